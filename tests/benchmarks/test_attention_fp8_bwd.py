"""benchmarks/attention_fp8_bwd.py's error columns on CPU (the reference path): the FP8 backward's emulation agrees
with itself, and the three arms' gradients sit where the kernels' CPU tests put them against float64 (the FP8 arms
far above the unquantized one); the timings are the GPU's."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import REPO
from tests.kernels.attention_cases import make_problem


def _load():
    spec = importlib.util.spec_from_file_location("attention_fp8_bwd", REPO / "benchmarks" / "attention_fp8_bwd.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kw", [dict(causal=True), dict(causal=False)])
def test_error_columns_on_the_reference_path(kw):
    bench = _load()
    lens = [70, 0, 1, 45]
    p = make_problem(21, lens, lens, dim=32, bias=False)
    q, k, v, do = (t.float() for t in (p.q, p.k, p.v, p.do))
    errs = bench._errors(dict(kw, max_q_len=max(lens), max_kv_len=max(lens)), q, k, v, p.q_offsets, p.kv_offsets, do)
    assert errs["emulation"] <= 1e-6  # the CPU path's FP8 backward is the emulation itself
    assert errs["bf16"] <= 1e-5  # fp32 inputs here: only rounding against float64
    assert errs["fp8 fwd, bf16 bwd"] <= 0.12 and errs["fp8 fwd+bwd"] <= 0.12  # the kernels' tests' FP8 bound
    assert min(errs["fp8 fwd, bf16 bwd"], errs["fp8 fwd+bwd"]) > 100 * errs["bf16"]  # the FP8 arms did quantize
