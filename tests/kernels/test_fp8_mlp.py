"""The FP8 GELU MLP: the tensorwise cast that applies the GELU (or its backward) as it reads, under the
interpreter against torch's GELU followed by the reference cast; and the fused MLP against the chain of two
``Fp8Linear`` layers around ``nn.GELU`` (emulated recipe), outputs and gradients over several steps."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton kernels are defined

import pytest
import torch
from torch import nn

from kernels import fp8_mlp, mx
from kernels.fp8_linear import Fp8Config, Fp8Linear, Fp8LinearError, fp8_step

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def _codes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).to(torch.int16)


def _dequant(q: mx.ScaledTensor) -> torch.Tensor:
    return q.data.float() * q.scale.float()


@pytest.mark.parametrize("act", ["gelu", "gelu_backward"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_activation_cast_matches_torch_then_reference(act, dtype):
    """Three steps of delayed scaling (the fused pass runs from the second): both layouts, scale, column sums and
    the amax ring against torch's activation then the reference cast. The interpreter's erf and torch's CPU erf
    differ in their last bits, most in the GELU's far tail (where 1 + erf cancels), so a few values may land one
    format step apart, or on either side of zero when they are far below the tensor's scale; everything else is
    bit-identical."""
    g = torch.Generator().manual_seed(0)
    h_ref, h_tri = mx.new_amax_history(3)[0], mx.new_amax_history(3)[0]
    fmt = "e4m3" if act == "gelu" else "e5m2"
    step_rel = 2.0**-3 if fmt == "e4m3" else 2.0**-2  # one step of the format's mantissa
    for step in range(3):
        x = (torch.randn(70, 37, generator=g) * 3).to(dtype)  # neither dim a multiple of 16
        u = (torch.randn(70, 37, generator=g) * 1.5).to(dtype) if act == "gelu_backward" else None
        d_ref = mx.DelayedScale(h_ref, step, 3, use_history=step > 0)
        d_tri = mx.DelayedScale(h_tri, step, 3, use_history=step > 0)
        want = mx.apply_cast_activation(x, act, u)
        a, b, s_ref = mx.quantize_tensorwise_both(want, fmt, backend="ref", col_sums=True, delayed=d_ref)
        c, d, s_tri = mx.quantize_tensorwise_both(x, fmt, backend="triton", col_sums=True, delayed=d_tri, act=act,
                                                  act_input=u)
        assert torch.equal(a.scale, c.scale)
        for ref, tri in ((a, c), (b, d)):
            r, t = _dequant(ref), _dequant(tri)
            far_below = 2.0**-10 * float(want.abs().max())  # negligible against the tensor's largest values
            close = (r - t).abs() <= step_rel * torch.maximum(r.abs(), t.abs()) + far_below
            assert close.all(), step
            assert (_codes(ref.data) != _codes(tri.data)).float().mean() <= 0.01, step
        assert torch.equal(h_ref >> 31, h_tri >> 31)  # the same steps recorded, amaxes within the rounding
        assert ((h_ref & 0x7FFFFFFF) - (h_tri & 0x7FFFFFFF)).abs().max() <= 2**13  # an fp16 step, in fp32 bits
        act_x = want.double()
        assert ((s_tri.double() - act_x.sum(0)).abs() <= 1e-3 * act_x.abs().sum(0) + 1e-6).all()


def test_activation_cast_needs_its_input_and_delayed_history():
    x = torch.randn(8, 16)
    d = mx.DelayedScale(mx.new_amax_history(2)[0], 1, 2, use_history=True)
    from kernels import mx_triton_tensorwise

    with pytest.raises(ValueError, match="act_input"):
        mx_triton_tensorwise.quantize_tensorwise(x, True, True, "e5m2", history=d.history, step=1, window=2,
                                                 use_history=True, act=2)
    with pytest.raises(ValueError, match="delayed scaling"):
        mx_triton_tensorwise.quantize_tensorwise(x, True, True, "e4m3", act=1)
    with pytest.raises(mx.MXFormatError, match="cast activation"):
        mx.apply_cast_activation(x, "relu")


def _mlp(seed: int, recipe: str = "tensorwise", scaling: str = "delayed") -> nn.Sequential:
    torch.manual_seed(seed)
    cfg = Fp8Config(recipe=recipe, scaling=scaling, emulate=True)
    return nn.Sequential(Fp8Linear(24, 64, config=cfg), nn.GELU(), Fp8Linear(64, 24, config=cfg))


def test_fused_mlp_equals_the_layer_chain_over_steps():
    """Same weights, inputs and output gradients; four steps with an optimizer step (and so a new delayed-scaling
    step) after each: the fused MLP's output and every gradient equal the Fp8Linear / GELU / Fp8Linear chain's
    bit for bit, and both keep the same amax histories."""
    chain, fused = _mlp(0), _mlp(0)
    assert fp8_mlp.fusable(fused[0], fused[1], fused[2])
    opt_c = torch.optim.SGD(chain.parameters(), lr=0.1)
    opt_f = torch.optim.SGD(fused.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        x = torch.randn(5, 7, 24, generator=g) * (1 + step)
        dy = torch.randn(5, 7, 24, generator=g)
        xc, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
        yc = chain(xc)
        yf = fp8_mlp.gelu_mlp(xf, fused[0], fused[2])
        yc.backward(dy)
        yf.backward(dy)
        assert torch.equal(yc, yf), step
        assert torch.equal(xc.grad, xf.grad), step
        for pc, pf in zip(chain.parameters(), fused.parameters()):
            assert torch.equal(pc.grad, pf.grad), step
        for lc, lf in ((chain[0], fused[0]), (chain[2], fused[2])):
            assert torch.equal(lc._amax_state.history, lf._amax_state.history), step
        opt_c.step()
        opt_f.step()
        opt_c.zero_grad()
        opt_f.zero_grad()


@pytest.mark.parametrize("fast_accum,dgrad_fast,wgrad_fast", [("output", False, False), ("dgrad", True, False),
                                                               ("all", True, True)])
def test_fast_accum_option_reaches_the_backward_gemms(monkeypatch, fast_accum, dgrad_fast, wgrad_fast):
    """Each GEMM's fast-accumulation flag, in the layer chain and the fused MLP: the two forward GEMMs always fast,
    the two input-gradient GEMMs with ``fast_accum`` "dgrad" or "all", the two weight-gradient GEMMs with "all"."""
    from kernels.fp8_linear import _Plan

    flags: list[bool] = []
    real = _Plan.gemm
    monkeypatch.setattr(_Plan, "gemm", lambda self, *a, fast_accum=False, **kw: flags.append(fast_accum)
                        or real(self, *a, fast_accum=fast_accum, **kw))
    torch.manual_seed(0)
    cfg = Fp8Config(recipe="tensorwise", scaling="delayed", wgrad="recipe", emulate=True, fast_accum=fast_accum)
    m = nn.Sequential(Fp8Linear(24, 64, config=cfg), nn.GELU(), Fp8Linear(64, 24, config=cfg))
    x = torch.randn(10, 24, requires_grad=True)
    for run in (lambda: m(x), lambda: fp8_mlp.gelu_mlp(x, m[0], m[2])):
        flags.clear()
        y = run()
        assert flags == [True, True]
        y.square().sum().backward()
        assert flags[2:] == [dgrad_fast, wgrad_fast] * 2  # each layer's input gradient, then its weight gradient
    with pytest.raises(Fp8LinearError, match="fast_accum"):
        Fp8Config(recipe="tensorwise", fast_accum="backward")
    with pytest.raises(Fp8LinearError, match="fast_accum='all' is a tensorwise option"):
        Fp8Config(recipe="blockwise", fast_accum="all")
    with pytest.raises(Fp8LinearError, match="fast_accum='dgrad' is a tensorwise option"):
        Fp8Config(recipe="blockwise", fast_accum="dgrad")


def test_fusable_only_for_tensorwise_delayed_exact_gelu_in_training():
    m = _mlp(0)
    assert fp8_mlp.fusable(m[0], m[1], m[2])
    assert not fp8_mlp.fusable(m[0], nn.GELU(approximate="tanh"), m[2])
    assert not fp8_mlp.fusable(m[0], nn.ReLU(), m[2])
    for other in (_mlp(0, recipe="blockwise", scaling="current"), _mlp(0, scaling="current")):
        assert not fp8_mlp.fusable(other[0], other[1], other[2])
    m.eval()  # eval casts use current scaling: the layers run unfused
    assert not fp8_mlp.fusable(m[0], m[1], m[2])
    plain = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
    assert not fp8_mlp.fusable(plain[0], plain[1], plain[2])


def test_model_mlp_takes_the_fused_path_and_matches(monkeypatch):
    from model.layers import MLP
    from train.precision import PrecisionPolicy, apply_precision_policy

    torch.manual_seed(0)
    a, b = MLP(24, 64), MLP(24, 64)
    b.load_state_dict(a.state_dict())
    for m in (a, b):
        apply_precision_policy(m, PrecisionPolicy(mlp="tensorwise", scaling="delayed", wgrad="recipe", emulate=True))
    calls = []
    real = fp8_mlp.gelu_mlp
    monkeypatch.setattr(fp8_mlp, "gelu_mlp", lambda *args: calls.append(1) or real(*args))
    x = torch.randn(9, 24)
    monkeypatch.setattr(fp8_mlp, "FUSE", False)
    ya = a(x)
    monkeypatch.setattr(fp8_mlp, "FUSE", True)
    yb = b(x)
    assert calls == [1] and torch.equal(ya, yb)
    fp8_step()
