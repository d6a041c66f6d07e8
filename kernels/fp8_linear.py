"""``Fp8Linear``: a drop-in ``nn.Linear`` whose three GEMMs run in block-scaled FP8.

For ``y = x W^T + b`` (x [M, K], W [N, K]) the layer runs

* output         ``y  = x  @ W^T``   reduction over K,
* input gradient ``dx = dy @ W``     reduction over N,
* weight gradient ``dW = dy^T @ x``  reduction over M (tokens),

each operand quantized along that GEMM's reduction dimension, per recipe:

========== ============================================ =============================================
recipe     operands                                     native GEMM (CUDA)
========== ============================================ =============================================
mxfp8      MXFP8: e4m3 + E8M0 scale per 32 elements     sm_100+: ``scaled_mm`` BlockWise1x32. Hopper:
                                                        ``mx_on_hopper="emulate"`` (default: Triton
                                                        quantize + decode to bf16, bf16 GEMM; exact MX
                                                        numerics, no FP8 speed) or ``"blockwise"`` (run
                                                        the blockwise recipe instead: FP8 speed, 128
                                                        blocks instead of 32)
blockwise  activations/gradients 1x128, weights 128x128 ``scaled_mm`` BlockWise1x128 x BlockWise128x128;
           (weight gradient: 1x128 on both operands)    wgrad BlockWise1x128 x BlockWise1x128
rowwise    one scale per row of each operand            ``scaled_mm`` RowWise
tensorwise one scale per tensor (an amax pass, then one ``torch._scaled_mm`` TensorWise (cuBLASLt);
           cast pass writing both layouts); e4m3 for x  the output GEMM with fast accumulation
           and W, e5m2 for dY (``grad_format``)
bf16       bf16 operands, fp32 accumulation             bf16 ``mm``
========== ============================================ =============================================

``fast_accum`` (tensorwise only): ``"output"`` (default) runs the output GEMM with cuBLAS's fast accumulation, as
common FP8 training recipes do, and the two backward GEMMs with full accumulation; ``"dgrad"`` runs the input
gradient fast too (its sums run over the layer's width), keeping the weight gradient's sums over every token in
full accumulation; ``"all"`` runs all three fast.
Measured on an H100 (benchmarks/RESULTS.md, "fast accumulation in the backward GEMMs"): inside the layer cuBLAS then
picks faster backward algorithms, 2-4% of the layer's forward+backward, at 4-60x the backward GEMMs' accumulation
error (6e-3 relative on a 65536-token weight gradient). Its held-out NE in ``gem_medium`` training, each FP8 run
against a bf16 run of its seed: RESULTS.md, "Targets at a glance".

``mx_scale`` (mxfp8 only): the E8M0 scale rule, ``"floor"`` (the OCP spec's, which saturates a block's values above
448 times its scale, up to 12.5%) or ``"ceil"`` (the exponent rounded up where the floor would saturate: still
MX data, nothing clipped; :mod:`kernels.mx`).

``wgrad`` picks the weight-gradient precision: ``"recipe"`` (same as the layer), ``"bf16"`` or
``"fp32"`` (high precision: the input is kept for the backward instead of its FP8 copy).
``blockwise_wgrad="128x128"`` quantizes the saved input in 128x128 tiles, so the blockwise weight-gradient
GEMM runs as (1x128, 128x128) instead of the slower (1x128, 1x128). Measured on an H200
(benchmarks/RESULTS.md, FP8 fifth round): ``tensorwise`` (dY in e5m2) is the fastest recipe on the large MLP
shapes, 1.42x bf16 ``nn.Linear`` over both MLP layers with delayed scaling and 1.31x with current scaling, then
``blockwise`` (1.12x).

``scaling`` (tensorwise only): ``"current"`` (default) derives each cast's scale from the tensor itself (an amax
pass, then the cast pass); ``"delayed"`` casts x and dY with a scale from the max amax of the last
``amax_history`` steps (:class:`kernels.mx.DelayedScale`): one pass over each, which also records its amax.
Weights keep current scaling (small tensors). A step is what lies between two optimizer steps: every
``torch.optim`` optimizer's ``step()`` ends the step (a global post-hook), and :func:`fp8_step` ends it by
hand (a loop without a ``torch.optim`` optimizer). Within a step the scales stay fixed, so a recomputed
forward (activation checkpointing) and every micro-batch of a gradient-accumulation step cast with the same
scale; their amaxes are max-combined and enter the history when the step ends. The first step of a layer
(no history yet) uses current scaling. Values beyond a delayed scale saturate to the format's max; the trainer
samples how often at each log line (``AmaxState.newest_overflow``, ``train/fp8_saturation.py``). dY's amax
outgrows its window far more often than x's, and ``grad_margin`` gives dY's delayed scale that many binades of
headroom, nearly free in e5m2 (it loses as many binades at the bottom of the format's 32). The history is
runtime state: not in the ``state_dict`` (a resumed run starts with one step of current scaling), per process
(ranks do not share amaxes), only in training mode (eval uses current scaling).

``min_gemm``: a call whose GEMM is smaller than this (tokens x in_features x out_features) runs as bf16
``F.linear``, as ``nn.Linear`` would. An FP8 layer's casts and per-call host work cost about 1 ms per
forward+backward in eager mode on an H200 host (1.0-1.8 ms, moving with the host's load), which small GEMMs do not
pay back. Measured there in two calls (tensorwise, benchmarks/RESULTS.md, "Where FP8 linears pay"): 0.16-0.73x bf16
at 1.7e10-6.9e10, 0.80-1.22x at 1.4e11, 1.35-1.67x at 2.7e11. So ``min_gemm=2e11`` keeps FP8 where it won in both
calls. The default 0 runs every call in FP8.

``emulate=True`` runs every recipe as quantize -> dequantize -> fp32 matmul, on any device: the
numerical reference of the native path (same quantized operands; only the accumulation order
differs). Without it, FP8 recipes on a CPU tensor raise :class:`Fp8LinearError`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kernels import mx
from kernels.fp8_delayed import AmaxState, fp8_step, register_step_hook  # noqa: F401  (fp8_step: public here too)

RECIPES = ("mxfp8", "blockwise", "rowwise", "tensorwise", "bf16")
GRAD_FORMATS = ("e5m2", "e4m3")
WGRAD_PRECISIONS = ("recipe", "bf16", "fp32")
MX_ON_HOPPER = ("emulate", "blockwise")
SCALINGS = ("current", "delayed")
FAST_ACCUM = ("output", "dgrad", "all")
# Recipes whose dY quantizer also returns dY's column sums (the bias gradient) from its read of dY, so the
# backward needs no separate pass over dY for db (a benchmark may drop a recipe to time the separate sum).
FUSED_BIAS_GRAD = {"mxfp8", "blockwise", "tensorwise"}


class Fp8LinearError(RuntimeError):
    """An FP8 linear layer asked for something the device or the shapes cannot do."""


@dataclass(frozen=True)
class Fp8Config:
    """How one :class:`Fp8Linear` computes. See the module docstring for the recipes."""

    recipe: str = "blockwise"
    wgrad: str = "recipe"
    emulate: bool = False
    mx_on_hopper: str = "emulate"
    mx_scale: str = "floor"  # mxfp8: the E8M0 scale rule, "floor" (OCP spec) or "ceil" (nothing saturates)
    blockwise_wgrad: str = "1x128"  # blocks of the saved input in the blockwise weight gradient
    grad_format: str = "e5m2"  # tensorwise: element format of dY (one scale spans the whole tensor)
    scaling: str = "current"  # tensorwise: "current" or "delayed" (x and dY; see the module docstring)
    amax_history: int = 16  # delayed scaling: the scale is the max amax of this many earlier steps
    grad_margin: int = 0  # delayed scaling: dY's scale covers 2**grad_margin x its history's amax (0-6)
    min_gemm: float = 0  # calls with tokens x in x out below this run bf16 F.linear (see the module docstring)
    fast_accum: str = "output"  # tensorwise: GEMMs with fast accumulation, "output", "dgrad" or "all" (module doc)

    def __post_init__(self) -> None:
        if self.fast_accum not in FAST_ACCUM:
            raise Fp8LinearError(f"Fp8Config.fast_accum must be one of {FAST_ACCUM}, got {self.fast_accum!r}")
        if self.scaling not in SCALINGS:
            raise Fp8LinearError(f"Fp8Config.scaling must be one of {SCALINGS}, got {self.scaling!r}")
        if not isinstance(self.amax_history, int) or isinstance(self.amax_history, bool) or self.amax_history < 1:
            raise Fp8LinearError(f"Fp8Config.amax_history must be an int >= 1 (steps), got {self.amax_history!r}")
        if not isinstance(self.grad_margin, int) or isinstance(self.grad_margin, bool) or not 0 <= self.grad_margin <= 6:
            raise Fp8LinearError(f"Fp8Config.grad_margin must be an int in 0..6 (binades), got {self.grad_margin!r}")
        if self.grad_margin and self.scaling != "delayed":
            raise Fp8LinearError(f"Fp8Config: grad_margin is a delayed-scaling option, but scaling is "
                                 f"{self.scaling!r}; use scaling='delayed' or grad_margin=0")
        if self.scaling == "delayed" and self.recipe not in ("tensorwise", "bf16"):
            raise Fp8LinearError(
                f"Fp8Config: scaling='delayed' is a tensorwise option, recipe is {self.recipe!r}; use "
                "recipe='tensorwise' or scaling='current'")
        if self.fast_accum != "output" and self.recipe not in ("tensorwise", "bf16"):
            raise Fp8LinearError(
                f"Fp8Config: fast_accum={self.fast_accum!r} is a tensorwise option, recipe is {self.recipe!r}; use "
                "recipe='tensorwise' or fast_accum='output'")
        if isinstance(self.min_gemm, bool) or not isinstance(self.min_gemm, (int, float)) or not self.min_gemm >= 0:
            raise Fp8LinearError(f"Fp8Config.min_gemm must be a number >= 0 (tokens x in x out), got {self.min_gemm!r}")
        if self.grad_format not in GRAD_FORMATS:
            raise Fp8LinearError(f"Fp8Config.grad_format must be one of {GRAD_FORMATS}, got {self.grad_format!r}")
        if self.blockwise_wgrad not in ("1x128", "128x128"):
            raise Fp8LinearError(
                f"Fp8Config.blockwise_wgrad must be '1x128' or '128x128', got {self.blockwise_wgrad!r}")
        if self.recipe not in RECIPES:
            raise Fp8LinearError(f"Fp8Config.recipe must be one of {RECIPES}, got {self.recipe!r}")
        if self.wgrad not in WGRAD_PRECISIONS:
            raise Fp8LinearError(f"Fp8Config.wgrad must be one of {WGRAD_PRECISIONS}, got {self.wgrad!r}")
        if self.mx_scale not in mx.MX_SCALE_RULES:
            raise Fp8LinearError(f"Fp8Config.mx_scale must be one of {mx.MX_SCALE_RULES}, got {self.mx_scale!r}")
        if self.mx_on_hopper not in MX_ON_HOPPER:
            raise Fp8LinearError(
                f"Fp8Config.mx_on_hopper must be one of {MX_ON_HOPPER}, got {self.mx_on_hopper!r}")


# ----------------------------------------------------------------------------------------------
# execution plan: which quantizers and which GEMM, decided once per call from config and device


@dataclass(frozen=True)
class _Plan:
    recipe: str  # effective recipe (mxfp8 may become blockwise on Hopper)
    native: bool  # False: emulate (dequantize + fp32 matmul)
    mx_hopper: bool  # mxfp8 on a GPU without MX tensor cores: decode to bf16, bf16 GEMM
    backend: str  # quantizer backend
    x_tiles: bool = False  # blockwise: 128x128 tiles for the input in the weight gradient
    grad_format: str = "e5m2"  # tensorwise: format of dY
    mx_scale: str = "floor"  # mxfp8: E8M0 scale rule
    fast_accum_dgrad: bool = False  # the input-gradient GEMM with fast accumulation too
    fast_accum_wgrad: bool = False  # and the weight-gradient GEMM

    @staticmethod
    def make(cfg: Fp8Config, x: torch.Tensor, where: str) -> _Plan:
        key = (cfg, x.device)  # a plan depends on the config and the device only: made once, not per call
        plan = _PLANS.get(key)
        if plan is None:
            p = _Plan._make(cfg, x, where)
            tiles = p.recipe == "blockwise" and cfg.blockwise_wgrad == "128x128"
            plan = _PLANS[key] = _Plan(p.recipe, p.native, p.mx_hopper, p.backend, x_tiles=tiles,
                                       grad_format=cfg.grad_format, mx_scale=cfg.mx_scale,
                                       fast_accum_dgrad=cfg.fast_accum in ("dgrad", "all"),
                                       fast_accum_wgrad=cfg.fast_accum == "all")
        return plan

    @staticmethod
    def _make(cfg: Fp8Config, x: torch.Tensor, where: str) -> _Plan:
        if cfg.emulate or cfg.recipe == "bf16":
            return _Plan(cfg.recipe, not cfg.emulate, False, "auto")
        if not x.is_cuda:
            raise Fp8LinearError(
                f"{where}: recipe {cfg.recipe!r} runs its FP8 GEMMs on CUDA only, got a {x.device.type} "
                "tensor. Move the model to a GPU, or set emulate=True (PrecisionPolicy.emulate) to run the "
                "quantize/dequantize reference on CPU.")
        cap = torch.cuda.get_device_capability(x.device)
        if cap < (8, 9):
            raise Fp8LinearError(
                f"{where}: FP8 GEMMs need compute capability 8.9+, this GPU is {cap[0]}.{cap[1]}; "
                "use recipe='bf16' or emulate=True.")
        if cfg.recipe == "blockwise" and cap[0] != 9:
            raise Fp8LinearError(
                f"{where}: the blockwise (1x128 / 128x128) scaled_mm path is a Hopper (sm_90) path, this GPU "
                f"is {cap[0]}.{cap[1]}; use recipe='mxfp8' (sm_100+) or 'rowwise'.")
        if cfg.recipe == "mxfp8" and cap[0] < 10:
            if cfg.mx_on_hopper == "blockwise":
                return _Plan("blockwise", True, False, "triton")
            return _Plan("mxfp8", True, True, "triton")
        return _Plan(cfg.recipe, True, False, "triton")

    # -- quantizers. An operand is a matrix quantized along its reduction dim, rows = output dim.

    @property
    def row_align(self) -> int:
        """Token rows of the native blockwise GEMMs are padded to a multiple of this (1: no padding).
        cuBLAS's blockwise FP8 GEMM refuses (CUBLAS_STATUS_NOT_SUPPORTED) a token count that is no multiple
        of 4, probably because the column-major 1x128 scale's leading dimension is the token count (H200,
        torch 2.11: M = 1000, 1004, 1008, 32 ran; 1001, 1002, 66001 were refused)."""
        return 4 if self.native and self.recipe == "blockwise" and not self.mx_hopper else 1

    def act(self, x: torch.Tensor, axis: int, grad: bool = False, col_sums: bool = False,
            delayed: mx.DelayedScale | None = None) -> Any:
        """``delayed``: tensorwise delayed scaling of this operand (None: current scaling)."""
        if col_sums:  # tensorwise only (FUSED_BIAS_GRAD): the pass that reads x first also sums the columns
            return mx.quantize_tensorwise(x, axis, self.grad_format if grad else "e4m3", backend=self.backend,
                                          col_sums=True, delayed=delayed)
        if self.recipe == "bf16":
            return (x if axis == 1 else x.t()).to(torch.bfloat16)
        if self.recipe == "mxfp8":
            return mx.mx_quantize(x, axis, backend=self.backend, scale_rule=self.mx_scale)
        if self.recipe == "blockwise":
            return mx.quantize_1x128(x, axis, backend=self.backend)
        if self.recipe == "tensorwise":
            return mx.quantize_tensorwise(x, axis, self.grad_format if grad else "e4m3", backend=self.backend,
                                          delayed=delayed)
        return mx.quantize_rowwise(_pad16(x, axis) if self.native else x, axis, backend=self.backend)

    def act_both(self, x: torch.Tensor, saved_input: bool = False, col_sums: bool = False,
                 grad: bool = False, delayed: mx.DelayedScale | None = None) -> tuple:
        if saved_input and self.x_tiles:  # (1x128, 128x128) wgrad GEMM runs faster than (1x128, 1x128)
            return self.act(x, 1), mx.quantize_128x128(x, backend=self.backend)[1]
        if self.recipe == "mxfp8":
            return mx.mx_quantize_both(x, backend=self.backend, col_sums=col_sums, scale_rule=self.mx_scale)
        if self.recipe == "blockwise":
            return mx.quantize_1x128_both(x, backend=self.backend, col_sums=col_sums)
        if self.recipe == "tensorwise":
            return mx.quantize_tensorwise_both(x, self.grad_format if grad else "e4m3", backend=self.backend,
                                               col_sums=col_sums, delayed=delayed)
        if self.recipe == "rowwise":
            if self.native and x.shape[0] % 16:  # only the per-column copy needs the padded reduction dim
                return self.act(x, 1), self.act(x, 0)
            return mx.quantize_rowwise_both(x, backend=self.backend)
        return self.act(x, 1), self.act(x, 0)

    def weight(self, w: torch.Tensor) -> tuple[Any, Any]:
        """(operand for the forward [N, K], operand for the input gradient [K, N])."""
        if self.recipe == "blockwise":
            return mx.quantize_128x128(w, backend=self.backend)
        return self.act_both(w)

    # -- GEMM: a [m, r] x bt [n, r] -> [m, n]

    def gemm(self, a: Any, bt: Any, out_dtype: torch.dtype, bias: torch.Tensor | None = None,
             fast_accum: bool = False) -> torch.Tensor:
        """``fast_accum``: tensorwise only (the forward GEMM, as common FP8 training recipes do)."""
        if bias is not None and self.native and self.recipe == "bf16":
            return torch.addmm(bias.to(a.dtype), a, bt.t()).to(out_dtype)  # bias in the GEMM epilogue
        if bias is not None and self.native and not self.mx_hopper:
            y = _scaled_mm_bias(a, bt, self.recipe, out_dtype, bias, fast_accum)
            if y is not None:
                return y
        y = self._gemm(a, bt, out_dtype, fast_accum)
        return y if bias is None else y + bias.to(y.dtype)

    def _gemm(self, a: Any, bt: Any, out_dtype: torch.dtype, fast_accum: bool = False) -> torch.Tensor:
        if not self.native:
            return (_dequant(a) @ _dequant(bt).t()).to(out_dtype)
        if self.recipe == "bf16":
            return (a @ bt.t()).to(out_dtype)
        if self.mx_hopper:
            da = mx.mx_dequantize(a, torch.bfloat16, backend=self.backend)
            db = mx.mx_dequantize(bt, torch.bfloat16, backend=self.backend)
            return (da @ db.t()).to(out_dtype)
        return _as(_scaled_mm(a, bt, self.recipe, out_dtype, fast_accum=fast_accum), out_dtype)


_PLANS: dict[tuple[Fp8Config, torch.device], _Plan] = {}


def _pad_rows(x: torch.Tensor, align: int) -> torch.Tensor:
    """Zero rows appended so the row count is a multiple of ``align`` (``x`` itself when it is)."""
    pad = (-x.shape[0]) % align
    return F.pad(x, (0, 0, 0, pad)) if pad else x


def _pad16(x: torch.Tensor, axis: int) -> torch.Tensor:
    """Zero-pad the reduction dim to a multiple of 16 (cuBLAS FP8 leading-dimension rule)."""
    n = x.shape[axis]  # the reduction dim: columns for axis=1, rows for axis=0
    pad = (-n) % 16
    if pad == 0:
        return x
    return F.pad(x, (0, pad)) if axis == 1 else F.pad(x, (0, 0, 0, pad))


def _dequant(op: Any) -> torch.Tensor:
    if isinstance(op, mx.MXTensor):
        return mx.mx_dequantize_ref(op)
    if isinstance(op, mx.ScaledTensor):
        return mx.dequantize_scaled(op)
    return op.float()  # bf16 operand: exact in fp32


def _round4_cols(s: torch.Tensor) -> torch.Tensor:
    pad = (-s.shape[1]) % 4
    return F.pad(s, (0, pad)) if pad else s


def _to_blocked(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 scales [rows, nb] -> the 32x4x4 swizzled layout BlockWise1x32 reads on sm_100+."""
    rows, cols = scale.shape
    nr, nc = -(-rows // 128), -(-cols // 4)
    padded = F.pad(scale, (0, nc * 4 - cols, 0, nr * 128 - rows))
    blocks = padded.view(nr, 128, nc, 4).permute(0, 2, 1, 3)
    return blocks.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1, 32, 16).flatten()


