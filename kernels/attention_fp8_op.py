"""FP8 jagged attention as ``torch.library`` custom ops (``gemtrain::jagged_attn_fp8_fwd`` / ``_bwd``).

The forward op quantizes q, k, v (Triton twin of ``kernels.attention_fp8.quantize_jagged``, one launch for the
three) and runs the FP8 forward kernel. With ``fp8_backward`` it also returns the row-major codes and scales
of q, k and v, and its autograd backward is ``gemtrain::jagged_attn_fp8_bwd``: dO quantized in the same blocks,
the bf16 backward kernels with their two score products (S = QK^T, dP = dO V^T) on those codes
(``attention_triton_bwd``, ``FP8``). Without it the backward is the bf16 path's ``gemtrain::jagged_attn_bwd``
on the unquantized q, k, v (straight-through gradients; see ``kernels.attention_fp8``). Both take the FP8
forward's output and log-sum-exp, and its list of query tiles.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
from torch.utils.flop_counter import register_flop_formula
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import triton_launch
from kernels.attention_fp8 import Fp8Jagged
from kernels.attention_fp8_triton import (
    jagged_attn_fp8_fwd_kernel,
    jagged_quant_kernel,
    jagged_quant_qkv_kernel,
    quant_plan_kernel,
)
from kernels.attention_op import (
    _NON_TENSOR,
    ScoreCodes,
    _backward_call,
    _bwd_flops,
    _launch_key,
    _len_key,
    _meta,
    _pairs_or_estimate,
    _plan,
    _ptr,
    _unset,
    attention_op,
    backward_launches,
    descriptors_pay,
    eager_call,
    fake_grads,
    input_grads,
    no_token_grads,
    work_list,
)
from kernels.attention_spec import RelativeBias
from kernels.attention_triton_common import INTERPRET, descriptor, launch, use_tma
from kernels.attention_worklist import fits

Tensor = torch.Tensor


class QuantPlan(NamedTuple):
    """Where the quantizer's work goes for one jagged layout (K and V share it, and Q in self-attention):
    each row's first scale block (``block_offsets``, [B+1] int32), each row's first column in
    ``TransposedCodes`` (``columns``, [B+1] int32: lengths rounded up to ``ROW_ALIGN``), and the (row, block)
    work list in row order (``work`` [n_items, 2] int32, row -1 past the last block; ``n_items`` bounds the
    blocks without a device sync)."""

    block_offsets: Tensor
    columns: Tensor
    work: Tensor
    n_items: int


def quant_plan(offsets: Tensor, block: int, total: int) -> QuantPlan:
    """The ``QuantPlan`` of a layout: one Triton launch on the GPU (``quant_plan_kernel``), else these torch ops
    (its reference)."""
    num_rows = offsets.numel() - 1
    n_items = triton.cdiv(total, block) + num_rows
    if offsets.is_cuda and not INTERPRET and fits(num_rows, total) and not torch.compiler.is_compiling():
        return quant_plan_triton(offsets, block, n_items)
    lens = (offsets[1:] - offsets[:-1]).long()
    zero = lens.new_zeros(1)
    cum = ((lens + block - 1) // block).cumsum(0)
    blk_off = torch.cat([zero, cum])
    cols = torch.cat([zero, ((lens + ROW_ALIGN - 1) // ROW_ALIGN * ROW_ALIGN).cumsum(0)])
    t = torch.arange(n_items, device=offsets.device)
    row = torch.searchsorted(cum, t, right=True)
    valid = row < num_rows
    blk = t - blk_off[row.clamp(max=num_rows)]
    work = torch.stack([torch.where(valid, row, -1), torch.where(valid, blk, 0)], 1).to(torch.int32)
    return QuantPlan(blk_off.to(torch.int32), cols.to(torch.int32), work.contiguous(), n_items)


def quant_plan_triton(offsets: Tensor, block: int, n_items: int) -> QuantPlan:
    """``quant_plan`` in one launch (needs ``attention_worklist.fits``)."""
    num_rows = offsets.numel() - 1
    rows = max(16, triton.next_power_of_2(num_rows))
    blk_off = torch.empty(num_rows + 1, dtype=torch.int32, device=offsets.device)
    cols = torch.empty(num_rows + 1, dtype=torch.int32, device=offsets.device)
    work = torch.empty((n_items, 2), dtype=torch.int32, device=offsets.device)
    triton_launch.run(quant_plan_kernel, (1,), offsets, blk_off, cols, work, num_rows, n_items, BLOCK=block,
                      ALIGN=ROW_ALIGN, ROWS=rows, LOG_ROWS=rows.bit_length() - 1, CHUNK=1024, num_warps=4)
    return QuantPlan(blk_off, cols, work, n_items)


class TransposedCodes(NamedTuple):
    """V's e4m3 codes as ``data`` ``[H * D, width]``: head h's dim d is row ``h * D + d``, tokens run along the
    columns, and each jagged row's tokens start at a multiple of ``ROW_ALIGN`` columns (``offsets`` ``[B+1]``,
    zeros in the gaps), so tiles that start at multiples of the KV tile inside a row start on 16-byte
    boundaries (tensor descriptors need that on their contiguous dim). ``width`` bounds the columns used
    without a device sync."""

    data: Tensor
    offsets: Tensor


ROW_ALIGN = 16


def _outputs(x: Tensor, offsets: Tensor, block: int, transposed: bool, row_major: bool
             ) -> tuple[Tensor, Tensor, Tensor | None]:
    """Buffers of one quantized tensor: (codes, scales, transposed codes)."""
    total, heads, dim = x.shape
    data = torch.empty(x.shape if row_major or not transposed else (0, heads, dim), dtype=torch.uint8,
                       device=x.device)
    scale = torch.empty(max((total + block - 1) // block + offsets.numel() - 1, 1), heads, dtype=torch.int32,
                        device=x.device)  # bounds the blocks without a device sync
    if not transposed:
        return data, scale, None
    width = (total + (offsets.numel() - 1) * (ROW_ALIGN - 1) + ROW_ALIGN - 1) // ROW_ALIGN * ROW_ALIGN
    return data, scale, torch.empty(heads * dim, max(width, ROW_ALIGN), dtype=torch.uint8, device=x.device)


def _results(data: Tensor, scale: Tensor, plan: QuantPlan, data_t: Tensor | None = None
             ) -> tuple[Fp8Jagged, TransposedCodes | None]:
    f8 = torch.float8_e4m3fn
    vt = None if data_t is None else TransposedCodes(data_t.view(f8), plan.columns)
    return Fp8Jagged(data.view(f8), scale.view(torch.float32), plan.block_offsets), vt


def _quant_meta(x: Tensor, block: int) -> dict:
    dim = x.shape[-1]
    return dict(H=x.shape[1], HEAD_DIM=dim, BLOCK_D=max(16, triton.next_power_of_2(dim)), QUANT_BLOCK=block,
                num_warps=8 if block * dim >= 8192 else 4)  # a 128x128 fp32 tile would spill with 4 warps


def quantize_jagged_triton(x: Tensor, offsets: Tensor, block: int, transposed: bool = False,
                           plan: QuantPlan | None = None,
                           row_major: bool = True) -> tuple[Fp8Jagged, TransposedCodes | None]:
    """Triton twin of ``quantize_jagged`` (bit-identical), one read of ``x``; with ``transposed`` also the
    ``TransposedCodes`` that the attention kernel reads V from.
    ``plan``: ``quant_plan(offsets, block, len(x))``, to share one between tensors of the same layout.
    ``row_major=False`` (with ``transposed``) skips the ``[tokens, H, D]`` codes: ``data`` is then empty."""
    plan = plan if plan is not None else quant_plan(offsets, block, x.shape[0])
    data, scale, data_t = _outputs(x, offsets, block, transposed, row_major)
    if plan.n_items > 0:
        triton_launch.run(jagged_quant_kernel, (plan.n_items * x.shape[1],),
            x.contiguous(), data, data if data_t is None else data_t, scale, offsets, plan.block_offsets,
            plan.work, plan.columns, 0 if data_t is None else data_t.stride(0), TRANSPOSED=transposed,
            ROW_MAJOR=row_major or not transposed, **_quant_meta(x, block),
        )
    return _results(data, scale, plan, data_t)


def quant_plans(q: Tensor, k: Tensor, q_offsets: Tensor, kv_offsets: Tensor, block: int
                ) -> tuple[QuantPlan, QuantPlan]:
    """(query layout's plan, key layout's plan): one, shared, in self-attention."""
    kv_plan = quant_plan(kv_offsets, block, k.shape[0])
    self_attn = q_offsets.data_ptr() == kv_offsets.data_ptr() and q.shape[0] == k.shape[0]
    return (kv_plan if self_attn else quant_plan(q_offsets, block, q.shape[0])), kv_plan


def quantize_qkv(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, block: int,
                 v_transposed: bool, v_row_major: bool = False
                 ) -> tuple[Fp8Jagged, Fp8Jagged, Fp8Jagged, TransposedCodes | None]:
    """``quantize_jagged_triton`` of q, k and v in one launch: v transposed alone when ``v_transposed``, in both
    layouts when ``v_row_major`` too (the backward's dP product reads it row-major)."""
    q_plan, kv_plan = quant_plans(q, k, q_offsets, kv_offsets, block)
    qd, qs, _ = _outputs(q, q_offsets, block, False, True)
    kd, ks, _ = _outputs(k, kv_offsets, block, False, True)
    vd, vs, vt = _outputs(v, kv_offsets, block, v_transposed, v_row_major)
    items = max(q_plan.n_items, kv_plan.n_items)
    if items > 0:
        triton_launch.run(jagged_quant_qkv_kernel, (items * q.shape[1], 3),
            q.contiguous(), k.contiguous(), v.contiguous(), qd, kd, vd, vd if vt is None else vt, qs, ks, vs,
            q_offsets, kv_offsets, q_plan.block_offsets, kv_plan.block_offsets, q_plan.work, kv_plan.work,
            kv_plan.columns, q_plan.n_items, kv_plan.n_items, 0 if vt is None else vt.stride(0),
            V_TRANSPOSED=v_transposed, V_ROW_MAJOR=v_row_major or not v_transposed, **_quant_meta(q, block),
        )
    vq, v_codes = _results(vd, vs, kv_plan, vt)
    return _results(qd, qs, q_plan)[0], _results(kd, ks, kv_plan)[0], vq, v_codes


def _descriptors(q: Tensor, k: Tensor, v_t: Tensor | None, enabled: bool) -> tuple:
    """Tensor descriptors of the Q and K codes (``[tokens, H*D]``) and of the transposed V codes
    (``TransposedCodes.data``); block shapes are set per configuration (``descriptor_hook``). The tensors
    themselves when descriptors are off."""
    if not enabled:
        return q, k, k if v_t is None else v_t
    vt = TensorDescriptor(v_t, list(v_t.shape), [v_t.stride(0), 1], [q.shape[-1], 16])
    return descriptor(q, True), descriptor(k, True), vt


def fp8_fwd_quantized(
    q: Tensor, k: Tensor, qq: Fp8Jagged, kq: Fp8Jagged, vq: Fp8Jagged, vt: TransposedCodes | None,
    q_offsets: Tensor, kv_offsets: Tensor, num_targets: Tensor | None, pos_weight: Tensor | None,
    time_weight: Tensor | None, q_timestamps: Tensor | None, kv_timestamps: Tensor | None,
    activation: str, causal: bool, scale: float, block_size: int, window: int, norm: int, len_key: int,
    q_len_hint: int, quant_block: int, work: Tensor | None = None, v_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The FP8 forward kernel on already-quantized inputs (``q``/``k``: shapes and output dtype only).
    ``vt``: the transposed V codes (read instead of ``vq.data`` when given). ``work``: the list of query tiles
    (``attention_op.work_list`` at the plan's query tile), built here when not given. ``v_bias`` (softmax only,
    ``[H, D]``): a bias of V left out of its codes, added to every output row that sees a key (the softmax
    weights of a row sum to one); ``kernels.qkv_fp8`` makes V's codes without it."""
    if v_bias is not None and activation != "softmax":
        raise ValueError(f"fp8_fwd_quantized: v_bias needs softmax attention (its rows sum to one), got "
                         f"activation={activation!r}: put V's bias into its codes instead")
    v_t = None if vt is None else vt.data
    out, lse = _unset(q), _unset(q, q.shape[:2], torch.float32)
    plan = _plan(q, k, len_key, block_size, q_len_hint)
    plan["block_d"] = max(32, plan["block_d"])  # FP8 tensor-core MMAs reduce over >= 32 elements
    if work is None:
        work = work_list(q_offsets, kv_offsets, plan["tile_q"], q.shape[0])[0]
    n_items = work.shape[0]
    meta = _meta(q, activation, causal, block_size, window, norm, num_targets, pos_weight, time_weight, plan)
    meta.pop("PREC")
    d = q.shape[-1]
    keys = min(len_key, k.shape[0], block_size if block_size > 0 else len_key)
    tma = v_t is not None and use_tma([qq.data, kq.data, v_t], d, plan["block_d"],
                                      descriptors_pay(q.shape[0], keys, q.shape[1], d))
    meta["USE_TMA"] = tma
    launch(jagged_attn_fp8_fwd_kernel, (n_items * q.shape[1],), (
        qq.data, kq.data, vq.data if v_t is None else v_t, *_descriptors(qq.data, kq.data, v_t, tma),
        qq.scale, kq.scale, vq.scale, qq.block_offsets,
        kq.block_offsets, out, lse, q_offsets, kv_offsets, _ptr(num_targets, q_offsets), work,
        _ptr(pos_weight, lse), _ptr(time_weight, lse), _ptr(q_timestamps, q_offsets),
        _ptr(kv_timestamps, kv_offsets), kv_offsets if vt is None else vt.offsets,
        lse if v_bias is None else v_bias.contiguous(), scale, float(max(norm, 1)),
        max(window, 0), len_key, 0 if v_t is None else v_t.stride(0),
    ), dict(QUANT_BLOCK=quant_block, V_TRANSPOSED=v_t is not None, BLOCK_M=plan["tile_q"],
            HAS_VBIAS=v_bias is not None, **meta),
        _launch_key(len_key, q, q_offsets, q_timestamps))
    return out, lse


@torch.library.custom_op("gemtrain::jagged_attn_fp8_fwd", mutates_args=())
def jagged_attn_fp8_fwd(
    q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
    num_targets: Tensor | None, pos_weight: Tensor | None, time_weight: Tensor | None,
    q_timestamps: Tensor | None, kv_timestamps: Tensor | None,
    activation: str, causal: bool, scale: float, block_size: int, window: int, norm: int, len_key: int,
    q_len_hint: int, quant_block: int, v_transposed: bool, fp8_backward: bool, work: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(out, lse, then for ``fp8_backward`` the codes and scales of q, k and v, row-major; else empty)."""
    num_rows = q_offsets.numel() - 1
    if q.shape[0] == 0 or k.shape[0] == 0 or num_rows == 0:
        out, lse = torch.zeros_like(q), torch.full(q.shape[:2], float("inf"), dtype=torch.float32, device=q.device)
        return out, lse, *_no_codes(q, k, v, q_offsets, kv_offsets, quant_block, fp8_backward)  # as the fake's
    qq, kq, vq, v_t = quantize_qkv(q, k, v, q_offsets, kv_offsets, quant_block, v_transposed, fp8_backward)
    out, lse = fp8_fwd_quantized(q, k, qq, kq, vq, v_t, q_offsets, kv_offsets, num_targets, pos_weight,
                                 time_weight, q_timestamps, kv_timestamps, activation, causal, scale, block_size,
                                 window, norm, len_key, q_len_hint, quant_block, work)
    if not fp8_backward:
        return out, lse, *_no_codes(q, k, v, q_offsets, kv_offsets, quant_block, False)
    return out, lse, qq.data, qq.scale, kq.data, kq.scale, vq.data, vq.scale


def _no_codes(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, block: int,
              shaped: bool) -> tuple[Tensor, ...]:
    """The forward op's code outputs: empty, or (``shaped``) unwritten buffers of their shapes (fake tensors, and
    calls without tokens, whose backward reads nothing)."""
    f8 = torch.float8_e4m3fn

    def pair(x: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
        if not shaped:
            return x.new_empty(0, dtype=f8), x.new_empty(0, dtype=torch.float32)
        blocks = max((x.shape[0] + block - 1) // block + offsets.shape[0] - 1, 1)  # as ``_outputs``
        return x.new_empty(x.shape, dtype=f8), x.new_empty((blocks, x.shape[1]), dtype=torch.float32)

    return (*pair(q, q_offsets), *pair(k, kv_offsets), *pair(v, kv_offsets))


@jagged_attn_fp8_fwd.register_fake
def _(q, k, v, q_offsets, kv_offsets, num_targets, pos_weight, time_weight, q_timestamps, kv_timestamps,
      activation, causal, scale, block_size, window, norm, len_key, q_len_hint, quant_block, v_transposed,
      fp8_backward, work=None):
    return (torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32),
            *_no_codes(q, k, v, q_offsets, kv_offsets, quant_block, fp8_backward))


@attention_op("jagged_attn_fp8_bwd")
def jagged_attn_fp8_bwd(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, q_codes: Tensor, q_scale: Tensor,
    k_codes: Tensor, k_scale: Tensor, v_codes: Tensor, v_scale: Tensor, q_offsets: Tensor,
    kv_offsets: Tensor, num_targets: Tensor | None, pos_weight: Tensor | None, time_weight: Tensor | None,
    q_timestamps: Tensor | None, kv_timestamps: Tensor | None,
    activation: str, causal: bool, scale: float, block_size: int, window: int, norm: int, len_key: int,
    q_len_hint: int, quant_block: int, work: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``jagged_attn_bwd`` with the score products on the forward's codes and dO's (quantized here)."""
    if q.shape[0] == 0 or k.shape[0] == 0 or q_offsets.numel() <= 1:
        return no_token_grads(q, k, v, pos_weight, time_weight)
    do = do.contiguous()
    q_plan, kv_plan = quant_plans(q, k, q_offsets, kv_offsets, quant_block)
    doq, _ = quantize_jagged_triton(do, q_offsets, quant_block, plan=q_plan)
    codes = ScoreCodes(q_codes, k_codes, v_codes, doq.data, q_scale, k_scale, v_scale, doq.scale,
                       q_plan.block_offsets, kv_plan.block_offsets, quant_block)
    return backward_launches(do, q, k, v, out, lse, q_offsets, kv_offsets, num_targets, pos_weight,
                             time_weight, q_timestamps, kv_timestamps, activation, causal, scale, block_size,
                             window, norm, len_key, q_len_hint, work, codes)


@jagged_attn_fp8_bwd.register_fake
def _(do, q, k, v, out, lse, q_codes, q_scale, k_codes, k_scale, v_codes, v_scale, q_offsets, kv_offsets,
      num_targets, pos_weight, time_weight, q_timestamps, kv_timestamps, activation, causal, scale, block_size,
      window, norm, len_key, q_len_hint, quant_block, work=None):
    return fake_grads(q, k, v, pos_weight, time_weight)


_SHARED = len(_NON_TENSOR)  # the forward's non-tensor arguments shared with the bf16 op; then quant_block,
# v_transposed and fp8_backward, then the work list


def _setup_context(ctx, inputs, output) -> None:
    (q, k, v, q_offsets, kv_offsets, num_targets, pos_weight, time_weight, q_ts, kv_ts, *rest) = inputs
    work = rest[_SHARED + 3] if len(rest) > _SHARED + 3 else None
    out, lse, *codes = output
    ctx.save_for_backward(q, k, v, out, lse, *codes, q_offsets, kv_offsets, num_targets, pos_weight, time_weight,
                          q_ts, kv_ts, work)
    ctx.rest = rest[:_SHARED]
    ctx.quant_block, _, ctx.fp8_backward = rest[_SHARED:_SHARED + 3]


def _backward(ctx, dout, *_):
    q, k, v, out, lse, *codes, q_offsets, kv_offsets, num_targets, pos_weight, time_weight, q_ts, kv_ts, work = (
        ctx.saved_tensors)
    tables = (q_offsets, kv_offsets, num_targets, pos_weight, time_weight, q_ts, kv_ts)
    if ctx.fp8_backward:
        grads = _fp8_backward_call(dout, q, k, v, out, lse, *codes, *tables, *ctx.rest, ctx.quant_block, work)
    else:
        grads = _backward_call(dout, q, k, v, out, lse, *tables, *ctx.rest, work)
    return input_grads(grads, pos_weight, time_weight, _SHARED + 4)


_fp8_backward_call = eager_call("jagged_attn_fp8_bwd")

jagged_attn_fp8_fwd.register_autograd(_backward, setup_context=_setup_context)


@register_flop_formula(torch.ops.gemtrain.jagged_attn_fp8_fwd, get_raw=True)
def _fwd_flops(*args, out_val=None, **kwargs) -> int:
    q = args[0]
    return 4 * _pairs_or_estimate(args[3], args[4], args) * q.shape[1] * q.shape[2]


@register_flop_formula(torch.ops.gemtrain.jagged_attn_fp8_bwd, get_raw=True)
def _fp8_bwd_flops(*args, out_val=None, **kwargs) -> int:
    return _bwd_flops(*args[:6], *args[12:], out_val=out_val)  # the bf16 op's arguments, less the codes


def jagged_attention_fp8_triton(
    q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *, activation: str, causal: bool,
    scale: float, bias: RelativeBias | None, block_size: int | None, window: int | None,
    num_targets: Tensor | None, pointwise_norm: str | int, max_q_len: int | None, max_kv_len: int | None,
    quant_block: int, v_transposed: bool = True, fp8_backward: bool = False,
) -> Tensor:
    """Triton path of ``kernels.attention_fp8.jagged_attention_fp8`` (arguments already validated).
    ``fp8_backward``: the backward's score products in FP8 (the forward then keeps its codes) where a gradient
    is asked for."""
    bias = bias if bias is not None and not bias.is_empty else None
    pos_w = bias.pos_weight if bias is not None else None
    time_w = bias.time_weight if bias is not None else None
    q_ts = bias.q_timestamps.contiguous() if time_w is not None else None
    kv_ts = bias.kv_timestamps.contiguous() if time_w is not None else None
    q, k, v, q_offsets, kv_offsets = (t.contiguous() for t in (q, k, v, q_offsets, kv_offsets))
    len_key, q_len_hint = _len_key(q_offsets, q, k, max_q_len, max_kv_len), int(max_q_len or 0)
    # One list of query tiles for the FP8 forward and the bf16 backward (both tile queries as ``_plan`` says).
    work = work_list(q_offsets, kv_offsets, _plan(q, k, len_key, int(block_size or 0), q_len_hint)["tile_q"],
                     q.shape[0])[0]
    keep_codes = fp8_backward and torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, pos_w, time_w))
    out, *_ = torch.ops.gemtrain.jagged_attn_fp8_fwd(
        q, k, v, q_offsets, kv_offsets,
        None if num_targets is None else num_targets.contiguous(),
        None if pos_w is None else pos_w.contiguous(), None if time_w is None else time_w.contiguous(),
        q_ts, kv_ts, activation, bool(causal), float(scale), int(block_size or 0),
        -1 if window is None else int(window), 0 if pointwise_norm == "row" else int(pointwise_norm),
        len_key, q_len_hint, int(quant_block), bool(v_transposed), bool(keep_codes), work,
    )
    return out


__all__ = ["QuantPlan", "TransposedCodes", "fp8_fwd_quantized", "jagged_attention_fp8_triton", "quant_plan",
           "quant_plan_triton", "quant_plans", "quantize_jagged_triton", "quantize_qkv"]
