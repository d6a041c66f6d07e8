"""Plain PyTorch reference of jagged attention (semantics in ``kernels.attention_spec``).

Rows are padded internally, a chunk of rows at a time, so the CPU path trains at usable speed; all
arithmetic stays in the input dtype (the tests use that to measure the reference's own low-precision error).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernels.attention_spec import RelativeBias, pos_bucket, time_bucket

# Elements of one chunk's [rows, H, Lq, Lkv] score tensor; bounds the reference's memory.
_CHUNK_ELEMENTS = 1 << 25


def visible_mask(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    kv_len: torch.Tensor,
    *,
    causal: bool,
    hist_end: torch.Tensor,
    block_size: int | None,
    window: int | None,
) -> torch.Tensor:
    """Which keys each query sees. ``q_pos``: [..., Lq, 1]; ``k_pos``: [1, Lkv]; lengths broadcast."""
    ok = (k_pos < kv_len) & (k_pos >= 0)
    history = k_pos < hist_end
    base = history | (k_pos == q_pos)
    if causal:
        base = base & (k_pos <= q_pos)
    ok = ok & base
    if block_size is not None:
        ok = ok & (q_pos >= 0) & (torch.div(k_pos, block_size, rounding_mode="floor")
                                  == torch.div(q_pos, block_size, rounding_mode="floor"))
    if window is not None:
        upper = q_pos if causal else q_pos + window
        ok = ok & (k_pos >= q_pos - window) & (k_pos <= upper)
    return ok


def _act(s: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "silu":
        return F.silu(s)
    return F.gelu(s, approximate="tanh")


def _pad_index(offsets: list[int], rows: range, max_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.tensor([offsets[b] for b in rows], device=device)
    lens = torch.tensor([offsets[b + 1] - offsets[b] for b in rows], device=device)
    ar = torch.arange(max_len, device=device)
    valid = ar[None, :] < lens[:, None]
    idx = torch.where(valid, starts[:, None] + ar[None, :], torch.zeros_like(valid, dtype=torch.long))
    return idx, valid


def _chunk_rows(q_off: list[int], kv_off: list[int], heads: int) -> list[range]:
    chunks: list[range] = []
    start, mq, mk = 0, 0, 0
    for b in range(len(q_off) - 1):
        nq, nk = max(mq, q_off[b + 1] - q_off[b]), max(mk, kv_off[b + 1] - kv_off[b])
        if b > start and (b + 1 - start) * heads * nq * nk > _CHUNK_ELEMENTS:
            chunks.append(range(start, b))
            start, nq, nk = b, q_off[b + 1] - q_off[b], kv_off[b + 1] - kv_off[b]
        mq, mk = nq, nk
    chunks.append(range(start, len(q_off) - 1))
    return chunks


def jagged_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    activation: str = "softmax",
    causal: bool = False,
    scale: float | None = None,
    bias: RelativeBias | None = None,
    block_size: int | None = None,
    window: int | None = None,
    num_targets: torch.Tensor | None = None,
    pointwise_norm: str | int = "row",
) -> torch.Tensor:
    """Reference jagged attention; same arguments and semantics as ``kernels.jagged_attention``."""
    total_q, heads, dim = q.shape
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    q_off = [int(x) for x in q_offsets.tolist()]
    kv_off = [int(x) for x in kv_offsets.tolist()]
    nt = [0] * (len(q_off) - 1) if num_targets is None else [int(x) for x in num_targets.tolist()]
    dev = q.device
    pieces: list[torch.Tensor] = []
    for rows in _chunk_rows(q_off, kv_off, heads):
        lq = [q_off[b + 1] - q_off[b] for b in rows]
        lk = [kv_off[b + 1] - kv_off[b] for b in rows]
        mq, mk = max(lq), max(lk)
        if mq == 0:
            continue
        if mk == 0:  # no keys: zeros that stay connected to q so backward still runs
            pieces.append(q[q_off[rows.start]:q_off[rows.stop]] * 0)
            continue
        qi, qvalid = _pad_index(q_off, rows, mq, dev)
        ki, _ = _pad_index(kv_off, rows, mk, dev)
        lq_t = torch.tensor(lq, device=dev)[:, None, None]
        lk_t = torch.tensor(lk, device=dev)[:, None, None]
        hist_end = lk_t - torch.tensor([nt[b] for b in rows], device=dev)[:, None, None]
        q_pos = lk_t - lq_t + torch.arange(mq, device=dev)[None, :, None]  # [n, Lq, 1]
        k_pos = torch.arange(mk, device=dev)[None, None, :]  # [1, 1, Lkv]
        mask = visible_mask(q_pos, k_pos, lk_t, causal=causal, hist_end=hist_end,
                            block_size=block_size, window=window)
        mask = (mask & qvalid[:, :, None])[:, None]  # [n, 1, Lq, Lkv]

        qp, kp, vp = q[qi], k[ki], v[ki]  # [n, L, H, D]
        s = torch.einsum("nihd,njhd->nhij", qp, kp) * scale
        if bias is not None and not bias.is_empty:
            s = s + _bias(bias, q_pos, k_pos, qi, ki).to(s.dtype)
        if activation == "softmax":
            s = s.masked_fill(~mask, float("-inf"))
            m = s.amax(dim=-1, keepdim=True).detach()
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            e = torch.exp(s - m)
            denom = e.sum(dim=-1, keepdim=True)
            p = e / torch.where(denom > 0, denom, torch.ones_like(denom))
        else:
            if pointwise_norm == "row":
                norm = lk_t.clamp_min(1).to(s.dtype)[:, None]
            else:
                norm = torch.tensor(float(pointwise_norm), dtype=s.dtype, device=dev)
            p = _act(s, activation) * mask / norm
        out = torch.einsum("nhij,njhd->nihd", p, vp)
        pieces.append(out[qvalid])
    if not pieces:
        return q * 0
    return torch.cat(pieces, dim=0)


def _bias(bias: RelativeBias, q_pos: torch.Tensor, k_pos: torch.Tensor, qi: torch.Tensor,
          ki: torch.Tensor) -> torch.Tensor:
    """Bias [n, H, Lq, Lkv] gathered from the tables (differentiable with respect to them)."""
    total: torch.Tensor | None = None
    if bias.pos_weight is not None:
        if bool((q_pos[:, :1] == q_pos[:1, :1]).all()):
            # Every row places its queries alike (self-attention): one [1, Lq, Lkv] gather serves the chunk,
            # which also keeps the table's backward scatter n times smaller.
            q_pos = q_pos[:1]
        buckets = pos_bucket(q_pos - k_pos, bias.pos_weight.shape[0])  # [n or 1, Lq, Lkv]
        total = bias.pos_weight[buckets].permute(0, 3, 1, 2)
    if bias.time_weight is not None:
        assert bias.q_timestamps is not None and bias.kv_timestamps is not None
        dt = bias.q_timestamps[qi][:, :, None] - bias.kv_timestamps[ki][:, None, :]
        t = bias.time_weight[time_bucket(dt, bias.time_weight.shape[0])].permute(0, 3, 1, 2)
        total = t if total is None else total + t
    assert total is not None
    return total
