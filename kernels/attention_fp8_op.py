"""FP8 jagged attention as a ``torch.library`` custom op (``gemtrain::jagged_attn_fp8_fwd``).

The op quantizes q, k, v (Triton twin of ``kernels.attention_fp8.quantize_jagged``, one pass each) and
runs the FP8 forward kernel.
Its autograd backward is the bf16 path's ``gemtrain::jagged_attn_bwd`` on the unquantized q, k, v with the
FP8 forward's output and log-sum-exp (straight-through gradients; see ``kernels.attention_fp8``).
"""

from __future__ import annotations

import torch
import triton
from torch.utils.flop_counter import register_flop_formula

from kernels.attention_fp8 import Fp8Jagged
from kernels.attention_fp8_triton import jagged_attn_fp8_fwd_kernel, jagged_quant_kernel
from kernels.attention_op import _len_key, _meta, _pairs_or_estimate, _plan, _ptr, _unset, work_list
from kernels.attention_spec import RelativeBias
from kernels.attention_triton_common import INTERPRET

Tensor = torch.Tensor


def quant_plan(offsets: Tensor, block: int, total: int) -> tuple[Tensor, Tensor, int]:
    """(first scale block of each row [B+1] int32, work list, its length) of one jagged layout; K and V share it."""
    lens = (offsets[1:] - offsets[:-1]).long()
    nblk = (lens + block - 1) // block
    blk_off = torch.cat([nblk.new_zeros(1), nblk.cumsum(0)]).to(torch.int32)
    work, n_items = work_list(offsets, offsets, block, total)
    return blk_off, work, n_items


def quantize_jagged_triton(x: Tensor, offsets: Tensor, block: int, transposed: bool = False,
                           plan: tuple[Tensor, Tensor, int] | None = None) -> tuple[Fp8Jagged, Tensor | None]:
    """Triton twin of ``quantize_jagged`` (bit-identical), one read of ``x``; with ``transposed`` also the
    ``[H * D, tokens]`` copy of the codes (token stride padded to 16 bytes) that the attention kernel reads V from.
    ``plan``: ``quant_plan(offsets, block, len(x))``, to share one between tensors of the same layout."""
    total, heads, dim = x.shape
    bid_bound = (total + block - 1) // block + offsets.numel() - 1
    blk_off, work, n_items = plan if plan is not None else quant_plan(offsets, block, total)
    data = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    scale = torch.empty(max(bid_bound, 1), heads, dtype=torch.int32, device=x.device)
    data_t = None
    if transposed:
        data_t = torch.empty(heads * dim, (total + 15) // 16 * 16, dtype=torch.uint8, device=x.device)
    if n_items > 0:
        jagged_quant_kernel[(n_items * heads,)](
            x.contiguous(), data, data if data_t is None else data_t, scale, offsets, blk_off, work,
            0 if data_t is None else data_t.stride(0), H=heads, HEAD_DIM=dim,
            BLOCK_D=max(16, triton.next_power_of_2(dim)), QUANT_BLOCK=block, TRANSPOSED=transposed,
            num_warps=8 if block * dim >= 8192 else 4,  # a 128x128 fp32 tile would spill with 4 warps
        )
    f8 = torch.float8_e4m3fn
    return Fp8Jagged(data.view(f8), scale.view(torch.float32), blk_off), None if data_t is None else data_t.view(f8)


def fp8_fwd_quantized(
    q: Tensor, k: Tensor, qq: Fp8Jagged, kq: Fp8Jagged, vq: Fp8Jagged, v_t: Tensor | None,
    q_offsets: Tensor, kv_offsets: Tensor, num_targets: Tensor | None, pos_weight: Tensor | None,
    time_weight: Tensor | None, q_timestamps: Tensor | None, kv_timestamps: Tensor | None,
    activation: str, causal: bool, scale: float, block_size: int, window: int, norm: int, len_key: int,
    q_len_hint: int, quant_block: int,
) -> tuple[Tensor, Tensor]:
    """The FP8 forward kernel on already-quantized inputs (``q``/``k``: shapes and output dtype only).
    ``v_t``: the transposed V codes (read instead of ``vq.data`` when given)."""
    out, lse = _unset(q), _unset(q, q.shape[:2], torch.float32)
    plan = _plan(q, k, len_key, block_size, q_len_hint)
    plan["block_d"] = max(32, plan["block_d"])  # FP8 tensor-core MMAs reduce over >= 32 elements
    if not INTERPRET and block_size == 0 and q_len_hint == 0 and plan["block_d"] == 128:
        plan["tile_q"] = 128  # the tile this kernel was measured with (bf16 kernels use 64 at D=128)
    work, n_items = work_list(q_offsets, kv_offsets, plan["tile_q"], q.shape[0])
    meta = _meta(q, activation, causal, block_size, window, norm, num_targets, pos_weight, time_weight, plan)
    meta.pop("PREC")
    meta.pop("USE_TMA")  # this kernel streams its tiles through pointers
    jagged_attn_fp8_fwd_kernel[(n_items * q.shape[1],)](
        qq.data, kq.data, vq.data if v_t is None else v_t, qq.scale, kq.scale, vq.scale, qq.block_offsets,
        kq.block_offsets, out, lse, q_offsets, kv_offsets, _ptr(num_targets, q_offsets), work,
        _ptr(pos_weight, lse), _ptr(time_weight, lse), _ptr(q_timestamps, q_offsets),
        _ptr(kv_timestamps, kv_offsets), scale, float(max(norm, 1)), max(window, 0), len_key,
        0 if v_t is None else v_t.stride(0), QUANT_BLOCK=quant_block, EXACT_CVT=INTERPRET,
        V_TRANSPOSED=v_t is not None, BLOCK_M=plan["tile_q"], **meta,
    )
    return out, lse


@torch.library.custom_op("gemtrain::jagged_attn_fp8_fwd", mutates_args=())
def jagged_attn_fp8_fwd(
    q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
    num_targets: Tensor | None, pos_weight: Tensor | None, time_weight: Tensor | None,
    q_timestamps: Tensor | None, kv_timestamps: Tensor | None,
    activation: str, causal: bool, scale: float, block_size: int, window: int, norm: int, len_key: int,
    q_len_hint: int, quant_block: int, v_transposed: bool,
) -> tuple[Tensor, Tensor]:
    num_rows = q_offsets.numel() - 1
    if q.shape[0] == 0 or k.shape[0] == 0 or num_rows == 0:
        return torch.zeros_like(q), torch.full(q.shape[:2], float("inf"), dtype=torch.float32, device=q.device)
    qq, _ = quantize_jagged_triton(q, q_offsets, quant_block)
    kv_plan = quant_plan(kv_offsets, quant_block, k.shape[0])  # K and V share the layout
    kq, _ = quantize_jagged_triton(k, kv_offsets, quant_block, plan=kv_plan)
    vq, v_t = quantize_jagged_triton(v, kv_offsets, quant_block, transposed=v_transposed, plan=kv_plan)
    return fp8_fwd_quantized(q, k, qq, kq, vq, v_t, q_offsets, kv_offsets, num_targets, pos_weight, time_weight,
                             q_timestamps, kv_timestamps, activation, causal, scale, block_size, window, norm,
                             len_key, q_len_hint, quant_block)


@jagged_attn_fp8_fwd.register_fake
def _(q, k, v, q_offsets, kv_offsets, num_targets, pos_weight, time_weight, q_timestamps, kv_timestamps,
      activation, causal, scale, block_size, window, norm, len_key, q_len_hint, quant_block, v_transposed):
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


def _setup_context(ctx, inputs, output) -> None:
    (q, k, v, q_offsets, kv_offsets, num_targets, pos_weight, time_weight, q_ts, kv_ts, *rest) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q_offsets, kv_offsets, num_targets, pos_weight, time_weight,
                          q_ts, kv_ts)
    ctx.rest = rest[:-2]  # the bf16 backward takes every argument but quant_block, v_transposed


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, q_offsets, kv_offsets, num_targets, pos_weight, time_weight, q_ts, kv_ts = ctx.saved_tensors
    dq, dk, dv, dpos, dtime = torch.ops.gemtrain.jagged_attn_bwd(
        dout, q, k, v, out, lse, q_offsets, kv_offsets, num_targets, pos_weight, time_weight, q_ts, kv_ts,
        *ctx.rest,
    )
    return (dq, dk, dv, None, None, None, dpos if pos_weight is not None else None,
            dtime if time_weight is not None else None, None, None) + (None,) * 10


