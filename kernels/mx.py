"""Block-scaled FP8 formats: OCP MX (MXFP8) and the Hopper scaled-GEMM recipes.

Formats (all elements are ``torch.float8_e4m3fn``; max normal 448):

* **MXFP8** (OCP Microscaling Formats spec v1.0): one E8M0 scale per 32 consecutive elements along
  the reduction dimension. Scales are stored as ``uint8`` biased exponents (value ``2**(s - 127)``,
  ``s = 255`` is NaN). Encoding follows section 6.3 of the spec: ``X = 2**(floor(log2(amax)) - 8)``
  (8 = emax of E4M3), elements ``V / X`` rounded to nearest-even and saturated to +-448 (values in
  (448, 512) of the scaled block clamp to 448: the spec's saturating conversion). Scale exponents
  below -127 clamp to -127. A block holding NaN or +-Inf gets the NaN scale (255) and NaN elements
  (0x7F), so it decodes to NaN, as the spec says for a NaN scale.
  ``scale_rule="ceil"`` keeps the format (E8M0 scales, e4m3 elements, 32-blocks) but rounds the scale exponent
  up where the floor rule would saturate (a block max whose mantissa exceeds E4M3's 1.75): ``X =
  2**ceil(log2(amax / 448))``, as the Hopper recipes below, so nothing saturates. The spec's floor rule clips a
  block's largest values by up to 12.5%; in training that costs measurable held-out NE (benchmarks/RESULTS.md,
  MX scale rule), the ceil rule about as much as the other FP8 recipes.
* **Hopper recipes** (fp32 scales, laid out as ``torch.nn.functional.scaled_mm`` reads them):
  ``1x128`` blocks (activations and gradients), ``128x128`` tiles (weights), ``rowwise`` and ``tensorwise``
  (one scale per tensor; gradients may use e5m2, whose wider range suits one scale over a whole tensor). Their
  scales are powers of two chosen so nothing saturates (``2**ceil(log2(amax / 448))``): dividing by a
  power of two is exact, so quantization is bit-reproducible on every backend, and E4M3's relative
  precision does not depend on where in its range a block lands, so nothing is lost against a
  non-power-of-two scale. Non-finite blocks get a NaN scale and NaN elements. The tensorwise recipe's delayed
  scaling (:class:`DelayedScale`) takes its scale from earlier steps' amaxes instead, so there values beyond it
  saturate to the format's max.

Layouts. ``axis=1`` quantizes blocks along each row (the contiguous dim) of ``x [R, C]`` and returns
``data [R, Cp]``; ``axis=0`` quantizes blocks along columns and returns the *transposed* layout
``data [C, Rp]`` (the quantization of ``x.T``), which is what the backward GEMMs read
(``dW = dY^T X`` reduces over tokens). ``Rp``/``Cp`` round the reduction length up to the block size;
the padding holds zeros, so it adds nothing to a GEMM.

Every quantizer has a PyTorch reference (``backend="ref"``, any device) and a Triton kernel
(``backend="triton"``; on CPU it runs under ``TRITON_INTERPRET=1``); the two are bit-identical.
``backend="auto"`` picks Triton on CUDA and the reference elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

MX_BLOCK = 32
HOPPER_BLOCK = 128
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
E8M0_NAN = 255
MX_SCALE_RULES = ("floor", "ceil")  # "floor": the OCP spec's rule (saturating); "ceil": nothing saturates
# Scale encodings the quantizer kernels take (their E8M0 argument): fp32 powers of two (ceil), or E8M0 bytes
# with the floor or the ceil rule. True/False read as E8M0 floor / fp32.
SCALE_FP32, SCALE_E8M0_FLOOR, SCALE_E8M0_CEIL = 0, 1, 2
_NAN_CODE = 0x7F  # e4m3fn NaN (positive)
_BACKENDS = ("auto", "ref", "triton")


class MXFormatError(ValueError):
    """An input the block-scaled quantizers cannot take (shape, dtype, device or backend)."""


@dataclass
class MXTensor:
    """MXFP8 matrix: ``data`` [rows, cols_padded] e4m3, ``scale`` [rows, cols_padded // 32] uint8 (E8M0).

    Blocks run along dim 1 of ``data``. ``scale`` may be any strided view: the Triton cast writes it
    column-major (strides (1, rows)), the reference row-major. ``shape`` is the logical (unpadded) shape of the
    matrix held.
    """

    data: torch.Tensor
    scale: torch.Tensor
    shape: tuple[int, int]


@dataclass
class ScaledTensor:
    """Hopper-recipe FP8 matrix: ``data`` [rows, cols_padded] e4m3 (e5m2 for tensorwise gradients) and fp32
    power-of-two ``scale``.

    ``kind`` is ``"1x128"`` (scale [rows, cols_padded // 128], strides (1, rows): column-major, as
    ``scaled_mm`` wants), ``"rowwise"`` (scale [rows, 1]), ``"128x128"`` (scale
    [ceil(rows/128), cols_padded // 128], row-major) or ``"tensorwise"`` (scale: one element, shape []).
    Decoded value = ``data * scale`` (broadcast per block).
    """

    data: torch.Tensor
    scale: torch.Tensor
    shape: tuple[int, int]
    kind: str


# ----------------------------------------------------------------------------------------------
# helpers


def _ceil_to(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def _check_2d(x: torch.Tensor, where: str) -> None:
    if x.dim() != 2:
        raise MXFormatError(f"{where}: expected a 2-D tensor, got shape {tuple(x.shape)}; reshape to [rows, cols]")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise MXFormatError(f"{where}: expected float32/float16/bfloat16 input, got {x.dtype}")


def _pick_backend(backend: str, x: torch.Tensor, where: str) -> str:
    if backend not in _BACKENDS:
        raise MXFormatError(f"{where}: backend must be one of {_BACKENDS}, got {backend!r}")
    # The Triton quantizers encode with the GPU's fp8 conversion, which needs sm_89+ (as every FP8 GEMM does);
    # older GPUs (emulated recipes) quantize with the reference.
    fp8_gpu = x.is_cuda and torch.cuda.get_device_capability(x.device) >= (8, 9)
    if backend == "auto":
        return "triton" if fp8_gpu else "ref"
    if backend == "triton" and x.is_cuda and not fp8_gpu:
        raise MXFormatError(f"{where}: the Triton quantizers need a GPU of compute capability 8.9+ (fp8 "
                            "conversion); use backend='ref' or 'auto' on this GPU")
    return backend


def _pad_cols(x: torch.Tensor, block: int) -> torch.Tensor:
    cp = _ceil_to(x.shape[1], block)
    if cp == x.shape[1]:
        return x
    return torch.nn.functional.pad(x, (0, cp - x.shape[1]))


def _f32_from_bits(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


def _mx_code(scale_rule: str, where: str) -> int:
    if scale_rule not in MX_SCALE_RULES:
        raise MXFormatError(f"{where}: scale_rule must be one of {MX_SCALE_RULES}, got {scale_rule!r}")
    return SCALE_E8M0_CEIL if scale_rule == "ceil" else SCALE_E8M0_FLOOR


def _scale_bits_ref(amax_bits: torch.Tensor, e8m0: int, emax: int = 8
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From |x| max (as fp32 bits) -> (inverse-scale fp32 bits, stored scale, non-finite mask).

    ``e8m0``: one of the SCALE_* encodings. Stored scale: the E8M0 byte (floor or ceil rule) or the fp32 bits
    of the power-of-two scale (pow2-ceil).
    ``emax``: exponent of the element format's largest power of two (e4m3 8: 448 = 1.75 * 2^8; e5m2 15:
    57344 = 1.75 * 2^15); both maxima have mantissa 1.75, so the ceil rule below fits both.
    """
    e = amax_bits >> 23  # biased exponent; sign bit already cleared
    bad = e == 255
    mant = amax_bits & 0x7FFFFF
    carry = (mant > 0x600000).to(torch.int32)  # amax's mantissa above fmt_max's 1.75: one more power of two
    if e8m0:
        # floor(log2 amax) - emax(e4m3)=8 (the spec), or ceil(log2(amax / 448)) (ceil rule); clamped at 2^-127
        s = torch.clamp(e - 8 + (carry if e8m0 == SCALE_E8M0_CEIL else 0), min=0)
        s = torch.where(bad, torch.full_like(s, E8M0_NAN), s)
        inv = (254 - torch.clamp(s, max=254)) << 23  # 2^(127 - s); s=0 gives 2^127, still normal
        return inv, s, bad
    t = e - emax + carry  # ceil(log2(amax / fmt_max)), biased
    t = torch.where(e == 0, torch.ones_like(t), torch.clamp(t, min=1))
    inv = (254 - t) << 23
    sbits = torch.where(bad, torch.full_like(t, 0x7FC00000), t << 23)
    return inv, sbits, bad


def _quant_rows_ref(x: torch.Tensor, block: int, e8m0: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize blocks of ``block`` along dim 1 of a padded fp32 matrix. Returns (e4m3 data, scale)."""
    r, c = x.shape
    xb = x.reshape(r, c // block, block)
    amax_bits = (xb.view(torch.int32) & 0x7FFFFFFF).amax(dim=-1)
    inv, s, bad = _scale_bits_ref(amax_bits, e8m0)
    y = (xb * _f32_from_bits(inv).unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX)
    q = y.to(torch.float8_e4m3fn).view(torch.uint8)
    q = q.masked_fill(bad.unsqueeze(-1), _NAN_CODE)
    q = q.reshape(r, c).view(torch.float8_e4m3fn)
    if e8m0:
        return q, s.to(torch.uint8)
    return q, _f32_from_bits(s)


def _decode_scale_e8m0(s: torch.Tensor) -> torch.Tensor:
    si = s.to(torch.int32)
    bits = torch.where(si == 0, torch.full_like(si, 0x00400000), si << 23)  # 2^-127 is subnormal
    bits = torch.where(si == E8M0_NAN, torch.full_like(si, 0x7FC00000), bits)
    return _f32_from_bits(bits)


# ----------------------------------------------------------------------------------------------
# MXFP8


def mx_quantize_ref(x: torch.Tensor, axis: int = 1, scale_rule: str = "floor") -> MXTensor:
    """Reference MXFP8 quantization (PyTorch, any device). See the module docstring for layouts and
    ``scale_rule``."""
    _check_2d(x, "mx_quantize_ref")
    code = _mx_code(scale_rule, "mx_quantize_ref")
    if axis not in (0, 1):
        raise MXFormatError(f"mx_quantize_ref: axis must be 0 or 1, got {axis}")
    m = x.float() if axis == 1 else x.float().t()
    q, s = _quant_rows_ref(_pad_cols(m.contiguous(), MX_BLOCK), MX_BLOCK, e8m0=code)
    return MXTensor(q, s, (m.shape[0], m.shape[1]))


def mx_dequantize_ref(t: MXTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reference MXFP8 decode to ``dtype`` ([rows, cols], padding dropped)."""
    r, c = t.shape
    vals = t.data.float().reshape(r, -1, MX_BLOCK) * _decode_scale_e8m0(t.scale).unsqueeze(-1)
    return vals.reshape(r, -1)[:, :c].to(dtype)


def mx_quantize(x: torch.Tensor, axis: int = 1, backend: str = "auto", scale_rule: str = "floor") -> MXTensor:
    """MXFP8-quantize ``x [R, C]`` with 32-blocks along dim ``axis`` (axis=0 returns the x.T layout);
    ``scale_rule``: ``"floor"`` (the OCP spec) or ``"ceil"`` (nothing saturates; module docstring)."""
    if _pick_backend(backend, x, "mx_quantize") == "ref":
        return mx_quantize_ref(x, axis, scale_rule)
    _check_2d(x, "mx_quantize")
    code = _mx_code(scale_rule, "mx_quantize")
    from kernels import mx_triton

    rows, cols = mx_triton.quantize(x, MX_BLOCK, e8m0=code, row=axis == 1, col=axis == 0)
    out = rows if axis == 1 else cols
    return MXTensor(out[0], out[1], out[2])


def mx_quantize_both(x: torch.Tensor, backend: str = "auto", col_sums: bool = False,
                     scale_rule: str = "floor") -> tuple:
    """Both MXFP8 layouts of ``x`` (blocks along rows, and the x.T layout) from one read of ``x``.

    With ``col_sums`` a third item holds ``x.sum(0)`` in fp32 (the bias gradient when ``x`` is dY).
    """
    if _pick_backend(backend, x, "mx_quantize_both") == "ref":
        out = (mx_quantize_ref(x, 1, scale_rule), mx_quantize_ref(x, 0, scale_rule))
        return out + (x.float().sum(0),) if col_sums else out
    _check_2d(x, "mx_quantize_both")
    code = _mx_code(scale_rule, "mx_quantize_both")
    from kernels import mx_triton

    rows, cols, *sums = mx_triton.quantize(x, MX_BLOCK, e8m0=code, row=True, col=True, col_sums=col_sums)
    return (MXTensor(*rows), MXTensor(*cols), *sums)


def mx_dequantize(t: MXTensor, dtype: torch.dtype = torch.float32, backend: str = "auto") -> torch.Tensor:
    """Decode an :class:`MXTensor` to ``dtype`` (float32 or bfloat16)."""
    if _pick_backend(backend, t.data, "mx_dequantize") == "ref":
        return mx_dequantize_ref(t, dtype)
    from kernels import mx_triton

    return mx_triton.mx_dequantize(t.data, t.scale, t.shape, dtype)


# ----------------------------------------------------------------------------------------------
# Hopper recipes: 1x128, 128x128, rowwise (fp32 power-of-two scales)


def _colmajor(scale_rows_major: torch.Tensor) -> torch.Tensor:
    """[rows, nb] values -> same values in a [rows, nb] view with strides (1, rows)."""
    return scale_rows_major.t().contiguous().t()


def quantize_1x128_ref(x: torch.Tensor, axis: int = 1) -> ScaledTensor:
    """Reference 1x128 quantization; scale [rows, nb] column-major (strides (1, rows))."""
    _check_2d(x, "quantize_1x128_ref")
    m = x.float() if axis == 1 else x.float().t()
    q, s = _quant_rows_ref(_pad_cols(m.contiguous(), HOPPER_BLOCK), HOPPER_BLOCK, e8m0=False)
    return ScaledTensor(q, _colmajor(s), (m.shape[0], m.shape[1]), "1x128")


def quantize_1x128(x: torch.Tensor, axis: int = 1, backend: str = "auto") -> ScaledTensor:
    """1x128 blocks along dim ``axis`` of ``x`` (axis=0 returns the x.T layout)."""
    if _pick_backend(backend, x, "quantize_1x128") == "ref":
        return quantize_1x128_ref(x, axis)
    _check_2d(x, "quantize_1x128")
    from kernels import mx_triton

    rows, cols = mx_triton.quantize(x, HOPPER_BLOCK, e8m0=False, row=axis == 1, col=axis == 0)
    out = rows if axis == 1 else cols
    return ScaledTensor(out[0], out[1], out[2], "1x128")


def quantize_1x128_both(x: torch.Tensor, backend: str = "auto", col_sums: bool = False) -> tuple:
    """Both 1x128 layouts of ``x`` (rows for the forward, x.T for the weight gradient); with
    ``col_sums`` a third item holds ``x.sum(0)`` in fp32."""
    if _pick_backend(backend, x, "quantize_1x128_both") == "ref":
        out = (quantize_1x128_ref(x, 1), quantize_1x128_ref(x, 0))
        return out + (x.float().sum(0),) if col_sums else out
    _check_2d(x, "quantize_1x128_both")
    from kernels import mx_triton

    # One read (rows read in fours, mx_triton.TILES): on an H100 0.397 ms against 0.568 ms for the rows and columns
    # casts as two launches, 65536x4096 bf16 (benchmarks/RESULTS.md, 2026-12-06).
    rows, cols, *sums = mx_triton.quantize(x, HOPPER_BLOCK, e8m0=False, row=True, col=True, col_sums=col_sums)
    return (ScaledTensor(*rows, "1x128"), ScaledTensor(*cols, "1x128"), *sums)


def quantize_128x128_ref(w: torch.Tensor) -> tuple[ScaledTensor, ScaledTensor]:
    """Reference 128x128-tile quantization of a weight ``w [N, K]``.

    Returns ``(w_q, wt_q)``: ``w_q.data [N, Kp]`` and ``wt_q.data [K, Np]`` (the transposed copy the
    input-gradient GEMM reads) with scales ``[ceil(N/128), Kp/128]`` and its transpose.
    """
    _check_2d(w, "quantize_128x128_ref")
    n, k = w.shape
    np_, kp = _ceil_to(n, HOPPER_BLOCK), _ceil_to(k, HOPPER_BLOCK)
    wp = torch.nn.functional.pad(w.float(), (0, kp - k, 0, np_ - n))
    tiles = wp.reshape(np_ // 128, 128, kp // 128, 128).permute(0, 2, 1, 3)  # [nb, kb, 128, 128]
    amax_bits = (tiles.reshape(np_ // 128, kp // 128, -1).view(torch.int32) & 0x7FFFFFFF).amax(-1)
    inv, sbits, bad = _scale_bits_ref(amax_bits, e8m0=False)
    y = (tiles * _f32_from_bits(inv)[..., None, None]).clamp(-E4M3_MAX, E4M3_MAX)
    q = y.to(torch.float8_e4m3fn).view(torch.uint8).masked_fill(bad[..., None, None], _NAN_CODE)
    q = q.permute(0, 2, 1, 3).reshape(np_, kp)
    s = _f32_from_bits(sbits)
    wq = ScaledTensor(q[:n].contiguous().view(torch.float8_e4m3fn), s, (n, k), "128x128")
    wtq = ScaledTensor(q.t()[:k].contiguous().view(torch.float8_e4m3fn), s.t().contiguous(), (k, n), "128x128")
    return wq, wtq


def quantize_128x128(w: torch.Tensor, backend: str = "auto") -> tuple[ScaledTensor, ScaledTensor]:
    """128x128-tile quantization of ``w [N, K]`` and its transposed copy (see the reference)."""
    if _pick_backend(backend, w, "quantize_128x128") == "ref":
        return quantize_128x128_ref(w)
    _check_2d(w, "quantize_128x128")
    from kernels import mx_triton

    (q, s), (qt, st) = mx_triton.quantize_tiles(w)
    n, k = w.shape
    return ScaledTensor(q, s, (n, k), "128x128"), ScaledTensor(qt, st, (k, n), "128x128")


def quantize_rowwise_ref(x: torch.Tensor, axis: int = 1) -> ScaledTensor:
    """Reference rowwise quantization: one power-of-two scale per row (axis=1) or per column (axis=0,
    returned in the x.T layout); scale [rows, 1] fp32."""
    _check_2d(x, "quantize_rowwise_ref")
    m = x if axis == 1 else x.t()
    mf = m.float()
    amax_bits = (mf.view(torch.int32) & 0x7FFFFFFF).amax(dim=1, keepdim=True)
    inv, sbits, bad = _scale_bits_ref(amax_bits, e8m0=False)
    y = (mf * _f32_from_bits(inv)).clamp(-E4M3_MAX, E4M3_MAX)
    q = y.to(torch.float8_e4m3fn).view(torch.uint8).masked_fill(bad, _NAN_CODE).view(torch.float8_e4m3fn)
    return ScaledTensor(q.contiguous(), _f32_from_bits(sbits), (m.shape[0], m.shape[1]), "rowwise")


def dequantize_scaled(t: ScaledTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode a :class:`ScaledTensor` to ``dtype`` ([rows, cols], padding dropped). PyTorch, any device."""
    r, c = t.shape
    d = t.data.float()
    if t.kind in ("rowwise", "tensorwise"):
        out = d * t.scale
    elif t.kind == "1x128":
        out = (d.reshape(r, -1, HOPPER_BLOCK) * t.scale.unsqueeze(-1)).reshape(r, -1)
    elif t.kind == "128x128":
        s = t.scale.repeat_interleave(HOPPER_BLOCK, 0)[: d.shape[0]]
        s = s.repeat_interleave(HOPPER_BLOCK, 1)[:, : d.shape[1]]
        out = d * s
    else:
        raise MXFormatError(
            f"dequantize_scaled: unknown kind {t.kind!r}; expected 1x128, 128x128, rowwise or tensorwise")
    return out[:, :c].to(dtype)


def quantize_rowwise(x: torch.Tensor, axis: int = 1, backend: str = "auto") -> ScaledTensor:
    """Rowwise quantization (see the reference); Triton: an amax pass, then a quantize pass."""
    if _pick_backend(backend, x, "quantize_rowwise") == "ref":
        return quantize_rowwise_ref(x, axis)
    _check_2d(x, "quantize_rowwise")
    from kernels import mx_triton

    rows, cols = mx_triton.quantize_rowwise(x, axis == 1, axis == 0)
    out = rows if axis == 1 else cols
    return ScaledTensor(out[0], out[1], out[2], "rowwise")


def quantize_rowwise_both(x: torch.Tensor, backend: str = "auto") -> tuple[ScaledTensor, ScaledTensor]:
    """Per-row and per-column (x.T layout) quantization; Triton reads ``x`` twice in all."""
    if _pick_backend(backend, x, "quantize_rowwise_both") == "ref":
        return quantize_rowwise_ref(x, 1), quantize_rowwise_ref(x, 0)
    _check_2d(x, "quantize_rowwise_both")
    from kernels import mx_triton

    rows, cols = mx_triton.quantize_rowwise(x, True, True)
    return ScaledTensor(*rows, "rowwise"), ScaledTensor(*cols, "rowwise")


# ----------------------------------------------------------------------------------------------
# tensorwise: one power-of-two scale per tensor. Current scaling: an amax pass, then one cast pass. Delayed
# scaling: the scale from an amax history of earlier steps, this step's amax recorded by the cast pass itself.

FORMATS = {"e4m3": (torch.float8_e4m3fn, E4M3_MAX, 8), "e5m2": (torch.float8_e5m2, E5M2_MAX, 15)}
TENSORWISE_PAD = 16  # cuBLAS FP8 GEMMs need the reduction dim (and leading dims) a multiple of 16
_STEP_SHIFT = 31  # a history slot holds (step << 31) | amax bits (sign cleared, so 31 bits)


@dataclass(frozen=True)
class DelayedScale:
    """Delayed scaling of one tensor (as Transformer Engine's default recipe): where its scale comes from and
    where its amax goes.

    ``history``: int64 ring of ``window + 1`` slots on the tensor's device; slot ``step % (window + 1)`` holds
    ``(step << 31) | amax_bits`` of the latest step that wrote it (amax as fp32 bits, NaN > Inf > finite). The
    cast of step ``step`` takes its scale from the max amax of the slots written in steps ``step - window`` ..
    ``step - 1`` (``use_history=True``), or from this tensor's own amax (``use_history=False``: current scaling,
    for a first step with no history), and atomically maxes this tensor's amax into its own step's slot. So the
    scale of a step never depends on that step's data: a recomputed forward (activation checkpointing) or a
    second micro-batch of the same step gets the same scale, and the recorded amax is the max over all of them.

    Values beyond the delayed scale's range saturate to the format's max (+-448 for e4m3, +-57344 for e5m2), which
    the cast does not count (:func:`delayed_overflow_ref` tells afterwards, from the history, whether a step did);
    a NaN/Inf element gets the NaN code, and a non-finite amax in the history makes the whole tensor NaN for the
    next ``window`` steps (as current scaling does for a non-finite tensor).

    ``margin`` (binades, 0-6): headroom of a scale taken from the history: it covers ``2**margin`` times the
    history's amax, so a step whose amax outgrows its window by less than that does not saturate; it costs the
    same number of binades at the bottom of the format's range (cheap for e5m2's 32).
    """

    history: torch.Tensor
    step: int
    window: int
    use_history: bool
    margin: int = 0


def new_amax_history(window: int, device: Any = None, rows: int = 1) -> torch.Tensor:
    """Empty history rings (int64 zeros) for :class:`DelayedScale`: [rows, window + 1]."""
    if window < 1:
        raise MXFormatError(f"new_amax_history: window must be >= 1 step, got {window}")
    return torch.zeros(rows, window + 1, dtype=torch.int64, device=device)


def tensorwise_history_amax_ref(history: torch.Tensor, step: int, window: int) -> torch.Tensor:
    """Max amax bits (0-dim int32) over the slots written in steps ``step - window`` .. ``step - 1`` (0 if none)."""
    s = history >> _STEP_SHIFT
    ok = (s >= step - window) & (s < step)
    return torch.where(ok, history & 0x7FFFFFFF, torch.zeros_like(history)).amax().to(torch.int32)


def delayed_overflow_ref(history: torch.Tensor, step: int, window: int, fmt: str = "e4m3",
                         margin: int = 0) -> torch.Tensor:
    """How far the amax recorded for ``step`` went beyond the range of the delayed scale that step cast with
    (``margin`` as in :class:`DelayedScale`): amax / (format max x scale), a 0-dim fp32 tensor. Above 1, values
    beyond the range saturated to the format's max; 0 where ``step`` cast with current scaling (no history in its
    window) or recorded no amax, and where an amax is not finite (its codes are NaN, not saturated). Device ops
    only: no sync."""
    _, fmax, emax = _fmt(fmt, "delayed_overflow_ref")
    emax -= margin
    prior = tensorwise_history_amax_ref(history, step, window)
    slot = history[step % history.shape[0]]
    own = torch.where((slot >> _STEP_SHIFT) == step, slot & 0x7FFFFFFF, torch.zeros_like(slot)).to(torch.int32)
    _, scale_bits, bad = _scale_bits_ref(prior, e8m0=0, emax=emax)
    limit = fmax * _f32_from_bits(scale_bits)
    ok = (prior > 0) & ~bad & (own >> 23 != 255)
    return torch.where(ok, _f32_from_bits(own) / limit, torch.zeros_like(limit))


def _record_amax_ref(history: torch.Tensor, step: int, amax_bits: torch.Tensor) -> None:
    i = step % history.shape[0]
    history[i] = torch.maximum(history[i], (step << _STEP_SHIFT) | amax_bits.to(torch.int64))


def _fmt(fmt: str, where: str) -> tuple[torch.dtype, float, int]:
    if fmt not in FORMATS:
        raise MXFormatError(f"{where}: fmt must be one of {list(FORMATS)}, got {fmt!r}")
    return FORMATS[fmt]


def _amax_bits_ref(x: torch.Tensor) -> torch.Tensor:
    return (x.float().reshape(-1).view(torch.int32) & 0x7FFFFFFF).amax() if x.numel() else \
        torch.zeros((), dtype=torch.int32, device=x.device)


def tensorwise_scale_ref(x: torch.Tensor, fmt: str = "e4m3") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inverse-scale fp32 bits, scale fp32 bits, non-finite) as 0-dim tensors, from |x| max (NaN > Inf)."""
    _, _, emax = _fmt(fmt, "tensorwise_scale_ref")
    return _scale_bits_ref(_amax_bits_ref(x), e8m0=False, emax=emax)


def _tensorwise_apply_ref(m: torch.Tensor, inv: torch.Tensor, bad: torch.Tensor, fmt: str,
                          nan_elements: bool = False) -> torch.Tensor:
    dt, fmax, _ = FORMATS[fmt]
    mp = _pad_cols(m.float().contiguous(), TENSORWISE_PAD)
    y = (mp * _f32_from_bits(inv)).clamp(-fmax, fmax)
    q = y.to(dt).view(torch.uint8)
    nan = bad | ~mp.isfinite() if nan_elements else bad
    return torch.where(nan, torch.full_like(q, _NAN_CODE), q).view(dt)


def quantize_tensorwise_ref(x: torch.Tensor, axis: int = 1, fmt: str = "e4m3",
                            delayed: DelayedScale | None = None) -> ScaledTensor:
    """Reference tensorwise quantization: ``x`` (axis=1) or ``x.T`` (axis=0) in ``fmt`` with one
    power-of-two scale, columns zero-padded to a multiple of 16; a non-finite tensor becomes all NaN.
    ``delayed``: delayed scaling (see :class:`DelayedScale`); records ``x``'s amax into its history."""
    _check_2d(x, "quantize_tensorwise_ref")
    if delayed is None:
        inv, sbits, bad = tensorwise_scale_ref(x, fmt)
    else:
        _, _, emax = _fmt(fmt, "quantize_tensorwise_ref")
        cur = _amax_bits_ref(x)
        if delayed.use_history:
            src = tensorwise_history_amax_ref(delayed.history, delayed.step, delayed.window)
            emax -= delayed.margin
        else:
            src = cur
        inv, sbits, bad = _scale_bits_ref(src, e8m0=False, emax=emax)
        _record_amax_ref(delayed.history, delayed.step, cur)
    m = x if axis == 1 else x.t()
    nan_elements = delayed is not None and delayed.use_history
    return ScaledTensor(_tensorwise_apply_ref(m, inv, bad, fmt, nan_elements), _f32_from_bits(sbits),
                        (m.shape[0], m.shape[1]), "tensorwise")


def _tensorwise_triton(x: torch.Tensor, row: bool, col: bool, fmt: str, col_sums: bool,
                       delayed: DelayedScale | None, act: int = 0, act_input: torch.Tensor | None = None) -> tuple:
    from kernels import mx_triton_tensorwise

    if delayed is None:
        return mx_triton_tensorwise.quantize_tensorwise(x, row, col, fmt, col_sums=col_sums)
    return mx_triton_tensorwise.quantize_tensorwise(x, row, col, fmt, col_sums=col_sums, history=delayed.history,
                                                    step=delayed.step, window=delayed.window,
                                                    use_history=delayed.use_history, margin=delayed.margin, act=act,
                                                    act_input=act_input)


# Activations a tensorwise cast can apply to what it reads (kernel code): the GELU (exact, erf) of x, and the
# GELU's input gradient x * gelu'(u), x being the gradient of its output and u its input.
CAST_ACTIVATIONS = {"gelu": 1, "gelu_backward": 2}


def apply_cast_activation(x: torch.Tensor, act: str, act_input: torch.Tensor | None = None) -> torch.Tensor:
    """What a cast with ``act`` quantizes, computed by torch (the reference, and the path without the fused
    pass): ``gelu(x)`` or ``gelu_backward(x, act_input)``, in x's dtype as ``nn.GELU`` computes them."""
    if act == "gelu":
        return torch.nn.functional.gelu(x)
    if act == "gelu_backward":
        return torch.ops.aten.gelu_backward(x, act_input)
    raise MXFormatError(f"cast activation must be one of {list(CAST_ACTIVATIONS)}, got {act!r}")


def quantize_tensorwise(x: torch.Tensor, axis: int = 1, fmt: str = "e4m3", backend: str = "auto",
                        col_sums: bool = False, delayed: DelayedScale | None = None) -> Any:
    """Tensorwise quantization of ``x`` (axis=1) or its transposed layout (axis=0); see the reference.
    With ``col_sums``, returns ``(ScaledTensor, x.sum(0) in fp32)``: the pass that reads ``x`` first sums its
    columns (the bias gradient when ``x`` is dY). ``delayed``: delayed scaling (:class:`DelayedScale`)."""
    if _pick_backend(backend, x, "quantize_tensorwise") == "ref":
        q = quantize_tensorwise_ref(x, axis, fmt, delayed)
        return (q, x.float().sum(0)) if col_sums else q
    _check_2d(x, "quantize_tensorwise")
    _fmt(fmt, "quantize_tensorwise")
    rows, cols, *sums = _tensorwise_triton(x, axis == 1, axis == 0, fmt, col_sums, delayed)
    q = ScaledTensor(*(rows if axis == 1 else cols), "tensorwise")
    return (q, *sums) if col_sums else q


def quantize_tensorwise_both(x: torch.Tensor, fmt: str = "e4m3", backend: str = "auto", col_sums: bool = False,
                             delayed: DelayedScale | None = None, act: str | None = None,
                             act_input: torch.Tensor | None = None) -> tuple:
    """Both tensorwise layouts (``x`` and ``x.T``, one shared scale); Triton: one pass that reads ``x`` once and
    writes both layouts, after an amax pass (current scaling) or alone (delayed scaling with history). With
    ``col_sums`` a third item holds ``x.sum(0)`` in fp32.

    ``act`` (``CAST_ACTIVATIONS``): quantize ``apply_cast_activation(x, act, act_input)`` instead of x (its
    sums, its amax). The Triton pass computes it as it reads (no activation tensor written or read again) where
    it runs alone (delayed scaling with history); otherwise torch computes it first."""
    if act is not None:
        fused = (delayed is not None and delayed.use_history and x.is_contiguous()
                 and (act_input is None or act_input.is_contiguous())
                 and _pick_backend(backend, x, "quantize_tensorwise_both") != "ref")
        if not fused:
            return quantize_tensorwise_both(apply_cast_activation(x, act, act_input), fmt, backend, col_sums, delayed)
        _check_2d(x, "quantize_tensorwise_both")
        _fmt(fmt, "quantize_tensorwise_both")
        if act not in CAST_ACTIVATIONS:
            raise MXFormatError(f"cast activation must be one of {list(CAST_ACTIVATIONS)}, got {act!r}")
        rows, cols, *sums = _tensorwise_triton(x, True, True, fmt, col_sums, delayed, CAST_ACTIVATIONS[act], act_input)
        return (ScaledTensor(*rows, "tensorwise"), ScaledTensor(*cols, "tensorwise"), *sums)
    if _pick_backend(backend, x, "quantize_tensorwise_both") == "ref":
        out = (quantize_tensorwise_ref(x, 1, fmt, delayed), quantize_tensorwise_ref(x, 0, fmt, delayed))
        return out + (x.float().sum(0),) if col_sums else out
    _check_2d(x, "quantize_tensorwise_both")
    _fmt(fmt, "quantize_tensorwise_both")
    rows, cols, *sums = _tensorwise_triton(x, True, True, fmt, col_sums, delayed)
    return (ScaledTensor(*rows, "tensorwise"), ScaledTensor(*cols, "tensorwise"), *sums)
