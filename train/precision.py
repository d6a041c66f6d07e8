"""Precision policy: which linear layers run in FP8 (and which recipe), which stay high precision.

Contract with the model code
----------------------------
A block declares its kind with a plain attribute set in its ``__init__``::

    class MlpBlock(nn.Module):
        precision_kind = "mlp"          # or set self.precision_kind = "mlp"

Kinds: ``"attention"``, ``"mlp"``, ``"interaction"`` (may run in FP8, per the policy) and
``"embedding"``, ``"head"``, ``"norm"``, ``"loss"`` (always high precision). Every ``nn.Linear`` takes
the kind of its nearest tagged ancestor (or its own tag); an untagged linear with no tagged ancestor
stays as it is. A tag deeper in the tree wins, so a head inside an MLP block stays high precision.

:func:`apply_precision_policy` swaps each ``nn.Linear`` of a kind whose recipe is not ``bf16`` for a
:class:`kernels.fp8_linear.Fp8Linear` that shares its parameters (apply it before building the
optimizer and before FSDP wrapping). It refuses, with :class:`PrecisionPolicyError`, a policy that
asks for a recipe on a high-precision kind, an unknown kind, and a model that already holds an FP8
layer under a high-precision kind. Kinds whose recipe is ``bf16`` keep ``nn.Linear`` (autocast decides). Recipes that need a GPU fail at the first forward on a CPU tensor
unless ``emulate=True`` (the quantize/dequantize reference that tests use).

Attention core. ``attention_kernel`` (``bf16`` | ``fp8`` | ``fp8_fwd_bwd`` | ``fp8_qkv``) picks the precision of the
attention products QK^T and PV themselves (``kernels.attention_fp8``: ``fp8`` for the forward's, with a
straight-through bf16 backward; ``fp8_fwd_bwd`` for the backward's score products too), separately from the
``attention`` recipe of the projection layers. ``fp8_qkv`` (softmax self-attention; ``kernels.qkv_fp8``) runs the
self-attention's QKV projection in FP8 writing the FP8 forward's operands, so no quantize pass runs between
them (the fastest FP8 attention forward measured: benchmarks/RESULTS.md), with a bf16 backward; it replaces that
projection's own recipe, needs a CUDA GPU (or ``TRITON_INTERPRET=1``), and cross attention runs ``fp8`` under it.
The policy sets the ``attention_precision`` attribute of every module that has
one (the model's attention blocks), or only of the modules named in ``attention_kernel_layers``
(qualified names, e.g. ``encoder.layers.2.attn``), so FP8 attention is chosen per layer. On CPU the
FP8 attention runs its emulating reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from torch import nn

from kernels.fp8_linear import RECIPES, SCALINGS, WGRAD_PRECISIONS, Fp8Config, Fp8Linear, Fp8LinearError

FP8_KINDS = ("attention", "mlp", "interaction")
ATTENTION_KERNELS = ("bf16", "fp8", "fp8_fwd_bwd", "fp8_qkv")
ATTENTION_PRECISION_ATTR = "attention_precision"
HIGH_PRECISION_KINDS = ("embedding", "head", "norm", "loss")
POLICY_SCALINGS = ("auto",) + SCALINGS  # "auto": delayed for the tensorwise layers, current for the others
KIND_ATTR = "precision_kind"


class PrecisionPolicyError(ValueError):
    """A precision policy that is invalid, or that would put a high-precision layer in FP8."""


@dataclass(frozen=True)
class PrecisionPolicy:
    """Recipe per module kind (``mxfp8`` | ``blockwise`` | ``rowwise`` | ``tensorwise`` | ``bf16``),
    weight-gradient precision (``recipe`` | ``bf16`` | ``fp32``) and the kinds that must stay high precision.
    ``grad_format`` (``e5m2`` | ``e4m3``): the element format of dY in the tensorwise recipe.
    ``scaling`` (``auto`` | ``current`` | ``delayed``), ``amax_history`` (steps) and ``grad_margin`` (binades
    of headroom on dY's delayed scale, 0-6): the tensorwise recipe's scaling of x and dY (``kernels.fp8_linear``).
    ``auto`` (the default) gives the tensorwise layers delayed scaling, the faster of the two, and every other
    recipe current scaling; ``delayed`` asks for it explicitly and needs every FP8 kind in ``tensorwise``;
    ``current`` keeps the tensorwise layers on an amax pass per cast.
    ``fast_accum`` (``output`` | ``dgrad`` | ``all``): which GEMMs of the tensorwise layers use cuBLAS's fast
    accumulation (``Fp8Config.fast_accum``).
    ``mx_scale`` (``floor`` | ``ceil``): the E8M0 scale rule of ``mxfp8`` layers (``kernels.fp8_linear``).
    ``min_gemm`` (tokens x in x out): FP8 layers run their smaller calls in bf16 (``Fp8Config.min_gemm``; 2e11
    keeps FP8 where it measured faster on an H200)."""

    # Every kind stays bf16 unless the config names a recipe for it, so turning one thing to FP8 (say
    # attention_kernel) changes nothing else. Fastest measured on an H200 (benchmarks/RESULTS.md, FP8 fifth
    # round, and 2026-12-03): "tensorwise" with delayed scaling (what "auto" gives it), 1.44-1.48x bf16 over the
    # gem_medium MLP's two linears (current scaling 1.31x, blockwise 1.15x); on an H100 with wgrad="recipe",
    # 1.36-1.41x, and 1.38-1.43x with fast_accum="all" (1.37-1.41x with "dgrad"). Interaction-sized layers lose in FP8
    # (0.12-0.22x, host-bound). Held-out NE against bf16, with and without fast accumulation: benchmarks/RESULTS.md,
    # "Targets at a glance" (configs/gem_medium.yaml shows the policy).
    attention: str = "bf16"
    mlp: str = "bf16"
    interaction: str = "bf16"
    wgrad: str = "bf16"
    high_precision: tuple[str, ...] = HIGH_PRECISION_KINDS
    emulate: bool = False
    mx_on_hopper: str = "emulate"
    mx_scale: str = "floor"  # mxfp8 layers: the E8M0 scale rule, "floor" (OCP spec) or "ceil" (nothing saturates)
    attention_kernel: str = "bf16"
    attention_kernel_layers: tuple[str, ...] | None = None
    grad_format: str = "e5m2"
    scaling: str = "auto"
    amax_history: int = 16
    grad_margin: int = 0  # delayed scaling: binades of headroom on dY's scale (``Fp8Config.grad_margin``)
    min_gemm: float = 0  # FP8 layers run bf16 below this tokens x in x out (``Fp8Config.min_gemm``)
    fast_accum: str = "output"  # tensorwise: "dgrad" also the input gradient's GEMM, "all" both backward ones

    def __post_init__(self) -> None:
        for kind in FP8_KINDS:
            recipe = getattr(self, kind)
            if recipe not in RECIPES:
                raise PrecisionPolicyError(
                    f"PrecisionPolicy.{kind}: unknown recipe {recipe!r}; expected one of {RECIPES}")
            if kind in self.high_precision and recipe != "bf16":
                raise PrecisionPolicyError(
                    f"PrecisionPolicy: kind {kind!r} is listed in high_precision but given recipe {recipe!r}; "
                    "remove it from high_precision or set its recipe to 'bf16'")
        if self.wgrad not in WGRAD_PRECISIONS:
            raise PrecisionPolicyError(
                f"PrecisionPolicy.wgrad: unknown precision {self.wgrad!r}; expected one of {WGRAD_PRECISIONS}")
        missing = [k for k in HIGH_PRECISION_KINDS if k not in self.high_precision]
        if missing:
            raise PrecisionPolicyError(
                f"PrecisionPolicy.high_precision must keep {list(HIGH_PRECISION_KINDS)}; missing {missing}")
        unknown = [k for k in self.high_precision if k not in FP8_KINDS + HIGH_PRECISION_KINDS]
        if unknown:
            raise PrecisionPolicyError(
                f"PrecisionPolicy.high_precision: unknown kinds {unknown}; "
                f"known: {list(FP8_KINDS + HIGH_PRECISION_KINDS)}")
        if self.scaling not in POLICY_SCALINGS:
            raise PrecisionPolicyError(
                f"PrecisionPolicy.scaling: unknown scaling {self.scaling!r}; expected one of {POLICY_SCALINGS}")
        other = {k: getattr(self, k) for k in FP8_KINDS if getattr(self, k) not in ("tensorwise", "bf16")}
        for option, fallback in (("scaling", "current"), ("fast_accum", "output"), ("grad_margin", 0)):
            value = getattr(self, option)
            if value not in (fallback, "auto") and other:
                raise PrecisionPolicyError(
                    f"PrecisionPolicy: {option}={value!r} is a tensorwise option, but {other} use other recipes; "
                    f"set those kinds to 'tensorwise' (or 'bf16'), or use {option}={fallback!r}")
        try:  # validates mx_on_hopper, mx_scale, grad_format, amax_history, grad_margin, min_gemm and fast_accum
            Fp8Config(recipe="bf16", mx_on_hopper=self.mx_on_hopper, mx_scale=self.mx_scale,
                      grad_format=self.grad_format, amax_history=self.amax_history, min_gemm=self.min_gemm,
                      fast_accum=self.fast_accum, scaling="current" if self.scaling == "current" else "delayed",
                      grad_margin=self.grad_margin)
        except Fp8LinearError as e:
            raise PrecisionPolicyError(f"PrecisionPolicy: {e}") from None
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise PrecisionPolicyError(f"PrecisionPolicy.attention_kernel: unknown precision "
                                       f"{self.attention_kernel!r}; expected one of {ATTENTION_KERNELS}")
        if self.attention_kernel != "bf16" and "attention" in self.high_precision:
            raise PrecisionPolicyError(f"PrecisionPolicy: attention_kernel={self.attention_kernel!r} but 'attention' "
                                       "is listed in high_precision; remove it from high_precision or use 'bf16'")

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "precision") -> PrecisionPolicy:
        """Build from a config mapping (YAML ``precision:`` section); ``where`` names it in errors."""
        known = {f.name for f in fields(cls)}
        extra = sorted(set(d) - known)
        if extra:
            raise PrecisionPolicyError(f"{where}: unknown keys {extra}; expected some of {sorted(known)}")
        d = dict(d)
        for key in ("amax_history", "grad_margin"):
            if isinstance(d.get(key), str) and d[key].strip().isdigit():  # a command-line value
                d[key] = int(d[key])
        if isinstance(d.get("min_gemm"), str):  # a command-line or YAML value such as "1e11"
            try:
                d["min_gemm"] = float(d["min_gemm"])
            except ValueError:
                raise PrecisionPolicyError(f"{where}.min_gemm: expected a number (tokens x in x out), got "
                                           f"{d['min_gemm']!r}") from None
        if "high_precision" in d:
            d["high_precision"] = tuple(d["high_precision"])
        if d.get("attention_kernel_layers") is not None:
            d["attention_kernel_layers"] = tuple(d["attention_kernel_layers"])
        try:
            return cls(**d)
        except PrecisionPolicyError as e:
            raise PrecisionPolicyError(f"{where}: {e}") from None

    def recipe_for(self, kind: str) -> str | None:
        """The recipe for a kind, or None for a kind that stays high precision."""
        if kind in self.high_precision:
            return None
        if kind in FP8_KINDS:
            return getattr(self, kind)
        raise PrecisionPolicyError(
            f"unknown precision_kind {kind!r}; known: {list(FP8_KINDS + HIGH_PRECISION_KINDS)}")

    def scaling_for(self, recipe: str) -> str:
        """The Fp8Config scaling of a layer with ``recipe``: only tensorwise layers scale from an amax history."""
        return "delayed" if recipe == "tensorwise" and self.scaling in ("auto", "delayed") else "current"

    def config_for(self, kind: str) -> Fp8Config | None:
        recipe = self.recipe_for(kind)
        if recipe is None:
            return None
        scaling = self.scaling_for(recipe)
        return Fp8Config(recipe=recipe, wgrad=self.wgrad, emulate=self.emulate, mx_on_hopper=self.mx_on_hopper,
                         mx_scale=self.mx_scale, grad_format=self.grad_format, scaling=scaling,
                         amax_history=self.amax_history, min_gemm=self.min_gemm, fast_accum=self.fast_accum,
                         grad_margin=self.grad_margin if scaling == "delayed" else 0)


@dataclass
class PolicyReport:
    """What :func:`apply_precision_policy` did, by qualified module name."""

    converted: dict[str, str] = field(default_factory=dict)  # name -> recipe
    kept: dict[str, str] = field(default_factory=dict)  # name -> kind ("untagged" if none)
    attention: dict[str, str] = field(default_factory=dict)  # attention module -> its QK^T/PV precision


def _kinds(model: nn.Module, policy: PrecisionPolicy) -> dict[str, str | None]:
    """Qualified name -> effective kind (nearest tagged ancestor or self), None where untagged."""
    out: dict[str, str | None] = {}

    def walk(mod: nn.Module, name: str, inherited: str | None) -> None:
        kind = getattr(mod, KIND_ATTR, None)
        if kind is not None:
            if not isinstance(kind, str):
                raise PrecisionPolicyError(f"module {name or '<root>'}: {KIND_ATTR} must be a string, got {kind!r}")
            policy.recipe_for(kind)  # raises on an unknown kind
            inherited = kind
        out[name] = inherited
        for child_name, child in mod.named_children():
            walk(child, f"{name}.{child_name}" if name else child_name, inherited)

    try:
        walk(model, "", None)
    except PrecisionPolicyError as e:
        raise PrecisionPolicyError(f"apply_precision_policy: {e}") from None
    return out


def apply_precision_policy(model: nn.Module, policy: PrecisionPolicy) -> PolicyReport:
    """Swap ``nn.Linear`` for ``Fp8Linear`` in the FP8 kinds the policy names; in place. See module doc."""
    kinds = _kinds(model, policy)
    report = PolicyReport()
    swaps: list[tuple[str, nn.Module, str, nn.Linear, Fp8Config]] = []
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear):
            continue
        kind = kinds.get(name)
        cfg = policy.config_for(kind) if kind is not None else None
        if isinstance(mod, Fp8Linear):  # built FP8 by hand: check it, retune it to the policy
            if kind in policy.high_precision and mod.config.recipe != "bf16":
                raise PrecisionPolicyError(
                    f"apply_precision_policy: {name} is an Fp8Linear (recipe {mod.config.recipe!r}) under "
                    f"kind {kind or 'untagged'!r}, which must stay high precision; build it as nn.Linear")
            if cfg is not None and cfg.recipe != "bf16":
                mod.config = cfg
                report.converted[name] = cfg.recipe
            continue
        if cfg is None or cfg.recipe == "bf16":  # bf16 kinds stay nn.Linear (autocast decides)
            report.kept[name] = kind or "untagged"
            continue
        if not name:
            raise PrecisionPolicyError(
                "apply_precision_policy: the root module itself is an nn.Linear; wrap it in a tagged block")
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        swaps.append((name, parent, attr, mod, cfg))
    for name, parent, attr, mod, cfg in swaps:
        setattr(parent, attr, Fp8Linear.from_linear(mod, cfg))
        report.converted[name] = cfg.recipe
    _set_attention_kernels(model, policy, kinds, report)
    return report


def _set_attention_kernels(model: nn.Module, policy: PrecisionPolicy, kinds: dict[str, str | None],
                           report: PolicyReport) -> None:
    """Set ``attention_precision`` on the attention modules (all, or those the policy names)."""
    targets = {name: mod for name, mod in model.named_modules() if hasattr(mod, ATTENTION_PRECISION_ATTR)}
    wanted = policy.attention_kernel_layers
    if wanted is not None:
        unknown = sorted(set(wanted) - set(targets))
        if unknown:
            raise PrecisionPolicyError(
                f"apply_precision_policy: attention_kernel_layers names {unknown}, which are not attention "
                f"modules of this model; known: {sorted(targets)}")
    for name, mod in targets.items():
        kind = kinds.get(name)
        chosen = policy.attention_kernel if wanted is None or name in wanted else "bf16"
        if kind is not None and kind in policy.high_precision:
            chosen = "bf16"
        setattr(mod, ATTENTION_PRECISION_ATTR, chosen)
        report.attention[name] = chosen


def apply_config_policy(model: nn.Module, section: dict[str, Any], source: str, log) -> PolicyReport | None:
    """The run config's `precision:` section applied to `model` (before the optimizer is built)."""
    from features.errors import GemtrainError

    if not section:
        return None
    # `--precision.emulate=true` on the command line arrives as a string
    raw = {k: {"true": True, "false": False}.get(v, v) if isinstance(v, str) else v for k, v in section.items()}
    where = f"{source}: precision"
    try:
        policy = PrecisionPolicy.from_dict(raw, where=where)  # its errors name `where` already
    except PrecisionPolicyError as e:
        raise GemtrainError(str(e)) from None
    try:
        report = apply_precision_policy(model, policy)
    except PrecisionPolicyError as e:
        raise GemtrainError(f"{where}: {e}") from None
    recipes = sorted(set(report.converted.values()))
    fp8_attn = sum(v != "bf16" for v in report.attention.values())
    log(f"precision policy: {len(report.converted)} linear layers in {', '.join(recipes) or 'no FP8 recipe'}, "
        f"{len(report.kept)} kept in high precision, FP8 attention in {fp8_attn} attention blocks")
    return report
