"""Sliding-window self-attention as ``torch.library`` custom ops around ``attention_triton_window``.

``gemtrain::window_attn_fwd`` / ``gemtrain::window_attn_bwd`` (autograd and FLOP formulas registered) serve
``jagged_attention(..., window=W)`` without ``block_size`` for self-attention (one offsets tensor for both
sides) with head dim <= 128; ``attention_op.jagged_attention_triton`` routes those calls here
(``supports``) and keeps the generic kernels for everything else.

Work list: one item per (row, tile of ``TILE`` tokens) (``attention_op.work_list``), shared by the
forward, the dq kernel (query tiles) and the dk/dv kernel (key tiles of the same size); each kernel loops
over inner tiles of its own size (``CONFIG``).
"""

from __future__ import annotations

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import attention_triton_common as common
from kernels import triton_launch
from kernels.attention_op import (  # attention_op imports this module lazily
    _ptr,
    _unset,
    attention_op,
    no_token_grads,
    softmax_delta,
    table_grad,
    table_grad_buffer,
    work_list,
)
from kernels.attention_self_op import (
    fake_backward,
    register_self_attention_autograd,
    register_self_attention_flops,
    self_attention_work,
)
from kernels.attention_triton_common import ACT_CODES, INTERPRET
from kernels.attention_triton_window import (
    window_attn_bwd_dkdv_kernel,
    window_attn_bwd_dq_kernel,
    window_attn_fwd_kernel,
)
from kernels.attention_triton_window_bwd import (
    window_attn_bwd_dkdv_ds_kernel,
    window_attn_bwd_dq_ds_kernel,
)

Tensor = torch.Tensor

MAX_HEAD_DIM = 128
# Outer tile (the work item: queries of the forward and dq kernels, keys of the dk/dv kernel) and, per kernel,
# (inner tile, warps, stages, one loop): the inner tile is the loop's (keys, or queries for dk/dv); one loop
# runs every inner tile masked in one pipelined loop, instead of three loops with the whole tiles unmasked.
# For 2-byte inputs at D <= 128, measured on an H200 (benchmarks/attention_local.py windowtune; RESULTS.md,
# issue-5 part). fp32 inputs on the GPU keep the generic kernels: at these tiles the window kernels spill
# heavily and take minutes to compile (ptxas, sm_90).
TILE = 64
# Measured at L=2048..32768, W=256 (bf16, D=128, causal): the forward 32-key tiles (0.68-0.76 ms at 3 stages
# against 0.75-0.84 at 64/2; 2 stages with KERNEL_OPTIONS below since); the backward kernels one loop (the
# three-loop split lost 15-20% there). Fused backward at L=4096: 4 warps, 2 stages, delta by its own pass (in the
# loop: +0.5-0.8 ms, register spills; 8 warps: +0.9-1.3 ms, with or without a 128-register cap); its dq kernel
# 8 warps, 3 stages, descriptors (pointer loads and stores: +0.15-0.2 ms).
CONFIG: dict[str, tuple[int, int, int, bool]] = {
    "fwd": (32, 4, 2, False), "dq": (64, 4, 2, True), "dkdv": (64, 4, 2, True),
    # The fused backward (attention_triton_window_bwd): its inner tiles are the outer tile, so the first entry
    # is unused; the last one of "fused" computes delta = rowsum(dO . o) in the dk/dv loop (else one pass first),
    # that of "dsq" (its dq kernel) moves the dS scratch through tensor descriptors (bulk copies) where TMA is on.
    "fused": (64, 4, 2, False), "dsq": (64, 8, 3, True)}
# Launch options beyond CONFIG's, per kernel (on the GPU). The forward pipelines every loop two deep and fits
# 128 registers: 124 registers and 48 KB of shared memory (ptxas, sm_90), so four programs share an SM where the
# three-deep forward at 143 registers and 65 KB held three. Measured on an H200 (W=256, L=4096 / 32768, the op
# alone, 5 alternating rounds): 0.580 / 0.591 ms against 0.600 / 0.618 for the three-deep forward; two-deep
# without the register cap (three programs) 0.646 / 0.672 (benchmarks/RESULTS.md, "Four forward programs per SM").
KERNEL_OPTIONS: dict[str, dict[str, int]] = {"fwd": {"num_stages": 2, "maxnreg": 128}}
# Backward: "fused" (dk, dv and the score gradients in one kernel, dq from those; where ``fused_slots`` allows)
# or "two" (the dq kernel, then the dk/dv kernel, each computing the scores).
BACKWARD = "fused"
# The fused backward keeps the score gradients of every (query, key tile) pair: about H * slots * tokens * TILE
# elements, slots = key tiles a query tile sees. Longer windows take the two-kernel backward.
MAX_FUSED_SLOTS = 9
# The fused backward's delta pass also copies the log-sum-exp, both by (head, query tile), so its dk/dv programs
# read a query tile's statistics as two aligned runs instead of every H-th value.
STATS_BY_TILE = True
# Softmax's log-sum-exp and delta enter the fused kernel's [keys, queries] products as their initial sums.
FOLD_STATS = True
# ... and reach it through a tensor descriptor where the other tiles do (no per-value addresses in registers).
STATS_TMA = True
INTERPRET_TILE = 16  # the interpreter's tests cover windows shorter and longer than a tile
WINDOW_CAP = 1 << 30  # longer windows see the same keys (rows are shorter); keeps the kernels' int32 exact


