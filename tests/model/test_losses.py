"""multitask_loss: weighted BCE per task; a masked task learns only where observed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model.losses import multitask_loss


def test_weighted_bce_per_task_and_total():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 2, generator=g)
    labels = (torch.rand(16, 2, generator=g) > 0.5).float()
    weights = torch.rand(16, 2, generator=g) + 0.5
    mask = torch.ones(16, 2)
    total, per = multitask_loss(logits, labels, mask, weights, ["click", "conversion"], task_weights=[1.0, 2.0])
    for i, name in enumerate(["click", "conversion"]):
        bce = F.binary_cross_entropy_with_logits(logits[:, i], labels[:, i], reduction="none")
        torch.testing.assert_close(per[name], (bce * weights[:, i]).sum() / weights[:, i].sum())
    torch.testing.assert_close(total, per["click"] + 2 * per["conversion"])


def test_masked_conversion_learns_only_where_observed():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(12, 2, generator=g, requires_grad=True)
    labels = (torch.rand(12, 2, generator=g) > 0.5).float()
    mask = torch.ones(12, 2)
    mask[::2, 1] = 0.0  # conversion unobserved on even rows (no click)
    total, per = multitask_loss(logits, labels, mask, torch.ones(12, 2))
    total.backward()
    assert (logits.grad[::2, 1] == 0).all() and (logits.grad[1::2, 1] != 0).all()
    assert (logits.grad[:, 0] != 0).all()
    # changing an unobserved label changes nothing
    flipped = labels.clone()
    flipped[::2, 1] = 1 - flipped[::2, 1]
    _, per2 = multitask_loss(logits.detach(), flipped, mask, torch.ones(12, 2))
    torch.testing.assert_close(per2["task1"], per["task1"].detach())


def test_task_with_nothing_observed_gives_zero_and_no_gradient():
    logits = torch.randn(4, 2, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0]] * 4)
    total, per = multitask_loss(logits, torch.ones(4, 2), mask, torch.ones(4, 2))
    assert float(per["task1"]) == 0.0
    total.backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[:, 1] == 0).all()
