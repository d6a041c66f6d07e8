"""Tensorwise delayed scaling: the Triton cast (interpreter) against the PyTorch reference bit for bit over
several steps, the history window rule, the first-step fallback, saturation and non-finite values, and the
layer's step rule (optimizer steps, micro-batches, activation checkpointing, eval mode)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton kernels are defined

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from kernels import mx, mx_triton_tensorwise
from kernels.fp8_linear import Fp8Config, Fp8Linear, Fp8LinearError, fp8_step
from tests.kernels.linear_steps import run

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
FORMATS = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


def f32_bits(v: float) -> int:
    return int(torch.tensor(v, dtype=torch.float32).view(torch.int32))


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_delayed_cast_matches_reference_bitwise_over_steps(fmt, dtype):
    """Six steps, window 3, data growing 4x a step (so the delayed scale saturates), a NaN in step 4: codes of
    both layouts, scale, column sums and the history ring equal the reference's after every step."""
    g = torch.Generator().manual_seed(0)
    h_ref, h_tri = mx.new_amax_history(3)[0], mx.new_amax_history(3)[0]
    for step in range(6):
        x = (torch.randn(37, 70, generator=g) * 4.0**step).to(dtype)  # neither dim a multiple of 16
        if step == 4:
            x[2, 3] = float("nan")
        d_ref = mx.DelayedScale(h_ref, step, 3, use_history=step > 0)
        d_tri = mx.DelayedScale(h_tri, step, 3, use_history=step > 0)
        a, b, s_ref = mx.quantize_tensorwise_both(x, fmt, backend="ref", col_sums=True, delayed=d_ref)
        c, d, s_tri = mx.quantize_tensorwise_both(x, fmt, backend="triton", col_sums=True, delayed=d_tri)
        assert torch.equal(bits(a.data), bits(c.data)) and torch.equal(bits(b.data), bits(d.data))
        assert torch.equal(bits(a.scale), bits(c.scale))
        assert torch.equal(h_ref, h_tri)
        want = x.double().sum(0)
        assert torch.equal(s_tri.isnan(), want.isnan())  # the bias gradient, summed by the cast pass
        ok = want.isfinite()
        assert ((s_tri.double() - want).abs() <= 1e-6 * x.double().abs().sum(0))[ok].all()
        q = mx.quantize_tensorwise(x, 0, fmt, backend="triton", delayed=d_tri)  # one layout: same codes
        assert torch.equal(bits(q.data), bits(b.data))