def _pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def supports(q: Tensor, k: Tensor, q_offsets: Tensor, kv_offsets: Tensor, block_size: int | None,
             window: int | None) -> bool:
    """Whether the window kernels serve this call: a window without blocks, self-attention (one offsets
    tensor for both sides), head dim <= MAX_HEAD_DIM, 2-byte inputs on the GPU (any float dtype under the
    interpreter, which runs on CPU tensors)."""
    return (window is not None and block_size is None and window >= 0 and q.shape[-1] <= MAX_HEAD_DIM
            and (q.element_size() <= 2 or not q.is_cuda)
            and q.shape[0] == k.shape[0] and q_offsets.data_ptr() == kv_offsets.data_ptr()
            and q_offsets.numel() == kv_offsets.numel())


def tile_of(q: Tensor) -> int:
    return INTERPRET_TILE if INTERPRET or not q.is_cuda else TILE


def inner_of(config: tuple[int, int, int, bool], tile: int) -> int:
    """A kernel's inner tile: its configured one, at most the outer tile under the interpreter."""
    return min(config[0], tile) if INTERPRET else config[0]


def fused_slots(window: int, causal: bool, tile: int) -> tuple[int, int]:
    """(slots, first slot) of the fused backward's dS scratch: key tiles ``j`` paired with query tile ``i``
    go to slot ``i - j + first``; (0, 0) when the window is too long for that path or it is switched off."""
    reach = -(-min(window, WINDOW_CAP) // tile)  # key tiles a window reaches on one side
    slots = reach + 1 if causal else 2 * reach + 1
    if BACKWARD != "fused" or slots > MAX_FUSED_SLOTS:
        return 0, 0
    return slots, 0 if causal else reach


def window_work(offsets: Tensor, total: int, tile: int) -> Tensor:
    return work_list(offsets, offsets, tile, total)[0]


def _desc(t: Tensor, tile: int, enabled: bool) -> Tensor | TensorDescriptor:
    if not enabled:
        return t
    tokens, heads, dim = t.shape
    return TensorDescriptor(t, [tokens, heads * dim], [heads * dim, 1], [tile, dim])


def _meta(q: Tensor, activation: str, causal: bool, norm: int, num_targets: Tensor | None,
          pos_weight: Tensor | None, time_weight: Tensor | None, tma: bool, block_m: int, block_n: int,
          kernel: str) -> dict:
    """Meta-parameters and launch options of one kernel (``kernel``: its key in ``CONFIG``)."""
    config = CONFIG[kernel]
    num_pos = 1 if pos_weight is None else pos_weight.shape[0]
    num_time = 1 if time_weight is None else time_weight.shape[0]
    return dict(
        H=q.shape[1], HEAD_DIM=q.shape[2], BLOCK_D=_pow2(q.shape[2]), ACT=ACT_CODES[activation], CAUSAL=causal,
        HAS_NT=num_targets is not None, HAS_POS=pos_weight is not None, NUM_POS=num_pos,
        HAS_TIME=time_weight is not None, NUM_TIME=num_time, NORM_ROW=norm == 0,
        PREC="ieee" if q.dtype == torch.float32 else "tf32", USE_TMA=tma, BLOCK_M=block_m, BLOCK_N=block_n,
        STAGES=1 if INTERPRET else config[2], POS_PAD=_pow2(num_pos), TIME_PAD=_pow2(num_time),
        ONE_LOOP=config[3], num_warps=config[1], **({} if INTERPRET else KERNEL_OPTIONS.get(kernel, {})),
    )


@attention_op("window_attn_fwd")
def window_attn_fwd(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, num_targets: Tensor | None, pos_weight: Tensor | None,
    time_weight: Tensor | None, q_timestamps: Tensor | None, kv_timestamps: Tensor | None,
    activation: str, causal: bool, scale: float, window: int, norm: int, work: Tensor,
) -> tuple[Tensor, Tensor]:
    if q.shape[0] == 0 or offsets.numel() <= 1:
        return torch.zeros_like(q), torch.full(q.shape[:2], float("inf"), dtype=torch.float32, device=q.device)
    out, lse = _unset(q), _unset(q, q.shape[:2], torch.float32)
    tile = tile_of(q)
    tma = common.use_tma([q, k, v], q.shape[2], _pow2(q.shape[2]))
    inner = inner_of(CONFIG["fwd"], tile)
    meta = _meta(q, activation, causal, norm, num_targets, pos_weight, time_weight, tma, tile, inner, "fwd")
    triton_launch.run(window_attn_fwd_kernel, (work.shape[0] * q.shape[1],),
        q, k, v, _desc(k, inner, tma), _desc(v, inner, tma), out, lse, offsets, _ptr(num_targets, offsets), work,
        _ptr(pos_weight, lse), _ptr(time_weight, lse), _ptr(q_timestamps, offsets), _ptr(kv_timestamps, offsets),
        scale, float(max(norm, 1)), min(window, WINDOW_CAP), **meta,
    )
    return out, lse


@window_attn_fwd.register_fake
def _(q, k, v, offsets, num_targets, pos_weight, time_weight, q_timestamps, kv_timestamps, activation, causal,
      scale, window, norm, work):
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


def _fused_backward(do, q, k, v, out, lse, offsets, dq, dk, dv, activation, causal, norm, num_targets, pos_weight,
                    time_weight, common_args, table_grads, times, scalars, grid, tile, tma, slots, slot0) -> None:
    """The fused backward (``attention_triton_window_bwd``): dk, dv and the dS scratch in one kernel, then dq."""
    cfg = CONFIG["fused"]
    inline = cfg[3] or activation != "softmax"  # delta is softmax's alone
    work = common_args[1]
    rows = q.shape[1] * slots * work.shape[0] * tile
    ds = _unset(q, (rows, tile))  # every tile the dq kernel reads is written whole
    ds_tma = tma and CONFIG["dsq"][3] and rows < 2**31  # descriptor coordinates are int32
    ds_desc = TensorDescriptor(ds, [rows, tile], [tile, 1], [tile, tile]) if ds_tma else ds
    dims = dict(H=q.shape[1], HEAD_DIM=q.shape[2], BLOCK_D=_pow2(q.shape[2]))
    delta, by_tile, stats = lse, not inline and STATS_BY_TILE, lse
    if by_tile:
        stats = softmax_delta(out, do, offsets, work, tile, lse)
        lse, delta = stats
        if tma:  # one descriptor over both halves; every tile's run starts 16-byte aligned, as bulk copies need
            n = stats.shape[2]
            stats = TensorDescriptor(stats, [2 * stats.shape[1], n], [n, 1], [1, tile])
    elif not inline:
        delta = softmax_delta(out, do, offsets, work, tile)
    meta = _meta(q, activation, causal, norm, num_targets, pos_weight, time_weight, tma, tile, tile, "fused")
    del meta["ONE_LOOP"]
    # Without bias tables the fused kernel computes (and stores) [keys, queries] tiles, which its dq kernel reads.
    rows_of_keys = pos_weight is None and time_weight is None
    triton_launch.run(window_attn_bwd_dkdv_ds_kernel, grid,
        q, k, v, out, do, _desc(q, tile, tma), _desc(do, tile, tma), _desc(out, tile, tma), lse, delta, stats, ds,
        ds_desc, dk, dv, offsets, *common_args, *table_grads, *times, *scalars, work.shape[0], **meta,
        DELTA_INLINE=inline, SLOTS=slots, SLOT0=slot0, DS_TMA=ds_tma, KEY_ROWS=rows_of_keys, STATS_BY_TILE=by_tile,
        FOLD_STATS=FOLD_STATS, STATS_TMA=by_tile and tma and STATS_TMA,
    )
    cfg = CONFIG["dsq"]
    triton_launch.run(window_attn_bwd_dq_ds_kernel, grid,
        k, _desc(k, tile, tma), ds, ds_desc, dq, offsets, work, scalars[0], scalars[2], work.shape[0], **dims,
        CAUSAL=causal, PREC=meta["PREC"], USE_TMA=tma, BLOCK_M=tile, STAGES=1 if INTERPRET else cfg[2],
        SLOTS=slots, SLOT0=slot0, DS_TMA=ds_tma, KEY_ROWS=rows_of_keys, num_warps=cfg[1],
    )


@attention_op("window_attn_bwd")
def window_attn_bwd(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, offsets: Tensor,
    num_targets: Tensor | None, pos_weight: Tensor | None, time_weight: Tensor | None,
    q_timestamps: Tensor | None, kv_timestamps: Tensor | None,
    activation: str, causal: bool, scale: float, window: int, norm: int, work: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    if q.shape[0] == 0 or offsets.numel() <= 1:
        return no_token_grads(q, k, v, pos_weight, time_weight)
    dpos, dtime = table_grad_buffer(pos_weight, q), table_grad_buffer(time_weight, q)
    do = do.contiguous()
    dq, dk, dv = _unset(q), _unset(k), _unset(v)
    tile = tile_of(q)
    slots, slot0 = fused_slots(window, causal, tile)
    tma = common.use_tma([q, k, v, out, do], q.shape[2], _pow2(q.shape[2]))
    common_args = (_ptr(num_targets, offsets), work, _ptr(pos_weight, lse), _ptr(time_weight, lse))
    scalars = (scale, float(max(norm, 1)), min(window, WINDOW_CAP))
    grid = (work.shape[0] * q.shape[1],)
    table_grads = (dpos, dtime)
    times = (_ptr(q_timestamps, offsets), _ptr(kv_timestamps, offsets))
    if slots:
        _fused_backward(do, q, k, v, out, lse, offsets, dq, dk, dv, activation, causal, norm, num_targets,
                        pos_weight, time_weight, common_args, table_grads, times, scalars, grid, tile, tma, slots,
                        slot0)
        return dq, dk, dv, table_grad(dpos, pos_weight), table_grad(dtime, time_weight)
    delta = _unset(q, q.shape[:2], torch.float32) if activation == "softmax" else lse  # written by the dq kernel
    inner = inner_of(CONFIG["dq"], tile)
    meta = _meta(q, activation, causal, norm, num_targets, pos_weight, time_weight, tma, tile, inner, "dq")
    triton_launch.run(window_attn_bwd_dq_kernel, grid,
        q, k, v, out, do, _desc(k, inner, tma), _desc(v, inner, tma), lse, delta, dq, offsets, *common_args,
        _ptr(q_timestamps, offsets), _ptr(kv_timestamps, offsets), *scalars, **meta,
    )
    inner = inner_of(CONFIG["dkdv"], tile)
    meta = _meta(q, activation, causal, norm, num_targets, pos_weight, time_weight, tma, inner, tile, "dkdv")
    triton_launch.run(window_attn_bwd_dkdv_kernel, grid,
        q, k, v, do, _desc(q, inner, tma), _desc(do, inner, tma), lse, delta, dk, dv, offsets, *common_args,
        dpos, dtime,
        _ptr(q_timestamps, offsets), _ptr(kv_timestamps, offsets), *scalars, **meta,
    )
    return dq, dk, dv, table_grad(dpos, pos_weight), table_grad(dtime, time_weight)


@window_attn_bwd.register_fake
def _(do, q, k, v, out, lse, offsets, num_targets, pos_weight, time_weight, q_timestamps, kv_timestamps,
      activation, causal, scale, window, norm, work):
    return fake_backward(q, k, v, pos_weight, time_weight)


# While tracing, every query is assumed to see a whole window.
register_self_attention_flops(torch.ops.gemtrain.window_attn_fwd, torch.ops.gemtrain.window_attn_bwd, "window",
                              lambda tokens, window, causal: tokens * (window + 1 if causal else 2 * window + 1))


# Eager calls skip the custom-op autograd layer (as the block ops do); callers of the raw forward op get its
# registered autograd, with the same gradients.
_WindowAttention = register_self_attention_autograd("_WindowAttention", "window_attn_fwd", "window_attn_bwd")


def window_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, *, activation: str, causal: bool, scale: float,
    window: int, num_targets: Tensor | None, pos_weight: Tensor | None, time_weight: Tensor | None,
    q_timestamps: Tensor | None, kv_timestamps: Tensor | None, norm: int,
) -> Tensor:
    """Sliding-window self-attention through the custom ops (inputs contiguous, validated by the caller)."""
    work = self_attention_work(q, offsets, lambda: window_work(offsets, q.shape[0], tile_of(q)))
    return _WindowAttention.apply(
        q, k, v, offsets, num_targets, pos_weight, time_weight, q_timestamps, kv_timestamps, activation,
        bool(causal), float(scale), int(window), int(norm), work,
    )


__all__ = ["supports", "window_attention"]
