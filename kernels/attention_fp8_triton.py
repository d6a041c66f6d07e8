"""Triton forward of FP8 jagged attention: QK^T and PV on e4m3 tensor cores with power-of-two block scales.

Same structure, masks and bias as ``kernels.attention_triton_fwd`` (work list, whole tiles below the causal
diagonal without masks, tiles streamed through tensor descriptors on Hopper); the differences:

* Q, K, V arrive as e4m3 with one fp32 power-of-two scale per (row block of ``QUANT_BLOCK`` tokens, head)
  (``kernels.attention_fp8.quantize_jagged``). Blocks start at each jagged row's first token. The KV loop
  starts at a multiple of ``BLOCK_N`` inside the row and ``BLOCK_N`` divides ``QUANT_BLOCK``, so each KV
  tile has one K scale and one V scale (the extra keys before the visible range are masked). The Q scale
  (per query) and the K scale (per tile) multiply the fp32 score tile.
* V is read from a transposed copy (``V_TRANSPOSED``, ``attention_fp8_op.TransposedCodes``: ``[H * D, columns]``,
  each row's tokens from column ``VTO[row]``), so the PV product's second operand is contiguous along its
  reduction dim, as Hopper's FP8 tensor-core instructions read it from shared memory.
* softmax: P = exp2(s - m + log2(P_SCALE)) lies in [0, P_SCALE] (``kernels.attention_fp8.P_SCALE``); it is
  stored as e4m3 (a fixed power of two, FA3's FP8 recipe, folded into the subtracted row max at no cost). The row sum ``l`` adds the unquantized
  fp32 P, in the same units, so the output is ``acc / l``. The accumulator is kept in units of the current
  tile's V scale (rescaled by the ratio of consecutive power-of-two scales together with the online-softmax
  rescale, which is exact), so each PV product accumulates in place on the tensor cores.
* silu/gelu: act(s) is unbounded, so each tile's P gets one power-of-two scale per query row
  (non-saturating, ``kernels.mx`` rule), which factors out of the PV product.

Accumulation is fp32. Under ``TRITON_INTERPRET=1`` the P conversion uses the exact integer RNE encoder
of ``kernels.mx_triton`` (the interpreter's float->fp8 cast is not round-to-nearest-even); on GPU it
is the hardware conversion (also RNE).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import attention_fp8 as fp8_recipe  # the recipe's constants
from kernels.attention_triton_bias import TABLE_PADS, add_bias_span, min_max, tile_spans
from kernels.attention_triton_common import (
    ACT_CODES,
    AUTOTUNE,
    INTERPRET,
    act_fwd,
    kv_range,
    load_rows,
    load_times,
    row_extent,
    smem_prune,
    stream_tile,
    unmasked_kv_end,
    visible,
)
from kernels.attention_worklist import owner
from kernels.mx_triton import HW_CVT, _encode_e4m3, _scale_from_amax, _scaled_codes

LOG2_P_SCALE: tl.constexpr = tl.constexpr(fp8_recipe.LOG2_P_SCALE)
SCALE_EXP_LIMIT: tl.constexpr = tl.constexpr(fp8_recipe.SCALE_EXP_LIMIT)
LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


def descriptor_hook(nargs: dict) -> None:
    """Autotune ``pre_hook``: block shapes of the Q, K and transposed-V descriptors for this config."""
    d = nargs["BLOCK_D"]
    shapes = {"QD": [nargs["BLOCK_M"], d], "KD": [nargs["BLOCK_N"], d], "VD": [d, nargs["BLOCK_N"]]}
    for name, shape in shapes.items():
        if isinstance(nargs[name], TensorDescriptor):
            nargs[name].block_shape = shape


def _configs() -> list[triton.Config]:
    if INTERPRET:
        return [triton.Config({"BLOCK_N": 32}, num_warps=4, num_stages=1, pre_hook=descriptor_hook)]
    # Four warps: programs share an SM and overlap one's softmax with the other's MMAs; eight warps on the same
    # tiles were 1.7-2.3x slower on an H200 (benchmarks/RESULTS.md, "FP8 attention on the bf16 kernel's design").
    # The first two are the default with and without a register cap of 136 (_capped says which cases take it;
    # benchmarks/RESULTS.md, "A register cap for the FP8 attention forward" and "The register cap by case").
    configs = [
        triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=s, maxnreg=r, pre_hook=descriptor_hook)
        for bn, w, s, r in ((64, 4, 3, 136), (64, 4, 3, None), (128, 4, 2, None), (64, 4, 2, None),
                            (32, 4, 3, None), (64, 8, 3, None), (128, 8, 2, None))
    ]
    # Without autotuning still two configs: Triton skips early_config_prune when given one (_prune then keeps
    # one, so nothing is benchmarked twice).
    return configs if AUTOTUNE else configs[:2]


_smem = smem_prune("BLOCK_N", "BLOCK_M")


def _capped(meta: dict) -> bool:
    """Whether the default configuration runs with its register cap, as timed on an H100 (capped / uncapped):
    64-query tiles without bias tables, softmax (batch A causal 1.02x, batch B causal 1.15x) and silu at head
    dim 64 (batch B 1.11x). Uncapped: bias tables (0.31-0.40x: they spill), silu at head dim 128 (0.86x), and
    16-query tiles (cross attention of 16 queries: 0.48x batch A, 0.97x batch B)."""
    if meta.get("BLOCK_M") != 64 or meta.get("HAS_POS") or meta.get("HAS_TIME"):
        return False
    act = meta.get("ACT", 0)
    return act == 0 or (act == ACT_CODES["silu"] and meta.get("BLOCK_D", 128) <= 64)


def _prune(configs: list[triton.Config], nargs: dict, **kwargs) -> list[triton.Config]:
    """KV tiles must not straddle a V scale block (``BLOCK_N`` divides ``QUANT_BLOCK``); without autotuning
    the default, with its register cap where :func:`_capped` says."""
    qb = kwargs["QUANT_BLOCK"]
    keep = [c for c in configs if qb % c.kwargs["BLOCK_N"] == 0]
    fallback = triton.Config({"BLOCK_N": min(qb, 64)}, num_warps=4, num_stages=2, pre_hook=descriptor_hook)
    keep = _smem(keep or [fallback], nargs, **kwargs)
    if AUTOTUNE:
        return keep
    capped = _capped(kwargs)
    return [next((c for c in keep if (c.maxnreg is not None) == capped), keep[0])]


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
def _to_e4m3(y):
    """fp32 tile (|y| <= 448) -> e4m3, round to nearest even."""
    if HW_CVT:
        return y.to(tl.float8e4nv, fp_downcast_rounding="rtne")
    else:
        return _encode_e4m3(y).to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def _v_tile(V, VD, stride_vt, row_start, start_n, h, offs_d, d_ok, n_ok,
            HEAD_DIM: tl.constexpr, H: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr,
            USE_TMA: tl.constexpr, V_TRANSPOSED: tl.constexpr, BLOCK_N: tl.constexpr):
    """The ``[BLOCK_N, BLOCK_D]`` V tile of keys ``start_n ..`` of the row starting at ``row_start`` (a token,
    or a column of the transposed codes): from the transposed codes (a transposed view of their
    ``[BLOCK_D, BLOCK_N]`` tile: K-major for the PV product) or from row-major codes."""
    if V_TRANSPOSED:
        if USE_TMA:
            vt = VD.load([h * HEAD_DIM, (row_start + start_n).to(tl.int32)])
        else:
            offs_n = row_start + start_n + tl.arange(0, BLOCK_N)
            vt_ptrs = V + (h * HEAD_DIM + offs_d).to(tl.int64)[:, None] * stride_vt + offs_n[None, :]
            vt = tl.load(vt_ptrs, mask=d_ok[:, None] & n_ok[None, :], other=0.0)
        return tl.trans(vt)
    else:
        offs_n = row_start + start_n + tl.arange(0, BLOCK_N)
        ptrs = V + offs_n[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :]
        return load_rows(ptrs, n_ok, d_ok, MASKED, EVEN_D)


@triton.jit
def _fp8_tile(
    acc, m_i, l_i, sv_acc, q, sq, pos_q, m_ok, ts_q, q_first, q_last, tq_min, tq_max, start_n, hi, hist_end, window,
    K, V, KD, VD, SK, SV, KTS, POSW, TIMEW, kv_start, vt_start, kb0, stride_vt, h, offs_d, d_ok, bias_scale,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_NT: tl.constexpr,
    BLOCK_S: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr,
    HAS_TIME: tl.constexpr, NUM_TIME: tl.constexpr, POS_PAD: tl.constexpr, TIME_PAD: tl.constexpr,
    QUANT_BLOCK: tl.constexpr, V_TRANSPOSED: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
    EVEN_D: tl.constexpr, USE_TMA: tl.constexpr,
):
    """One KV tile. ``MASKED=False``: every query sees every key of the tile, which lies inside the row (no
    visibility mask, no key bounds; query rows past the row's end are never stored)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    n_ok = offs_n < hi
    rows = (kv_start + offs_n)[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :]
    k = stream_tile(KD, K + rows, kv_start + start_n, h * HEAD_DIM, n_ok, d_ok, MASKED, EVEN_D, USE_TMA)
    v = _v_tile(V, VD, stride_vt, vt_start, start_n, h, offs_d, d_ok, n_ok, HEAD_DIM, H, MASKED, EVEN_D, USE_TMA,
                V_TRANSPOSED, BLOCK_N)
    ts_k = load_times(KTS, kv_start, offs_n, n_ok, MASKED, HAS_TIME)
    blk = (kb0 + start_n // QUANT_BLOCK) * H + h
    c = sq * tl.load(SK + blk)  # per query: Q scale x this tile's K scale x the score factor
    sv = tl.load(SV + blk)
    s = tl.dot(q, tl.trans(k))
    HAS_BIAS: tl.constexpr = HAS_POS or HAS_TIME
    if HAS_BIAS or ACT != 0:
        s = s * c[:, None]
        tk_min = 0
        tk_max = 0
        if HAS_TIME:
            tk_min, tk_max = min_max(ts_k, n_ok)
        p_lo, p_hi, t_lo, t_hi, u, w, t_narrow = tile_spans(
            q_first, q_last, start_n, tl.minimum(start_n + BLOCK_N, hi) - 1, ts_q, tq_min, tq_max, ts_k, tk_min,
            tk_max, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME)
        s = add_bias_span(s, pos_q, offs_n, p_lo, p_hi, ts_q, ts_k, u, w, t_lo, t_hi, t_narrow, h, POSW, TIMEW,
                          bias_scale, H, HAS_POS, NUM_POS, HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD)
    ok = tl.full([BLOCK_N], 1, tl.int1)[None, :]
    if MASKED:
        ok = visible(pos_q[:, None], offs_n[None, :], hi, hist_end, window, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW)
        ok = ok & m_ok[:, None]
    if ACT == 0:
        if MASKED:
            s = tl.where(ok, s, float("-inf"))
        if HAS_BIAS:
            m_new = tl.maximum(m_i, tl.max(s, 1))
        else:  # c > 0: the max of the scaled scores is the scaled max, and P takes one FMA per score
            m_new = tl.maximum(m_i, tl.max(s, 1) * c)
        m_ref = m_new
        if MASKED:
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        if HAS_BIAS:
            p = tl.exp2(s - (m_ref - LOG2_P_SCALE)[:, None])
        else:
            p = tl.exp2(s * c[:, None] - (m_ref - LOG2_P_SCALE)[:, None])
        alpha = tl.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        acc = acc * (alpha * (sv_acc / sv))[:, None]  # powers of two: exact change of units
        sv_acc = sv
        acc = tl.dot(_to_e4m3(p), v, acc)
    else:
        p = act_fwd(s, ACT)
        if MASKED:
            p = tl.where(ok, p, 0.0)
        amax = tl.max(p.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
        inv, sp, _ = _scale_from_amax(amax, False)
        y = p * inv.to(tl.float32, bitcast=True)[:, None]
        p8 = _to_e4m3(tl.minimum(tl.maximum(y, -448.0), 448.0))
        acc += tl.dot(p8, v) * (sp.to(tl.float32, bitcast=True) * sv)[:, None]
    return acc, m_i, l_i, sv_acc


@triton.autotune(configs=_configs(),
                 key=["LEN_KEY", "HEAD_DIM", "ACT", "CAUSAL", "BLOCK_S", "HAS_POS", "HAS_TIME", "QUANT_BLOCK",
                      "V_TRANSPOSED", "USE_TMA"],
                 prune_configs_by={"early_config_prune": _prune})
@triton.heuristics(TABLE_PADS)
@triton.jit
def jagged_attn_fp8_fwd_kernel(
    Q, K, V, QD, KD, VD, SQ, SK, SV, QBO, KBO, OUT, LSE, QO, KO, NT, WORK, POSW, TIMEW, QTS, KTS, VTO, VB,
    scale, norm_const, window, LEN_KEY, stride_vt,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_NT: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr,
    NUM_TIME: tl.constexpr, NORM_ROW: tl.constexpr, QUANT_BLOCK: tl.constexpr, V_TRANSPOSED: tl.constexpr,
    USE_TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, POS_PAD: tl.constexpr,
    TIME_PAD: tl.constexpr, HAS_VBIAS: tl.constexpr = False,
):
    pid = tl.program_id(0)
    item = pid // H
    h = pid % H
    row = tl.load(WORK + 2 * item)
    if row < 0:
        return
    mblk = tl.load(WORK + 2 * item + 1)
    q_start, q_len, kv_start, kv_len, hist_end = row_extent(QO, KO, NT, row, HAS_NT)
    qb0 = tl.load(QBO + row).to(tl.int64)  # first scale block of this row
    kb0 = tl.load(KBO + row).to(tl.int64)
    vt_start = kv_start  # where this row's V codes start: a token, or a column of the transposed codes
    if V_TRANSPOSED:
        vt_start = tl.load(VTO + row).to(tl.int64)

    offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM
    shift = kv_len - q_len
    pos_q = shift + offs_m
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM

    q_ptrs = Q + (q_start + offs_m)[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :]
    q = stream_tile(QD, q_ptrs, q_start + mblk * BLOCK_M, h * HEAD_DIM, m_ok, d_ok, True, EVEN_D, USE_TMA)
    # 1.0 past the row: those queries stay finite (never stored) and keep the scaled-max shortcut valid.
    sq = tl.load(SQ + (qb0 + offs_m // QUANT_BLOCK) * H + h, mask=m_ok, other=1.0)
    ts_q = load_times(QTS, q_start, offs_m, m_ok, True, HAS_TIME)
    tq_min = 0
    tq_max = 0
    if HAS_TIME:
        tq_min, tq_max = min_max(ts_q, m_ok)

    last = tl.minimum(mblk * BLOCK_M + BLOCK_M, q_len) - 1
    lo, hi = kv_range(shift + mblk * BLOCK_M, shift + last, kv_len, window, CAUSAL, BLOCK_S, HAS_WINDOW)
    lo = (lo // BLOCK_N) * BLOCK_N  # tiles aligned inside the row: one K and one V scale per tile

    if ACT == 0:
        sq = sq * (scale * LOG2E)  # softmax in base 2
        bias_scale = LOG2E
    else:
        sq = sq * scale
        bias_scale = 1.0
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # V scale of the accumulator's units (softmax path); 1.0 when the row has no key to visit
    sv_acc = tl.load(SV + (kb0 + lo // QUANT_BLOCK) * H + h, mask=lo < hi, other=1.0)

    mid = unmasked_kv_end(lo, shift + mblk * BLOCK_M, kv_len, hist_end, BLOCK_N, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW)
    for start_n in range(lo, mid, BLOCK_N):
        acc, m_i, l_i, sv_acc = _fp8_tile(
            acc, m_i, l_i, sv_acc, q, sq, pos_q, m_ok, ts_q, shift + mblk * BLOCK_M, shift + last, tq_min, tq_max,
            start_n, hi, hist_end, window, K, V, KD, VD, SK, SV, KTS, POSW, TIMEW, kv_start, vt_start, kb0, stride_vt, h,
            offs_d, d_ok, bias_scale, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW, HAS_POS, NUM_POS,
            HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, QUANT_BLOCK, V_TRANSPOSED, BLOCK_N, False, EVEN_D, USE_TMA)
    for start_n in range(mid, hi, BLOCK_N):
        acc, m_i, l_i, sv_acc = _fp8_tile(
            acc, m_i, l_i, sv_acc, q, sq, pos_q, m_ok, ts_q, shift + mblk * BLOCK_M, shift + last, tq_min, tq_max,
            start_n, hi, hist_end, window, K, V, KD, VD, SK, SV, KTS, POSW, TIMEW, kv_start, vt_start, kb0, stride_vt, h,
            offs_d, d_ok, bias_scale, H, HEAD_DIM, ACT, CAUSAL, HAS_NT, BLOCK_S, HAS_WINDOW, HAS_POS, NUM_POS,
            HAS_TIME, NUM_TIME, POS_PAD, TIME_PAD, QUANT_BLOCK, V_TRANSPOSED, BLOCK_N, True, EVEN_D, USE_TMA)

    if ACT == 0:
        has = l_i > 0.0
        out = acc * (sv_acc / tl.where(has, l_i, 1.0))[:, None]
        if HAS_VBIAS:  # V's bias, added after the products: each softmax row sums to one, P (V + b) = P V + b
            vb = tl.load(VB + h * HEAD_DIM + offs_d, mask=d_ok, other=0.0).to(tl.float32)
            out = tl.where(has[:, None], out + vb[None, :], out)
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)) - LOG2_P_SCALE, float("inf"))
        tl.store(LSE + (q_start + offs_m) * H + h, lse, mask=m_ok)
    else:
        if NORM_ROW:
            out = acc / tl.maximum(kv_len, 1).to(tl.float32)
        else:
            out = acc / norm_const
    o_ptrs = OUT + (q_start + offs_m)[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


@triton.jit
def _quant_block(X, OUT, OUT_T, SCALE, OFF, BLKOFF, WORK, COLS, stride_t, item, h,
                 H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, QUANT_BLOCK: tl.constexpr,
                 TRANSPOSED: tl.constexpr, ROW_MAJOR: tl.constexpr):
    """One (row block, head) of work item ``item``: power-of-two scale from the block's |x| max, e4m3 codes
    (round to nearest even, bit-identical to ``kernels.attention_fp8.quantize_jagged``): ``[tokens, H, D]``
    (``ROW_MAJOR``) and/or the transposed copy (``TRANSPOSED``: ``attention_fp8_op.TransposedCodes``, row
    starts ``COLS``)."""
    row = tl.load(WORK + 2 * item)
    if row >= 0:
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
        code = _scaled_codes(x, inv, bad)
        if ROW_MAJOR:
            tl.store(OUT + ptrs, code, mask=ok)
        if TRANSPOSED:  # tokens as the fast dim of the store (coalesced); the transpose goes through the tile
            col0 = tl.multiple_of(tl.load(COLS + row), 16).to(tl.int64)  # rows start on 16-byte boundaries
            local = c * QUANT_BLOCK + tl.arange(0, QUANT_BLOCK)
            width = tl.load(COLS + row + 1).to(tl.int64) - col0  # the row's length rounded up: zeros after it
            code_t = tl.where((offs_t < end)[None, :], tl.trans(code), 0)
            t_ptrs = (h * HEAD_DIM + offs_d).to(tl.int64)[:, None] * stride_t + (col0 + local)[None, :]
            # Both sides multiples of 16: the mask holds over runs of 16 tokens, so the stores are 16 bytes wide.
            in_row = (local // 16) < (width // 16)
            tl.store(OUT_T + t_ptrs, code_t, mask=(offs_d < HEAD_DIM)[:, None] & in_row[None, :])
        tl.store(SCALE + (tl.load(BLKOFF + row) + c) * H + h, stored)


@triton.jit
def jagged_quant_kernel(
    X, OUT, OUT_T, SCALE, OFF, BLKOFF, WORK, COLS, stride_t,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, QUANT_BLOCK: tl.constexpr,
    TRANSPOSED: tl.constexpr, ROW_MAJOR: tl.constexpr,
):
    """One tensor: a program per (work item, head) (``_quant_block``)."""
    pid = tl.program_id(0)
    _quant_block(X, OUT, OUT_T, SCALE, OFF, BLKOFF, WORK, COLS, stride_t, pid // H, pid % H, H, HEAD_DIM, BLOCK_D,
                 QUANT_BLOCK, TRANSPOSED, ROW_MAJOR)


@triton.jit
def jagged_quant_qkv_kernel(
    Q, K, V, QC, KC, VC, VT, SQ, SK, SV, QO, KO, QBO, KBO, QWORK, KWORK, COLS, q_items, kv_items, stride_t,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, QUANT_BLOCK: tl.constexpr,
    V_TRANSPOSED: tl.constexpr, V_ROW_MAJOR: tl.constexpr,
):
    """Q, K and V in one launch (grid axis 1 picks the tensor; K and V share a layout): the launch's host time
    is paid once. V's codes go to the transposed copy (``V_TRANSPOSED``) and/or row-major (``V_ROW_MAJOR``)."""
    pid = tl.program_id(0)
    which = tl.program_id(1)
    item = pid // H
    h = pid % H
    if which == 0:
        if item < q_items:
            _quant_block(Q, QC, QC, SQ, QO, QBO, QWORK, COLS, stride_t, item, h, H, HEAD_DIM, BLOCK_D, QUANT_BLOCK,
                         False, True)
    elif which == 1:
        if item < kv_items:
            _quant_block(K, KC, KC, SK, KO, KBO, KWORK, COLS, stride_t, item, h, H, HEAD_DIM, BLOCK_D, QUANT_BLOCK,
                         False, True)
    else:
        if item < kv_items:
            _quant_block(V, VC, VT, SV, KO, KBO, KWORK, COLS, stride_t, item, h, H, HEAD_DIM, BLOCK_D, QUANT_BLOCK,
                         V_TRANSPOSED, V_ROW_MAJOR)


@triton.jit
def quant_plan_kernel(OFF, BLKOFF, COLS, WORK, num_rows, n_items, BLOCK: tl.constexpr, ALIGN: tl.constexpr,
                      ROWS: tl.constexpr, LOG_ROWS: tl.constexpr, CHUNK: tl.constexpr):
    """``attention_fp8_op.quant_plan`` in one program: each row's first scale block (``BLKOFF``, [B+1]) and
    first transposed column (``COLS``, lengths rounded up to ``ALIGN``), and the (row, block) work list in row
    order (row -1 past the last block)."""
    r = tl.arange(0, ROWS)
    ok = r < num_rows
    lens = (tl.load(OFF + r + 1, mask=ok, other=0) - tl.load(OFF + r, mask=ok, other=0)).to(tl.int32)
    tl.store(BLKOFF + 1 + r, tl.cumsum(tl.where(ok, (lens + BLOCK - 1) // BLOCK, 0), 0), mask=ok)
    tl.store(COLS + 1 + r, tl.cumsum(tl.where(ok, (lens + ALIGN - 1) // ALIGN * ALIGN, 0), 0), mask=ok)
    tl.store(BLKOFF + r, 0, mask=r == 0)
    tl.store(COLS + r, 0, mask=r == 0)
    tl.debug_barrier()  # the sums written above are read back by other threads of this program
    for start in range(0, n_items, CHUNK):
        t = start + tl.arange(0, CHUNK)
        pos = owner(BLKOFF + 1, t, num_rows, 1 << 30, ROWS, LOG_ROWS)  # the row that owns entry t
        valid = pos < num_rows
        block = t - tl.load(BLKOFF + tl.minimum(pos, num_rows))
        in_list = t < n_items
        tl.store(WORK + 2 * t, tl.where(valid, pos, -1), mask=in_list)
        tl.store(WORK + 2 * t + 1, tl.where(valid, block, 0), mask=in_list)
