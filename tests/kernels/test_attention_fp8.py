"""FP8 jagged attention: block quantizer, Triton kernel (interpreter) vs the PyTorch reference of the same
quantized arithmetic, error bound against the high-precision paths, gradients, per-layer policy."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from kernels import AttentionError, RelativeBias, jagged_attention
from kernels.attention_fp8 import (
    dequantize_jagged,
    jagged_attention_fp8,
    jagged_attention_fp8_bwd_ref,
    jagged_attention_fp8_ref,
    quantize_jagged,
)
from tests.kernels.attention_cases import make_problem, rel_err

# Stated bound: relative L2 error (||out - ref|| / ||ref||) of the FP8 output against the high-precision
# output, for unit-Gaussian q, k, v. e4m3 keeps 3 mantissa bits (relative rounding error <= 2^-4 per
# element, ~2.5% RMS); Q, K, V and P each add one such rounding. Measured 0.035-0.05 on these problems.
FP8_REL_BOUND = 0.08
# Gradients are the high-precision backward at the unquantized inputs, fed the FP8 output/LSE.
FP8_GRAD_REL_BOUND = 0.12
INTERPRET_TILE_N = 32  # the kernel's KV tile under TRITON_INTERPRET=1


def _bias(p, dtype=torch.float32) -> RelativeBias:
    return RelativeBias(p.pos.to(dtype), p.time.to(dtype), p.q_ts, p.kv_ts)


def _loop_quantize(x: torch.Tensor, offsets: list[int], block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, per block of ``block`` tokens, per head: power-of-two scale 2^ceil(log2(amax/448))."""
    data = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
    scales = []
    for b in range(len(offsets) - 1):
        for s in range(offsets[b], offsets[b + 1], block):
            e = min(s + block, offsets[b + 1])
            blk = x[s:e].float()
            amax = blk.abs().amax(dim=(0, 2))  # [H]
            scale = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
            data[s:e] = (blk / scale[None, :, None]).to(torch.float8_e4m3fn)
            scales.append(scale)
    return data, torch.stack(scales)


def test_quantizer_matches_a_plain_loop_and_bounds_its_error():
    g = torch.Generator().manual_seed(3)
    lens = [70, 0, 5, 128, 129]
    offsets = [0, *torch.tensor(lens).cumsum(0).tolist()]
    x = torch.randn(sum(lens), 3, 8, generator=g) * torch.exp2(torch.randint(-6, 7, (sum(lens), 3, 1), generator=g))
    off_t = torch.tensor(offsets)
    for block in (64, 128):
        t = quantize_jagged(x, off_t, block)
        data, scales = _loop_quantize(x, offsets, block)
        assert torch.equal(t.data.view(torch.uint8), data.view(torch.uint8))
        assert torch.equal(t.scale, scales)
        expect_blocks = [0, *torch.tensor([math.ceil(n / block) for n in lens]).cumsum(0).tolist()]
        assert t.block_offsets.tolist() == expect_blocks
        # Round trip: half an e4m3 step, relative 2^-4 for normals, absolute 2^-10 * scale for subnormals.
        dq = dequantize_jagged(t, off_t, block)
        ones = quantize_jagged(x, off_t, block)  # decoding ones gives each element's block scale
        ones.data = torch.ones_like(x).to(torch.float8_e4m3fn)
        bid_scale = dequantize_jagged(ones, off_t, block)
        bound = torch.maximum(x.abs() * 2.0**-4, bid_scale * 2.0**-10)
        assert bool(((dq - x).abs() <= bound).all())
        assert float(t.data.float().abs().max()) <= 448.0


