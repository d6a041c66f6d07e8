"""Precision policy: FP8 only in the kinds it names, high-precision kinds enforced, clear errors."""

import pytest
import torch
from torch import nn

from kernels.fp8_linear import Fp8Config, Fp8Linear, Fp8LinearError
from train.precision import PrecisionPolicy, PrecisionPolicyError, apply_precision_policy


class Tagged(nn.Sequential):
    def __init__(self, kind: str, *mods: nn.Module):
        super().__init__(*mods)
        self.precision_kind = kind


class Toy(nn.Module):
    """Stand-in for the model: tagged blocks as the model code declares them."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_proj = Tagged("embedding", nn.Linear(32, 64))
        self.attn = Tagged("attention", nn.Linear(64, 64), nn.Linear(64, 64))
        # an MLP block holding a nested head: the deeper tag wins
        self.mlp = Tagged("mlp", nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), Tagged("head", nn.Linear(64, 64)))
        self.inter = Tagged("interaction", nn.Linear(64, 64))
        self.norm = Tagged("norm", nn.LayerNorm(64))
        self.head = Tagged("head", nn.Linear(64, 2))
        self.extra = nn.Linear(2, 2)  # untagged: left alone

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed_proj(x)
        h = self.norm(h + self.attn(h))
        h = h + self.mlp(h)
        return self.extra(self.head(self.inter(h)))


def linear_types(model: nn.Module) -> dict[str, str]:
    return {n: (m.config.recipe if isinstance(m, Fp8Linear) else "linear")
            for n, m in model.named_modules() if isinstance(m, nn.Linear)}


def test_policy_converts_named_kinds_and_keeps_high_precision():
    torch.manual_seed(0)
    model = Toy()
    params_before = {n: p for n, p in model.named_parameters()}
    policy = PrecisionPolicy(attention="rowwise", mlp="blockwise", interaction="mxfp8", emulate=True)
    report = apply_precision_policy(model, policy)
    assert linear_types(model) == {
        "embed_proj.0": "linear", "attn.0": "rowwise", "attn.1": "rowwise", "mlp.0": "blockwise",
        "mlp.2": "blockwise", "mlp.3.0": "linear", "inter.0": "mxfp8", "head.0": "linear", "extra": "linear",
    }
    assert report.converted == {"attn.0": "rowwise", "attn.1": "rowwise", "mlp.0": "blockwise",
                                "mlp.2": "blockwise", "inter.0": "mxfp8"}
    assert report.kept == {"embed_proj.0": "embedding", "mlp.3.0": "head", "head.0": "head", "extra": "untagged"}
    for n, p in model.named_parameters():  # same Parameter objects: optimizers and checkpoints unaffected
        assert p is params_before[n]
    assert all(type(model.get_submodule(n)) is nn.Linear for n in report.kept)


def test_converted_model_trains_close_to_the_original():
    torch.manual_seed(1)
    model = Toy()
    x = torch.randn(48, 32)
    ref = model(x).detach()
    apply_precision_policy(model, PrecisionPolicy(attention="blockwise", mlp="mxfp8", wgrad="bf16", emulate=True))
    y = model(x)
    assert float((y.detach() - ref).norm() / ref.norm()) < 0.1
    y.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_bf16_kinds_stay_nn_linear():
    model = Toy()
    apply_precision_policy(model, PrecisionPolicy(attention="bf16", mlp="bf16", interaction="rowwise", emulate=True))
    assert [n for n, r in linear_types(model).items() if r != "linear"] == ["inter.0"]


def test_refuses_fp8_for_high_precision_kinds():
    with pytest.raises(PrecisionPolicyError, match="high_precision"):
        PrecisionPolicy(mlp="blockwise", high_precision=("embedding", "head", "norm", "loss", "mlp"))
    with pytest.raises(PrecisionPolicyError, match="missing"):
        PrecisionPolicy(high_precision=("embedding", "norm", "loss"))
    model = Toy()
    model.head[0] = Fp8Linear.from_linear(model.head[0], Fp8Config(recipe="blockwise", emulate=True))
    with pytest.raises(PrecisionPolicyError, match=r"head\.0.*'head'"):
        apply_precision_policy(model, PrecisionPolicy(emulate=True))


def test_unknown_kind_is_named():
    model = Toy()
    model.inter.precision_kind = "moe"
    with pytest.raises(PrecisionPolicyError, match="'moe'"):
        apply_precision_policy(model, PrecisionPolicy())


def test_gpu_recipe_fails_clearly_on_cpu_unless_emulated():
    model = Toy()
    apply_precision_policy(model, PrecisionPolicy(mlp="blockwise"))  # conversion itself is device-free
    with pytest.raises(Fp8LinearError, match="emulate=True"):
        model(torch.randn(4, 32))


def test_from_config_mapping():
    p = PrecisionPolicy.from_dict({"mlp": "mxfp8", "wgrad": "fp32", "emulate": True,
                                   "high_precision": ["embedding", "head", "norm", "loss"]})
    assert p.mlp == "mxfp8" and p.wgrad == "fp32" and p.high_precision == ("embedding", "head", "norm", "loss")
    with pytest.raises(PrecisionPolicyError, match="configs/x.yaml:precision: unknown keys"):
        PrecisionPolicy.from_dict({"mpl": "mxfp8"}, where="configs/x.yaml:precision")
    with pytest.raises(PrecisionPolicyError, match="precision: PrecisionPolicy.mlp: unknown recipe 'fp4'"):
        PrecisionPolicy.from_dict({"mlp": "fp4"})


def test_fast_accum_reaches_the_fp8_layers_and_is_validated():
    model = Toy()
    report = apply_precision_policy(model, PrecisionPolicy.from_dict({"mlp": "tensorwise", "fast_accum": "all",
                                                                       "emulate": True}))
    assert all(model.get_submodule(n).config.fast_accum == "all" for n in report.converted)
    assert PrecisionPolicy(mlp="tensorwise").config_for("mlp").fast_accum == "output"
    with pytest.raises(PrecisionPolicyError, match="fast_accum"):
        PrecisionPolicy.from_dict({"mlp": "tensorwise", "fast_accum": "backward"})
    assert PrecisionPolicy(mlp="tensorwise", fast_accum="dgrad").config_for("mlp").fast_accum == "dgrad"
    with pytest.raises(PrecisionPolicyError, match=r"fast_accum='all' is a tensorwise option.*'attention': 'blockwise'"):
        PrecisionPolicy.from_dict({"mlp": "tensorwise", "attention": "blockwise", "fast_accum": "all"})


def test_mx_scale_rule_reaches_the_mxfp8_layers_and_is_validated():
    model = Toy()
    report = apply_precision_policy(model, PrecisionPolicy.from_dict({"mlp": "mxfp8", "mx_scale": "ceil",
                                                                       "emulate": True}))
    assert report.converted == {"mlp.0": "mxfp8", "mlp.2": "mxfp8"}
    assert all(model.get_submodule(n).config.mx_scale == "ceil" for n in report.converted)
    assert PrecisionPolicy(mlp="mxfp8").config_for("mlp").mx_scale == "floor"  # the OCP spec's rule by default
    with pytest.raises(PrecisionPolicyError, match="mx_scale"):
        PrecisionPolicy.from_dict({"mlp": "mxfp8", "mx_scale": "round"})


def test_tensorwise_policy_passes_grad_format_and_validates_it():
    model = Toy()
    report = apply_precision_policy(model, PrecisionPolicy(attention="tensorwise", mlp="tensorwise",
                                                           grad_format="e4m3", wgrad="recipe", emulate=True))
    assert report.converted == {"attn.0": "tensorwise", "attn.1": "tensorwise", "mlp.0": "tensorwise",
                                "mlp.2": "tensorwise"}
    assert all(model.get_submodule(n).config.grad_format == "e4m3" for n in report.converted)
    model(torch.randn(8, 32)).square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    with pytest.raises(PrecisionPolicyError, match="grad_format"):
        PrecisionPolicy.from_dict({"mlp": "tensorwise", "grad_format": "e3m4"})


def test_delayed_scaling_option_reaches_the_tensorwise_layers_and_is_validated():
    p = PrecisionPolicy.from_dict({"mlp": "tensorwise", "attention": "tensorwise", "wgrad": "recipe",
                                   "emulate": True, "scaling": "delayed", "amax_history": "8"})  # "8": a CLI value
    assert p.scaling == "delayed" and p.amax_history == 8
    assert PrecisionPolicy().scaling == "auto"
    model = Toy()
    report = apply_precision_policy(model, p)
    assert set(report.converted.values()) == {"tensorwise"}
    cfgs = [model.get_submodule(n).config for n in report.converted]
    assert all(c.scaling == "delayed" and c.amax_history == 8 for c in cfgs)
    model(torch.randn(8, 32)).square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert PrecisionPolicy(mlp="blockwise", amax_history=8).config_for("mlp").scaling == "current"
    with pytest.raises(PrecisionPolicyError, match=r"precision: .*scaling='delayed' is a tensorwise option.*"
                                                   r"'mlp': 'blockwise'"):
        PrecisionPolicy.from_dict({"attention": "tensorwise", "mlp": "blockwise", "scaling": "delayed"})
    with pytest.raises(PrecisionPolicyError, match="unknown scaling 'lazy'"):
        PrecisionPolicy.from_dict({"mlp": "tensorwise", "scaling": "lazy"})
    with pytest.raises(PrecisionPolicyError, match="amax_history must be an int >= 1"):
        PrecisionPolicy.from_dict({"mlp": "tensorwise", "scaling": "delayed", "amax_history": 0})


def test_grad_margin_reaches_the_delayed_layers_and_is_validated():
    p = PrecisionPolicy.from_dict({"mlp": "tensorwise", "attention": "tensorwise", "wgrad": "recipe",
                                   "emulate": True, "grad_margin": "4"})  # "4": a CLI value
    assert p.grad_margin == 4 and PrecisionPolicy().grad_margin == 0
    model = Toy()
    report = apply_precision_policy(model, p)
    assert all(model.get_submodule(n).config.grad_margin == 4 for n in report.converted)
    model(torch.randn(8, 32)).square().mean().backward()
    assert all(model.get_submodule(n)._amax_state.margins == (0, 4) for n in report.converted)
    with pytest.raises(PrecisionPolicyError, match="grad_margin is a delayed-scaling option.*'current'"):
        PrecisionPolicy.from_dict({"mlp": "tensorwise", "scaling": "current", "grad_margin": 2})
    with pytest.raises(PrecisionPolicyError, match=r"grad_margin=2 is a tensorwise option.*'mlp': 'blockwise'"):
        PrecisionPolicy.from_dict({"attention": "tensorwise", "mlp": "blockwise", "grad_margin": 2})
    with pytest.raises(PrecisionPolicyError, match=r"grad_margin must be an int in 0\.\.6"):
        PrecisionPolicy.from_dict({"mlp": "tensorwise", "grad_margin": 9})


def test_min_gemm_reaches_the_fp8_layers_and_is_validated():
    p = PrecisionPolicy.from_dict({"mlp": "tensorwise", "emulate": True, "min_gemm": "1e11"})  # YAML 1.1 reads a str
    assert p.min_gemm == 1e11 and PrecisionPolicy().min_gemm == 0
    model = Toy()
    report = apply_precision_policy(model, p)
    assert report.converted and all(model.get_submodule(n).config.min_gemm == 1e11 for n in report.converted)
    with pytest.raises(PrecisionPolicyError, match="min_gemm"):
        PrecisionPolicy.from_dict({"mlp": "tensorwise", "min_gemm": "a lot"})
    with pytest.raises(PrecisionPolicyError, match="min_gemm"):
        PrecisionPolicy.from_dict({"mlp": "tensorwise", "min_gemm": -5})


def test_auto_scaling_gives_tensorwise_layers_delayed_scaling_and_the_others_current():
    p = PrecisionPolicy(mlp="tensorwise", attention="blockwise", emulate=True)  # auto: mixing recipes is fine
    assert p.config_for("mlp").scaling == "delayed"
    assert p.config_for("attention").scaling == "current"
    assert PrecisionPolicy(mlp="tensorwise", scaling="current").config_for("mlp").scaling == "current"
    with pytest.raises(PrecisionPolicyError, match="unknown scaling"):
        PrecisionPolicy(scaling="sometimes")
