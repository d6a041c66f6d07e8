"""MXFP8 and Hopper-recipe quantizers: Triton (interpreter) vs reference bit for bit, special values,
round-trip error bounds, layouts."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton kernels are defined

import pytest
import torch

from kernels import mx

F8 = torch.float8_e4m3fn
# NaN/Inf blocks multiply Inf by the (unused) inverse scale inside the interpreter; the result is masked
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


def wide_input(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random values over ~12 decades plus NaN, Inf, a zero block and (fp32) subnormals."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-6, 6, cols).roll(seed)
    x[1, 3] = float("nan")
    x[2, 40] = float("-inf")
    x[4, :32] = 0.0
    x[5, 7] = -0.0
    x[6, 0] = 1.9 * 2.0**10  # saturates under the MX floor rule
    x = x.to(dtype)
    if dtype == torch.float32:
        x[7, 32:64] = torch.rand(32, generator=g) * 1e-39  # fp32 subnormals
    if dtype == torch.float16:
        x[7, 32:64] = torch.rand(32, generator=g).half() * 5e-6  # fp16 subnormals
    return x


DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("rule", mx.MX_SCALE_RULES)
def test_mx_triton_matches_reference_bitwise(dtype, axis, rule):
    x = wide_input(40, 72, dtype, seed=axis)  # neither dim a multiple of 32: padding covered
    ref = mx.mx_quantize(x, axis, backend="ref", scale_rule=rule)
    tri = mx.mx_quantize(x, axis, backend="triton", scale_rule=rule)
    assert tri.shape == ref.shape == ((40, 72) if axis == 1 else (72, 40))
    assert tri.data.dtype == F8 and tri.scale.dtype == torch.uint8
    assert torch.equal(bits(tri.data), bits(ref.data))
    assert torch.equal(tri.scale, ref.scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [0, 1])
def test_1x128_triton_matches_reference_bitwise(dtype, axis):
    x = wide_input(40, 136, dtype, seed=3 + axis)
    ref = mx.quantize_1x128(x, axis, backend="ref")
    tri = mx.quantize_1x128(x, axis, backend="triton")
    assert torch.equal(bits(tri.data), bits(ref.data))
    assert torch.equal(bits(tri.scale), bits(ref.scale))
    rows = tri.data.shape[0]
    assert tri.scale.shape == (rows, tri.data.shape[1] // 128)
    assert tri.scale.stride() == (1, rows)  # column-major, as scaled_mm reads it


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rowwise_triton_matches_reference_bitwise(dtype):
    x = wide_input(40, 72, dtype, seed=8)
    for axis in (0, 1):
        ref, tri = mx.quantize_rowwise(x, axis, backend="ref"), mx.quantize_rowwise(x, axis, backend="triton")
        assert torch.equal(bits(tri.data), bits(ref.data)) and torch.equal(bits(tri.scale), bits(ref.scale))
        assert tri.scale.shape == (tri.data.shape[0], 1)
    rows, cols = mx.quantize_rowwise_both(x, backend="triton")
    assert torch.equal(bits(rows.data), bits(mx.quantize_rowwise_ref(x, 1).data))
    assert torch.equal(bits(cols.data), bits(mx.quantize_rowwise_ref(x, 0).data))


def test_both_layouts_from_one_read_match_single_layouts():
    x = wide_input(72, 96, torch.bfloat16, seed=5)
    rows, cols = mx.mx_quantize_both(x, backend="triton")
    assert torch.equal(bits(rows.data), bits(mx.mx_quantize_ref(x, 1).data))
    assert torch.equal(bits(cols.data), bits(mx.mx_quantize_ref(x, 0).data))
    assert torch.equal(cols.scale, mx.mx_quantize_ref(x, 0).scale)
    r128, c128 = mx.quantize_1x128_both(x, backend="triton")
    assert torch.equal(bits(r128.data), bits(mx.quantize_1x128_ref(x, 1).data))
    assert torch.equal(bits(c128.scale), bits(mx.quantize_1x128_ref(x, 0).scale))


@pytest.mark.parametrize("block,tiles", [(32, (64, 64, 4)), (32, (32, 128, 4)), (128, (128, 128, 4)),
                                         (128, (256, 128, 8)), (32, (32, 64, 2, 0, 2)), (128, (128, 128, 4, 0, 2)),
                                         (32, (32, 128, 2, 0, 3, 1)), (128, (128, 128, 4, 0, 3, 1)),
                                         (32, (32, 128, 1, 0, 8)), (128, "interleaved"), (32, "interleaved")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_tile_path_matches_reference(block, tiles, dtype):
    """Column blocks take one of three code paths (TR == block or not, or rows read in fours by the interleaved
    cast), and a program may cast several column tiles, or several row tiles (here more than the rows hold), in
    turn: all must be exact, partial tiles at both edges included."""
    from kernels import mx_triton

    if tiles == "interleaved":
        tiles = mx_triton.Interleaved(warps=4)
    x = wide_input(202, 136, dtype, seed=9)  # 202 rows: the last row tile ends inside a group of four
    rows, cols, sums = mx_triton.quantize(x, block, block == 32, True, True, tiles=tiles, col_sums=True)
    quant = mx.mx_quantize_ref if block == 32 else mx.quantize_1x128_ref
    assert torch.equal(bits(rows[0]), bits(quant(x, 1).data)) and torch.equal(bits(rows[1]), bits(quant(x, 1).scale))
    assert torch.equal(bits(cols[0]), bits(quant(x, 0).data)) and torch.equal(bits(cols[1]), bits(quant(x, 0).scale))
    exact, size = x.double().sum(0), x.double().abs().sum(0)
    finite = exact.isfinite()
    assert torch.equal(sums.isfinite(), finite)
    # fp32 sums in any order: within n * eps of the column's sum of |x| (n = 202 rows)
    assert ((sums.double() - exact).abs()[finite] <= 202 * 2.0**-24 * size[finite]).all()
    if dtype == torch.bfloat16:
        assert torch.allclose(sums.nan_to_num(0.0, 0.0, 0.0), x.float().sum(0).nan_to_num(0.0, 0.0, 0.0), rtol=1e-5)


@pytest.mark.parametrize("tiles", [(64, 64, 4), (32, 128, 4), (32, 128, 2, 0, 3, 1), "interleaved"])
def test_every_tile_path_takes_the_mx_ceil_rule(tiles):
    from kernels import mx_triton

    if tiles == "interleaved":
        tiles = mx_triton.Interleaved(warps=4)
    x = wide_input(202, 136, torch.bfloat16, seed=10)
    rows, cols = mx_triton.quantize(x, 32, mx.SCALE_E8M0_CEIL, True, True, tiles=tiles)
    for got, axis in ((rows, 1), (cols, 0)):
        want = mx.mx_quantize_ref(x, axis, scale_rule="ceil")
        assert torch.equal(bits(got[0]), bits(want.data)) and torch.equal(got[1], want.scale)


def test_interleaved_cast_writes_both_layouts_only():
    from kernels import mx_triton

    x = wide_input(40, 136, torch.bfloat16, seed=4)
    with pytest.raises(ValueError, match="both layouts"):
        mx_triton.quantize(x, 128, False, True, False, tiles=mx_triton.Interleaved())
    rows, cols = mx_triton.quantize(x, 128, False, True, True, tiles=mx_triton.Interleaved(warps=8))
    assert rows[1].stride() == (1, 40) and cols[1].stride() == (1, 136)  # column-major scales, as the one-read cast


@pytest.mark.parametrize("block", [32, 128])
def test_bf16_tiles_kept_16_bit_or_widened_give_the_same_casts(monkeypatch, block):
    """bf16 tiles stay 16-bit through the amax, or are widened on load (the casts with column sums,
    ``WIDEN_WITH_SUMS``): either way the codes, scales and column sums are the same (NaN, Inf and -Inf blocks
    included)."""
    from kernels import mx_triton

    x = wide_input(200, 136, torch.bfloat16, seed=11)
    outs = []
    for widened in (False, True):
        monkeypatch.setattr(mx_triton, "WIDEN_WITH_SUMS", widened)
        got = mx_triton.quantize(x, block, block == 32, True, True, tiles=(block, 128, 4), col_sums=True)
        outs.append([bits(t) for t in (got[0][0], got[0][1], got[1][0], got[1][1])] + [got[2]])
    for a, b in zip(*outs):
        assert torch.equal(a.nan_to_num(0.0, 0.0, 0.0), b.nan_to_num(0.0, 0.0, 0.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_128x128_triton_matches_reference_and_transpose(dtype):
    w = wide_input(136, 200, dtype, seed=6)
    (wq, wtq), (wq_t, wtq_t) = mx.quantize_128x128(w, backend="ref"), mx.quantize_128x128(w, backend="triton")
    assert torch.equal(bits(wq.data), bits(wq_t.data)) and torch.equal(bits(wtq.data), bits(wtq_t.data))
    assert torch.equal(bits(wq.scale), bits(wq_t.scale)) and torch.equal(bits(wtq.scale), bits(wtq_t.scale))
    # the transposed copy holds the same values
    a = mx.dequantize_scaled(wq).nan_to_num(1.0)
    b = mx.dequantize_scaled(wtq).nan_to_num(1.0)
    assert torch.equal(a, b.t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mx_dequantize_triton_matches_reference(dtype):
    x = wide_input(40, 72, torch.float32, seed=7)
    q = mx.mx_quantize_ref(x)
    a, b = mx.mx_dequantize(q, dtype, backend="ref"), mx.mx_dequantize(q, dtype, backend="triton")
    assert a.dtype == b.dtype == dtype and a.shape == b.shape == (40, 72)
    assert torch.equal(a.isnan(), b.isnan())
    assert torch.equal(a.float().nan_to_num(0.0), b.float().nan_to_num(0.0))


@pytest.mark.parametrize("axis", [0, 1])
def test_mx_triton_scales_are_column_major_and_decode(axis):
    """The Triton cast writes E8M0 scales column-major (a few runs per tile instead of single bytes); the
    dequantizer reads any strides, so both decodes agree with the reference's row-major scales."""
    x = wide_input(72, 96, torch.bfloat16, seed=8)
    got_q = mx.mx_quantize(x, axis, backend="triton")
    rows = 96 if axis == 0 else 72
    assert got_q.scale.shape == (rows, 3) and got_q.scale.stride() == (1, rows)
    want = mx.mx_dequantize(mx.mx_quantize_ref(x, axis), torch.float32, backend="ref")
    for backend in ("ref", "triton"):
        got = mx.mx_dequantize(got_q, torch.float32, backend=backend)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))


