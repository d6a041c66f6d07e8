"""Jagged attention as ``torch.library`` custom ops around the Triton kernels.

Custom ops (``gemtrain::jagged_attn_fwd`` / ``gemtrain::jagged_attn_bwd``) keep ``torch.compile`` free of
graph breaks, work under activation checkpointing, and let ``torch.utils.flop_counter`` count useful
FLOPs through the registered formulas. Launch order: rows with the longest other side first, and inside
a row the most expensive (last) tiles first, so skewed batches do not leave a long tail on few SMs.
"""

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import triton
from torch.utils.flop_counter import register_flop_formula

from kernels import attention_triton_common as common
from kernels import triton_launch
from kernels.attention_flops import BACKWARD_FACTOR, visible_pairs
from kernels.attention_spec import RelativeBias
from kernels.attention_triton_bwd import jagged_attn_bwd_dkdv_kernel, jagged_attn_bwd_dq_kernel
from kernels.attention_triton_common import ACT_CODES, INTERPRET, descriptor, launch
from kernels.attention_triton_fwd import jagged_attn_fwd_kernel
from kernels.attention_triton_window_bwd import softmax_delta_kernel
from kernels.attention_worklist import fits, work_list_triton

Tensor = torch.Tensor


def work_list(tile_offsets: Tensor, other_offsets: Tensor, block: int, total: int) -> tuple[Tensor, int]:
    """[N, 2] int32 (row, tile) pairs, rows with the longest other side first, last tiles first.

    N is an upper bound computed without a device sync (``ceil(total / block) + B``); unused entries
    have row -1 and their programs exit at once. The list depends only on the offsets and ``block``, so
    the forward's list is passed on to the backward (``work`` argument of the ops) where it fits. On the
    GPU one Triton launch builds it (``attention_worklist``); these torch ops are its reference.
    """
    num_rows = tile_offsets.numel() - 1
    n_items = triton.cdiv(total, block) + num_rows
    if tile_offsets.is_cuda and not INTERPRET and fits(num_rows, total) and not torch.compiler.is_compiling():
        return work_list_triton(tile_offsets, other_offsets, block, n_items), n_items  # one launch
    lens = (tile_offsets[1:] - tile_offsets[:-1]).long()
    other = (other_offsets[1:] - other_offsets[:-1]).long()
    tiles = (lens + block - 1) // block
    perm = torch.argsort(other * (1 << 20) + lens, descending=True, stable=True)
    tiles_sorted = tiles[perm]
    cum = tiles_sorted.cumsum(0)
    t = torch.arange(n_items, device=tile_offsets.device)
    idx = torch.searchsorted(cum, t, right=True)
    valid = idx < num_rows
    idx_c = idx.clamp(max=num_rows - 1)
    tile = tiles_sorted[idx_c] - 1 - (t - (cum[idx_c] - tiles_sorted[idx_c]))
    row = torch.where(valid, perm[idx_c], torch.full_like(idx_c, -1))
    tile = torch.where(valid, tile, torch.zeros_like(tile))
    return torch.stack([row, tile], dim=1).to(torch.int32).contiguous(), n_items


# Tensor descriptors save GPU time on large calls (batch A, causal: forward 1.04-1.10 ms against 1.25-1.33 with
# pointers), but Triton encodes every descriptor on the host at each launch (tens of us), which calls bound by
# host time pay in full (batch B and cross attention: 0.1-0.4 ms more per forward+backward, no GPU time saved):
# benchmarks/RESULTS.md, "Descriptors cost host time". Below this bound on the score products (query tokens x
# keys per query x heads x head dim), "auto" streams tiles through pointers.
DESCRIPTOR_MIN_WORK = 10**11


def descriptors_pay(q_tokens: int, keys_per_query: int, heads: int, head_dim: int) -> bool:
    """Whether a call is large enough for tensor descriptors (``DESCRIPTOR_MIN_WORK``)."""
    return q_tokens * keys_per_query * heads * head_dim >= DESCRIPTOR_MIN_WORK


