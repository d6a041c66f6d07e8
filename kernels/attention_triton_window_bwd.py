"""Fused backward of sliding-window self-attention: dk, dv and the score gradients in one pass, dq from them.

The two-kernel backward (``attention_triton_window``) computes the scores and ``dO . V^T`` of every (query
tile, key tile) pair twice, once for dq and once for dk/dv: 7 tile matmuls per pair. Here:

* ``window_attn_bwd_dkdv_ds_kernel``: one program per (key tile, head), looping over the query tiles that
  see it (every tile masked, one pipelined loop): S, dP, dV += P^T dO, dK += dS^T Q as in the dk/dv
  kernel, and it stores the pair's dS (in the inputs' dtype: what the dq matmul reads anyway) into a
  scratch of whole tiles ``DS[h, slot, query tile's work item, query, key]`` (``[..., key, query]`` without bias
  tables, where the tile is computed transposed), ``slot = query tile - key tile
  (+ NB when not causal)``, ``NB`` the key tiles a window reaches on one side (the query tile's work item
  follows from the key tile's: a row's tiles are consecutive items, its last tile first, ``work_list``).
  Whole tiles (the rows past a jagged row's end are the tile's own) go through bulk tensor copies (``DS_TMA``). Softmax needs ``delta = rowsum(dO . o)`` of each query tile:
  computed in the loop from the o tile (``DELTA_INLINE``) or read from ``softmax_delta_kernel``'s output,
  which then also copies the log-sum-exp so both lie by (head, query tile) (``STATS_BY_TILE``), read as two
  aligned runs (through one descriptor with ``STATS_TMA``). On [keys, queries] tiles each thread holds 16
  columns' statistics; with ``FOLD_STATS`` they enter the products as initial sums (``S^T - lse`` and
  ``dP^T - delta`` come out of the matmuls), so no extra register copies stay live (on an H200 these three
  cut the kernel's register spills from 88 to 28 bytes and the backward op by 1.10-1.11x).
* ``window_attn_bwd_dq_ds_kernel``: one program per (query tile, head): dq = sum over its key tiles of
  dS K (one matmul per pair).

So 5 tile matmuls per pair, no atomics on q/k/v gradients, no ordering between programs, any mask the
window kernels serve (causal or not, targets). The price is the dS scratch, ``H * slots * work items *
tile * tile`` elements (about ``H * slots * tokens * tile``), ``slots = NB + 1`` (causal) or ``2 NB + 1``: the op takes this path only for short windows.
Every (query tile, slot) the dq kernel reads is written whole by the program of that key tile (zeros where
the pair sees nothing), so the scratch needs no zero fill. Outer and inner tiles are one size (``TILE``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.attention_triton_bias import min_max, tile_table_grads
from kernels.attention_triton_bwd import _scores
from kernels.attention_triton_common import (
    fast_act,
    load_rows,
    load_vec,
    score_grads,
    score_scales,
    stream_rows,
    stream_tile,
    visible,
)
from kernels.attention_triton_window import _item, inverse_norm, key_tile, store_key_grads, tile_rows


@triton.jit
def softmax_delta_kernel(OUT, DO, DELTA, OFF, WORK, LSE, H: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BY_TILE: tl.constexpr = False):
    """``delta = rowsum(dO . o)`` (softmax's backward) of one query tile and head of a work list over the query
    offsets ``OFF`` (``attention_op.softmax_delta``; the fused window backward runs it first). ``BY_TILE``:
    ``DELTA`` is ``[2, H, work items * BLOCK_M]`` (one program per item and head), the log-sum-exp ``LSE``
    (``[tokens, H]``) copied to its first half, both by (head, work item, query of the tile): the dk/dv
    programs read a query tile's statistics as two aligned runs (+inf and 0 at queries past its row)."""
    row, h, start, L, _, m0 = _item(WORK, OFF, OFF, BLOCK_M, H, False)
    if row < 0:
        return
    offs_m, offs_d, m_ok, d_ok, rows = tile_rows(start, L, m0, h, H, HEAD_DIM, BLOCK_D, BLOCK_M)
    o = load_rows(OUT + rows, m_ok, d_ok, True, BLOCK_D == HEAD_DIM)
    do = load_rows(DO + rows, m_ok, d_ok, True, BLOCK_D == HEAD_DIM)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    if BY_TILE:
        stride = tl.num_programs(0) // H * BLOCK_M
        at = h * stride + tl.program_id(0) // H * BLOCK_M + tl.arange(0, BLOCK_M)
        tl.store(DELTA + at, tl.load(LSE + (start + offs_m) * H + h, mask=m_ok, other=float("inf")))
        tl.store(DELTA + H * stride + at, tl.where(m_ok, delta, 0.0))
    else:
        tl.store(DELTA + (start + offs_m) * H + h, delta, mask=m_ok)


@triton.jit
def _ds_row0(h, slot, item, n_items, SLOTS: tl.constexpr, TILE: tl.constexpr):
    """First scratch row (int64) of the dS tile of (head, slot, query tile ``item`` of the work list)."""
    return ((h * SLOTS + slot).to(tl.int64) * n_items + item) * TILE


@triton.jit
def _ds_tile_ptrs(DS, row0, TILE: tl.constexpr):
    r = tl.arange(0, TILE)
    return DS + (row0 + r)[:, None] * TILE + r[None, :]


@triton.jit
def _store_ds(DS, DSD, row0, ds, TILE: tl.constexpr, DS_TMA: tl.constexpr):
    """Store one whole dS tile at scratch row ``row0`` (a bulk tensor copy with ``DS_TMA``)."""
    if DS_TMA:
        DSD.store([row0.to(tl.int32), 0], ds)
    else:
        tl.store(_ds_tile_ptrs(DS, row0, TILE), ds)


@triton.jit
def _dkdv_ds_tile(
    dk, dv, dpos, dtime, k, v, offs_n, ts_k, k_first, k_last, tk_min, tk_max, start_m, L, hist_end, window, start,
    h, q_item, ds_row0, Q, DO, OUT, QD, DOD, OD, LSE, DELTA, STD, DS, DSD, QTS, POSW, TIMEW, DPOSW, DTIMEW,
    offs_d, d_ok, qk_scale, bias_scale, inv_n, n_items,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_NT: tl.constexpr,
    HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr, NUM_TIME: tl.constexpr,
    POS_PAD: tl.constexpr, TIME_PAD: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, USE_TMA: tl.constexpr, DELTA_INLINE: tl.constexpr,
    DS_TMA: tl.constexpr, KEY_ROWS: tl.constexpr, STATS_BY_TILE: tl.constexpr, FOLD_STATS: tl.constexpr,
    STATS_TMA: tl.constexpr,
):
    """One query tile of the fused loop (``_dkdv_tile``, masked, plus the store of the pair's whole dS tile
    at scratch row ``ds_row0``, zeros where a query sees no key of the tile). Without bias tables the tile is
    computed transposed, [keys, queries] (P^T and dS^T feed dV and dK from registers, see ``_dkdv_tile``),
    and stored so (``KEY_ROWS`` scratch)."""
    offs_m, m_ok, q, do, ts_q = stream_rows(Q, DO, QD, DOD, QTS, start, start_m, L, h, offs_d, d_ok, H,
                                            HEAD_DIM, BLOCK_M, True, EVEN_D, USE_TMA, HAS_TIME)
    lse = offs_m  # read by softmax only
    delta = offs_m
    if ACT == 0:
        if STATS_TMA:  # no per-value addresses in registers
            lse = STD.load([h, q_item * BLOCK_M]).reshape([BLOCK_M])
            delta = STD.load([H + h, q_item * BLOCK_M]).reshape([BLOCK_M])
        else:
            stat = (start + offs_m) * H + h
            if STATS_BY_TILE:
                stat = (h * n_items + q_item) * BLOCK_M + tl.arange(0, BLOCK_M)  # [2, H, work items * tile]
            lse = load_vec(LSE + stat, m_ok, float("inf"), True)
            if DELTA_INLINE:
                rows = (start + offs_m)[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :]
                o = stream_tile(OD, OUT + rows, start + start_m, h * HEAD_DIM, m_ok, d_ok, True, EVEN_D, USE_TMA)
                delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
            else:
                delta = load_vec(DELTA + stat, m_ok, 0.0, True)
    if KEY_ROWS:  # on an H200 the fused backward ran 1.04-1.05x faster so (W=256, L=4096, softmax)
        ok_t = visible(offs_m[None, :], offs_n[:, None], L, hist_end, window, CAUSAL, HAS_NT, 0, True) & m_ok[None, :]
        if ACT == 0 and FOLD_STATS:
            # The statistics run along the columns: 16 of each per thread of a 64-column tile. Entering as the
            # products' initial sums, they are spread into registers the products take anyway.
            zeros = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            st = tl.dot(k, tl.trans(q), zeros - (lse * (1.0 / qk_scale))[None, :], input_precision=PREC) * qk_scale
            dpt = tl.dot(v, tl.trans(do), zeros - delta[None, :], input_precision=PREC)
            pt = tl.where(ok_t, tl.exp2(st), 0.0)  # exp2(s - lse); dS = P (dP - delta)
            dst = tl.where(ok_t, pt * dpt, 0.0)
        else:
            st = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale
            dpt = tl.dot(v, tl.trans(do), input_precision=PREC)
            pt, dst = score_grads(st, dpt, lse, delta, ok_t, inv_n, ACT, True, fast_act(do), True)
        dst_lo = dst.to(q.dtype)
        _store_ds(DS, DSD, ds_row0, dst_lo, BLOCK_N, DS_TMA)
        dv += tl.dot(pt.to(do.dtype), do, input_precision=PREC)
        dk += tl.dot(dst_lo, q, input_precision=PREC)
        return dk, dv, dpos, dtime
    tq_min = 0
    tq_max = 0
    if HAS_TIME:
        tq_min, tq_max = min_max(ts_q, m_ok)
    q_last = tl.minimum(start_m + BLOCK_M, L) - 1
    s, p_lo, p_hi, t_lo, t_hi, u, w, t_narrow = _scores(
        q, k, offs_m, offs_n, ts_q, ts_k, start_m, q_last, k_first, k_last, tq_min, tq_max, tk_min, tk_max, h,
        POSW, TIMEW, qk_scale, bias_scale, H, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC)
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)
    ok = visible(offs_m[:, None], offs_n[None, :], L, hist_end, window, CAUSAL, HAS_NT, 0, True) & m_ok[:, None]
    p, ds = score_grads(s, dp, lse, delta, ok, inv_n, ACT, True, fast_act(do))
    ds_lo = ds.to(q.dtype)
    _store_ds(DS, DSD, ds_row0, ds_lo, BLOCK_N, DS_TMA)
    dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
    dk += tl.dot(tl.trans(ds_lo), q, input_precision=PREC)
    dpos, dtime = tile_table_grads(dpos, dtime, DPOSW, DTIMEW, ds, ok, offs_m, offs_n, ts_q, ts_k, p_lo, p_hi, t_lo,
                                   t_hi, u, w, t_narrow, start_m - k_first, h, H, HAS_POS, NUM_POS, POS_PAD, HAS_TIME,
                                   NUM_TIME, TIME_PAD, True, BLOCK_M, BLOCK_N)
    return dk, dv, dpos, dtime


