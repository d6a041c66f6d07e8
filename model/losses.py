"""Multitask loss: weighted binary cross-entropy per task; a masked task learns only where observed."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def multitask_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    label_mask: torch.Tensor,
    weights: torch.Tensor,
    task_names: list[str] | tuple[str, ...] | None = None,
    task_weights: list[float] | tuple[float, ...] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-> (total, {task: loss}); all ``[B, T]``; computed in float32.

    Each task's loss is ``sum(mask * weight * bce) / sum(mask * weight)`` (0 when nothing is observed, so
    a batch without conversions gives the conversion head no gradient). ``total`` sums the tasks, each
    scaled by ``task_weights`` (default 1). ``task_names`` label the dict (default ``task0``, ``task1``...).
    """
    logits = logits.float()
    bce = F.binary_cross_entropy_with_logits(logits, labels.float(), reduction="none")
    w = label_mask.float() * weights.float()
    per_task_sum = (bce * w).sum(dim=0)
    denom = w.sum(dim=0)
    per_task = per_task_sum / denom.clamp_min(torch.finfo(torch.float32).tiny)
    per_task = torch.where(denom > 0, per_task, per_task_sum * 0)  # keeps the graph, adds zero
    t = logits.shape[1]
    names = list(task_names) if task_names is not None else [f"task{i}" for i in range(t)]
    if task_weights is None:
        total = per_task.sum()
    else:  # Python floats: a weight tensor built here would be a blocking host-to-device copy every step
        total = sum(per_task[i] * float(w) for i, w in enumerate(task_weights))
    return total, {name: per_task[i] for i, name in enumerate(names)}