jagged_attn_fp8_fwd.register_autograd(_backward, setup_context=_setup_context)


@register_flop_formula(torch.ops.gemtrain.jagged_attn_fp8_fwd, get_raw=True)
def _fwd_flops(*args, out_val=None, **kwargs) -> int:
    q = args[0]
    return 4 * _pairs_or_estimate(args[3], args[4], args) * q.shape[1] * q.shape[2]


def jagged_attention_fp8_triton(
    q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *, activation: str, causal: bool,
    scale: float, bias: RelativeBias | None, block_size: int | None, window: int | None,
    num_targets: Tensor | None, pointwise_norm: str | int, max_q_len: int | None, max_kv_len: int | None,
    quant_block: int, v_transposed: bool = True,
) -> Tensor:
    """Triton path of ``kernels.attention_fp8.jagged_attention_fp8`` (arguments already validated)."""
    bias = bias if bias is not None and not bias.is_empty else None
    pos_w = bias.pos_weight if bias is not None else None
    time_w = bias.time_weight if bias is not None else None
    q_ts = bias.q_timestamps.contiguous() if time_w is not None else None
    kv_ts = bias.kv_timestamps.contiguous() if time_w is not None else None
    out, _ = torch.ops.gemtrain.jagged_attn_fp8_fwd(
        q.contiguous(), k.contiguous(), v.contiguous(), q_offsets.contiguous(), kv_offsets.contiguous(),
        None if num_targets is None else num_targets.contiguous(),
        None if pos_w is None else pos_w.contiguous(), None if time_w is None else time_w.contiguous(),
        q_ts, kv_ts, activation, bool(causal), float(scale), int(block_size or 0),
        -1 if window is None else int(window), 0 if pointwise_norm == "row" else int(pointwise_norm),
        _len_key(q_offsets, q, k, max_q_len, max_kv_len), int(max_q_len or 0), int(quant_block),
        bool(v_transposed),
    )
    return out


__all__ = ["fp8_fwd_quantized", "jagged_attention_fp8_triton", "quant_plan", "quantize_jagged_triton"]