@triton.jit
def window_attn_bwd_dkdv_ds_kernel(
    Q, K, V, OUT, DO, QD, DOD, OD, LSE, DELTA, STD, DS, DSD, DK, DV, OFF, NT, WORK, POSW, TIMEW, DPOSW, DTIMEW, QTS,
    KTS, scale, norm_const, window, n_items,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, ACT: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_NT: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr,
    NUM_TIME: tl.constexpr, NORM_ROW: tl.constexpr, PREC: tl.constexpr, USE_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr, POS_PAD: tl.constexpr,
    TIME_PAD: tl.constexpr, DELTA_INLINE: tl.constexpr, SLOTS: tl.constexpr, SLOT0: tl.constexpr,
    DS_TMA: tl.constexpr, KEY_ROWS: tl.constexpr, STATS_BY_TILE: tl.constexpr = False,
    FOLD_STATS: tl.constexpr = False,
    STATS_TMA: tl.constexpr = False,
):
    """dk, dv of one key tile and the dS of every pair it takes part in (see the module docstring).
    ``KEY_ROWS`` (set by ``attention_window_op`` without bias tables): [keys, queries] tiles, stored so."""
    tl.static_assert(not (KEY_ROWS and (HAS_POS or HAS_TIME)), "[keys, queries] tiles take no bias tables")
    row, h, start, L, hist_end, n0 = _item(WORK, OFF, NT, BLOCK_N, H, HAS_NT)
    if row < 0:
        return
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    offs_n, offs_d, n_ok, d_ok, rows, k, v, ts_k, k_last, tk_min, tk_max = key_tile(
        K, V, KTS, start, L, n0, h, H, HEAD_DIM, BLOCK_D, BLOCK_N, HAS_TIME)
    qk_scale, bias_scale = score_scales(scale, ACT)
    inv_n = inverse_norm(L, norm_const, NORM_ROW)
    # Query tiles (aligned with the dq kernel's) holding a query that sees a key of this tile.
    lo = n0
    if not CAUSAL:
        lo = (tl.maximum(n0 - window, 0) // BLOCK_M) * BLOCK_M
    hi = tl.minimum(k_last + window + 1, L)
    j = n0 // BLOCK_N
    item_j = tl.program_id(0) // H  # a row's tiles are consecutive work items, its last tile first
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dpos = tl.zeros([POS_PAD], dtype=tl.float32)
    dtime = tl.zeros([TIME_PAD], dtype=tl.float32)
    for start_m in tl.range(lo, hi, BLOCK_M, num_stages=STAGES):
        item_i = item_j + j - start_m // BLOCK_M  # the query tile's work item
        dk, dv, dpos, dtime = _dkdv_ds_tile(
            dk, dv, dpos, dtime, k, v, offs_n, ts_k, n0, k_last, tk_min, tk_max, start_m, L, hist_end, window, start,
            h, item_i, _ds_row0(h, start_m // BLOCK_M - j + SLOT0, item_i, n_items, SLOTS, BLOCK_N),
            Q, DO, OUT, QD, DOD, OD, LSE, DELTA, STD, DS, DSD, QTS, POSW, TIMEW, DPOSW, DTIMEW, offs_d, d_ok,
            qk_scale, bias_scale, inv_n, n_items, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, HAS_POS, NUM_POS, HAS_TIME,
            NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_M, BLOCK_N, EVEN_D, USE_TMA, DELTA_INLINE, DS_TMA, KEY_ROWS,
            STATS_BY_TILE, FOLD_STATS, STATS_TMA)
    store_key_grads(DK, DV, DPOSW, DTIMEW, rows, n_ok, d_ok, dk, dv, dpos, dtime, scale, h, H, HAS_POS, NUM_POS,
                    POS_PAD, HAS_TIME, NUM_TIME, TIME_PAD)


@triton.jit
def window_attn_bwd_dq_ds_kernel(
    K, KD, DS, DSD, DQ, OFF, WORK, scale, window, n_items,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr,
    USE_TMA: tl.constexpr, BLOCK_M: tl.constexpr, STAGES: tl.constexpr, SLOTS: tl.constexpr,
    SLOT0: tl.constexpr, DS_TMA: tl.constexpr, KEY_ROWS: tl.constexpr,
):
    """dq of one query tile: the sum over the key tiles it sees of dS (from the scratch) times K.
    ``KEY_ROWS``: the scratch holds the tiles transposed, [keys, queries] (the fused kernel without tables)."""
    row, h, start, L, _, m0 = _item(WORK, OFF, OFF, BLOCK_M, H, False)
    if row < 0:
        return
    offs_m, offs_d, m_ok, d_ok, _ = tile_rows(start, L, m0, h, H, HEAD_DIM, BLOCK_D, BLOCK_M)
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    last = tl.minimum(m0 + BLOCK_M, L) - 1
    lo = (tl.maximum(m0 - window, 0) // BLOCK_M) * BLOCK_M  # the key tiles the fused kernel paired with
    hi = last + 1
    if not CAUSAL:
        hi = tl.minimum(L, last + window + 1)
    i = m0 // BLOCK_M
    item = tl.program_id(0) // H
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in tl.range(lo, hi, BLOCK_M, num_stages=STAGES):
        row0 = _ds_row0(h, i - start_n // BLOCK_M + SLOT0, item, n_items, SLOTS, BLOCK_M)
        if DS_TMA:
            ds = DSD.load([row0.to(tl.int32), 0])
        else:
            ds = tl.load(_ds_tile_ptrs(DS, row0, BLOCK_M))
        if KEY_ROWS:
            ds = tl.trans(ds)
        offs_n = start_n + tl.arange(0, BLOCK_M)
        k_rows = (start + offs_n)[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :]
        # dS is zero at keys past the row (TMA tiles read the next row's there, finite)
        k = stream_tile(KD, K + k_rows, start + start_n, h * HEAD_DIM, offs_n < L, d_ok, True, EVEN_D, USE_TMA)
        dq += tl.dot(ds, k, input_precision=PREC)
    # the store's offsets are recomputed here rather than kept live through the loop (fewer registers there)
    tl.store(DQ + (start + offs_m)[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