@pytest.mark.parametrize("row_step", [1, 3])
def test_recording_cast_loops_over_row_tiles(row_step):
    """The recording cast's programs walk every row_step-th row tile (4 tiles of 64 rows here), keeping the amax
    and the column sums across them: codes, scale, ring and sums must not depend on row_step."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(200, 70, generator=g)
    x[150, 5] = 1000.0  # the amax sits in a later row tile
    h_ref, h_tri = mx.new_amax_history(2)[0], mx.new_amax_history(2)[0]
    for step in range(2):
        d_ref = mx.DelayedScale(h_ref, step, 2, use_history=step > 0)
        a, b = mx.quantize_tensorwise_both(x * (step + 1), "e4m3", backend="ref", delayed=d_ref)
        rows, cols, sums = mx_triton_tensorwise.quantize_tensorwise(x * (step + 1), True, True, "e4m3", col_sums=True,
                                                         history=h_tri, step=step, window=2,
                                                         use_history=step > 0, row_step=row_step)
        assert torch.equal(bits(rows[0]), bits(a.data)) and torch.equal(bits(cols[0]), bits(b.data))
        assert torch.equal(bits(rows[1]), bits(a.scale)) and torch.equal(h_ref, h_tri)
        torch.testing.assert_close(sums, (x * (step + 1)).sum(0), rtol=1e-5, atol=1e-4)


def test_history_window_rule():
    """The scale of step s is the max amax recorded in steps s-window .. s-1: not the current step's, not older."""
    window = 2
    h = mx.new_amax_history(window)[0]
    amaxes = [8.0, 1.0, 2.0, 0.5]
    for step, a in enumerate(amaxes):
        mx.quantize_tensorwise(torch.full((4, 16), a), 1, "e4m3", backend="triton",
                               delayed=mx.DelayedScale(h, step, window, use_history=False))
    # step 4 reads steps 2 and 3 (2.0, 0.5); 8.0 (step 0) has left the window, 1.0 (step 1) too
    assert mx.tensorwise_history_amax_ref(h, 4, window).item() == f32_bits(2.0)
    assert mx.tensorwise_history_amax_ref(h, 3, window).item() == f32_bits(2.0)  # steps 1, 2
    assert mx.tensorwise_history_amax_ref(h, 2, window).item() == f32_bits(1.0)  # steps 0, 1 (slot 0 holds 3)
    # the Triton cast at step 4 uses that max: amax 2.0 -> scale 2^ceil(log2(2/448)) = 2^-7
    q = mx.quantize_tensorwise(torch.full((4, 16), 0.25), 1, "e4m3", backend="triton",
                               delayed=mx.DelayedScale(h, 4, window, use_history=True))
    assert q.scale.item() == 2.0**-7
    # a second cast in the same step (a micro-batch, a recomputed forward) keeps the scale and max-combines
    q2 = mx.quantize_tensorwise(torch.full((4, 16), 100.0), 1, "e4m3", backend="triton",
                                delayed=mx.DelayedScale(h, 4, window, use_history=True))
    assert q2.scale.item() == 2.0**-7
    assert int(h[4 % (window + 1)]) == (4 << 31) | f32_bits(100.0)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_margin_gives_the_history_scale_headroom(fmt):
    """A margin of m binades: a scale from the history covers 2**m x its amax (Triton and reference bit for bit),
    so a step up to 2**m over the window does not saturate; the first step (current scaling) ignores it."""
    h_ref, h_tri = mx.new_amax_history(2)[0], mx.new_amax_history(2)[0]
    x0 = torch.randn(40, 48, generator=torch.Generator().manual_seed(3))
    fmax = FORMATS[fmt][1]
    for step, x in enumerate((x0, 6 * x0)):  # step 1: 6x the window's amax
        d_ref = mx.DelayedScale(h_ref, step, 2, use_history=step > 0, margin=3)
        d_tri = mx.DelayedScale(h_tri, step, 2, use_history=step > 0, margin=3)
        a, b = mx.quantize_tensorwise_both(x, fmt, backend="ref", delayed=d_ref)
        c, d = mx.quantize_tensorwise_both(x, fmt, backend="triton", delayed=d_tri)
        assert torch.equal(bits(a.data), bits(c.data)) and torch.equal(bits(b.data), bits(d.data))
        assert torch.equal(bits(a.scale), bits(c.scale)) and torch.equal(h_ref, h_tri)
        plain = mx.quantize_tensorwise_ref(x, 1, fmt, delayed=mx.DelayedScale(h_ref.clone(), step, 2, step > 0))
        if step == 0:
            assert torch.equal(bits(a.data), bits(plain.data))
        else:
            assert a.scale.item() == 8 * plain.scale.item()
            assert plain.data.float().abs().max().item() == fmax  # without the margin the step saturates
            assert a.data.float().abs().max().item() < fmax
            torch.testing.assert_close(a.data.float()[:, :48] * a.scale, x, rtol=0.25, atol=1e-3)
            over = [mx.delayed_overflow_ref(h_ref, 1, 2, fmt, margin=m).item() for m in (0, 3)]
            assert over[0] > 1 >= over[1] and over[0] == pytest.approx(8 * over[1])


