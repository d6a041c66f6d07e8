"""The GEM model's forward+backward on one device: encoder options side by side, jagged vs padded.

For each variant (attention full / block / window / mixed, softmax / silu, ``attention_impl`` jagged vs
padded) on the same synthetic batch: forward+backward time (median of CUDA-event timings after warm-up),
peak memory, forward FLOPs per example (the model's own count, real tokens only), and the ratio to the
padded baseline. Correctness first: the jagged model's logits (Triton kernels) against the same model
with the PyTorch reference attention, and against the padded model (SDPA), all in float32.

    python benchmarks/model_step.py                # gem_medium shape on CUDA, bf16 autocast
    python benchmarks/model_step.py --tiny         # a seconds-long CPU run (CI keeps it from rotting)

Every variant is a new Triton kernel key (activation, locality, bias), and the kernels autotune each
key on first use, about a minute apiece on an H200: a device run that must fit a few minutes sets
``GEMTRAIN_ATTN_AUTOTUNE=0`` (one configuration per kernel) or picks ``--variants``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def _schema(name: str, max_length: int | None, max_rows: int):
    from features import load_schema

    s = load_schema(REPO / "schemas" / f"{name}.yaml")
    tables = tuple(dataclasses.replace(t, num_embeddings=min(t.num_embeddings, max_rows)) for t in s.tables)
    seqs = tuple(dataclasses.replace(q, max_length=max_length or q.max_length) for q in s.sequences)
    return dataclasses.replace(s, tables=tables, sequences=seqs)


def main(argv: list[str] | None = None) -> str:
    from ingest.convert import table_to_batch
    from ingest.synth import generate_table
    from kernels import attention_impl
    from model import build_model, multitask_loss
    from train.mfu import time_fn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="small CPU run")
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--variants", default="", help="comma-separated subset of the variant names (default: all)")
    p.add_argument("--no-check", action="store_true", help="skip the float32 correctness comparison")
    args = p.parse_args(argv)
    t0 = time.perf_counter()

    def say(line: str) -> None:  # progress goes out as it happens (a run cut short still tells where it was)
        print(f"{line}    [{time.perf_counter() - t0:.0f}s]", flush=True)

    tiny = args.tiny
    device = torch.device("cpu" if tiny or not torch.cuda.is_available() else "cuda")
    schema = _schema("demo" if tiny else "gem_medium", 24 if tiny else None, 512 if tiny else 200_000)
    rows = args.rows or (4 if tiny else 32)
    base = ({"d_model": 16, "num_heads": 2, "top_dim": 32} if tiny else
            {"d_model": 256, "num_heads": 4, "top_dim": 512})
    enc = {"num_layers": 2, "window": 8 if tiny else 256, "block_size": 8 if tiny else 64}
    variants = {
        "full, padded (SDPA)": {"attention_impl": "padded"},
        "full": {},
        "block": {"attention": "block"},
        "window": {"attention": "window"},
        "mixed window/block": {"attention": ["window", "block"]},
        "full, silu": {"activation": "silu"},
        "full, silu, padded": {"activation": "silu", "attention_impl": "padded"},
    }
    if args.variants:
        wanted = [v.strip() for v in args.variants.split(",")]
        unknown = [v for v in wanted if v not in variants]
        if unknown:
            raise SystemExit(f"unknown variants {unknown}; known: {list(variants)}")
        variants = {k: v for k, v in variants.items() if k in wanted}
    torch.manual_seed(0)
    batch = table_to_batch(generate_table(schema, rows, seed=0), schema).to(device)
    lengths = batch.seq_offsets["history"].diff()
    lines = [f"# model_step: schema {schema.name} (tables <= {schema.tables[0].num_embeddings} rows), B={rows}, "
             f"history mean {float(lengths.float().mean()):.0f} / max {int(lengths.max())} events "
             f"(padding to batch max wastes {1 - float(lengths.sum()) / (rows * int(lengths.max())):.0%}), "
             f"d_model {base['d_model']}, heads {base['num_heads']}, 2 encoder layers, "
             f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}"]

    # Correctness (float32): Triton vs reference attention, jagged vs padded.
    def cfg(v: dict) -> dict:
        v = dict(v)
        impl = v.pop("attention_impl", "jagged")
        return {**base, "attention_impl": impl, "sequence_encoder": {**enc, **v}}

    say(lines[0])
    if not args.no_check:
        model = build_model(schema, cfg({}), device=device)
        padded = build_model(schema, cfg({"attention_impl": "padded"}), device=device)
        padded.load_state_dict(model.state_dict())
        with torch.no_grad():
            ours = model(batch).logits
            say("# check: jagged forward done")
            with attention_impl("ref"):
                ref = model(batch).logits
            say("# check: reference forward done")
            pad = padded(batch).logits
        lines.append(f"# float32 logits max |diff|: jagged (dispatch) vs reference attention "
                     f"{float((ours - ref).abs().max()):.2e}; jagged vs padded SDPA "
                     f"{float((ours - pad).abs().max()):.2e}")
        say(lines[-1])
        del model, padded

    rows_out = []
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    for name, v in variants.items():
        torch.manual_seed(0)
        m = build_model(schema, cfg(v), device=device)
        flops = m.forward_flops(batch)

        def step(m=m):
            with autocast:
                out = m(batch)
                loss, _ = multitask_loss(out.logits, batch.labels, batch.label_mask, batch.weights)
            (loss + out.aux_loss).backward()

        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            t = time_fn(step, device, warmup=0 if tiny else 2, repeat=1 if tiny else 5)
        except torch.OutOfMemoryError:
            t = float("nan")  # reported as such; the next variant still runs
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
        rows_out.append((name, t, peak, flops["total"] / rows, flops["encoder_attention_core"] / rows))
        say(f"# done: {name} {t * 1e3:.1f} ms")
        del m, step
    pad_t = rows_out[0][1] if "padded" in rows_out[0][0] else float("nan")
    lines.append("| variant | fwd+bwd ms | examples/s | vs padded | peak GiB | fwd GFLOP/example | attn-core GFLOP/example |")
    lines.append("|---|---|---|---|---|---|---|")
    for name, t, peak, f, fa in rows_out:
        lines.append(f"| {name} | {t * 1e3:.1f} | {rows / t:,.0f} | {pad_t / t:.2f}x | {peak:.2f} | {f / 1e9:.3f} | "
                     f"{fa / 1e9:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(main())