def test_quantizer_non_finite_block_decodes_to_nan_alone():
    x = torch.randn(100, 2, 4, generator=torch.Generator().manual_seed(0))
    x[10, 1, 2] = float("inf")
    off = torch.tensor([0, 100])
    dq = dequantize_jagged(quantize_jagged(x, off, 64), off, 64)
    assert bool(dq[:64, 1].isnan().all())
    assert bool(dq[:64, 0].isfinite().all()) and bool(dq[64:].isfinite().all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_quantizer_is_bit_identical(dtype):
    from kernels.attention_fp8_op import quantize_jagged_triton

    g = torch.Generator().manual_seed(8)
    lens = [70, 0, 5, 128, 129]
    off = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    total = sum(lens)
    x = torch.randn(total, 3, 12, generator=g) * torch.exp2(torch.randint(-6, 7, (total, 3, 1), generator=g))
    x[3, 1, 1], x[200, 2, 0] = float("nan"), float("-inf")
    x = x.to(dtype)
    for block in (64, 128):
        want = quantize_jagged(x, off, block)
        got, got_t = quantize_jagged_triton(x, off, block, transposed=True)
        nb = int(want.block_offsets[-1])
        codes = want.data.view(torch.uint8)
        assert torch.equal(got.data.view(torch.uint8), codes)
        assert torch.equal(got.scale[:nb].view(torch.int32), want.scale.view(torch.int32))
        assert torch.equal(got.block_offsets, want.block_offsets)
        # Transposed: each row from a multiple of 16 columns, zeros up to the next multiple.
        assert got_t.offsets.tolist() == [0, 80, 80, 96, 224, 368]
        flat_t = got_t.data.view(torch.uint8)
        for b, n in enumerate(lens):
            c0, t0 = int(got_t.offsets[b]), int(off[b])
            assert torch.equal(flat_t[:, c0:c0 + n], codes[t0:t0 + n].reshape(n, flat_t.shape[0]).t())
            assert not flat_t[:, c0 + n:int(got_t.offsets[b + 1])].any()
        rows_off, _ = quantize_jagged_triton(x, off, block, transposed=True, row_major=False)
        assert rows_off.data.numel() == 0
        assert torch.equal(rows_off.scale[:nb].view(torch.int32), got.scale[:nb].view(torch.int32))


@pytest.mark.parametrize("block", [64, 128])
def test_quant_plan_kernel_matches_its_reference(block):
    # The one-launch plan (interpreter) against the torch ops that define it: rows of 0, 1, < block, exact
    # multiples of block and the max; each block of each row listed once, then row -1.
    from kernels.attention_fp8_op import quant_plan, quant_plan_triton

    lens = [0, 1, 70, 128, 129, 0, 256, 17]
    off = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    want = quant_plan(off, block, sum(lens))
    got = quant_plan_triton(off, block, want.n_items)
    for name in ("block_offsets", "columns", "work"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    listed = [tuple(x) for x in want.work.tolist() if x[0] >= 0]
    assert listed == [(b, c) for b, n in enumerate(lens) for c in range(math.ceil(n / block))]
    assert want.columns.tolist() == [0, *torch.tensor([math.ceil(n / 16) * 16 for n in lens]).cumsum(0).tolist()]


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("v_t", [False, True])
def test_one_launch_for_q_k_v_matches_three(cross, v_t):
    from kernels.attention_fp8_op import quantize_jagged_triton, quantize_qkv

    p = make_problem(6, [3, 20, 0, 1] if cross else [70, 0, 5, 129], [70, 0, 5, 129], dim=32)
    x = [t.float() for t in (p.q, p.k, p.v)]
    got = quantize_qkv(*x, p.q_offsets, p.kv_offsets, 64, v_t)
    want = [quantize_jagged_triton(x[0], p.q_offsets, 64)[0], quantize_jagged_triton(x[1], p.kv_offsets, 64)[0]]
    v_codes, v_tr = quantize_jagged_triton(x[2], p.kv_offsets, 64, transposed=v_t, row_major=not v_t)
    for a, b in zip(got[:3], [*want, v_codes], strict=True):
        nb = int(b.block_offsets[-1])
        assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))
        assert torch.equal(a.scale[:nb], b.scale[:nb]) and torch.equal(a.block_offsets, b.block_offsets)
    assert (got[3] is None) == (not v_t)
    if v_t:
        assert torch.equal(got[3].offsets, v_tr.offsets)
        used = int(v_tr.offsets[-1])
        assert torch.equal(got[3].data.view(torch.uint8)[:, :used], v_tr.data.view(torch.uint8)[:, :used])