def test_first_step_fallback_is_current_scaling():
    """Without history the delayed cast is current scaling bit for bit (Triton and reference) and records."""
    torch.manual_seed(1)
    x = torch.randn(40, 48) * 3
    for backend in ("ref", "triton"):
        h = mx.new_amax_history(4)[0]
        rows, cols = mx.quantize_tensorwise_both(x, "e5m2", backend=backend,
                                                 delayed=mx.DelayedScale(h, 0, 4, use_history=False))
        cur = mx.quantize_tensorwise_ref(x, 1, "e5m2"), mx.quantize_tensorwise_ref(x, 0, "e5m2")
        assert torch.equal(bits(rows.data), bits(cur[0].data)) and torch.equal(bits(cols.data), bits(cur[1].data))
        assert torch.equal(bits(rows.scale), bits(cur[0].scale))
        assert int(h[0]) == f32_bits(float(x.abs().max()))  # step 0: no step tag


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_saturation_and_non_finite_values(fmt):
    """Beyond the delayed scale's range values saturate to +-max; NaN/Inf elements get NaN codes (the rest of the
    tensor stays finite); a non-finite amax in the history makes the next steps' tensors all NaN."""
    dt, fmax = FORMATS[fmt]
    for backend in ("ref", "triton"):
        h = mx.new_amax_history(2)[0]
        mx.quantize_tensorwise(torch.ones(4, 16), 1, fmt, backend=backend,
                               delayed=mx.DelayedScale(h, 0, 2, use_history=False))
        x = torch.ones(4, 16)
        x[0, :4] = torch.tensor([1e6, -1e6, float("inf"), float("nan")])
        q = mx.quantize_tensorwise(x, 1, fmt, backend=backend, delayed=mx.DelayedScale(h, 1, 2, use_history=True))
        s = q.scale.item()
        assert s * fmax >= 1.0 > s * fmax / 2  # scale from step 0's amax (1.0), not this step's
        y = mx.dequantize_scaled(q)
        assert y[0, 0].item() == s * fmax and y[0, 1].item() == -s * fmax  # saturated
        assert y[0, 2:4].isnan().all() and torch.isfinite(y[1:]).all() and torch.isfinite(y[0, 4:]).all()
        q2 = mx.quantize_tensorwise(torch.ones(4, 16), 1, fmt, backend=backend,
                                    delayed=mx.DelayedScale(h, 2, 2, use_history=True))
        assert q2.scale.isnan() and mx.dequantize_scaled(q2).isnan().all()  # step 1 recorded NaN


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_overflow_of_a_step_says_whether_its_cast_saturated(fmt):
    """`delayed_overflow_ref`: the step's amax over the range its delayed scale gave; above 1 exactly when some
    element lay beyond that range (and was saturated). 0 for a step without history or with a non-finite amax."""
    _, fmax = FORMATS[fmt]
    for backend in ("ref", "triton"):
        for factor in (0.5, 1.5, 1.9, 3.0, 1e6):
            h = mx.new_amax_history(2)[0]
            mx.quantize_tensorwise(torch.ones(4, 16), 1, fmt, backend=backend,
                                   delayed=mx.DelayedScale(h, 0, 2, use_history=False))
            assert float(mx.delayed_overflow_ref(h, 0, 2, fmt)) == 0.0  # current scaling: nothing to exceed
            x = torch.ones(4, 16)
            x[1, 3] = factor
            q = mx.quantize_tensorwise(x, 1, fmt, backend=backend, delayed=mx.DelayedScale(h, 1, 2, True))
            limit = q.scale.item() * fmax
            ratio = float(mx.delayed_overflow_ref(h, 1, 2, fmt))
            assert ratio == pytest.approx(max(factor, 1.0) / limit, rel=1e-6)
            saturated = mx.dequantize_scaled(q)[1, 3].item() < factor
            assert (ratio > 1) == saturated == (factor > limit), (backend, factor)
        x[0, 0] = float("nan")
        mx.quantize_tensorwise(x, 1, fmt, backend=backend, delayed=mx.DelayedScale(h, 2, 2, True))
        assert float(mx.delayed_overflow_ref(h, 2, 2, fmt)) == 0.0  # NaN codes, not saturation


# ---- the layer


def delayed_layer(base: nn.Linear, window: int = 4, **kw) -> Fp8Linear:
    return Fp8Linear.from_linear(base, Fp8Config(recipe="tensorwise", wgrad="recipe", emulate=True,
                                                 scaling="delayed", amax_history=window, **kw))


def test_layer_first_step_equals_current_scaling_then_uses_history():
    torch.manual_seed(2)
    base = nn.Linear(64, 32)
    x, dy = torch.randn(24, 64), torch.randn(24, 32)
    cur = Fp8Linear.from_linear(base, Fp8Config(recipe="tensorwise", wgrad="recipe", emulate=True))
    lin = delayed_layer(base)
    for a, b in zip(run(lin, x, dy), run(cur, x, dy)):
        assert torch.equal(a, b)  # step 0: no history, current scaling
    assert torch.equal(lin._amax_state.newest_overflow("e5m2"), torch.zeros(2))  # nothing to saturate against
    fp8_step()
    # step 1 with x 8x larger: the delayed scales come from step 0's amaxes, so x and dY saturate
    out = run(lin, 8 * x, 8 * dy)
    ref = run(cur, 8 * x, 8 * dy)
    assert not torch.equal(out[0], ref[0])
    assert (out[0] - ref[0]).abs().max() > 0.1 * ref[0].abs().max()
    st = lin._amax_state
    assert st.step == 1 and st.last == [1, 1] and st.use_history == (True, True)
    want_x = (1 << 31) | f32_bits(float((8 * x).abs().max()))
    assert int(st.history[0, 1]) == want_x  # this step's x amax, tagged with step 1
    assert (st.newest_overflow("e5m2") > 1).all()  # both rings' casts saturated, and say so


