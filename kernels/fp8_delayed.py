"""Delayed scaling of ``Fp8Linear`` (``kernels.fp8_linear``): the step counter that optimizer steps advance, and
each layer's amax history (x and dY rings on the device, step bookkeeping on the host)."""

from __future__ import annotations

from typing import Any

import torch

from kernels import mx

_GENERATION = [0]  # bumped by every optimizer step (hook below) and by fp8_step()
_HOOK: list[Any] = []


def fp8_step() -> None:
    """End the current step for delayed scaling: the next training forward of every delayed-scaling layer
    commits the amaxes recorded so far and reads its scales from a history that includes them. Every
    ``torch.optim`` optimizer's ``step()`` calls this (a global post-hook, registered with the first
    delayed-scaling layer); call it by hand only in loops that update weights some other way."""
    _GENERATION[0] += 1


def register_step_hook() -> None:
    if not _HOOK:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _HOOK.append(register_optimizer_step_post_hook(lambda *_: fp8_step()))


class AmaxState:
    """Delayed-scaling state of one layer: the amax rings of x (row 0) and dY (row 1) on the device, and on the
    host the layer's step number and the latest step each ring was written in.

    ``begin()`` (each training forward) starts a new step when an optimizer step (or :func:`fp8_step`) came since
    the last forward, and decides once per step whether each ring has history in the window: every cast of that
    step (first forward, recomputed forward, backward, further micro-batches) then takes the same path and, with
    history, the same scale. Host counters only: no device op and no sync. ``margins``: each ring's headroom in
    binades (``DelayedScale.margin``)."""

    def __init__(self, window: int, device: torch.device, margins: tuple[int, int] = (0, 0)):
        self.window = window
        self.device = device
        self.margins = margins
        self.history = mx.new_amax_history(window, device, rows=2)
        self.rows = (self.history[0], self.history[1])
        self.step = 0
        self.gen: int | None = None
        self.last: list[int | None] = [None, None]  # step of the latest record per ring
        self.use_history = (False, False)

    def begin(self) -> int:
        gen = _GENERATION[0]
        if gen != self.gen:
            if self.gen is not None:
                self.step += 1
            self.gen = gen
            self.use_history = tuple(t is not None and t >= self.step - self.window for t in self.last)
        return self.step

    def scale(self, row: int, step: int, use_history: bool) -> mx.DelayedScale:
        """The DelayedScale of ring ``row`` in ``step`` (``use_history`` as ``begin`` decided for that step);
        marks the ring written in ``step``."""
        last = self.last[row]
        self.last[row] = step if last is None or last < step else last
        return mx.DelayedScale(self.rows[row], step, self.window, use_history, self.margins[row])

    def newest_overflow(self, grad_format: str) -> torch.Tensor:
        """[2] fp32, per ring (x in e4m3, dY in ``grad_format``): :func:`kernels.mx.delayed_overflow_ref` of the
        newest step it recorded (above 1: that step's cast saturated), 0 for a ring with none. No sync."""
        out = [mx.delayed_overflow_ref(ring, t, self.window, fmt, margin) if t is not None
               else torch.zeros((), device=ring.device)
               for ring, t, fmt, margin in zip(self.rows, self.last, ("e4m3", grad_format), self.margins)]
        return torch.stack(out)

__all__ = ["AmaxState", "fp8_step", "register_step_hook"]