# ---- special values (OCP MX v1.0, section 6.3)


def test_mx_special_values():
    x = torch.zeros(6, 32)
    x[0, :] = 1.0
    x[0, 5] = float("nan")
    x[1, :] = 1.5
    x[1, 2] = float("inf")
    # row 2 stays zero; row 3: -0.0
    x[3, 0] = -0.0
    x[4, :] = 2.0**-130  # below the smallest E8M0 scale: exponent clamps to -127
    x[5, 0] = 1.9 * 2.0**10  # amax exponent 10 -> X = 2^2; 1.9*2^8 > 448 saturates
    x[5, 1] = 3 * 2.0**-7  # 3/128 / 4 = 3 * 2^-9: an e4m3 subnormal, exact
    for backend in ("ref", "triton"):
        q = mx.mx_quantize(x, backend=backend)
        s, d = q.scale[:, 0], bits(q.data)
        assert s.tolist()[:5] == [255, 255, 0, 0, 0]
        assert s[5].item() == 127 + 2
        assert (d[0] == 0x7F).all() and (d[1] == 0x7F).all()  # non-finite block: NaN elements
        assert (d[2] == 0).all() and d[3, 0].item() == 0x80  # -0.0 keeps its sign
        assert d[5, 0].item() == 0x7E and d[5, 1].item() == 0x03
        y = mx.mx_dequantize(q, backend=backend)
        assert y[:2].isnan().all()
        assert (y[2:4] == 0).all() and torch.signbit(y[3, 0])
        assert y[5, 0].item() == 448 * 4.0 and y[5, 1].item() == 3 * 2.0**-7
        assert torch.equal(y[4], torch.full((32,), 2.0**-130))  # 2^-3 * 2^-127: exact


