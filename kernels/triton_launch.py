"""Launching a Triton JIT function with less host time than ``fn[grid](...)``.

On an H200 host ``fn[grid](*args, **kwargs)`` takes ~50 us of host time per launch, ~13 us of it in the compiled
kernel's own launcher; the rest is the JIT's per-call bookkeeping (a cache-key string of every option, checks of
global values, launch metadata). Short batches (jagged attention over short histories, cross attention of a few
candidates) pay it on every kernel of every call: benchmarks/RESULTS.md, "Host time per launch".

``run`` binds the arguments with the JIT function's own binder, so the specialization (dtypes, 16-byte alignment,
divisibility of integers, constexprs) is exactly the one Triton would compile for, looks the compiled kernel up by
it and launches that. The first launch of each specialization, launches under the interpreter, launches watched
by a launch hook (profilers) or a pipeline-inspection hook, Triton versions whose JIT keeps its binder elsewhere and
anything that is not a bare JIT function go through ``fn[grid]``, as does every launch with
``GEMTRAIN_DIRECT_LAUNCH=0``.
"""

from __future__ import annotations

import os

import torch
import triton
from triton import knobs

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
ENABLED = os.environ.get("GEMTRAIN_DIRECT_LAUNCH", "1") != "0"

# (function, device, specialization, options) -> compiled kernel
_COMPILED: dict[tuple, object] = {}


def _watched(hook) -> bool:
    """Whether a launch hook is installed (a non-empty ``HookChain``; a function or None in older Triton)."""
    return bool(getattr(hook, "calls", hook))


def _binder(fn, device: int):
    """The JIT function's argument binder for ``device`` (Triton 3.5-3.6 keep it last in ``device_caches``:
    kernel cache, key cache, target, backend, binder); None where this Triton lays them out otherwise."""
    caches = fn.device_caches[device]
    return caches[4] if isinstance(caches, tuple) and len(caches) == 5 and callable(caches[4]) else None


def run(fn, grid: tuple, *args, **kwargs) -> None:
    """``fn[grid](*args, **kwargs)``, the compiled kernel launched directly once it exists."""
    if (INTERPRET or not ENABLED or not isinstance(fn, triton.runtime.JITFunction)
            or _watched(knobs.runtime.launch_enter_hook) or _watched(knobs.runtime.launch_exit_hook)
            or getattr(knobs.runtime, "add_stages_inspection_hook", None) is not None):  # Triton 3.7: keyed pipelines
        fn[grid](*args, **kwargs)
        return
    device = torch._C._cuda_getDevice()
    binder = _binder(fn, device)
    if binder is None:
        fn[grid](*args, **kwargs)
        return
    # The options the JIT adds itself, so that the binder sees what fn[grid] would (the same cache entry).
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    bound, specialization, options = binder(*args, **kwargs)
    key = (fn, device, tuple(specialization), tuple(options.items()))
    kernel = _COMPILED.get(key)
    if kernel is None:
        kernel = fn.run(*args, grid=grid, warmup=False, **kwargs)  # compiles if needed, and launches
        _COMPILED[key] = kernel.result() if hasattr(kernel, "result") else kernel
        return
    grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]
    kernel.run(grid_x, grid_y, grid_z, torch._C._cuda_getCurrentRawStream(device), kernel.function,
               kernel.packed_metadata, None, None, None, *bound.values())


__all__ = ["run"]
