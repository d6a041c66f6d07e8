"""The QKV projection in FP8 whose outputs are the FP8 attention's operands: no quantize pass between them.

``qkv_codes(x, weights, bias, offsets, heads, scales)`` runs ``x [ΣL, d] -> q, k, v`` (``nn.Linear(d, 3d)``'s
three row blocks) as three ``torch._scaled_mm`` GEMMs on x's tensorwise e4m3 codes, each writing e4m3 codes
straight away, with one power-of-two scale per tensor (``scales``: q's, k's and v's, known before the GEMMs,
as delayed scaling carries them from earlier steps; values beyond them saturate):

* q and k: ``[ΣL, H, D]`` codes (``Fp8Jagged``) with their bias;
* V: transposed (``TransposedCodes``: features along the rows, tokens along the columns, each jagged row
  starting at a multiple of 16 columns), the layout the FP8 kernel reads V in, from a GEMM of the weight
  by x's codes placed at those columns. V's bias stays out of its codes (a GEMM's bias runs along its output
  columns, here tokens) and is returned for the kernel to add to its output (``fp8_fwd_quantized(v_bias=)``):
  softmax rows sum to one, so ``P (V + b) = P V + b``.

The scale blocks of the returned ``Fp8Jagged`` (the kernel reads one scale per 128-token block and head) all
hold their tensor's scale. The output scale goes into the GEMM's input scale (both powers of two, so exact),
and the bias is divided by it, because ``_scaled_mm`` ignored ``scale_result`` with e4m3 output on an H200
(torch 2.11; benchmarks/RESULTS.md). Runs wherever ``torch._scaled_mm`` does (CUDA sm_89+, and PyTorch's CPU
path, which the tests use).

``projected_attention`` is the trainable whole (policy ``attention_kernel: fp8_qkv``): scales from
``bound_scales`` (no history, nothing saturates), the FP8 forward, and a bf16 backward on the codes dequantized
in one pass each (``dequantize``). On an H200 (batch A, benchmarks/qkv_fp8.py, benchmarks/RESULTS.md) the
attention forward on these codes ran 1.30-1.35x our bf16 forward, projection plus attention 1.23-1.32x the bf16
pair, and forward+backward 0.98-1.01x (the backward is bf16's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import mx, triton_launch
from kernels.attention_fp8 import DEFAULT_QUANT_BLOCK, Fp8Jagged
from kernels.attention_fp8_op import TransposedCodes, quant_plan
from kernels.mx_triton import decode_e4m3

Tensor = torch.Tensor
F8 = torch.float8_e4m3fn
E4M3_MAX = 448.0


@dataclass
class QKVCodes:
    """The FP8 attention's operands from ``qkv_codes``: q, k as ``Fp8Jagged`` codes, V as ``TransposedCodes``
    (``v`` holds V's scales, its ``data`` is the transposed codes too), and V's bias (``[H, D]``, or None)."""

    q: Fp8Jagged
    k: Fp8Jagged
    v: Fp8Jagged
    v_transposed: TransposedCodes
    v_bias: Tensor | None
    block: int  # the scale blocks' tokens (all hold one scale per tensor)


def pow2_scale(amax: Tensor) -> Tensor:
    """The least power of two ``s`` (fp32, 0-d) with ``amax / s <= 448``: a tensorwise e4m3 scale."""
    return torch.exp2(torch.ceil(torch.log2(amax.float().clamp_min(2.0**-100) / E4M3_MAX)))


def bound_scales(x: Tensor, weights: tuple[mx.ScaledTensor, ...], bias: Tensor | None) -> Tensor:
    """``[3]`` scales for q, k and v codes that no element can exceed, without computing q, k, v: by
    Cauchy-Schwarz ``|x w_j + b_j| <= ||x|| ||w_j|| + |b_j|`` over x's rows (x's codes differ from x by at most
    2^-4 per element) and the weight codes' rows (V's bias stays out of its codes). Nothing saturates; the
    bound sits about sqrt(d) above typical values, which e4m3's 15 binades of normal numbers absorb."""
    xn = torch.linalg.vector_norm(x, dim=1, dtype=torch.float32).amax() * (1 + 2.0**-4)
    out = []
    for i, w in enumerate(weights):
        wn = torch.linalg.vector_norm(w.data.float(), dim=1).amax() * w.scale
        bn = bias.chunk(3)[i].float().abs().amax() * (1 + 2.0**-7) if bias is not None and i < 2 else 0.0
        out.append(pow2_scale(xn * wn + bn))
    return torch.stack(out)


