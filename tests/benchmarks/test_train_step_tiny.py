"""The end-to-end train-step benchmark runs in its tiny CPU mode, so the script cannot rot."""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import pytest

from tests.conftest import REPO


def _load():
    spec = importlib.util.spec_from_file_location("train_step", REPO / "benchmarks" / "train_step.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["train_step"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(300)
def test_train_step_tiny(tmp_path, capsys):
    mod = _load()
    out = tmp_path / "rows.json"
    rc = mod.main(["--tiny", "--steps", "1", "--warmup", "1", "--batch-size", "4", "--threads", "0",
                   "--rows", "32", "--variants", "jagged-full,padded-full,jagged-full-tokens", "--local", "jagged-full",
                   "--memory-curve", "--curve-lengths", "8,16", "--json", str(out), "--profile", "1"])
    assert rc == 0
    data = json.loads(out.read_text())
    rows = {r["variant"]: r for r in data["variants"]}
    assert set(rows) == {"jagged-full", "padded-full", "jagged-full-tokens"}
    for r in rows.values():
        assert r["examples_per_s"] > 0 and r["events_per_s"] > 0 and r["step_std_ms"] >= 0
        assert {"h2d", "forward", "backward", "optimizer"} <= set(r["phases_ms"])
        assert r["mfu"]["step_flops"] > 0
    names = [layer["name"] for layer in rows["jagged-full"]["mfu"]["layers"]]
    assert any(n.startswith("encoders.history.layers.") for n in names), names
    assert rows["padded-full"]["mfu"]["layers"] == []  # not in --local
    # same seed, same batches: the padded model executes more FLOPs (padding) than the jagged one
    assert rows["padded-full"]["executed_gflops"] > rows["jagged-full"]["executed_gflops"]
    assert rows["jagged-full-tokens"]["token_budget"] > 0
    # memory curve: every (length, mode) ran; checkpointing recomputes the same step (lr 0: same weights)
    curve = data["memory_curve"]["rows"]
    assert {(r["length"], r["mode"]) for r in curve} == {(n, m) for n in (8, 16) for m in ("off", "layer", "attn")}
    for n in (8, 16):
        by_mode = {r["mode"]: r for r in curve if r["length"] == n}
        assert all(not r["oom"] and r["step_ms"] > 0 for r in by_mode.values())
        for m in ("layer", "attn"):
            assert by_mode[m]["loss"] == by_mode["off"]["loss"]
            assert math.isclose(by_mode[m]["grad_norm"], by_mode["off"]["grad_norm"], rel_tol=1e-5)
    text = capsys.readouterr().out
    assert "| jagged-full |" in text and "jagged / padded examples/s (full)" in text
    assert "### local MFU per block: jagged-full" in text and "## memory vs speed" in text
    assert "# profile: " in text and "# host wait" in text  # --profile ran one step of jagged-full
    assert "longest trainable history" not in text  # no allocator peak on CPU: no search


def test_all_max_length_batch_pins_every_row(tmp_path):
    mod = _load()
    from features import load_schema

    schema = load_schema(REPO / "schemas" / "demo.yaml")
    cut, batch = mod.all_max_length_batch(schema, 24, rows=5)
    for seq in cut.sequences:
        assert seq.max_length == 24
        assert batch.seq_offsets[seq.name].diff().tolist() == [24] * 5
    import ingest.synth as synth

    assert synth.EMPTY_FRACTION > 0 and synth.length_params(24)[1] > 0  # the generator is restored