def test_mx_ceil_rule_rounds_the_scale_up_only_where_the_floor_saturates():
    """Block maxima 1.75 * 2^10 (448 * 4: fits under the floor's 2^2), 1.9 * 2^10 (would saturate: 2^3), NaN."""
    x = torch.ones(3, 32)
    x[0, 0] = 1.75 * 2.0**10
    x[1, 0] = -1.9 * 2.0**10
    x[2, 0] = float("nan")
    for backend in ("ref", "triton"):
        floor, ceil = mx.mx_quantize(x, backend=backend), mx.mx_quantize(x, backend=backend, scale_rule="ceil")
        assert floor.scale[:, 0].tolist() == [129, 129, 255]
        assert ceil.scale[:, 0].tolist() == [129, 130, 255]
        assert torch.equal(bits(ceil.data[0]), bits(floor.data[0])) and bits(ceil.data[0, 0]).item() == 0x7E
        y = mx.mx_dequantize(ceil, backend=backend)
        assert y[1, 0].item() == -1920.0  # -1.9 * 2^10 / 8 = -243.2 -> -240 (RNE), times 8; the floor gives -1792
        assert mx.mx_dequantize(floor, backend=backend)[1, 0].item() == -1792.0
        assert y[2].isnan().all()
    with pytest.raises(mx.MXFormatError, match="scale_rule"):
        mx.mx_quantize(x, scale_rule="round")


