"""Weak scaling of data-parallel training: 1 GPU vs N GPUs at the same per-GPU batch.

    torchrun --nproc-per-node 2 benchmarks/dist_scaling.py [--config configs/gem_medium.yaml] [--steps 8]

One torchrun, two phases in the same processes (so imports and kernel compiles happen once):
1. baseline: every rank trains its own copy of the model alone on its own GPU (the single-GPU
   path: no process group traffic), `steps` timed steps after warm-up;
2. data parallel over all ranks with `model.parallelize.parallelize` (`distributed.sparse:
   replicate`: the tables replicated with a sparse-row gradient all-reduce, since fbgemm's CUDA
   kernels are not on the benchmark machine; the dense blocks under FSDP2), same per-rank batch.
Examples/s = global examples / wall time; scaling ratio = (N-GPU examples/s) / (N x 1-GPU examples/s).
Communication share: the last 3 steps of phase 2 run under the profiler; NCCL kernel time not
overlapped by any compute kernel, over the profiled wall time ("exposed"), and all NCCL time.
Batches are synthetic (`ingest.synth`), made once and resident on the GPU: the loader is not timed.
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


def _batches(schema, rows: int, n: int, seed: int, device):
    from ingest.convert import table_to_batch
    from ingest.synth import generate_table

    out = []
    for i in range(n):
        b = table_to_batch(generate_table(schema, rows, seed=seed, start_row=i * rows), schema)
        out.append(b.to(device))
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


def _single_gpu(schema, cfg, tasks, batches, dev, autocast: bool, warmup: int, steps: int) -> tuple[float, float]:
    """The trainer's single-GPU step (plain model, its optimizers); -> (timed seconds, first step seconds)."""
    from model import build_model
    from model.losses import multitask_loss
    from train.trainer import build_optimizer

    torch.manual_seed(0)
    model = build_model(schema, cfg.model).to(dev)
    opt, _, dense_params, _ = build_optimizer(model, cfg)

    def step(b):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            out = model(b)
        loss, _ = multitask_loss(out.logits.float(), b.labels, b.label_mask, b.weights, tasks)
        (loss + out.aux_loss.float()).backward()
        torch.nn.utils.clip_grad_norm_(dense_params, cfg.optim.clip_grad_norm)
        opt.step()

    t0 = time.perf_counter()
    step(batches[0])
    _sync(dev)
    first = time.perf_counter() - t0
    return _time_steps(step, batches, warmup, steps, dev), first


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(REPO / "configs" / "gem_medium.yaml"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batches", type=int, default=3, help="distinct synthetic batches per rank, cycled")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default="")
    ap.add_argument("--kernel-table", action="store_true", help="rank 0 prints the profiled step's top kernels")
    a, overrides = ap.parse_known_args(argv)

    import torch.distributed as dist

    from features import load_schema
    from model import build_model
    from model.parallelize import ParallelConfig, parallelize
    from train import distributed as tdist
    from train.config import load_run_config
    from train.dist_trainer import build_optimizer as dist_optimizer

    cfg = load_run_config(a.config, overrides)
    info = tdist.setup(a.device, timeout_s=180)
    dev = info.device
    schema = load_schema(cfg.schema_path())
    tasks = list(schema.label_names)
    bsz = cfg.train.batch_size
    autocast = dev.type == "cuda" and cfg.train.bf16
    t_data = time.perf_counter()
    batches = _batches(schema, bsz, a.batches, seed=1000 + info.rank, device=dev)
    t_data = time.perf_counter() - t_data
    events = sum(int(b.seq_offsets[s.name][-1]) for b in batches for s in schema.sequences) / len(batches)

    # ---- phase 1: one GPU each, no communication --------------------------------------------------
    t1, t_compile = _single_gpu(schema, cfg, tasks, batches, dev, autocast, a.warmup, a.steps)
    print(f"rank {info.rank}: 1 GPU alone: {1e3 * t1 / a.steps:.1f} ms/step (first step {t_compile:.1f} s, "
          f"data {t_data:.1f} s, {events:,.0f} events/batch)", flush=True)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    if info.world_size > 1:
        dist.barrier()

    # ---- phase 2: data parallel over every rank ---------------------------------------------------
    res = {"world_size": info.world_size, "batch_per_rank": bsz, "mean_events_per_batch": events,
           "one_gpu_step_s": t1 / a.steps, "first_step_s": t_compile, "data_s": t_data}
    if info.world_size > 1:
        torch.manual_seed(0)
        model = build_model(schema, cfg.model).to(dev)
        pz = parallelize(model, schema, ParallelConfig(sparse="replicate"), dev, batch_size=bsz,
                         loss_tasks=tasks, log=lambda _m: None)
        copt, dparams = dist_optimizer(pz, cfg)
        from train.dist_trainer import _ClippedOptimizer

        opt2 = _ClippedOptimizer(copt, dparams, cfg.optim.clip_grad_norm, pz.replicated_sync)

        def step2(b):
            opt2.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
                loss, _ = pz.model(b)
            loss.backward()
            opt2.step()

        t2 = _time_steps(step2, batches, a.warmup, a.steps, dev)
        res["dp_step_s"] = t2 / a.steps
        print(f"rank {info.rank}: data parallel x{info.world_size}: {1e3 * t2 / a.steps:.1f} ms/step", flush=True)
        if dev.type == "cuda":
            from torch.profiler import ProfilerActivity, profile

            _sync(dev)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                tp = time.perf_counter()
                for i in range(3):
                    step2(batches[i % len(batches)])
                _sync(dev)
                tp = time.perf_counter() - tp
            exposed, total = _exposed_comm(prof)
            if a.kernel_table and info.is_main:
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))
            res.update(profiled_s=tp, comm_exposed_s=exposed, comm_total_s=total,
                       sparse_rows_synced=pz.replicated_sync.rows_sent)
        steps = tdist.all_gather_floats(t2 / a.steps)
        res["dp_step_s_per_rank"] = steps
    ones = tdist.all_gather_floats(t1 / a.steps)
    res["one_gpu_step_s_per_rank"] = ones
    if info.is_main:
        n = info.world_size
        one_rate = bsz / (sum(ones) / len(ones))
        lines = [f"# weak scaling, {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}, "
                 f"torch {torch.__version__}, {Path(a.config).name}, batch {bsz}/GPU "
                 f"(~{events:,.0f} history events/batch), bf16={autocast}, {a.steps} timed steps",
                 "| GPUs | step ms | examples/s | scaling ratio | comm exposed | comm total |", "|---|---|---|---|---|---|",
                 f"| 1 | {1e3 * sum(ones) / len(ones):.1f} | {one_rate:,.0f} | 1.00 | - | - |"]
        if n > 1:
            dp = max(res["dp_step_s_per_rank"])
            rate = n * bsz / dp
            res.update(one_gpu_examples_per_s=one_rate, dp_examples_per_s=rate, scaling_ratio=rate / (n * one_rate))
            share = (f"{100 * res['comm_exposed_s'] / res['profiled_s']:.1f}%" if "profiled_s" in res else "n/a")
            tot = (f"{100 * res['comm_total_s'] / res['profiled_s']:.1f}%" if "profiled_s" in res else "n/a")
            lines.append(f"| {n} | {1e3 * dp:.1f} | {rate:,.0f} | {res['scaling_ratio']:.3f} | {share} | {tot} |")
        print("\n".join(lines), flush=True)
        res["table"] = lines
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    if info.world_size > 1:
        dist.barrier()
    tdist.teardown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