def quantize_qkv_weight(weight: Tensor) -> tuple[mx.ScaledTensor, mx.ScaledTensor, mx.ScaledTensor]:
    """``nn.Linear(d, 3d).weight`` ``[3d, d]`` as the tensorwise e4m3 codes of its q, k and v row blocks (cast
    once per optimizer step, not per call)."""
    if weight.dim() != 2 or weight.shape[0] % 3:
        raise ValueError(f"quantize_qkv_weight: expected an nn.Linear(d, 3d) weight [3d, d], got {tuple(weight.shape)}")
    return tuple(mx.quantize_tensorwise(w.contiguous()) for w in weight.chunk(3))


def _gemm(a: Tensor, sa: Tensor, bt: Tensor, sb: Tensor, s_out: Tensor, bias: Tensor | None) -> Tensor:
    """e4m3 codes of ``(a sa)(bt sb) + bias`` in units of ``s_out``."""
    b = None if bias is None else (bias.float() / s_out).to(torch.bfloat16)
    return torch._scaled_mm(a, bt, sa / s_out, sb, bias=b, out_dtype=F8, use_fast_accum=True)


def token_columns(offsets: Tensor, columns: Tensor, total: int) -> Tensor:
    """Each token's column in ``TransposedCodes`` (row b's tokens from ``columns[b]`` on)."""
    lens = offsets[1:] - offsets[:-1]
    return torch.arange(total, device=offsets.device) - torch.repeat_interleave(offsets[:-1] - columns[:-1], lens,
                                                                                output_size=total)


def _rows_at_columns(x8: Tensor, dst: Tensor, width: int) -> Tensor:
    """``[width, d]`` e4m3: x's codes at their tokens' columns (``dst``), zeros in the gaps (copied as 8-byte
    words: one-byte elements copied 4x slower on an H200)."""
    d = x8.shape[1]
    out = torch.zeros(width, d, dtype=F8, device=x8.device)
    word = torch.int64 if d % 8 == 0 else torch.uint8
    out.view(torch.uint8).view(word).index_copy_(0, dst, x8.view(torch.uint8).view(word))
    return out


