"""How often delayed FP8 scaling saturates, sampled at each log line.

A tensorwise layer with delayed scaling casts x and dY with a scale from the amaxes of earlier steps; a step whose
values outgrow that range saturates them to the format's max, silently. Each layer's amax rings record every step,
so at a log line the newest step of every ring is checked (`AmaxState.newest_overflow`): one device computation
and one copy per log line, nothing per step. The tally is a sample (one step per log line), not a count of every
step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from kernels.fp8_linear import Fp8Linear

RINGS = ("x", "dy")  # each layer's two rings: the forward's input casts (e4m3), the backward's dY casts


@dataclass
class SaturationTally:
    """Casts checked and saturated so far, in total and per ring (x: activations, dy: output gradients), and the
    largest overflow seen (amax over the scale's range)."""

    checked: int = 0
    saturated: int = 0
    worst: float = 0.0
    by_ring: dict[str, list[int]] = field(default_factory=lambda: {r: [0, 0] for r in RINGS})  # [checked, saturated]

    def sample(self, model: nn.Module) -> dict[str, float]:
        """Check the newest step of every delayed-scaling ring in `model`; the log record's fields (none without
        such layers, or before any of them has cast with history)."""
        layers = [m.delayed_overflow() for m in model.modules() if isinstance(m, Fp8Linear)]
        rings = [r for r in layers if r is not None]
        if not rings:
            return {}
        ratio = torch.stack(rings).float().cpu()  # [layers, 2]: x, dy
        live = ratio > 0  # 0: that ring's step had no history (current scaling) or no finite amax
        if not live.any():
            return {}
        rec: dict[str, float] = {}
        for i, ring in enumerate(RINGS):
            r = ratio[:, i][live[:, i]]
            if r.numel():
                over = int((r > 1).sum())
                self.by_ring[ring][0] += r.numel()
                self.by_ring[ring][1] += over
                rec[f"fp8/saturated_casts_{ring}"] = over / r.numel()
        ratio = ratio[live]
        saturated = int((ratio > 1).sum())
        self.checked += ratio.numel()
        self.saturated += saturated
        self.worst = max(self.worst, float(ratio.max()))
        return {"fp8/saturated_casts": saturated / ratio.numel(), "fp8/amax_over_range": float(ratio.max()), **rec}

    def summary(self) -> dict[str, float] | None:
        """For summary.json: the share of checked casts that saturated, over the run's log lines (in total and per
        ring: `checked_x`, `saturated_x`, `checked_dy`, `saturated_dy`)."""
        if not self.checked:
            return None
        per_ring = {f"{k}_{ring}": n for ring, (c, s) in self.by_ring.items()
                    for k, n in (("checked", c), ("saturated", s))}
        return {"checked_casts": self.checked, "saturated_casts": self.saturated,
                "saturated_share": self.saturated / self.checked, "max_amax_over_range": self.worst, **per_ring}
