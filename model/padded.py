"""The padded baseline (``attention_impl: padded``): jagged <-> padded layouts and SDPA attention on [B, H, L, D].

It exists so the saving of the jagged path can be measured end to end on the same model: the history is
padded to the batch's longest row, every encoder op runs on ``B * Lmax`` tokens, and attention goes
through ``torch.nn.functional.scaled_dot_product_attention`` with a mask (and the relative bias as an
additive float mask). Masking follows ``kernels.attention_spec`` exactly, so for softmax without dropout
the padded model equals the jagged one up to float rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.attention_ref import visible_mask
from kernels.attention_spec import pos_bucket, time_bucket


@dataclass
class PaddedLayout:
    """Where each jagged token sits in a ``[B, Lmax]`` box."""

    lengths: torch.Tensor  # [B]
    max_len: int
    dest: torch.Tensor  # [ΣL] flat index into B * Lmax
    valid: torch.Tensor  # [B, Lmax] bool

    @staticmethod
    def of(offsets: torch.Tensor, total: int, max_len: int | None = None) -> PaddedLayout:
        lengths = offsets[1:] - offsets[:-1]
        b = lengths.numel()
        if max_len is None:
            max_len = int(lengths.max()) if b else 0  # the one device sync of the padded path
        rows = torch.repeat_interleave(torch.arange(b, device=offsets.device), lengths, output_size=total)
        pos = torch.arange(total, device=offsets.device) - offsets[:-1][rows]
        valid = torch.arange(max_len, device=offsets.device)[None, :] < lengths[:, None]
        return PaddedLayout(lengths=lengths, max_len=max_len, dest=rows * max_len + pos, valid=valid)

    @property
    def batch(self) -> int:
        return self.lengths.numel()

    def pad(self, x: torch.Tensor, fill: float | int = 0) -> torch.Tensor:
        """``[ΣL, ...]`` -> ``[B * Lmax, ...]`` (padding holds ``fill``)."""
        out = x.new_full((self.batch * self.max_len, *x.shape[1:]), fill)
        return out.index_copy(0, self.dest, x)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """``[B * Lmax, ...]`` -> ``[ΣL, ...]``."""
        return x.index_select(0, self.dest)


# SDPA's memory-efficient kernel wants an additive mask whose strides are multiples of 16 elements; an
# unaligned one is padded (copied, and the copy kept for backward) on every call. Masks are built aligned.
_MASK_ALIGN = 16


def _aligned_len(n: int) -> int:
    return -(-n // _MASK_ALIGN) * _MASK_ALIGN


def _additive_mask(visible: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, lk: int) -> torch.Tensor:
    """``where(visible, bias or 0, -inf)`` in ``dtype``, sliced from a key dimension padded to the alignment.

    ``visible [..., Lq, Lk_aligned]`` bool; ``bias`` broadcastable to ``[..., H, Lq, Lk_aligned]``. Built directly in
    the compute dtype, so no float32 ``[B, H, L, L]`` copy of the bias exists.
    """
    value = bias.to(dtype) if bias is not None else torch.zeros((), dtype=dtype, device=visible.device)
    return torch.where(visible, value, float("-inf"))[..., :lk]


def _relative_bias(pos_weight: torch.Tensor, lq: int, lk: int) -> torch.Tensor:
    """``[H, Lq, Lk]`` with ``[h, i, j] = pos_weight[pos_bucket(i - j), h]`` (Toeplitz: one value per ``i - j``).

    Gathers the ``Lq + Lk - 1`` distinct values and lays them out with ``unfold``, so the backward scatters
    ``Lq + Lk - 1`` rows into the table instead of ``Lq * Lk`` duplicate indices (which CUDA's
    index-accumulate serialises: seconds per layer at L = 4096).
    """
    rel = torch.arange(-(lk - 1), lq, device=pos_weight.device)  # i - j, from -(Lk-1) to Lq-1
    vals = pos_weight[pos_bucket(rel, pos_weight.shape[0])]  # [Lq + Lk - 1, H]
    win = vals.unfold(0, lk, 1)  # [Lq, H, Lk]: win[i, :, b] = vals[i + b]; i - j + Lk - 1 = i + b at b = Lk-1-j
    return win.flip(-1).permute(1, 0, 2)


def _sdpa(q, k, v, **kw):
    """SDPA on its flash / memory-efficient kernels: the cuDNN backend builds a plan per new shape (about 2 s
    each), and a padded batch changes shape whenever its longest row does."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def _shared_causal_self_attention(q, k, v, lens, *, scale, pos_weight, block_size, window):
    """Causal self-attention of right-padded rows: a valid query ``i < len`` sees only keys ``j <= i < len``, so
    the key-padding mask is implied and one ``[1, H, L, L]`` mask/bias serves every row (``is_causal`` and
    SDPA's flash backend when there is neither bias nor locality). Padded queries output zeros."""
    b, lq, h, d = q.shape
    dev = q.device
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, L, D]
    if pos_weight is None and block_size is None and window is None:
        out = _sdpa(qh, kh, vh, is_causal=True, scale=scale)
    else:
        la = _aligned_len(lq)
        q_pos = torch.arange(lq, device=dev)[:, None]
        k_pos = torch.arange(la, device=dev)[None, :]
        lim = torch.tensor(lq, device=dev)
        visible = visible_mask(q_pos, k_pos, lim, causal=True, hist_end=lim, block_size=block_size, window=window)
        bias = _relative_bias(pos_weight.to(q.dtype), lq, la) if pos_weight is not None else None  # [H, L, La]
        attn_mask = _additive_mask(visible, bias, q.dtype, lq)[None]  # [1, H or 1, L, L], one for all rows
        out = _sdpa(qh, kh, vh, attn_mask=attn_mask, scale=scale)
    valid = torch.arange(lq, device=dev)[None, :] < lens[:, None]  # [B, L]
    return out.transpose(1, 2) * valid[:, :, None, None].to(out.dtype)


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_lens: torch.Tensor,
    kv_lens: torch.Tensor,
    *,
    activation: str = "softmax",
    causal: bool = False,
    scale: float | None = None,
    pos_weight: torch.Tensor | None = None,
    time_weight: torch.Tensor | None = None,
    q_ts: torch.Tensor | None = None,
    kv_ts: torch.Tensor | None = None,
    block_size: int | None = None,
    window: int | None = None,
    same_lengths: bool = False,
) -> torch.Tensor:
    """Padded attention: ``q [B, Lq, H, D]``, ``k, v [B, Lk, H, D]``, lengths ``[B]`` -> ``[B, Lq, H, D]``.

    Positions, masks and bias follow ``kernels.attention_spec``. Padded queries and queries that see no
    key output zeros. ``q_ts [B, Lq]`` / ``kv_ts [B, Lk]``: timestamps (with ``time_weight``).
    ``same_lengths``: ``q_lens == kv_lens`` (self-attention), so the position bias is one table for all rows;
    causal softmax self-attention without a time bias then needs no per-row mask at all (the strongest
    padded baseline: flash SDPA with ``is_causal`` when there is no bias either).
    """
    b, lq, h, d = q.shape
    lk = k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    dev = q.device
    if lk == 0 or lq == 0:
        return q.new_zeros(q.shape) + 0 * (k.sum() + v.sum())  # keeps k, v in the graph
    if same_lengths and causal and activation == "softmax" and time_weight is None and lq == lk:
        return _shared_causal_self_attention(q, k, v, q_lens, scale=scale, pos_weight=pos_weight,
                                             block_size=block_size, window=window)
    la = _aligned_len(lk) if activation == "softmax" else lk
    lq_t, lk_t = q_lens[:, None, None], kv_lens[:, None, None]
    q_pos = lk_t - lq_t + torch.arange(lq, device=dev)[None, :, None]  # [B, Lq, 1]
    k_pos = torch.arange(la, device=dev)[None, None, :]  # [1, 1, La]
    mask = visible_mask(q_pos, k_pos, lk_t, causal=causal, hist_end=lk_t, block_size=block_size, window=window)
    mask = mask & (torch.arange(lq, device=dev)[None, :, None] < lq_t)  # [B, Lq, La]
    seen = mask.any(dim=-1, keepdim=True)  # [B, Lq, 1]
    # SDPA returns NaN for a row with no visible key: let such rows see key 0, then zero them.
    mask = mask | (~seen & (k_pos == 0))
    bias = None
    if pos_weight is not None:
        # built from the table in the compute dtype (the gather's backward sums into the float32 table)
        pw = pos_weight.to(q.dtype) if activation == "softmax" else pos_weight
        if same_lengths:  # self-attention: q_pos - k_pos = i - j in every row, one [H, Lq, Lk] table
            bias = _relative_bias(pw, lq, la)[None]  # [1, H, Lq, La]
        else:
            # F.embedding: its CUDA backward reduces duplicate indices by sorting (indexing's is serial per index)
            bias = F.embedding(pos_bucket(q_pos - k_pos, pw.shape[0]), pw).permute(0, 3, 1, 2)  # [B, H, Lq, La]
    if time_weight is not None:
        assert q_ts is not None and kv_ts is not None
        kts = kv_ts if la == lk else F.pad(kv_ts, (0, la - lk))
        tb = time_bucket(q_ts[:, :, None] - kts[:, None, :], time_weight.shape[0])
        tw = time_weight.to(q.dtype) if activation == "softmax" else time_weight
        t = F.embedding(tb, tw).permute(0, 3, 1, 2)
        del tb
        bias = t if bias is None else bias + t
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, L, D]
    if activation == "softmax":
        attn_mask = _additive_mask(mask[:, None], bias, q.dtype, lk)
        out = _sdpa(qh, kh, vh, attn_mask=attn_mask, scale=scale)
    else:
        s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
        if bias is not None:
            s = s + bias.to(s.dtype)
        act = F.silu(s) if activation == "silu" else F.gelu(s, approximate="tanh")
        norm = kv_lens.clamp_min(1).to(s.dtype)[:, None, None, None]
        out = torch.matmul(act * mask[:, None] / norm, vh)
    out = out.transpose(1, 2)
    return out * seen[..., None].to(out.dtype)


def padded_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    q_timestamps: torch.Tensor | None = None,
    kv_timestamps: torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor:
    """Same inputs and result as ``kernels.jagged_attention`` (jagged ``[ΣL, H, D]``), computed padded."""
    ql = PaddedLayout.of(q_offsets, q.shape[0])
    kl = PaddedLayout.of(kv_offsets, k.shape[0])
    h, d = q.shape[1:]
    pq = ql.pad(q).view(ql.batch, ql.max_len, h, d)
    pk = kl.pad(k).view(kl.batch, kl.max_len, h, d)
    pv = kl.pad(v).view(kl.batch, kl.max_len, h, d)
    qts = ql.pad(q_timestamps).view(ql.batch, ql.max_len) if q_timestamps is not None else None
    kts = kl.pad(kv_timestamps).view(kl.batch, kl.max_len) if kv_timestamps is not None else None
    out = sdpa_attention(pq, pk, pv, ql.lengths, kl.lengths, q_ts=qts, kv_ts=kts, **kwargs)
    return ql.unpad(out.reshape(ql.batch * ql.max_len, h, d))
