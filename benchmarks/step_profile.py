"""`benchmarks/train_step.py --profile N`: a few training steps under torch.profiler."""

from __future__ import annotations

import collections
import time
import warnings
from pathlib import Path

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_steps(step, pf, n: int, device: torch.device) -> None:
    """`n` steps under torch.profiler: how busy the GPU is, the costliest kernels, and the host's waits on it."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    t0 = time.perf_counter()
    with profile(activities=acts, record_shapes=True) as prof:
        for _ in range(n):
            batch, _ = pf.next()
            step(batch)
            pf.preload()
        _sync(device)
    wall_ms = 1e3 * (time.perf_counter() - t0) / n
    events = prof.key_averages()
    busy_ms = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA") / 1e3 / n
    print(f"# profile: {wall_ms:.1f} ms per step (profiled), GPU kernels {busy_ms:.1f} ms per step "
          f"({100 * busy_ms / wall_ms:.0f}% busy)", flush=True)
    waits = [e for e in events if e.key in ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize",
                                            "cudaDeviceSynchronize", "aten::nonzero", "cudaMemcpyAsync")]
    for e in waits:
        print(f"# host wait  {e.key:<28} calls/step {e.count / n:7.1f}  host ms/step {e.cpu_time_total / 1e3 / n:7.2f}")
    if device.type == "cuda":  # where the host waits for the device: CUDA's sync debug mode names each place
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                batch, _ = pf.next()
                step(batch)
                pf.preload()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        places = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught
                                     if "synchroniz" in str(w.message))
        for where, count in places.most_common(15):
            print(f"# host sync  {count:4d}/step  {where}")
    copies = [e for e in prof.key_averages(group_by_input_shape=True) if e.key == "aten::copy_"]
    for e in sorted(copies, key=lambda e: -e.self_device_time_total)[:8]:  # the costliest copies and casts
        print(f"# copy  {e.self_device_time_total / 1e3 / n:6.2f} ms/step  {e.count / n:5.1f}/step  {e.input_shapes}")
    print(events.table(sort_by="self_device_time_total" if device.type == "cuda" else "self_cpu_time_total",
                       row_limit=25, max_name_column_width=60), flush=True)