def test_mx_ceil_rule_never_saturates_and_matches_the_floor_elsewhere():
    """Elementwise: every value in the normal range of its block within 2^-4 relative (the floor rule clips up to
    1/8); blocks whose maximum fits under the floor scale are quantized identically by both rules."""
    x = wide_input(64, 256, torch.float32, seed=11)
    x = x.nan_to_num(0.0, 0.0, 0.0)
    floor, ceil = mx.mx_quantize_ref(x), mx.mx_quantize_ref(x, scale_rule="ceil")
    y = mx.mx_dequantize_ref(ceil)
    scale = mx._decode_scale_e8m0(ceil.scale).repeat_interleave(32, 1)[:, :256]
    normal = x.abs() >= scale * 2**-6
    assert ((y - x).abs() <= x.abs() * 2**-4)[normal].all()
    clipped = (mx.mx_dequantize_ref(floor) - x).abs() > x.abs() * 2**-4
    assert (clipped & normal).any()  # the floor rule does saturate here
    same = ceil.scale == floor.scale
    assert not same.all() and same.float().mean() > 0.5
    blocks = same.repeat_interleave(32, 1)
    assert torch.equal(bits(ceil.data)[blocks], bits(floor.data)[blocks])


def test_e4m3_rounding_is_nearest_even():
    # amax = 256 -> X = 1, so elements are encoded as they are
    vals = torch.tensor([256.0, 1.0, 1 + 1 / 16, 1 + 3 / 16, -(2.0**-9), 2.0**-10, 3 * 2.0**-10, 2.0**-6])
    x = torch.zeros(1, 32)
    x[0, : len(vals)] = vals
    want = [0x78, 0x38, 0x38, 0x3A, 0x81, 0x00, 0x02, 0x08]
    for backend in ("ref", "triton"):
        q = mx.mx_quantize(x, backend=backend)
        assert q.scale.item() == 127
        assert bits(q.data)[0, : len(vals)].tolist() == want


def test_pow2_scales_never_saturate():
    x = torch.tensor([[448.0, 449.0, 1.75 * 2.0**20, -(1.76 * 2.0**20)]]).repeat(1, 32)
    for backend in ("ref", "triton"):
        q = mx.quantize_1x128(x, backend=backend)
        s = q.scale.flatten()[0].item()
        assert s == 2.0**13  # ceil(log2(1.76 * 2^20 / 448)) = 13
        assert mx.dequantize_scaled(q).abs().max().item() <= 1.76 * 2.0**20 * (1 + 2**-4)
        assert not (bits(q.data) == 0x7F).any()


# ---- round-trip error bounds


