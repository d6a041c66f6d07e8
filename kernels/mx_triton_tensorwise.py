"""Tensorwise FP8 quantizers (one scale per tensor) behind :mod:`kernels.mx`: the amax pass, and the cast
pass writing one or both layouts, with current or delayed scaling. Element encoding as in
:mod:`kernels.mx_triton` (the GPU's cvt; integer encoders under the interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import triton_launch
from kernels.mx_triton import HW_CVT, _ceil_to, _encode_e4m3, _encode_e5m2, _pow2_scale

# ---- tensorwise (one scale per tensor). Current scaling: an amax pass, then one cast pass writing one or both
# layouts; three launches per tensor (zero fill, amax, cast) and no other device ops: the cast pass derives the
# scale from the amax itself, so a layer's many small tensors do not pay a string of tiny scale kernels.
# Delayed scaling: one cast pass per tensor, its scale from an amax history of earlier steps (a ring of int64
# slots ``(step << 31) | amax_bits``), recording this tensor's amax into the current step's slot as it casts.

# (rows, cols, warps) of the cast pass and of each loop step of the amax pass: best of a 5-tile sweep (cast) and
# a 6-tile x 3-program-count sweep (amax) on an H200 (benchmarks/RESULTS.md, 2026-11-30): the amax pass reads
# 65536x4096 bf16 in 0.134 ms (98% of copy) with (64, 128, 4), 0.33 ms before; 528 to 2112 programs time alike.
TENSORWISE_TILES: tuple[int, int, int] = (64, 128, 4)
TENSORWISE_AMAX_TILES: tuple[int, int, int] = (64, 128, 4)
TENSORWISE_AMAX_PROGRAMS = 1024  # programs of the amax pass in all (each loops over its share of the row tiles)
# The recording (delayed-scaling) cast: its tiles and programs in all (each loops over its share of the row tiles);
# best of a 5-tile x 4-program-count sweep on an H200 (benchmarks/RESULTS.md, 2026-11-30, fourth round): both
# layouts of 65536x4096 bf16 in 0.545 ms (48% of copy); the other counts and tiles within 2%.
TENSORWISE_DELAYED_TILES: tuple[int, int, int] = (32, 128, 4)
TENSORWISE_CAST_PROGRAMS = 4224
# The recording cast that also sums x's columns (dY in the backward: the bias gradient from the same read): the
# column sums take a register per element, and taller, narrower tiles with fewer programs keep that cheaper; best
# of a 10-tile x 3-program-count sweep on an H200 (benchmarks/RESULTS.md, 2026-12-03): both layouts + sums of
# 65536x4096 bf16 in 0.359-0.361 ms (72% of copy), 0.400-0.404 (64%) at the cast's own tiles.
TENSORWISE_COLSUM_TILES: tuple[int, int, int] = (64, 64, 4)
TENSORWISE_COLSUM_PROGRAMS = 2112
# The recording casts that compute the GELU (or its backward) as they read (``act``): an erf and an exp per element
# make them instruction-bound, and 8 warps on 32x128 tiles hide that best of 6 tiles on an H100 (65536x4096 bf16,
# both layouts: GELU 0.531 ms against 0.622 at the cast's own tiles; GELU backward + sums 0.795 against 1.013 at
# the column-sum tiles; benchmarks/fp8_mlp.py casts, RESULTS.md 2026-12-06).
TENSORWISE_ACT_TILES: tuple[int, int, int] = (32, 128, 8)
TENSORWISE_PAD = 16  # keep equal to kernels.mx.TENSORWISE_PAD
_FMT = {"e4m3": (0, 448.0, 8), "e5m2": (1, 57344.0, 15)}
_DUMMIES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _cdiv(n: int, d: int) -> int:
    return -(-n // d)  # plain Python: triton.cdiv is a JIT constexpr function, microseconds per host call


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _dummy(dev: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A [1, 1] placeholder for a pointer argument a kernel does not use (one per device and dtype, reused:
    an allocation per call costs host time the host-bound layer step does not have)."""
    t = _DUMMIES.get((dev, dtype))
    if t is None:
        t = _DUMMIES[(dev, dtype)] = torch.zeros(1, 1, dtype=dtype, device=dev)
    return t


