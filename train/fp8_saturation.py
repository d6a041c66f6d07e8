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
    """Casts checked and saturated so far per ring (x: activations, dy: output gradients), and the largest
    overflow seen (amax over the scale's range)."""

    by_ring: dict[str, list[int]] = field(default_factory=lambda: {r: [0, 0] for r in RINGS})  # [checked, saturated]
    worst: float = 0.0

    @property
    def checked(self) -> int:
        return sum(c for c, _ in self.by_ring.values())

    @property
    def saturated(self) -> int:
        return sum(s for _, s in self.by_ring.values())

    def sample(self, model: nn.Module) -> dict[str, float]:
        """Check the newest step of every delayed-scaling ring in `model`; the log record's fields (none without
        such layers, or before any of them has cast with history)."""
        layers = [m.delayed_overflow() for m in model.modules() if isinstance(m, Fp8Linear)]
        rings = [r for r in layers if r is not None]
        if not rings:
            return {}
        # [layers, 2]: x, dy; 0 where that ring's step had no history (current scaling) or no finite amax
        ratio = torch.stack(rings).float().cpu()
        rec: dict[str, float] = {}
        checked = saturated = 0
        for i, ring in enumerate(RINGS):
            r = ratio[:, i][ratio[:, i] > 0]
            if r.numel():
                over = int((r > 1).sum())
                self.by_ring[ring][0] += r.numel()
                self.by_ring[ring][1] += over
                checked, saturated = checked + r.numel(), saturated + over
                rec[f"fp8/saturated_casts_{ring}"] = over / r.numel()
        if not checked:
            return {}
        self.worst = max(self.worst, float(ratio.max()))
        return {"fp8/saturated_casts": saturated / checked, "fp8/amax_over_range": float(ratio.max()), **rec}

    def summary(self) -> dict[str, float] | None:
        """For summary.json: the share of checked casts that saturated, over the run's log lines (in total and per
        ring: `checked_x`, `saturated_x`, `checked_dy`, `saturated_dy`)."""
        if not self.checked:
            return None
        per_ring = {f"{k}_{ring}": n for ring, (c, s) in self.by_ring.items()
                    for k, n in (("checked", c), ("saturated", s))}
        return {"checked_casts": self.checked, "saturated_casts": self.saturated,
                "saturated_share": self.saturated / self.checked, "max_amax_over_range": self.worst, **per_ring}