def _roundtrips(x):
    yield "mxfp8", mx.mx_dequantize_ref(mx.mx_quantize_ref(x)), 0.045
    yield "mxfp8 ceil", mx.mx_dequantize_ref(mx.mx_quantize_ref(x, scale_rule="ceil")), 0.035
    yield "1x128", mx.dequantize_scaled(mx.quantize_1x128_ref(x)), 0.035
    yield "128x128", mx.dequantize_scaled(mx.quantize_128x128_ref(x)[0]), 0.035
    yield "rowwise", mx.dequantize_scaled(mx.quantize_rowwise(x)), 0.035


def test_roundtrip_error_bounds():
    """E4M3 keeps 3 mantissa bits: RNE error <= 2^-4 relative for every element in the normal range
    of its block. Power-of-two-ceil scales never saturate, so that bound holds elementwise; the MX floor
    rule clamps values in (448, 512)*X, at most 1/8 relative. Gaussian data: relative Frobenius error
    measured ~0.027 (pow2) and ~0.031 (MX); bounds allow margin."""
    torch.manual_seed(0)
    x = torch.randn(256, 512) * 3
    for name, y, bound in _roundtrips(x):
        err = (y - x).norm() / x.norm()
        assert err < bound, (name, err)
        assert (y - x).abs().max() <= x.abs().max() * 2**-3, name
    scale = mx.quantize_1x128_ref(x).scale.repeat_interleave(128, 1)
    y = mx.dequantize_scaled(mx.quantize_1x128_ref(x))
    normal = x.abs() >= scale * 2**-6
    assert ((y - x).abs() <= x.abs() * 2**-4)[normal].all()
    assert ((y - x).abs() <= scale * 2**-10)[~normal].all()  # half the e4m3 subnormal step


def test_outlier_block_only_hurts_its_own_block():
    """Finer blocks confine an outlier's damage: one 1e6 in a row flushes its MX block's small values,
    not the other blocks of the row."""
    x = torch.full((1, 128), 1e-3)
    x[0, 0] = 1e6
    y = mx.mx_dequantize_ref(mx.mx_quantize_ref(x))
    assert (y[0, 1:32] == 0).all()
    assert torch.allclose(y[0, 32:], x[0, 32:], rtol=2**-4)
    r = mx.dequantize_scaled(mx.quantize_rowwise(x))
    assert (r[0, 1:] == 0).all()  # rowwise loses the whole row


def test_rejects_bad_inputs():
    with pytest.raises(mx.MXFormatError, match="2-D"):
        mx.mx_quantize(torch.zeros(2, 3, 32))
    with pytest.raises(mx.MXFormatError, match="float32/float16/bfloat16"):
        mx.mx_quantize(torch.zeros(4, 32, dtype=torch.int32))
    with pytest.raises(mx.MXFormatError, match="backend"):
        mx.quantize_1x128(torch.zeros(4, 128), backend="cuda")
    from kernels import mx_triton

    with pytest.raises(ValueError, match="whole 128-blocks"):
        mx_triton.quantize(torch.zeros(128, 128), 128, False, True, True, tiles=(128, 64, 4))
    with pytest.raises(mx.MXFormatError, match="unknown kind"):
        mx.dequantize_scaled(mx.ScaledTensor(torch.zeros(1, 1), torch.ones(1, 1), (1, 1), "2x2"))


def test_auto_backend_keeps_pre_fp8_gpus_on_the_reference(monkeypatch):
    """The Triton quantizers encode with the GPU's fp8 conversion (sm_89+): on an older GPU "auto" picks the
    reference and an explicit "triton" is refused with what to do (fault injected: the device capability)."""
    from types import SimpleNamespace

    from kernels.mx import MXFormatError, _pick_backend

    gpu = SimpleNamespace(is_cuda=True, device="cuda:0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert _pick_backend("auto", gpu, "test") == "ref"
    with pytest.raises(MXFormatError, match="8.9"):
        _pick_backend("triton", gpu, "test")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert _pick_backend("auto", gpu, "test") == "triton"
    assert _pick_backend("auto", torch.zeros(1), "test") == "ref"