@triton.jit
def _history_amax(hist_ptr, STEP, NSLOT: tl.constexpr, NSLOT_P2: tl.constexpr, WINDOW: tl.constexpr):
    """Max amax bits over the ring's slots recorded in steps STEP - WINDOW .. STEP - 1 (kernels.mx
    ``tensorwise_history_amax_ref``); slots of older steps, and the current step's, do not count."""
    i = tl.arange(0, NSLOT_P2)
    v = tl.load(hist_ptr + i, mask=i < NSLOT, other=0)
    s = v >> 31
    ok = (s >= STEP - WINDOW) & (s < STEP)
    return tl.max(tl.where(ok, v & 0x7FFFFFFF, 0), axis=0).to(tl.int32)


@triton.jit
def _amax_all_kernel(x_ptr, R, C, sxr, sxc, amax_ptr, ROW_STEP, cs_ptr, scs,
                     TR: tl.constexpr, TC: tl.constexpr, COLSUM: tl.constexpr):
    """|x| max over the whole matrix as fp32 bits (integer max: NaN > Inf > finite): each program walks row
    tiles pid_r, pid_r + ROW_STEP, ... of one column tile, then one atomic max into ``amax_ptr`` (zeroed).
    ``COLSUM``: each program also writes the fp32 column sums of its rows to ``cs[pid_r, cols]`` (the bias
    gradient when x is dY, from the same read), reduced over the ROW_STEP rows of ``cs`` by the caller."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    cc = (pid_c * TC + tl.arange(0, TC)).to(tl.int64)
    acc = tl.zeros((TR, TC), dtype=tl.int32)
    csum = tl.zeros((TR, TC), dtype=tl.float32)  # summed over its rows once, after the loop
    for r0 in range(pid_r * TR, R, ROW_STEP * TR):
        rr = (r0 + tl.arange(0, TR)).to(tl.int64)
        x = tl.load(x_ptr + rr[:, None] * sxr + cc[None, :] * sxc, mask=(rr[:, None] < R) & (cc[None, :] < C),
                    other=0.0).to(tl.float32)
        acc = tl.maximum(acc, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
        if COLSUM:
            csum += x
    tl.atomic_max(amax_ptr, tl.max(tl.max(acc, axis=1), axis=0))
    if COLSUM:
        tl.store(cs_ptr + pid_r * scs + cc, tl.sum(csum, axis=0), mask=cc < C)


@triton.jit
def _gelu_prologue(x, u_ptr, offs, ok, ACT: tl.constexpr):
    """The tensor the cast quantizes, from what it read: ``gelu(x)`` (ACT 1) or ``x * gelu'(u)`` (ACT 2, x = dh,
    the gradient of the GELU's output), in fp32 with torch's formulas (exact erf GELU), rounded to the input's
    dtype as ``nn.GELU`` and its backward write it."""
    if ACT == 1:
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    else:
        u = tl.load(u_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        cdf = 0.5 * (1.0 + tl.math.erf(u * 0.7071067811865476))
        pdf = tl.exp(-0.5 * u * u) * 0.3989422804014327
        x = x * (cdf + u * pdf)
    return x.to(u_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _cast_tile(x_ptr, rr, cc, R, C, sxr, sxc, inv, bad, q_ptr, sqr, CP, qt_ptr, sqtr, RP, u_ptr,
               ROW: tl.constexpr, COL: tl.constexpr, E5M2: tl.constexpr, FMAX: tl.constexpr,
               NAN_ELEMENTS: tl.constexpr, ACT: tl.constexpr = 0):
    """Cast one [TR, TC] tile (rows rr, columns cc) and store its codes; returns (x in fp32, |x| bits).
    ``ACT``: cast the GELU of what it read (1) or the GELU's input gradient (2, see ``_gelu_prologue``)."""
    offs = rr[:, None] * sxr + cc[None, :] * sxc
    ok = (rr[:, None] < R) & (cc[None, :] < C)
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    if ACT != 0:
        x = _gelu_prologue(x, u_ptr, offs, ok, ACT)
    ab = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    # fp32 inputs keep the integer encoder: the cvt's codes of an fp32 tile came out wrong on the GPU (Triton 3.6,
    # an H200); 16-bit inputs, what the layers cast, were right bit for bit
    if HW_CVT and x_ptr.dtype.element_ty != tl.float32:
        # The cvt saturates finite values to +-FMAX and turns NaN into 0x7F: no clamp, and a non-finite tensor's
        # scale is NaN. Inf elements would saturate, so a delayed scale marks them NaN first.
        y = x * tl.where(bad, float("nan"), inv.to(tl.float32, bitcast=True))
        if NAN_ELEMENTS:  # a delayed scale never saw this tensor's NaN/Inf: mark them per element
            y = tl.where(ab >= 0x7F800000, float("nan"), y)
        if E5M2:
            code = y.to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
        else:
            code = y.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    else:
        y = tl.minimum(tl.maximum(x * inv.to(tl.float32, bitcast=True), -FMAX), FMAX)
        if E5M2:
            code = _encode_e5m2(y)
        else:
            code = _encode_e4m3(y)
        if NAN_ELEMENTS:  # a delayed scale never saw this tensor's NaN/Inf: mark them per element
            code = tl.where(bad | (ab >= 0x7F800000), 0x7F, code).to(tl.uint8)
        else:
            code = tl.where(bad, 0x7F, code).to(tl.uint8)
    if ROW:
        tl.store(q_ptr + rr[:, None] * sqr + cc[None, :], code, mask=(rr[:, None] < R) & (cc[None, :] < CP))
    if COL:
        # transposed addresses rather than tl.trans(code): with the cvt's 8-bit codes, the tl.trans form came out
        # wrong on the GPU for fp32 inputs (Triton 3.6, an H200)
        tl.store(qt_ptr + cc[None, :] * sqtr + rr[:, None], code, mask=(cc[None, :] < C) & (rr[:, None] < RP))
    return x, ab