CASES = [
    # (activation, kwargs, dtype, v_transposed, quant_block)
    ("softmax", dict(), torch.float32, True, 64),
    ("softmax", dict(causal=True, targets=True), torch.float16, False, 64),
    ("softmax", dict(causal=True, window=7), torch.float32, True, 128),
    ("silu", dict(block_size=16), torch.float32, False, 64),
    ("gelu", dict(causal=True, pointwise_norm=8), torch.float32, True, 64),
]


@pytest.mark.parametrize("act,kw,dtype,v_t,qb", CASES)
def test_kernel_matches_quantized_reference(act, kw, dtype, v_t, qb):
    kw = dict(kw)
    targets = kw.pop("targets", False)
    p = make_problem(11, [33, 0, 3, 40], [33, 4, 30, 40], targets=targets)
    q, k, v = (t.to(dtype) for t in (p.q, p.k, p.v))
    args = (q, k, v, p.q_offsets, p.kv_offsets)
    common = dict(activation=act, bias=_bias(p), num_targets=p.num_targets, **kw)
    out = jagged_attention_fp8(*args, impl="triton", quant_block=qb, v_transposed=v_t, **common)
    ref = jagged_attention_fp8_ref(*args, quant_block=qb, tile_n=INTERPRET_TILE_N, **common)
    assert out.dtype == dtype and bool(out.isfinite().all())
    # Same quantized numbers; only fp32 summation order (and fp16 output rounding) differ.
    assert rel_err(out, ref.double()) <= (1e-3 if dtype == torch.float16 else 1e-5)
    exact = jagged_attention(p.q, p.k, p.v, p.q_offsets, p.kv_offsets, impl="ref", activation=act,
                             bias=_bias(p, torch.float64), num_targets=p.num_targets, **kw)
    assert 0.005 < rel_err(out, exact) <= FP8_REL_BOUND  # quantized for real, and within the bound


def test_error_bound_against_bf16_and_fp32_paths():
    p = make_problem(5, [40, 70, 17], [40, 70, 17], heads=2, dim=32, bias=False)
    args = (p.q_offsets, p.kv_offsets)
    bf = [t.bfloat16() for t in (p.q, p.k, p.v)]
    fp8 = jagged_attention(*bf, *args, causal=True, impl="triton", precision="fp8")
    # The bf16 path (its CPU reference: the interpreter has no bf16 dot) and the Triton kernel in fp32.
    bf16_out = jagged_attention(*bf, *args, causal=True, impl="ref")
    fp32_out = jagged_attention(*(t.float() for t in (p.q, p.k, p.v)), *args, causal=True, impl="triton")
    exact = jagged_attention(p.q, p.k, p.v, *args, causal=True, impl="ref")
    assert rel_err(bf16_out, exact) < 0.01
    assert rel_err(fp8, bf16_out.double()) <= FP8_REL_BOUND
    assert rel_err(fp8, fp32_out.double()) <= FP8_REL_BOUND
    # Without P quantization the reference is literally quantize -> dequantize -> jagged_attention_ref;
    # quantizing P adds error but stays within the bound.
    no_p = jagged_attention_fp8_ref(*bf, *args, causal=True, quantize_p=False)
    assert rel_err(no_p, exact) < rel_err(fp8, exact) <= FP8_REL_BOUND


