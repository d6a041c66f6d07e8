"""Both layouts of a block cast from rows read in fours, behind :func:`kernels.mx_triton.quantize`.

The one-read cast of :mod:`kernels.mx_triton` transposes a tile's 1-byte codes through shared memory a byte at a
time. Here a program reads its [block, block] tile as four [block/4, block] row tiles (rows 4g, 4g+1, 4g+2,
4g+3 of the tile), which Triton lays out alike, so the codes of one column in four consecutive rows pack into one
4-byte word in registers (on the GPU two paired fp32 -> e4m3 conversions fill it) and the transposed layout leaves
as words. Codes, scales and column sums are those of the PyTorch reference, bit for bit (the element encoding is
:mod:`kernels.mx_triton`'s). The 1x128 casts take it (``mx_triton.TILES``); MX's 32-row tiles are faster one-read
(benchmarks/RESULTS.md, 2026-12-06).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import triton_launch
from kernels.mx_triton import HW_CVT, Interleaved, _amax_bits, _ceil_to, _scale_from_amax, _scaled_codes


@triton.jit
def _abs_bits(x):
    """|x| as integer bits of x's width, bf16 or fp32 (an integer max orders them NaN > Inf > finite)."""
    if x.dtype == tl.bfloat16:
        return x.to(tl.int16, bitcast=True) & 0x7FFF
    else:
        return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _codes_word(x0, x1, x2, x3, inv_bits, bad):
    """e4m3 codes of ``x0..x3 * inv`` (as ``_scaled_codes``) packed into one int32, x0's in the low byte."""
    if HW_CVT:  # two paired conversions fill the word: no byte extraction and merging after them
        s = tl.where(bad, float("nan"), inv_bits.to(tl.float32, bitcast=True))
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; "
            "mov.b32 $0, {lo, hi}; }",
            "=r,f,f,f,f", [x0.to(tl.float32) * s, x1.to(tl.float32) * s, x2.to(tl.float32) * s, x3.to(tl.float32) * s],
            dtype=tl.int32, is_pure=True, pack=1)
    else:
        return (_scaled_codes(x0, inv_bits, bad).to(tl.int32) | (_scaled_codes(x1, inv_bits, bad).to(tl.int32) << 8)
                | (_scaled_codes(x2, inv_bits, bad).to(tl.int32) << 16)
                | (_scaled_codes(x3, inv_bits, bad).to(tl.int32) << 24))


@triton.jit
def _store_scales(ptr, stored, mask, E8M0: tl.constexpr):
    """Scales as E8M0 bytes or as fp32 (``stored`` holds their bits either way)."""
    if E8M0:
        tl.store(ptr, stored.to(tl.uint8), mask=mask)
    else:
        tl.store(ptr, stored.to(tl.float32, bitcast=True), mask=mask)


@triton.jit
def _row_blocks(x, rows, cols, R, CP, q_ptr, sqr, s_ptr, ssc, pid_c, E8M0: tl.constexpr):
    """Cast a [G, BLK] row tile in blocks along its columns: codes to q, one scale per row to s."""
    inv, stored, bad = _scale_from_amax(_amax_bits(x, 1), E8M0)
    code = _scaled_codes(x, inv[:, None], bad[:, None])
    tl.store(q_ptr + rows[:, None].to(tl.int64) * sqr + cols[None, :], code,
             mask=(rows[:, None] < R) & (cols[None, :] < CP))
    _store_scales(s_ptr + rows + pid_c * ssc, stored, rows < R, E8M0)