# "recipe/out dtype" -> whether scaled_mm took a fused bias on this build (probed on first use)
_BIAS_FUSION: dict[str, bool] = {}


def _scaled_mm_bias(a: Any, bt: Any, recipe: str, out_dtype: torch.dtype, bias: torch.Tensor,
                    fast_accum: bool = False) -> torch.Tensor | None:
    """scaled_mm with the bias in its epilogue, or None where this build/recipe does not take one."""
    od = out_dtype if out_dtype in (torch.bfloat16, torch.float32) else torch.bfloat16
    key = f"{recipe}/{od}"
    if _BIAS_FUSION.get(key) is False:
        return None
    try:
        y = _scaled_mm(a, bt, recipe, od, bias=_as(bias, od), fast_accum=fast_accum)
    except (RuntimeError, ValueError):  # e.g. "Bias is not supported when out_dtype is set to Float32"
        if key in _BIAS_FUSION:
            raise
        _BIAS_FUSION[key] = False
        return None
    _BIAS_FUSION[key] = True
    return _as(y, out_dtype)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)`` without the call where it is already that dtype (a host op saved per GEMM)."""
    return t if t.dtype == dtype else t.to(dtype)


def _scaled_mm(a: Any, bt: Any, recipe: str, out_dtype: torch.dtype,
               bias: torch.Tensor | None = None, fast_accum: bool = False) -> torch.Tensor:
    od = out_dtype if out_dtype in (torch.bfloat16, torch.float32) else torch.bfloat16
    if recipe == "tensorwise":  # cuBLASLt; a row-major, b column-major, scalar fp32 scales
        return torch._scaled_mm(a.data, bt.data.t(), a.scale, bt.scale, bias=bias, out_dtype=od,
                                use_fast_accum=fast_accum)
    st, sw = F.ScalingType, F.SwizzleType
    if recipe == "rowwise":
        return F.scaled_mm(a.data, bt.data.t(), a.scale, st.RowWise, bt.scale.t(), st.RowWise,
                           bias=bias, output_dtype=od)
    if recipe == "blockwise":
        if bt.kind == "128x128":  # scale [nb, kb] -> [L4, nb] column-major
            sb, rb = _round4_cols(bt.scale).contiguous().t(), st.BlockWise128x128
        else:
            sb, rb = bt.scale, st.BlockWise1x128
        return F.scaled_mm(a.data, bt.data.t(), a.scale, st.BlockWise1x128, sb, rb,
                           bias=bias, output_dtype=od)
    e8 = torch.float8_e8m0fnu
    return F.scaled_mm(a.data, bt.data.t(), _to_blocked(a.scale).view(e8), st.BlockWise1x32,
                       _to_blocked(bt.scale).view(e8), st.BlockWise1x32,
                       swizzle_a=sw.SWIZZLE_32_4_4, swizzle_b=sw.SWIZZLE_32_4_4, bias=bias, output_dtype=od)


def _check_native_shapes(plan: _Plan, m: int, k: int, n: int, where: str) -> None:
    if not plan.native or plan.recipe == "bf16" or plan.mx_hopper:
        return
    need = 128 if plan.recipe == "blockwise" else (32 if plan.recipe == "mxfp8" else 16)  # 16: row/tensorwise
    if k % need or n % need:
        raise Fp8LinearError(
            f"{where}: recipe {plan.recipe!r} needs in_features and out_features divisible by {need} "
            f"(got {k} -> {n}); pick a multiple, keep this layer high precision, or set emulate=True.")


def _hp_gemm(a: torch.Tensor, bt: torch.Tensor, prec: str, native: bool) -> torch.Tensor:
    """High-precision a @ bt^T (wgrad kept in bf16 or fp32), fp32 result."""
    dt = torch.bfloat16 if prec == "bf16" else torch.float32
    if native:
        return (a.to(dt) @ bt.to(dt).t()).float()
    return a.to(dt).float() @ bt.to(dt).float().t()


def _split_operand(op: Any) -> tuple[list[torch.Tensor], Any]:
    """A quantized operand (None, a tensor, or a dataclass such as ``mx.ScaledTensor``) as its tensors plus a
    tensor-free form to rebuild it from them (:func:`_join_operand`)."""
    if op is None or isinstance(op, torch.Tensor):
        return ([] if op is None else [op]), op is None
    if not is_dataclass(op):
        raise Fp8LinearError(f"Fp8Linear: cannot save a quantized operand of type {type(op).__name__}")
    names = [f.name for f in fields(op) if isinstance(getattr(op, f.name), torch.Tensor)]
    rest = {f.name: getattr(op, f.name) for f in fields(op) if f.name not in names}
    return [getattr(op, n) for n in names], (type(op), names, rest)


def _join_operand(form: Any, tensors: list[torch.Tensor]) -> Any:
    if form is True:
        return None
    if form is False:
        return tensors[0]
    cls, names, rest = form
    return cls(**rest, **dict(zip(names, tensors)))


class _Fp8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                cfg: Fp8Config, where: str, out_dtype: torch.dtype, state: AmaxState | None) -> torch.Tensor:
        plan = _Plan.make(cfg, x, where)
        m, k = x.shape
        n = w.shape[0]
        _check_native_shapes(plan, m, k, n, where)
        wgrad = plan.recipe if cfg.wgrad == "recipe" else cfg.wgrad
        fp8_wgrad = cfg.wgrad == "recipe"  # same precision as the layer
        need_wgrad = ctx.needs_input_grad[1]
        xd = None
        if state is not None and plan.recipe == "tensorwise":  # delayed scaling of x (and, in backward, dY)
            step = state.begin()
            ux, ctx.dy_use_history = state.use_history
            ctx.state, ctx.step = state, step
            xd = state.scale(0, step, ux)
        else:
            ctx.state = None
        xq = _pad_rows(x, plan.row_align)  # zero rows add nothing to any GEMM; sliced off the outputs
        if fp8_wgrad and need_wgrad:
            xa, xt = plan.act_both(xq, saved_input=True, delayed=xd)
        else:
            xa, xt = plan.act(xq, 1, delayed=xd), None
        wa, wt = plan.weight(w)
        y = plan.gemm(xa, wa, out_dtype, bias=b, fast_accum=True)
        if y.shape[0] != m:
            y = y[:m]
        ctx.plan, ctx.wgrad, ctx.fp8_wgrad, ctx.m = plan, wgrad, fp8_wgrad, m
        ctx.has_bias = b is not None
        ctx.b_dtype = b.dtype if b is not None else None
        ctx.x_dtype, ctx.w_dtype = x.dtype, w.dtype
        # The FP8 copies go through save_for_backward, not ctx attributes: activation checkpointing frees
        # (and recomputes) saved tensors only. High-precision wgrad keeps the input itself, not its FP8 copy.
        xt_tensors, ctx.xt_form = _split_operand(xt)
        wt_tensors, ctx.wt_form = _split_operand(wt)
        ctx.n_xt = len(xt_tensors)
        ctx.save_for_backward(x if (need_wgrad and not fp8_wgrad) else None, *xt_tensors, *wt_tensors)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        plan: _Plan = ctx.plan
        if not dy.is_contiguous():
            dy = dy.contiguous()
        x, *saved = ctx.saved_tensors
        xt = _join_operand(ctx.xt_form, saved[:ctx.n_xt])
        wt = _join_operand(ctx.wt_form, saved[ctx.n_xt:])
        dx = dw = None
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dya = dyt = db = None
        want_db = ctx.has_bias and ctx.needs_input_grad[2]
        dyq = _pad_rows(dy, plan.row_align)
        dyd = ctx.state.scale(1, ctx.step, ctx.dy_use_history) if ctx.state is not None and (need_x or need_w) \
            else None
        # db from the quantizer's read of dY: the amax pass sums dY's columns nearly for free, and so does a delayed
        # cast (no amax pass): on 65536x1024 and 65536x4096 bf16 its sums cost 0.05-0.14 ms less than a separate
        # torch sum, for one layout or both (H200, benchmarks/RESULTS.md 2026-12-03)
        fuse_db = want_db and plan.native and plan.recipe in FUSED_BIAS_GRAD
        if ctx.fp8_wgrad and need_w:
            if fuse_db:
                dya, dyt, db = plan.act_both(dyq, col_sums=True, grad=True, delayed=dyd)
            else:
                dya, dyt = plan.act_both(dyq, grad=True, delayed=dyd)
        elif need_x:
            if fuse_db and plan.recipe == "tensorwise":  # the row-layout-only quantizers of the others do not sum
                dya, db = plan.act(dyq, 1, grad=True, col_sums=True, delayed=dyd)
            else:
                dya = plan.act(dyq, 1, grad=True, delayed=dyd)
        if need_x:
            dx = plan.gemm(dya, wt, ctx.x_dtype, fast_accum=plan.fast_accum_dgrad)
            if dx.shape[0] != ctx.m:
                dx = dx[:ctx.m]
        if need_w:
            if ctx.fp8_wgrad:
                dw = plan.gemm(dyt, xt, ctx.w_dtype, fast_accum=plan.fast_accum_wgrad)
            else:
                dw = _hp_gemm(dy.t(), x.t(), ctx.wgrad, plan.native)
            if dw.dtype != ctx.w_dtype:
                dw = dw.to(ctx.w_dtype)
        if want_db:
            db = db if db is not None else dy.sum(0, dtype=torch.float32)
            if db.dtype != ctx.b_dtype:
                db = db.to(ctx.b_dtype)
        ctx.state = None
        return dx, dw, db, None, None, None, None


class Fp8Linear(nn.Linear):
    """``nn.Linear`` with FP8 (or bf16) GEMMs in forward and backward; same parameters and state_dict.

    ``Fp8Linear(in, out, bias, recipe="blockwise", wgrad="recipe", emulate=False)``, or
    ``Fp8Linear.from_linear(linear, config)`` to wrap an existing layer's parameters (shared, not copied).
    Inputs of any leading shape ``[..., in_features]``; the output has the input's dtype, or under autocast
    the autocast dtype (as ``nn.Linear`` under autocast); gradients take the input's and parameters' dtypes.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None,
                 dtype: torch.dtype | None = None, *, config: Fp8Config | None = None, **config_kwargs: Any):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        if config is not None and config_kwargs:
            raise Fp8LinearError("Fp8Linear: pass either config= or recipe/wgrad/emulate keywords, not both")
        self.config = config if config is not None else Fp8Config(**config_kwargs)
        self._fp8_where = f"Fp8Linear({in_features}->{out_features})"
        self._amax_state: AmaxState | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, config: Fp8Config) -> Fp8Linear:
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.bias = linear.bias
        new.config = config
        new._fp8_where = f"Fp8Linear({linear.in_features}->{linear.out_features})"
        new._amax_state = None
        new.train(linear.training)
        return new

    def _delayed_state(self, x: torch.Tensor) -> AmaxState | None:
        """This layer's delayed-scaling state (made on first use, remade when the device or window changes);
        None where the layer uses current scaling (config, or eval mode)."""
        c = self.config
        if c.scaling != "delayed" or c.recipe != "tensorwise" or not self.training:
            return None
        st = self._amax_state
        if st is None or st.device != x.device or st.window != c.amax_history or st.margins[1] != c.grad_margin:
            register_step_hook()
            st = self._amax_state = AmaxState(c.amax_history, x.device, (0, c.grad_margin))
        return st

    def delayed_overflow(self) -> torch.Tensor | None:
        """Whether the newest step of each delayed-scaling ring saturated (``AmaxState.newest_overflow``); None
        before the layer's first delayed cast."""
        st = self._amax_state
        return None if st is None else st.newest_overflow(self.config.grad_format)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise Fp8LinearError(
                f"Fp8Linear: input's last dim is {x.shape[-1]}, layer expects in_features={self.in_features}")
        lead = x.shape[:-1]
        if x.numel() == 0:  # no tokens (an MoE expert that got none): nothing to quantize or scale
            return torch.nn.functional.linear(x, self.weight, self.bias)
        if x.numel() * self.out_features < self.config.min_gemm:  # too small for FP8 to pay back its casts
            return torch.nn.functional.linear(x, self.weight, self.bias)
        # Under autocast the output takes the autocast dtype, as nn.Linear's does: an fp32 output would send
        # fp32 activations downstream (the attention kernels then run fp32 dot products, many times slower).
        if self.config.scaling == "delayed":
            y = self._run_delayed(x.reshape(-1, self.in_features))
        else:
            y = self._run(x.reshape(-1, self.in_features), None)
        return y.reshape(*lead, self.out_features)

    def _run(self, x2: torch.Tensor, state: AmaxState | None) -> torch.Tensor:
        # Under autocast the output takes the autocast dtype, as nn.Linear's does: an fp32 output would send
        # fp32 activations downstream (the attention kernels then run fp32 dot products, many times slower).
        dev = x2.device.type
        where = getattr(self, "_fp8_where", None) or f"Fp8Linear({self.in_features}->{self.out_features})"
        if torch.is_autocast_enabled(dev):
            with torch.autocast(dev, enabled=False):  # the recipe picks every GEMM's precision itself
                return _Fp8LinearFn.apply(x2, self.weight, self.bias, self.config, where,
                                          torch.get_autocast_dtype(dev), state)
        return _Fp8LinearFn.apply(x2, self.weight, self.bias, self.config, where, x2.dtype, state)

    @torch.compiler.disable
    def _run_delayed(self, x2: torch.Tensor) -> torch.Tensor:
        """Delayed scaling keeps host-side step counters that change every step: run eagerly, outside any
        compiled graph (traced, each new step number would be a guard failure and a recompile)."""
        return self._run(x2, self._delayed_state(x2))

    def extra_repr(self) -> str:
        c = self.config
        extra = f", scaling=delayed (history {c.amax_history})" if c.scaling == "delayed" else ""
        extra += f", grad_margin={c.grad_margin}" if c.grad_margin else ""
        extra += f", min_gemm={c.min_gemm:g}" if c.min_gemm else ""
        return f"{super().extra_repr()}, recipe={c.recipe}, wgrad={c.wgrad}, emulate={c.emulate}{extra}"