def test_gradients_within_bound():
    """The FP8 backward (score products on codes) and the straight-through bf16 backward, in the kernels and in
    the reference path, all lie within the bound of the float64 gradients."""
    p = make_problem(2, [20, 0, 40], [20, 9, 40])
    grads = {}
    for name, impl, prec, dtype, fp8_bwd in (("fp8_kernel", "triton", "fp8", torch.float32, True),
                                             ("fp8_fwd_only", "triton", "fp8", torch.float32, False),
                                             ("fp8_ref", "ref", "fp8", torch.float32, True),
                                             ("fp8_ref_fwd_only", "ref", "fp8", torch.float32, False),
                                             ("exact", "ref", "bf16", torch.float64, True)):
        leaves = [t.detach().to(dtype).clone().requires_grad_() for t in (p.q, p.k, p.v)]
        pos = p.pos.detach().to(dtype).clone().requires_grad_()
        call = jagged_attention if prec == "bf16" else partial(jagged_attention_fp8, fp8_backward=fp8_bwd)
        out = call(*leaves, p.q_offsets, p.kv_offsets, causal=True, impl=impl, bias=RelativeBias(pos_weight=pos))
        out.backward(p.do.to(dtype))
        grads[name] = [t.grad for t in leaves] + [pos.grad]
    for name in ("fp8_kernel", "fp8_fwd_only", "fp8_ref", "fp8_ref_fwd_only"):
        for got, want in zip(grads[name], grads["exact"], strict=True):
            assert bool(got.isfinite().all())
            assert rel_err(got, want) <= FP8_GRAD_REL_BOUND, name
    # The reference path's FP8 backward is the kernels' arithmetic (its forward quantizes P per 64-key tile,
    # the interpreter's kernel per 32, which moves softmax's delta a little).
    for got, want in zip(grads["fp8_ref"], grads["fp8_kernel"], strict=True):
        assert rel_err(got, want.double()) <= 0.01


BACKWARD_CASES = [
    # (activation, kwargs, bias, q lengths, kv lengths, quant_block): empty rows, length 1, Lq != Lkv
    ("softmax", dict(causal=True, targets=True), False, [20, 0, 40, 1, 33], [20, 9, 40, 1, 33], 64),
    ("softmax", dict(), True, [20, 0, 40, 1, 33], [20, 9, 40, 1, 33], 128),
    ("softmax", dict(causal=True), True, [3, 0, 1, 5], [40, 9, 1, 70], 64),  # cross attention
    ("silu", dict(causal=True, window=7), False, [20, 0, 40, 1, 33], [20, 9, 40, 1, 33], 64),
    ("gelu", dict(pointwise_norm=8, block_size=16), True, [20, 0, 40, 1, 33], [20, 9, 40, 1, 33], 64),
]


@pytest.mark.parametrize("act,kw,use_bias,lq,lk,qb", BACKWARD_CASES)
def test_fp8_backward_matches_its_reference(act, kw, use_bias, lq, lk, qb):
    """The FP8 backward kernels (S and dP on e4m3 codes) against the same arithmetic in float64, and against
    the float64 gradients of unquantized attention within the bound."""
    kw = dict(kw)
    targets = kw.pop("targets", False)
    p = make_problem(3, lq, lk, targets=targets)
    leaves = [t.detach().float().clone().requires_grad_() for t in (p.q, p.k, p.v)]
    tables = [p.pos.float().clone().requires_grad_(), p.time.float().clone().requires_grad_()] if use_bias else []
    bias = RelativeBias(*tables, p.q_ts, p.kv_ts) if use_bias else None
    common = dict(activation=act, num_targets=p.num_targets, **kw)
    out = jagged_attention_fp8(*leaves, p.q_offsets, p.kv_offsets, impl="triton", bias=bias, quant_block=qb,
                               fp8_backward=True, **common)
    out.backward(p.do.float())
    got = [t.grad for t in leaves + tables]
    ref = jagged_attention_fp8_bwd_ref(p.do.float(), *(t.detach() for t in leaves), out.detach(), p.q_offsets,
                                       p.kv_offsets, bias=bias, quant_block=qb, **common)
    want = list(ref[:3]) + ([ref[3], ref[4]] if use_bias else [])
    exact_leaves = [t.detach().clone().requires_grad_() for t in (p.q, p.k, p.v)]
    exact_tables = [p.pos.clone().requires_grad_(), p.time.clone().requires_grad_()] if use_bias else []
    exact_bias = RelativeBias(*exact_tables, p.q_ts, p.kv_ts) if use_bias else None
    jagged_attention(*exact_leaves, p.q_offsets, p.kv_offsets, impl="ref", bias=exact_bias, **common).backward(p.do)
    for g, w, e in zip(got, want, [t.grad for t in exact_leaves + exact_tables], strict=True):
        assert bool(g.isfinite().all())
        assert rel_err(g, w) <= 1e-5  # same quantized numbers; fp32 summation order differs
        assert 0.002 < rel_err(g, e) <= FP8_GRAD_REL_BOUND  # quantized for real, and within the bound


