"""The GELU MLP ``fc2(gelu(fc1(x)))`` of two tensorwise delayed-scaling ``Fp8Linear`` layers as one autograd
function whose casts apply the GELU as they read.

Run as three modules, the MLP writes ``h = gelu(u)`` in bf16 and its FP8 cast reads it back (forward), and writes
``du = gelu_backward(dh, u)`` and its cast reads that back (backward): two [tokens, hidden] tensors written and
read once more for nothing. Here the cast of fc2's input reads ``u`` and quantizes ``gelu(u)``, and the cast of
fc1's output gradient reads ``dh`` and ``u`` and quantizes ``du`` (with its column sums, the bias gradient):
``kernels.mx.quantize_tensorwise_both(act=...)``. The numbers are those of the three-module chain: the same
rounding of h and du to the activation dtype, the same delayed scales and amax histories (each layer keeps its
own ``AmaxState``). GEMMs, casts and scales otherwise as ``Fp8Linear`` runs them (``kernels.fp8_linear``).

Taken by ``model.layers.MLP`` when :func:`fusable`: both layers tensorwise with delayed scaling and FP8
weight gradients, the same configuration, an exact (erf) GELU, training mode. A step without history (a
layer's first) computes the GELU with torch and casts as usual. Measured on an H100 (65536 x 1024 -> 4096 -> 1024,
forward+backward): 4.28 ms against 4.59 for the three-module chain, 1.38x the bf16 MLP against 1.29x
(benchmarks/fp8_mlp.py; benchmarks/RESULTS.md, 2026-12-06).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kernels import mx
from kernels.fp8_linear import Fp8Config, Fp8Linear, _join_operand, _Plan, _split_operand

FUSE = True  # False: the MLP always runs as its three modules (for A/B timings)


def fusable(fc1: nn.Module, act: nn.Module, fc2: nn.Module) -> bool:
    """Whether ``fc2(act(fc1(x)))`` can run as :func:`gelu_mlp`."""
    if not (FUSE and isinstance(fc1, Fp8Linear) and isinstance(fc2, Fp8Linear) and isinstance(act, nn.GELU)):
        return False
    c = fc1.config
    return (act.approximate == "none" and c == fc2.config and c.recipe == "tensorwise" and c.scaling == "delayed"
            and c.wgrad == "recipe" and c.min_gemm == 0 and fc1.training and fc2.training
            and fc1.out_features == fc2.in_features)


class _Fp8GeluMlpFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor,
                b2: torch.Tensor | None, cfg: Fp8Config, out_dtype: torch.dtype, st1: Any, st2: Any) -> torch.Tensor:
        plan = _Plan.make(cfg, x, "Fp8 GELU MLP")
        step1, step2 = st1.begin(), st2.begin()
        (ux1, ctx.dy_hist1), (uh2, ctx.dy_hist2) = st1.use_history, st2.use_history
        ctx.plan, ctx.st1, ctx.st2, ctx.step1, ctx.step2 = plan, st1, st2, step1, step2
        xa, xt = plan.act_both(x, saved_input=True, delayed=st1.scale(0, step1, ux1))
        w1a, w1t = plan.weight(w1)
        u = plan.gemm(xa, w1a, out_dtype, bias=b1, fast_accum=True)
        ha, ht = mx.quantize_tensorwise_both(u, "e4m3", backend=plan.backend, delayed=st2.scale(0, step2, uh2),
                                             act="gelu")
        w2a, w2t = plan.weight(w2)
        y = plan.gemm(ha, w2a, out_dtype, bias=b2, fast_accum=True)
        ctx.forms = []
        saved = []
        for op in (xt, w1t, ht, w2t):  # FP8 operands go through save_for_backward (checkpointing frees them)
            tensors, form = _split_operand(op)
            ctx.forms.append((form, len(tensors)))
            saved += tensors
        ctx.save_for_backward(u, *saved)
        ctx.dtypes = (x.dtype, w1.dtype, w2.dtype, b1.dtype if b1 is not None else None,
                      b2.dtype if b2 is not None else None)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        plan = ctx.plan
        u, *rest = ctx.saved_tensors
        ops = []
        for form, n in ctx.forms:
            ops.append(_join_operand(form, rest[:n]))
            rest = rest[n:]
        xt, w1t, ht, w2t = ops
        x_dtype, w1_dtype, w2_dtype, b1_dtype, b2_dtype = ctx.dtypes
        fmt = plan.grad_format
        dya, dyt, db2 = mx.quantize_tensorwise_both(dy.contiguous(), fmt, backend=plan.backend, col_sums=True,
                                                    delayed=ctx.st2.scale(1, ctx.step2, ctx.dy_hist2))
        dh = plan.gemm(dya, w2t, u.dtype, fast_accum=plan.fast_accum_dgrad)
        dw2 = plan.gemm(dyt, ht, w2_dtype, fast_accum=plan.fast_accum_wgrad)
        dua, dut, db1 = mx.quantize_tensorwise_both(dh, fmt, backend=plan.backend, col_sums=True,
                                                    delayed=ctx.st1.scale(1, ctx.step1, ctx.dy_hist1),
                                                    act="gelu_backward", act_input=u)
        dx = plan.gemm(dua, w1t, x_dtype, fast_accum=plan.fast_accum_dgrad)
        dw1 = plan.gemm(dut, xt, w1_dtype, fast_accum=plan.fast_accum_wgrad)
        ctx.st1 = ctx.st2 = None
        return (dx, dw1.to(w1_dtype), db1.to(b1_dtype) if b1_dtype is not None else None, dw2.to(w2_dtype),
                db2.to(b2_dtype) if b2_dtype is not None else None, None, None, None, None)


@torch.compiler.disable  # delayed scaling keeps host step counters (see Fp8Linear._run_delayed)
def gelu_mlp(x: torch.Tensor, fc1: Fp8Linear, fc2: Fp8Linear) -> torch.Tensor:
    """``fc2(gelu(fc1(x)))`` in one autograd function (see the module docstring); requires :func:`fusable`."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, fc1.in_features)
    if x2.shape[0] == 0:
        return fc2(nn.functional.gelu(fc1(x)))
    dev = x2.device.type
    st1, st2 = fc1._delayed_state(x2), fc2._delayed_state(x2)
    out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x2.dtype
    with torch.autocast(dev, enabled=False):  # the recipe picks every GEMM's precision itself
        y = _Fp8GeluMlpFn.apply(x2, fc1.weight, fc1.bias, fc2.weight, fc2.bias, fc1.config, out_dtype, st1, st2)
    return y.reshape(*lead, fc2.out_features)
