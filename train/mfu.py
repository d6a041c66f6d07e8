"""MFU accounting: FLOPs per step over step time and the device's dense bf16 peak.

Three figures, as GEM reports them:
- **local MFU**: each block timed alone (forward + backward, no recompute, no communication),
  FLOPs of all blocks over the sum of their times;
- **end-to-end MFU**: the whole step's FLOPs over the whole step's time;
- **scaling ratio**: end-to-end over local (what the data path, the glue and communication cost);
  a ratio of two achieved rates, so it needs no peak.

`measure_step_in_place` takes these figures inside a training run (the trainer's
`logging.local_mfu_every`) without changing the run: RNG, gradients and buffers are restored.

FLOPs come from `torch.utils.flop_counter.FlopCounterMode`: matmuls and every custom op that
registers a formula (the jagged attention kernels do); embeddings and elementwise ops count 0,
following the usual convention.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

# Dense bf16 tensor-core peaks from the vendors' datasheets (TFLOP/s, without sparsity).
PEAK_BF16_TFLOPS: dict[str, float] = {
    "H200": 989.0,
    "H100": 989.0,
    "H800": 989.0,
    "GH200": 989.0,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "B200": 2250.0,
    "GB200": 2500.0,
    "MI300X": 1307.0,
}


def device_peak_flops(device: torch.device | str | None = None, override_tflops: float | None = None) -> float | None:
    """Dense bf16 peak in FLOP/s for `device`, or None where no peak is known (CPU, unknown GPU)."""
    if override_tflops is not None:
        return override_tflops * 1e12
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    # Longest key first, so "GH200" wins over "H200".
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key in name.upper():
            return PEAK_BF16_TFLOPS[key] * 1e12
    return None


# Modules whose import registers FLOP formulas for our custom ops. FlopCounterMode copies the formula
# registry when it is created, so they must be imported before the counter is made.
_FLOP_FORMULA_MODULES = ("kernels.attention_op", "kernels.attention_block_op", "kernels.attention_fp8_op")


def _register_custom_op_flops() -> None:
    for name in _FLOP_FORMULA_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # no Triton here: the custom ops cannot run either
            pass


def count_flops(fn: Callable[[], object]) -> tuple[int, dict[str, int]]:
    """FLOPs of running `fn` once (forward and whatever backward it does), total and per module."""
    _register_custom_op_flops()
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    per_module = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    return counter.get_total_flops(), per_module


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], object], device: torch.device, warmup: int = 2, repeat: int = 5) -> float:
    """Median seconds of `fn` (CUDA events on GPU, a host clock on CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


@dataclass
class LayerMFU:
    name: str
    flops: int
    seconds: float

    @property
    def tflops_per_s(self) -> float:
        return self.flops / self.seconds / 1e12 if self.seconds > 0 else 0.0


@dataclass
class MFUReport:
    step_flops: int
    step_seconds: float
    peak_flops: float | None
    layers: list[LayerMFU] = field(default_factory=list)

    @property
    def achieved_flops(self) -> float:
        return self.step_flops / self.step_seconds if self.step_seconds > 0 else 0.0

    @property
    def end_to_end_mfu(self) -> float | None:
        return self.achieved_flops / self.peak_flops if self.peak_flops else None

    @property
    def local_achieved_flops(self) -> float | None:
        """FLOP/s of the blocks timed alone: all their FLOPs over the sum of their times."""
        total_t = sum(layer.seconds for layer in self.layers)
        return sum(layer.flops for layer in self.layers) / total_t if total_t > 0 else None

    @property
    def local_mfu(self) -> float | None:
        local = self.local_achieved_flops
        return local / self.peak_flops if self.peak_flops and local is not None else None

    @property
    def scaling_ratio(self) -> float | None:
        """End-to-end over local (= end-to-end MFU over local MFU, but needs no peak)."""
        local = self.local_achieved_flops
        return self.achieved_flops / local if local else None

    def to_dict(self) -> dict:
        return {
            "step_flops": self.step_flops,
            "step_seconds": self.step_seconds,
            "achieved_tflops": self.achieved_flops / 1e12,
            "peak_tflops": self.peak_flops / 1e12 if self.peak_flops else None,
            "end_to_end_mfu": self.end_to_end_mfu,
            "local_mfu": self.local_mfu,
            "scaling_ratio": self.scaling_ratio,
            "layers": [{"name": x.name, "gflops": x.flops / 1e9, "ms": x.seconds * 1e3,
                        "tflops_per_s": x.tflops_per_s} for x in self.layers],
        }

    def table(self) -> str:
        def pct(x: float | None) -> str:
            return f"{100 * x:.1f}%" if x is not None else "n/a"

        lines = [f"{'layer':<40} {'GFLOP':>10} {'ms':>9} {'TFLOP/s':>9}"]
        for x in self.layers:
            lines.append(f"{x.name:<40} {x.flops / 1e9:>10.2f} {x.seconds * 1e3:>9.3f} {x.tflops_per_s:>9.2f}")
        lines.append(f"step: {self.step_flops / 1e9:.2f} GFLOP in {self.step_seconds * 1e3:.2f} ms = "
                     f"{self.achieved_flops / 1e12:.2f} TFLOP/s; end-to-end MFU {pct(self.end_to_end_mfu)}, "
                     f"local MFU {pct(self.local_mfu)}, scaling ratio "
                     + (f"{self.scaling_ratio:.2f}" if self.scaling_ratio is not None else "n/a"))
        return "\n".join(lines)


def _detach_like(x):
    if isinstance(x, torch.Tensor):
        y = x.detach()
        return y.requires_grad_(True) if y.is_floating_point() else y
    if isinstance(x, tuple):
        return tuple(_detach_like(v) for v in x)
    if isinstance(x, list):
        return [_detach_like(v) for v in x]
    if isinstance(x, dict):
        return {k: _detach_like(v) for k, v in x.items()}
    return x


def _float_outputs(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() and out.requires_grad else []
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _float_outputs(v)]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _float_outputs(v)]
    if hasattr(out, "__dataclass_fields__"):
        return [t for k in out.__dataclass_fields__ for t in _float_outputs(getattr(out, k))]
    return []


