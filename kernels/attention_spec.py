"""Shared definitions of jagged attention: errors, the relative bias, bucket functions, dispatch override.

Positions. In batch row ``b`` with ``Lq`` queries and ``Lkv`` keys, key ``j`` sits at position ``j`` and
query ``i`` at position ``Lkv - Lq + i`` (bottom-right alignment, as flash-attention aligns causal
attention of different lengths). With ``Lq == Lkv`` both are plain indices.

Which keys a query at position ``p`` sees (every condition below holds at once):

* ``causal``: keys at positions ``<= p``.
* ``num_targets[b] = T`` (HSTU target-aware mask): the last ``T`` keys are targets (candidates); a key
  that is a target is seen only by the query at its own position. History keys follow the other rules.
  Used for self-attention, a target query sees every history key and itself; a history query sees
  history keys only (causally when ``causal``).
* ``block_size = S``: keys of the query's own block, ``p // S == key // S`` (floor division; a query at a
  negative position has no block and sees nothing).
* ``window = W``: keys in ``[p - W, p]`` when ``causal``, ``[p - W, p + W]`` otherwise.

A query that sees no key outputs zeros (and gets zero gradients).

Activations.

* ``softmax``: ``out_i = sum_j softmax_j(s_ij) v_j`` with ``s_ij = scale * q_i.k_j + bias_ij``.
* ``silu`` / ``gelu`` (pointwise, HSTU/GDPA style): ``out_i = sum_j act(s_ij) v_j / n`` over the visible keys,
  where ``n`` is the row's KV length (``pointwise_norm="row"``, rows of length 0 use 1) or a fixed
  positive number (``pointwise_norm=<int>``). ``gelu`` is the tanh approximation.

Relative bias (``RelativeBias``). ``bias_ij[h] = pos_weight[pos_bucket(p_i - j), h]
+ time_weight[time_bucket(t_i - t_j), h]`` (either table may be absent):

* ``pos_bucket(r) = clamp(r, -M, P - 1 - M) + M`` with ``P`` pos buckets and ``M = (P - 1) // 2``:
  linear in the relative position, clamped at both ends (causal attention uses buckets ``M..P-1``).
* ``time_bucket(dt) = min(floor(log2(float32(1 + |dt|))), T - 1)`` with ``T`` time buckets and ``dt`` in
  int64 seconds; the floor(log2) is read off the float32 exponent bits, so the reference and the kernels
  agree bit for bit.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

Activation = Literal["softmax", "silu", "gelu"]
Impl = Literal["auto", "triton", "ref"]
ACTIVATIONS: tuple[str, ...] = ("softmax", "silu", "gelu")
IMPLS: tuple[str, ...] = ("auto", "triton", "ref")


class AttentionError(ValueError):
    """Raised when a jagged attention call gets inputs it cannot handle (says which argument and why)."""


@dataclass
class RelativeBias:
    """Learnable per-head relative position and time-difference tables, looked up inside the kernel.

    ``pos_weight``: ``[num_pos_buckets, H]`` or None; ``time_weight``: ``[num_time_buckets, H]`` or None.
    ``q_timestamps``: ``[ΣLq]`` and ``kv_timestamps``: ``[ΣLkv]`` int64 seconds (needed with ``time_weight``).
    For self-attention pass the same timestamps for both sides.
    """

    pos_weight: torch.Tensor | None = None
    time_weight: torch.Tensor | None = None
    q_timestamps: torch.Tensor | None = None
    kv_timestamps: torch.Tensor | None = None

    def validate(self, num_heads: int, total_q: int, total_kv: int) -> None:
        for name in ("pos_weight", "time_weight"):
            w = getattr(self, name)
            if w is not None and (w.dim() != 2 or w.shape[1] != num_heads or w.shape[0] < 1):
                raise AttentionError(
                    f"RelativeBias.{name}: expected shape [num_buckets >= 1, H={num_heads}], got "
                    f"{tuple(w.shape)}; build the table with one column per head"
                )
        if self.time_weight is not None:
            for name, total in (("q_timestamps", total_q), ("kv_timestamps", total_kv)):
                ts = getattr(self, name)
                if ts is None:
                    raise AttentionError(f"RelativeBias.{name} is None but time_weight is set; pass [ΣL] int64 seconds")
                if ts.dim() != 1 or ts.shape[0] != total:
                    raise AttentionError(
                        f"RelativeBias.{name}: expected shape [{total}] (one timestamp per token), got {tuple(ts.shape)}"
                    )

    @property
    def is_empty(self) -> bool:
        return self.pos_weight is None and self.time_weight is None


def pos_bucket(rel: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """Bucket of the relative position ``query_pos - key_pos`` (see the module docstring)."""
    half = (num_buckets - 1) // 2
    return rel.clamp(-half, num_buckets - 1 - half) + half


def time_bucket(dt: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """Bucket of a time difference in seconds: floor(log2(1 + |dt|)) from the float32 exponent, clamped."""
    x = (dt.abs() + 1).to(torch.float32)
    exponent = (x.view(torch.int32) >> 23) - 127
    return exponent.clamp(0, num_buckets - 1).to(torch.int64)


_state = threading.local()


def current_impl() -> str:
    return getattr(_state, "impl", "auto")


@contextlib.contextmanager
def attention_impl(impl: Impl) -> Iterator[None]:
    """Force ``jagged_attention`` to use ``"triton"`` or ``"ref"`` (``"auto"``: Triton on CUDA, ref on CPU).

    Under ``TRITON_INTERPRET=1`` the Triton kernels run on CPU tensors, which is how the tests cover them.
    """
    if impl not in IMPLS:
        raise AttentionError(f"attention_impl: impl={impl!r}, expected one of {IMPLS}")
    previous = current_impl()
    _state.impl = impl
    try:
        yield
    finally:
        _state.impl = previous
