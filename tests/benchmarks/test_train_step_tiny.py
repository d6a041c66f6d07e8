"""The end-to-end train-step benchmark runs in its tiny CPU mode, so the script cannot rot."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import REPO


@pytest.mark.timeout(300)
def test_train_step_tiny(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("train_step", REPO / "benchmarks" / "train_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "rows.json"
    rc = mod.main(["--tiny", "--steps", "1", "--warmup", "1", "--batch-size", "4", "--threads", "0",
                   "--rows", "32", "--variants", "jagged-full,padded-full", "--json", str(out)])
    assert rc == 0
    rows = {r["variant"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"jagged-full", "padded-full"}
    for r in rows.values():
        assert r["examples_per_s"] > 0 and r["events_per_s"] > 0
        assert {"h2d", "forward", "backward", "optimizer"} <= set(r["phases_ms"])
        assert r["mfu"]["step_flops"] > 0
        names = [layer["name"] for layer in r["mfu"]["layers"]]
        assert any(n.startswith("encoders.history.layers.") for n in names), names
    # same seed, same batches: the padded model executes more FLOPs (padding) than the jagged one
    assert rows["padded-full"]["executed_gflops"] > rows["jagged-full"]["executed_gflops"]
    text = capsys.readouterr().out
    assert "| jagged-full |" in text and "jagged / padded examples/s (full)" in text