def _plan(q: Tensor, k: Tensor, len_key: int, block_size: int, q_len_hint: int, *streamed: Tensor) -> dict:
    d = q.shape[-1]
    tiles = _tiles if torch.compiler.is_compiling() else _cached_tiles  # the compiler traces the plain function
    plan = dict(tiles(d, q.dtype == torch.float32, len_key, block_size, q_len_hint))
    # Descriptors are decided where the kernels launch (given the streamed tensors); tiles alone need none.
    plan["tma"] = False
    if streamed:
        keys = min(len_key, k.shape[0], block_size if block_size > 0 else len_key)
        plan["tma"] = common.use_tma([q, k, *streamed], d, plan["block_d"],
                                     descriptors_pay(q.shape[0], keys, q.shape[1], d))
    return plan


def _tiles(d: int, fp32: bool, len_key: int, block_size: int, q_len_hint: int) -> tuple:
    """The plan's tile sizes and precision (``_plan``; eager calls read them from ``_cached_tiles``)."""
    block_d = max(16, triton.next_power_of_2(d))
    if INTERPRET:
        tile_q, tile_kv = 32, 32
    else:
        # 64-row tiles at every head dim, measured on an H200 (benchmarks/attention_configs.py at D=128;
        # at D=64 on batch B and on batch A's lengths, 64-row tiles took 14-20% less GPU time than 128-row
        # ones: benchmarks/RESULTS.md, "Host time, D=64 tiles, ...").
        tile_q = tile_kv = 64
        if q_len_hint > 0:  # short query rows (cross attention of a few candidates): small query tiles
            tile_q = min(tile_q, max(16, triton.next_power_of_2(q_len_hint)))
        if block_size > 0:  # tiles no larger than the block keep block-local work at O(L*S)
            tile_q = min(tile_q, max(16, triton.next_power_of_2(block_size)))
            tile_kv = min(tile_kv, max(16, triton.next_power_of_2(block_size)))
    # tile_q_bwd: the dq pass's query tile (sized like the forward's; tuned on its own).
    return (("block_d", block_d), ("tile_q", tile_q), ("tile_q_bwd", tile_q), ("tile_kv", tile_kv),
            ("prec", "ieee" if fp32 else "tf32"), ("len_key", len_key))


_cached_tiles = functools.cache(_tiles)  # the ops ask for the tiles at every call


def _meta(q: Tensor, activation: str, causal: bool, block_size: int, window: int, norm: int,
          num_targets: Tensor | None, pos_weight: Tensor | None, time_weight: Tensor | None,
          plan: dict) -> dict:
    return dict(
        H=q.shape[1], HEAD_DIM=q.shape[2], BLOCK_D=plan["block_d"], ACT=ACT_CODES[activation],
        CAUSAL=causal, HAS_NT=num_targets is not None, BLOCK_S=block_size, HAS_WINDOW=window >= 0,
        HAS_POS=pos_weight is not None, NUM_POS=1 if pos_weight is None else pos_weight.shape[0],
        HAS_TIME=time_weight is not None, NUM_TIME=1 if time_weight is None else time_weight.shape[0],
        NORM_ROW=norm == 0, PREC=plan["prec"], USE_TMA=plan["tma"],
    )


def _launch_key(len_key: int, q: Tensor, offsets: Tensor, timestamps: Tensor | None) -> tuple:
    """What picks an autotuned kernel's configuration beyond its meta-parameters (``common.launch``)."""
    return len_key, q.dtype, offsets.dtype, None if timestamps is None else timestamps.dtype


def _unset(like: Tensor, shape: tuple | None = None, dtype: torch.dtype | None = None) -> Tensor:
    """Output buffer the kernels fill completely; NaN-poisoned under the interpreter so tests see holes."""
    t = torch.empty(like.shape if shape is None else shape, dtype=dtype or like.dtype, device=like.device)
    return t.fill_(float("nan")) if INTERPRET else t


