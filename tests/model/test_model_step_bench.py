"""benchmarks/model_step.py in its tiny CPU mode, so the device benchmark cannot rot."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO


def test_model_step_benchmark_tiny_mode():
    spec = importlib.util.spec_from_file_location("model_step", REPO / "benchmarks" / "model_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    table = mod.main(["--tiny"])
    lines = table.splitlines()
    assert "vs reference attention 0.00e+00" in lines[1]  # on CPU the dispatch is the reference
    diff = float(lines[1].rsplit(" ", 1)[-1])
    assert diff < 1e-5  # jagged == padded (float32)
    body = [line for line in lines if line.startswith("| ") and not line.startswith("| variant")]
    assert len(body) == 7 and body[0].startswith("| full, padded (SDPA) |")
