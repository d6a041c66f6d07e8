"""Triton forward of jagged attention: online softmax (log-sum-exp saved) or pointwise activation.

One program per (work item, head); a work item is one BLOCK_M tile of queries of one row, listed
longest rows first (see ``attention_op.work_list``). Tensors are contiguous ``[tokens, H, D]``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.attention_triton_bias import (
    TABLE_PADS,
    add_bias_span,
    min_max,
    tile_spans,
)
from kernels.attention_triton_common import (
    act_fwd,
    config_prune,
    descriptor_hook,
    fast_act,
    kernel_configs,
    kv_range,
    load_rows,
    load_times,
    row_extent,
    score_scales,
    softmax_step,
    stream_rows,
    unmasked_kv_end,
    visible,
)

# (BLOCK_N, warps, stages) by head dim (query tiles: ``attention_op._plan``); measured on an H200 with
# benchmarks/attention_configs.py (benchmarks/RESULTS.md, "Descriptors and measured configurations").
# Two entries even where they agree: with more than one configuration the autotuner prunes (shared memory),
# so fp32 at D=256 still gets a configuration that fits.
DEFAULTS = {64: (64, 4, 3), 256: (64, 4, 3)}
CANDIDATES = [(64, 4, 3), (128, 8, 3), (32, 4, 3), (64, 8, 4)]


def _configs() -> list[triton.Config]:
    return kernel_configs("BLOCK_N", DEFAULTS, CANDIDATES, descriptor_hook("BLOCK_N", "KD", "VD"))


@triton.jit
def _fwd_tile(
    acc, m_i, l_i, q, pos_q, m_ok, ts_q, q_first, q_last, tq_min, tq_max, start_n, hi, hist_end, window, K, V, KD,
    VD, KTS, POSW, TIMEW, kv_start, h, offs_d, d_ok, qk_scale, bias_scale,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_NT: tl.constexpr,
    BLOCK_S: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr,
    HAS_TIME: tl.constexpr, NUM_TIME: tl.constexpr, POS_PAD: tl.constexpr, TIME_PAD: tl.constexpr,
    PREC: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr, USE_TMA: tl.constexpr,
):
    """One KV tile of the forward. ``MASKED=False``: every query sees every key of the tile, which lies
    inside the row (no visibility mask, no key bounds; rows past the row's end hold q = 0 and stay
    finite, and they are never stored)."""
    offs_n, n_ok, k, v, ts_k = stream_rows(K, V, KD, VD, KTS, kv_start, start_n, hi, h, offs_d, d_ok, H, HEAD_DIM,
                                           BLOCK_N, MASKED, EVEN_D, USE_TMA, HAS_TIME)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    tk_min = 0
    tk_max = 0
    if HAS_TIME:
        tk_min, tk_max = min_max(ts_k, n_ok)
    p_lo, p_hi, t_lo, t_hi, u, w, t_narrow = tile_spans(
        q_first, q_last, start_n, tl.minimum(start_n + BLOCK_N, hi) - 1, ts_q, tq_min, tq_max, ts_k, tk_min, tk_max,
        HAS_POS, NUM_POS, HAS_TIME, NUM_TIME)
    s = add_bias_span(s, pos_q, offs_n, p_lo, p_hi, ts_q, ts_k, u, w, t_lo, t_hi, t_narrow, h, POSW, TIMEW,
                      bias_scale, H, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD)
    ok = tl.full([BLOCK_N], 1, tl.int1)[None, :]  # whole tiles: every score counts
    if MASKED:
        ok = visible(pos_q[:, None], offs_n[None, :], hi, hist_end, window, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW)
        ok = ok & m_ok[:, None]
    if ACT == 0:
        p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, ok, MASKED)
        acc = acc * alpha[:, None]
    else:
        p = act_fwd(s, ACT, fast_act(v))
        if MASKED:
            p = tl.where(ok, p, 0.0)
    acc += tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return acc, m_i, l_i


@triton.autotune(configs=_configs(), key=["LEN_KEY", "HEAD_DIM", "ACT", "CAUSAL", "BLOCK_S", "HAS_POS", "HAS_TIME", "USE_TMA"],
                 prune_configs_by={"early_config_prune": config_prune("BLOCK_N", "BLOCK_M")})
@triton.heuristics(TABLE_PADS)
@triton.jit
def jagged_attn_fwd_kernel(
    Q, K, V, KD, VD, OUT, LSE, QO, KO, NT, WORK, POSW, TIMEW, QTS, KTS,
    scale, norm_const, window, LEN_KEY,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_NT: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr,
    NUM_TIME: tl.constexpr, NORM_ROW: tl.constexpr, PREC: tl.constexpr, USE_TMA: tl.constexpr,
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

    offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM
    shift = kv_len - q_len
    pos_q = shift + offs_m
    stride_t: tl.constexpr = H * HEAD_DIM
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM

    q_ptrs = Q + (q_start + offs_m)[:, None] * stride_t + h * HEAD_DIM + offs_d[None, :]
    q = load_rows(q_ptrs, m_ok, d_ok, True, EVEN_D)
    ts_q = load_times(QTS, q_start, offs_m, m_ok, True, HAS_TIME)
    tq_min = 0
    tq_max = 0
    if HAS_TIME:
        tq_min, tq_max = min_max(ts_q, m_ok)

    last = tl.minimum(mblk * BLOCK_M + BLOCK_M, q_len) - 1
    lo, hi = kv_range(shift + mblk * BLOCK_M, shift + last, kv_len, window, CAUSAL, BLOCK_S, HAS_WINDOW)

    qk_scale, bias_scale = score_scales(scale, ACT)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Whole tiles every query of this tile sees (below the causal diagonal) skip the mask and the
    # key bounds; the diagonal tiles and the row's last partial tile take the masked path.
    mid = unmasked_kv_end(lo, shift + mblk * BLOCK_M, kv_len, hist_end, BLOCK_N, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW)
    for start_n in range(lo, mid, BLOCK_N):
        acc, m_i, l_i = _fwd_tile(
            acc, m_i, l_i, q, pos_q, m_ok, ts_q, shift + mblk * BLOCK_M, shift + last, tq_min, tq_max, start_n, hi,
            hist_end, window, K, V, KD, VD, KTS, POSW, TIMEW, kv_start, h, offs_d, d_ok, qk_scale, bias_scale, H,
            HEAD_DIM, ACT, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW,
            HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_N, False, EVEN_D, USE_TMA)
    for start_n in range(mid, hi, BLOCK_N):
        acc, m_i, l_i = _fwd_tile(
            acc, m_i, l_i, q, pos_q, m_ok, ts_q, shift + mblk * BLOCK_M, shift + last, tq_min, tq_max, start_n, hi,
            hist_end, window, K, V, KD, VD, KTS, POSW, TIMEW, kv_start, h, offs_d, d_ok, qk_scale, bias_scale, H,
            HEAD_DIM, ACT, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW,
            HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, PREC, BLOCK_N, True, EVEN_D, USE_TMA)

    if ACT == 0:
        has = l_i > 0.0
        out = acc / tl.where(has, l_i, 1.0)[:, None]
        # +inf for a query that sees nothing makes the backward's exp2(s - lse) zero there.
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("inf"))
        tl.store(LSE + (q_start + offs_m) * H + h, lse, mask=m_ok)
    else:
        if NORM_ROW:
            out = acc / tl.maximum(kv_len, 1).to(tl.float32)
        else:
            out = acc / norm_const
    o_ptrs = OUT + (q_start + offs_m)[:, None] * stride_t + h * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
