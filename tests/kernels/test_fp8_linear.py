"""Fp8Linear on CPU (emulated recipes): outputs and gradients against a float64 linear within stated
bounds, the emulation equal to a GEMM of independently quantized operands, and the errors it raises."""

import pytest
import torch
from torch import nn

from kernels import mx
from kernels.fp8_linear import Fp8Config, Fp8Linear, Fp8LinearError, _pad16, _to_blocked
from tests.kernels.linear_steps import run

FP8_RECIPES = ["mxfp8", "blockwise", "rowwise", "tensorwise"]
M, K, N = 200, 256, 128  # tokens not a multiple of 128: the padded weight-gradient path is covered


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def case():
    torch.manual_seed(0)
    base = nn.Linear(K, N)
    x, dy = torch.randn(M, K), torch.randn(M, N)
    xd = x.double().requires_grad_()
    wd = base.weight.detach().double().requires_grad_()
    yd = xd @ wd.t() + base.bias.detach().double()
    yd.backward(dy.double())
    return base, x, dy, (yd.detach(), xd.grad, wd.grad, dy.double().sum(0))


# Bounds: e4m3 RNE error is <= 2^-4 relative per operand element (~2.7% RMS measured on Gaussians);
# a product of two such operands over a long reduction lands near sqrt(2) * 2.7% ~ 3.8% (MX saturation
# adds a little: ~5.8% measured). tensorwise carries dY in e5m2 (2^-3 relative): dX and dW ~5.9% measured.
# bf16: 8 bits, ~0.3%.
BOUND = {"mxfp8": 0.075, "blockwise": 0.05, "rowwise": 0.05, "tensorwise": 0.075, "bf16": 0.006}


@pytest.mark.parametrize("recipe", FP8_RECIPES + ["bf16"])
def test_outputs_and_gradients_within_bounds(case, recipe):
    base, x, dy, ref = case
    got = run(Fp8Linear.from_linear(base, Fp8Config(recipe=recipe, emulate=True)), x, dy)
    for name, a, b in zip(("y", "dx", "dW"), got[:3], ref[:3]):
        assert rel(a, b) < BOUND[recipe], (recipe, name, rel(a, b))
        assert rel(a, b) > 1e-4, (recipe, name)  # the quantization really happened
    assert torch.allclose(got[3].double(), ref[3], atol=1e-4)  # bias gradient: plain fp32 sum


def test_mx_ceil_scale_rule_reaches_every_gemm_and_removes_the_saturation_error(case):
    """The ceil rule's errors are those of an unsaturated e4m3 cast (blockwise's bound); the floor's are larger."""
    base, x, dy, ref = case
    floor = run(Fp8Linear.from_linear(base, Fp8Config(recipe="mxfp8", emulate=True)), x, dy)
    ceil = run(Fp8Linear.from_linear(base, Fp8Config(recipe="mxfp8", mx_scale="ceil", emulate=True)), x, dy)
    for name, f, c, r in zip(("y", "dx", "dW"), floor[:3], ceil[:3], ref[:3]):
        assert 1e-4 < rel(c, r) < BOUND["blockwise"], name
        assert rel(c, r) < rel(f, r), name


@pytest.mark.parametrize("wgrad,bound", [("fp32", 1e-5), ("bf16", BOUND["bf16"])])
@pytest.mark.parametrize("recipe", ["mxfp8", "blockwise"])
def test_high_precision_weight_gradient(case, recipe, wgrad, bound):
    base, x, dy, ref = case
    y, dx, dw, _ = run(Fp8Linear.from_linear(base, Fp8Config(recipe=recipe, wgrad=wgrad, emulate=True)), x, dy)
    assert rel(dw, ref[2]) < bound
    assert rel(dx, ref[1]) > 1e-3  # the other GEMMs stay in FP8


