"""End-to-end train-step benchmark: jagged (ours) vs the padded baseline, full vs block attention.

One run builds the `gem_medium` model (or the demo one with `--tiny`), streams synthetic Parquet
through the real loader and the device prefetcher, and for each variant reports examples/s,
history events/s, the step-time breakdown (data wait, H2D, forward, backward, optimizer), peak
memory and local / end-to-end MFU with the scaling ratio. Useful FLOPs count real tokens only and
are the same for every variant of one attention kind (the jagged model's FLOPs), so the padded
baseline's wasted work does not count as useful.

    python benchmarks/train_step.py                      # on a GPU: gem_medium, bf16
    python benchmarks/train_step.py --tiny --steps 3     # on CPU: the demo schema, seconds

Two timed passes per variant: a throughput pass (no synchronisation inside the loop, so copies
and compute overlap as in training) and a breakdown pass (CUDA events between phases).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from features import load_schema  # noqa: E402
from ingest.loader import Loader, LoaderConfig  # noqa: E402
from model import build_model  # noqa: E402
from model.losses import multitask_loss  # noqa: E402
from train.config import run_config_from_dict  # noqa: E402
from train.data import DevicePrefetcher, real_events  # noqa: E402
from train.mfu import capture_block_inputs, count_flops, measure_local, mfu_report  # noqa: E402
from train.trainer import build_optimizer  # noqa: E402

GEM_MEDIUM_MODEL = {
    "d_model": 1024, "num_heads": 8,
    "sequence_encoder": {"num_layers": 4, "attention": "full", "causal": True, "mlp_ratio": 4},
    "interaction": {"kind": "dcn", "num_layers": 2},
    "top_dim": 1024, "head_hidden": 256,
}
TINY_MODEL = {"d_model": 32, "num_heads": 2, "sequence_encoder": {"num_layers": 2}, "top_dim": 64,
              "head_hidden": 16}

VARIANTS = {
    "jagged-full": {"attention_impl": "jagged"},
    "padded-full": {"attention_impl": "padded"},
    "jagged-block64": {"attention_impl": "jagged", "sequence_encoder": {"attention": "block", "block_size": 64}},
    "padded-block64": {"attention_impl": "padded", "sequence_encoder": {"attention": "block", "block_size": 64}},
}


def merged(base: dict, extra: dict) -> dict:
    out = json.loads(json.dumps(base))
    for k, v in extra.items():
        out[k] = merged(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseTimer:
    """Seconds per phase: CUDA events on GPU (read after the step), a host clock on CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.marks: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if self.device.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((name, ev))
        else:
            self.marks.append((name, time.perf_counter()))

    def phases(self) -> dict[str, float]:
        sync(self.device)
        out = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = a.elapsed_time(b) / 1e3 if self.device.type == "cuda" else b - a
        self.marks.clear()
        return out


def timed_blocks(model: torch.nn.Module, prefix: str = "") -> dict[str, torch.nn.Module]:
    """The dense blocks timed alone for local MFU: top-level modules, with containers
    (ModuleDict/ModuleList) and layer stacks (a `layers` ModuleList) opened one level; embeddings excluded."""
    out: dict[str, torch.nn.Module] = {}
    for name, mod in model.named_children():
        full = f"{prefix}{name}"
        if name == "embeddings" or not any(p.requires_grad for p in mod.parameters()):
            continue
        if isinstance(mod, torch.nn.ModuleDict | torch.nn.ModuleList):
            out.update(timed_blocks(mod, prefix=f"{full}."))
        elif isinstance(getattr(mod, "layers", None), torch.nn.ModuleList):
            out.update({f"{full}.layers.{i}": layer for i, layer in enumerate(mod.layers)})
        else:
            out[full] = mod
    return out


