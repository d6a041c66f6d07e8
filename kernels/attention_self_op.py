"""Autograd shared by the one-offsets self-attention ops (block-local and window).

Both take ``(q, k, v, offsets, num_targets, pos_weight, time_weight, q_timestamps, kv_timestamps, *options,
work)`` forward and return ``(out, lse)``; their backward ops take ``(do, q, k, v, out, lse, <the same
tensors>, *options, work)`` and return ``(dq, dk, dv, dpos, dtime)``, the table gradients empty where a
table is absent.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.flop_counter import register_flop_formula

from kernels.attention_flops import BACKWARD_FACTOR, visible_pairs
from kernels.attention_op import eager_autograd, eager_call

Tensor = torch.Tensor


def fake_backward(q: Tensor, k: Tensor, v: Tensor, pos_weight: Tensor | None, time_weight: Tensor | None):
    """The backward op's outputs, shapes only (``register_fake``)."""
    def table(t: Tensor | None) -> Tensor:
        return t.new_empty(t.shape) if t is not None else q.new_empty((0,), dtype=torch.float32)

    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), table(pos_weight), table(time_weight)


def register_self_attention_autograd(name: str, fwd_op: str, bwd_op: str) -> type[torch.autograd.Function]:
    """Registers ``gemtrain::<bwd_op>`` as the autograd of ``gemtrain::<fwd_op>`` and returns the eager
    ``autograd.Function`` (``name``) that runs the same ``setup_context`` / ``backward`` without the custom-op
    autograd layer (``eager_autograd``)."""
    backward_call = eager_call(bwd_op)

    def setup_context(ctx, inputs, output) -> None:
        q, k, v, offsets, num_targets, pos_weight, time_weight, q_ts, kv_ts, *rest = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, offsets, num_targets, pos_weight, time_weight, q_ts, kv_ts,
                              rest[-1])
        ctx.rest = rest[:-1]

    def backward(ctx, dout, dlse):
        q, k, v, out, lse, offsets, num_targets, pos_weight, time_weight, q_ts, kv_ts, work = ctx.saved_tensors
        dq, dk, dv, dpos, dtime = backward_call(
            dout, q, k, v, out, lse, offsets, num_targets, pos_weight, time_weight, q_ts, kv_ts, *ctx.rest, work,
        )
        # no gradient for offsets, num_targets, the timestamps, the options and the work list
        return (dq, dk, dv, None, None, dpos if pos_weight is not None else None,
                dtime if time_weight is not None else None) + (None,) * (len(ctx.rest) + 3)

    torch.library.register_autograd(f"gemtrain::{fwd_op}", backward, setup_context=setup_context)
    return eager_autograd(name, eager_call(fwd_op), setup_context, backward)


def register_self_attention_flops(fwd_op, bwd_op, option: str, traced_pairs: Callable[[int, int, bool], int]) -> None:
    """FLOP formulas of both ops: 4 * visible pairs * H * D forward, ``BACKWARD_FACTOR`` times that backward.

    ``option`` names the op's size (``block_size`` or ``window``, its first option after ``scale``) as
    ``visible_pairs`` takes it; ``traced_pairs(tokens, size, causal)`` is the count assumed while tracing, where
    fake offsets carry no values.
    """

    def pairs(offsets: Tensor, num_targets: Tensor | None, causal: bool, size: int, tokens: int) -> int:
        try:
            return visible_pairs(offsets, offsets, causal=causal, num_targets=num_targets, **{option: size})
        except Exception:  # fake/meta offsets (tracing)
            return traced_pairs(tokens, size, causal)

    @register_flop_formula(fwd_op, get_raw=True)
    def _fwd_flops(*args, out_val=None, **kwargs) -> int:
        q = args[0]
        return 4 * pairs(args[3], args[4], args[10], args[12], q.shape[0]) * q.shape[1] * q.shape[2]

    @register_flop_formula(bwd_op, get_raw=True)
    def _bwd_flops(*args, out_val=None, **kwargs) -> int:
        q = args[1]
        return int(BACKWARD_FACTOR * 4 * pairs(args[6], args[7], args[13], args[15], q.shape[0]) * q.shape[1]
                   * q.shape[2])


def self_attention_work(q: Tensor, offsets: Tensor, build: Callable[[], Tensor]) -> Tensor:
    """An op's work list: ``build()``, or an empty one when there are no tokens or no rows."""
    if q.shape[0] == 0 or offsets.numel() <= 1:
        return torch.zeros((0, 2), dtype=torch.int32, device=q.device)
    return build()