def _ptr(t: Tensor | None, fallback: Tensor) -> Tensor:
    return fallback if t is None else t


_BODIES: dict[str, Callable] = {}


def attention_op(name: str) -> Callable:
    """Decorator: the function becomes custom op ``gemtrain::<name>`` (no mutated arguments) and stays
    callable directly through ``eager_call``."""

    def register(fn: Callable):
        _BODIES[name] = fn
        return torch.library.custom_op(f"gemtrain::{name}", mutates_args=())(fn)

    return register


def eager_call(name: str) -> Callable:
    """Caller of ``gemtrain::<name>`` for the eager autograd functions: the op's Python body itself where nothing
    watches the dispatcher (no dispatch mode such as ``FlopCounterMode`` or fake tensors, no compiler, plain
    tensors), else the op. The dispatcher's per-call work (argument binding, alias checks) costs 70-125 us of
    host time per op on an H200 host, which short batches pay in full."""
    op, body = getattr(torch.ops.gemtrain, name), _BODIES[name]

    def call(*args):
        if (torch._C._len_torch_dispatch_stack() == 0 and not torch.compiler.is_compiling()
                and type(args[0]) is Tensor and type(args[1]) is Tensor):
            return body(*args)
        return op(*args)

    return call


@attention_op("jagged_attn_fwd")
def jagged_attn_fwd(
    q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
    num_targets: Tensor | None, pos_weight: Tensor | None, time_weight: Tensor | None,
    q_timestamps: Tensor | None, kv_timestamps: Tensor | None,
    activation: str, causal: bool, scale: float, block_size: int, window: int, norm: int, len_key: int,
    q_len_hint: int, work: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    num_rows = q_offsets.numel() - 1
    if q.shape[0] == 0 or k.shape[0] == 0 or num_rows == 0:
        return torch.zeros_like(q), torch.full(q.shape[:2], float("inf"), dtype=torch.float32, device=q.device)
    # Every token belongs to a tile whose program writes it, so no memset pass is needed.
    out, lse = _unset(q), _unset(q, q.shape[:2], torch.float32)
    plan = _plan(q, k, len_key, block_size, q_len_hint, v)
    if work is None:
        work = work_list(q_offsets, kv_offsets, plan["tile_q"], q.shape[0])[0]
    n_items = work.shape[0]
    meta = _meta(q, activation, causal, block_size, window, norm, num_targets, pos_weight, time_weight, plan)
    launch(jagged_attn_fwd_kernel, (n_items * q.shape[1],), (
        q, k, v, descriptor(k, plan["tma"]), descriptor(v, plan["tma"]), out, lse, q_offsets, kv_offsets,
        _ptr(num_targets, q_offsets), work,
        _ptr(pos_weight, lse), _ptr(time_weight, lse), _ptr(q_timestamps, q_offsets),
        _ptr(kv_timestamps, kv_offsets), scale, float(max(norm, 1)), max(window, 0), len_key,
    ), dict(BLOCK_M=plan["tile_q"], **meta), _launch_key(len_key, q, q_offsets, q_timestamps))
    return out, lse


@jagged_attn_fwd.register_fake
def _(q, k, v, q_offsets, kv_offsets, num_targets, pos_weight, time_weight, q_timestamps, kv_timestamps,
      activation, causal, scale, block_size, window, norm, len_key, q_len_hint, work=None):
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


@attention_op("jagged_attn_bwd")
def jagged_attn_bwd(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, q_offsets: Tensor,
    kv_offsets: Tensor, num_targets: Tensor | None, pos_weight: Tensor | None, time_weight: Tensor | None,
    q_timestamps: Tensor | None, kv_timestamps: Tensor | None,
    activation: str, causal: bool, scale: float, block_size: int, window: int, norm: int, len_key: int,
    q_len_hint: int, work: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    if q.shape[0] == 0 or k.shape[0] == 0 or q_offsets.numel() <= 1:
        return no_token_grads(q, k, v, pos_weight, time_weight)
    return backward_launches(do, q, k, v, out, lse, q_offsets, kv_offsets, num_targets, pos_weight, time_weight,
                             q_timestamps, kv_timestamps, activation, causal, scale, block_size, window, norm,
                             len_key, q_len_hint, work)


class ScoreCodes(NamedTuple):
    """The e4m3 operands of the backward's score products (``attention_triton_bwd``, ``FP8``): row-major codes
    ``[tokens, H, D]`` of q, k, v and dO, their fp32 power-of-two scales ``[blocks, H]``, each row's first
    block of the query layout (q, dO) and of the key layout (k, v), and the block length in tokens."""

    q: Tensor
    k: Tensor
    v: Tensor
    do: Tensor
    q_scale: Tensor
    k_scale: Tensor
    v_scale: Tensor
    do_scale: Tensor
    q_blocks: Tensor
    kv_blocks: Tensor
    block: int


def backward_launches(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, q_offsets: Tensor,
    kv_offsets: Tensor, num_targets: Tensor | None, pos_weight: Tensor | None, time_weight: Tensor | None,
    q_timestamps: Tensor | None, kv_timestamps: Tensor | None,
    activation: str, causal: bool, scale: float, block_size: int, window: int, norm: int, len_key: int,
    q_len_hint: int, work: Tensor | None = None, codes: ScoreCodes | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``jagged_attn_bwd``'s two launches on a call with tokens; ``codes``: the score products in FP8."""
    dq, dk, dv = _unset(q), _unset(k), _unset(v)
    dpos, dtime = table_grad_buffer(pos_weight, q), table_grad_buffer(time_weight, q)
    do, out = do.contiguous(), out.contiguous()
    plan = _plan(q, k, len_key, block_size, q_len_hint, v, do)
    if codes is not None and plan["block_d"] < 32:  # FP8 tensor-core MMAs reduce over >= 32 elements
        plan.update(block_d=32, tma=False)
    meta = _meta(q, activation, causal, block_size, window, norm, num_targets, pos_weight, time_weight, plan)
    scalars = (scale, float(max(norm, 1)), max(window, 0), len_key)
    # The forward's list of query tiles serves as the list of KV tiles when both sides are the same
    # rows tiled alike (self-attention), and as the dq pass's (and delta's) list when its tile is the forward's.
    fwd_tile = plan["tile_q"]
    work_q = work if work is not None and plan["tile_q_bwd"] == fwd_tile else None
    if work_q is None:
        work_q = work_list(q_offsets, kv_offsets, plan["tile_q_bwd"], q.shape[0])[0]
    # softmax's delta = rowsum(dO . o): written by the dq kernel, which therefore runs before the dk/dv kernel
    delta = _unset(q, q.shape[:2], torch.float32) if activation == "softmax" else lse
    self_attn = q_offsets.data_ptr() == kv_offsets.data_ptr() and q.shape[0] == k.shape[0]
    work_kv = work if work is not None and self_attn and plan["tile_kv"] == fwd_tile else None
    if work_kv is None:
        work_kv = work_list(kv_offsets, q_offsets, plan["tile_kv"], k.shape[0])[0]
    key = _launch_key(len_key, q, q_offsets, q_timestamps)
    tma = plan["tma"]
    qd, kd, vd, dod = (descriptor(t, tma) for t in (q, k, v, do))
    fp8 = None if codes is None else tuple(codes[:10])  # the kernels' CODES tuple (attention_triton_bwd.C_Q ...)
    meta.update(FP8=codes is not None, QUANT_BLOCK=0 if codes is None else codes.block)
    launch(jagged_attn_bwd_dq_kernel, (work_q.shape[0] * q.shape[1],), (
        q, k, v, do, out, kd, vd, fp8, lse, delta, dq, q_offsets,
        kv_offsets, _ptr(num_targets, q_offsets), work_q,
        _ptr(pos_weight, lse), _ptr(time_weight, lse), _ptr(q_timestamps, q_offsets),
        _ptr(kv_timestamps, kv_offsets), *scalars,
    ), dict(BLOCK_M=plan["tile_q_bwd"], **meta), key)
    launch(jagged_attn_bwd_dkdv_kernel, (work_kv.shape[0] * q.shape[1],), (
        q, k, v, do, qd, dod, fp8, lse, delta, dk, dv, q_offsets,
        kv_offsets, _ptr(num_targets, q_offsets), work_kv,
        _ptr(pos_weight, lse), _ptr(time_weight, lse), dpos, dtime, _ptr(q_timestamps, q_offsets),
        _ptr(kv_timestamps, kv_offsets), *scalars,
    ), dict(BLOCK_N=plan["tile_kv"], **meta), key)
    return dq, dk, dv, table_grad(dpos, pos_weight), table_grad(dtime, time_weight)


def softmax_delta(out: Tensor, do: Tensor, offsets: Tensor, work: Tensor, tile: int,
                  lse: Tensor | None = None) -> Tensor:
    """``(do.float() * out.float()).sum(-1)``, ``[tokens, H]`` fp32, in one Triton pass over the query tiles of
    ``work`` (``tile`` rows each, over ``offsets``). With ``lse`` (``[tokens, H]``): ``[2, H, work items * tile]``,
    the log-sum-exp then delta by (head, work item, query of the tile) (``softmax_delta_kernel``'s ``BY_TILE``)."""
    tokens, heads, d = out.shape
    shape = (tokens, heads) if lse is None else (2, heads, work.shape[0] * tile)
    delta = _unset(out, shape, torch.float32)  # every token is in one work item's tile
    triton_launch.run(softmax_delta_kernel, (work.shape[0] * heads,),
        out.contiguous(), do.contiguous(), delta, offsets, work, delta if lse is None else lse, H=heads,
        HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_M=tile, BY_TILE=lse is not None,
        num_warps=4)
    return delta


def table_grad_buffer(table: Tensor | None, like: Tensor) -> Tensor:
    """fp32 gradient buffer of a bias table (zeroed: the kernels add into it); without a table an empty
    stand-in, never read (and not an alias of an input, which autotuning's zeroing between trials would clear)."""
    if table is None:
        return torch.empty(0, dtype=torch.float32, device=like.device)
    return torch.zeros(table.shape, dtype=torch.float32, device=like.device)


def table_grad(grad: Tensor, table: Tensor | None) -> Tensor:
    """A table's gradient in the table's dtype (accumulated in float32)."""
    return grad if table is None else grad.to(table.dtype)


def no_token_grads(q: Tensor, k: Tensor, v: Tensor, pos_weight: Tensor | None,
                   time_weight: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """A backward op's outputs for a call without tokens or rows: zeros everywhere."""
    return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v),
            table_grad(table_grad_buffer(pos_weight, q), pos_weight),
            table_grad(table_grad_buffer(time_weight, q), time_weight))


@jagged_attn_bwd.register_fake
def _(do, q, k, v, out, lse, q_offsets, kv_offsets, num_targets, pos_weight, time_weight, q_timestamps,
      kv_timestamps, activation, causal, scale, block_size, window, norm, len_key, q_len_hint, work=None):
    return fake_grads(q, k, v, pos_weight, time_weight)


def fake_grads(q: Tensor, k: Tensor, v: Tensor, pos_weight: Tensor | None,
               time_weight: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """A backward op's outputs as fake tensors (shapes and dtypes of ``no_token_grads``)."""
    table = lambda t: t.new_empty(t.shape) if t is not None else q.new_empty((0,), dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), table(pos_weight), table(time_weight)


_NON_TENSOR = ("activation", "causal", "scale", "block_size", "window", "norm", "len_key", "q_len_hint")


_backward_call = eager_call("jagged_attn_bwd")


def input_grads(grads: tuple, pos_weight: Tensor | None, time_weight: Tensor | None, more: int) -> tuple:
    """A forward op's input gradients from a backward op's (dq, dk, dv, dpos, dtime): q, k, v, the tables
    (None for tables not given), None for the other tensors and for ``more`` non-tensor arguments after them."""
    dq, dk, dv, dpos, dtime = grads
    return (dq, dk, dv, None, None, None, dpos if pos_weight is not None else None,
            dtime if time_weight is not None else None, None, None) + (None,) * more


def _setup_context(ctx, inputs, output) -> None:
    (q, k, v, q_offsets, kv_offsets, num_targets, pos_weight, time_weight, q_ts, kv_ts, *rest) = inputs
    work = rest[len(_NON_TENSOR)] if len(rest) > len(_NON_TENSOR) else None
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q_offsets, kv_offsets, num_targets, pos_weight, time_weight,
                          q_ts, kv_ts, work)
    ctx.rest = rest[:len(_NON_TENSOR)]


def _backward(ctx, dout, dlse):
    """``jagged_attn_bwd``'s gradients (eagerly where nothing watches the dispatcher) on the forward's output and
    log-sum-exp, on the forward's list of query tiles."""
    (q, k, v, out, lse, q_offsets, kv_offsets, num_targets, pos_weight, time_weight, q_ts, kv_ts,
     work) = ctx.saved_tensors
    grads = _backward_call(dout, q, k, v, out, lse, q_offsets, kv_offsets, num_targets, pos_weight, time_weight,
                           q_ts, kv_ts, *ctx.rest, work)
    return input_grads(grads, pos_weight, time_weight, len(_NON_TENSOR) + 1)

jagged_attn_fwd.register_autograd(_backward, setup_context=_setup_context)


def _pairs_or_estimate(q_offsets: Tensor, kv_offsets: Tensor, args: tuple) -> int:
    num_targets, causal, block_size, window = args[5], args[11], args[13], args[14]
    try:
        return visible_pairs(q_offsets, kv_offsets, causal=causal, block_size=block_size or None,
                             window=None if window < 0 else window, num_targets=num_targets)
    except Exception:  # fake/meta offsets (tracing): no values, so assume equal rows
        rows = max(q_offsets.shape[0] - 1, 1)
        return args[0].shape[0] * args[1].shape[0] // rows


@register_flop_formula(torch.ops.gemtrain.jagged_attn_fwd, get_raw=True)
def _fwd_flops(*args, out_val=None, **kwargs) -> int:
    q = args[0]
    return 4 * _pairs_or_estimate(args[3], args[4], args) * q.shape[1] * q.shape[2]


@register_flop_formula(torch.ops.gemtrain.jagged_attn_bwd, get_raw=True)
def _bwd_flops(*args, out_val=None, **kwargs) -> int:
    q = args[1]
    shifted = (args[1], args[2], args[3], args[6], args[7], args[8], None, None, None, None, None,
               args[14], None, args[16], args[17])
    return int(BACKWARD_FACTOR * 4 * _pairs_or_estimate(args[6], args[7], shifted) * q.shape[1] * q.shape[2])


def _len_key(q_offsets: Tensor, q: Tensor, k: Tensor, max_q_len: int | None, max_kv_len: int | None) -> int:
    """Power-of-two bucket of the longest row, so autotuning does not repeat for every jagged batch."""
    rows = max(q_offsets.numel() - 1, 1)
    longest = max(max_q_len or 0, max_kv_len or 0) or max(q.shape[0], k.shape[0]) // rows
    return triton.next_power_of_2(max(longest, 16))


def jagged_attention_triton(
    q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *, activation: str, causal: bool,
    scale: float, bias: RelativeBias | None, block_size: int | None, window: int | None,
    num_targets: Tensor | None, pointwise_norm: str | int, max_q_len: int | None, max_kv_len: int | None,
) -> Tensor:
    """Triton path of ``kernels.jagged_attention`` (arguments already validated there)."""
    bias = bias if bias is not None and not bias.is_empty else None
    pos_w = bias.pos_weight if bias is not None else None
    time_w = bias.time_weight if bias is not None else None
    q_ts = bias.q_timestamps.contiguous() if time_w is not None else None
    kv_ts = bias.kv_timestamps.contiguous() if time_w is not None else None
    q, k, v, q_offsets, kv_offsets = (t.contiguous() for t in (q, k, v, q_offsets, kv_offsets))
    from kernels import attention_block_op as block_op  # imports this module: loaded on first use

    if block_op.supports(q, k, q_offsets, kv_offsets, block_size, window):  # one-pass block-local kernels
        return block_op.block_attention(
            q, k, v, q_offsets, activation=activation, causal=causal, scale=scale, block_size=int(block_size),
            num_targets=None if num_targets is None else num_targets.contiguous(),
            pos_weight=None if pos_w is None else pos_w.contiguous(),
            time_weight=None if time_w is None else time_w.contiguous(), q_timestamps=q_ts, kv_timestamps=kv_ts,
            norm=0 if pointwise_norm == "row" else int(pointwise_norm),
        )
    from kernels import attention_window_op as window_op

    if window_op.supports(q, k, q_offsets, kv_offsets, block_size, window):  # the window's own kernels
        return window_op.window_attention(
            q, k, v, q_offsets, activation=activation, causal=causal, scale=scale, window=int(window),
            num_targets=None if num_targets is None else num_targets.contiguous(),
            pos_weight=None if pos_w is None else pos_w.contiguous(),
            time_weight=None if time_w is None else time_w.contiguous(), q_timestamps=q_ts, kv_timestamps=kv_ts,
            norm=0 if pointwise_norm == "row" else int(pointwise_norm),
        )
    len_key, q_len_hint = _len_key(q_offsets, q, k, max_q_len, max_kv_len), int(max_q_len or 0)
    block = int(block_size or 0)
    # One list of query tiles for the forward and (where it fits) the backward's two passes.
    work = work_list(q_offsets, kv_offsets, _plan(q, k, len_key, block, q_len_hint)["tile_q"], q.shape[0])[0]
    inputs = (
        q, k, v, q_offsets, kv_offsets, None if num_targets is None else num_targets.contiguous(),
        None if pos_w is None else pos_w.contiguous(), None if time_w is None else time_w.contiguous(),
        q_ts, kv_ts, activation, bool(causal), float(scale), block, -1 if window is None else int(window),
        0 if pointwise_norm == "row" else int(pointwise_norm), len_key, q_len_hint, work,
    )
    if torch.compiler.is_compiling():  # the op's registered autograd: what the compiler traces best
        return torch.ops.gemtrain.jagged_attn_fwd(*inputs)[0]
    return _JaggedAttention.apply(*inputs)


def eager_autograd(name: str, fwd_op: Callable, setup_context, backward) -> type[torch.autograd.Function]:
    """An ``autograd.Function`` (named ``name``) that runs ``fwd_op`` (an ``eager_call``) with the autograd the
    op registers (its ``setup_context`` and ``backward``) and returns the op's first output. Eager calls through
    it skip the custom-op autograd layer's per-call argument re-binding (host time a synchronized call pays
    while the GPU waits); under a dispatch mode the op itself runs, so FLOP counters and fake tensors see it."""

    def forward(ctx, *inputs):
        output = fwd_op(*inputs)
        setup_context(ctx, inputs, output)
        return output[0]

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(lambda ctx, dout: backward(ctx, dout, None))})


_JaggedAttention = eager_autograd("_JaggedAttention", eager_call("jagged_attn_fwd"), _setup_context, _backward)


__all__ = ["jagged_attention_triton", "work_list"]
