"""Block-local and sliding-window jagged attention (Triton, interpreter): locality and accuracy."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.attention_cases import assert_accurate, make_problem, run

# Lengths: 0, 1, < S, an exact multiple of S, and the maximum (S = 8).
LENGTHS = [0, 1, 5, 16, 29]


def _perturbed(seed: int, row: int, key: int):
    p = make_problem(seed=seed, lq=[3, 29], lk=[3, 29], heads=1, bias=True)
    moved = make_problem(seed=seed, lq=[3, 29], lk=[3, 29], heads=1, bias=True)
    j = int(p.kv_offsets[row]) + key
    g = torch.Generator().manual_seed(seed + 1)
    moved.k[j] += torch.randn(moved.k[j].shape, generator=g, dtype=torch.float64)
    moved.v[j] += torch.randn(moved.v[j].shape, generator=g, dtype=torch.float64)
    return p, moved


@pytest.mark.parametrize("act", ["softmax", "silu"])
@pytest.mark.parametrize("kind", ["block", "window"])
def test_keys_outside_block_or_window_do_not_touch_the_query(act, kind):
    row, query = 1, 20  # row of length 29; query 20 sits in block [16, 24) and window [15, 20]
    kw = {"block_size": 8, "causal": True} if kind == "block" else {"window": 5, "causal": True}
    outside = 13 if kind == "block" else 14
    inside = 17 if kind == "block" else 15
    p, moved_out = _perturbed(3, row, outside)
    _, moved_in = _perturbed(3, row, inside)
    base = run(p, torch.float32, "triton", activation=act, **kw)
    far = run(moved_out, torch.float32, "triton", activation=act, **kw)
    near = run(moved_in, torch.float32, "triton", activation=act, **kw)
    i = int(p.q_offsets[row]) + query
    for name, a, b, c in zip(("out", "dq"), base[:2], far[:2], near[:2]):
        assert torch.equal(a[i], b[i]), f"{name} of query {query} changed when a key outside its {kind} moved"
        assert not torch.equal(a[i], c[i]), f"{name} of query {query} ignored a key inside its {kind}"


@pytest.mark.parametrize("act", ["softmax", "silu", "gelu"])
@pytest.mark.parametrize("kind", ["block", "window"])
def test_block_and_window_match_reference(act, kind):
    kw = {"block_size": 8} if kind == "block" else {"window": 6}
    # Non-causal block and window; the causal ones are covered by test_jagged_attention_triton.
    p = make_problem(seed=11, lq=LENGTHS, lk=LENGTHS, heads=1, bias=act != "gelu")
    assert_accurate(p, torch.float32 if act == "softmax" else torch.float16, activation=act, **kw)
