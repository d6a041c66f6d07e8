"""Triton backward of jagged attention.

Two kernels, no atomics on q/k/v gradients (so gradients are deterministic):

* ``dkdv``: one program per (KV tile, head), looping over the queries that can see the tile; it also
  sums the score gradients per bias-table bucket in registers over the whole loop (``table_grad_span``:
  one reduction per tile and bucket threshold, by diagonal near the diagonal) and adds them to the
  tables once at its end (fp32 atomics, one per bucket).
* ``dq``: one program per (Q tile, head), looping over the keys the tile sees (like the forward); it runs
  first and stores softmax's ``delta`` for the dk/dv kernel.

Softmax: ``ds = p * (dp - delta)`` with ``delta_i = do_i . o_i``, computed and stored by the dq kernel from
the o tile next to its dO tile (so the dq kernel runs first); pointwise: ``ds = dp * act'(s) / n``.

``FP8``: the two score products, S = QK^T and dP = dO V^T, run on e4m3 tensor cores from row-major codes of q, k,
v and dO (``CODES``: one power-of-two scale per (row block of ``QUANT_BLOCK`` tokens, head), from each row's first
block; dO shares Q's blocks, V K's). Their operands are contiguous along the head dim, the reduction of both,
as Hopper's FP8 instructions read them, so no transposed copy is needed. dV, dK and dQ stay bf16 products of P / dS with the unquantized dO, Q and K.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.attention_triton_bias import (
    TABLE_PADS,
    add_bias_span,
    flush_table_grad,
    min_max,
    near_tiles,
    tile_spans,
    tile_table_grads,
)
from kernels.attention_triton_common import (
    config_prune,
    descriptor_hook,
    fast_act,
    kernel_configs,
    kv_range,
    load_times,
    load_vec,
    q_range,
    row_extent,
    score_grads,
    score_scales,
    stream_rows,
    stream_tile,
    unmasked_kv_end,
    unmasked_q_start,
    visible,
)

_KEY = ["LEN_KEY", "HEAD_DIM", "ACT", "CAUSAL", "BLOCK_S", "HAS_POS", "HAS_TIME", "USE_TMA", "FP8",
        "QUANT_BLOCK"]


# (inner tile, warps, stages) by head dim (outer tiles: ``attention_op._plan``); measured on an H200 with
# benchmarks/attention_configs.py (benchmarks/RESULTS.md, "Descriptors and measured configurations").
DKDV_DEFAULTS = {128: (64, 4, 2), 256: (32, 4, 2)}
DQ_DEFAULTS = {128: (64, 4, 2), 256: (32, 4, 2)}
CANDIDATES = [(32, 4, 2), (64, 8, 2), (32, 8, 2), (64, 4, 2), (64, 4, 3)]


# The FP8 operands travel as one tuple argument, ``CODES`` (``attention_op.ScoreCodes``'s tensors), None on the bf16
# path: one argument to bind per launch instead of ten. The codes stream through pointers: Triton's CUDA launcher
# counts tensor descriptors at the signature's top level only, so one inside the tuple fails at the first launch
# (``benchmarks/kernel_resources.py``'s launcher column checks it).
C_Q, C_K, C_V, C_DO, C_SQ, C_SK, C_SV, C_SDO, C_QBO, C_KBO = (
    tl.constexpr(i) for i in range(10))  # a code's scales sit C_SQ entries after it


def _configs(name: str) -> list[triton.Config]:
    if name == "dkdv":
        return kernel_configs("BLOCK_M", DKDV_DEFAULTS, CANDIDATES, descriptor_hook("BLOCK_M", "QD", "DOD"))
    return kernel_configs("BLOCK_N", DQ_DEFAULTS, CANDIDATES, descriptor_hook("BLOCK_N", "KD", "VD"))


@triton.jit
def _scores(q, k, pos_q, pos_k, ts_q, ts_k, q_first, q_last, k_first, k_last, tq_min, tq_max, tk_min, tk_max, h,
            POSW, TIMEW, qk_scale, bias_scale, H: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr,
            HAS_TIME: tl.constexpr, NUM_TIME: tl.constexpr, POS_PAD: tl.constexpr, TIME_PAD: tl.constexpr,
            PREC: tl.constexpr):
    """Scaled scores plus bias of a tile, and what the table gradients reuse (``tile_spans``)."""
    if q.dtype == tl.float8e4nv:  # FP8 codes (``qk_scale``: the tile's scales)
        s = tl.dot(q, tl.trans(k)) * qk_scale
    else:
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    p_lo, p_hi, t_lo, t_hi, u, w, t_narrow = tile_spans(
        q_first, q_last, k_first, k_last, ts_q, tq_min, tq_max, ts_k, tk_min, tk_max, HAS_POS, NUM_POS, HAS_TIME,
        NUM_TIME)
    s = add_bias_span(s, pos_q, pos_k, p_lo, p_hi, ts_q, ts_k, u, w, t_lo, t_hi, t_narrow, h, POSW, TIMEW,
                      bias_scale, H, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD)
    return s, p_lo, p_hi, t_lo, t_hi, u, w, t_narrow


@triton.jit
def _softmax_stats(LSE, DELTA, q_start, offs_m, m_ok, h, H: tl.constexpr, ACT: tl.constexpr, MASKED: tl.constexpr):
    """(log-sum-exp, delta) of the queries ``offs_m`` for softmax's backward (placeholders for pointwise ones)."""
    lse = offs_m
    delta = offs_m
    if ACT == 0:
        lse = load_vec(LSE + (q_start + offs_m) * H + h, m_ok, float("inf"), MASKED)
        delta = load_vec(DELTA + (q_start + offs_m) * H + h, m_ok, 0.0, MASKED)
    return lse, delta


