"""Triton kernels of sliding-window self-attention (``window=W``): each query sees at most the W previous
keys and itself (``[p - W, p + W]`` when not causal).

One program per (work item, head); a work item is one tile of a row (``attention_op.work_list``). A
query tile ``[m0, m0 + BLOCK_M)`` sees keys in ``[m0 - W, m0 + BLOCK_M)`` only, so every loop is at most
``(BLOCK_M + W) / BLOCK_N + 1`` tiles long, in three parts: the masked tiles at the window's far edge, the
whole tiles every query of the tile sees (no visibility mask, no bounds: ``MASKED=False``), and the masked
tiles at the causal diagonal (or the near edge); ``ONE_LOOP`` runs every tile masked in one pipelined loop
instead (a configuration choice, measured). The tile steps are those of the generic kernels
(``_fwd_tile``, ``_dq_tile``, ``_dkdv_tile``); only the loop bounds are the window's.

Backward: ``window_attn_bwd_dq_kernel`` first (per query tile: ``delta = rowsum(dO . o)`` computed and
stored, then dq over the tile's keys), then ``window_attn_bwd_dkdv_kernel`` (per key tile: dk, dv in
registers over the query tiles that see it; the bias-table gradients summed per program). No atomics on
q/k/v gradients. Self-attention only (one offsets array: query ``i`` and key ``j`` of a row sit at
positions ``i`` and ``j``). Tensors are contiguous ``[tokens, H, D]``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.attention_triton_bias import flush_table_grad, min_max
from kernels.attention_triton_bwd import _dkdv_tile, _dq_tile
from kernels.attention_triton_common import load_rows, load_times, score_scales
from kernels.attention_triton_fwd import _fwd_tile


@triton.jit
def _item(WORK, OFF, NT, TILE: tl.constexpr, H: tl.constexpr, HAS_NT: tl.constexpr):
    """(row, head, the row's first token, its length, end of its history, first position of the tile);
    row < 0 for an unused work item."""
    pid = tl.program_id(0)
    item = pid // H
    h = pid % H
    row = tl.load(WORK + 2 * item)
    first = tl.load(WORK + 2 * item + 1) * TILE
    start = tl.load(OFF + tl.maximum(row, 0)).to(tl.int64)
    L = (tl.load(OFF + tl.maximum(row, 0) + 1) - start).to(tl.int32)
    hist_end = L
    if HAS_NT:
        hist_end = L - tl.load(NT + tl.maximum(row, 0)).to(tl.int32)
    return row, h, start, L, hist_end, first


@triton.jit
def _key_parts(m0, last, L, hist_end, window, CAUSAL: tl.constexpr, HAS_NT: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """Key tiles of queries at positions ``m0 .. last``: (lo, a, b, hi) with masked tiles ``lo .. a``,
    whole tiles every query sees ``a .. b`` and masked tiles ``b .. hi`` (steps of BLOCK_N from lo)."""
    lo = tl.maximum(m0 - window, 0)
    hi = last + 1
    full_hi = m0 + 1  # a key every query sees: at or before the first query (causal) ...
    if not CAUSAL:
        hi = tl.minimum(L, last + window + 1)
        full_hi = tl.minimum(L, m0 + window + 1)  # ... or within the window of the first query
    if HAS_NT:
        full_hi = tl.minimum(full_hi, hist_end)  # target keys are seen by their own query alone
    full_lo = tl.maximum(last - window, 0)  # and within the window of the last query
    a = lo + tl.cdiv(tl.maximum(full_lo - lo, 0), BLOCK_N) * BLOCK_N
    a = tl.minimum(a, hi)
    b = a + (tl.maximum(full_hi - a, 0) // BLOCK_N) * BLOCK_N
    return lo, a, b, hi


@triton.jit
def _query_parts(n0, k_last, L, hist_end, window, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_M: tl.constexpr):
    """Query tiles that see keys at positions ``n0 .. k_last``: (lo, a, b, hi) as in ``_key_parts``. Whole
    query tiles (inside the row) see every key only when the key tile is whole and inside the history."""
    lo = n0
    if not CAUSAL:
        lo = tl.maximum(n0 - window, 0)
    hi = tl.minimum(k_last + window + 1, L)
    full_lo = k_last  # a query that sees the last key ...
    if not CAUSAL:
        full_lo = tl.maximum(k_last - window, 0)
    full_hi = tl.minimum(n0 + window + 1, L)  # ... and the first one
    if n0 + BLOCK_N > hist_end:  # partial key tile, or target keys: masked tiles only
        full_hi = full_lo
    a = lo + tl.cdiv(tl.maximum(full_lo - lo, 0), BLOCK_M) * BLOCK_M
    a = tl.minimum(a, hi)
    b = a + (tl.maximum(full_hi - a, 0) // BLOCK_M) * BLOCK_M
    return lo, a, b, hi


@triton.jit
def tile_rows(start, L, p0, h, H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK: tl.constexpr):
    """Positions ``p0 .. p0 + BLOCK`` of a row (first token ``start``, length L) for head h: (offs, offs_d,
    ok, d_ok, rows), ``rows`` the element offsets into a contiguous ``[tokens, H, D]`` tensor."""
    offs = p0 + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    ok = offs < L
    d_ok = offs_d < HEAD_DIM
    rows = (start + offs)[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :]
    return offs, offs_d, ok, d_ok, rows


@triton.jit
def query_tile(Q, QTS, start, L, m0, h, H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_M: tl.constexpr, HAS_TIME: tl.constexpr):
    """The queries ``m0 .. m0 + BLOCK_M`` of a row for head h, as the forward and dq kernels hold them:
    (offs_m, offs_d, m_ok, d_ok, rows, q, ts_q, tq_min, tq_max)."""
    offs_m, offs_d, m_ok, d_ok, rows = tile_rows(start, L, m0, h, H, HEAD_DIM, BLOCK_D, BLOCK_M)
    q = load_rows(Q + rows, m_ok, d_ok, True, BLOCK_D == HEAD_DIM)
    ts_q = load_times(QTS, start, offs_m, m_ok, True, HAS_TIME)
    tq_min = 0
    tq_max = 0
    if HAS_TIME:
        tq_min, tq_max = min_max(ts_q, m_ok)
    return offs_m, offs_d, m_ok, d_ok, rows, q, ts_q, tq_min, tq_max


@triton.jit
def key_tile(K, V, KTS, start, L, n0, h, H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
             BLOCK_N: tl.constexpr, HAS_TIME: tl.constexpr):
    """The keys ``n0 .. n0 + BLOCK_N`` of a row (first token ``start``, length L) for head h, as the dk/dv
    kernels hold them: (offs_n, offs_d, n_ok, d_ok, rows, k, v, ts_k, k_last, tk_min, tk_max)."""
    offs_n, offs_d, n_ok, d_ok, rows = tile_rows(start, L, n0, h, H, HEAD_DIM, BLOCK_D, BLOCK_N)
    k = load_rows(K + rows, n_ok, d_ok, True, BLOCK_D == HEAD_DIM)
    v = load_rows(V + rows, n_ok, d_ok, True, BLOCK_D == HEAD_DIM)
    ts_k = load_times(KTS, start, offs_n, n_ok, True, HAS_TIME)
    k_last = tl.minimum(n0 + BLOCK_N, L) - 1
    tk_min = 0
    tk_max = 0
    if HAS_TIME:
        tk_min, tk_max = min_max(ts_k, n_ok)
    return offs_n, offs_d, n_ok, d_ok, rows, k, v, ts_k, k_last, tk_min, tk_max


@triton.jit
def inverse_norm(L, norm_const, NORM_ROW: tl.constexpr):
    """1 / the pointwise activations' normaliser: the row's length, or the fixed constant."""
    if NORM_ROW:
        inv_n = 1.0 / tl.maximum(L, 1).to(tl.float32)
    else:
        inv_n = 1.0 / norm_const
    return inv_n


@triton.jit
def store_key_grads(DK, DV, DPOSW, DTIMEW, rows, n_ok, d_ok, dk, dv, dpos, dtime, scale, h, H: tl.constexpr,
                    HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, POS_PAD: tl.constexpr, HAS_TIME: tl.constexpr,
                    NUM_TIME: tl.constexpr, TIME_PAD: tl.constexpr):
    """The end of a dk/dv program: its bias-table gradient sums added once, dk (times the score scale) and dv
    stored."""
    if HAS_POS:
        flush_table_grad(DPOSW, dpos, h, H, NUM_POS, POS_PAD)
    if HAS_TIME:
        flush_table_grad(DTIMEW, dtime, h, H, NUM_TIME, TIME_PAD)
    mask = n_ok[:, None] & d_ok[None, :]
    tl.store(DK + rows, (dk * scale).to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + rows, dv.to(DV.dtype.element_ty), mask=mask)


@triton.jit
def window_attn_fwd_kernel(
    Q, K, V, KD, VD, OUT, LSE, OFF, NT, WORK, POSW, TIMEW, QTS, KTS,
    scale, norm_const, window,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, ACT: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_NT: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr,
    NUM_TIME: tl.constexpr, NORM_ROW: tl.constexpr, PREC: tl.constexpr, USE_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr, POS_PAD: tl.constexpr,
    TIME_PAD: tl.constexpr, ONE_LOOP: tl.constexpr,
):
    row, h, start, L, hist_end, m0 = _item(WORK, OFF, NT, BLOCK_M, H, HAS_NT)
    if row < 0:
        return
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    offs_m, offs_d, m_ok, d_ok, rows, q, ts_q, tq_min, tq_max = query_tile(
        Q, QTS, start, L, m0, h, H, HEAD_DIM, BLOCK_D, BLOCK_M, HAS_TIME)
    last = tl.minimum(m0 + BLOCK_M, L) - 1
    lo, a, b, hi = _key_parts(m0, last, L, hist_end, window, CAUSAL, HAS_NT, BLOCK_N)
    qk_scale, bias_scale = score_scales(scale, ACT)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if ONE_LOOP:  # every tile masked, one pipelined loop
        a = hi
        b = hi
        for start_n in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):
            acc, m_i, l_i = _fwd_tile(
                acc, m_i, l_i, q, offs_m, m_ok, ts_q, m0, last, tq_min, tq_max, start_n, hi, hist_end, window, K, V, KD,
                VD, KTS, POSW, TIMEW, start, h, offs_d, d_ok, qk_scale, bias_scale, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, 0,
                True, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_N, True, EVEN_D, USE_TMA)
        lo = hi
    for start_n in range(lo, a, BLOCK_N):  # the window's far edge
        acc, m_i, l_i = _fwd_tile(
            acc, m_i, l_i, q, offs_m, m_ok, ts_q, m0, last, tq_min, tq_max, start_n, hi, hist_end, window, K, V, KD, VD,
            KTS, POSW, TIMEW, start, h, offs_d, d_ok, qk_scale, bias_scale, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, 0, True,
            HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_N, True, EVEN_D, USE_TMA)
    for start_n in tl.range(a, b, BLOCK_N, num_stages=STAGES):  # whole tiles every query sees
        acc, m_i, l_i = _fwd_tile(
            acc, m_i, l_i, q, offs_m, m_ok, ts_q, m0, last, tq_min, tq_max, start_n, hi, hist_end, window, K, V, KD, VD,
            KTS, POSW, TIMEW, start, h, offs_d, d_ok, qk_scale, bias_scale, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, 0, True,
            HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_N, False, EVEN_D, USE_TMA)
    for start_n in range(b, hi, BLOCK_N):  # the diagonal (or the near edge)
        acc, m_i, l_i = _fwd_tile(
            acc, m_i, l_i, q, offs_m, m_ok, ts_q, m0, last, tq_min, tq_max, start_n, hi, hist_end, window, K, V, KD, VD,
            KTS, POSW, TIMEW, start, h, offs_d, d_ok, qk_scale, bias_scale, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, 0, True,
            HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_N, True, EVEN_D, USE_TMA)
    if ACT == 0:
        has = l_i > 0.0
        out = acc / tl.where(has, l_i, 1.0)[:, None]
        # +inf for a query that sees nothing makes the backward's exp2(s - lse) zero there.
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("inf"))
        tl.store(LSE + (start + offs_m) * H + h, lse, mask=m_ok)
    else:
        if NORM_ROW:
            out = acc / tl.maximum(L, 1).to(tl.float32)
        else:
            out = acc / norm_const
    tl.store(OUT + rows, out.to(OUT.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


@triton.jit
def window_attn_bwd_dq_kernel(
    Q, K, V, OUT, DO, KD, VD, LSE, DELTA, DQ, OFF, NT, WORK, POSW, TIMEW, QTS, KTS,
    scale, norm_const, window,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, ACT: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_NT: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr,
    NUM_TIME: tl.constexpr, NORM_ROW: tl.constexpr, PREC: tl.constexpr, USE_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr, POS_PAD: tl.constexpr,
    TIME_PAD: tl.constexpr, ONE_LOOP: tl.constexpr,
):
    """dq of one query tile; softmax also stores ``delta = rowsum(dO . o)`` for the dk/dv kernel."""
    row, h, start, L, hist_end, m0 = _item(WORK, OFF, NT, BLOCK_M, H, HAS_NT)
    if row < 0:
        return
    offs_m, offs_d, m_ok, d_ok, rows = tile_rows(start, L, m0, h, H, HEAD_DIM, BLOCK_D, BLOCK_M)
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    q = load_rows(Q + rows, m_ok, d_ok, True, EVEN_D)
    do = load_rows(DO + rows, m_ok, d_ok, True, EVEN_D)
    ts_q = load_times(QTS, start, offs_m, m_ok, True, HAS_TIME)
    tq_min = 0
    tq_max = 0
    if HAS_TIME:
        tq_min, tq_max = min_max(ts_q, m_ok)
    lse = tl.zeros([BLOCK_M], dtype=tl.float32)  # read by softmax only
    delta = lse
    if ACT == 0:
        o = load_rows(OUT + rows, m_ok, d_ok, True, EVEN_D)
        delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
        tl.store(DELTA + (start + offs_m) * H + h, delta, mask=m_ok)
        lse = tl.load(LSE + (start + offs_m) * H + h, mask=m_ok, other=float("inf"))
    qk_scale, bias_scale = score_scales(scale, ACT)
    inv_n = inverse_norm(L, norm_const, NORM_ROW)
    last = tl.minimum(m0 + BLOCK_M, L) - 1
    lo, a, b, hi = _key_parts(m0, last, L, hist_end, window, CAUSAL, HAS_NT, BLOCK_N)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if ONE_LOOP:  # every tile masked, one pipelined loop
        a = hi
        b = hi
        for start_n in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):
            dq = _dq_tile(
                dq, q, do, do, 1.0, 1.0, lse, delta, offs_m, m_ok, ts_q, m0, last, tq_min, tq_max, start_n, hi,
                hist_end, window,
                start, 0, h, K, V, KD, VD, None, KTS, POSW, TIMEW, offs_d, d_ok, qk_scale, bias_scale,
                inv_n, H, HEAD_DIM, ACT,
                CAUSAL, HAS_NT, 0, True, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_N, True,
                EVEN_D, USE_TMA, False, 0)
        lo = hi
    for start_n in range(lo, a, BLOCK_N):
        dq = _dq_tile(
            dq, q, do, do, 1.0, 1.0, lse, delta, offs_m, m_ok, ts_q, m0, last, tq_min, tq_max, start_n, hi, hist_end,
            window, start, 0,
            h, K, V, KD, VD, None, KTS, POSW, TIMEW, offs_d, d_ok, qk_scale, bias_scale, inv_n, H,
            HEAD_DIM, ACT, CAUSAL,
            HAS_NT, 0, True, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_N, True, EVEN_D,
            USE_TMA, False, 0)
    for start_n in tl.range(a, b, BLOCK_N, num_stages=STAGES):
        dq = _dq_tile(
            dq, q, do, do, 1.0, 1.0, lse, delta, offs_m, m_ok, ts_q, m0, last, tq_min, tq_max, start_n, hi, hist_end,
            window, start, 0,
            h, K, V, KD, VD, None, KTS, POSW, TIMEW, offs_d, d_ok, qk_scale, bias_scale, inv_n, H,
            HEAD_DIM, ACT, CAUSAL,
            HAS_NT, 0, True, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_N, False, EVEN_D,
            USE_TMA, False, 0)
    for start_n in range(b, hi, BLOCK_N):
        dq = _dq_tile(
            dq, q, do, do, 1.0, 1.0, lse, delta, offs_m, m_ok, ts_q, m0, last, tq_min, tq_max, start_n, hi, hist_end,
            window, start, 0,
            h, K, V, KD, VD, None, KTS, POSW, TIMEW, offs_d, d_ok, qk_scale, bias_scale, inv_n, H,
            HEAD_DIM, ACT, CAUSAL,
            HAS_NT, 0, True, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_N, True, EVEN_D,
            USE_TMA, False, 0)
    tl.store(DQ + rows, (dq * scale).to(DQ.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


@triton.jit
def window_attn_bwd_dkdv_kernel(
    Q, K, V, DO, QD, DOD, LSE, DELTA, DK, DV, OFF, NT, WORK, POSW, TIMEW, DPOSW, DTIMEW, QTS, KTS,
    scale, norm_const, window,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, ACT: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_NT: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr,
    NUM_TIME: tl.constexpr, NORM_ROW: tl.constexpr, PREC: tl.constexpr, USE_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr, POS_PAD: tl.constexpr,
    TIME_PAD: tl.constexpr, ONE_LOOP: tl.constexpr,
):
    """dk, dv of one key tile over the query tiles that see it; bias-table gradients summed per program
    (``table_grad_span`` in its near-diagonal form: every tile of a window is near) and added once."""
    row, h, start, L, hist_end, n0 = _item(WORK, OFF, NT, BLOCK_N, H, HAS_NT)
    if row < 0:
        return
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    offs_n, offs_d, n_ok, d_ok, rows, k, v, ts_k, k_last, tk_min, tk_max = key_tile(
        K, V, KTS, start, L, n0, h, H, HEAD_DIM, BLOCK_D, BLOCK_N, HAS_TIME)
    qk_scale, bias_scale = score_scales(scale, ACT)
    inv_n = inverse_norm(L, norm_const, NORM_ROW)
    lo, a, b, hi = _query_parts(n0, k_last, L, hist_end, window, CAUSAL, BLOCK_N, BLOCK_M)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dpos = tl.zeros([POS_PAD], dtype=tl.float32)
    dtime = tl.zeros([TIME_PAD], dtype=tl.float32)
    if ONE_LOOP:  # every tile masked, one pipelined loop
        a = hi
        b = hi
        for start_m in tl.range(lo, hi, BLOCK_M, num_stages=STAGES):
            dk, dv, dpos, dtime = _dkdv_tile(
                dk, dv, dpos, dtime, k, v, offs_n, ts_k, n0, k_last, tk_min, tk_max, start_m, hi, 0, L, hist_end,
                window, start, h, Q, DO, QD, DOD, None, 0, 1.0, 1.0, LSE, DELTA, QTS, POSW, TIMEW,
                DPOSW, DTIMEW, offs_d, d_ok, qk_scale,
                bias_scale, inv_n, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, 0, True, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME,
                POS_PAD, TIME_PAD, PREC, BLOCK_M, BLOCK_N, True, EVEN_D, USE_TMA, True,
                False, 0)
        lo = hi
    for start_m in range(lo, a, BLOCK_M):  # the diagonal (or the near edge)
        dk, dv, dpos, dtime = _dkdv_tile(
            dk, dv, dpos, dtime, k, v, offs_n, ts_k, n0, k_last, tk_min, tk_max, start_m, hi, 0, L, hist_end, window,
            start, h, Q, DO, QD, DOD, None, 0, 1.0, 1.0, LSE, DELTA, QTS, POSW, TIMEW, DPOSW,
            DTIMEW, offs_d, d_ok, qk_scale, bias_scale,
            inv_n, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, 0, True, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD,
            PREC, BLOCK_M, BLOCK_N, True, EVEN_D, USE_TMA, True,
                False, 0)
    for start_m in tl.range(a, b, BLOCK_M, num_stages=STAGES):  # whole tiles whose queries see every key
        dk, dv, dpos, dtime = _dkdv_tile(
            dk, dv, dpos, dtime, k, v, offs_n, ts_k, n0, k_last, tk_min, tk_max, start_m, b, 0, L, hist_end, window,
            start, h, Q, DO, QD, DOD, None, 0, 1.0, 1.0, LSE, DELTA, QTS, POSW, TIMEW, DPOSW,
            DTIMEW, offs_d, d_ok, qk_scale, bias_scale,
            inv_n, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, 0, True, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD,
            PREC, BLOCK_M, BLOCK_N, False, EVEN_D, USE_TMA, True,
                False, 0)
    for start_m in range(b, hi, BLOCK_M):  # the window's far edge
        dk, dv, dpos, dtime = _dkdv_tile(
            dk, dv, dpos, dtime, k, v, offs_n, ts_k, n0, k_last, tk_min, tk_max, start_m, hi, 0, L, hist_end, window,
            start, h, Q, DO, QD, DOD, None, 0, 1.0, 1.0, LSE, DELTA, QTS, POSW, TIMEW, DPOSW,
            DTIMEW, offs_d, d_ok, qk_scale, bias_scale,
            inv_n, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, 0, True, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD,
            PREC, BLOCK_M, BLOCK_N, True, EVEN_D, USE_TMA, True,
                False, 0)
    store_key_grads(DK, DV, DPOSW, DTIMEW, rows, n_ok, d_ok, dk, dv, dpos, dtime, scale, h, H, HAS_POS, NUM_POS,
                    POS_PAD, HAS_TIME, NUM_TIME, TIME_PAD)
