"""Triton kernels of block-local self-attention (``block_size=S``): each block attends only to itself.

A block of S <= 64 tokens fits one tile, so the softmax is exact in one pass (no online rescaling) and
the backward needs no second pass: a block's dq, dk and dv depend on that block alone. The work is
memory-bound (per token: read q, k, v, write o), so each program takes ``group`` consecutive blocks of
one row for one head (a work item: row, first block / group) and loops over them with
``tl.range(num_stages=...)``, so the next block's loads overlap this block's math.

Self-attention only (one offsets array for both sides): query ``i`` and key ``j`` of a row sit at
positions ``i`` and ``j``. Visibility (causal in the block, the row's partial last block, target-aware
rows) is ``attention_triton_common.visible``; log-sum-exp is stored as the generic forward stores it
(base 2, +inf for a query that sees no key). Tensors are contiguous ``[tokens, H, D]``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.attention_triton_bias import (
    add_bias,
    add_table_grad,
    bucket_tile,
    pos_bucket,
)
from kernels.attention_triton_common import (
    act_fwd,
    fast_act,
    load_times,
    score_grads,
    score_scales,
    stream_tile,
    visible,
)


@triton.jit
def _block_rows(start, b0, L, h, offs_d, S: tl.constexpr, TILE: tl.constexpr, H: tl.constexpr,
                HEAD_DIM: tl.constexpr):
    """(positions of the tile's tokens in the row, which belong to this block and row, element offsets)."""
    loc = tl.arange(0, TILE)
    pos = b0 + loc
    ok = pos < L
    if TILE != S:  # a tile wider than the block: its last rows belong to the next block
        ok = ok & (loc < S)
    rows = (start + pos)[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :]
    return pos, ok, rows


@triton.jit
def _block_scores(q, k, pos, ok, ts_q, ts_k, L, hist_end, h, POSW, TIMEW, qk_scale, bias_scale,
                  S: tl.constexpr, H: tl.constexpr, CAUSAL: tl.constexpr, HAS_NT: tl.constexpr,
                  HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr,
                  NUM_TIME: tl.constexpr, PREC: tl.constexpr):
    """(scores with the bias, visibility) of one block: ``[TILE, TILE]`` queries x keys."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    s = add_bias(s, pos, pos, ts_q, ts_k, False, 0, False, 0, h, POSW, TIMEW, bias_scale, H, HAS_POS, NUM_POS,
                 HAS_TIME, NUM_TIME, False)
    vis = visible(pos[:, None], pos[None, :], L, hist_end, 0, CAUSAL, HAS_NT, S, False) & ok[:, None]
    return s, vis


@triton.jit
def _program_item(WORK, OFF, NT, group, scale, norm_const, S: tl.constexpr, H: tl.constexpr,
                  HAS_NT: tl.constexpr, ACT: tl.constexpr, NORM_ROW: tl.constexpr):
    """This program's work item and head: (row, head, the row's first token, its length, end of its history,
    first block of the item, blocks in the item, q·k factor, bias factor, pointwise 1/n); row < 0 for an
    unused item."""
    pid = tl.program_id(0)
    item = pid // H
    h = pid % H
    row = tl.load(WORK + 2 * item)
    first = tl.load(WORK + 2 * item + 1) * group
    start = tl.load(OFF + tl.maximum(row, 0)).to(tl.int64)
    L = (tl.load(OFF + tl.maximum(row, 0) + 1) - start).to(tl.int32)
    hist_end = L
    if HAS_NT:
        hist_end = L - tl.load(NT + tl.maximum(row, 0)).to(tl.int32)
    n_here = tl.minimum(group, tl.cdiv(L, S) - first)
    qk_scale, bias_scale = score_scales(scale, ACT)
    if NORM_ROW:
        inv_n = 1.0 / tl.maximum(L, 1).to(tl.float32)
    else:
        inv_n = 1.0 / norm_const
    return row, h, start, L, hist_end, first, n_here, qk_scale, bias_scale, inv_n


@triton.jit
def block_attn_fwd_kernel(
    Q, K, V, QD, KD, VD, OUT, LSE, OFF, NT, WORK, POSW, TIMEW, QTS, KTS,
    scale, norm_const, group,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, S: tl.constexpr, TILE: tl.constexpr,
    ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_NT: tl.constexpr, HAS_POS: tl.constexpr,
    NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr, NUM_TIME: tl.constexpr, NORM_ROW: tl.constexpr,
    PREC: tl.constexpr, USE_TMA: tl.constexpr, STAGES: tl.constexpr,
):
    row, h, start, L, hist_end, first, n_here, qk_scale, bias_scale, inv_n = _program_item(
        WORK, OFF, NT, group, scale, norm_const, S, H, HAS_NT, ACT, NORM_ROW)
    if row < 0:
        return
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    col = h * HEAD_DIM
    for i in tl.range(0, n_here, num_stages=STAGES):
        b0 = (first + i) * S
        pos, ok, rows = _block_rows(start, b0, L, h, offs_d, S, TILE, H, HEAD_DIM)
        q = stream_tile(QD, Q + rows, start + b0, col, ok, d_ok, True, EVEN_D, USE_TMA)
        k = stream_tile(KD, K + rows, start + b0, col, ok, d_ok, True, EVEN_D, USE_TMA)
        v = stream_tile(VD, V + rows, start + b0, col, ok, d_ok, True, EVEN_D, USE_TMA)
        ts_q = load_times(QTS, start, pos, ok, True, HAS_TIME)
        ts_k = load_times(KTS, start, pos, ok, True, HAS_TIME)
        s, vis = _block_scores(q, k, pos, ok, ts_q, ts_k, L, hist_end, h, POSW, TIMEW, qk_scale, bias_scale, S, H,
                               CAUSAL, HAS_NT, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, PREC)
        if ACT == 0:
            s = tl.where(vis, s, float("-inf"))
            m = tl.max(s, 1)
            m = tl.where(m == float("-inf"), 0.0, m)  # a query that sees nothing keeps a finite reference
            p = tl.exp2(s - m[:, None])
            den = tl.sum(p, 1)
            has = den > 0.0
            out = tl.dot(p.to(v.dtype), v, input_precision=PREC) / tl.where(has, den, 1.0)[:, None]
            # +inf for a query that sees nothing makes the backward's exp2(s - lse) zero there.
            lse = tl.where(has, m + tl.log2(tl.where(has, den, 1.0)), float("inf"))
            tl.store(LSE + (start + pos) * H + h, lse, mask=ok)
        else:
            p = tl.where(vis, act_fwd(s, ACT, fast_act(v)), 0.0)
            out = tl.dot(p.to(v.dtype), v, input_precision=PREC) * inv_n
        tl.store(OUT + rows, out.to(OUT.dtype.element_ty), mask=ok[:, None] & d_ok[None, :])


@triton.jit
def _diagonal_grads(DPOSW, acc, h, H: tl.constexpr, NUM_POS: tl.constexpr, TILE: tl.constexpr):
    """Add ``acc`` (score gradients of the item's blocks, summed over blocks: in every block query ``i``
    and key ``j`` sit ``i - j`` apart) into the position table: one sum per diagonal, then one atomic
    add per relative position instead of one per score."""
    i = tl.arange(0, TILE)
    c = tl.arange(0, 2 * TILE)
    rel = c - (TILE - 1)  # i - j
    j = i[:, None] - rel[None, :]
    inside = (j >= 0) & (j < TILE)
    diag = tl.sum(tl.where(inside, tl.gather(acc, tl.where(inside, j, 0), axis=1), 0.0), 0)
    bkt = pos_bucket(rel, 0, NUM_POS)
    tl.atomic_add(DPOSW + bkt * H + h, diag, mask=rel < TILE)


@triton.jit
def block_attn_bwd_kernel(
    Q, K, V, OUT, DO, QD, KD, VD, OD, DOD, LSE, DQ, DK, DV, OFF, NT, WORK, POSW, TIMEW, DPOSW, DTIMEW, QTS, KTS,
    scale, norm_const, group,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, S: tl.constexpr, TILE: tl.constexpr,
    ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_NT: tl.constexpr, HAS_POS: tl.constexpr,
    NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr, NUM_TIME: tl.constexpr, NORM_ROW: tl.constexpr,
    PREC: tl.constexpr, USE_TMA: tl.constexpr, STAGES: tl.constexpr,
):
    """dq, dk, dv of each block from one load of its q, k, v, o, dO and log-sum-exp (``delta = dO . o``
    is computed here); bias-table gradients summed per program before the atomic adds."""
    row, h, start, L, hist_end, first, n_here, qk_scale, bias_scale, inv_n = _program_item(
        WORK, OFF, NT, group, scale, norm_const, S, H, HAS_NT, ACT, NORM_ROW)
    if row < 0:
        return
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    col = h * HEAD_DIM
    pos_acc = tl.zeros([TILE, TILE], dtype=tl.float32)
    for i in tl.range(0, n_here, num_stages=STAGES):
        b0 = (first + i) * S
        pos, ok, rows = _block_rows(start, b0, L, h, offs_d, S, TILE, H, HEAD_DIM)
        q = stream_tile(QD, Q + rows, start + b0, col, ok, d_ok, True, EVEN_D, USE_TMA)
        k = stream_tile(KD, K + rows, start + b0, col, ok, d_ok, True, EVEN_D, USE_TMA)
        v = stream_tile(VD, V + rows, start + b0, col, ok, d_ok, True, EVEN_D, USE_TMA)
        do = stream_tile(DOD, DO + rows, start + b0, col, ok, d_ok, True, EVEN_D, USE_TMA)
        ts_q = load_times(QTS, start, pos, ok, True, HAS_TIME)
        ts_k = load_times(KTS, start, pos, ok, True, HAS_TIME)
        s, vis = _block_scores(q, k, pos, ok, ts_q, ts_k, L, hist_end, h, POSW, TIMEW, qk_scale, bias_scale, S, H,
                               CAUSAL, HAS_NT, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, PREC)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        lse = tl.zeros([TILE], dtype=tl.float32)  # read by softmax only
        delta = lse
        if ACT == 0:
            o = stream_tile(OD, OUT + rows, start + b0, col, ok, d_ok, True, EVEN_D, USE_TMA)
            delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
            lse = tl.load(LSE + (start + pos) * H + h, mask=ok, other=float("inf"))
        p, ds = score_grads(s, dp, lse, delta, vis, inv_n, ACT, True, fast_act(do))
        mask = ok[:, None] & d_ok[None, :]
        dv = tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
        tl.store(DV + rows, dv.to(DV.dtype.element_ty), mask=mask)
        dk = tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC) * scale
        tl.store(DK + rows, dk.to(DK.dtype.element_ty), mask=mask)
        dq = tl.dot(ds.to(k.dtype), k, input_precision=PREC) * scale
        tl.store(DQ + rows, dq.to(DQ.dtype.element_ty), mask=mask)
        if HAS_POS:
            pos_acc += ds
        if HAS_TIME:
            add_table_grad(DTIMEW, bucket_tile(ts_q, ts_k, NUM_TIME, False), ds, vis, h, H, NUM_TIME)
    if HAS_POS:
        _diagonal_grads(DPOSW, pos_acc, h, H, NUM_POS, TILE)
