"""Useful FLOPs of a jagged attention call: only (query, key) pairs that are real and visible count.

Forward: ``4 * pairs * D * H`` (two matmuls: QK^T and PV); backward: 2.5x the forward (five matmuls);
forward+backward therefore 3.5x, the convention of the device README and flash-attention.
"""

from __future__ import annotations

import torch

BACKWARD_FACTOR = 2.5


def visible_pairs(
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    causal: bool = False,
    block_size: int | None = None,
    window: int | None = None,
    num_targets: torch.Tensor | None = None,
) -> int:
    """Number of visible (query, key) pairs over the batch, in closed form per query (no [Lq, Lkv] mask)."""
    qo = q_offsets.detach().to("cpu", torch.int64)
    ko = kv_offsets.detach().to("cpu", torch.int64)
    lq, lk = qo[1:] - qo[:-1], ko[1:] - ko[:-1]
    if int(lq.sum()) == 0:
        return 0
    row = torch.repeat_interleave(torch.arange(lq.numel()), lq)
    first = qo[:-1][row]
    p = lk[row] - lq[row] + (torch.arange(int(lq.sum())) - first)  # query positions
    n = lk[row]
    hist = n - (num_targets.detach().to("cpu", torch.int64)[row] if num_targets is not None else 0)
    lo = torch.zeros_like(p)
    hi = torch.minimum(n, p + 1) if causal else n.clone()  # exclusive upper bound
    if block_size is not None:
        blk = torch.div(p, block_size, rounding_mode="floor") * block_size
        lo = torch.maximum(lo, blk)
        hi = torch.minimum(hi, blk + block_size)
        hi = torch.where(p < 0, lo, hi)
    if window is not None:
        lo = torch.maximum(lo, p - window)
        hi = torch.minimum(hi, p + 1 if causal else p + window + 1)
    hist_count = (torch.minimum(hi, hist) - lo).clamp_min(0)
    own = (p >= hist) & (p >= lo) & (p < hi)  # a target query sees its own key
    return int((hist_count + own.to(torch.int64)).sum())


def jagged_attention_flops(
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    num_heads: int,
    head_dim: int,
    *,
    causal: bool = False,
    block_size: int | None = None,
    window: int | None = None,
    num_targets: torch.Tensor | None = None,
    backward: bool = False,
) -> int:
    """Useful FLOPs of one call (forward, or forward+backward with ``backward=True``), for MFU accounting."""
    pairs = visible_pairs(q_offsets, kv_offsets, causal=causal, block_size=block_size, window=window,
                          num_targets=num_targets)
    fwd = 4 * pairs * head_dim * num_heads
    return int(fwd * (1 + BACKWARD_FACTOR)) if backward else fwd
