"""How often delayed FP8 scaling saturates, sampled at each log line.

A tensorwise layer with delayed scaling casts x and dY with a scale from the amaxes of earlier steps; a step whose
values outgrow that range saturates them to the format's max, silently. Each layer's amax rings record every step,
so at a log line the newest step of every ring is checked (`AmaxState.newest_overflow`): one device computation
and one copy per log line, nothing per step. The tally is a sample (one step per log line), not a count of every
step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kernels.fp8_linear import Fp8Linear


@dataclass
class SaturationTally:
    """Casts checked and saturated so far, and the largest overflow seen (amax over the scale's range)."""

    checked: int = 0
    saturated: int = 0
    worst: float = 0.0

    def sample(self, model: nn.Module) -> dict[str, float]:
        """Check the newest step of every delayed-scaling ring in `model`; the log record's fields (none without
        such layers, or before any of them has cast with history)."""
        layers = [m.delayed_overflow() for m in model.modules() if isinstance(m, Fp8Linear)]
        rings = [r for r in layers if r is not None]
        if not rings:
            return {}
        ratio = torch.stack(rings).float().cpu()
        ratio = ratio[ratio > 0]  # 0: that ring's step had no history (current scaling) or no finite amax
        if not ratio.numel():
            return {}
        saturated = int((ratio > 1).sum())
        self.checked += ratio.numel()
        self.saturated += saturated
        self.worst = max(self.worst, float(ratio.max()))
        return {"fp8/saturated_casts": saturated / ratio.numel(), "fp8/amax_over_range": float(ratio.max())}

    def summary(self) -> dict[str, float] | None:
        """For summary.json: the share of checked casts that saturated, over the run's log lines."""
        if not self.checked:
            return None
        return {"checked_casts": self.checked, "saturated_casts": self.saturated,
                "saturated_share": self.saturated / self.checked, "max_amax_over_range": self.worst}