def capture_block_inputs(model: nn.Module, blocks: dict[str, nn.Module], run: Callable[[], object]) -> dict:
    """Runs `run()` once and records the (args, kwargs) each block was first called with."""
    captured: dict[str, tuple] = {}
    handles = []
    for name, block in blocks.items():
        def hook(_mod, args, kwargs, name=name):
            captured.setdefault(name, (_detach_like(args), _detach_like(kwargs)))
        handles.append(block.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return captured


def measure_local(blocks: dict[str, nn.Module], inputs: dict[str, tuple], device: torch.device,
                  warmup: int = 2, repeat: int = 5, autocast_dtype: torch.dtype | None = None) -> list[LayerMFU]:
    """Times each block alone, forward + backward, on the inputs it saw in a real step."""
    out: list[LayerMFU] = []
    for name, block in blocks.items():
        if name not in inputs:
            continue
        args, kwargs = inputs[name]

        def step(block=block, args=args, kwargs=kwargs):
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                res = block(*args, **kwargs)
            outs = _float_outputs(res)
            if outs:
                torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

        flops, _ = count_flops(step)
        seconds = time_fn(step, device, warmup=warmup, repeat=repeat)
        block.zero_grad(set_to_none=True)
        out.append(LayerMFU(name=name, flops=flops, seconds=seconds))
    return out


def mfu_report(step_flops: int, step_seconds: float, layers: Iterable[LayerMFU] = (),
               device: torch.device | str | None = None, peak_override_tflops: float | None = None) -> MFUReport:
    return MFUReport(step_flops=step_flops, step_seconds=step_seconds,
                     peak_flops=device_peak_flops(device, peak_override_tflops), layers=list(layers))


def dense_blocks(model: nn.Module, prefix: str = "") -> dict[str, nn.Module]:
    """The blocks timed alone for local MFU, by qualified name: the model's top-level trainable modules, with
    containers (ModuleDict/ModuleList) and layer stacks (a `layers` ModuleList) opened; embeddings excluded."""
    out: dict[str, nn.Module] = {}
    for name, mod in model.named_children():
        full = f"{prefix}{name}"
        if name == "embeddings" or not any(p.requires_grad for p in mod.parameters()):
            continue
        if isinstance(mod, nn.ModuleDict | nn.ModuleList):
            out.update(dense_blocks(mod, prefix=f"{full}."))
        elif isinstance(getattr(mod, "layers", None), nn.ModuleList):
            out.update({f"{full}.layers.{i}": layer for i, layer in enumerate(mod.layers)})
        else:
            out[full] = mod
    return out


def measure_step_in_place(model: nn.Module, loss_fn: Callable[[], torch.Tensor], device: torch.device, *,
                          blocks: dict[str, nn.Module] | None = None, autocast_dtype: torch.dtype | None = None,
                          warmup: int = 1, repeat: int = 3) -> tuple[int, list[LayerMFU]]:
    """(FLOPs of one training step, each block timed alone) for the batch `loss_fn` computes the loss of.

    Runs inside a training run without changing it: the random streams (dropout), every parameter's
    gradient and every buffer are restored afterwards, and no module's train/eval mode is touched.
    """
    blocks = dense_blocks(model) if blocks is None else blocks
    params = list(model.parameters())
    grads = [p.grad for p in params]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=cuda):
            for p in params:
                p.grad = None
            step_flops, _ = count_flops(lambda: loss_fn().backward())
            for p in params:
                p.grad = None
            inputs = capture_block_inputs(model, blocks, loss_fn)
            layers = measure_local(blocks, inputs, device, warmup=warmup, repeat=repeat,
                                   autocast_dtype=autocast_dtype)
            del inputs
    finally:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    return step_flops, layers


