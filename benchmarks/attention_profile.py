"""Where one jagged attention forward+backward spends its time: host (Python, launches) vs GPU kernels.

    python benchmarks/attention_profile.py B            # a standard batch of the device README
    python benchmarks/attention_profile.py A timeline   # the GPU's timeline of back-to-back backward calls

Prints the wall time of one call against the summed GPU kernel time (a call whose wall time is well
above its kernel time is bound by host work), then the top operators by host time and by GPU time.
``timeline``: every kernel of ``calls`` back-to-back backward calls (causal, a kept graph) in GPU order, with
its start, its duration and the idle gap before it, so time between kernels shows; then the SM clock and power
draw under sustained calls (``nvidia-smi``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository importable

from benchmarks.attention import BATCHES, cuda_time, lengths, offsets_of, profiled_kernels  # noqa: E402
from benchmarks.attention_launch import per_call_us  # noqa: E402
from kernels import jagged_attention  # noqa: E402


def _inputs(name: str) -> tuple:
    """(max_len, offsets, q, k, v leaves, dO) of a standard batch, bf16."""
    B, max_len, H, D = BATCHES[name]
    lens = lengths(B, max_len)
    T = int(lens.sum())
    q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    return max_len, offsets_of(lens), q, k, v, torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)


def main(name: str = "B", iters: int = 20) -> None:
    max_len, offs, q, k, v, do = _inputs(name)

    def step() -> None:
        for t in (q, k, v):
            t.grad = None
        jagged_attention(q, k, v, offs, offs, causal=True, max_kv_len=max_len).backward(do)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / iters * 1e3
    host = per_call_us(step, iters) / 1e3  # launches queue behind the GPU once it is busy
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    gpu = sum(e.self_device_time_total for e in events) / iters / 1e3
    print(f"batch {name}: one call {wall:.3f} ms (synchronized), {host:.3f} ms host per call back to back, "
          f"GPU kernels {gpu:.3f} ms per call")
    print(events.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=48))
    print(events.table(sort_by="self_device_time_total", row_limit=8, max_name_column_width=48))


def timeline(name: str = "A", calls: int = 3) -> None:
    max_len, offs, q, k, v, do = _inputs(name)
    out = jagged_attention(q, k, v, offs, offs, causal=True, max_kv_len=max_len)
    bwd = lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    kernels = profiled_kernels(bwd, calls, warmup=5)
    t0 = kernels[0].time_range.start
    print(f"batch {name}: {calls} back-to-back backward calls, causal softmax; us from the first kernel's start\n")
    print("| start us | gap before us | duration us | kernel |")
    print("|---|---|---|---|")
    prev_end = t0
    for e in kernels:
        r = e.time_range
        print(f"| {r.start - t0:.0f} | {r.start - prev_end:.0f} | {r.elapsed_us():.0f} | {e.name[:60]} |")
        prev_end = r.end
    busy = sum(e.time_range.elapsed_us() for e in kernels)
    span = kernels[-1].time_range.end - t0
    print(f"\nspan {span / calls:.0f} us per call, kernels {busy / calls:.0f} us per call, idle {(span - busy) / calls:.0f}; "
          f"CUDA events without the profiler: {cuda_time(bwd, calls=5) * 1e3:.0f} us per call (5 back to back)")
    for _ in range(20):  # sustained load: the clocks and power the timed calls ran at
        bwd()
    print(f"while running: {nvidia_smi('clocks.sm,clocks.max.sm,power.draw,power.limit')} (SM MHz, max SM MHz, W, W limit)")
    torch.cuda.synchronize()


def nvidia_smi(fields: str) -> str:
    """``nvidia-smi --query-gpu=fields`` of the current GPU, or why it could not be read."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader",
                              f"--id={torch.cuda.current_device()}"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi unavailable ({type(e).__name__})"


if __name__ == "__main__":
    if any(a not in (*BATCHES, "timeline") for a in sys.argv[1:]):  # --help, or a typo: the usage
        sys.exit(__doc__)
    if "timeline" in sys.argv[1:]:
        timeline(*[a for a in sys.argv[1:] if a != "timeline"][:1] or ["A"])
    else:
        main(*(sys.argv[1:2] or ["B"]))
