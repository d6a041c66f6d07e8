"""Block-local self-attention as ``torch.library`` custom ops around ``attention_triton_block``.

``gemtrain::block_attn_fwd`` / ``gemtrain::block_attn_bwd`` (autograd and FLOP formulas registered) serve
``jagged_attention(..., block_size=S)`` for self-attention (one offsets tensor for both sides) with
S <= 64 and D <= 128; ``attention_op.jagged_attention_triton`` routes those calls here (``supports``) and
keeps the generic kernels for everything else.

Work list: items of ``group`` consecutive blocks of one row (``attention_op.work_list`` with tiles of
``group * S`` tokens); ``group`` is as large as keeps a few waves of programs per SM.
"""

from __future__ import annotations

import functools

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import attention_triton_common as common
from kernels import triton_launch
from kernels.attention_op import (  # attention_op imports this module lazily
    _ptr,
    _unset,
    attention_op,
    no_token_grads,
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
from kernels.attention_triton_block import block_attn_bwd_kernel, block_attn_fwd_kernel
from kernels.attention_triton_common import ACT_CODES, INTERPRET

Tensor = torch.Tensor

# Blocks of up to 64 tokens and head dims up to 128 (the shapes checked on the device): S=128
# (tile 128 x 128 or 128 x 64 with the score tiles' transposes) asked for more shared memory than an H200
# has in the backward (360 KB at D=128, 237 KB at D=64 with 3 stages), so it keeps the generic kernels.
MAX_TILE = 64
MAX_HEAD_DIM = 128
# (warps, stages) of the forward and the backward for tiles of at most 16 KB ("small", measured on an H200
# at S=64, D=128, bf16: benchmarks/attention.py blocksweep, RESULTS.md issue-5 part) and larger ones
# ("large": fp32 at S=64, D=128, which ran there in the accuracy checks).
FWD_CONFIG: dict[str, tuple[int, int]] = {"small": (4, 2), "large": (4, 1)}
BWD_CONFIG: dict[str, tuple[int, int]] = {"small": (4, 3), "large": (4, 1)}
MAX_GROUP = 4
WAVES = 8  # programs per SM (at least) that fix the largest group


def _pow2(n: int) -> int:
    """Smallest power of two >= n, at least 16 (plain Python: ``triton.next_power_of_2`` is a JIT
    function whose host calls cost microseconds each, paid on every attention call)."""
    return max(16, 1 << (n - 1).bit_length())


def tile_of(block_size: int) -> int:
    return _pow2(block_size)


def supports(q: Tensor, k: Tensor, q_offsets: Tensor, kv_offsets: Tensor, block_size: int | None,
             window: int | None) -> bool:
    """Whether the block kernels serve this call: block-local self-attention (one offsets tensor for both
    sides), S <= MAX_TILE, D <= MAX_HEAD_DIM."""
    return (block_size is not None and window is None and 0 < block_size <= MAX_TILE
            and q.shape[-1] <= MAX_HEAD_DIM and q.shape[0] == k.shape[0]
            and q_offsets.data_ptr() == kv_offsets.data_ptr() and q_offsets.numel() == kv_offsets.numel())


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def group_of(total: int, block_size: int, heads: int, device: torch.device) -> int:
    """Blocks per program: the largest power of two <= MAX_GROUP that keeps WAVES programs per SM."""
    if INTERPRET or device.type != "cuda":
        return 2  # the interpreter's tests cover items of several blocks
    programs = -(-total // block_size) * heads
    group = max(1, programs // (WAVES * _sm_count(device.index or 0)))
    return min(MAX_GROUP, 1 << (group.bit_length() - 1))


def block_work(offsets: Tensor, total: int, block_size: int, group: int) -> Tensor:
    return work_list(offsets, offsets, block_size * group, total)[0]


def config_key(q: Tensor, block_size: int) -> str:
    """Config class of a tile: "small" up to 16 KB (bf16 64 x 128), else "large"."""
    tile_bytes = tile_of(block_size) * _pow2(q.shape[-1]) * q.element_size()
    return "small" if tile_bytes <= 16384 else "large"


def _desc(t: Tensor, tile: int, enabled: bool) -> Tensor | TensorDescriptor:
    if not enabled:
        return t
    tokens, heads, dim = t.shape
    return TensorDescriptor(t, [tokens, heads * dim], [heads * dim, 1], [tile, dim])


def _meta(q: Tensor, activation: str, causal: bool, block_size: int, norm: int, num_targets: Tensor | None,
          pos_weight: Tensor | None, time_weight: Tensor | None, tma: bool, config: tuple[int, int]) -> dict:
    tile = tile_of(block_size)
    return dict(
        H=q.shape[1], HEAD_DIM=q.shape[2], BLOCK_D=_pow2(q.shape[2]), S=block_size,
        TILE=tile, ACT=ACT_CODES[activation], CAUSAL=causal, HAS_NT=num_targets is not None,
        HAS_POS=pos_weight is not None, NUM_POS=1 if pos_weight is None else pos_weight.shape[0],
        HAS_TIME=time_weight is not None, NUM_TIME=1 if time_weight is None else time_weight.shape[0],
        NORM_ROW=norm == 0, PREC="ieee" if q.dtype == torch.float32 else "tf32", USE_TMA=tma,
        STAGES=1 if INTERPRET else config[1], num_warps=config[0],
    )


@attention_op("block_attn_fwd")
def block_attn_fwd(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, num_targets: Tensor | None, pos_weight: Tensor | None,
    time_weight: Tensor | None, q_timestamps: Tensor | None, kv_timestamps: Tensor | None,
    activation: str, causal: bool, scale: float, block_size: int, norm: int, group: int, work: Tensor,
) -> tuple[Tensor, Tensor]:
    if q.shape[0] == 0 or offsets.numel() <= 1:
        return torch.zeros_like(q), torch.full(q.shape[:2], float("inf"), dtype=torch.float32, device=q.device)
    out, lse = _unset(q), _unset(q, q.shape[:2], torch.float32)
    tile = tile_of(block_size)
    tma = common.use_tma([q, k, v], q.shape[2], _pow2(q.shape[2]))
    meta = _meta(q, activation, causal, block_size, norm, num_targets, pos_weight, time_weight, tma,
                 FWD_CONFIG[config_key(q, block_size)])
    triton_launch.run(block_attn_fwd_kernel, (work.shape[0] * q.shape[1],),
        q, k, v, _desc(q, tile, tma), _desc(k, tile, tma), _desc(v, tile, tma), out, lse, offsets,
        _ptr(num_targets, offsets), work, _ptr(pos_weight, lse), _ptr(time_weight, lse),
        _ptr(q_timestamps, offsets), _ptr(kv_timestamps, offsets), scale, float(max(norm, 1)), group, **meta,
    )
    return out, lse


@block_attn_fwd.register_fake
def _(q, k, v, offsets, num_targets, pos_weight, time_weight, q_timestamps, kv_timestamps, activation, causal,
      scale, block_size, norm, group, work):
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


@attention_op("block_attn_bwd")
def block_attn_bwd(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, offsets: Tensor,
    num_targets: Tensor | None, pos_weight: Tensor | None, time_weight: Tensor | None,
    q_timestamps: Tensor | None, kv_timestamps: Tensor | None,
    activation: str, causal: bool, scale: float, block_size: int, norm: int, group: int, work: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    if q.shape[0] == 0 or offsets.numel() <= 1:
        return no_token_grads(q, k, v, pos_weight, time_weight)
    dpos, dtime = table_grad_buffer(pos_weight, q), table_grad_buffer(time_weight, q)
    do = do.contiguous()
    dq, dk, dv = _unset(q), _unset(k), _unset(v)
    tile = tile_of(block_size)
    tma = common.use_tma([q, k, v, out, do], q.shape[2], _pow2(q.shape[2]))
    meta = _meta(q, activation, causal, block_size, norm, num_targets, pos_weight, time_weight, tma,
                 BWD_CONFIG[config_key(q, block_size)])
    triton_launch.run(block_attn_bwd_kernel, (work.shape[0] * q.shape[1],),
        q, k, v, out, do, *(_desc(t, tile, tma) for t in (q, k, v, out, do)), lse, dq, dk, dv, offsets,
        _ptr(num_targets, offsets), work, _ptr(pos_weight, lse), _ptr(time_weight, lse),
        dpos, dtime,
        _ptr(q_timestamps, offsets), _ptr(kv_timestamps, offsets), scale, float(max(norm, 1)), group, **meta,
    )
    return dq, dk, dv, table_grad(dpos, pos_weight), table_grad(dtime, time_weight)


@block_attn_bwd.register_fake
def _(do, q, k, v, out, lse, offsets, num_targets, pos_weight, time_weight, q_timestamps, kv_timestamps,
      activation, causal, scale, block_size, norm, group, work):
    return fake_backward(q, k, v, pos_weight, time_weight)


# While tracing, every block is assumed whole.
register_self_attention_flops(torch.ops.gemtrain.block_attn_fwd, torch.ops.gemtrain.block_attn_bwd, "block_size",
                              lambda tokens, size, causal: tokens * (size + 1) // 2 if causal else tokens * size)


# Eager calls skip the custom-op autograd layer (about 100 us of host time per forward and 100-160 us per
# forward+backward, measured on the 2-core development VM with the kernels stubbed); callers of the raw
# forward op still get its registered autograd, with the same gradients.
_BlockAttention = register_self_attention_autograd("_BlockAttention", "block_attn_fwd", "block_attn_bwd")


def block_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, *, activation: str, causal: bool, scale: float,
    block_size: int, num_targets: Tensor | None, pos_weight: Tensor | None, time_weight: Tensor | None,
    q_timestamps: Tensor | None, kv_timestamps: Tensor | None, norm: int,
) -> Tensor:
    """Block-local self-attention through the custom ops (inputs contiguous, validated by the caller)."""
    group = group_of(q.shape[0], block_size, q.shape[1], q.device)
    work = self_attention_work(q, offsets, lambda: block_work(offsets, q.shape[0], block_size, group))
    return _BlockAttention.apply(
        q, k, v, offsets, num_targets, pos_weight, time_weight, q_timestamps, kv_timestamps, activation,
        bool(causal), float(scale), int(block_size), int(norm), group, work,
    )


__all__ = ["block_attention", "supports"]