def mfu_record(step: int, step_flops: int, step_events: int, window_seconds: float, window_steps: int,
               window_events: int, layers: list[LayerMFU], peak_flops: float | None) -> dict[str, Any]:
    """The trainer's `{"kind": "mfu"}` record. End-to-end: the counted step's FLOPs per real event times the
    events of the window since the last record, over the window's wall time (data wait included); local: the
    blocks' FLOPs over their summed times alone. MFU fields are None where no peak is known."""
    achieved = step_flops / max(1, step_events) * window_events / window_seconds if window_seconds > 0 else 0.0
    report = MFUReport(step_flops=step_flops, step_seconds=step_flops / achieved if achieved > 0 else 0.0,
                       peak_flops=peak_flops, layers=layers)
    local = report.local_achieved_flops
    return {
        "kind": "mfu", "step": step, "step_flops": step_flops, "step_events": step_events,
        "window_steps": window_steps, "step_ms": window_seconds / max(1, window_steps) * 1e3,
        "e2e_tflops_per_s": achieved / 1e12, "local_tflops_per_s": local / 1e12 if local is not None else None,
        "peak_tflops": peak_flops / 1e12 if peak_flops else None,
        "local_mfu": report.local_mfu, "e2e_mfu": report.end_to_end_mfu if achieved > 0 else None,
        "scaling_ratio": report.scaling_ratio if achieved > 0 else None,
        "layers": [{"name": x.name, "flops": x.flops, "ms": x.seconds * 1e3, "tflops_per_s": x.tflops_per_s,
                    "mfu": x.flops / x.seconds / peak_flops if peak_flops and x.seconds > 0 else None}
                   for x in layers],
    }


def mfu_line(rec: dict[str, Any]) -> str:
    """One printable line of an mfu record: local / end-to-end / scaling ratio."""
    def rate(tflops: float | None, mfu: float | None) -> str:
        s = f"{tflops:.4g} TFLOP/s" if tflops is not None else "n/a"
        return s + (f" (MFU {100 * mfu:.1f}%)" if mfu is not None else "")

    ratio = rec["scaling_ratio"]
    line = (f"mfu @ step {rec['step']}: local {rate(rec['local_tflops_per_s'], rec['local_mfu'])} / "
            f"end-to-end {rate(rec['e2e_tflops_per_s'], rec['e2e_mfu'])} / scaling ratio "
            + (f"{ratio:.2f}" if ratio is not None else "n/a") + f" ({len(rec['layers'])} blocks")
    if rec["layers"]:
        slow = max(rec["layers"], key=lambda x: x["ms"])
        total = sum(x["ms"] for x in rec["layers"])
        line += f"; slowest alone: {slow['name']}, {100 * slow['ms'] / total:.0f}% of their time"
    if rec["peak_tflops"] is None:
        line += "; no peak known for this device: set logging.peak_tflops for MFU"
    return line + ")"
