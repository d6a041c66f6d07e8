"""The kernels with tiles streamed through tensor descriptors (GEMTRAIN_ATTN_TMA=1), on the interpreter.

A descriptor spans the whole ``[tokens, H*D]`` tensor, so a tile that runs past a jagged row reads the
next row's tokens instead of zeros; the kernels must mask them. Accuracy against the float64 reference,
and a row's results bit-identical when the next row's keys, values, queries and output gradients change.
"""

from __future__ import annotations

import pytest
import torch

from kernels import attention_op as op
from kernels import attention_triton_common as common
from tests.kernels.attention_cases import assert_accurate, make_problem, run

LENGTHS = [97, 0, 1, 65, 33]  # 32-row interpreter tiles: whole tiles, partial tiles, empty and single rows


@pytest.fixture(autouse=True)
def descriptors_on(monkeypatch):
    monkeypatch.setattr(common, "TMA", "1")
    made = []
    real = op.descriptor
    monkeypatch.setattr(op, "descriptor", lambda t, on: made.append(on) or real(t, on))
    yield made
    assert made and all(made), "the kernels did not take the descriptor path"


CASES = {
    "causal softmax + pos/time bias": dict(activation="softmax", causal=True),
    "non-causal silu + targets": dict(activation="silu", causal=False, targets=True),
    "block-local softmax (S=16)": dict(activation="softmax", causal=True, block_size=16),
    "window gelu (W=20)": dict(activation="gelu", causal=True, window=20),
}


@pytest.mark.parametrize("name", list(CASES))
def test_descriptor_path_matches_reference(name):
    kw = dict(CASES[name])
    targets = kw.pop("targets", False)
    p = make_problem(seed=len(name), lq=LENGTHS, lk=LENGTHS, heads=2, bias=True, targets=targets)
    assert_accurate(p, torch.float32, **kw)


@pytest.mark.parametrize("bias", [False, True])
def test_window_softmax_statistics_through_descriptors(bias):
    # The fused window backward reads each query tile's softmax statistics through one descriptor (tiles
    # of a row that ends mid-tile included); without tables they enter the [keys, queries] products.
    from kernels import attention_window_op as wop

    assert wop.STATS_TMA and wop.STATS_BY_TILE
    p = make_problem(seed=12, lq=LENGTHS, lk=LENGTHS, heads=2, bias=bias)
    assert_accurate(p, torch.float32, activation="softmax", causal=True, window=20)


def test_cross_rows_match_reference():
    p = make_problem(seed=4, lq=[16, 3, 0, 16, 5], lk=LENGTHS, heads=2, bias=True)
    assert_accurate(p, torch.float32, activation="softmax", causal=True)


@pytest.mark.parametrize("act", ["softmax", "silu"])
def test_next_row_does_not_reach_into_a_row(act):
    lens = [45, 40]  # row 0 ends inside a tile; its last tiles read row 1's first tokens
    base = make_problem(seed=9, lq=lens, lk=lens, heads=2, bias=True)
    moved = make_problem(seed=9, lq=lens, lk=lens, heads=2, bias=True)
    g = torch.Generator().manual_seed(10)
    for t in (moved.q, moved.k, moved.v, moved.do):
        t[lens[0]:] = 50.0 * torch.randn(t[lens[0]:].shape, generator=g, dtype=torch.float64)
    a = run(base, torch.float32, "triton", activation=act, causal=True)
    b = run(moved, torch.float32, "triton", activation=act, causal=True)
    for name, x, y in zip(("out", "dq", "dk", "dv"), a, b):
        assert torch.equal(x[:lens[0]], y[:lens[0]]), f"{name} of row 0 changed with row 1's tokens"
        assert not torch.equal(x[lens[0]:], y[lens[0]:]), f"{name} of row 1 ignored its own tokens"
