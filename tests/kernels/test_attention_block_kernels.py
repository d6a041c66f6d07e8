"""One-pass block-local self-attention kernels (``kernels.attention_block_op``, interpreter): accuracy against
the float64 reference, locality, and that ``jagged_attention`` routes block-local self-attention to them."""

from __future__ import annotations

import pytest
import torch

import kernels.attention_block_op  # noqa: F401  (registers the FLOP formulas before a counter starts)
import kernels.attention_op  # noqa: F401
from kernels.attention_flops import visible_pairs
from tests.kernels.attention_cases import assert_accurate, op_flops, run, self_problem

# Lengths: 0, 1, < S, exact multiples of S, and the maximum (S = 8 or 16).
LENGTHS = [0, 1, 5, 16, 29, 32]


def _self_problem(seed: int, heads: int = 2, bias: bool = True, targets: bool = False, lengths=LENGTHS):
    return self_problem(seed, lengths, heads=heads, bias=bias, targets=targets)


@pytest.mark.parametrize("act", ["softmax", "silu", "gelu"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [8, 16])
def test_block_kernels_match_reference(act, causal, block):
    # S=8 runs a 16-row tile holding one block (its last rows masked); S=16 fills the tile. Softmax
    # with both tables in fp32, pointwise activations with the position table alone in fp16.
    p = _self_problem(seed=5 + block, bias=True)
    dtype = torch.float32 if act == "softmax" else torch.float16
    if act != "softmax":
        p.time = None
    assert_accurate(p, dtype, activation=act, causal=causal, block_size=block)


@pytest.mark.parametrize("act", ["softmax", "silu"])
def test_block_kernels_without_bias_and_with_targets(act):
    p = _self_problem(seed=23, bias=False, targets=True)
    assert_accurate(p, torch.float16 if act == "softmax" else torch.float32, activation=act, causal=True,
                    block_size=8)


def test_block_kernels_fixed_pointwise_norm_and_scale():
    p = _self_problem(seed=29, bias=True)
    assert_accurate(p, torch.float32, activation="silu", causal=False, block_size=16, pointwise_norm=7,
                    scale=0.3)


def test_block_kernels_empty_batch():
    p = _self_problem(seed=31, lengths=[0, 0])
    out, dq, dk, dv, dpos, dtime = run(p, torch.float32, "triton", causal=True, block_size=8)
    assert out.shape == (0, 2, 16) and dq.shape == dk.shape == dv.shape == (0, 2, 16)
    assert torch.count_nonzero(dpos) == 0 and torch.count_nonzero(dtime) == 0


@pytest.mark.parametrize("act", ["softmax", "gelu"])
def test_keys_outside_the_block_do_not_touch_the_query(act):
    row, query = 4, 20  # row of length 29; query 20 sits in block [16, 24)
    base_p = _self_problem(seed=3, heads=1)
    results = {}
    for name, key in (("base", None), ("outside", 13), ("inside", 17)):
        p = _self_problem(seed=3, heads=1)
        if key is not None:
            j = int(p.q_offsets[row]) + key
            g = torch.Generator().manual_seed(7)
            p.k[j] += torch.randn(p.k[j].shape, generator=g, dtype=torch.float64)
            p.v[j] += torch.randn(p.v[j].shape, generator=g, dtype=torch.float64)
        results[name] = run(p, torch.float32, "triton", activation=act, causal=False, block_size=8)
    i = int(base_p.q_offsets[row]) + query
    for n, name in enumerate(("out", "dq")):
        assert torch.equal(results["base"][n][i], results["outside"][n][i]), f"{name} moved with a key outside"
        assert not torch.equal(results["base"][n][i], results["inside"][n][i]), f"{name} ignored a key inside"
    # The key gradients of the query's block do not see the outside key either.
    block = slice(int(base_p.q_offsets[row]) + 16, int(base_p.q_offsets[row]) + 24)
    for n in (2, 3):
        assert torch.equal(results["base"][n][block], results["outside"][n][block])


def test_block_local_self_attention_takes_the_block_kernels():
    p = _self_problem(seed=41, bias=False)
    kw = dict(causal=True, block_size=8)
    ops = op_flops(p, **kw)
    pairs = visible_pairs(p.q_offsets, p.q_offsets, causal=True, block_size=8)
    assert ops.get("gemtrain.block_attn_fwd") == 4 * pairs * 2 * 16, ops
    assert ops.get("gemtrain.block_attn_bwd") == int(2.5 * 4 * pairs * 2 * 16), ops
    assert not any("jagged_attn" in name for name in ops), ops
    # Two offsets tensors (the general case), blocks with a window, or blocks over 64 keep the generic kernels.
    cross = _self_problem(seed=41, bias=False)
    cross.kv_offsets = cross.q_offsets.clone()
    for prob, extra in ((cross, kw), (p, dict(causal=True, block_size=8, window=4)), (p, dict(causal=True, block_size=128))):
        ops = op_flops(prob, **extra)
        assert "gemtrain.jagged_attn_fwd" in ops and not any("block_attn" in n for n in ops), (extra, ops)


def test_raw_op_autograd_equals_the_autograd_node():
    # jagged_attention runs the ops under one autograd.Function; the forward op's registered autograd
    # (for callers of the raw op) must give the same gradients bit for bit.
    from kernels.attention_block_op import block_attention, block_work

    p = _self_problem(seed=43, bias=True)
    grads = []
    for raw in (False, True):
        q, k, v = (t.detach().float().requires_grad_() for t in (p.q, p.k, p.v))
        pos = p.pos.detach().float().requires_grad_()
        args = dict(activation="softmax", causal=True, scale=0.25, block_size=8, num_targets=None, pos_weight=pos,
                    time_weight=None, q_timestamps=None, kv_timestamps=None, norm=0)
        if raw:
            work = block_work(p.q_offsets, q.shape[0], 8, 2)
            out = torch.ops.gemtrain.block_attn_fwd(q, k, v, p.q_offsets, None, pos, None, None, None, "softmax",
                                                    True, 0.25, 8, 0, 2, work)[0]
        else:
            out = block_attention(q, k, v, p.q_offsets, **args)
        out.backward(p.do.float())
        grads.append([out.detach(), q.grad, k.grad, v.grad, pos.grad])
    for a, b in zip(*grads):
        assert torch.equal(a, b)