def test_fp8_backward_keeps_codes_only_where_a_gradient_is_asked(monkeypatch):
    """Without a gradient (or with ``fp8_backward=False``) the forward returns no codes; with one it returns
    the row-major codes of q, k and v, and the backward's quantized dO."""
    from kernels import attention_fp8_op

    p = make_problem(8, [20, 5], [20, 5], bias=False)
    kept = []
    real = attention_fp8_op.quantize_qkv
    monkeypatch.setattr(attention_fp8_op, "quantize_qkv", lambda *a, **kw: kept.append(a[-1]) or real(*a, **kw))
    leaves = [t.detach().float().clone().requires_grad_() for t in (p.q, p.k, p.v)]
    call = partial(jagged_attention_fp8, *leaves, p.q_offsets, p.kv_offsets, impl="triton", quant_block=64)
    with torch.no_grad():
        call(fp8_backward=True)
    call(fp8_backward=False)
    call(fp8_backward=True).sum().backward()
    assert kept == [False, False, True]  # v_row_major: the codes the backward reads
    assert all(t.grad is not None and bool(t.grad.isfinite().all()) for t in leaves)


def test_backward_reuses_the_forwards_work_list(monkeypatch):
    """Self-attention builds one list of query tiles per forward+backward: the FP8 forward's serves the
    backward's two passes. Gradients equal those of the ops called without a list (each builds its own)."""
    from kernels import attention_fp8_op, attention_op
    from kernels.attention_fp8 import DEFAULT_QUANT_BLOCK

    p = make_problem(6, [20, 0, 40], [20, 0, 40])
    built = []
    real = attention_op.work_list
    counting = lambda *a, **kw: built.append(1) or real(*a, **kw)
    monkeypatch.setattr(attention_op, "work_list", counting)
    monkeypatch.setattr(attention_fp8_op, "work_list", counting)
    q, k, v = (t.detach().float().clone().requires_grad_() for t in (p.q, p.k, p.v))
    do, offs = p.do.float(), p.q_offsets
    jagged_attention(q, k, v, offs, offs, causal=True, impl="triton", precision="fp8_fwd_bwd",
                     max_kv_len=40).backward(do)
    assert len(built) == 1
    shared = (offs, offs, None, None, None, None, None, "softmax", True, 1 / math.sqrt(q.shape[2]), 0, -1, 0,
              attention_op._len_key(offs, q, k, None, 40), 0)
    out, lse, *codes = torch.ops.gemtrain.jagged_attn_fp8_fwd(q.detach(), k.detach(), v.detach(), *shared,
                                                              DEFAULT_QUANT_BLOCK, True, True)
    own_lists = torch.ops.gemtrain.jagged_attn_fp8_bwd(do, q.detach(), k.detach(), v.detach(), out, lse, *codes,
                                                       *shared, DEFAULT_QUANT_BLOCK)
    assert len(built) == 4  # the forward's list, then the backward's two
    for got, want in zip((q.grad, k.grad, v.grad), own_lists[:3], strict=True):
        assert torch.equal(got, want)


def test_precision_keyword_dispatch_and_errors():
    p = make_problem(4, [20, 9], [20, 9], bias=False)
    q, k, v = (t.float() for t in (p.q, p.k, p.v))
    args = (q, k, v, p.q_offsets, p.kv_offsets)
    assert torch.equal(jagged_attention(*args, precision="bf16"), jagged_attention(*args))  # bf16 untouched
    via_kw = jagged_attention(*args, precision="fp8", impl="ref")
    assert torch.equal(via_kw, jagged_attention_fp8_ref(*args))
    # "fp8_fwd_bwd": the same forward; the backward's score products in FP8 (the reference path's emulation).
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    both = jagged_attention(*leaves, p.q_offsets, p.kv_offsets, precision="fp8_fwd_bwd", impl="ref")
    assert torch.equal(both, via_kw)
    both.backward(p.do.float())
    want = jagged_attention_fp8_bwd_ref(p.do.float(), q, k, v, both.detach(), p.q_offsets, p.kv_offsets)
    for got, w in zip((t.grad for t in leaves), want[:3]):
        assert torch.equal(got, w.float())
    with pytest.raises(AttentionError, match="precision"):
        jagged_attention(*args, precision="fp4")
    with pytest.raises(AttentionError, match="quant_block"):
        jagged_attention_fp8(*args, quant_block=32)


