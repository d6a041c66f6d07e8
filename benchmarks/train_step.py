"""End-to-end train-step benchmark: jagged (ours) vs the padded baseline, and the step-level options.

One run builds the `gem_medium` model (or the demo one with `--tiny`), streams synthetic Parquet
through the real loader and the device prefetcher, and for each variant reports examples/s,
history events/s, the step-time breakdown (data wait, H2D, forward, backward, optimizer), the spread
of step times, peak memory and local / end-to-end MFU with the scaling ratio (and, with `--local`,
the per-layer local MFU table). Useful FLOPs count real tokens only and are the same for every
variant of one model shape (the jagged model's FLOPs, without recompute), so the padded baseline's
wasted work and checkpointing's recompute do not count as useful.

Variants (`--variants`): `{jagged,padded}-{full,block64}` (relative position bias on, as configured),
`{jagged,padded}-full-nobias` (encoder and cross-attention biases off: the padded baseline then runs
SDPA's flash backend), `jagged-full-ckpt` / `jagged-full-ckpt-attn` (activation checkpointing of every
encoder layer / of its attention only), `jagged-full-compile` (`train.compile`: the dense blocks through
`torch.compile`, dynamic shapes), `jagged-full-tokens` (token-budget batching: the loader's batches
hold about the same number of events, so step times even out).

`--memory-curve`: peak memory and step time against history length for checkpointing off / every
encoder layer / attention only, on synthetic batches whose rows all hold exactly `L` events (the
synthetic generator's length distribution pinned to the maximum), then the longest history trainable at
the batch size with checkpointing off and on: a line fitted to the last two probes predicts the length
that fills the device, and a step at that length (10% shorter after an out-of-memory) verifies it.

    python benchmarks/train_step.py                      # on a GPU: gem_medium, bf16
    python benchmarks/train_step.py --tiny --steps 3     # on CPU: the demo schema, seconds
    python benchmarks/train_step.py --memory-curve --variants none
    python benchmarks/train_step.py --padding-waste 0.6 --variants jagged-full,jagged-full-nobias,padded-full-nobias \
        --local jagged-full --profile 3             # issue 9's targets on the standard 60%-padding lengths

`--profile N` also runs N steps of the `--profile-variants` under torch.profiler and prints how busy the GPU
was, where the host waited on it (CUDA's sync debug mode names each place), the costliest copies by shape
and the kernel table.

Two timed passes per variant: a throughput pass (no synchronisation inside the loop, so copies
and compute overlap as in training; a CUDA event per step gives the step-time spread) and a breakdown
pass (CUDA events between phases).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.step_profile import profile_steps  # noqa: E402
from features import load_schema  # noqa: E402
from ingest.loader import Loader, LoaderConfig  # noqa: E402
from model import build_model  # noqa: E402
from model.losses import multitask_loss  # noqa: E402
from train.config import run_config_from_dict  # noqa: E402
from train.data import DevicePrefetcher, real_events  # noqa: E402
from train.mfu import capture_block_inputs, count_flops, dense_blocks, measure_local, mfu_report  # noqa: E402
from train.optimizers import build_optimizer  # noqa: E402

GEM_MEDIUM_MODEL = {
    "d_model": 1024, "num_heads": 8,
    "sequence_encoder": {"num_layers": 4, "attention": "full", "causal": True, "mlp_ratio": 4},
    "interaction": {"kind": "dcn", "num_layers": 2},
    "top_dim": 1024, "head_hidden": 256,
}
TINY_MODEL = {"d_model": 32, "num_heads": 2, "sequence_encoder": {"num_layers": 2}, "top_dim": 64,
              "head_hidden": 16}

NO_BIAS = {"sequence_encoder": {"bias": {"position": False, "time": False}},
           "cross_attention": {"position_bias": False}}
BLOCK64 = {"sequence_encoder": {"attention": "block", "block_size": 64}}


@dataclasses.dataclass(frozen=True)
class Variant:
    model: dict  # overrides of the base model config
    shape: str  # variants of one shape share the useful FLOPs of its plain jagged variant
    ckpt: str = "off"  # off | layer | attn
    compile: bool = False
    token_budget: bool = False

    @property
    def plain(self) -> bool:
        """Executes exactly the useful FLOPs (no recompute) and can be counted by the FLOP counter."""
        return self.ckpt == "off" and not self.compile


VARIANTS = {
    "jagged-full": Variant({"attention_impl": "jagged"}, "full"),
    "padded-full": Variant({"attention_impl": "padded"}, "full"),
    "jagged-block64": Variant({"attention_impl": "jagged", **BLOCK64}, "block64"),
    "padded-block64": Variant({"attention_impl": "padded", **BLOCK64}, "block64"),
    "jagged-full-nobias": Variant({"attention_impl": "jagged", **NO_BIAS}, "full-nobias"),
    "padded-full-nobias": Variant({"attention_impl": "padded", **NO_BIAS}, "full-nobias"),
    "jagged-full-ckpt": Variant({"attention_impl": "jagged"}, "full", ckpt="layer"),
    "jagged-full-ckpt-attn": Variant({"attention_impl": "jagged"}, "full", ckpt="attn"),
    "jagged-full-compile": Variant({"attention_impl": "jagged"}, "full", compile=True),
    "jagged-full-tokens": Variant({"attention_impl": "jagged"}, "full", token_budget=True),
}
DEFAULT_VARIANTS = "jagged-full,padded-full,jagged-block64,padded-block64"


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


class EncoderCheckpointing:
    """Activation checkpointing of the encoder layers (`layer`) or of their attention only (`attn`),
    switchable per step (`mode`), through non-reentrant `torch.utils.checkpoint`."""

    def __init__(self, model: torch.nn.Module, mode: str = "off"):
        from torch.utils.checkpoint import checkpoint

        self.mode = mode
        for enc in getattr(model, "encoders", {}).values():
            for layer in enc.layers:
                for kind, mod in (("layer", layer), ("attn", layer.attn)):
                    def forward(*args, _fwd=mod.forward, _kind=kind, **kwargs):
                        if self.mode == _kind and torch.is_grad_enabled():
                            return checkpoint(_fwd, *args, use_reentrant=False, **kwargs)
                        return _fwd(*args, **kwargs)

                    mod.forward = forward


def loss_of(model, batch, autocast_dtype):
    with torch.autocast(batch.dense.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        out = model(batch)
    loss, _ = multitask_loss(out.logits.float(), batch.labels, batch.label_mask, batch.weights)
    return loss + out.aux_loss.float() if out.aux_loss is not None else loss


def mean_events_per_row(schema, url: str, batch_size: int, batches: int = 8) -> float:
    """Average history events per row over the first batches of the data (sets the token budget)."""
    loader = Loader(schema, LoaderConfig(url=url, batch_size=batch_size, shuffle=True, epochs=None, num_threads=0))
    rows = events = 0
    for i, batch in enumerate(loader):
        rows += batch.batch_size
        events += real_events(batch)
        if i + 1 >= batches:
            break
    return events / max(1, rows)


def sdpa_bias_check(device: torch.device, heads: int, head_dim: int) -> str:
    """Whether SDPA's memory-efficient kernel takes an additive bf16 mask that needs a gradient (the padded
    baseline's relative bias), with SDPA's own reasons when it does not (it falls back to the float32 math path)."""
    import warnings

    from torch.backends.cuda import SDPAParams, can_use_efficient_attention

    q, k, v = (torch.randn(2, heads, 64, head_dim, device=device, dtype=torch.bfloat16) for _ in range(3))
    mask = torch.zeros(1, heads, 64, 64, device=device, dtype=torch.bfloat16, requires_grad=True) * 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ok = can_use_efficient_attention(SDPAParams(q, k, v, mask, 0.0, False, False), True)
        except TypeError:  # before enable_gqa
            ok = can_use_efficient_attention(SDPAParams(q, k, v, mask, 0.0, False), True)
    reasons = "; ".join(str(w.message).split(" (Triggered")[0] for w in caught)
    return f"SDPA memory-efficient kernel with a bias that needs a gradient: {ok}" + (f" ({reasons})" if reasons else "")


def run_variant(name: str, schema, model_dict: dict, url: str, args, device: torch.device,
                useful_per_event: dict[str, float]) -> dict:
    v = VARIANTS[name]
    torch.manual_seed(0)
    cfg = run_config_from_dict({"schema": str(args.schema), "data": {"train_url": url}, "model": model_dict,
                                "optim": {"lr": 1e-4}})
    model = build_model(schema, cfg.model, device=device)
    optimizer, *_ = build_optimizer(model, cfg)
    if v.ckpt != "off":
        EncoderCheckpointing(model, v.ckpt)
    if v.compile:
        from train.compile import compile_dense_blocks

        compile_dense_blocks(model)
    autocast = torch.bfloat16 if device.type == "cuda" else None
    budget = None
    if v.token_budget:  # about the events of a fixed-size batch, rows capped at twice the batch size
        budget = int(args.batch_size * mean_events_per_row(schema, url, args.batch_size))
    loader = Loader(schema, LoaderConfig(url=url, batch_size=2 * args.batch_size if budget else args.batch_size,
                                         token_budget=budget, shuffle=True, epochs=None,
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
    t_warm = time.perf_counter()
    for _ in range(args.warmup):
        batch, _ = pf.next()
        pf.preload()
        step(batch)
    sync(device)
    warm_s = time.perf_counter() - t_warm
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    # throughput pass: no synchronisation inside the loop; one mark per step for the spread of step times
    examples = events = 0
    wait = 0.0
    marks = PhaseTimer(device)
    t0 = time.perf_counter()
    for i in range(args.steps):
        tw = time.perf_counter()
        batch, _ = pf.next()
        wait += time.perf_counter() - tw
        marks.mark(f"step{i}")
        step(batch)
        pf.preload()  # the next batch's copy overlaps this step's compute
        examples += batch.batch_size
        events += real_events(batch)
    marks.mark("end")
    sync(device)
    wall = time.perf_counter() - t0
    step_times = list(marks.phases().values())
    peak_gib = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")

    if args.profile and name in args.profile_variants.split(","):
        profile_steps(step, pf, args.profile, device)

    # breakdown pass: data wait (host), H2D (the copy stream's work, timed alone), forward, backward, optimizer
    phases: dict[str, float] = {}
    timer = PhaseTimer(device)
    n_breakdown = max(1, args.steps // 2)
    for _ in range(n_breakdown):
        sync(device)
        tw = time.perf_counter()
        cpu_batch = next(pf.it)
        phases["data_wait"] = phases.get("data_wait", 0.0) + time.perf_counter() - tw
        timer.mark("start")
        batch = cpu_batch.to(device, non_blocking=True)
        timer.mark("h2d")
        step(batch, timer)
        for k, val in timer.phases().items():
            phases[k] = phases.get(k, 0.0) + val
    phases = {k: val / n_breakdown for k, val in phases.items()}

    # useful FLOPs of one step (forward + backward): counted on the plain variants, on the last batch, and
    # scaled to the average step by real events. The padded baseline, checkpointing (recompute) and compiled
    # variants are credited with the plain jagged model's FLOPs of the same shape.
    flops = None
    if v.plain:
        flops, _ = count_flops(lambda: loss_of(model, batch, autocast).backward())
        optimizer.zero_grad(set_to_none=True)
        if name == f"jagged-{v.shape}" or v.shape not in useful_per_event:
            useful_per_event[v.shape] = flops / max(1, real_events(batch))
    elif v.shape not in useful_per_event:  # no plain run of this shape: the model's own formula (3x forward)
        useful_per_event[v.shape] = 3 * model.forward_flops(batch)["total"] / max(1, real_events(batch))
    layers = []
    if v.plain and name in args.local.split(","):
        blocks = dense_blocks(model)
        inputs = capture_block_inputs(model, blocks, lambda: loss_of(model, batch, autocast))
        layers = measure_local(blocks, inputs, device, warmup=1, repeat=3, autocast_dtype=autocast)
        del inputs
        model.zero_grad(set_to_none=True)
    step_s = wall / args.steps
    report = mfu_report(int(useful_per_event[v.shape] * events / args.steps), step_s, layers, device=device,
                        peak_override_tflops=args.peak_tflops)
    return {
        "variant": name, "examples_per_s": examples / wall, "events_per_s": events / wall,
        "step_ms": step_s * 1e3, "step_std_ms": statistics.pstdev(step_times) * 1e3,
        "data_wait_frac": wait / wall, "peak_mem_gib": peak_gib, "warmup_s": warm_s,
        "rows_per_step": examples / args.steps, "token_budget": budget,
        "phases_ms": {k: val * 1e3 for k, val in phases.items()}, "mfu": report.to_dict(),
        "mfu_table": report.table() if layers else None,
        "executed_gflops": flops / 1e9 if flops is not None else None,
    }


# ---- memory vs speed, and the longest trainable history ----------------------------------------------

def all_max_length_batch(schema, length: int, rows: int, seed: int = 0):
    """(schema cut to `length`, a batch whose histories all hold exactly `length` events): the synthetic
    generator with its lognormal lengths pinned above the maximum (every row is cut to it), no empty rows."""
    import ingest.synth as synth
    from ingest.convert import table_to_batch

    cut = dataclasses.replace(schema, sequences=tuple(dataclasses.replace(s, max_length=length)
                                                      for s in schema.sequences))
    saved = synth.length_params, synth.EMPTY_FRACTION
    synth.length_params = lambda max_length, *_a, **_k: (math.log(max_length) + 1.0, 0.0)
    synth.EMPTY_FRACTION = 0.0
    try:
        table = synth.generate_table(cut, rows, seed=seed)
    finally:
        synth.length_params, synth.EMPTY_FRACTION = saved
    return cut, table_to_batch(table, cut)


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


class CurveProbe:
    """One model (learning rate 0, so every probe sees the same weights) trained for single steps on
    all-max-length batches, with the encoder's checkpointing switched per step."""

    def __init__(self, schema, model_dict: dict, args, device: torch.device):
        torch.manual_seed(0)
        cfg = run_config_from_dict({"schema": str(args.schema), "data": {"train_url": "unused"},
                                    "model": model_dict, "optim": {"lr": 0.0, "weight_decay": 0.0,
                                                                   "sparse": {"lr": 0.0}}})
        self.schema, self.args, self.device = schema, args, device
        self.model = build_model(schema, cfg.model, device=device)
        self.optimizer, *_ = build_optimizer(self.model, cfg)
        self.ckpt = EncoderCheckpointing(self.model)
        self.autocast = torch.bfloat16 if device.type == "cuda" else None

    def step(self, length: int, mode: str, repeat: int = 1) -> dict:
        """Peak memory (GiB; NaN on CPU), median step ms, loss and dense gradient norm of a step at `length`,
        or {"oom": True}."""
        cut, cpu_batch = all_max_length_batch(self.schema, length, self.args.batch_size)
        self.model.embeddings.schema = cut  # the histories' upper bound (kernel grids) follows the probe
        self.ckpt.mode = mode
        if self.device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        times, loss, norm = [], float("nan"), float("nan")
        try:
            batch = cpu_batch.to(self.device)
            for _ in range(repeat):
                timer = PhaseTimer(self.device)
                timer.mark("start")
                lval = loss_of(self.model, batch, self.autocast)
                lval.backward()
                grads = [p.grad for p in self.model.parameters() if p.grad is not None and not p.grad.is_sparse]
                gnorm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                timer.mark("step")
                times.append(timer.phases()["step"])
                loss, norm = float(lval.detach()), float(gnorm)
            del batch, lval
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not _is_oom(e):
                raise
            self.optimizer.zero_grad(set_to_none=True)
            return {"length": length, "mode": mode, "oom": True}
        finally:
            self.model.embeddings.schema = self.schema
        peak = torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else float("nan")
        return {"length": length, "mode": mode, "oom": False, "peak_gib": peak,
                "step_ms": statistics.median(times) * 1e3, "loss": loss, "grad_norm": norm,
                "events_per_s": self.args.batch_size * length / statistics.median(times)}


