"""Tensorwise quantizer (one power-of-two scale per tensor, e4m3 or e5m2) and the rowwise amax pass: Triton
(interpreter) vs the reference bit for bit in both layouts, the e5m2 encoder against torch's cast, special
values, error bounds."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton kernels are defined

import pytest
import torch

from kernels import mx, mx_triton_tensorwise

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


def finite_wide(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """~10 decades below the max (so both formats' subnormals are hit), zeros, -0.0, one fp32 subnormal."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-8, 2, cols).roll(seed)
    x[0, :5] = 0.0
    x[1, 1] = -0.0
    x = x.to(dtype)
    if dtype == torch.float32:
        x[2, 3] = 1e-39
    return x


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tensorwise_triton_matches_reference_bitwise(dtype, fmt):
    x = finite_wide(37, 70, dtype, seed=1)  # neither dim a multiple of 16: padding covered
    for axis in (0, 1):
        ref = mx.quantize_tensorwise(x, axis, fmt, backend="ref")
        tri = mx.quantize_tensorwise(x, axis, fmt, backend="triton")
        assert tri.data.dtype == ref.data.dtype == FORMATS[fmt]
        assert tri.shape == ref.shape == ((37, 70) if axis == 1 else (70, 37))
        assert tri.data.shape == ref.data.shape == ((37, 80) if axis == 1 else (70, 48))
        assert torch.equal(bits(tri.data), bits(ref.data))
        assert tri.scale.shape == () and torch.equal(bits(tri.scale), bits(ref.scale))
        assert (bits(ref.data)[:, ref.shape[1]:] == 0).all()  # padding is zeros: adds nothing to a GEMM
    rows, cols = mx.quantize_tensorwise_both(x, fmt, backend="triton")
    assert torch.equal(bits(rows.data), bits(mx.quantize_tensorwise_ref(x, 1, fmt).data))
    assert torch.equal(bits(cols.data), bits(mx.quantize_tensorwise_ref(x, 0, fmt).data))
    assert torch.equal(bits(mx.dequantize_scaled(cols)), bits(mx.dequantize_scaled(rows).t()))


def test_e5m2_encoder_is_torchs_round_to_nearest_even():
    """Every e5m2 value and every midpoint between neighbours (ties go to the even code), both signs,
    through the Triton cast pass with scale 1 (amax 57344 = e5m2 max)."""
    vals = torch.arange(0, 0x7C, dtype=torch.uint8).view(torch.float8_e5m2).float()  # finite non-negatives
    mids = (vals[:-1] + vals[1:]) / 2
    x = torch.cat([vals, mids, -vals, -mids, torch.tensor([57344.0])])
    x = torch.nn.functional.pad(x, (0, (-x.numel()) % 16)).reshape(-1, 16)
    (q, s, _), _ = mx_triton_tensorwise.quantize_tensorwise(x, True, False, "e5m2")
    assert s.item() == 1.0
    assert torch.equal(bits(q), bits(x.to(torch.float8_e5m2)))


def test_non_finite_tensor_becomes_nan_and_scale_never_saturates():
    x = finite_wide(16, 32, torch.float32, seed=2)
    x[3, 4] = float("inf")
    for backend in ("ref", "triton"):
        q = mx.quantize_tensorwise(x, 1, "e4m3", backend=backend)
        assert q.scale.isnan() and mx.dequantize_scaled(q).isnan().all()
    y = torch.tensor([[448.0 * 3, -449.0 * 3] + [1.0] * 14])
    for fmt, fmax in (("e4m3", 448.0), ("e5m2", 57344.0)):
        for backend in ("ref", "triton"):
            q = mx.quantize_tensorwise(y, 1, fmt, backend=backend)
            assert q.scale.item() * fmax >= 449.0 * 3 > q.scale.item() * fmax / 2  # smallest pow2 that fits
            assert not (mx.dequantize_scaled(q) != mx.dequantize_scaled(q)).any()


@pytest.mark.parametrize("fmt,mant", [("e4m3", 3), ("e5m2", 2)])
def test_tensorwise_roundtrip_error_bounds(fmt, mant):
    """RNE keeps ``mant`` mantissa bits: error <= 2^-(mant+1) relative for elements in the format's normal
    range (scale * 2^-6 for e4m3, scale * 2^-14 for e5m2), half a subnormal step below it."""
    torch.manual_seed(0)
    x = torch.randn(128, 256) * torch.logspace(-3, 1, 256)
    q = mx.quantize_tensorwise_ref(x, 1, fmt)
    y = mx.dequantize_scaled(q)
    s = q.scale.item()
    min_normal, step = (2.0**-6, 2.0**-9) if fmt == "e4m3" else (2.0**-14, 2.0**-16)
    normal = x.abs() >= s * min_normal
    assert ((y - x).abs() <= x.abs() * 2.0 ** -(mant + 1))[normal].all()
    assert ((y - x).abs() <= s * step / 2)[~normal].all()
    assert (y - x).norm() / x.norm() < {"e4m3": 0.035, "e5m2": 0.07}[fmt]


def test_tensorwise_rejects_unknown_format():
    with pytest.raises(mx.MXFormatError, match="fmt"):
        mx.quantize_tensorwise(torch.zeros(4, 16), 1, "e3m4")


@pytest.mark.parametrize("row_step", [1, 2, 3])
def test_amax_pass_loops_over_row_tiles(row_step):
    """Each program of the amax pass walks every row_step-th row tile: the max (bits) must not depend on it."""
    x = finite_wide(200, 70, torch.bfloat16, seed=4)  # 4 row tiles of 64 with the default tiles
    want = (x.float().view(torch.int32) & 0x7FFFFFFF).max()
    assert mx_triton_tensorwise.tensorwise_amax(x, row_step=row_step).item() == want.item()
    x[199, 69] = float("nan")  # in the last, partial row tile
    assert mx_triton_tensorwise.tensorwise_amax(x, row_step=row_step).item() == 0x7FC00000


def test_rowwise_scales_gather_over_several_tiles():
    """The rowwise amax pass combines tiles with atomic max per row and per column (here 3 x 3 tiles of
    64 x 128); the result must still be the reference bit for bit, NaN rows/columns included."""
    x = finite_wide(150, 300, torch.float32, seed=5)
    x[70, 290] = float("nan")
    for axis in (0, 1):
        ref, tri = mx.quantize_rowwise(x, axis, backend="ref"), mx.quantize_rowwise(x, axis, backend="triton")
        assert torch.equal(bits(tri.data), bits(ref.data)) and torch.equal(bits(tri.scale), bits(ref.scale))
    assert mx.dequantize_scaled(mx.quantize_rowwise(x, 1, backend="triton"))[70].isnan().all()


@pytest.mark.parametrize("row_step", [1, 3])
def test_amax_pass_column_sums_are_the_bias_gradient(row_step):
    """col_sums: the amax pass also sums each column over all row tiles (partial sums per program, added by
    the caller); the amax and the codes stay the reference's bit for bit."""
    x = finite_wide(200, 70, torch.bfloat16, seed=6)
    amax, sums = mx_triton_tensorwise.tensorwise_amax(x, row_step=row_step, col_sums=True)
    assert amax.item() == (x.float().view(torch.int32) & 0x7FFFFFFF).max().item()
    torch.testing.assert_close(sums, x.float().sum(0), rtol=1e-5, atol=1e-5)
    for backend in ("ref", "triton"):
        rows, cols, db = mx.quantize_tensorwise_both(x, "e5m2", backend=backend, col_sums=True)
        assert torch.equal(bits(rows.data), bits(mx.quantize_tensorwise_ref(x, 1, "e5m2").data))
        assert torch.equal(bits(cols.data), bits(mx.quantize_tensorwise_ref(x, 0, "e5m2").data))
        torch.testing.assert_close(db, x.float().sum(0), rtol=1e-5, atol=1e-5)
        q, db1 = mx.quantize_tensorwise(x, 1, "e4m3", backend=backend, col_sums=True)
        assert torch.equal(bits(q.data), bits(mx.quantize_tensorwise_ref(x, 1, "e4m3").data))
        torch.testing.assert_close(db1, x.float().sum(0), rtol=1e-5, atol=1e-5)


def test_fp8_linear_plan_takes_the_bias_gradient_from_the_tensorwise_quantizer():
    """The native tensorwise plan (Triton quantizers, here under the interpreter) hands back dY's column sums
    with both layouts and with the row layout alone, as the backward uses them."""
    from kernels.fp8_linear import FUSED_BIAS_GRAD, _Plan

    assert "tensorwise" in FUSED_BIAS_GRAD
    plan = _Plan("tensorwise", True, False, "triton", grad_format="e5m2")
    dy = finite_wide(48, 32, torch.float32, seed=7)
    a, b, db = plan.act_both(dy, col_sums=True, grad=True)
    assert a.data.dtype == b.data.dtype == torch.float8_e5m2
    a1, db1 = plan.act(dy, 1, grad=True, col_sums=True)
    assert torch.equal(bits(a1.data), bits(a.data)) and torch.equal(db1, db)
    torch.testing.assert_close(db, dy.sum(0), rtol=1e-6, atol=1e-6)