def test_policy_turns_fp8_attention_on_per_layer():
    from torch import nn

    from model.attention import SelfAttention
    from model.config import ModelConfig
    from model.embeddings import History
    from train.precision import PrecisionPolicy, PrecisionPolicyError, apply_precision_policy

    torch.manual_seed(0)
    cfg = ModelConfig.from_dict({"d_model": 32, "num_heads": 2})
    model = nn.ModuleDict({"layers": nn.ModuleList([SelfAttention(cfg, "full", None, None) for _ in range(2)])})
    policy = PrecisionPolicy(mlp="bf16", attention_kernel="fp8", attention_kernel_layers=("layers.1",), emulate=True)
    report = apply_precision_policy(model, policy)
    assert report.attention == {"layers.0": "bf16", "layers.1": "fp8"}
    assert [m.attention_precision for m in model["layers"]] == ["bf16", "fp8"]

    offsets = torch.tensor([0, 30, 30, 50])
    hist = History(tokens=torch.randn(50, 32), offsets=offsets, timestamps=torch.arange(50), max_length=30)
    layer = model["layers"][1]
    y8 = layer(hist.tokens, hist)
    layer.attention_precision = "bf16"
    y = layer(hist.tokens, hist)
    assert 0 < rel_err(y8, y.double()) <= FP8_REL_BOUND

    apply_precision_policy(model, PrecisionPolicy(mlp="bf16", attention_kernel="fp8"))
    assert all(m.attention_precision == "fp8" for m in model["layers"])
    # The backward's score products in FP8 as well: the same forward, other gradients (CPU: the emulation).
    apply_precision_policy(model, PrecisionPolicy.from_dict({"attention_kernel": "fp8_fwd_bwd"}))
    assert all(m.attention_precision == "fp8_fwd_bwd" for m in model["layers"])
    x = hist.tokens.clone().requires_grad_()
    y_both = layer(x, hist)
    assert torch.equal(y_both, y8)
    y_both.sum().backward()
    dx_both = x.grad.clone()
    layer.attention_precision = "fp8"
    x.grad = None
    layer(x, hist).sum().backward()
    assert 0 < rel_err(dx_both, x.grad.double()) <= FP8_GRAD_REL_BOUND
    with pytest.raises(PrecisionPolicyError, match="attention_kernel_layers"):
        apply_precision_policy(model, PrecisionPolicy(mlp="bf16", attention_kernel="fp8",
                                                      attention_kernel_layers=("layers.7",)))
    with pytest.raises(PrecisionPolicyError, match="attention_kernel"):
        PrecisionPolicy(attention_kernel="fp4")
    with pytest.raises(PrecisionPolicyError, match="high_precision"):
        PrecisionPolicy(attention_kernel="fp8",
                        high_precision=("embedding", "head", "norm", "loss", "attention"))