def test_blockwise_wgrad_with_input_tiles(case):
    base, x, dy, ref = case
    cfg = Fp8Config(recipe="blockwise", blockwise_wgrad="128x128", emulate=True)
    _, _, dw, _ = run(Fp8Linear.from_linear(base, cfg), x, dy)
    assert 1e-3 < rel(dw, ref[2]) < BOUND["blockwise"]
    xt = mx.dequantize_scaled(mx.quantize_128x128_ref(x)[1])  # x^T in 128x128 tiles
    dyt = mx.dequantize_scaled(mx.quantize_1x128_ref(dy, axis=0))
    assert torch.allclose(dw, dyt @ xt.t(), atol=1e-4)


def test_emulation_is_the_gemm_of_quantized_operands(case):
    base, x, dy, _ = case
    w = base.weight.detach()
    y, dx, dw, _ = run(Fp8Linear.from_linear(base, Fp8Config(recipe="mxfp8", emulate=True)), x, dy)
    dq = mx.mx_dequantize_ref
    assert torch.allclose(y, dq(mx.mx_quantize_ref(x)) @ dq(mx.mx_quantize_ref(w)).t() + base.bias, atol=1e-5)
    assert torch.allclose(dx, dq(mx.mx_quantize_ref(dy)) @ dq(mx.mx_quantize_ref(w, axis=0)).t(), atol=1e-5)
    assert torch.allclose(dw, dq(mx.mx_quantize_ref(dy, axis=0)) @ dq(mx.mx_quantize_ref(x, axis=0)).t(), atol=1e-4)
    y2, dx2, dw2, _ = run(Fp8Linear.from_linear(base, Fp8Config(recipe="blockwise", emulate=True)), x, dy)
    wq, wtq = mx.quantize_128x128_ref(w)
    ds = mx.dequantize_scaled
    assert torch.allclose(y2, ds(mx.quantize_1x128_ref(x)) @ ds(wq).t() + base.bias, atol=1e-5)
    assert torch.allclose(dx2, ds(mx.quantize_1x128_ref(dy)) @ ds(wtq).t(), atol=1e-5)


def test_tensorwise_emulation_is_the_gemm_of_quantized_operands(case):
    """x and W in e4m3, dY in e5m2 (grad_format), one scale per tensor; e4m3 dY is closer to float64."""
    base, x, dy, ref = case
    w = base.weight.detach()
    y, dx, dw, _ = run(Fp8Linear.from_linear(base, Fp8Config(recipe="tensorwise", emulate=True)), x, dy)
    tq, ds = mx.quantize_tensorwise_ref, mx.dequantize_scaled
    assert torch.allclose(y, ds(tq(x)) @ ds(tq(w)).t() + base.bias, atol=1e-5)
    assert torch.allclose(dx, ds(tq(dy, 1, "e5m2")) @ ds(tq(w, 0)).t(), atol=1e-5)
    assert torch.allclose(dw, ds(tq(dy, 0, "e5m2")) @ ds(tq(x, 0)).t(), atol=1e-4)
    _, dx4, dw4, _ = run(Fp8Linear.from_linear(base, Fp8Config(recipe="tensorwise", grad_format="e4m3",
                                                                emulate=True)), x, dy)
    assert rel(dx4, ref[1]) < rel(dx, ref[1]) and rel(dw4, ref[2]) < rel(dw, ref[2])


def test_drop_in_for_nn_linear():
    torch.manual_seed(1)
    base = nn.Linear(64, 32)
    lin = Fp8Linear.from_linear(base, Fp8Config(recipe="rowwise", emulate=True))
    assert lin.weight is base.weight and lin.bias is base.bias
    assert isinstance(lin, nn.Linear) and list(lin.state_dict()) == list(base.state_dict())
    fresh = Fp8Linear(64, 32, recipe="blockwise", emulate=True)
    fresh.load_state_dict(base.state_dict())
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)  # any leading shape, dtype kept
    y = fresh(x)
    assert y.shape == (3, 5, 32) and y.dtype == torch.bfloat16
    assert rel(y.float(), base(x.float())) < 0.06
    assert "recipe=blockwise" in repr(fresh)