def longest_trainable(probe: CurveProbe, mode: str, rows: list[dict], cap_gib: float, max_len: int) -> dict:
    """The longest all-max-length history that trains at the batch size under `cap_gib`: a line through the
    last two probes predicts it, one step verifies it (10% shorter after an out-of-memory, three tries)."""
    pts = sorted((r["length"], r["peak_gib"]) for r in rows if r["mode"] == mode and not r["oom"])
    if len(pts) < 2 or any(math.isnan(p) for _, p in pts):
        return {"mode": mode, "predicted": None, "verified": None, "note": "no peak memory on this device"}
    (l1, p1), (l2, p2) = pts[-2:]
    slope = (p2 - p1) / (l2 - l1)
    predicted = int(l2 + (cap_gib - p2) / slope) if slope > 0 else max_len
    length = min(max_len, predicted // 256 * 256)
    for _ in range(3):
        r = probe.step(length, mode)
        if not r["oom"]:
            return {"mode": mode, "predicted": predicted, "verified": length, "peak_gib": r["peak_gib"],
                    "step_ms": r["step_ms"], "capped": length == max_len}
        length = int(length * 0.9) // 256 * 256
    return {"mode": mode, "predicted": predicted, "verified": None, "note": "out of memory at every try"}


def memory_curve(schema, base: dict, args, device: torch.device) -> dict:
    probe = CurveProbe(schema, merged(base, {"attention_impl": "jagged"}), args, device)
    lengths = [int(x) for x in args.curve_lengths.split(",")]
    modes = args.curve_modes.split(",")
    probe.step(lengths[0], "off")  # warm-up: kernels compile, optimizer state is allocated
    repeat = 2 if device.type == "cuda" else 1
    rows = [probe.step(n, m, repeat=repeat) for n in lengths for m in modes]
    cap = args.curve_cap_gib
    if cap is None and device.type == "cuda":
        cap = 0.95 * torch.cuda.get_device_properties(device).total_memory / 2**30
    longest = []
    if cap is not None:
        longest = [longest_trainable(probe, m, rows, cap, args.curve_max_len) for m in ("off", "layer") if m in modes]
    del probe
    gc.collect()
    return {"rows": rows, "longest": longest, "cap_gib": cap}


def print_curve(curve: dict, batch_size: int) -> None:
    print(f"\n## memory vs speed: batch {batch_size}, every history at the length shown "
          "(encoder checkpointing off / every layer / attention only)")
    print("| length | checkpointing | peak GiB | step ms | events/s | loss | grad norm |")
    print("|---|---|---|---|---|---|---|")
    for r in curve["rows"]:
        if r["oom"]:
            print(f"| {r['length']} | {r['mode']} | out of memory | | | | |")
            continue
        print(f"| {r['length']} | {r['mode']} | {r['peak_gib']:.1f} | {r['step_ms']:.1f} | {r['events_per_s']:.3g} | "
              f"{r['loss']:.6f} | {r['grad_norm']:.6g} |")
    for x in curve["longest"]:
        if x.get("verified"):
            print(f"longest trainable history, checkpointing {x['mode']}: {x['verified']} events "
                  f"(peak {x['peak_gib']:.1f} GiB of cap {curve['cap_gib']:.0f}, step {x['step_ms']:.0f} ms; line fit "
                  f"predicted {x['predicted']}" + ("; search capped by --curve-max-len" if x["capped"] else "") + ")")
        else:
            print(f"longest trainable history, checkpointing {x['mode']}: not found ({x.get('note')})")


def print_table(results: list[dict], schema_name: str, args, device: torch.device) -> None:
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"\n## train step: {schema_name}, batch {args.batch_size}, {args.steps} steps, {dev_name}, "
          f"{'bf16' if device.type == 'cuda' else 'fp32'}")
    hdr = ("variant", "ex/s", "events/s", "step ms", "step std ms", "wait%", "h2d", "fwd", "bwd", "opt",
           "peak GiB", "e2e MFU", "local MFU", "scaling")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))

    def pct(x):
        return f"{100 * x:.1f}%" if x is not None else "n/a"

    ex = {}
    for r in results:
        ph, m = r["phases_ms"], r["mfu"]
        print(f"| {r['variant']} | {r['examples_per_s']:.1f} | {r['events_per_s']:.3g} | {r['step_ms']:.2f} | "
              f"{r['step_std_ms']:.2f} | {100 * r['data_wait_frac']:.2f} | {ph.get('h2d', 0):.2f} | "
              f"{ph.get('forward', 0):.2f} | {ph.get('backward', 0):.2f} | {ph.get('optimizer', 0):.2f} | "
              f"{r['peak_mem_gib']:.1f} | {pct(m['end_to_end_mfu'])} | {pct(m['local_mfu'])} | "
              + (f"{m['scaling_ratio']:.2f}" if m["scaling_ratio"] is not None else "n/a") + " |")
        ex[r["variant"]] = r["examples_per_s"]
    for shape in ("full", "block64", "full-nobias"):
        j, pd = ex.get(f"jagged-{shape}"), ex.get(f"padded-{shape}")
        if j and pd:
            print(f"jagged / padded examples/s ({shape}): {j / pd:.2f}x")
    base = ex.get("jagged-full")
    for other in ("jagged-block64", "jagged-full-ckpt", "jagged-full-ckpt-attn", "jagged-full-compile",
                  "jagged-full-tokens"):
        if base and ex.get(other):
            print(f"{other} / jagged-full examples/s: {ex[other] / base:.2f}x")
    for r in results:
        if r["mfu_table"]:
            print(f"\n### local MFU per block: {r['variant']} (each block alone, forward + backward)\n{r['mfu_table']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="demo schema, small model (CPU smoke run)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rows", type=int, default=0, help="synthetic rows to write (default: enough for the run)")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--padding-waste", type=float, default=None,
                   help="share of a padded box the synthetic histories leave empty (default: the generator's 0.5; "
                        "the device README's standard batches waste ~0.6)")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, 'none', of: {', '.join(VARIANTS)}")
    p.add_argument("--local", default="jagged-full,padded-full",
                   help="variants whose blocks are also timed alone (local MFU per block)")
    p.add_argument("--peak-tflops", type=float, default=None, help="override the device's bf16 peak")
    p.add_argument("--memory-curve", action="store_true", help="also the memory vs speed curve and longest history")
    p.add_argument("--curve-lengths", default="2048,4096,8192", help="history lengths of the curve")
    p.add_argument("--curve-modes", default="off,layer,attn", help="encoder checkpointing modes of the curve")
    p.add_argument("--curve-cap-gib", type=float, default=None, help="memory cap of the search (default 95%% of the GPU)")
    p.add_argument("--curve-max-len", type=int, default=65536, help="longest length the search tries")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.add_argument("--profile", type=int, default=0, help="also profile this many steps (torch.profiler)")
    p.add_argument("--profile-variants", default="jagged-full", help="variants the profile covers")
    args = p.parse_args(argv)
    args.schema = REPO / "schemas" / ("demo.yaml" if args.tiny else "gem_medium.yaml")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    schema = load_schema(args.schema)
    if args.tiny:  # small tables too: a CPU step then costs milliseconds, not the dense table gradients
        schema = dataclasses.replace(schema, tables=tuple(
            dataclasses.replace(t, num_embeddings=min(t.num_embeddings, 4096)) for t in schema.tables))
    base = TINY_MODEL if args.tiny else GEM_MEDIUM_MODEL
    names = [n for n in args.variants.split(",") if n and n != "none"]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")

    import ingest.synth as synth
    from ingest.synth import write_synthetic

    if args.padding_waste is not None:  # before the first table: the generator's plan is cached per schema
        synth.TARGET_WASTE = args.padding_waste

    results: list[dict] = []
    if names:
        rows = args.rows or args.batch_size * 64
        with tempfile.TemporaryDirectory() as tmp:
            url = os.path.join(tmp, "data")
            t0 = time.perf_counter()
            write_synthetic(schema, url, rows, seed=0, files=4)
            print(f"# {rows} synthetic {schema.name} rows written in {time.perf_counter() - t0:.1f} s", flush=True)
            useful: dict[str, float] = {}
            if device.type == "cuda" and any(n.startswith("padded") for n in names):
                print("# " + sdpa_bias_check(device, base["num_heads"], base["d_model"] // base["num_heads"]),
                      flush=True)
            # plain jagged variants first: they set the useful FLOPs of their shape
            for name in sorted(names, key=lambda n: (not n.startswith("jagged"), not VARIANTS[n].plain)):
                t0 = time.perf_counter()
                try:
                    results.append(run_variant(name, schema, merged(base, VARIANTS[name].model), url, args, device,
                                               useful))
                except (torch.OutOfMemoryError, RuntimeError) as e:
                    if not _is_oom(e):
                        raise
                    where = " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}"
                                       for f in reversed(traceback.extract_tb(e.__traceback__)[-8:]))
                    print(f"# {name}: out of memory ({str(e).splitlines()[0][:160]}) at {where}", flush=True)
                gc.collect()  # free this variant's model and optimizer before the next one
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                if results and results[-1]["variant"] == name:
                    print(f"# {name} ({time.perf_counter() - t0:.0f} s): "
                          + json.dumps({k: v for k, v in results[-1].items() if k != "mfu_table"}), flush=True)
        print_table(results, schema.name, args, device)
    curve = None
    if args.memory_curve:
        curve = memory_curve(schema, base, args, device)
        print_curve(curve, args.batch_size)
    if args.json:
        Path(args.json).write_text(json.dumps({"variants": results, "memory_curve": curve}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