@pytest.mark.parametrize("precision", ["fp8", "fp8_fwd_bwd"])
def test_custom_op_compiles_counts_flops_and_checkpoints(precision):
    import torch.utils.checkpoint
    from torch.utils.flop_counter import FlopCounterMode

    import kernels.attention_fp8_op  # noqa: F401  (registers the flop formula before the counter snapshots it)
    from kernels import jagged_attention_flops

    p = make_problem(seed=104, lq=[4, 12], lk=[4, 12], bias=False)
    q, k, v = (t.float().requires_grad_() for t in (p.q, p.k, p.v))

    def f(q, k, v):
        return jagged_attention(q, k, v, p.q_offsets, p.kv_offsets, causal=True, impl="triton",
                                precision=precision) * 2

    with FlopCounterMode(display=False) as counter:
        eager = f(q, k, v)
    assert counter.get_total_flops() == jagged_attention_flops(p.q_offsets, p.kv_offsets, 2, 16, causal=True)
    with FlopCounterMode(display=False) as counter:
        f(q, k, v).sum().backward()
    assert counter.get_total_flops() == jagged_attention_flops(p.q_offsets, p.kv_offsets, 2, 16, causal=True,
                                                               backward=True)
    q.grad = None
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    torch.testing.assert_close(compiled, eager)
    compiled.sum().backward()
    dq_compiled = q.grad.clone()
    q.grad = None
    ck = torch.utils.checkpoint.checkpoint(f, q, k, v, use_reentrant=False)
    ck.sum().backward()
    dq = q.grad.clone()
    q.grad = None
    eager.sum().backward()
    torch.testing.assert_close(dq, q.grad)
    torch.testing.assert_close(dq_compiled, q.grad)


def test_v_blocks_of_very_different_scales_and_zero_blocks():
    # The kernel keeps its accumulator in units of the current V block's scale; jumps between blocks
    # (2^20, all-zero, 2^-20) must change units exactly.
    p = make_problem(7, [10, 200], [10, 200], bias=False)
    v = p.v.float().clone()
    v[10:74] *= 2.0**20
    v[74:138] = 0.0
    v[138:] *= 2.0**-20
    args = (p.q.float(), p.k.float(), v, p.q_offsets, p.kv_offsets)
    out = jagged_attention_fp8(*args, impl="triton", quant_block=64)
    ref = jagged_attention_fp8_ref(*args, quant_block=64, tile_n=INTERPRET_TILE_N)
    assert bool(out.isfinite().all())
    assert rel_err(out, ref.double()) <= 1e-5
    assert quantize_jagged(v, p.kv_offsets, 64).scale[2].tolist() == [2.0**-63] * 2  # zero block: clamped scale


def test_benchmark_fp8_case_runs_on_the_interpreter(monkeypatch, capsys):
    # The device benchmark's per-case code (kernel-only call on pre-quantized inputs included), on CPU.
    import benchmarks.attention as bench
    from kernels import attention_impl

    monkeypatch.setattr(bench, "cuda_time", lambda fn, reps=10, warmup=2, calls=1: (fn(), 1.0)[1])
    p = make_problem(9, [24, 9, 40], [24, 9, 40])
    q, k, v = (t.half() for t in (p.q, p.k, p.v))
    kw = dict(causal=True, bias=_bias(p), max_q_len=40, max_kv_len=40)
    with attention_impl("triton"):
        *times, gpu, err_fp8, err_bf, err_emu = bench._fp8_case(q, k, v, p.q_offsets, p.kv_offsets, kw, 64, True,
                                                                 emulation=True)
    assert times == [1.0] * 4 and gpu == 0.0 and "disagree" not in capsys.readouterr().out
    assert err_bf < 0.01 < err_fp8 <= FP8_REL_BOUND
    assert err_emu < 1e-3  # the emulation replays the kernel's own KV tiles (fp16 output rounding)


@pytest.mark.parametrize("act,kw", [("softmax", dict(causal=True)), ("silu", dict(causal=False, targets=True))])
def test_descriptor_path_matches_reference_and_keeps_rows_apart(monkeypatch, act, kw):
    # GEMTRAIN_ATTN_TMA=1: Q, K and the transposed V stream through tensor descriptors spanning every row, so
    # a tile past a row's end reads the next row's codes; they must not reach the row's output.
    from kernels import attention_fp8_op as op8
    from kernels import attention_triton_common as common

    monkeypatch.setattr(common, "TMA", "1")
    made = []
    real = op8._descriptors
    monkeypatch.setattr(op8, "_descriptors", lambda *a: made.append(a[-1]) or real(*a))
    kw = dict(kw)
    targets = kw.pop("targets", False)
    lens = [45, 40, 0, 1]  # row 0 ends inside a 32-key tile: its last tile reads row 1's first tokens
    p = make_problem(13, lens, lens, dim=32, targets=targets)  # descriptors need D = the 32-wide tile
    common_kw = dict(activation=act, bias=_bias(p), num_targets=p.num_targets, quant_block=64, **kw)
    args = (p.q.float(), p.k.float(), p.v.float(), p.q_offsets, p.kv_offsets)
    out = jagged_attention_fp8(*args, impl="triton", **common_kw)
    assert made and all(made), "the kernel did not take the descriptor path"
    ref = jagged_attention_fp8_ref(*args, tile_n=INTERPRET_TILE_N, **common_kw)
    assert rel_err(out, ref.double()) <= 1e-5
    moved = [t.clone() for t in args[:3]]
    for t in moved:
        t[lens[0]:] = 50.0 * torch.randn(t[lens[0]:].shape, generator=torch.Generator().manual_seed(1))
    out2 = jagged_attention_fp8(*moved, p.q_offsets, p.kv_offsets, impl="triton", **common_kw)
    assert torch.equal(out[:lens[0]], out2[:lens[0]])
    assert not torch.equal(out[lens[0]:], out2[lens[0]:])


