"""Correctness checks run by benchmarks/fp8_linear.py before it times anything (on the GPU, fresh random data).

Triton quantizers against the PyTorch reference bit for bit (NaN/Inf, zero blocks and fp32 subnormals included),
the delayed-scaling cast over several steps, and each FP8 linear's output and gradients against its emulated
reference and a float64 linear. Each check returns ``(label, result)`` rows for the benchmark's table.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels import mx
from kernels.fp8_linear import Fp8Config, Fp8Linear, fp8_step


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    def u(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().view(torch.uint8) if t.element_size() == 1 else t.contiguous().view(torch.int32)
    return a.shape == b.shape and torch.equal(u(a).cpu(), u(b).cpu())


def check_quantizers(dev: str, only_tensorwise: bool = False) -> list[tuple[str, str]]:
    rows = []
    g = torch.Generator(device="cpu").manual_seed(1)
    for dt in (torch.float32, torch.bfloat16):
        x = (torch.randn(1000, 1000, generator=g) * torch.logspace(-6, 6, 1000)).to(dt)
        x[3, 5] = float("nan")
        x[10, 40] = float("inf")
        x[20, :64] = 0
        if dt == torch.float32:
            x[30, 64:192] = torch.rand(128, generator=g) * 1e-39  # fp32 subnormals
        xc = x.to(dev)
        for axis in (() if only_tensorwise else (0, 1)):
            ref, tri = mx.mx_quantize_ref(x, axis), mx.mx_quantize(xc, axis, backend="triton")
            ok = bits_equal(ref.data, tri.data) and bits_equal(ref.scale, tri.scale)
            d_ref = mx.mx_dequantize_ref(ref, torch.bfloat16)
            d_tri = mx.mx_dequantize(tri, torch.bfloat16, backend="triton")
            okd = torch.equal(d_ref.float().nan_to_num(7.0), d_tri.float().cpu().nan_to_num(7.0))
            r1, t1 = mx.quantize_1x128_ref(x, axis), mx.quantize_1x128(xc, axis, backend="triton")
            ok1 = bits_equal(r1.data, t1.data) and bits_equal(r1.scale, t1.scale)
            rows.append((f"mx quantize axis={axis} {dt}", str(ok)))
            rows.append((f"mx dequantize->bf16 axis={axis} {dt}", str(okd)))
            rows.append((f"1x128 quantize axis={axis} {dt}", str(ok1)))
        xf = x.nan_to_num(0.0, 0.0, 0.0)  # one non-finite element makes the whole tensor NaN: check finite data
        if only_tensorwise:
            rows += _check_tensorwise(x, xf, dev, dt)
            continue
        (a, b), (c, d) = mx.mx_quantize_both(xc, backend="triton"), mx.quantize_1x128_both(xc, backend="triton")
        rows.append((f"mx both {dt}", str(bits_equal(a.data, mx.mx_quantize_ref(x, 1).data)
                                         and bits_equal(b.data, mx.mx_quantize_ref(x, 0).data))))
        rows.append((f"1x128 both {dt}", str(bits_equal(c.data, mx.quantize_1x128_ref(x, 1).data)
                                            and bits_equal(d.data, mx.quantize_1x128_ref(x, 0).data))))
        w_ref, wt_ref = mx.quantize_128x128_ref(x)
        w_tri, wt_tri = mx.quantize_128x128(xc, backend="triton")
        rows.append((f"128x128 {dt}", str(bits_equal(w_ref.data, w_tri.data) and bits_equal(wt_ref.data, wt_tri.data)
                                         and bits_equal(w_ref.scale, w_tri.scale))))
        rq, rc = mx.quantize_rowwise(x, 0), mx.quantize_rowwise(xc, 0)
        rows.append((f"rowwise cuda==cpu {dt}", str(bits_equal(rq.data, rc.data))))
        rows += _check_tensorwise(x, xf, dev, dt)
    return rows


def _check_tensorwise(x: torch.Tensor, xf: torch.Tensor, dev: str, dt: torch.dtype) -> list[tuple[str, str]]:
    rows = []
    for fmt in ("e4m3", "e5m2"):
        for src, tag in ((x, "with NaN/Inf"), (xf, "finite")):
            a, b = mx.quantize_tensorwise_both(src.to(dev), fmt, backend="triton")
            ra, rb = mx.quantize_tensorwise_ref(src, 1, fmt), mx.quantize_tensorwise_ref(src, 0, fmt)
            ok = (bits_equal(a.data, ra.data) and bits_equal(b.data, rb.data)
                  and bits_equal(a.scale.reshape(1), ra.scale.reshape(1)))
            rows.append((f"tensorwise {fmt} both layouts {tag} {dt}", str(ok)))
    rows += check_delayed_quantizer(x, xf, dev, dt)
    a, b, sums = mx.quantize_tensorwise_both(xf.to(dev), "e5m2", backend="triton", col_sums=True)
    ok = bits_equal(a.data, mx.quantize_tensorwise_ref(xf, 1, "e5m2").data)
    err = rel(sums.cpu(), xf.double().sum(0))
    rows.append((f"tensorwise e5m2 both layouts + column sums {dt}: codes bit-exact, sums rel. err", f"{ok} {err:.1e}"))
    return rows


def check_delayed_quantizer(x: torch.Tensor, xf: torch.Tensor, dev: str, dt: torch.dtype) -> list[tuple[str, str]]:
    """Delayed-scaling tensorwise cast (Triton on the GPU) against the reference over four steps of a window-2
    history: step 0 without history (current scaling), then scales from earlier steps, the data growing 8x a step
    (saturation), NaN/Inf in the last step; codes of both layouts, scale, history ring, column sums."""
    rows = []
    for fmt in ("e4m3", "e5m2"):
        h_ref, h_gpu = mx.new_amax_history(2)[0], mx.new_amax_history(2, dev)[0]
        ok, err = True, 0.0
        for step in range(4):
            src = (x if step == 3 else xf) * 8.0**step
            d_ref, d_gpu = (mx.DelayedScale(h, step, 2, use_history=step > 0) for h in (h_ref, h_gpu))
            a, b = mx.quantize_tensorwise_both(src, fmt, backend="ref", delayed=d_ref)
            c, d, sums = mx.quantize_tensorwise_both(src.to(dev), fmt, backend="triton", col_sums=True, delayed=d_gpu)
            ok &= (bits_equal(a.data, c.data) and bits_equal(b.data, d.data) and torch.equal(h_ref, h_gpu.cpu())
                   and bits_equal(a.scale.reshape(1), c.scale.reshape(1)))
            if step < 3:
                err = max(err, rel(sums.cpu(), src.double().sum(0)))
        rows.append((f"tensorwise delayed {fmt} both layouts, 4 steps (saturation, NaN/Inf) {dt}: bit-exact, "
                     "column sums rel. err", f"{ok} {err:.1e}"))
    return rows


def check_delayed_linear(dev: str) -> list[tuple[str, str]]:
    """Delayed-scaling tensorwise layer over three steps: native against its emulation (same histories) and
    against a float64 linear, per step (step 0 runs current scaling)."""
    rows = []
    torch.manual_seed(3)
    m, k, n = 1000, 1024, 512
    base = nn.Linear(k, n, device=dev, dtype=torch.bfloat16)
    lins = {e: Fp8Linear.from_linear(base, Fp8Config(recipe="tensorwise", scaling="delayed", emulate=e))
            for e in (False, True)}
    for step in range(3):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16) * (1 + step)
        dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        xd = x.double().requires_grad_()
        wd = base.weight.detach().double().requires_grad_()
        (xd @ wd.t() + base.bias.double()).backward(dy.double())
        out = {}
        for e, lin in lins.items():
            xi = x.clone().requires_grad_()
            base.weight.grad = base.bias.grad = None
            y = lin(xi)
            y.backward(dy)
            out[e] = (y.detach(), xi.grad, base.weight.grad.clone(), base.bias.grad.clone())
        f64 = ((xd @ wd.t() + base.bias.double()).detach(), xd.grad, wd.grad, dy.double().sum(0))
        rows.append((f"tensorwise delayed step {step}: native vs emulated (y, dx, dW, db)",
                     " ".join(f"{rel(a, b):.1e}" for a, b in zip(out[False], out[True]))))
        rows.append((f"tensorwise delayed step {step}: native vs float64 (y, dx, dW, db)",
                     " ".join(f"{rel(a, b):.1e}" for a, b in zip(out[False], f64))))
        fp8_step()
    return rows


def check_linears(dev: str, variants: list[tuple[str, dict]]) -> list[tuple[str, str]]:
    return (check_linears_dtype(dev, torch.float32, variants) + check_linears_dtype(dev, torch.bfloat16, variants)
            + check_delayed_linear(dev))


def check_linears_dtype(dev: str, dtype: torch.dtype, variants: list[tuple[str, dict]]) -> list[tuple[str, str]]:
    rows = []
    torch.manual_seed(2)
    m, k, n = 1000, 1024, 512  # tokens not a multiple of 128: exercises the padded wgrad
    x = torch.randn(m, k, device=dev, dtype=dtype)
    dy = torch.randn(m, n, device=dev, dtype=dtype)
    base = nn.Linear(k, n, device=dev, dtype=dtype)
    xd = x.double().requires_grad_()
    wd = base.weight.detach().double().requires_grad_()
    yd = xd @ wd.t() + base.bias.double()
    yd.backward(dy.double())
    for label, kw in variants:
        try:
            out = {}
            for emulate in (False, True):
                lin = Fp8Linear.from_linear(base, Fp8Config(emulate=emulate, **kw))
                xi = x.clone().requires_grad_()
                base.weight.grad = base.bias.grad = None
                y = lin(xi)
                y.backward(dy)
                out[emulate] = (y.detach(), xi.grad, base.weight.grad.clone(), base.bias.grad.clone())
            nat, emu = out[False], out[True]
            tag = str(dtype).replace("torch.", "")
            rows.append((f"{label} {tag}: native vs emulated (y, dx, dW, db)",
                         " ".join(f"{rel(a, b):.1e}" for a, b in zip(nat, emu))))
            rows.append((f"{label} {tag}: native vs float64 (y, dx, dW, db)",
                         " ".join(f"{rel(a, b):.1e}" for a, b in zip(nat, (yd, xd.grad, wd.grad, dy.double().sum(0))))))
        except Exception as e:  # report and continue: one broken recipe must not hide the others
            rows.append((f"{label} {dtype}", f"ERROR {type(e).__name__}: {str(e)[:300]}"))
    return rows
