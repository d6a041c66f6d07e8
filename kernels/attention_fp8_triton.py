"""Triton forward of FP8 jagged attention: QK^T and PV on e4m3 tensor cores with power-of-two block scales.

Same structure, masks and bias as ``kernels.attention_triton_fwd``; the differences:

* Q, K, V arrive as e4m3 with one fp32 power-of-two scale per (row block of ``QUANT_BLOCK`` tokens, head)
  (``kernels.attention_fp8.quantize_jagged``). Blocks start at each jagged row's first token. Q and K
  scales are applied per token to the fp32 score tile (they sit on the non-reduced dims of QK^T); the
  V scale is one scalar per KV tile, so the KV loop starts at a multiple of ``BLOCK_N`` inside the row
  and ``BLOCK_N`` divides ``QUANT_BLOCK`` (the extra keys before the visible range are masked).
  With ``V_TRANSPOSED`` V is read from a ``[H * D, tokens]`` copy, so the PV product's second operand
  is contiguous along its reduction dim (what Hopper's FP8 tensor-core instructions read from shared
  memory; Triton's FP8 attention tutorial stores V the same way).
* softmax: P = exp2(s - m) is in [0, 1]; it is stored as e4m3 of ``P * P_SCALE`` (a fixed power of two,
  FA3's FP8 recipe) and the output is divided by ``P_SCALE`` at the end. The row sum ``l`` adds the
  unquantized fp32 P. The accumulator is kept in units of the current tile's V scale (rescaled by the
  ratio of consecutive power-of-two scales together with the online-softmax rescale, which is exact),
  so each PV product accumulates in place on the tensor cores.
* silu/gelu: act(s) is unbounded, so each tile's P gets one power-of-two scale per query row
  (non-saturating, ``kernels.mx`` rule), which factors out of the PV product.

Accumulation is fp32. Under ``TRITON_INTERPRET=1`` the P conversion uses the exact integer RNE encoder
of ``kernels.mx_triton`` (the interpreter's float->fp8 cast is not round-to-nearest-even); on GPU it
is the hardware conversion (also RNE).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.attention_triton_bias import pos_bucket, time_bucket
from kernels.attention_triton_common import (
    AUTOTUNE,
    INTERPRET,
    act_fwd,
    kv_range,
    score_scales,
    smem_prune,
    softmax_step,
    visible,
)
from kernels.mx_triton import _encode_e4m3, _scale_from_amax

P_SCALE: tl.constexpr = tl.constexpr(256.0)  # softmax P in [0, 1] -> [0, 256]: keeps e4m3's 3 mantissa bits down to P = 2^-14
# Input scale exponents are clamped to [-63, 63], so the ratio of two scales is a normal fp32 number.
SCALE_EXP_LIMIT: tl.constexpr = tl.constexpr(63)


def _configs() -> list[triton.Config]:
    if INTERPRET:
        return [triton.Config({"BLOCK_N": 32}, num_warps=4, num_stages=1)]
    configs = [
        triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bn, w, s in ((128, 8, 3), (64, 4, 3), (64, 8, 3), (128, 4, 3), (128, 8, 2))
    ]
    # Without autotuning still two configs: Triton skips early_config_prune when given one, and the
    # 64-token scale blocks need BLOCK_N = 64 (_prune then keeps one, so nothing is benchmarked twice).
    return configs if AUTOTUNE else configs[:2]


_smem = smem_prune("BLOCK_N", "BLOCK_M")


def _prune(configs: list[triton.Config], nargs: dict, **kwargs) -> list[triton.Config]:
    """KV tiles must not straddle a V scale block (``BLOCK_N`` divides ``QUANT_BLOCK``)."""
    qb = kwargs["QUANT_BLOCK"]
    keep = [c for c in configs if qb % c.kwargs["BLOCK_N"] == 0]
    keep = _smem(keep or [triton.Config({"BLOCK_N": min(qb, 64)}, num_warps=4, num_stages=2)], nargs, **kwargs)
    return keep if AUTOTUNE else keep[:1]


@triton.jit
def input_scale(amax_bits):
    """Power-of-two scale 2^ceil(log2(amax / 448)) (``kernels.mx`` rule), exponent clamped to
    [-SCALE_EXP_LIMIT, SCALE_EXP_LIMIT]: (inverse-scale bits, scale bits, non-finite)."""
    e = amax_bits >> 23
    bad = e == 255
    t = e - 8 + ((amax_bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    t = tl.minimum(tl.maximum(t, 127 - SCALE_EXP_LIMIT), 127 + SCALE_EXP_LIMIT)
    return (254 - t) << 23, tl.where(bad, 0x7FC00000, t << 23), bad


@triton.jit
def _to_e4m3(y, EXACT: tl.constexpr):
    """fp32 tile (|y| <= 448) -> e4m3, round to nearest even."""
    if EXACT:
        return _encode_e4m3(y).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
    else:
        return y.to(tl.float8e4nv)


@triton.autotune(configs=_configs(),
                 key=["LEN_KEY", "HEAD_DIM", "ACT", "CAUSAL", "BLOCK_S", "HAS_POS", "HAS_TIME", "QUANT_BLOCK",
                      "V_TRANSPOSED"],
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def jagged_attn_fp8_fwd_kernel(
    Q, K, V, SQ, SK, SV, QBO, KBO, OUT, LSE, QO, KO, NT, WORK, POSW, TIMEW, QTS, KTS,
    scale, norm_const, window, LEN_KEY, stride_vt,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_NT: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr,
    NUM_TIME: tl.constexpr, NORM_ROW: tl.constexpr, QUANT_BLOCK: tl.constexpr, EXACT_CVT: tl.constexpr,
    V_TRANSPOSED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    item = pid // H
    h = pid % H
    row = tl.load(WORK + 2 * item)
    if row < 0:
        return
    mblk = tl.load(WORK + 2 * item + 1)
    q_start = tl.load(QO + row).to(tl.int64)
    q_len = (tl.load(QO + row + 1) - q_start).to(tl.int32)
    kv_start = tl.load(KO + row).to(tl.int64)
    kv_len = (tl.load(KO + row + 1) - kv_start).to(tl.int32)
    qb0 = tl.load(QBO + row).to(tl.int64)  # first scale block of this row
    kb0 = tl.load(KBO + row).to(tl.int64)
    hist_end = kv_len
    if HAS_NT:
        hist_end = kv_len - tl.load(NT + row).to(tl.int32)

    offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM
    shift = kv_len - q_len
    pos_q = shift + offs_m
    stride_t: tl.constexpr = H * HEAD_DIM

    q_ptrs = Q + (q_start + offs_m)[:, None] * stride_t + h * HEAD_DIM + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    sq = tl.load(SQ + (qb0 + offs_m // QUANT_BLOCK) * H + h, mask=m_ok, other=0.0)
    if HAS_TIME:
        ts_q = tl.load(QTS + q_start + offs_m, mask=m_ok, other=0)

    last = tl.minimum(mblk * BLOCK_M + BLOCK_M, q_len) - 1
    lo, hi = kv_range(shift + mblk * BLOCK_M, shift + last, kv_len, window, CAUSAL, BLOCK_S, HAS_WINDOW)
    lo = (lo // BLOCK_N) * BLOCK_N  # tiles aligned inside the row: one V scale per tile

    qk_scale, bias_scale = score_scales(scale, ACT)
    sq = sq * qk_scale
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # V scale of the accumulator's units (softmax path); 1.0 when the row has no key to visit
    sv_acc = tl.load(SV + (kb0 + lo // QUANT_BLOCK) * H + h, mask=lo < hi, other=1.0)

    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi
        kv_rows = (kv_start + offs_n)[:, None] * stride_t + h * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + kv_rows, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        if V_TRANSPOSED:  # [H*D, tokens]: the PV operand arrives K-major, as Hopper's FP8 MMA reads it
            vt_ptrs = V + (h * HEAD_DIM + offs_d).to(tl.int64)[:, None] * stride_vt + (kv_start + offs_n)[None, :]
            v = tl.trans(tl.load(vt_ptrs, mask=d_ok[:, None] & n_ok[None, :], other=0.0))
        else:
            v = tl.load(V + kv_rows, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        sk = tl.load(SK + (kb0 + offs_n // QUANT_BLOCK) * H + h, mask=n_ok, other=0.0)
        sv = tl.load(SV + (kb0 + start_n // QUANT_BLOCK) * H + h)
        s = tl.dot(q, tl.trans(k)) * sq[:, None] * sk[None, :]
        if HAS_POS:
            s += tl.load(POSW + pos_bucket(pos_q[:, None], offs_n[None, :], NUM_POS) * H + h) * bias_scale
        if HAS_TIME:
            ts_k = tl.load(KTS + kv_start + offs_n, mask=n_ok, other=0)
            s += tl.load(TIMEW + time_bucket(ts_q[:, None], ts_k[None, :], NUM_TIME) * H + h) * bias_scale
        ok = visible(pos_q[:, None], offs_n[None, :], hi, hist_end, window, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW)
        ok = ok & m_ok[:, None]
        if ACT == 0:
            p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, ok, True)
            acc = acc * (alpha * (sv_acc / sv))[:, None]  # powers of two: exact change of units
            sv_acc = sv
            p8 = _to_e4m3(p * P_SCALE, EXACT_CVT)
            acc = tl.dot(p8, v, acc)
        else:
            p = tl.where(ok, act_fwd(s, ACT), 0.0)
            amax = tl.max(p.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
            inv, sp, _ = _scale_from_amax(amax, False)
            y = p * inv.to(tl.float32, bitcast=True)[:, None]
            p8 = _to_e4m3(tl.minimum(tl.maximum(y, -448.0), 448.0), EXACT_CVT)
            acc += tl.dot(p8, v) * (sp.to(tl.float32, bitcast=True) * sv)[:, None]

    if ACT == 0:
        has = l_i > 0.0
        out = (acc * sv_acc) / (tl.where(has, l_i, 1.0) * P_SCALE)[:, None]
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("inf"))
        tl.store(LSE + (q_start + offs_m) * H + h, lse, mask=m_ok)
    else:
        if NORM_ROW:
            out = acc / tl.maximum(kv_len, 1).to(tl.float32)
        else:
            out = acc / norm_const
    o_ptrs = OUT + (q_start + offs_m)[:, None] * stride_t + h * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


@triton.jit
def jagged_quant_kernel(
    X, OUT, OUT_T, SCALE, OFF, BLKOFF, WORK, stride_t,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, QUANT_BLOCK: tl.constexpr,
    TRANSPOSED: tl.constexpr,
):
    """One (row block, head): power-of-two scale from the block's |x| max, e4m3 codes (exact RNE encoder,
    bit-identical to ``kernels.attention_fp8.quantize_jagged``); optionally the ``[H*D, tokens]`` copy."""
    pid = tl.program_id(0)
    item = pid // H
    h = pid % H
    row = tl.load(WORK + 2 * item)
    if row < 0:
        return
    c = tl.load(WORK + 2 * item + 1)
    start = tl.load(OFF + row).to(tl.int64)
    end = tl.load(OFF + row + 1).to(tl.int64)
    offs_t = start + c * QUANT_BLOCK + tl.arange(0, QUANT_BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (offs_t < end)[:, None] & (offs_d < HEAD_DIM)[None, :]
    ptrs = offs_t[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :]
    x = tl.load(X + ptrs, mask=ok, other=0.0).to(tl.float32)
    amax = tl.max(tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1), axis=0)  # NaN > Inf > finite
    inv, stored, bad = input_scale(amax)
    y = tl.minimum(tl.maximum(x * inv.to(tl.float32, bitcast=True), -448.0), 448.0)
    code = tl.where(bad, 0x7F, _encode_e4m3(y)).to(tl.uint8)
    tl.store(OUT + ptrs, code, mask=ok)
    if TRANSPOSED:  # tokens as the fast dim of the store (coalesced); the transpose goes through the tile
        t_ptrs = (h * HEAD_DIM + offs_d).to(tl.int64)[:, None] * stride_t + offs_t[None, :]
        tl.store(OUT_T + t_ptrs, tl.trans(code), mask=(offs_d < HEAD_DIM)[:, None] & (offs_t < end)[None, :])
    tl.store(SCALE + (tl.load(BLKOFF + row) + c) * H + h, stored)