def test_fp8_backward_descriptor_path_matches_reference_and_keeps_rows_apart(monkeypatch):
    # GEMTRAIN_ATTN_TMA=1: q, k, v and dO stream through descriptors spanning every row, so a tile past a row's
    # end reads the next row's tokens; they must not reach the row's gradients. The codes stream through pointers
    # (a descriptor inside the kernels' CODES tuple does not launch on a GPU: attention_triton_bwd).
    from kernels import attention_op
    from kernels import attention_triton_common as common

    monkeypatch.setattr(common, "TMA", "1")
    made = []
    real = attention_op.descriptor
    monkeypatch.setattr(attention_op, "descriptor", lambda t, on: made.append((t.dtype, on)) or real(t, on))
    lens = [45, 40, 0, 1]
    p = make_problem(14, lens, lens, dim=32, bias=False)  # descriptors need D = the 32-wide tile

    def grads(q, k, v, do):
        leaves = [t.float().clone().requires_grad_() for t in (q, k, v)]
        out = jagged_attention_fp8(*leaves, p.q_offsets, p.kv_offsets, causal=True, impl="triton", quant_block=64,
                                   fp8_backward=True)
        out.backward(do.float())
        return out.detach(), [t.grad for t in leaves]

    out, got = grads(p.q, p.k, p.v, p.do)
    assert (torch.float32, True) in made, "the backward did not stream its operands through descriptors"
    assert all(dtype != torch.float8_e4m3fn for dtype, _ in made), made
    want = jagged_attention_fp8_bwd_ref(p.do.float(), p.q.float(), p.k.float(), p.v.float(), out, p.q_offsets,
                                        p.kv_offsets, causal=True, quant_block=64)
    for g, w in zip(got, want[:3]):
        assert rel_err(g, w) <= 1e-5
    moved = [t.clone() for t in (p.q, p.k, p.v, p.do)]
    for t in moved:
        t[lens[0]:] = 50.0 * torch.randn(t[lens[0]:].shape, generator=torch.Generator().manual_seed(1),
                                         dtype=t.dtype)
    _, got2 = grads(*moved)
    for g, g2 in zip(got, got2):
        assert torch.equal(g[:lens[0]], g2[:lens[0]])
        assert not torch.equal(g[lens[0]:], g2[lens[0]:])


def test_fp8_backward_of_calls_without_tokens():
    # No query tokens, and queries without keys: gradients are zeros, with shapes the compiler's fakes agree on.
    for lq, lk in (([0, 0], [0, 0]), ([3, 2], [0, 0])):
        p = make_problem(15, lq, lk, bias=False)
        leaves = [t.detach().float().clone().requires_grad_() for t in (p.q, p.k, p.v)]
        f = partial(jagged_attention, q_offsets=p.q_offsets, kv_offsets=p.kv_offsets, impl="triton",
                    precision="fp8_fwd_bwd")
        out = torch.compile(f, backend="aot_eager", fullgraph=True)(*leaves)
        out.sum().backward()
        assert bool((out == 0).all())
        assert all(t.grad is not None and bool((t.grad == 0).all()) for t in leaves)
