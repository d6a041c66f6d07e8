"""Single-process training with the NaN guard on the device against a host read per step, in one process.

    python benchmarks/step_guard.py [--steps 200] [--rounds 2] [--tiny] [--profile] [--host-profile]
                                    [-- --section.key=value ...]

The trainer's guard (train/step_guard.py) clips the gradients, checks the loss and gradients and skips a
non-finite update on the device, and reads the flag a step or two later, so the host runs ahead of the GPU.
The baseline reads each step's flag on the host before the update (`Trainer.device_guard = False`, the
guard the single-process loop had before). Both arms train the same config (`configs/gem_medium.yaml` on
the GPU, the demo model with `--tiny`), seed, data and steps; each round runs both, alternating which goes
first, after an unscored warm-up run (the process's first run pays for compiles over many steps). Per run: the
steady step time ((train s - first step s) / (steps - 1)), examples/s over those steps and wall time; then the
ratio host / device per round and the median. On CUDA a last short run under `torch.cuda.set_sync_debug_mode("warn")`
counts the host syncs left in the loop, by the line that made them (set-up and the first step's included).
`--profile`: the kernels launched per step and their time against the steady step time, which says whether the GPU
or the host sets the pace, and the costliest kernels (aten ops on CPU) per step. `--host-profile`: the host's own
time per step by Python function (cProfile), where a host-paced step spends it. Both take the difference of a short
and a long run over the extra steps, after an unscored run.
"""

from __future__ import annotations

import argparse
import collections
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

COMMON = ["--logging.progress=false", "--logging.tensorboard=false", "--logging.report=false",
          "--checkpoint.at_end=false", "--eval.at_end=false", "--train.checkpoint_every=0", "--data.epochs=1"]
TINY = ["--train.device=cpu", "--train.batch_size=64", "--model.d_model=16", "--model.num_heads=2",
        "--model.sequence_encoder.num_layers=1", "--model.top_dim=32", "--model.head_hidden=16"]


def overrides(args: argparse.Namespace, data: Path) -> list[str]:
    return COMMON + (TINY if args.tiny else []) + [
        f"--train.steps={args.steps}", f"--data.train_url={data / 'train'}", f"--data.eval_url={data / 'eval'}",
        "--data.synth.eval_rows=64"] + list(args.extra)


def run_arm(config: Path, over: list[str], device_guard: bool, run_dir: Path) -> dict:
    import torch

    from train.config import load_run_config
    from train.trainer import Trainer

    cfg = load_run_config(config, over)
    if not any(o.startswith("--data.synth.train_rows=") for o in over):  # one pass: every step a new batch
        cfg.data.synth.train_rows = cfg.train.batch_size * cfg.train.steps
    tr = Trainer(cfg, run_dir, quiet=True)
    tr.device_guard = device_guard
    s = tr.fit()
    guard = "device" if tr._guard.device_guard else "host"
    del tr  # the next arm builds its own model: free this one's tables and optimizer state first
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    steady = (s["train_seconds"] - s["first_step_seconds"]) / max(1, s["steps"] - 1)
    return {"guard": guard, "steps": s["steps"], "step_ms": 1e3 * steady,
            "examples_per_s": cfg.train.batch_size / steady if steady > 0 else float("nan"),
            "wall_s": s["wall_seconds"]}


def same_data(config: Path, over: list[str], steps: int) -> list[str]:
    """Overrides that give a short and a long profiled run the same data set (enough rows for `steps`), so the
    difference of the two holds training steps only, not the data's generation."""
    if any(o.startswith("--data.synth.train_rows=") for o in over):
        return over
    from train.config import load_run_config

    return over + [f"--data.synth.train_rows={load_run_config(config, over).train.batch_size * steps}"]


def count_syncs(config: Path, over: list[str], run_dir: Path, steps: int) -> collections.Counter:
    """Host syncs of a short device-guard run, by the source line that made them (CUDA only)."""
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run_arm(config, over + [f"--train.steps={steps}"], True, run_dir)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught
                               if "synchroniz" in str(w.message))


Work = dict[str, tuple[float, float]]  # per kernel, aten op or function: (launches or calls, ms)


def profiled(config: Path, over: list[str], run_dir: Path, steps: int) -> Work:
    """A device-guard run of `steps` steps under torch.profiler: per GPU kernel name, its launches and summed ms,
    copies and memsets included. On CPU the same per aten op (its self CPU time), nested ops included. Ranges that
    `record_function` marks on the GPU's timeline (the optimizers' `Optimizer.step#...`) span kernels and the gaps
    between them: they are left out, or their kernels would count twice."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available() and "--train.device=cpu" not in over
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        run_arm(config, over + [f"--train.steps={steps}"], True, run_dir)
    return event_work(prof.events(), cuda)


def event_work(events, cuda: bool) -> Work:
    """Per name, the count and summed ms of the profiler events `profiled` counts (its docstring says which)."""
    from torch.autograd import DeviceType

    launches: collections.Counter = collections.Counter()
    ms: collections.Counter = collections.Counter()
    for e in events:
        if cuda and e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
            ms[e.name] += e.time_range.elapsed_us() / 1e3
        elif not cuda and e.device_type == DeviceType.CPU and e.name.startswith("aten::"):
            ms[e.name] += e.self_cpu_time_total / 1e3
        else:
            continue
        launches[e.name] += 1
    return {k: (launches[k], ms[k]) for k in launches}


def host_profiled(config: Path, over: list[str], run_dir: Path, steps: int) -> Work:
    """A device-guard run of `steps` steps under cProfile: per Python function (file:line(name)), its calls and
    its own host ms (time inside it, not in what it calls; C functions and torch ops included)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.runcall(run_arm, config, over + [f"--train.steps={steps}"], True, run_dir)
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (primitive calls, calls, own s, cumulative s, callers)
    return {f"{Path(f).name}:{line}({name})": (nc, tt * 1e3) for (f, line, name), (_, nc, tt, _, _) in stats.items()}