@triton.jit(do_not_specialize=["STEP"])
def _tensorwise_cast_kernel(x_ptr, R, C, sxr, sxc, amax_ptr, scale_ptr, q_ptr, sqr, CP, qt_ptr, sqtr, RP,
                            hist_ptr, STEP, cs_ptr, scs, NR, ROW_STEP, u_ptr,
                            TR: tl.constexpr, TC: tl.constexpr, ROW: tl.constexpr, COL: tl.constexpr,
                            E5M2: tl.constexpr, FMAX: tl.constexpr, EMAX: tl.constexpr,
                            DELAYED: tl.constexpr, RECORD: tl.constexpr, NSLOT: tl.constexpr,
                            NSLOT_P2: tl.constexpr, WINDOW: tl.constexpr, COLSUM: tl.constexpr,
                            LOOP: tl.constexpr, ACT: tl.constexpr = 0):
    """Codes of x into q [R, CP] (ROW) and into the transposed qt [C, RP] (COL), one read of x; padding
    rows/columns get code 0. Program (0, 0) writes the scale.

    Current scaling (not DELAYED): the scale from ``amax_ptr`` (this tensor's amax); a non-finite tensor gets
    NaN codes. DELAYED: the scale from the history ring ``hist_ptr`` (steps STEP - WINDOW .. STEP - 1); elements
    beyond it saturate to +-FMAX, non-finite elements get the NaN code, a non-finite history makes all codes NaN.
    RECORD: this tensor's amax, tagged with STEP, atomically maxed into slot STEP % NSLOT.
    COLSUM: fp32 column sums into ``cs[pid_r, cols]`` (summed over pid_r by the caller).
    LOOP: each program walks row tiles pid_r, pid_r + ROW_STEP, ... (below NR) and keeps the amax and the
    column sums in registers, so the reductions and the atomic happen once per program, not once per tile;
    otherwise one tile per program. ACT (1: GELU of x, 2: x * GELU'(u), u in ``u_ptr`` laid out as x; DELAYED
    only, the amax being that of the activated tensor): the codes, amax and sums are those of the activated x."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    if DELAYED:
        amax = _history_amax(hist_ptr, STEP, NSLOT, NSLOT_P2, WINDOW)
    else:
        amax = tl.load(amax_ptr)
    inv, sbits, bad = _pow2_scale(amax, EMAX)
    if (pid_r == 0) & (pid_c == 0):
        tl.store(scale_ptr, sbits.to(tl.float32, bitcast=True))
    cc = (pid_c * TC + tl.arange(0, TC)).to(tl.int64)
    if LOOP:
        acc = tl.zeros((TR, TC), dtype=tl.int32)
        # column sums kept per element (one add each) and reduced over the rows once, after the loop; a
        # reduction across threads per tile made the pass 0.62 ms against 0.48 (65536x4096, both layouts)
        csum = tl.zeros((TR, TC), dtype=tl.float32)
        for r0 in range(pid_r * TR, NR, ROW_STEP * TR):
            rr = (r0 + tl.arange(0, TR)).to(tl.int64)
            x, ab = _cast_tile(x_ptr, rr, cc, R, C, sxr, sxc, inv, bad, q_ptr, sqr, CP, qt_ptr, sqtr, RP, u_ptr,
                               ROW, COL, E5M2, FMAX, DELAYED, ACT)
            if RECORD:
                acc = tl.maximum(acc, ab)
            if COLSUM:
                csum += x
        if RECORD:  # skip the atomic where the slot already holds a larger value (most programs, after the first)
            packed = (tl.cast(STEP, tl.int64) << 31) | tl.max(tl.max(acc, axis=1), axis=0).to(tl.int64)
            slot = hist_ptr + STEP % NSLOT
            tl.atomic_max(slot, packed, mask=packed > tl.load(slot))
        if COLSUM:
            tl.store(cs_ptr + pid_r * scs + cc, tl.sum(csum, axis=0), mask=cc < C)
    else:  # current scaling: one tile per program (RECORD and COLSUM need LOOP)
        rr = (pid_r * TR + tl.arange(0, TR)).to(tl.int64)
        _cast_tile(x_ptr, rr, cc, R, C, sxr, sxc, inv, bad, q_ptr, sqr, CP, qt_ptr, sqtr, RP, u_ptr,
                   ROW, COL, E5M2, FMAX, DELAYED, ACT)


def tensorwise_amax(x: torch.Tensor, tiles: tuple[int, int, int] | None = None,
                    row_step: int | None = None, col_sums: bool = False):
    """|x| max as fp32 bits in a [1] int32 device tensor (NaN > Inf > finite); no host sync.
    ``row_step``: programs along the rows (default: about ``TENSORWISE_AMAX_PROGRAMS`` programs in all; on CPU
    one per row tile). ``col_sums``: return ``(amax, fp32 column sums of x [C])``, summed in the same read."""
    r, c = x.shape
    tr, tc, nw = tiles or TENSORWISE_AMAX_TILES
    amax = torch.zeros(1, dtype=torch.int32, device=x.device)
    col_tiles, row_tiles = _cdiv(c, tc), _cdiv(r, tr)
    # enough programs to fill the GPU a few times over; each loops over its share of the row tiles
    if row_step is None:
        row_step = max(1, min(row_tiles, TENSORWISE_AMAX_PROGRAMS // col_tiles)) if x.is_cuda else row_tiles
    cs = torch.empty(row_step, c, dtype=torch.float32, device=x.device) if col_sums else \
        _dummy(x.device, torch.float32)
    if r and c:
        triton_launch.run(_amax_all_kernel, (row_step, col_tiles), x, r, c, x.stride(0), x.stride(1), amax, row_step,
                          cs, cs.stride(0), TR=tr, TC=tc, COLSUM=col_sums, num_warps=nw)
    elif col_sums:
        cs.zero_()
    return (amax, cs.sum(0)) if col_sums else amax


def quantize_tensorwise(x: torch.Tensor, row: bool, col: bool, fmt: str,
                        tiles: tuple[int, int, int] | None = None, col_sums: bool = False,
                        history: torch.Tensor | None = None, step: int = 0, window: int = 0,
                        use_history: bool = False, row_step: int | None = None, act: int = 0,
                        act_input: torch.Tensor | None = None, margin: int = 0):
    """Tensorwise quantize. Returns ((q [R, Cp], scale [], (R, C)) | None, (qt [C, Rp], scale [], (C, R)) | None),
    Cp/Rp rounded up to 16 (zero padding); with ``col_sums`` a third item, the fp32 column sums of ``x``
    (summed by the pass that reads ``x`` first).

    ``history`` (int64 [window + 1] ring, see kernels.mx.DelayedScale): the cast records this tensor's amax for
    ``step``; with ``use_history`` the scale comes from the ring (one pass over ``x``, no amax pass), else from
    an amax pass as in current scaling; ``margin`` binades of headroom on a scale from the ring. A recording
    cast loops over row tiles (``row_step`` programs along the rows; default: about ``TENSORWISE_CAST_PROGRAMS``
    in all on a GPU, ``TENSORWISE_COLSUM_PROGRAMS`` with column sums, half the row tiles on CPU).

    ``act`` (delayed scaling with history only: the one pass computes the activation): 1 quantizes ``gelu(x)``,
    2 quantizes ``x * gelu'(act_input)`` (x the gradient of the GELU's output, ``act_input`` its input, same
    shape and strides as x); both rounded to x's dtype first, as the unfused layers would hold them."""
    r, c = x.shape
    dev = x.device
    e5, fmax, emax = _FMT[fmt]
    dt = torch.float8_e5m2 if e5 else torch.float8_e4m3fn
    cp, rp = _ceil_to(c, TENSORWISE_PAD), _ceil_to(r, TENSORWISE_PAD)
    record = history is not None
    delayed = record and use_history
    if delayed:
        emax -= margin  # the scale covers 2**margin x the history's amax
    if act and not delayed:
        raise ValueError("quantize_tensorwise: act needs delayed scaling with history (no amax pass to fuse into)")
    if act == 2 and (act_input is None or act_input.shape != x.shape or act_input.stride() != x.stride()
                     or act_input.dtype != x.dtype):
        raise ValueError("quantize_tensorwise: act=2 needs act_input of x's shape, strides and dtype")
    sums = None
    if delayed:
        amax = _dummy(dev, torch.int32)
    elif col_sums:
        amax, sums = tensorwise_amax(x, col_sums=True)
    else:
        amax = tensorwise_amax(x)
    scale = torch.empty((), dtype=torch.float32, device=dev)
    cs_here = col_sums and delayed
    tr, tc, nw = tiles or (TENSORWISE_ACT_TILES if act else TENSORWISE_COLSUM_TILES if cs_here else
                           TENSORWISE_DELAYED_TILES if record else TENSORWISE_TILES)
    dummy = _dummy(dev, torch.uint8)
    q = torch.empty(r, cp, dtype=torch.uint8, device=dev) if row else dummy
    qt = torch.empty(c, rp, dtype=torch.uint8, device=dev) if col else dummy
    nr = rp if col else r
    row_tiles, col_tiles = max(1, _cdiv(nr, tr)), max(1, _cdiv(cp if row else c, tc))
    loop = record or cs_here
    if not loop:
        row_step = row_tiles
    elif row_step is None:
        programs = TENSORWISE_COLSUM_PROGRAMS if cs_here else TENSORWISE_CAST_PROGRAMS
        row_step = max(1, min(row_tiles, programs // col_tiles)) if x.is_cuda else \
            _cdiv(row_tiles, 2)
    cs = torch.empty(row_step, c, dtype=torch.float32, device=dev) if cs_here else _dummy(dev, torch.float32)
    nslot = history.shape[0] if record else 1
    triton_launch.run(_tensorwise_cast_kernel, (row_step, col_tiles),
        x, r, c, x.stride(0), x.stride(1), amax, scale, q, q.stride(0), cp, qt, qt.stride(0), rp,
        history if record else _dummy(dev, torch.int64), step, cs, cs.stride(0), nr, row_step,
        act_input if act == 2 else x,
        TR=tr, TC=tc, ROW=row, COL=col, E5M2=bool(e5), FMAX=fmax, EMAX=emax, DELAYED=delayed, RECORD=record,
        NSLOT=nslot, NSLOT_P2=_next_pow2(nslot), WINDOW=window, COLSUM=cs_here, LOOP=loop, ACT=act, num_warps=nw)
    if cs_here:
        sums = cs.sum(0)
    rows = (q.view(dt), scale, (r, c)) if row else None
    cols = (qt.view(dt), scale, (c, r)) if col else None
    return (rows, cols, sums) if col_sums else (rows, cols)