@triton.jit
def block_scales(SA, SB, b0, offs, ok, h, H: tl.constexpr, QUANT_BLOCK: tl.constexpr, MASKED: tl.constexpr):
    """Per-token scales of two FP8 operands of one layout (Q and dO, or K and V) at the tokens ``offs`` of a
    row whose first scale block is ``b0`` (0 outside ``ok``)."""
    idx = (b0 + offs // QUANT_BLOCK) * H + h
    return load_vec(SA + idx, ok, 0.0, MASKED), load_vec(SB + idx, ok, 0.0, MASKED)


@triton.jit
def code_tiles(CODES, A: tl.constexpr, B: tl.constexpr, row, ptrs, first, ok, d_ok, h, H: tl.constexpr,
               QUANT_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    """A program's resident tile of two FP8 operands of one layout (``CODES`` entries ``A`` and ``B``: K and V,
    or Q and dO) at ``ptrs``, the ``BLOCK`` tokens from ``first`` (a multiple of ``BLOCK``) of jagged row ``row``,
    and the two scales of the tile: ``BLOCK`` divides ``QUANT_BLOCK``, so the tile lies in one scale block."""
    tl.static_assert(QUANT_BLOCK % BLOCK == 0)
    a = tl.load(CODES[A] + ptrs, mask=ok[:, None] & d_ok[None, :], other=0.0)
    b = tl.load(CODES[B] + ptrs, mask=ok[:, None] & d_ok[None, :], other=0.0)
    first_block = tl.load(CODES[C_KBO if A == C_K else C_QBO] + row).to(tl.int64)
    idx = (first_block + first // QUANT_BLOCK) * H + h
    return a, b, tl.load(CODES[A + C_SQ] + idx), tl.load(CODES[B + C_SQ] + idx)


@triton.jit
def _dkdv_tile(
    dk, dv, dpos, dtime, k, v, offs_n, ts_k, k_first, k_last, tk_min, tk_max, start_m, m_end, shift, kv_len,
    hist_end, window, q_start, h,
    Q, DO, QD, DOD, CODES, qb0, sk, sv, LSE, DELTA, QTS, POSW, TIMEW, DPOSW, DTIMEW, offs_d, d_ok, qk_scale,
    bias_scale, inv_n,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_NT: tl.constexpr,
    BLOCK_S: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr,
    HAS_TIME: tl.constexpr, NUM_TIME: tl.constexpr, POS_PAD: tl.constexpr, TIME_PAD: tl.constexpr,
    PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr,
    USE_TMA: tl.constexpr, WIDE: tl.constexpr, FP8: tl.constexpr, QUANT_BLOCK: tl.constexpr,
):
    """One Q tile of the dk/dv loop; ``dpos`` / ``dtime``: the program's per-bucket table gradients;
    ``WIDE``: a loop over few tiles near the diagonal (see ``table_grad_span``); keys at positions
    ``k_first .. k_last`` with timestamps in ``tk_min .. tk_max``. ``MASKED=False``: a whole Q tile
    (inside the row) whose every query sees every key of the KV tile (no visibility mask, no bounds).
    ``FP8``: ``k`` and ``v`` are the KV tile's codes, ``sk`` (times ``qk_scale``) and ``sv`` its two scales (the
    tile lies in one scale block); the Q tile's scales are per query (its start need not be a multiple of it)."""
    offs_m, m_ok, q, do, ts_q = stream_rows(Q, DO, QD, DOD, QTS, q_start, start_m, m_end, h, offs_d, d_ok, H,
                                            HEAD_DIM, BLOCK_M, MASKED, EVEN_D, USE_TMA, HAS_TIME)
    q8 = q  # the score products' operands: the codes under FP8
    do8 = do
    sq = qk_scale
    sdo = 1.0
    if FP8:
        _, _, q8, do8, _ = stream_rows(CODES[C_Q], CODES[C_DO], None, None, QTS, q_start, start_m, m_end, h,
                                       offs_d, d_ok, H, HEAD_DIM, BLOCK_M, MASKED, EVEN_D, False, False)
        sq, sdo = block_scales(CODES[C_SQ], CODES[C_SDO], qb0, offs_m, m_ok, h, H, QUANT_BLOCK, MASKED)
    pos_q = shift + offs_m
    if not (HAS_POS or HAS_TIME):
        # Without bias tables the tile is computed transposed, [keys, queries] (S^T = K Q^T): P^T and dS^T are
        # then the left operands of dV += P^T dO and dK += dS^T Q straight from registers, where a [queries,
        # keys] tile goes through shared memory before each of the two products (fewer spills too). Measured on
        # an H200 (backward op, benchmarks/RESULTS.md): batch A causal silu 1.08-1.09x, softmax unchanged.
        # The bias tables' helpers work on [queries, keys] tiles. Loading lse and delta before the two products
        # spills more (offline, sm_90: 188 against 52 bytes, causal softmax).
        if FP8:
            st = tl.dot(k, tl.trans(q8)) * (sq * sk)[None, :]  # sk, sv: the KV tile's (one block's) scales
            dpt = tl.dot(v, tl.trans(do8)) * (sdo * sv)[None, :]
        else:
            st = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale
            dpt = tl.dot(v, tl.trans(do), input_precision=PREC)
        ok_t = tl.full([BLOCK_N, BLOCK_M], 1, tl.int1)
        if MASKED:
            ok_t = visible(pos_q[None, :], offs_n[:, None], kv_len, hist_end, window, CAUSAL, HAS_NT, BLOCK_S,
                           HAS_WINDOW)
            ok_t = ok_t & m_ok[None, :]
        lse, delta = _softmax_stats(LSE, DELTA, q_start, offs_m, m_ok, h, H, ACT, MASKED)
        pt, dst = score_grads(st, dpt, lse, delta, ok_t, inv_n, ACT, MASKED, fast_act(do), True)
        dv += tl.dot(pt.to(do.dtype), do, input_precision=PREC)
        dk += tl.dot(dst.to(q.dtype), q, input_precision=PREC)
        return dk, dv, dpos, dtime
    tq_min = 0
    tq_max = 0
    if HAS_TIME:
        tq_min, tq_max = min_max(ts_q, m_ok)
    q_last = shift + tl.minimum(start_m + BLOCK_M, m_end) - 1
    score_scale = qk_scale
    if FP8:
        score_scale = (sq * sk)[:, None]
    s, p_lo, p_hi, t_lo, t_hi, u, w, t_narrow = _scores(
        q8, k, pos_q, offs_n, ts_q, ts_k, shift + start_m, q_last, k_first, k_last, tq_min, tq_max, tk_min, tk_max, h,
        POSW, TIMEW, score_scale, bias_scale, H, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC)
    if FP8:
        dp = tl.dot(do8, tl.trans(v)) * (sdo * sv)[:, None]
    else:
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
    ok = tl.full([BLOCK_M, BLOCK_N], 1, tl.int1)
    if MASKED:
        ok = visible(pos_q[:, None], offs_n[None, :], kv_len, hist_end, window, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW)
        ok = ok & m_ok[:, None]
    lse, delta = _softmax_stats(LSE, DELTA, q_start, offs_m, m_ok, h, H, ACT, MASKED)  # late: fewer live registers
    p, ds = score_grads(s, dp, lse, delta, ok, inv_n, ACT, MASKED, fast_act(do))
    dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
    dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
    dpos, dtime = tile_table_grads(dpos, dtime, DPOSW, DTIMEW, ds, ok, pos_q, offs_n, ts_q, ts_k, p_lo, p_hi, t_lo,
                                   t_hi, u, w, t_narrow, shift + start_m - k_first, h, H, HAS_POS, NUM_POS, POS_PAD,
                                   HAS_TIME, NUM_TIME, TIME_PAD, WIDE, BLOCK_M, BLOCK_N)
    return dk, dv, dpos, dtime


@triton.jit
def _dq_tile(
    dq, q, do, do8, sq, sdo, lse, delta, pos_q, m_ok, ts_q, q_first, q_last, tq_min, tq_max, start_n, hi, hist_end,
    window, kv_start, kb0, h, K, V, KD, VD, CODES, KTS, POSW, TIMEW, offs_d, d_ok, qk_scale,
    bias_scale, inv_n,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_NT: tl.constexpr,
    BLOCK_S: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr,
    HAS_TIME: tl.constexpr, NUM_TIME: tl.constexpr, POS_PAD: tl.constexpr, TIME_PAD: tl.constexpr,
    PREC: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr, USE_TMA: tl.constexpr,
    FP8: tl.constexpr, QUANT_BLOCK: tl.constexpr,
):
    """One KV tile of the dq loop (``MASKED=False`` as in the forward: a whole tile every query sees;
    rows past the row's end have do = 0 and lse = +inf, so they add nothing). ``FP8``: ``q`` and ``do8`` are
    the Q tile's codes, ``sq`` (times ``qk_scale``) and ``sdo`` its two scales (the tile lies in one scale
    block); K and V stream as codes with per-key scales for the score products, and K in bf16 for dQ."""
    if FP8:
        offs_n, n_ok, k8, v, ts_k = stream_rows(CODES[C_K], CODES[C_V], None, None, KTS, kv_start, start_n, hi, h,
                                                offs_d, d_ok, H, HEAD_DIM, BLOCK_N, MASKED, EVEN_D, False, HAS_TIME)
        rows = (kv_start + offs_n)[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :]
        k = stream_tile(KD, K + rows, kv_start + start_n, h * HEAD_DIM, n_ok, d_ok, MASKED, EVEN_D, USE_TMA)
        sk, sv = block_scales(CODES[C_SK], CODES[C_SV], kb0, offs_n, n_ok, h, H, QUANT_BLOCK, MASKED)
        score_scale = (sk * sq)[None, :]  # sq, sdo: the Q tile's (one block's) scales
    else:
        offs_n, n_ok, k, v, ts_k = stream_rows(K, V, KD, VD, KTS, kv_start, start_n, hi, h, offs_d, d_ok, H,
                                               HEAD_DIM, BLOCK_N, MASKED, EVEN_D, USE_TMA, HAS_TIME)
        k8 = k
        score_scale = qk_scale
    tk_min = 0
    tk_max = 0
    if HAS_TIME:
        tk_min, tk_max = min_max(ts_k, n_ok)
    k_last = tl.minimum(start_n + BLOCK_N, hi) - 1
    s, _, _, _, _, _, _, _ = _scores(q, k8, pos_q, offs_n, ts_q, ts_k, q_first, q_last, start_n, k_last, tq_min,
                                     tq_max, tk_min, tk_max, h, POSW, TIMEW, score_scale, bias_scale, H, HAS_POS,
                                     NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC)
    if FP8:
        dp = tl.dot(do8, tl.trans(v)) * (sv * sdo)[None, :]
    else:
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
    ok = tl.full([BLOCK_N], 1, tl.int1)[None, :]  # whole tiles: every score counts
    if MASKED:
        ok = visible(pos_q[:, None], offs_n[None, :], hi, hist_end, window, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW)
        ok = ok & m_ok[:, None]
    _, ds = score_grads(s, dp, lse, delta, ok, inv_n, ACT, MASKED, fast_act(do))
    dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    return dq


@triton.autotune(configs=_configs("dkdv"), key=_KEY, reset_to_zero=["DPOSW", "DTIMEW"],
                 prune_configs_by={"early_config_prune": config_prune("BLOCK_M", "BLOCK_N")})
@triton.heuristics(TABLE_PADS)
@triton.jit
def jagged_attn_bwd_dkdv_kernel(
    Q, K, V, DO, QD, DOD, CODES,
    LSE, DELTA, DK, DV, QO, KO, NT, WORK, POSW, TIMEW, DPOSW, DTIMEW, QTS, KTS,
    scale, norm_const, window, LEN_KEY,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_NT: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr,
    NUM_TIME: tl.constexpr, NORM_ROW: tl.constexpr, PREC: tl.constexpr, USE_TMA: tl.constexpr,
    FP8: tl.constexpr, QUANT_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, POS_PAD: tl.constexpr, TIME_PAD: tl.constexpr,
):
    pid = tl.program_id(0)
    item = pid // H
    h = pid % H
    row = tl.load(WORK + 2 * item)
    if row < 0:
        return
    nblk = tl.load(WORK + 2 * item + 1)
    q_start, q_len, kv_start, kv_len, hist_end = row_extent(QO, KO, NT, row, HAS_NT)
    shift = kv_len - q_len
    stride_t: tl.constexpr = H * HEAD_DIM
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM

    offs_n = nblk * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    n_ok = offs_n < kv_len
    d_ok = offs_d < HEAD_DIM
    kv_rows = (kv_start + offs_n)[:, None] * stride_t + h * HEAD_DIM + offs_d[None, :]
    qb0 = 0
    sk = 1.0
    sv = 1.0
    if FP8:  # the KV tile's codes and scales (the score products' operands)
        k, v, sk, sv = code_tiles(CODES, C_K, C_V, row, kv_rows, nblk * BLOCK_N, n_ok, d_ok, h, H, QUANT_BLOCK,
                                  BLOCK_N)
        qb0 = tl.load(CODES[C_QBO] + row).to(tl.int64)
    else:
        k = tl.load(K + kv_rows, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(V + kv_rows, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    ts_k = load_times(KTS, kv_start, offs_n, n_ok, True, HAS_TIME)
    k_first = nblk * BLOCK_N
    k_last = tl.minimum(k_first + BLOCK_N, kv_len) - 1
    tk_min = 0
    tk_max = 0
    if HAS_TIME:
        tk_min, tk_max = min_max(ts_k, n_ok)

    last = tl.minimum(nblk * BLOCK_N + BLOCK_N, kv_len) - 1
    lo, hi = q_range(nblk * BLOCK_N, last, q_len, kv_len, window, CAUSAL, BLOCK_S, HAS_WINDOW)
    lo = tl.maximum(lo, 0)
    hi = tl.minimum(hi, q_len)

    qk_scale, bias_scale = score_scales(scale, ACT)
    if NORM_ROW:
        inv_n = 1.0 / tl.maximum(kv_len, 1).to(tl.float32)
    else:
        inv_n = 1.0 / norm_const
    if FP8:
        sk = sk * qk_scale
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # Table gradients summed per bucket over the whole loop, added to the tables once at the end.
    dpos = tl.zeros([POS_PAD], dtype=tl.float32)
    dtime = tl.zeros([TIME_PAD], dtype=tl.float32)

    # Q tiles whose every query sees every key of this KV tile (past the causal diagonal) skip the
    # mask and the bounds; the diagonal tiles before them and the last partial tile take the masked path.
    # A partial KV tile never takes the unmasked path (its padding keys would reach the bias gradients).
    mid = unmasked_q_start(lo, hi, nblk * BLOCK_N + BLOCK_N - 1, shift, hist_end, BLOCK_M, CAUSAL, BLOCK_S,
                           HAS_WINDOW)
    full_end = mid + ((hi - mid) // BLOCK_M) * BLOCK_M
    for start_m in range(lo, mid, BLOCK_M):
        dk, dv, dpos, dtime = _dkdv_tile(
            dk, dv, dpos, dtime, k, v, offs_n, ts_k, k_first, k_last, tk_min, tk_max, start_m, mid, shift,
            kv_len, hist_end, window, q_start, h, Q, DO, QD, DOD, CODES, qb0, sk, sv, LSE, DELTA,
            QTS, POSW, TIMEW, DPOSW, DTIMEW, offs_d,
            d_ok, qk_scale, bias_scale, inv_n, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW, HAS_POS, NUM_POS,
            HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_M, BLOCK_N, True, EVEN_D, USE_TMA, True,
                FP8, QUANT_BLOCK)
    if HAS_POS or HAS_TIME:
        # The whole tiles near the keys (``near_tiles``: where position buckets vary within a tile and log
        # time buckets change fastest) run in their own short loop, which may sum a wide span by diagonal
        # or bucket by bucket; the long loops before and after it stay lean (no nested loop, few registers),
        # so the compiler pipelines them.
        near_lo, near_hi = near_tiles(mid, full_end, k_first, k_last, shift, BLOCK_M, HAS_POS, NUM_POS, HAS_TIME,
                                      BLOCK_N)
        for start_m in range(mid, near_lo, BLOCK_M):
            dk, dv, dpos, dtime = _dkdv_tile(
                dk, dv, dpos, dtime, k, v, offs_n, ts_k, k_first, k_last, tk_min, tk_max, start_m, full_end, shift,
                kv_len, hist_end, window, q_start, h, Q, DO, QD, DOD, CODES, qb0, sk, sv, LSE, DELTA,
            QTS, POSW, TIMEW, DPOSW, DTIMEW,
                offs_d, d_ok, qk_scale, bias_scale, inv_n, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW, HAS_POS,
                NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_M, BLOCK_N, False, EVEN_D, USE_TMA, False,
                FP8, QUANT_BLOCK)
        for start_m in range(near_lo, near_hi, BLOCK_M):
            dk, dv, dpos, dtime = _dkdv_tile(
                dk, dv, dpos, dtime, k, v, offs_n, ts_k, k_first, k_last, tk_min, tk_max, start_m, full_end, shift,
                kv_len, hist_end, window, q_start, h, Q, DO, QD, DOD, CODES, qb0, sk, sv, LSE, DELTA,
            QTS, POSW, TIMEW, DPOSW, DTIMEW,
                offs_d, d_ok, qk_scale, bias_scale, inv_n, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW, HAS_POS,
                NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_M, BLOCK_N, False, EVEN_D, USE_TMA, True,
                FP8, QUANT_BLOCK)
        for start_m in range(near_hi, full_end, BLOCK_M):
            dk, dv, dpos, dtime = _dkdv_tile(
                dk, dv, dpos, dtime, k, v, offs_n, ts_k, k_first, k_last, tk_min, tk_max, start_m, full_end, shift,
                kv_len, hist_end, window, q_start, h, Q, DO, QD, DOD, CODES, qb0, sk, sv, LSE, DELTA,
            QTS, POSW, TIMEW, DPOSW, DTIMEW,
                offs_d, d_ok, qk_scale, bias_scale, inv_n, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW, HAS_POS,
                NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_M, BLOCK_N, False, EVEN_D, USE_TMA, False,
                FP8, QUANT_BLOCK)
    else:
        for start_m in range(mid, full_end, BLOCK_M):
            dk, dv, dpos, dtime = _dkdv_tile(
                dk, dv, dpos, dtime, k, v, offs_n, ts_k, k_first, k_last, tk_min, tk_max, start_m, full_end, shift,
                kv_len, hist_end, window, q_start, h, Q, DO, QD, DOD, CODES, qb0, sk, sv, LSE, DELTA,
            QTS, POSW, TIMEW, DPOSW, DTIMEW,
                offs_d, d_ok, qk_scale, bias_scale, inv_n, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW, HAS_POS,
                NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_M, BLOCK_N, False, EVEN_D, USE_TMA, False,
                FP8, QUANT_BLOCK)
    for start_m in range(full_end, hi, BLOCK_M):
        dk, dv, dpos, dtime = _dkdv_tile(
            dk, dv, dpos, dtime, k, v, offs_n, ts_k, k_first, k_last, tk_min, tk_max, start_m, hi, shift,
            kv_len, hist_end, window, q_start, h, Q, DO, QD, DOD, CODES, qb0, sk, sv, LSE, DELTA,
            QTS, POSW, TIMEW, DPOSW, DTIMEW, offs_d,
            d_ok, qk_scale, bias_scale, inv_n, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW, HAS_POS, NUM_POS,
            HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_M, BLOCK_N, True, EVEN_D, USE_TMA, True,
                FP8, QUANT_BLOCK)

    if HAS_POS:
        flush_table_grad(DPOSW, dpos, h, H, NUM_POS, POS_PAD)
    if HAS_TIME:
        flush_table_grad(DTIMEW, dtime, h, H, NUM_TIME, TIME_PAD)
    tl.store(DK + kv_rows, (dk * scale).to(DK.dtype.element_ty), mask=n_ok[:, None] & d_ok[None, :])
    tl.store(DV + kv_rows, dv.to(DV.dtype.element_ty), mask=n_ok[:, None] & d_ok[None, :])


@triton.autotune(configs=_configs("dq"), key=_KEY,
                 prune_configs_by={"early_config_prune": config_prune("BLOCK_N", "BLOCK_M")})
@triton.heuristics(TABLE_PADS)
@triton.jit
def jagged_attn_bwd_dq_kernel(
    Q, K, V, DO, OUT, KD, VD, CODES,
    LSE, DELTA, DQ, QO, KO, NT, WORK, POSW, TIMEW, QTS, KTS,
    scale, norm_const, window, LEN_KEY,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_NT: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr,
    NUM_TIME: tl.constexpr, NORM_ROW: tl.constexpr, PREC: tl.constexpr, USE_TMA: tl.constexpr,
    FP8: tl.constexpr, QUANT_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, POS_PAD: tl.constexpr, TIME_PAD: tl.constexpr,
):
    pid = tl.program_id(0)
    item = pid // H
    h = pid % H
    row = tl.load(WORK + 2 * item)
    if row < 0:
        return
    mblk = tl.load(WORK + 2 * item + 1)
    q_start, q_len, kv_start, kv_len, hist_end = row_extent(QO, KO, NT, row, HAS_NT)
    shift = kv_len - q_len
    stride_t: tl.constexpr = H * HEAD_DIM
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM

    offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM
    pos_q = shift + offs_m
    q_rows = (q_start + offs_m)[:, None] * stride_t + h * HEAD_DIM + offs_d[None, :]
    kb0 = 0
    sq = 1.0
    sdo = 1.0
    if FP8:  # the Q tile's codes and scales (the score products' operands)
        q, do8, sq, sdo = code_tiles(CODES, C_Q, C_DO, row, q_rows, mblk * BLOCK_M, m_ok, d_ok, h, H, QUANT_BLOCK,
                                     BLOCK_M)
        kb0 = tl.load(CODES[C_KBO] + row).to(tl.int64)
    else:
        q = tl.load(Q + q_rows, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    do = tl.load(DO + q_rows, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    if not FP8:
        do8 = do
    ts_q = load_times(QTS, q_start, offs_m, m_ok, True, HAS_TIME)
    tq_min = 0
    tq_max = 0
    if HAS_TIME:
        tq_min, tq_max = min_max(ts_q, m_ok)
    lse = tl.zeros([BLOCK_M], dtype=tl.float32)  # read by softmax only
    delta = lse
    if ACT == 0:
        lse = tl.load(LSE + (q_start + offs_m) * H + h, mask=m_ok, other=float("inf"))
        # delta = rowsum(dO . o) of this tile, stored for the dk/dv kernel (launched after this one)
        o = tl.load(OUT + q_rows, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
        tl.store(DELTA + (q_start + offs_m) * H + h, delta, mask=m_ok)
    qk_scale, bias_scale = score_scales(scale, ACT)
    if NORM_ROW:
        inv_n = 1.0 / tl.maximum(kv_len, 1).to(tl.float32)
    else:
        inv_n = 1.0 / norm_const
    if FP8:
        sq = sq * qk_scale

    last = tl.minimum(mblk * BLOCK_M + BLOCK_M, q_len) - 1
    lo, hi = kv_range(shift + mblk * BLOCK_M, shift + last, kv_len, window, CAUSAL, BLOCK_S, HAS_WINDOW)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # As in the forward: whole KV tiles below the causal diagonal unmasked, the rest masked.
    mid = unmasked_kv_end(lo, shift + mblk * BLOCK_M, kv_len, hist_end, BLOCK_N, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW)
    for start_n in range(lo, mid, BLOCK_N):
        dq = _dq_tile(
            dq, q, do, do8, sq, sdo, lse, delta, pos_q, m_ok, ts_q, shift + mblk * BLOCK_M, shift + last, tq_min,
            tq_max, start_n,
            hi, hist_end, window, kv_start, kb0, h,
            K, V, KD, VD, CODES, KTS, POSW, TIMEW, offs_d, d_ok, qk_scale, bias_scale, inv_n,
            H, HEAD_DIM, ACT, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD,
            TIME_PAD, PREC, BLOCK_N, False, EVEN_D, USE_TMA, FP8, QUANT_BLOCK)
    for start_n in range(mid, hi, BLOCK_N):
        dq = _dq_tile(
            dq, q, do, do8, sq, sdo, lse, delta, pos_q, m_ok, ts_q, shift + mblk * BLOCK_M, shift + last, tq_min,
            tq_max, start_n,
            hi, hist_end, window, kv_start, kb0, h,
            K, V, KD, VD, CODES, KTS, POSW, TIMEW, offs_d, d_ok, qk_scale, bias_scale, inv_n,
            H, HEAD_DIM, ACT, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD,
            TIME_PAD, PREC, BLOCK_N, True, EVEN_D, USE_TMA, FP8, QUANT_BLOCK)
    tl.store(DQ + q_rows, (dq * scale).to(DQ.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
