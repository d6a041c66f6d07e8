"""Quality of the FP8 recipes: the same training run in bf16 and under each FP8 precision policy.

    PYTHONPATH=. python benchmarks/fp8_quality.py [--steps 200] [--variants a,b] [--parallel 2] [--gpus 0,1]
                                                  [--gpu-after 1:/tmp/bench.done] [--deadline 250] [--mps]
    PYTHONPATH=. python benchmarks/fp8_quality.py --cpu          # tiny CPU mode: emulated recipes, demo schema
    PYTHONPATH=. python benchmarks/fp8_quality.py --seeds 0,1,2 --variants tensorwise --parallel 6 --gpus 0,1
    PYTHONPATH=. python benchmarks/fp8_quality.py --pool benchmarks/quality/*-600-*.json   # tables over saved runs

Every variant is one `train.trainer.Trainer` run of the same config (``configs/gem_medium.yaml`` on the GPU),
same seed, data and steps; only the run config's ``precision:`` section differs. The table holds the
held-out click and conversion NE of each run (from its summary.json) and the relative difference to the
``bf16`` run; ``bf16 (repeat)`` runs the baseline again, so its difference is the run-to-run noise floor
(non-deterministic GPU reductions), the scale against which the FP8 differences are read. Target: relative
NE difference <= 0.1%.

On the GPU each variant runs in its own process (``--parallel`` at a time, spread over ``--gpus``, at most
ceil(parallel / number of GPUs) on one GPU; ``--gpu-after 1:FILE`` keeps GPU 1 free until FILE exists, so a
benchmark can use it first; ``--mps`` runs them under CUDA's Multi-Process Service, so the small-batch runs'
kernels share a GPU at once instead of taking turns); the synthetic data is written once before they start. ``--cpu`` runs the variants one after another in this
process with ``emulate: true`` (quantize -> dequantize reference of every recipe, FP8 attention's reference)
on the demo schema and a tiny model: a check that the pipeline works, not a quality figure.

``--pool a.json b.json`` trains nothing and prints the seed tables over the paired runs of earlier ``--json``
files (each run paired with the bf16 run of its own file and seed), then the NE difference against the target: its
95% interval over the pairs, whether that lies inside ±0.1%, whether it excludes a loss above 0.1%, and the pairs a
±0.1% interval needs at that spread. The device time of one session trains a few seed pairs, so the runs kept in
``benchmarks/quality/`` add up across sessions. ``--no-bf16`` trains only the named variants: a file of such runs
is paired at ``--pool`` time with the bf16 runs of the same seeds in a kept file of the same setup, in rows of
their own (``X (bf16 of another call)``): runs of one call can share a shift that such pairs do not cancel
(benchmarks/RESULTS.md, "Fast-accumulation runs paired across calls"), so the target is read on pairs trained
side by side.

``--seeds 0,1,2`` trains every variant once per seed (``train.seed``: model init and batch order; the data
stays the same) and compares each run with the bf16 run of its own seed. Short runs are chaotic (any
perturbation of the trajectory, FP8 rounding among them, moves held-out NE by about a percent), so the
figure to read is the mean over seeds of the paired difference against its spread, printed below the
per-run table.

Each table also holds the recalibrated NE (``train.metrics``: NE after one logit shift per task, fitted out of
fold on the held-out rows). Runs that learn the same ranking but end with different calibration offsets differ
in NE and far less in it, so it separates a recipe's effect on what the model learned from the offset noise
of short runs. And the expected NE (``train.metrics``: every held-out label replaced by its true probability,
which the synthetic data carries): two runs compared on the same rows differ in it by what they predict, not by
how the held-out labels' coin flips fell on the rows where their predictions differ.

Runs trained with ``-- --eval.save_predictions=true`` keep their per-row held-out predictions; each FP8 run then
gets, in its summary (``sampling``), the standard error of its NE difference to the bf16 run of its seed
over the held-out rows (``benchmarks/quality_sampling.py``), and a last table sets that error against the pairs'
spread: the share of the spread that more held-out rows would remove.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: `benchmarks` importable
from benchmarks.quality_sampling import attach_sampling, sampling_table  # noqa: E402
from benchmarks.quality_stats import (  # noqa: E402
    METRICS,
    QualityError,
    pooled_tables,
    seed_table,
    split_seed,
    table,
    with_seed,
)

# name -> the run config's precision: section ({} = no section: plain bf16 autocast on the GPU, fp32 on CPU).
# Interaction layers stay bf16 in every variant (their 160-wide input is no multiple of 128, and at these
# sizes they lose in FP8: benchmarks/RESULTS.md); attention projections and MLPs take the recipe.
VARIANTS: dict[str, dict[str, object]] = {
    "bf16": {},
    "bf16 (repeat)": {},
    "blockwise wgrad=bf16": {"attention": "blockwise", "mlp": "blockwise", "wgrad": "bf16"},
    "blockwise": {"attention": "blockwise", "mlp": "blockwise", "wgrad": "recipe"},
    "tensorwise": {"attention": "tensorwise", "mlp": "tensorwise", "wgrad": "recipe", "scaling": "current"},
    "tensorwise delayed": {"attention": "tensorwise", "mlp": "tensorwise", "wgrad": "recipe", "scaling": "delayed"},
    "tensorwise delayed fast accum": {"attention": "tensorwise", "mlp": "tensorwise", "wgrad": "recipe",
                                      "scaling": "delayed", "fast_accum": "all"},
    "tensorwise delayed fast accum dY margin": {"attention": "tensorwise", "mlp": "tensorwise", "wgrad": "recipe",
                                               "scaling": "delayed", "fast_accum": "all", "grad_margin": 4},
    "tensorwise delayed fast dgrad": {"attention": "tensorwise", "mlp": "tensorwise", "wgrad": "recipe",
                                      "scaling": "delayed", "fast_accum": "dgrad"},
    "rowwise": {"attention": "rowwise", "mlp": "rowwise", "wgrad": "recipe"},
    "mxfp8 (hopper: emulate)": {"attention": "mxfp8", "mlp": "mxfp8", "wgrad": "recipe",
                                "mx_on_hopper": "emulate"},
    "mxfp8 ceil (hopper: emulate)": {"attention": "mxfp8", "mlp": "mxfp8", "wgrad": "recipe",
                                     "mx_on_hopper": "emulate", "mx_scale": "ceil"},
    "fp8 attention kernel": {"attention_kernel": "fp8"},
    "fp8 attention kernel fwd+bwd": {"attention_kernel": "fp8_fwd_bwd"},
    "fp8 qkv projection route": {"attention_kernel": "fp8_qkv"},
}
CPU_VARIANTS = ("bf16", "bf16 (repeat)", "blockwise", "tensorwise", "mxfp8 (hopper: emulate)",
                "fp8 attention kernel", "fp8 attention kernel fwd+bwd")

# Tiny CPU mode: the demo schema, a small model (its cross attention runs FP8 attention), few steps.
CPU_OVERRIDES = [
    "--data.synth.train_rows=1024", "--data.synth.eval_rows=256", "--data.synth.files=1",
    "--train.batch_size=64", "--train.log_every=2", "--train.device=cpu", "--train.torch_threads=1",
    "--train.checkpoint_every=0", "--optim.warmup_steps=2", "--eval.batch_size=256", "--eval.max_batches=0",
    "--model.d_model=16", "--model.num_heads=2", "--model.sequence_encoder.num_layers=0",
    "--model.interaction.kind=none", "--model.top_dim=32", "--model.head_hidden=16",
]
COMMON = ["--logging.progress=false", "--logging.tensorboard=false", "--logging.report=false",
          "--checkpoint.at_end=false"]


def precision_overrides(policy: dict[str, object], emulate: bool) -> list[str]:
    pol = dict(policy)
    if emulate and pol:
        pol["emulate"] = "true"
    return [f"--precision.{k}={v}" for k, v in pol.items()]


def variant_overrides(run: str, steps: int, data_dir: Path | None, cpu: bool, extra: list[str]) -> list[str]:
    name, seed = split_seed(run)
    if name not in VARIANTS:
        raise QualityError(f"fp8_quality: unknown variant {name!r}; known: {list(VARIANTS)}")
    out = list(COMMON) + [f"--train.steps={steps}"]
    if data_dir is not None:
        out += [f"--data.train_url={data_dir / 'train'}", f"--data.eval_url={data_dir / 'eval'}"]
    if cpu:
        out += CPU_OVERRIDES
    else:
        out += ["--eval.max_batches=0"]  # every held-out row
    out += list(extra) + precision_overrides(VARIANTS[name], emulate=cpu)
    return out if seed is None else out + [f"--train.seed={seed}"]


def config_path(cpu: bool) -> Path:
    return REPO / "configs" / ("demo.yaml" if cpu else "gem_medium.yaml")


def run_one(name: str, run_dir: Path, steps: int, data_dir: Path | None, cpu: bool, extra: list[str]) -> dict:
    """One training run in this process; returns its summary (also written to run_dir/summary.json)."""
    from train.config import load_run_config
    from train.trainer import Trainer

    cfg = load_run_config(config_path(cpu), variant_overrides(name, steps, data_dir, cpu, extra))
    t0 = time.perf_counter()
    summary = Trainer(cfg, run_dir, quiet=True).fit()
    summary["quality_wall_s"] = time.perf_counter() - t0
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=True) + "\n")
    return summary


def write_data(steps: int, data_dir: Path | None, cpu: bool, extra: list[str]) -> None:
    from features import load_schema
    from train.config import load_run_config
    from train.data import ensure_synthetic

    cfg = load_run_config(config_path(cpu), variant_overrides("bf16", steps, data_dir, cpu, extra))
    ensure_synthetic(cfg, load_schema(cfg.schema_path()), log=lambda m: print(m, file=sys.stderr))


MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/nvidia/bin", "/usr/bin"])


def mps_env(root: Path) -> dict[str, str]:
    """The variables that point the MPS daemon and its clients at one pipe and log folder under ``root``."""
    return {"CUDA_MPS_PIPE_DIRECTORY": str(root / "mps-pipe"), "CUDA_MPS_LOG_DIRECTORY": str(root / "mps-log")}


@contextlib.contextmanager
def mps_daemon(root: Path, search: str = MPS_SEARCH):
    """CUDA's Multi-Process Service for the runs' processes (``--mps``): without it a GPU runs one process's
    kernels at a time, in time slices, and each small-batch run leaves most of the GPU idle in its slice; under
    MPS the processes' kernels share the GPU at once. Yields the variables the runs need; stops the daemon at the
    end."""
    exe = shutil.which(MPS_CONTROL, path=search)
    if exe is None:
        raise QualityError(f"fp8_quality --mps: {MPS_CONTROL} was not found (searched {search}); it comes with the "
                           "NVIDIA driver's utilities. Run without --mps")
    env = mps_env(root)
    for d in env.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    full = {**os.environ, **env}
    started = subprocess.run([exe, "-d"], env=full, capture_output=True, text=True)
    if started.returncode != 0:
        raise QualityError(f"fp8_quality --mps: '{exe} -d' failed with exit {started.returncode}: "
                           f"{(started.stderr or started.stdout).strip()[:300]} (logs in {env['CUDA_MPS_LOG_DIRECTORY']})")
    print(f"MPS daemon started (pipe {env['CUDA_MPS_PIPE_DIRECTORY']})", file=sys.stderr, flush=True)
    try:
        yield env
    finally:
        subprocess.run([exe], input="quit\n", env=full, capture_output=True, text=True)


def _spawn(name: str, run_dir: Path, gpu: str | None, args: argparse.Namespace, extra: list[str],
           env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, **(env_extra or {})}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", name, "--run-root", str(args.run_root),
           "--steps", str(args.steps)]
    if args.data_dir:
        cmd += ["--data-dir", str(args.data_dir)]
    if args.cpu:
        cmd.append("--cpu")
    cmd += ["--"] + extra
    log = open(run_dir / "stderr.log", "w")  # noqa: SIM115 (closed with the process below)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    proc.log = log  # type: ignore[attr-defined]
    return proc


def _last_step(run_dir: Path) -> int | None:
    """The last logged training step of a run (from its metrics.jsonl), or None."""
    f = run_dir / "metrics.jsonl"
    if not f.exists():
        return None
    steps = [json.loads(ln).get("step") for ln in f.read_text().splitlines() if '"train"' in ln]
    return steps[-1] if steps else None


def _dir_name(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def _gpu_ready(gpu: str | None, after: dict[str, Path]) -> bool:
    """A GPU named in ``--gpu-after GPU:FILE`` takes runs only once FILE exists (another job used it first)."""
    return gpu is None or gpu not in after or after[gpu].exists()


def pick_gpu(gpus: list[str | None], busy: list[str | None], per_gpu: int,
             after: dict[str, Path]) -> str | None | bool:
    """The ready GPU with the fewest runs (``busy``: the GPU of each running process) and fewer than
    ``per_gpu``; False when none has room. Ties go to the GPU listed first."""
    load = {g: busy.count(g) for g in gpus if _gpu_ready(g, after)}
    free = [g for g in load if load[g] < per_gpu]
    return min(free, key=lambda g: load[g]) if free else False


def run_parallel(names: list[str], args: argparse.Namespace, extra: list[str],
                 env_extra: dict[str, str] | None = None) -> dict[str, dict | None]:
    """``--parallel`` processes at a time, at most ceil(parallel / len(gpus)) on one GPU: each new run goes to
    a ready GPU with the fewest runs on it (so with --parallel equal to the GPU count, one run per GPU).
    ``env_extra``: variables every run's process gets on top of this one's (the MPS daemon's, with --mps)."""
    gpus = [g for g in args.gpus.split(",") if g] if args.gpus else [None]
    per_gpu = -(-args.parallel // len(gpus))
    after = dict(_parse_after(a) for a in args.gpu_after)
    pending = list(names)
    running: dict[str, subprocess.Popen] = {}
    on_gpu: dict[str, str | None] = {}
    results: dict[str, dict | None] = {n: None for n in names}
    t_end = time.monotonic() + args.deadline if args.deadline else math.inf
    while pending or running:
        if time.monotonic() > t_end:
            for n, p in running.items():
                p.kill()
                p.wait()
                p.log.close()  # type: ignore[attr-defined]
                step = _last_step(args.run_root / _dir_name(n))
                results[n] = {"error": f"stopped at the {args.deadline:.0f} s deadline"
                              + (f" after step {step}" if step is not None else " before its first logged step")}
            for n in pending:
                results[n] = {"error": "not started before the deadline"}
            break
        while pending and len(running) < args.parallel:
            gpu = pick_gpu(gpus, list(on_gpu.values()), per_gpu, after)
            if gpu is False:
                break
            n = pending.pop(0)
            running[n] = _spawn(n, args.run_root / _dir_name(n), gpu, args, extra, env_extra)
            on_gpu[n] = gpu
            print(f"{n}: started on GPU {gpu}", file=sys.stderr, flush=True)
        time.sleep(1.0)
        for n, p in list(running.items()):
            if p.poll() is None:
                continue
            p.log.close()  # type: ignore[attr-defined]
            del running[n]
            del on_gpu[n]
            f = args.run_root / _dir_name(n) / "summary.json"
            if p.returncode == 0 and f.exists():
                results[n] = json.loads(f.read_text())
            else:
                tail = (args.run_root / _dir_name(n) / "stderr.log").read_text()[-400:].strip().splitlines()
                results[n] = {"error": f"exit {p.returncode}: {tail[-1] if tail else ''}"}
            print(f"{n}: done ({'ok' if 'error' not in results[n] else results[n]['error']})",
                  file=sys.stderr, flush=True)
    return results


def run_grouped(names: list[str], args: argparse.Namespace, extra: list[str]) -> dict[str, dict | None]:
    """``--in-process``: one process per GPU that trains its share of the variants in turn (dealt round-robin
    in the order given), so imports, the CUDA context and loaded kernels are paid once per GPU."""
    gpus = [g for g in args.gpus.split(",") if g] if args.gpus else [None]
    groups = [names[i::len(gpus)] for i in range(len(gpus))]
    procs = []
    for gpu, group in zip(gpus, groups):
        if group:
            procs.append((group, _spawn(",".join(group), args.run_root / f"gpu{gpu}", gpu, args, extra)))
            print(f"GPU {gpu}: {', '.join(group)}", file=sys.stderr, flush=True)
    t_end = time.monotonic() + args.deadline if args.deadline else math.inf
    while any(p.poll() is None for _, p in procs) and time.monotonic() < t_end:
        time.sleep(1.0)
    results: dict[str, dict | None] = {}
    for group, p in procs:
        killed = p.poll() is None
        if killed:
            p.kill()
        p.wait()
        p.log.close()  # type: ignore[attr-defined]
        for n in group:
            f = args.run_root / _dir_name(n) / "summary.json"
            if f.exists():
                results[n] = json.loads(f.read_text())
            else:
                step = _last_step(args.run_root / _dir_name(n))
                why = f"stopped at the {args.deadline:.0f} s deadline" if killed else f"exit {p.returncode}"
                results[n] = {"error": why + (f" after step {step}" if step is not None else "")}
    return {n: results.get(n) for n in names}


def _parse_after(spec: str) -> tuple[str, Path]:
    gpu, sep, path = spec.partition(":")
    if not sep or not gpu or not path:
        raise QualityError(f"fp8_quality: --gpu-after takes GPU:FILE (e.g. 1:/tmp/bench.done), got {spec!r}")
    return gpu, Path(path)


def main(argv: list[str]) -> int:
    if "--" in argv:  # everything after -- goes to the run config as overrides
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    else:
        extra = []
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="tiny CPU mode (emulated recipes, demo schema)")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: 200 GPU, 6 CPU)")
    ap.add_argument("--variants", default=None, help="comma-separated names (default: all; CPU: a subset)")
    ap.add_argument("--parallel", type=int, default=1, help="GPU: processes at a time")
    ap.add_argument("--gpus", default="", help="GPU: comma-separated CUDA device ids to spread runs over")
    ap.add_argument("--in-process", action="store_true",
                    help="GPU: one process per GPU trains its share of the variants in turn (no --parallel)")
    ap.add_argument("--gpu-after", action="append", default=[], metavar="GPU:FILE",
                    help="GPU: start runs on GPU only once FILE exists (a benchmark uses it first); repeatable")
    ap.add_argument("--run-root", type=Path, default=None)
    ap.add_argument("--data-dir", type=Path, default=None, help="train/ and eval/ synthetic splits (written if absent)")
    ap.add_argument("--seeds", default=None,
                    help="comma-separated train.seed values: every variant once per seed (default: the config's)")
    ap.add_argument("--json", type=Path, default=None, help="write the summaries here")
    ap.add_argument("--deadline", type=float, default=None,
                    help="GPU: seconds after which unfinished runs are stopped (the table shows them as failed)")
    ap.add_argument("--pool", type=Path, nargs="+", default=None, metavar="JSON",
                    help="train nothing: the seed tables over the runs of these --json files (benchmarks/quality/)")
    ap.add_argument("--mps", action="store_true",
                    help="GPU: run the processes under CUDA's Multi-Process Service (their kernels share the GPU "
                         "at once instead of in time slices); starts and stops the daemon")
    ap.add_argument("--no-bf16", action="store_true",
                    help="GPU: train only the named variants; --pool pairs them with the bf16 runs of the same "
                         "seeds in the other files (kept runs of the same command), in rows of their own: pairs across "
                         "calls carry a shift of their own, so the target is read on pairs trained side by side")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child process: run one variant
    args = ap.parse_args(argv)
    if args.pool:
        print("\n".join(pooled_tables(args.pool)))
        sets = [json.loads(f.read_text()) for f in args.pool]
        print_sampling(sets)
        print_saturation(sets)
        return 0
    args.steps = args.steps or (6 if args.cpu else 200)
    tmp = None
    if args.run_root is None:
        tmp = tempfile.mkdtemp(prefix="fp8_quality-")
        args.run_root = Path(tmp)
    if args.cpu and args.data_dir is None:
        args.data_dir = args.run_root / "data"

    if args.one is not None:  # one variant, or (--in-process) several in turn; each writes its summary.json
        for name in args.one.split(","):
            run_dir = args.run_root / _dir_name(name)
            run_dir.mkdir(parents=True, exist_ok=True)
            try:
                run_one(name, run_dir, args.steps, args.data_dir, args.cpu, extra)
            except Exception as e:  # the next variant still runs; the table shows this one as failed
                (run_dir / "summary.json").write_text(json.dumps({"error": f"{type(e).__name__}: {e}"[:300]}))
                print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 0

    if args.mps and (args.cpu or args.in_process):
        raise QualityError("fp8_quality: --mps is for GPU runs in one process each (not with --cpu or --in-process)")
    names = args.variants.split(",") if args.variants else list(CPU_VARIANTS if args.cpu else VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise QualityError(f"fp8_quality: unknown variants {unknown}; known: {list(VARIANTS)}")
    if "bf16" not in names and not args.no_bf16:
        names.insert(0, "bf16")
    if args.seeds:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
        names = [with_seed(n, sd) for sd in seeds for n in names]
    t0 = time.perf_counter()
    write_data(args.steps, args.data_dir, args.cpu, extra)
    if args.cpu and args.parallel <= 1:
        import torch

        threads = torch.get_num_threads()
        results: dict[str, dict | None] = {}
        try:
            for n in names:
                results[n] = run_one(n, args.run_root / _dir_name(n), args.steps, args.data_dir, True, extra)
        finally:
            torch.set_num_threads(threads)  # the CPU config pins one thread for the run
    elif args.in_process:
        results = run_grouped(names, args, extra)
    else:  # one process per variant (with --cpu and --parallel > 1: the same path on CPU)
        with mps_daemon(args.run_root) if args.mps else contextlib.nullcontext({}) as mps_vars:
            results = run_parallel(names, args, extra, mps_vars)
    where = "CPU (emulated recipes, demo schema, tiny model)" if args.cpu else "configs/gem_medium.yaml"
    print(f"\n## FP8 quality: {where}, {args.steps} steps, same seed and data; "
          f"wall {time.perf_counter() - t0:.0f} s")
    print("\n".join(table(results)))
    print_saturation([results])
    if args.seeds:
        for metric, label in METRICS.items():
            print(f"\n## {label}, paired over seeds {args.seeds} (each run against the bf16 run of its seed)")
            print("\n".join(seed_table(results, metric=metric)))
    if attach_sampling(results, lambda n: args.run_root / _dir_name(n)):
        print_sampling([results])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, allow_nan=True) + "\n")
    return 0


