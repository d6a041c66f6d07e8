"""Weak scaling of data-parallel training: 1 GPU vs N GPUs at the same per-GPU batch.

    torchrun --nproc-per-node 2 benchmarks/dist_scaling.py [--config configs/gem_medium.yaml] [--steps 8]
        [--dense fsdp,ddp] [--splits contiguous,balanced] [--guards device,host]

One torchrun, all rows in the same processes (imports and kernel compiles happen once). Every rank
builds the same global batches (`--batches` of N x batch rows, synthetic, `ingest.synth`) and takes
its share of each in one of two ways (`--splits`):
- contiguous: rank r takes rows [r*b, (r+1)*b) (the ranks' history lengths differ as they come);
- balanced: the global batch's rows sorted by history events and dealt to the ranks in serpentine
  order (0..N-1, N-1..0, ...), as the loader's length-aware batching (ingest/batching.py) and GEM's
  batch shuffling do, so every rank gets about the same events.
For each split and each `--guards` mode (device: the NaN guard and clipping on the device, no host
read per step; host: the earlier step, which read the touched-row counts and the gradient norm on the
host after backward):
1. baseline: every rank trains its own copy of the model alone on its own GPU (the single-GPU step:
   no process group traffic, the same optimizers and guard code as the data-parallel rows,
   `ClippedOptimizer` on local gradients), `steps` timed steps after warm-up; the 1-GPU rate is
   the batch over the mean of the ranks' step times;
2. data parallel over all ranks with `model.parallelize.parallelize` (`distributed.sparse:
   replicate`: tables replicated with a row-sparse gradient all-reduce, since fbgemm's CUDA kernels
   are not on the benchmark machine), once per `--dense` layout: fsdp (FSDP2 per block, bf16 params),
   fsdp_keep (the same, `reshard_after_forward: false`), ddp (torch DDP, bucketed all-reduce during
   backward), ddp_bf16 (the same with gradients and table rows sent as bf16, `reduce_dtype: bf16`), with the
   distributed trainer's optimizer wrapper (`ClippedOptimizer`).
All layouts of a split are built first and kept; after warm-up each is timed for `--steps` steps in
turn, `--reps` turns, so drift of the machine (clocks, the other GPU) falls on every layout alike.
Per turn: the 1-GPU step time is the mean of the ranks' (each alone), the N-GPU time the slowest
rank's; examples/s = examples / the median over turns; scaling ratio = the median over turns of
(1-GPU time / N-GPU time) of the same split and guard, with its range. Communication share: 3 more steps under the profiler;
NCCL kernel time not overlapped by any compute kernel over the profiled wall time ("exposed"), and
all NCCL kernel time ("total"); "GPU busy": the share of that wall time in which any kernel ran on
rank 0 (the rest: the GPU waiting for the host); "host issue ms": the host's time to issue one step
from an idle GPU (rank 0, median of 3; near the step time: the host, not the GPU, sets the pace). Batches are resident on the GPU: the loader is not timed.
Rank 0 prints one table and writes it to --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _global_tables(schema, rows: int, n: int, seed: int):
    from ingest.synth import generate_table

    return [generate_table(schema, rows, seed=seed, start_row=i * rows) for i in range(n)]


def _row_events(table, schema):
    import pyarrow.compute as pc

    from ingest.batching import row_events

    lens = [pc.list_value_length(table.column(s.name)).fill_null(0).to_numpy(zero_copy_only=False)
            for s in schema.sequences]
    return row_events(lens, [s.max_length for s in schema.sequences])


def split_rows(events, world: int, rank: int, how: str):
    """This rank's row indices of one global batch: contiguous, or balanced (serpentine by events)."""
    import numpy as np

    n = len(events)
    per = n // world
    if how == "contiguous":
        return np.arange(rank * per, (rank + 1) * per)
    order = np.argsort(-np.asarray(events), kind="stable")
    lane = np.arange(n) % world
    bins = np.where((np.arange(n) // world) % 2 == 0, lane, world - 1 - lane)
    return np.sort(order[bins == rank])


def _batches(schema, tables, world: int, rank: int, how: str, device):
    import pyarrow as pa

    from ingest.convert import table_to_batch

    out = []
    for t in tables:
        idx = split_rows(_row_events(t, schema), world, rank, how)
        out.append(table_to_batch(t.take(pa.array(idx)), schema).to(device))
    return out


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_steps(step, batches, warmup: int, steps: int, device) -> float:
    for i in range(warmup):
        step(batches[i % len(batches)])
    _sync(device)
    t0 = time.perf_counter()
    for i in range(steps):
        step(batches[i % len(batches)])
    _sync(device)
    return time.perf_counter() - t0


def _exposed_comm(prof) -> tuple[float, float]:
    """(NCCL kernel time not overlapped by compute kernels, all NCCL kernel time), seconds."""
    kernels = [e for e in prof.events() if getattr(e, "device_type", None) is not None
               and str(e.device_type).endswith("CUDA") and e.time_range.elapsed_us() > 0]
    comm = sorted((e.time_range.start, e.time_range.end) for e in kernels if "nccl" in e.name.lower())
    comp = sorted((e.time_range.start, e.time_range.end) for e in kernels if "nccl" not in e.name.lower())
    merged: list[list[float]] = []
    for a, b in comp:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    exposed = total = 0.0
    for a, b in comm:
        total += b - a
        covered = sum(max(0.0, min(b, y) - max(a, x)) for x, y in merged if x < b and y > a)
        exposed += (b - a) - covered
    return exposed * 1e-6, total * 1e-6


def _busy(prof) -> float:
    """Seconds in which at least one GPU kernel ran (the union of kernel intervals) over the profile."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if str(getattr(e, "device_type", "")).endswith("CUDA") and e.time_range.elapsed_us() > 0)
    busy, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy * 1e-6


def _profile(step, batches, dev) -> tuple[float, object]:
    """3 steps under torch.profiler: (wall seconds, profile)."""
    from torch.profiler import ProfilerActivity, profile

    _sync(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        tp = time.perf_counter()
        for i in range(3):
            step(batches[i % len(batches)])
        _sync(dev)
        tp = time.perf_counter() - tp
    return tp, prof


def _kernel_us(prof, steps: int = 3) -> dict[str, float]:
    """GPU time per step of each kernel name (microseconds), over the profiled steps."""
    out: dict[str, float] = {}
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA") and e.time_range.elapsed_us() > 0:
            out[e.name] = out.get(e.name, 0.0) + e.time_range.elapsed_us() / steps
    return out


def _sync_sites(step, batch, dev) -> dict[str, int]:
    """Where one step makes the host wait for the GPU: the calls that `torch.cuda.set_sync_debug_mode`
    warns about, by the innermost frames of this repository (ops run by backward's thread have none)."""
    import collections
    import traceback
    import warnings

    sites: collections.Counter = collections.Counter()

    def hook(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1]
                  if f.filename.startswith(str(REPO)) and "site-packages" not in f.filename]
        where = " < ".join(f"{Path(f.filename).relative_to(REPO)}:{f.lineno}" for f in frames[-3:][::-1])
        sites[f"{where or Path(filename).name + ':' + str(lineno)} | {str(message)[:50]}"] += 1

    _sync(dev)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = hook
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(batch)
            _sync(dev)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return dict(sites)


def _guarded_step(model_loss, opt, dev, autocast: bool):
    """The trainer's step: zero_grad, forward + loss, backward, the clipped / NaN-guarded optimizer step,
    and the NaN guard's flag pushed and polled as the distributed loop does (`SkipCounter`)."""
    from train.step_guard import SkipCounter

    skips = SkipCounter()
    n = [0]

    def step(b):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            loss = model_loss(b)
        loss.backward()
        opt.step()
        n[0] += 1
        skips.push(n[0], opt.last_ok)
        if skips.poll():
            raise RuntimeError("benchmark step had non-finite gradients")

    return step


def _single_gpu(schema, cfg, tasks, dev, autocast: bool, guard: str, alone):
    """The single-GPU step (plain model) with the distributed step's loss, optimizers and guard code
    (`make_loss_fn` over a one-rank group, so no collective; `ClippedOptimizer` on this process's
    gradients: fused AdamW, row-wise Adagrad on the tables); -> (step, None)."""
    from model import build_model
    from model.parallelize import make_loss_fn
    from train.dist_trainer import combined_optimizer
    from train.optimizers import split_params
    from train.step_guard import ClippedOptimizer

    torch.manual_seed(0)
    model = build_model(schema, cfg.model).to(dev)
    dense, tables = split_params(model)
    opt = ClippedOptimizer(combined_optimizer(dense, tables, cfg), list(dense.values()), cfg.optim.clip_grad_norm,
                            distributed=False, device_guard=guard == "device")
    loss_fn = make_loss_fn(tasks, group=alone)
    return _guarded_step(lambda b: loss_fn(model(b), b)[0], opt, dev, autocast), None


def _link_probe(dev, sizes_mb=(1, 8, 32)) -> list[dict]:
    """Bus bandwidth of a float32 all-reduce and all-gather between the ranks (NCCL's busbw: all-reduce
    bytes x 2(n-1)/n, all-gather output bytes x (n-1)/n, over the median time of 5 after 2 warm-ups)."""
    import statistics

    import torch.distributed as dist

    n = dist.get_world_size()
    out = []
    for mb in sizes_mb:
        x = torch.ones(mb * 2**18, device=dev)
        g = torch.empty(n * x.numel(), device=dev)
        for name, fn, factor in (("all_reduce", lambda x=x: dist.all_reduce(x), 2 * (n - 1) / n),
                                 ("all_gather", lambda g=g, x=x: dist.all_gather_into_tensor(g, x), (n - 1))):
            times = []
            for i in range(7):
                _sync(dev)
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                _sync(dev)
                if i >= 2:
                    times.append(time.perf_counter() - t0)
            t = statistics.median(times)
            out.append({"op": name, "mb": mb, "ms": 1e3 * t, "busbw_gb_s": factor * mb * 2**20 / t / 1e9})
    return out


DENSE = {"fsdp": {"dense": "fsdp"}, "fsdp_keep": {"dense": "fsdp", "reshard_after_forward": False},
         "ddp": {"dense": "ddp"}, "ddp_bf16": {"dense": "ddp", "reduce_dtype": "bf16"}}


def _data_parallel(schema, cfg, tasks, dev, autocast: bool, dense: str, guard: str):
    """The distributed trainer's step under `parallelize` (tables replicated); -> (step, Parallelized).
    guard "host": the earlier step (rows marked by any() over the table gradients, counts and the
    gradient norm read on the host after backward, the update skipped on the host)."""
    from model import build_model
    from model.parallelize import ParallelConfig, parallelize
    from train.dist_trainer import build_optimizer as dist_optimizer
    from train.step_guard import ClippedOptimizer

    torch.manual_seed(0)
    model = build_model(schema, cfg.model).to(dev)
    pz = parallelize(model, schema, ParallelConfig(sparse="replicate", **DENSE[dense]), dev,
                     batch_size=cfg.train.batch_size, loss_tasks=tasks, log=lambda _m: None)
    copt, dparams = dist_optimizer(pz, cfg)
    pz.replicated_sync.mark_at_forward = guard == "device"
    opt = ClippedOptimizer(copt, dparams, cfg.optim.clip_grad_norm, pz.replicated_sync,
                            device_guard=guard == "device")
    if guard == "device" and not opt.device_guard:
        raise RuntimeError("the device guard fell back to the host guard (an optimizer cannot skip on the device)")
    return _guarded_step(lambda b: pz.model(b)[0], opt, dev, autocast), pz


def _profiled(step, batches, dev, pz, label: str, info, profile_table: bool) -> dict:
    """3 profiled steps and one step under the sync debug mode (rank 0 prints the kernel table if asked)."""
    if dev.type != "cuda":
        return {}
    host, full = [], []
    for i in range(3):  # from an idle GPU: the host's time to issue a step, and the step's time to finish
        _sync(dev)
        t0 = time.perf_counter()
        step(batches[i % len(batches)])
        host.append(time.perf_counter() - t0)
        _sync(dev)
        full.append(time.perf_counter() - t0)
    tp, prof = _profile(step, batches, dev)
    exposed, total = _exposed_comm(prof)
    if profile_table and info.is_main:
        print(f"# profile of 3 steps, rank 0, {label}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
    res = {"profiled_s": tp, "comm_exposed_s": exposed, "comm_total_s": total, "gpu_busy_s": _busy(prof),
           "kernels_us": _kernel_us(prof), "sync_sites": _sync_sites(step, batches[0], dev),
           "host_issue_s": sorted(host)[1], "isolated_step_s": sorted(full)[1]}
    if pz is not None:
        res.update(sparse_rows_sent=pz.replicated_sync.rows_sent, sparse_rows_received=pz.replicated_sync.rows_received)
    return res


def _print_diagnosis(rows: list[dict], top: int = 12) -> None:
    """Per N-GPU row: the kernels with the largest GPU time per step above the 1-GPU row of the same split
    and guard, and the host-wait sites of both."""
    for r in rows:
        if r["gpus"] == 1 or "kernels_us" not in r:
            continue
        one = next((x for x in rows if x["gpus"] == 1 and x["split"] == r["split"] and x["guard"] == r["guard"]), None)
        if one is None or "kernels_us" not in one:
            continue
        k1, k2 = one["kernels_us"], r["kernels_us"]
        diff = sorted(((k2.get(k, 0.0) - k1.get(k, 0.0), k) for k in set(k1) | set(k2)), reverse=True)
        print(f"# {r['split']} {r['dense']} guard {r['guard']}: GPU ms/step {sum(k2.values()) / 1e3:.1f} "
              f"(1 GPU {sum(k1.values()) / 1e3:.1f}); kernels with the most extra time (ms/step, N GPU - 1 GPU):")
        for d, k in diff[:top]:
            print(f"#   {d / 1e3:+7.2f}  ({k2.get(k, 0.0) / 1e3:6.2f} vs {k1.get(k, 0.0) / 1e3:6.2f})  {k[:90]}")
        for d, k in diff[-4:]:
            print(f"#   {d / 1e3:+7.2f}  ({k2.get(k, 0.0) / 1e3:6.2f} vs {k1.get(k, 0.0) / 1e3:6.2f})  {k[:90]}")
        for name, x in (("1 GPU", one), (f"{r['gpus']} GPU", r)):
            sites = x.get("sync_sites", {})
            print(f"# host waits in one {name} step ({r['guard']} guard): {sum(sites.values())}")
            for site, n in sorted(sites.items(), key=lambda kv: -kv[1])[:8]:
                print(f"#   {n:3d} x {site}")


def _free(dev) -> None:
    import gc

    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(REPO / "configs" / "gem_medium.yaml"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="turns: every layout timed --steps steps, in turn, this often")
    ap.add_argument("--batches", type=int, default=3, help="distinct global batches, cycled")
    ap.add_argument("--dense", default="fsdp,ddp", help="comma-separated: " + ", ".join(DENSE))
    ap.add_argument("--splits", default="contiguous,balanced", help="comma-separated: contiguous, balanced")
    ap.add_argument("--guards", default="device", help="comma-separated: device (no host read per step), host "
                    "(the earlier step: touched rows and gradient norm read on the host after backward)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default="")
    ap.add_argument("--diagnose", action="store_true", help="rank 0 prints where the N-GPU step's extra GPU "
                    "time goes (kernels, against the 1-GPU step) and where each step makes the host wait")
    ap.add_argument("--kernel-table", action="store_true", help="rank 0 prints each profiled layout's top kernels")
    a, overrides = ap.parse_known_args(argv)
    denses = [d for d in a.dense.split(",") if d]
    splits = [x for x in a.splits.split(",") if x]
    guards = [g for g in a.guards.split(",") if g]
    bad = [d for d in denses if d not in DENSE] + [x for x in splits if x not in ("contiguous", "balanced")] + [
        g for g in guards if g not in ("device", "host")]
    if bad:
        ap.error(f"unknown --dense / --splits value(s): {', '.join(bad)}")

    import torch.distributed as dist

    from features import load_schema
    from train import distributed as tdist
    from train.config import load_run_config

    cfg = load_run_config(a.config, overrides)
    info = tdist.setup(a.device, timeout_s=180)
    dev = info.device
    n = info.world_size
    schema = load_schema(cfg.schema_path())
    tasks = list(schema.label_names)
    bsz = cfg.train.batch_size
    autocast = dev.type == "cuda" and cfg.train.bf16
    t_data = time.perf_counter()
    tables = _global_tables(schema, n * bsz, a.batches, seed=1000)
    t_data = time.perf_counter() - t_data
    res: dict = {"world_size": n, "batch_per_rank": bsz, "data_s": t_data, "rows": []}
    lines = []
    if n > 1 and dev.type == "cuda":
        res["link"] = _link_probe(dev)
        lines_link = ", ".join(f"{x['op']} {x['mb']} MB {x['ms']:.2f} ms ({x['busbw_gb_s']:.1f} GB/s)"
                               for x in res["link"])
    else:
        lines_link = ""
    def pct(r: dict, key: str) -> str:
        return f"{100 * r[key] / r['profiled_s']:.1f}%" if "profiled_s" in r else "n/a"

    def ms(r: dict, key: str) -> str:
        return f"{1e3 * r[key]:.1f}" if key in r else "n/a"

    import statistics

    alone = None  # this rank's one-rank group: the baseline's loss takes no collective
    for r in range(n):
        g = dist.new_group([r]) if n > 1 else None
        if r == info.rank:
            alone = g
    for how in splits:
        batches = _batches(schema, tables, n, info.rank, how, dev)
        events = sum(int(b.seq_offsets[s.name][-1]) for b in batches for s in schema.sequences) / len(batches)
        evs = tdist.all_gather_floats(events)
        ev_text = " / ".join(f"{e / 1e3:.1f}k" for e in evs)
        layouts = []  # (gpus, dense, guard, step, pz); kept alive together, timed in turns
        for guard in guards:
            layouts.append((1, "-", guard, *_single_gpu(schema, cfg, tasks, dev, autocast, guard, alone)))
            if n > 1:
                layouts += [(n, d, guard, *_data_parallel(schema, cfg, tasks, dev, autocast, d, guard)) for d in denses]
        times: list[list[float]] = [[] for _ in layouts]
        for _g, _d, _gu, step, _pz in layouts:  # warm-up (compiles, allocator)
            for k in range(a.warmup):
                step(batches[k % len(batches)])
            _sync(dev)
        for _rep in range(a.reps):  # turns: drift of the machine spreads over every layout alike
            for i, (_g, _d, _gu, step, _pz) in enumerate(layouts):
                if n > 1:
                    dist.barrier()
                times[i].append(_time_steps(step, batches, 0, a.steps, dev) / a.steps)
        per_rank = [[tdist.all_gather_floats(t) for t in ts] for ts in times]  # [layout][rep][rank]
        for i, (gpus, dense, guard, step, pz) in enumerate(layouts):
            label = f"{how}, {'1 GPU' if gpus == 1 else dense}, guard {guard}"
            prof = _profiled(step, batches, dev, pz, label, info, a.kernel_table)
            one_i = next(j for j, x in enumerate(layouts) if x[0] == 1 and x[2] == guard)
            # per turn: 1 GPU = the mean of the ranks (each alone), N GPU = the slowest rank
            t_rep = [sum(r) / n if gpus == 1 else max(r) for r in per_rank[i]]
            one_rep = [sum(r) / n for r in per_rank[one_i]]
            ratios = [o / t for o, t in zip(one_rep, t_rep)]
            t_med = statistics.median(t_rep)
            ranks = [statistics.median(r[k] for r in per_rank[i]) for k in range(n)]
            rate = gpus * bsz / t_med
            row = {"gpus": gpus, "split": how, "dense": dense, "guard": guard, "step_s_per_rank": ranks,
                   "step_s_turns": t_rep, "events_per_rank": evs, "examples_per_s": rate,
                   "scaling_ratio": statistics.median(ratios), "ratio_turns": ratios, **prof}
            res["rows"].append(row)
            spread = f" ({min(ratios):.3f}-{max(ratios):.3f})" if gpus > 1 and len(ratios) > 1 else ""
            ratio_text = "1.00" if gpus == 1 else f"{row['scaling_ratio']:.3f}"
            comm = "| - | - " if gpus == 1 else f"| {pct(prof, 'comm_exposed_s')} | {pct(prof, 'comm_total_s')} "
            lines.append(f"| {gpus} | {how} | {dense} | {guard} | {1e3 * t_med:.1f} "
                         f"| {' / '.join(f'{1e3 * x:.1f}' for x in ranks)} | {ev_text} | {rate:,.0f} "
                         f"| {ratio_text}{spread} "
                         f"| {pct(prof, 'gpu_busy_s')} | {ms(prof, 'host_issue_s')} {comm}|")
        del layouts, batches
        _free(dev)
    if info.is_main:
        head = [f"# weak scaling, {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}, "
                f"torch {torch.__version__}, {Path(a.config).name}, batch {bsz}/GPU, bf16={autocast}, "
                f"{a.reps} turns of {a.steps} timed steps after {a.warmup}, {a.batches} global batches cycled; "
                "step ms: median over turns of the ranks' mean (1 GPU) or the slowest rank (N GPU); ratio: median "
                "over turns (range); GPU busy and comm shares: rank 0, 3 profiled steps",
                "| GPUs | split | dense | guard | step ms | step ms per rank | events/batch per rank "
                "| examples/s | scaling ratio | GPU busy | host issue ms | comm exposed | comm total |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        if lines_link:
            head.insert(1, f"# link (busbw): {lines_link}")
        print("\n".join(head + lines), flush=True)
        if a.diagnose:
            _print_diagnosis(res["rows"])
        res["table"] = head + lines
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    if n > 1:
        dist.barrier()
    tdist.teardown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
