"""benchmarks/fp8_encode.py on CPU (interpreter): the integer encoder of the cast kernels equals torch's
fp32 -> e4m3 / e5m2 conversion on every code, tie and clamp bound; the GPU rows are the script's own."""

from __future__ import annotations

import importlib.util

import torch

from tests.conftest import REPO


def _load():
    spec = importlib.util.spec_from_file_location("fp8_encode", REPO / "benchmarks" / "fp8_encode.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_integer_encoder_is_torchs_conversion_on_every_case(capsys):
    mod = _load()
    for fmt, dt in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        v = mod.probe_values(fmt, "cpu")
        assert v.numel() > 1000 and bool((v == 0).any()) and bool((v.abs() > mod.FORMATS[fmt][1]).any())
        ref = v.clamp(-mod.FORMATS[fmt][1], mod.FORMATS[fmt][1]).to(dt).view(torch.uint8)
        assert torch.equal(mod.encode(v, "integer", fmt), ref)
        assert not torch.equal(mod.encode(v, "floor", fmt), ref)  # the probe tells encoders apart
    assert mod.main([]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| e")]
    assert len(rows) == 4 and all(r.split(" | ")[3] == "True" for r in rows)  # integer == torch
