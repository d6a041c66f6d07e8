"""benchmarks/quant_both.py on CPU (interpreter): every configuration it times (each one-read tile shape and the
two-launch split) writes the PyTorch reference's codes and scales bit for bit (the check the benchmark runs on the
GPU), on a shape that leaves partial tiles along both dims; the timings are the GPU's."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.conftest import REPO


def _load():
    spec = importlib.util.spec_from_file_location("quant_both", REPO / "benchmarks" / "quant_both.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("block", [128, 32])
def test_every_configuration_writes_the_reference_codes(block):
    bench = _load()
    # 150 x 264: a whole and a partial tile on both axes for the largest tiles (128 x 256)
    x = (torch.randn(150, 264, generator=torch.Generator().manual_seed(3)) * 4).to(torch.bfloat16)
    x[7, 11] = float("inf")
    results = {}
    for label, call in bench._calls(block, x):
        (q, s, _), (qt, st, _) = call()
        results[label] = [bench._bits(t) for t in (q, s, qt, st)]
    ref = bench._reference(block, x)
    assert any("(shipped)" in k for k in results)
    assert "two launches" in results and len(results) > 2
    for label, got in results.items():
        assert all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, ref)), label
