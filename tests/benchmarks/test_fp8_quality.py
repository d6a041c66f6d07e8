"""benchmarks/fp8_quality.py in its tiny CPU mode: every variant trains through the trainer, the table
compares held-out NE against bf16, and a repeat of the baseline is bit-for-bit the same on CPU."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from tests.conftest import REPO


def _load():
    spec = importlib.util.spec_from_file_location("fp8_quality", REPO / "benchmarks" / "fp8_quality.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(120)
def test_fp8_quality_cpu_mode(tmp_path, capsys):
    mod = _load()
    out = tmp_path / "q.json"
    names = "bf16,bf16 (repeat),tensorwise,fp8 attention kernel"
    rc = mod.main(["--cpu", "--steps", "3", "--variants", names, "--run-root", str(tmp_path / "runs"),
                   "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert list(res) == names.split(",")
    for name, s in res.items():
        assert s["steps"] == 3 and s["eval_rows"] > 0, name
        assert all(math.isfinite(s["eval"][t]["ne"]) for t in ("click", "conversion")), name
    diffs = mod.max_rel_diff(res)
    assert diffs["bf16 (repeat)"] == 0.0  # same seed, data and steps: CPU runs are deterministic
    assert 0.0 < diffs["tensorwise"] < 0.05  # emulated FP8 changes the numbers, not the model
    assert 0.0 < diffs["fp8 attention kernel"] < 0.05
    table = capsys.readouterr().out
    assert "| tensorwise |" in table and "rel. diff" in table and "FAILED" not in table


def test_variant_overrides_put_the_policy_in_the_precision_section():
    mod = _load()
    ov = mod.variant_overrides("blockwise wgrad=bf16", 7, None, cpu=True, extra=["--train.seed=3"])
    assert "--train.steps=7" in ov and "--train.seed=3" in ov
    assert {"--precision.mlp=blockwise", "--precision.wgrad=bf16", "--precision.emulate=true"} <= set(ov)
    assert not any(o.startswith("--precision.") for o in mod.variant_overrides("bf16", 7, None, True, []))
    with pytest.raises(mod.QualityError, match="unknown variant"):
        mod.variant_overrides("fp4", 7, None, True, [])


def test_pick_gpu_keeps_one_run_per_gpu_and_waits_for_a_gpu_held_by_a_benchmark(tmp_path):
    mod = _load()
    done = tmp_path / "bench.done"
    after = {"1": done}
    assert mod.pick_gpu(["0", "1"], [], 1, after) == "0"
    assert mod.pick_gpu(["0", "1"], ["0"], 1, after) is False  # GPU 1 still held, GPU 0 full
    done.touch()
    assert mod.pick_gpu(["0", "1"], ["0"], 1, after) == "1"
    assert mod.pick_gpu(["0", "1"], ["0", "1"], 1, after) is False
    assert mod.pick_gpu(["0", "1"], ["0", "1", "0"], 2, after) == "1"  # fewest runs first
    assert mod.pick_gpu([None], [], 1, {}) is None  # no --gpus: the default device
    with pytest.raises(mod.QualityError, match="GPU:FILE"):
        mod._parse_after("1")