def loss_of(model, batch, autocast_dtype):
    with torch.autocast(batch.dense.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        out = model(batch)
    loss, _ = multitask_loss(out.logits.float(), batch.labels, batch.label_mask, batch.weights)
    return loss + out.aux_loss.float() if out.aux_loss is not None else loss


def run_variant(name: str, schema, model_dict: dict, url: str, args, device: torch.device,
                useful_per_event: dict[str, float]) -> dict:
    torch.manual_seed(0)
    cfg = run_config_from_dict({"schema": str(args.schema), "data": {"train_url": url}, "model": model_dict,
                                "optim": {"lr": 1e-4}})
    model = build_model(schema, cfg.model, device=device)
    optimizer, *_ = build_optimizer(model, cfg)
    autocast = torch.bfloat16 if device.type == "cuda" else None
    loader = Loader(schema, LoaderConfig(url=url, batch_size=args.batch_size, shuffle=True, epochs=None,
                                         num_threads=args.threads, prefetch=4, pin_memory=device.type == "cuda"))
    pf = DevicePrefetcher(loader, device, want_state=lambda i: False)

    def step(batch, timer: PhaseTimer | None = None):
        loss = loss_of(model, batch, autocast)
        if timer:
            timer.mark("forward")
        loss.backward()
        if timer:
            timer.mark("backward")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if timer:
            timer.mark("optimizer")
        return loss

    # warm-up (kernels compile, autotune, allocator settles)
    for _ in range(args.warmup):
        batch, _ = pf.next()
        pf.preload()
        step(batch)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    # throughput pass: no synchronisation inside the loop
    examples = events = 0
    wait = 0.0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        tw = time.perf_counter()
        batch, _ = pf.next()
        wait += time.perf_counter() - tw
        step(batch)
        pf.preload()  # the next batch's copy overlaps this step's compute
        examples += batch.batch_size
        events += real_events(batch)
    sync(device)
    wall = time.perf_counter() - t0
    peak_gib = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")

    # breakdown pass: data wait (host), H2D (the copy stream's work, timed alone), forward, backward, optimizer
    phases: dict[str, float] = {}
    timer = PhaseTimer(device)
    for _ in range(max(1, args.steps // 2)):
        sync(device)
        tw = time.perf_counter()
        cpu_batch = next(pf.it)
        phases["data_wait"] = phases.get("data_wait", 0.0) + time.perf_counter() - tw
        timer.mark("start")
        batch = cpu_batch.to(device, non_blocking=True)
        timer.mark("h2d")
        step(batch, timer)
        for k, v in timer.phases().items():
            phases[k] = phases.get(k, 0.0) + v
    n_breakdown = max(1, args.steps // 2)
    phases = {k: v / n_breakdown for k, v in phases.items()}

    # useful FLOPs of one step (forward + backward) and local MFU per top-level block
    flops, _ = count_flops(lambda: loss_of(model, batch, autocast).backward())
    optimizer.zero_grad(set_to_none=True)
    blocks = timed_blocks(model)
    inputs = capture_block_inputs(model, blocks, lambda: loss_of(model, batch, autocast))
    layers = measure_local(blocks, inputs, device, warmup=1, repeat=3, autocast_dtype=autocast)
    model.zero_grad(set_to_none=True)
    step_s = wall / args.steps
    # FLOPs were counted on the last batch; scale to the average step by real events. The padded
    # baseline is credited with the jagged model's (useful) FLOPs of the same attention kind.
    kind = name.split("-", 1)[1]
    if name.startswith("jagged") or kind not in useful_per_event:
        useful_per_event[kind] = flops / max(1, real_events(batch))
    per_event = useful_per_event[kind]
    report = mfu_report(int(per_event * events / args.steps), step_s, layers, device=device,
                        peak_override_tflops=args.peak_tflops)
    return {
        "variant": name, "examples_per_s": examples / wall, "events_per_s": events / wall,
        "step_ms": step_s * 1e3, "data_wait_frac": wait / wall, "peak_mem_gib": peak_gib,
        "phases_ms": {k: v * 1e3 for k, v in phases.items()}, "mfu": report.to_dict(),
        "executed_gflops": flops / 1e9,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="demo schema, small model (CPU smoke run)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rows", type=int, default=0, help="synthetic rows to write (default: enough for the run)")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--peak-tflops", type=float, default=None, help="override the device's bf16 peak")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = p.parse_args(argv)
    args.schema = REPO / "schemas" / ("demo.yaml" if args.tiny else "gem_medium.yaml")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    schema = load_schema(args.schema)
    base = TINY_MODEL if args.tiny else GEM_MEDIUM_MODEL

    from ingest.synth import write_synthetic

    rows = args.rows or args.batch_size * 64
    with tempfile.TemporaryDirectory() as tmp:
        url = os.path.join(tmp, "data")
        t0 = time.perf_counter()
        write_synthetic(schema, url, rows, seed=0, files=4)
        print(f"# {rows} synthetic {schema.name} rows written in {time.perf_counter() - t0:.1f} s", flush=True)
        results = []
        useful: dict[str, float] = {}
        for name in sorted(args.variants.split(","), key=lambda n: not n.startswith("jagged")):
            results.append(run_variant(name, schema, merged(base, VARIANTS[name]), url, args, device, useful))
            gc.collect()  # free this variant's model and optimizer before the next one
            if device.type == "cuda":
                torch.cuda.empty_cache()
            print(f"# {name}: " + json.dumps(results[-1]), flush=True)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"\n## train step: {schema.name}, batch {args.batch_size}, {args.steps} steps, {dev_name}, "
          f"{'bf16' if device.type == 'cuda' else 'fp32'}")
    hdr = ("variant", "ex/s", "events/s", "step ms", "wait%", "h2d", "fwd", "bwd", "opt", "peak GiB",
           "e2e MFU", "local MFU", "scaling")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    base_ex = {}
    for r in results:
        ph, m = r["phases_ms"], r["mfu"]

        def pct(x):
            return f"{100 * x:.1f}%" if x is not None else "n/a"

        print(f"| {r['variant']} | {r['examples_per_s']:.1f} | {r['events_per_s']:.3g} | {r['step_ms']:.2f} | "
              f"{100 * r['data_wait_frac']:.1f} | {ph.get('h2d', 0):.2f} | {ph.get('forward', 0):.2f} | "
              f"{ph.get('backward', 0):.2f} | {ph.get('optimizer', 0):.2f} | {r['peak_mem_gib']:.1f} | "
              f"{pct(m['end_to_end_mfu'])} | {pct(m['local_mfu'])} | "
              + (f"{m['scaling_ratio']:.2f}" if m["scaling_ratio"] is not None else "n/a") + " |")
        base_ex[r["variant"]] = r["examples_per_s"]
    for kind in ("full", "block64"):
        j, pd = base_ex.get(f"jagged-{kind}"), base_ex.get(f"padded-{kind}")
        if j and pd:
            print(f"jagged / padded examples/s ({kind}): {j / pd:.2f}x")
    if base_ex.get("jagged-full") and base_ex.get("jagged-block64"):
        print(f"block64 / full examples/s (jagged): {base_ex['jagged-block64'] / base_ex['jagged-full']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
