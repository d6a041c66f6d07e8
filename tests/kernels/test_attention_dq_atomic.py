"""The one-kernel attention backward (``attention_op.DQ_MODE = "atomic"``: the dk/dv kernel adds each
pair's dS·K into fp32 dq sums) against the reference, under the interpreter (element atomics; the GPU's
bulk tensor reduce is checked by ``benchmarks/attention.py check``)."""

from __future__ import annotations

import pytest
import torch

from kernels import attention_op
from tests.kernels.attention_cases import assert_accurate, make_problem, run

UNEQUAL = ([3, 1, 0, 5, 16], [0, 7, 24, 2, 20])
EQUAL = ([0, 1, 24, 9, 17], [0, 1, 24, 9, 17])
CASES = [
    ("softmax", {"causal": True}, EQUAL, True, torch.float32),
    ("softmax", {}, UNEQUAL, False, torch.float16),
    ("softmax", {"causal": True}, EQUAL, True, torch.float16),
    ("silu", {"causal": True}, UNEQUAL, True, torch.float32),
    ("gelu", {}, EQUAL, False, torch.float32),
]


@pytest.fixture
def atomic_dq(monkeypatch):
    monkeypatch.setattr(attention_op, "DQ_MODE", "atomic")
    launched = []
    real = attention_op.jagged_attn_bwd_dq_kernel
    monkeypatch.setattr(attention_op, "jagged_attn_bwd_dq_kernel", _Spy(real, launched))
    return launched


class _Spy:
    """Records launches of a Triton kernel (``kernel[grid](...)``) and runs them."""

    def __init__(self, kernel, launched: list) -> None:
        self.kernel, self.launched = kernel, launched

    def __getitem__(self, grid):
        self.launched.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_atomic_dq_matches_reference(atomic_dq, case):
    act, kw, (lq, lk), bias, dtype = CASES[case]
    p = make_problem(seed=200 + case, lq=lq, lk=lk, heads=2, bias=bias, targets=case == 2)
    assert_accurate(p, dtype, activation=act, **kw)
    assert atomic_dq == [], "the dq kernel ran although the dk/dv kernel accumulates dq"


def test_atomic_dq_equals_the_dq_kernel(atomic_dq, monkeypatch):
    """Same gradients as the two-kernel backward up to fp32 summation order."""
    p = make_problem(seed=210, lq=[7, 0, 40], lk=[7, 0, 40], heads=2, bias=True)
    _, dq_atomic, dk_atomic, *_ = run(p, torch.float32, "triton", causal=True)
    monkeypatch.setattr(attention_op, "DQ_MODE", "kernel")
    _, dq, dk, *_ = run(p, torch.float32, "triton", causal=True)
    assert len(atomic_dq) == 1
    torch.testing.assert_close(dq_atomic, dq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dk_atomic, dk, rtol=0, atol=0)


def test_unknown_dq_mode_is_refused(monkeypatch):
    monkeypatch.setattr(attention_op, "DQ_MODE", "fast")
    p = make_problem(seed=211, lq=[4], lk=[4], heads=1, bias=False)
    with pytest.raises(ValueError, match="DQ_MODE"):
        run(p, torch.float32, "triton", causal=True)