def test_nan_input_reaches_the_output():
    torch.manual_seed(2)
    lin = Fp8Linear(64, 16, recipe="mxfp8", emulate=True)
    x = torch.randn(4, 64)
    x[1, 3] = float("nan")
    y = lin(x)
    assert y[1].isnan().all() and not y[[0, 2, 3]].isnan().any()


def test_gpu_recipes_fail_clearly_on_cpu():
    x = torch.randn(4, 128)
    for recipe in FP8_RECIPES:
        with pytest.raises(Fp8LinearError, match="emulate=True"):
            Fp8Linear(128, 128, recipe=recipe)(x)
    assert Fp8Linear(128, 128, recipe="bf16")(x).shape == (4, 128)  # bf16 needs no GPU


def test_config_validation():
    with pytest.raises(Fp8LinearError, match="recipe"):
        Fp8Config(recipe="fp4")
    with pytest.raises(Fp8LinearError, match="wgrad"):
        Fp8Config(wgrad="fp8e5m2")
    with pytest.raises(Fp8LinearError, match="mx_on_hopper"):
        Fp8Config(mx_on_hopper="native")
    with pytest.raises(Fp8LinearError, match="mx_scale"):
        Fp8Config(recipe="mxfp8", mx_scale="nearest")
    with pytest.raises(Fp8LinearError, match="grad_format"):
        Fp8Config(recipe="tensorwise", grad_format="e3m4")
    with pytest.raises(Fp8LinearError, match="in_features=16"):
        Fp8Linear(16, 8, recipe="bf16")(torch.randn(2, 32))


def test_mx_scale_swizzle_is_a_padded_permutation():
    """The sm_100 scale layout (32x4x4 blocks): same values, padded to 128 rows x 4 columns."""
    s = torch.arange(200 * 6, dtype=torch.int32).reshape(200, 6)
    b = _to_blocked(s)
    assert b.numel() == 256 * 8
    assert torch.equal(b.sort().values[-s.numel():], s.flatten())
    assert b[:4].tolist() == [0, 1, 2, 3] and b[4].item() == s[32, 0].item()


def test_native_rowwise_pads_only_the_reduction_dim():
    x = torch.randn(1000, 1024)
    assert _pad16(x, 1) is x  # 1024 columns: aligned already
    p = _pad16(x, 0)
    assert p.shape == (1008, 1024) and torch.equal(p[:1000], x) and (p[1000:] == 0).all()


@pytest.mark.parametrize("recipe", ["mxfp8", "blockwise", "rowwise", "tensorwise", "bf16"])
def test_no_tokens_gives_an_empty_output_and_zero_gradients(recipe):
    # An MoE expert can receive no tokens in a step; the layer must not fail on an empty input.
    layer = Fp8Linear(64, 32, config=Fp8Config(recipe=recipe, emulate=True))
    x = torch.randn(0, 64, requires_grad=True)
    y = layer(x)
    assert y.shape == (0, 32)
    y.sum().backward()
    assert x.grad.shape == (0, 64)
    assert torch.count_nonzero(layer.weight.grad) == 0 and torch.count_nonzero(layer.bias.grad) == 0


