"""Triton kernels behind :mod:`kernels.mx`: block quantize (rows, transposed, or both from one read),
128x128 tile quantize, MXFP8 decode, rowwise quantize (tensorwise: :mod:`kernels.mx_triton_tensorwise`).

The element conversion fp32 -> e4m3 / e5m2 (round to nearest even, inputs already clamped) is the GPU's
cvt instruction on the GPU and, under the interpreter, an encoder of integer and exactly-rounded fp32
operations: both give the PyTorch reference's codes bit for bit (``benchmarks/fp8_encode.py`` checks the
cvt against torch on every code, tie and clamp bound); the cvt runs at memory speed, the integer encoder
~20% slower on a streaming pass.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import triton_launch

# The interpreter's fp8 conversion rounds subnormal ties wrongly, so it takes the integer encoders. The cvt
# needs sm_89+, as every FP8 GEMM route here does (``kernels.mx`` quantizes with the reference on older GPUs).
HW_CVT = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")


@triton.jit
def _encode_e4m3(y):
    """fp32 (finite, |y| <= 448) -> e4m3fn code as int32 (RNE)."""
    if HW_CVT:
        return y.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True).to(tl.int32)
    else:
        return _encode_e4m3_int(y)


@triton.jit
def _encode_e5m2(y):
    """fp32 (finite, |y| <= 57344) -> e5m2 code as int32 (RNE)."""
    if HW_CVT:
        return y.to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True).to(tl.int32)
    else:
        return _encode_e5m2_int(y)


@triton.jit
def _encode_fp8_int(y, MANT: tl.constexpr, BIAS: tl.constexpr):
    """fp32 (finite, within the format's range) -> code of the 8-bit float with ``MANT`` mantissa bits and
    exponent bias ``BIAS`` as int32 (round to nearest even), in integer and exact fp32 operations."""
    SHIFT: tl.constexpr = 23 - MANT
    b = y.to(tl.int32, bitcast=True)
    sign = (b >> 24) & 0x80
    ab = b & 0x7FFFFFFF
    # normal (|y| >= 2^(1 - BIAS)): round 23 mantissa bits to MANT, ties to even, then rebias 127 -> BIAS
    norm = ((ab + ((1 << (SHIFT - 1)) - 1) + ((ab >> SHIFT) & 1)) >> SHIFT) - ((127 - BIAS) << MANT)
    # subnormal: adding 2^(23 + STEP) makes the fp32 add round |y| to a multiple of 2^STEP (the format's step)
    STEP: tl.constexpr = 1 - BIAS - MANT
    MAGIC: tl.constexpr = (1 << (23 + STEP)) * 1.0
    yab = ab.to(tl.float32, bitcast=True)
    sub = (yab + MAGIC).to(tl.int32, bitcast=True) - ((127 + 23 + STEP) << 23)  # minus the bits of MAGIC
    return tl.where(ab >= ((128 - BIAS) << 23), norm, sub) | sign


@triton.jit
def _encode_e4m3_int(y):
    """fp32 (finite, |y| <= 448) -> e4m3fn code as int32 (RNE)."""
    return _encode_fp8_int(y, 3, 7)


@triton.jit
def _encode_e5m2_int(y):
    """fp32 (finite, |y| <= 57344) -> e5m2 code as int32 (RNE)."""
    return _encode_fp8_int(y, 2, 15)


@triton.jit
def _scaled_codes(x, inv_bits, bad):
    """e4m3 codes (uint8) of ``x * inv`` with ``inv`` the power-of-two inverse scale given as fp32 bits;
    elements of a ``bad`` block (non-finite amax) get the NaN code 0x7F. ``inv_bits`` and ``bad`` broadcast
    against ``x``."""
    if HW_CVT:
        # The cvt saturates finite values to +-448 and turns NaN into 0x7F, so no clamp and no per-element
        # select: a bad block's scale is NaN, and so is every product with it.
        s = tl.where(bad, float("nan"), inv_bits.to(tl.float32, bitcast=True))
        return (x.to(tl.float32) * s).to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    else:
        y = tl.minimum(tl.maximum(x.to(tl.float32) * inv_bits.to(tl.float32, bitcast=True), -448.0), 448.0)
        return tl.where(bad, 0x7F, _encode_e4m3_int(y)).to(tl.uint8)


@triton.jit
def _scale_from_amax(amax_bits, E8M0: tl.constexpr):
    """Same rules as kernels.mx._scale_bits_ref: (inverse-scale bits, stored scale, non-finite). ``E8M0`` is one of
    kernels.mx's SCALE_* encodings: 0 fp32 powers of two, 1 E8M0 with the spec's floor rule, 2 E8M0 with the ceil
    rule."""
    e = amax_bits >> 23
    bad = e == 255
    if E8M0:
        if E8M0 == 2:
            s = tl.maximum(e - 8 + ((amax_bits & 0x7FFFFF) > 0x600000).to(tl.int32), 0)
        else:
            s = tl.maximum(e - 8, 0)
        s = tl.where(bad, 255, s)
        inv = (254 - tl.minimum(s, 254)) << 23
        stored = s
    else:
        mant = amax_bits & 0x7FFFFF
        t = e - 8 + (mant > 0x600000).to(tl.int32)
        t = tl.where(e == 0, 1, tl.maximum(t, 1))
        inv = (254 - t) << 23
        stored = tl.where(bad, 0x7FC00000, t << 23)
    return inv, stored, bad


@triton.jit
def _amax_bits(x, axis: tl.constexpr):
    """fp32 bits of max |x| along ``axis`` (integer max: NaN > Inf > finite), for fp32 or bf16 ``x``: a bf16
    tile is reduced on its own 16 bits (the fp32 value's upper half), so it stays half the registers."""
    if x.dtype == tl.bfloat16:
        return (tl.max(x.to(tl.int16, bitcast=True) & 0x7FFF, axis=axis).to(tl.int32)) << 16
    else:
        return tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=axis)


@triton.jit
def _quant_rows(x, A: tl.constexpr, W: tl.constexpr, BLK: tl.constexpr, E8M0: tl.constexpr):
    """Quantize a [A, W] fp32 or bf16 tile in blocks of BLK along dim 1 -> (codes [A, W], scales [A, W//BLK])."""
    xb = tl.reshape(x, (A * (W // BLK), BLK))
    amax = _amax_bits(xb, 1)
    inv, stored, bad = _scale_from_amax(amax, E8M0)
    code = _scaled_codes(xb, inv[:, None], bad[:, None])
    return tl.reshape(code, (A, W)), tl.reshape(stored, (A, W // BLK))


@triton.jit
def _quant_kernel(
    x_ptr, R, C, sxr, sxc,
    q_ptr, sqr, s_ptr, ssr, ssc, CP,
    qt_ptr, sqtr, st_ptr, sstr, sstc, RP, cs_ptr, scs,
    TR: tl.constexpr, TC: tl.constexpr, BLK: tl.constexpr,
    ROW: tl.constexpr, COL: tl.constexpr, E8M0: tl.constexpr, COLSUM: tl.constexpr,
    TILES_PER_PROG: tl.constexpr, ALONG_ROWS: tl.constexpr, F32: tl.constexpr = False,
):
    pid_r = tl.program_id(0)
    if TILES_PER_PROG == 1:
        _quant_tile(x_ptr, R, C, sxr, sxc, q_ptr, sqr, s_ptr, ssr, ssc, CP, qt_ptr, sqtr, st_ptr, sstr, sstc, RP,
                    cs_ptr, scs, pid_r, tl.program_id(1), TR, TC, BLK, ROW, COL, E8M0, COLSUM, F32)
    else:
        # Several tiles per program, cast in turn (pipelining their loads measured no faster): consecutive row
        # tiles (each column's transposed codes in one longer run; MX columns: 0.300 -> 0.280 ms on 65536x4096
        # bf16, MX and 1x128 both layouts lost with it) or consecutive column tiles.
        for t in tl.range(0, TILES_PER_PROG, num_stages=1):
            if ALONG_ROWS:
                pr = pid_r * TILES_PER_PROG + t
                pc = tl.program_id(1)
            else:
                pr = pid_r
                pc = tl.program_id(1) * TILES_PER_PROG + t
            if (pr * TR < (RP if COL else R)) & (pc * TC < (CP if ROW else C)):
                _quant_tile(x_ptr, R, C, sxr, sxc, q_ptr, sqr, s_ptr, ssr, ssc, CP, qt_ptr, sqtr, st_ptr, sstr, sstc,
                            RP, cs_ptr, scs, pr, pc, TR, TC, BLK, ROW, COL, E8M0, COLSUM, F32)


@triton.jit
def _quant_tile(
    x_ptr, R, C, sxr, sxc,
    q_ptr, sqr, s_ptr, ssr, ssc, CP,
    qt_ptr, sqtr, st_ptr, sstr, sstc, RP, cs_ptr, scs, pid_r, pid_c,
    TR: tl.constexpr, TC: tl.constexpr, BLK: tl.constexpr,
    ROW: tl.constexpr, COL: tl.constexpr, E8M0: tl.constexpr, COLSUM: tl.constexpr, F32: tl.constexpr,
):
    rr = (pid_r * TR + tl.arange(0, TR)).to(tl.int64)
    cc = (pid_c * TC + tl.arange(0, TC)).to(tl.int64)
    inb = (rr[:, None] < R) & (cc[None, :] < C)
    x = tl.load(x_ptr + rr[:, None] * sxr + cc[None, :] * sxc, mask=inb, other=0.0)
    if F32 or x.dtype != tl.bfloat16:  # bf16 may stay 16-bit until each product with its scale (exact either way)
        x = x.to(tl.float32)
    if COLSUM:  # per-tile column sums (the bias gradient when x is dY), reduced on the host side
        tl.store(cs_ptr + pid_r * scs + cc, tl.sum(x.to(tl.float32), axis=0), mask=cc < C)
    if ROW:  # blocks along C; output [R, CP]
        code, sc = _quant_rows(x, TR, TC, BLK, E8M0)
        m = (rr[:, None] < R) & (cc[None, :] < CP)
        tl.store(q_ptr + rr[:, None] * sqr + cc[None, :], code, mask=m)
        bc = (pid_c * (TC // BLK) + tl.arange(0, TC // BLK)).to(tl.int64)
        ms = (rr[:, None] < R) & (bc[None, :] < CP // BLK)
        sp = s_ptr + rr[:, None] * ssr + bc[None, :] * ssc
        if E8M0:
            tl.store(sp, sc.to(tl.uint8), mask=ms)
        else:
            tl.store(sp, sc.to(tl.float32, bitcast=True), mask=ms)
    if COL:  # blocks along R; output transposed [C, RP]
        m = (cc[:, None] < C) & (rr[None, :] < RP)
        if TR == BLK:
            # one block of rows per tile: reduce over axis 0 in place and transpose only the 1-byte codes
            amax = _amax_bits(x, 0)
            inv, stored, bad = _scale_from_amax(amax, E8M0)
            code = _scaled_codes(x, inv[None, :], bad[None, :])
            tl.store(qt_ptr + cc[:, None] * sqtr + rr[None, :], tl.trans(code), mask=m)
            sp = st_ptr + cc * sstr + pid_r * sstc
            if E8M0:
                tl.store(sp, stored.to(tl.uint8), mask=cc < C)
            else:
                tl.store(sp, stored.to(tl.float32, bitcast=True), mask=cc < C)
        else:
            codet, sct = _quant_rows(tl.trans(x), TC, TR, BLK, E8M0)
            tl.store(qt_ptr + cc[:, None] * sqtr + rr[None, :], codet, mask=m)
            br = (pid_r * (TR // BLK) + tl.arange(0, TR // BLK)).to(tl.int64)
            ms = (cc[:, None] < C) & (br[None, :] < RP // BLK)
            sp = st_ptr + cc[:, None] * sstr + br[None, :] * sstc
            if E8M0:
                tl.store(sp, sct.to(tl.uint8), mask=ms)
            else:
                tl.store(sp, sct.to(tl.float32, bitcast=True), mask=ms)


@triton.jit
def _tile_kernel(
    w_ptr, N, K, swn, swk,
    q_ptr, sqn, qt_ptr, sqtk, s_ptr, ssn, st_ptr, sst, NP, KP,
    T: tl.constexpr,
):
    """One T x T tile -> one power-of-two scale; writes q [N, KP], q^T [K, NP], scale and scale^T."""
    pn = tl.program_id(0)
    pk = tl.program_id(1)
    rn = (pn * T + tl.arange(0, T)).to(tl.int64)
    rk = (pk * T + tl.arange(0, T)).to(tl.int64)
    w = tl.load(w_ptr + rn[:, None] * swn + rk[None, :] * swk,
                mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0).to(tl.float32)
    amax = tl.max(tl.max(w.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1), axis=0)
    inv, stored, bad = _scale_from_amax(amax, False)
    # Not _scaled_codes: with its 8-bit codes the transposed copy came out wrong for fp32 weights on an H200
    # (Triton 3.6; the row-major copy of the same codes was right), so this kernel keeps int32 codes.
    y = w * inv.to(tl.float32, bitcast=True)
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    code = tl.where(bad, 0x7F, _encode_e4m3(y)).to(tl.uint8)
    tl.store(q_ptr + rn[:, None] * sqn + rk[None, :], code, mask=(rn[:, None] < N) & (rk[None, :] < KP))
    tl.store(qt_ptr + rk[:, None] * sqtk + rn[None, :], tl.trans(code),
             mask=(rk[:, None] < K) & (rn[None, :] < NP))
    sv = stored.to(tl.float32, bitcast=True)
    tl.store(s_ptr + pn * ssn + pk, sv)
    tl.store(st_ptr + pk * sst + pn, sv)


@triton.jit
def decode_e4m3(code):
    """e4m3fn codes (uint8) -> fp32, exact (subnormals and NaN codes included)."""
    if HW_CVT:  # the GPU's e4m3 -> fp32 conversion is exact
        return code.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        c = code.to(tl.int32)
        e = (c >> 3) & 0xF
        mant = c & 7
        sign = (c & 0x80) << 24
        normal = (sign | ((e + 120) << 23) | (mant << 20)).to(tl.float32, bitcast=True)
        sub = mant.to(tl.float32) * 0.001953125  # m * 2^-9, exact; sign set by bits (keeps -0.0)
        sub = (sub.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
        v = tl.where(e == 0, sub, normal)
        return tl.where((c & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def _mx_dequant_kernel(q_ptr, sqr, s_ptr, ssr, ssc, o_ptr, sor, R, C,
                       TR: tl.constexpr, TC: tl.constexpr, BLK: tl.constexpr, BF16: tl.constexpr):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rr = (pid_r * TR + tl.arange(0, TR)).to(tl.int64)
    cc = (pid_c * TC + tl.arange(0, TC)).to(tl.int64)
    m = (rr[:, None] < R) & (cc[None, :] < C)
    code = tl.load(q_ptr + rr[:, None] * sqr + cc[None, :], mask=m, other=0)
    bc = (pid_c * (TC // BLK) + tl.arange(0, TC // BLK)).to(tl.int64)  # one scale per block, broadcast
    sb = tl.load(s_ptr + rr[:, None] * ssr + bc[None, :] * ssc,
                 mask=(rr[:, None] < R) & (bc[None, :] * BLK < C), other=127).to(tl.int32)
    v = decode_e4m3(code)
    xs = tl.where(sb == 0, 0x00400000, tl.where(sb == 255, 0x7FC00000, sb << 23)).to(tl.float32, bitcast=True)
    out = tl.reshape(tl.reshape(v, (TR, TC // BLK, BLK)) * xs[:, :, None], (TR, TC))  # NaN scale -> NaN
    if BF16:
        if HW_CVT:  # the GPU's conversion rounds to nearest even, subnormals included
            r = out.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
        else:  # integer round-to-nearest-even: the interpreter's conversion rounds subnormals otherwise
            b = out.to(tl.int32, bitcast=True)
            r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        r = tl.where(out != out, 0x7FC0, r)  # torch's NaN, not the cvt's 0x7FFF
        tl.store(o_ptr + rr[:, None] * sor + cc[None, :], r.to(tl.int16), mask=m)
    else:
        tl.store(o_ptr + rr[:, None] * sor + cc[None, :], out, mask=m)


def _ceil_to(n: int, m: int) -> int:
    return (n + m - 1) // m * m


@dataclass(frozen=True)
class Interleaved:
    """A both-layouts cast whose programs read their [block, block] tile as four row tiles of every fourth row
    (:mod:`kernels.mx_triton_interleaved`): warps per program and Triton's register cap (``maxnreg``, 0 = none)."""

    warps: int = 4
    cap: int = 0


# Tile shapes (rows, cols, warps[, register cap[, tiles per program[, along rows]]]) per (block, mode): best of
# sweeps on an H200 (benchmarks/fp8_linear.py --sweep, 2026-11-29 and 2026-12-03; both layouts: benchmarks/quant_both.py,
# 2026-12-01 and 2026-12-03; MX columns and both layouts with column sums: benchmarks/RESULTS.md, 2026-12-03).
# Column blocks with TR == BLK take the transpose-the-codes path. The register cap (Triton's ``maxnreg``, GPU
# only; 0 = none) sets how many programs share an SM; a program casts its tiles in turn, along the columns (along
# rows = 0) or along the rows (1: consecutive row tiles, so each column's transposed codes come out as one longer
# run). A "+sums" mode, where present, is the cast that also sums x's columns (``col_sums``). An ``Interleaved``
# entry (both layouts only) takes the cast of kernels.mx_triton_interleaved instead.
TILES: dict[tuple[int, str], tuple[int, ...] | Interleaved] = {
    (32, "row"): (16, 512, 4, 0, 4),
    (32, "col"): (32, 128, 1, 0, 4, 1),
    (32, "both"): (32, 128, 2),
    (128, "row"): (8, 1024, 8),
    (128, "col"): (128, 64, 4),
    # 1x128 both layouts: rows read in fours (kernels.mx_triton_interleaved); on an H100 0.397 ms against 0.415 for
    # the one-read tile (128, 128, 8, 128) in the same run, 65536x4096 bf16 (benchmarks/RESULTS.md, 2026-12-06)
    (128, "both"): Interleaved(warps=8),
    # both layouts plus column sums (dY: the bias gradient from the same read) take fewer registers per program
    (32, "both+sums"): (32, 128, 1),
    # the 1x128 dY cast, rows read in fours: on an H100 0.474 ms against 0.517 for the one-read tile (128, 128, 4)
    # widened (0.536 kept 16-bit) in the same run
    (128, "both+sums"): Interleaved(warps=4),
}


# bf16 tiles stay 16-bit in the casts (half the registers, the same codes), except in the one-read casts with column
# sums, whose sums are fp32 anyway (the interleaved cast keeps bf16 16-bit there too): on an H200 (65536x4096, benchmarks/quant_both.py) those ran faster widened on load
# (MX 0.336 ms against 0.374 16-bit, 1x128 0.480 against 0.501), MX both layouts without sums 0.316 ms 16-bit
# against 0.328 widened.
WIDEN_WITH_SUMS = True


def quantize(x: torch.Tensor, block: int, e8m0: int, row: bool, col: bool,
             tiles: tuple[int, ...] | Interleaved | None = None, col_sums: bool = False):
    """Launch the block quantizer. Returns ((q, s, shape) | None, (qt, st, shape) | None), plus the
    fp32 column sums of ``x`` as a third item when ``col_sums`` (one read serves both). ``e8m0``: the scale
    encoding, one of kernels.mx's SCALE_* (a bool reads as E8M0 floor / fp32).

    Row output: q [R, Cp], scale [R, Cp/block]; column output: qt [C, Rp], scale [C, Rp/block].
    Scales are [rows, nb] with strides (1, rows): fp32 (1x128) as scaled_mm reads them, and uint8 E8M0 since
    a tile's scales are then a few contiguous runs instead of single bytes a row of scales apart.
    """
    r, c = x.shape
    mode = "both" if (row and col) else ("row" if row else "col")
    key = (block, mode + "+sums") if col_sums and (block, mode + "+sums") in TILES else (block, mode)
    t = tiles or TILES[key]
    if isinstance(t, Interleaved):
        if not (row and col):
            raise ValueError("quantize: the interleaved cast writes both layouts; give tile shapes for one layout")
        from kernels import mx_triton_interleaved

        return mx_triton_interleaved.quantize_both(x, block, e8m0, t, col_sums)
    tr, tc, nw, cap, per_prog, along_rows = tuple(t) + (0, 1, 0)[len(t) - 3:]  # defaults: no cap, one tile per program
    if (row and tc % block) or (col and tr % block):
        raise ValueError(f"quantize: tile ({tr}, {tc}) must hold whole {block}-blocks along the blocked dims")
    cp, rp = _ceil_to(c, block), _ceil_to(r, block)
    dev = x.device
    sdt = torch.uint8 if e8m0 else torch.float32

    def scale_buf(rows: int, nb: int) -> torch.Tensor:  # [rows, nb], column-major
        return torch.empty(nb, rows, dtype=sdt, device=dev).t()

    dummy8 = torch.empty(1, dtype=torch.uint8, device=dev)
    q = torch.empty(r, cp, dtype=torch.uint8, device=dev) if row else dummy8.view(1, 1)
    s = scale_buf(r, cp // block) if row else torch.empty(1, 1, dtype=sdt, device=dev)
    qt = torch.empty(c, rp, dtype=torch.uint8, device=dev) if col else dummy8.view(1, 1)
    st = scale_buf(c, rp // block) if col else torch.empty(1, 1, dtype=sdt, device=dev)
    row_tiles, n_col_tiles = triton.cdiv(rp if col else r, tr), triton.cdiv(cp if row else c, tc)
    grid = (-(-row_tiles // per_prog), n_col_tiles) if along_rows else (row_tiles, -(-n_col_tiles // per_prog))
    cs = torch.empty(row_tiles, c, dtype=torch.float32, device=dev) if col_sums else torch.empty(1, 1, device=dev)
    triton_launch.run(_quant_kernel, grid,
        x, r, c, x.stride(0), x.stride(1),
        q, q.stride(0), s, s.stride(0), s.stride(1), cp,
        qt, qt.stride(0), st, st.stride(0), st.stride(1), rp, cs, cs.stride(0),
        TR=tr, TC=tc, BLK=block, ROW=row, COL=col, E8M0=e8m0, COLSUM=col_sums, TILES_PER_PROG=per_prog,
        ALONG_ROWS=bool(along_rows), F32=col_sums and WIDEN_WITH_SUMS, num_warps=nw,
        **({"maxnreg": cap} if cap and x.is_cuda else {}),
    )
    f8 = torch.float8_e4m3fn
    rows = (q.view(f8), s, (r, c)) if row else None
    cols = (qt.view(f8), st, (c, r)) if col else None
    if col_sums:
        return rows, cols, cs.sum(0)
    return rows, cols


def quantize_tiles(w: torch.Tensor, tile: int = 128):
    """128x128-tile quantize of w [N, K] -> ((q [N, Kp], s [Nb, Kb]), (qt [K, Np], st [Kb, Nb]))."""
    n, k = w.shape
    np_, kp = _ceil_to(n, tile), _ceil_to(k, tile)
    dev = w.device
    q = torch.empty(n, kp, dtype=torch.uint8, device=dev)
    qt = torch.empty(k, np_, dtype=torch.uint8, device=dev)
    s = torch.empty(np_ // tile, kp // tile, dtype=torch.float32, device=dev)
    st = torch.empty(kp // tile, np_ // tile, dtype=torch.float32, device=dev)
    triton_launch.run(_tile_kernel, (np_ // tile, kp // tile),
        w, n, k, w.stride(0), w.stride(1),
        q, q.stride(0), qt, qt.stride(0), s, s.stride(0), st, st.stride(0), np_, kp,
        T=tile, num_warps=8,
    )
    f8 = torch.float8_e4m3fn
    return (q.view(f8), s), (qt.view(f8), st)


# (rows, cols, warps) of mx_dequantize: best of a 10-tile sweep on an H200 (benchmarks/RESULTS.md, 2026-12-03),
# 65536x4096 to bf16 in 0.216 ms (91% of copy); the other tiles of 256-1024 columns within 5%.
DEQUANT_TILES: tuple[int, int, int] = (8, 1024, 4)


def mx_dequantize(data: torch.Tensor, scale: torch.Tensor, shape: tuple[int, int],
                  dtype: torch.dtype) -> torch.Tensor:
    """Decode MXFP8 (data [R, Cp] e4m3, scale [R, Cp/32] uint8 of any strides) to ``dtype`` [R, C]."""
    r, c = shape
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"mx_dequantize: output dtype must be float32 or bfloat16, got {dtype}")
    bf16 = dtype == torch.bfloat16
    out = torch.empty(r, c, dtype=dtype, device=data.device)
    q = data.view(torch.uint8)
    tr, tc, nw = DEQUANT_TILES
    triton_launch.run(_mx_dequant_kernel, (triton.cdiv(r, tr), triton.cdiv(c, tc)),
        q, q.stride(0), scale, scale.stride(0), scale.stride(1),
        out.view(torch.int16) if bf16 else out, out.stride(0), r, c,
        TR=tr, TC=tc, BLK=32, BF16=bf16, num_warps=nw,
    )
    return out


# ---- rowwise (one scale per row and/or per column): an amax pass (atomic max per row / column into zeroed
# buffers), then a quantize pass that derives each scale from its amax; no device ops in between.


@triton.jit
def _pow2_scale(amax_bits, EMAX: tl.constexpr):
    """kernels.mx._scale_bits_ref(e8m0=False, emax=EMAX): (inverse-scale bits, scale bits, non-finite)."""
    e = amax_bits >> 23
    bad = e == 255
    t = e - EMAX + ((amax_bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    t = tl.where(e == 0, 1, tl.maximum(t, 1))
    return (254 - t) << 23, tl.where(bad, 0x7FC00000, t << 23), bad


@triton.jit
def _amax_rc_kernel(x_ptr, R, C, sxr, sxc, ra_ptr, ca_ptr,
                    TR: tl.constexpr, TC: tl.constexpr, ROW: tl.constexpr, COL: tl.constexpr):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rr = (pid_r * TR + tl.arange(0, TR)).to(tl.int64)
    cc = (pid_c * TC + tl.arange(0, TC)).to(tl.int64)
    inb = (rr[:, None] < R) & (cc[None, :] < C)
    x = tl.load(x_ptr + rr[:, None] * sxr + cc[None, :] * sxc, mask=inb, other=0.0).to(tl.float32)
    b = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF  # integer max: NaN > Inf > finite
    if ROW:
        tl.atomic_max(ra_ptr + rr, tl.max(b, axis=1), mask=rr < R)
    if COL:
        tl.atomic_max(ca_ptr + cc, tl.max(b, axis=0), mask=cc < C)


@triton.jit
def _apply_kernel(x_ptr, R, C, sxr, sxc, q_ptr, sqr, ra_ptr, rs_ptr, qt_ptr, sqtr, ca_ptr, cs_ptr,
                  TR: tl.constexpr, TC: tl.constexpr, ROW: tl.constexpr, COL: tl.constexpr):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rr = (pid_r * TR + tl.arange(0, TR)).to(tl.int64)
    cc = (pid_c * TC + tl.arange(0, TC)).to(tl.int64)
    inb = (rr[:, None] < R) & (cc[None, :] < C)
    x = tl.load(x_ptr + rr[:, None] * sxr + cc[None, :] * sxc, mask=inb, other=0.0).to(tl.float32)
    if ROW:
        inv, sb, bad = _pow2_scale(tl.load(ra_ptr + rr, mask=rr < R, other=0), 8)
        if pid_c == 0:  # one program per row block writes the row scales
            tl.store(rs_ptr + rr, sb.to(tl.float32, bitcast=True), mask=rr < R)
        code = _scaled_codes(x, inv[:, None], bad[:, None])
        tl.store(q_ptr + rr[:, None] * sqr + cc[None, :], code, mask=inb)
    if COL:
        inv, sb, bad = _pow2_scale(tl.load(ca_ptr + cc, mask=cc < C, other=0), 8)
        if pid_r == 0:
            tl.store(cs_ptr + cc, sb.to(tl.float32, bitcast=True), mask=cc < C)
        code = _scaled_codes(x, inv[None, :], bad[None, :])
        tl.store(qt_ptr + cc[:, None] * sqtr + rr[None, :], tl.trans(code),
                 mask=(cc[:, None] < C) & (rr[None, :] < R))


def quantize_rowwise(x: torch.Tensor, row: bool, col: bool, tr: int = 64, tc: int = 128):
    """Rowwise (per-row) and/or per-column quantize with ``kernels.mx``'s power-of-two rule.
    Returns ((q [R, C], scale [R, 1]) | None, (qt [C, R], scale [C, 1]) | None), each with its shape."""
    r, c = x.shape
    dev = x.device
    grid = (max(1, triton.cdiv(r, tr)), max(1, triton.cdiv(c, tc)))
    one = torch.zeros(1, dtype=torch.int32, device=dev)
    ra = torch.zeros(r, dtype=torch.int32, device=dev) if row else one
    ca = torch.zeros(c, dtype=torch.int32, device=dev) if col else one
    if r and c:
        triton_launch.run(_amax_rc_kernel, grid, x, r, c, x.stride(0), x.stride(1), ra, ca, TR=tr, TC=tc, ROW=row,
                          COL=col, num_warps=4)
    rs = torch.empty(r, 1, dtype=torch.float32, device=dev) if row else torch.empty(1, dtype=torch.float32, device=dev)
    cs = torch.empty(c, 1, dtype=torch.float32, device=dev) if col else torch.empty(1, dtype=torch.float32, device=dev)
    q = torch.empty(r, c, dtype=torch.uint8, device=dev) if row else torch.empty(1, 1, dtype=torch.uint8, device=dev)
    qt = torch.empty(c, r, dtype=torch.uint8, device=dev) if col else torch.empty(1, 1, dtype=torch.uint8, device=dev)
    triton_launch.run(_apply_kernel, grid, x, r, c, x.stride(0), x.stride(1), q, q.stride(0), ra, rs, qt, qt.stride(0),
                      ca, cs, TR=tr, TC=tc, ROW=row, COL=col, num_warps=4)
    f8 = torch.float8_e4m3fn
    rows = (q.view(f8), rs, (r, c)) if row else None
    cols = (qt.view(f8), cs, (c, r)) if col else None
    return rows, cols