def qkv_codes(x: Tensor, weights: tuple[mx.ScaledTensor, ...], bias: Tensor | None, offsets: Tensor, heads: int,
              scales: Tensor, x_codes: mx.ScaledTensor | None = None, block: int = DEFAULT_QUANT_BLOCK) -> QKVCodes:
    """q, k, v codes of ``x @ W^T + bias`` for the FP8 attention (module docstring). ``weights``:
    ``quantize_qkv_weight(W)``; ``bias``: ``[3d]`` or None; ``scales``: ``[3]`` fp32 powers of two (q's, k's,
    v's; ``pow2_scale`` of their amaxes); ``x_codes``: x's tensorwise e4m3 codes if the caller has them (else
    cast here, current scaling). ``offsets`` ``[B+1]``: the jagged rows of x's tokens."""
    total, d = x.shape
    if d % heads or d % 16:
        raise ValueError(f"qkv_codes: width {d} must split into {heads} heads and be a multiple of 16 (FP8 GEMMs)")
    if len(weights) != 3 or any(w.shape != (d, d) for w in weights):
        raise ValueError(f"qkv_codes: expected three [{d}, {d}] weight codes (quantize_qkv_weight), got "
                         f"{[tuple(w.shape) for w in weights]}")
    if scales.shape != (3,):
        raise ValueError(f"qkv_codes: scales must be [3] (q, k, v), got {tuple(scales.shape)}")
    xs = x_codes if x_codes is not None else mx.quantize_tensorwise(x)
    bq, bk, bv = (None, None, None) if bias is None else bias.chunk(3)
    plan = quant_plan(offsets, block, total)
    width = max(16, (total + (offsets.numel() - 1) * 15 + 15) // 16 * 16)  # bounds the columns without a sync
    xpad = _rows_at_columns(xs.data, token_columns(offsets, plan.columns, total), width)
    wq, wk, wv = weights
    q8 = _gemm(xs.data, xs.scale, wq.data.t(), wq.scale, scales[0], bq)
    k8 = _gemm(xs.data, xs.scale, wk.data.t(), wk.scale, scales[1], bk)
    vt8 = _gemm(wv.data, wv.scale, xpad.t(), xs.scale, scales[2], None)  # [d, width]: V transposed
    nb = max((total + block - 1) // block + offsets.numel() - 1, 1)  # scale blocks, as the quantizer bounds them
    per_block = lambda s: s.reshape(1, 1).expand(nb, heads).contiguous()
    dim = d // heads
    return QKVCodes(
        Fp8Jagged(q8.view(total, heads, dim), per_block(scales[0]), plan.block_offsets),
        Fp8Jagged(k8.view(total, heads, dim), per_block(scales[1]), plan.block_offsets),
        Fp8Jagged(vt8, per_block(scales[2]), plan.block_offsets),
        TransposedCodes(vt8, plan.columns),
        None if bv is None else bv.view(heads, dim),
        block,
    )


def attention(codes: QKVCodes, offsets: Tensor, max_len: int | None = None, causal: bool = True,
              scale: float | None = None, out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """Softmax self-attention forward ``[ΣL, H, D]`` of the FP8 kernel on ``qkv_codes``' operands, V's bias
    added in its epilogue. ``max_len``: the longest row (buckets the kernel's tuning; from the tokens per row
    when None)."""
    from kernels.attention_fp8_op import fp8_fwd_quantized
    from kernels.attention_op import _len_key

    total, heads, dim = codes.q.data.shape
    like = torch.empty((), dtype=out_dtype, device=offsets.device).expand(total, heads, dim)  # shape and dtype
    len_key = _len_key(offsets, like, like, max_len, max_len)
    scale = dim**-0.5 if scale is None else scale
    return fp8_fwd_quantized(like, like, codes.q, codes.k, codes.v, codes.v_transposed, offsets, offsets, None,
                             None, None, None, None, "softmax", causal, scale, 0, -1, 0, len_key, max_len or 0,
                             codes.block, v_bias=codes.v_bias)[0]


@triton.jit
def _dequant_kernel(c_ptr, stride_c, col_ptr, s_ptr, b_ptr, o_ptr, T, D,
                    TRANSPOSED: tl.constexpr, HAS_BIAS: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """out ``[T, D]`` = codes * scale (+ bias per column), from row-major codes ``[T, D]`` (row stride
    ``stride_c``) or from ``TransposedCodes`` (``[D, columns]``, token t at column ``col[t]``)."""
    t = (tl.program_id(0) * BT + tl.arange(0, BT)).to(tl.int64)
    j = (tl.program_id(1) * BD + tl.arange(0, BD)).to(tl.int64)
    tm, jm = t < T, j < D
    scale = tl.load(s_ptr)
    if TRANSPOSED:  # [BD, BT] tiles: a warp's lanes read consecutive columns, so its byte loads coalesce
        col = tl.load(col_ptr + t, mask=tm, other=0).to(tl.int64)
        code = tl.load(c_ptr + j[:, None] * stride_c + col[None, :], mask=jm[:, None] & tm[None, :], other=0)
        v = tl.trans(decode_e4m3(code) * scale)
    else:
        code = tl.load(c_ptr + t[:, None] * stride_c + j[None, :], mask=tm[:, None] & jm[None, :], other=0)
        v = decode_e4m3(code) * scale
    if HAS_BIAS:
        v += tl.load(b_ptr + j, mask=jm, other=0.0).to(tl.float32)[None, :]
    tl.store(o_ptr + t[:, None] * D + j[None, :], v.to(o_ptr.dtype.element_ty), mask=tm[:, None] & jm[None, :])


def dequantize(codes: Tensor, scale: Tensor, dtype: torch.dtype, columns: Tensor | None = None,
               bias: Tensor | None = None) -> Tensor:
    """``[T, D]`` values of e4m3 ``codes`` times the 0-d ``scale`` (plus ``bias`` ``[D]``) in ``dtype``: ``codes``
    row-major ``[T, D]``, or transposed ``[D, width]`` with token t at column ``columns[t]`` (one pass, the
    transposition included)."""
    transposed = columns is not None
    total, d = (columns.numel(), codes.shape[0]) if transposed else codes.shape
    out = torch.empty(total, d, dtype=dtype, device=codes.device)
    if total == 0:
        return out
    bt, bd = (128, 64) if transposed else (32, 128)
    u8 = codes.view(torch.uint8)
    triton_launch.run(_dequant_kernel, (triton.cdiv(total, bt), triton.cdiv(d, bd)), u8, u8.stride(0),
                      columns if transposed else u8, scale.float().reshape(1), out if bias is None else bias, out,
                      total, d, TRANSPOSED=transposed, HAS_BIAS=bias is not None, BT=bt, BD=bd, num_warps=4)
    return out


_WEIGHT_CODES: dict[int, tuple] = {}  # id(weight) -> (weight's version, data pointer, codes): cast once per update


def _weight_codes(weight: Tensor) -> tuple[mx.ScaledTensor, ...]:
    key = (weight._version, weight.data_ptr())
    hit = _WEIGHT_CODES.get(id(weight))
    if hit is None or hit[0] != key:
        hit = (key, quantize_qkv_weight(weight.detach()))
        _WEIGHT_CODES[id(weight)] = hit
    return hit[1]


class _ProjectedAttention(torch.autograd.Function):
    """x -> FP8 projection codes -> FP8 attention forward; backward in 16 bits on the dequantized codes (the
    attention's straight-through backward, as ``precision="fp8"``), then the projection's dx, dW, db."""

    @staticmethod
    def forward(ctx, x, weight, bias, offsets, pos_weight, time_weight, timestamps, heads, opts):
        from kernels.attention_fp8_op import fp8_fwd_quantized
        from kernels.attention_op import _len_key, _plan, work_list

        dt = opts["dtype"]
        xb = x.to(dt).contiguous()
        weights = _weight_codes(weight)
        xs = mx.quantize_tensorwise(xb)
        scales = bound_scales(xb, weights, bias)
        codes = qkv_codes(xb, weights, bias, offsets, heads, scales, x_codes=xs)
        total, dim = xb.shape[0], xb.shape[1] // heads
        like = torch.empty((), dtype=dt, device=x.device).expand(total, heads, dim)
        len_key = _len_key(offsets, like, like, opts["max_len"], opts["max_len"])
        block, window = int(opts["block_size"] or 0), -1 if opts["window"] is None else int(opts["window"])
        work = work_list(offsets, offsets, _plan(like, like, len_key, block, 0)["tile_q"], total)[0]
        ts = None if time_weight is None else timestamps.contiguous()
        out, lse = fp8_fwd_quantized(like, like, codes.q, codes.k, codes.v, codes.v_transposed, offsets, offsets,
                                     None, pos_weight, time_weight, ts, ts, "softmax", opts["causal"],
                                     opts["scale"], block, window, 0, len_key, 0, codes.block, work,
                                     v_bias=codes.v_bias)
        ctx.save_for_backward(xb, weight, bias, offsets, out, lse, codes.q.data, codes.k.data,
                              codes.v_transposed.data, codes.v_transposed.offsets, scales, pos_weight, time_weight,
                              ts, work)
        ctx.args = (heads, block, window, len_key, opts, x.dtype)
        return out

    @staticmethod
    def backward(ctx, dout):
        from kernels.attention_op import _backward_call

        (xb, weight, bias, offsets, out, lse, q8, k8, vt8, columns, scales, pos_weight, time_weight, ts,
         work) = ctx.saved_tensors
        heads, block, window, len_key, opts, x_dtype = ctx.args
        total, d = xb.shape
        bf = opts["dtype"]
        q, k = (dequantize(c.view(total, d), sc, bf).view(c.shape) for c, sc in ((q8, scales[0]), (k8, scales[1])))
        v = dequantize(vt8, scales[2], bf, token_columns(offsets, columns, total),
                       None if bias is None else bias.chunk(3)[2])
        dq, dk, dv, dpos, dtime = _backward_call(
            dout.contiguous().to(bf), q, k, v.view(total, heads, d // heads), out, lse, offsets, offsets, None,
            pos_weight, time_weight, ts, ts, "softmax", opts["causal"], opts["scale"], block, window, 0, len_key, 0,
            work)
        parts = [t.reshape(total, d) for t in (dq, dk, dv)]  # d(x W^T + b) by row block of W, each [ΣL, d]
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            wb = weight.to(bf).chunk(3)
            dx = parts[0] @ wb[0]
            for g, w in zip(parts[1:], wb[1:]):
                dx.addmm_(g, w)
            dx = dx.to(x_dtype)
        if ctx.needs_input_grad[1]:
            dw = torch.cat([g.t() @ xb for g in parts]).to(weight.dtype)
        if bias is not None and ctx.needs_input_grad[2]:
            db = torch.cat([g.sum(0, dtype=torch.float32) for g in parts]).to(bias.dtype)
        return (dx, dw, db, None, dpos if pos_weight is not None else None,
                dtime if time_weight is not None else None, None, None, None)


def projected_attention(x: Tensor, weight: Tensor, bias: Tensor | None, offsets: Tensor, heads: int, *,
                        causal: bool = True, scale: float | None = None, pos_weight: Tensor | None = None,
                        time_weight: Tensor | None = None, timestamps: Tensor | None = None,
                        block_size: int | None = None, window: int | None = None,
                        max_len: int | None = None, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """Softmax self-attention of ``x [ΣL, d]`` over its jagged rows with ``q, k, v = x W^T + b`` (``W``
    ``[3d, d]``, an ``nn.Linear(d, 3d)``'s) in one step: the projection writes the FP8 attention's e4m3 operands
    (``qkv_codes``, scales from ``bound_scales``) and the FP8 forward runs on them. The backward is bf16: the
    attention's on the dequantized codes (straight-through), then the projection's. Returns ``[ΣL, H, D]`` in
    ``dtype``, the precision of the output and of the backward (bf16; fp32 under the interpreter, whose bf16 is
    wrong).
    The relative bias tables, block-local and window masks are the attention kernels' (``timestamps``: ``[ΣL]``,
    with ``time_weight``). Runs where ``torch._scaled_mm`` and the Triton kernels run (CUDA sm_89+, or
    ``TRITON_INTERPRET=1``)."""
    from kernels.attention_triton_common import INTERPRET

    if not x.is_cuda and not INTERPRET:
        raise ValueError("projected_attention: the FP8 projection route runs Triton kernels, on a CUDA GPU (sm_89+) "
                         "or under TRITON_INTERPRET=1; on CPU use attention_kernel fp8 (its emulating reference)")
    d = x.shape[1]
    if weight.shape != (3 * d, d):
        raise ValueError(f"projected_attention: weight must be [3d, d] = [{3 * d}, {d}], got {tuple(weight.shape)}")
    opts = dict(causal=bool(causal), scale=(d // heads) ** -0.5 if scale is None else float(scale),
                block_size=block_size, window=window, max_len=max_len, dtype=dtype)
    return _ProjectedAttention.apply(x, weight, bias, offsets.contiguous(), pos_weight, time_weight, timestamps,
                                     heads, opts)
