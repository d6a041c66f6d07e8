"""Delayed FP8 scaling's saturation, sampled at log lines (`train/fp8_saturation.py`) and carried by a run."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from kernels.fp8_linear import Fp8Config, Fp8Linear, fp8_step
from train.fp8_saturation import SaturationTally
from train.trainer import Trainer


def delayed_model(grad_margin: int = 0) -> nn.Module:
    cfg = Fp8Config(recipe="tensorwise", wgrad="recipe", emulate=True, scaling="delayed", amax_history=4,
                    grad_margin=grad_margin)
    return nn.Sequential(Fp8Linear(32, 16, config=cfg), nn.ReLU(), Fp8Linear(16, 8, config=cfg))


def step(model: nn.Module, x: torch.Tensor) -> None:
    model(x).square().sum().backward()
    fp8_step()


def test_tally_counts_saturated_casts_of_the_newest_step():
    torch.manual_seed(0)
    model, tally = delayed_model(), SaturationTally()
    x = torch.randn(16, 32)
    step(model, x)
    assert tally.sample(model) == {}  # first step: current scaling, nothing to check
    step(model, x)
    rec = tally.sample(model)  # the same data again: inside the range of the scales from step 0
    assert rec["fp8/saturated_casts"] == 0.0 and 0 < rec["fp8/amax_over_range"] <= 1
    assert rec["fp8/saturated_casts_x"] == rec["fp8/saturated_casts_dy"] == 0.0
    step(model, 8 * x)  # 8x the amax of every earlier step: x and dY casts of both layers saturate
    rec = tally.sample(model)
    assert rec["fp8/saturated_casts"] == 1.0 and rec["fp8/amax_over_range"] > 1
    assert rec["fp8/saturated_casts_x"] == rec["fp8/saturated_casts_dy"] == 1.0
    assert (tally.checked, tally.saturated) == (8, 4)  # two log lines x two layers x (x, dY)
    assert tally.summary() == {"checked_casts": 8, "saturated_casts": 4, "saturated_share": 0.5,
                               "max_amax_over_range": pytest.approx(rec["fp8/amax_over_range"]),
                               "checked_x": 4, "saturated_x": 2, "checked_dy": 4, "saturated_dy": 2}


def test_tally_tells_the_forward_ring_from_the_gradient_ring():
    """Values outgrowing their scale in the backward only (a loss scaled 8x): the dY rings saturate, x rings not."""
    torch.manual_seed(0)
    model, tally = delayed_model(), SaturationTally()
    x = torch.randn(16, 32)
    step(model, x)
    step(model, x)
    model(x).square().sum().mul(8).backward()
    fp8_step()
    rec = tally.sample(model)
    assert rec["fp8/saturated_casts_x"] == 0.0 and rec["fp8/saturated_casts_dy"] == 1.0
    assert rec["fp8/saturated_casts"] == 0.5
    assert tally.summary()["saturated_x"] == 0 and tally.summary()["saturated_dy"] == 2


def test_grad_margin_keeps_a_larger_backward_inside_the_range():
    """The same 8x backward with 4 binades of headroom on dY's scale: no dY cast saturates, and the last layer
    (whose dY, the loss's gradient, is the same in both runs) reads 1/16 of the overflow it reads without."""
    reads, last_dy = [], []
    for margin in (0, 4):
        torch.manual_seed(0)
        model, tally = delayed_model(margin), SaturationTally()
        x = torch.randn(16, 32)
        step(model, x)
        step(model, x)
        model(x).square().sum().mul(8).backward()
        fp8_step()
        reads.append(tally.sample(model))
        last_dy.append(model[2].delayed_overflow()[1].item())
    assert reads[0]["fp8/saturated_casts_dy"] == 1.0 and reads[1]["fp8/saturated_casts_dy"] == 0.0
    assert reads[0]["fp8/saturated_casts_x"] == reads[1]["fp8/saturated_casts_x"] == 0.0
    assert last_dy[0] > 1 and last_dy[1] == pytest.approx(last_dy[0] / 16)


def test_run_records_saturation_with_delayed_fp8_layers_only(tiny_cfg, tmp_path):
    cfg = tiny_cfg(train__steps=4, train__log_every=2, precision__mlp="tensorwise", precision__emulate="true",
                   precision__wgrad="recipe")
    summary = Trainer(cfg, tmp_path / "fp8", quiet=True).fit()
    sat = summary["fp8_saturation"]
    assert sat["checked_casts"] > 0 and 0 <= sat["saturated_share"] <= 1 and sat["max_amax_over_range"] > 0
    records = [json.loads(line) for line in (tmp_path / "fp8" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("kind") == "train"]
    assert train and all("fp8/saturated_casts" in r for r in train)
    plain = Trainer(tiny_cfg(train__steps=2, train__log_every=1), tmp_path / "plain", quiet=True).fit()
    assert plain["fp8_saturation"] is None