def test_optimizer_step_ends_the_step_and_micro_batches_share_it():
    torch.manual_seed(3)
    base = nn.Linear(32, 16)
    lin = delayed_layer(base, window=2)
    opt = torch.optim.SGD(lin.parameters(), lr=0.0)
    x, dy = torch.randn(8, 32), torch.randn(8, 16)
    run(lin, x, dy)
    run(lin, 2 * x, dy)  # second micro-batch: same step, amax max-combined
    st = lin._amax_state
    assert st.step == 0 and int(st.history[0, 0]) == f32_bits(float((2 * x).abs().max()))
    opt.step()  # the global optimizer hook ends the step
    opt.step()  # two optimizer steps before the next forward still make one layer step
    run(lin, x, dy)
    assert st.step == 1 and st.use_history == (True, True)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recompute_uses_the_same_scale(reentrant):
    """A block of two delayed-scaling layers under activation checkpointing gives the gradients of the same block
    without checkpointing, in a step with history, even when another micro-batch of the same step (100x larger,
    between the forward and its backward) has raised the amax recorded for that step."""
    torch.manual_seed(4)
    l1, l2 = nn.Linear(32, 64), nn.Linear(64, 16)

    def block():
        return nn.Sequential(delayed_layer(l1), nn.GELU(), delayed_layer(l2))

    plain, ckpt = block(), block()
    x0, x, dy = torch.randn(8, 32), torch.randn(8, 32), torch.randn(8, 16)
    grads = []
    for model, use_ckpt in ((plain, False), (ckpt, True)):
        model(x0.clone().requires_grad_()).backward(dy)  # step 0: fills the history
        fp8_step()
        xi = x.clone().requires_grad_()
        for p in model.parameters():
            p.grad = None
        y = checkpoint(model, xi, use_reentrant=reentrant) if use_ckpt else model(xi)
        with torch.no_grad():
            model(100 * x)  # another micro-batch of this step, before the first one's backward
        y.backward(dy)
        grads.append([xi.grad] + [p.grad.clone() for p in model.parameters()])
        fp8_step()
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_eval_mode_uses_current_scaling_and_records_nothing():
    torch.manual_seed(5)
    base = nn.Linear(32, 16)
    lin = delayed_layer(base)
    cur = Fp8Linear.from_linear(base, Fp8Config(recipe="tensorwise", emulate=True))
    x = torch.randn(8, 32)
    run(lin, x, torch.randn(8, 16))
    fp8_step()
    lin.eval()
    with torch.no_grad():
        assert torch.equal(lin(5 * x), cur(5 * x))
    assert lin._amax_state.last == [0, 0]


def test_config_validation():
    with pytest.raises(Fp8LinearError, match="scaling must be one of"):
        Fp8Config(recipe="tensorwise", scaling="lazy")
    with pytest.raises(Fp8LinearError, match="amax_history must be an int >= 1"):
        Fp8Config(recipe="tensorwise", scaling="delayed", amax_history=0)
    with pytest.raises(Fp8LinearError, match="scaling='delayed' is a tensorwise option"):
        Fp8Config(recipe="blockwise", scaling="delayed")
    for margin in (-1, 7, 1.5, True):
        with pytest.raises(Fp8LinearError, match=r"grad_margin must be an int in 0\.\.6"):
            Fp8Config(recipe="tensorwise", scaling="delayed", grad_margin=margin)
    with pytest.raises(Fp8LinearError, match="grad_margin is a delayed-scaling option"):
        Fp8Config(recipe="tensorwise", grad_margin=2)
    with pytest.raises(mx.MXFormatError, match="window must be >= 1"):
        mx.new_amax_history(0)
    assert "scaling=delayed (history 4)" in repr(delayed_layer(nn.Linear(16, 16)))


def test_compiled_block_runs_delayed_layers_eagerly_and_matches():
    """Under torch.compile (as train.compile compiles MLP blocks) a delayed-scaling layer runs outside the graph:
    the same outputs and gradients as eager over steps, and its step counter still advances."""
    torch.manual_seed(6)
    l1, l2 = nn.Linear(32, 64), nn.Linear(64, 16)
    eager = nn.Sequential(delayed_layer(l1), nn.GELU(), delayed_layer(l2))
    comp = nn.Sequential(delayed_layer(l1), nn.GELU(), delayed_layer(l2))
    comp.compile(backend="eager", dynamic=True)
    from torch._dynamo.utils import counters

    run_steps(eager, comp, range(2))
    compiled = dict(counters["stats"])
    run_steps(eager, comp, range(2, 4))
    assert dict(counters["stats"]) == compiled  # new steps compile nothing more
    assert comp[0]._amax_state.step == 3 and comp[0]._amax_state.use_history == (True, True)


def run_steps(eager: nn.Module, comp: nn.Module, steps: range) -> None:
    for step in steps:
        x, dy = torch.randn(8 + step, 32) * (step + 1), torch.randn(8 + step, 16)
        outs = []
        for model in (eager, comp):
            xi = x.clone().requires_grad_()
            for p in model.parameters():
                p.grad = None
            y = model(xi)
            y.backward(dy)
            outs.append([y.detach(), xi.grad] + [p.grad.clone() for p in model.parameters()])
        for a, b in zip(*outs):
            assert torch.equal(a, b)
        fp8_step()