def per_step(measure, config: Path, over: list[str], tmp: Path, short: int, long: int) -> Work:
    """`measure` (`profiled` or `host_profiled`) per step: the difference of a long and a short run over the extra
    steps, so set-up, the first step and the end of the run cancel. Both runs train on one data set, after an
    unscored run that pays the one-off imports and caches."""
    over = same_data(config, over, long)
    tag = measure.__name__
    run_arm(config, over + [f"--train.steps={short}"], True, tmp / f"run-{tag}-warm")
    a = measure(config, over, tmp / f"run-{tag}-short", short)
    b = measure(config, over, tmp / f"run-{tag}-long", long)
    zero, n = (0, 0.0), long - short
    return {k: ((b.get(k, zero)[0] - a.get(k, zero)[0]) / n, (b.get(k, zero)[1] - a.get(k, zero)[1]) / n)
            for k in set(a) | set(b)}


def costliest_table(work: Work, rows: int, what: str, counted: str) -> list[str]:
    """The costliest kernels (or host functions) per step, by time: where the step's time goes."""
    total = sum(ms for _, ms in work.values()) or 1.0
    out = [f"| {what} | {counted} per step | ms per step | share |", "|---|---|---|---|"]
    for name, (count, ms) in sorted(work.items(), key=lambda kv: -kv[1][1])[:rows]:
        short_name = name if len(name) <= 90 else name[:87] + "..."
        out.append(f"| `{short_name}` | {count:.1f} | {ms:.3f} | {ms / total:.1%} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="the demo schema and a tiny model on CPU")
    ap.add_argument("--profile", action="store_true",
                    help="also the kernels and kernel time per step (torch.profiler) against the steady step time")
    ap.add_argument("--host-profile", action="store_true",
                    help="also the host's time per step by Python function (cProfile), the costliest first")
    ap.add_argument("--no-warmup", action="store_true", help="skip the unscored device-guard run before the rounds")
    ap.add_argument("extra", nargs="*", help="config overrides after --")
    args = ap.parse_args(argv)
    config = REPO / "configs" / ("demo.yaml" if args.tiny else "gem_medium.yaml")
    import torch

    card = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.tiny else "cpu"
    print(f"## NaN guard on the device vs a host read per step: {config.name}, {args.steps} steps, {card}, "
          f"torch {torch.__version__}")
    print("| round | arm | guard | steps | step ms | examples/s | wall s |")
    print("|---|---|---|---|---|---|---|")
    ratios, device_ms = [], []
    with tempfile.TemporaryDirectory() as tmp:
        over = overrides(args, Path(tmp) / "data")
        if not args.no_warmup:  # the process's first run compiles and caches for many steps: keep it out of the ratio
            t0 = time.perf_counter()
            x = run_arm(config, over, True, Path(tmp) / "run-warmup")
            print(f"| warm-up | device | {x['guard']} | {x['steps']} | {x['step_ms']:.2f} | "
                  f"{x['examples_per_s']:,.0f} | {time.perf_counter() - t0:.1f} |", flush=True)
        for r in range(args.rounds):
            arms = [("device", True), ("host", False)]
            res = {}
            for name, guard in (arms if r % 2 == 0 else arms[::-1]):
                t0 = time.perf_counter()
                res[name] = run_arm(config, over, guard, Path(tmp) / f"run-{r}-{name}")
                x = res[name]
                print(f"| {r + 1} | {name} | {x['guard']} | {x['steps']} | {x['step_ms']:.2f} | "
                      f"{x['examples_per_s']:,.0f} | {time.perf_counter() - t0:.1f} |", flush=True)
            ratios.append(res["host"]["step_ms"] / res["device"]["step_ms"])
            device_ms.append(res["device"]["step_ms"])
        short, long = 5, 5 + min(args.steps, 30)  # the profiles' two runs
        if args.profile:
            work = per_step(profiled, config, over, Path(tmp), short, long)
            n, ms = sum(c for c, _ in work.values()), sum(m for _, m in work.values())
            step_ms = statistics.median(device_ms)
            if card == "cpu":
                print(f"per step ({long} - {short} steps profiled, device guard): {n:.0f} aten ops (nested ones "
                      f"included), {ms:.2f} ms of their own CPU time against {step_ms:.2f} ms per step")
            else:
                busy = ms / step_ms
                print(f"per step ({long} - {short} steps profiled, device guard): {n:.0f} GPU kernels, {ms:.2f} ms "
                      f"of kernel time against {step_ms:.2f} ms per step: the GPU busy {busy:.0%}"
                      + (" (the host sets the pace)" if busy < 0.8 else ""))
            print("\n".join(costliest_table(work, 15, "kernel (aten op on CPU)", "launches")), flush=True)
        if args.host_profile:
            host = per_step(host_profiled, config, over, Path(tmp), short, long)
            print(f"host time per step by function ({long} - {short} steps under cProfile, device guard; its own "
                  f"time, not its callees'): {sum(ms for _, ms in host.values()):.2f} ms in all")
            print("\n".join(costliest_table(host, 20, "function", "calls")), flush=True)
        if card != "cpu":
            steps = min(args.steps, 20)
            syncs = count_syncs(config, over, Path(tmp) / "run-syncs", steps)
            print(f"host syncs in a {steps}-step device-guard run: {sum(syncs.values())}; by line: "
                  + ", ".join(f"{k} x{v}" for k, v in syncs.most_common(12)))
    print(f"host / device step time: {', '.join(f'{x:.3f}' for x in ratios)}; median {statistics.median(ratios):.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