@triton.jit
def _both_kernel(
    x_ptr, R, C, sxr, sxc,
    q_ptr, sqr, s_ptr, ssc, CP,
    qw_ptr, sqwr, st_ptr, sstc, cs_ptr, scs,
    BLK: tl.constexpr, E8M0: tl.constexpr, COLSUM: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    G: tl.constexpr = BLK // 4
    g = tl.arange(0, G)
    r0 = pid_r * BLK + 4 * g  # first of each group's four rows
    cols = pid_c * BLK + tl.arange(0, BLK)
    inc = cols[None, :] < C
    p = x_ptr + r0[:, None].to(tl.int64) * sxr + cols[None, :].to(tl.int64) * sxc
    x0 = tl.load(p, mask=(r0[:, None] < R) & inc, other=0.0)
    x1 = tl.load(p + sxr, mask=(r0[:, None] + 1 < R) & inc, other=0.0)
    x2 = tl.load(p + 2 * sxr, mask=(r0[:, None] + 2 < R) & inc, other=0.0)
    x3 = tl.load(p + 3 * sxr, mask=(r0[:, None] + 3 < R) & inc, other=0.0)
    if x0.dtype != tl.bfloat16:  # bf16 stays 16-bit until each product with its scale; others widen, as there
        x0, x1, x2, x3 = x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32), x3.to(tl.float32)
    _row_blocks(x0, r0, cols, R, CP, q_ptr, sqr, s_ptr, ssc, pid_c, E8M0)
    _row_blocks(x1, r0 + 1, cols, R, CP, q_ptr, sqr, s_ptr, ssc, pid_c, E8M0)
    _row_blocks(x2, r0 + 2, cols, R, CP, q_ptr, sqr, s_ptr, ssc, pid_c, E8M0)
    _row_blocks(x3, r0 + 3, cols, R, CP, q_ptr, sqr, s_ptr, ssc, pid_c, E8M0)
    # column blocks: the four tiles' |x| merged elementwise first, so one reduction runs across the program
    a = tl.maximum(tl.maximum(_abs_bits(x0), _abs_bits(x1)), tl.maximum(_abs_bits(x2), _abs_bits(x3)))
    amax = tl.max(a, axis=0).to(tl.int32)
    if x0.dtype == tl.bfloat16:
        amax = amax << 16  # bf16 bits are the fp32 value's upper half
    inv, stored, bad = _scale_from_amax(amax, E8M0)
    word = _codes_word(x0, x1, x2, x3, inv[None, :], bad[None, :])
    tl.store(qw_ptr + cols[None, :].to(tl.int64) * sqwr + (pid_r * G + g[:, None]), word, mask=inc)
    _store_scales(st_ptr + cols + pid_r * sstc, stored, cols < C, E8M0)
    if COLSUM:  # per-tile column sums (the bias gradient when x is dY), reduced on the host side
        xs = (x0.to(tl.float32) + x1.to(tl.float32)) + (x2.to(tl.float32) + x3.to(tl.float32))
        tl.store(cs_ptr + pid_r * scs + cols, tl.sum(xs, axis=0), mask=cols < C)


def quantize_both(x: torch.Tensor, block: int, e8m0: int, shape: Interleaved, col_sums: bool = False):
    """Both layouts of ``x`` in ``block``-blocks, as :func:`kernels.mx_triton.quantize` with ``row`` and ``col``
    (same outputs and layouts, column sums as its third item with ``col_sums``)."""
    r, c = x.shape
    cp, rp = _ceil_to(c, block), _ceil_to(r, block)
    dev = x.device
    sdt = torch.uint8 if e8m0 else torch.float32
    q = torch.empty(r, cp, dtype=torch.uint8, device=dev)
    s = torch.empty(cp // block, r, dtype=sdt, device=dev).t()  # column-major scales, as the one-read cast's
    qt = torch.empty(c, rp, dtype=torch.uint8, device=dev)
    st = torch.empty(rp // block, c, dtype=sdt, device=dev).t()
    qw = qt.view(torch.int32)  # rp is a multiple of 4: each row of qt holds whole words
    row_tiles = rp // block
    cs = torch.empty(row_tiles, c, dtype=torch.float32, device=dev) if col_sums else torch.empty(1, 1, device=dev)
    triton_launch.run(_both_kernel, (row_tiles, cp // block),
        x, r, c, x.stride(0), x.stride(1),
        q, q.stride(0), s, s.stride(1), cp,
        qw, qw.stride(0), st, st.stride(1), cs, cs.stride(0),
        BLK=block, E8M0=e8m0, COLSUM=col_sums, num_warps=shape.warps,
        **({"maxnreg": shape.cap} if shape.cap and x.is_cuda else {}),
    )
    f8 = torch.float8_e4m3fn
    rows, cols = (q.view(f8), s, (r, c)), (qt.view(f8), st, (c, r))
    return (rows, cols, cs.sum(0)) if col_sums else (rows, cols)