def print_sampling(result_sets: list[dict]) -> None:
    rows = sampling_table(result_sets)
    if rows:
        print("\n## Held-out rows' share of the pairs' NE spread (runs trained with --eval.save_predictions=true; "
              "standard error over the rows, quality_sampling.py)")
        print("\n".join(rows))


def saturation_table(result_sets: list[dict]) -> list[str]:
    """Per variant, the delayed-scaling casts its runs found saturated at their log lines (summary.json's
    `fp8_saturation`, train/fp8_saturation.py): whether the FP8 runs' scales kept up with their values."""
    by_variant: dict[str, list[dict]] = {}
    for results in result_sets:
        for name, s in results.items():
            if s and s.get("fp8_saturation"):
                by_variant.setdefault(split_seed(name)[0], []).append(s["fp8_saturation"])
    rows = ["| variant | runs | casts saturated | x (forward) | dY (backward) | max amax / range |",
            "|---|---|---|---|---|---|"]

    def share(sats: list[dict], ring: str = "") -> str:  # ring "": all casts; "x" / "dy": one ring's casts
        kept = [x for x in sats if not ring or f"checked_{ring}" in x]  # older runs kept totals only
        if not kept:
            return "not kept"
        checked, saturated = (sum(x[f"{k}_{ring}" if ring else f"{k}_casts"] for x in kept)
                              for k in ("checked", "saturated"))
        text = f"{saturated} of {checked} ({saturated / checked:.2%})" if checked else "none checked"
        return text if len(kept) == len(sats) else f"{text}; {len(kept)} of {len(sats)} runs"

    for v, sats in by_variant.items():
        rows.append(f"| {v} | {len(sats)} | {share(sats)} | "
                    f"{share(sats, 'x')} | {share(sats, 'dy')} | {max(x['max_amax_over_range'] for x in sats):.3g} |")
    return rows if by_variant else []


def print_saturation(result_sets: list[dict]) -> None:
    rows = saturation_table(result_sets)
    if rows:
        print("\n## Delayed scaling: casts saturated (the newest step of every amax ring, checked at each log line)")
        print("\n".join(rows))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