def test_row_padding_only_for_native_blockwise():
    from kernels.fp8_linear import _pad_rows, _Plan

    x = torch.randn(37, 16)
    p = _pad_rows(x, 16)
    assert p.shape == (48, 16) and torch.equal(p[:37], x) and (p[37:] == 0).all()
    assert _pad_rows(x, 1) is x
    assert _Plan("blockwise", True, False, "triton").row_align == 4  # cuBLAS refused M % 4 != 0 on an H200
    assert _Plan("blockwise", False, False, "ref").row_align == 1  # emulated: no cuBLAS, no padding
    assert _Plan("tensorwise", True, False, "triton").row_align == 1


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise"])
def test_output_takes_the_autocast_dtype_like_nn_linear(case, recipe):
    """Under autocast the output is in the autocast dtype (as nn.Linear's), so the layers after it do not run
    in fp32; the recipe's own numerics are unchanged (the GEMM result rounded once to bf16), and the
    gradients keep the input's and parameters' dtypes."""
    base, x, dy, _ = case
    lin = Fp8Linear.from_linear(base, Fp8Config(recipe=recipe, emulate=True))
    y32, *_ = run(lin, x, dy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert nn.Linear(K, N)(x).dtype == torch.bfloat16  # what a drop-in replacement must match
        xg = x.clone().requires_grad_()
        y = lin(xg)
    assert y.dtype == torch.bfloat16
    assert rel(y, y32) < 2 ** -7  # bf16 rounding of the same result (GEMM and bias), nothing more
    y.backward(dy.to(torch.bfloat16))
    assert xg.grad.dtype == torch.float32 and base.weight.grad.dtype == torch.float32



class _Checkpointed(nn.Module):
    """``lin`` under non-reentrant activation checkpointing, with ``lin``'s parameters (``run`` reads them)."""

    def __init__(self, lin: nn.Module):
        super().__init__()
        self.lin = lin
        self.weight, self.bias = lin.weight, lin.bias

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self.lin, t, use_reentrant=False)


@pytest.mark.parametrize("recipe", FP8_RECIPES + ["bf16"])
def test_fp8_copies_are_saved_tensors_that_checkpointing_frees(case, recipe):
    """The backward's quantized copies of x (for dW) and W (for dX) pass through save_for_backward, so a
    checkpointed region frees and recomputes them instead of holding them on ctx; gradients are unchanged."""
    base, x, dy, _ = case
    lin = Fp8Linear.from_linear(base, Fp8Config(recipe=recipe, emulate=True))
    packed: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        lin(x.clone().requires_grad_())
    assert len(packed) >= 2  # x's and W's copies (each codes, plus scales for the FP8 recipes)
    if recipe != "bf16":
        assert any(t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.uint8) for t in packed)
    plain = run(lin, x, dy)
    for got, want in zip(run(_Checkpointed(lin), x, dy), plain):
        assert torch.equal(got, want)


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise"])
def test_min_gemm_runs_calls_below_it_as_bf16_linear(recipe):
    """Below ``min_gemm`` (tokens x in x out) the layer is ``F.linear``: same output and gradients bit for bit;
    at it, the FP8 path (whose output differs from F.linear's)."""
    torch.manual_seed(3)
    base = nn.Linear(64, 32)
    x = torch.randn(4, 5, 64)  # 20 tokens: a GEMM of 20 x 64 x 32 = 40960
    for min_gemm, fp8 in ((40961, False), (1e9, False), (40960, True), (0, True)):
        layer = Fp8Linear.from_linear(base, Fp8Config(recipe=recipe, emulate=True, min_gemm=min_gemm))
        xs = [x.clone().requires_grad_() for _ in range(2)]
        ours, ref = layer(xs[0]), nn.functional.linear(xs[1], base.weight, base.bias)
        assert torch.equal(ours, ref) != fp8, (min_gemm, fp8)
        if not fp8:
            g = torch.randn_like(ours)
            grads = [torch.autograd.grad(y, (xi, base.weight, base.bias), g) for y, xi in ((ours, xs[0]), (ref, xs[1]))]
            assert all(torch.equal(a, b) for a, b in zip(*grads))
    assert "min_gemm=1e+09" in repr(Fp8Linear.from_linear(base, Fp8Config(recipe=recipe, min_gemm=1e9)))
    for bad in (-1, "1e11", True):
        with pytest.raises(Fp8LinearError, match="min_gemm"):
            Fp8Config(recipe=recipe, min_gemm=bad)
