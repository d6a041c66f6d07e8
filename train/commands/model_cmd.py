"""`gemtrain model summary CONFIG`: parameters per part (sparse vs dense) and forward FLOPs per example."""

from __future__ import annotations

import argparse

from train.cli import Command


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a run config (YAML) with `schema:` and `model:` sections")
    p.add_argument("--rows", type=int, default=256,
                   help="synthetic rows whose history lengths give the 'sample' FLOPs column (default 256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic sample (default 0)")


def _load(path: str, overrides: list[str]):
    """(schema, ModelConfig, run name) from a run config, through the trainer's config loader."""
    from features import load_schema
    from train.config import load_run_config

    cfg = load_run_config(path, overrides)
    return load_schema(cfg.schema_path()), cfg.model, cfg.name


def _fmt(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f}"


def summarize(schema, cfg, *, rows: int = 256, seed: int = 0) -> str:
    """The summary text (parameters per part, FLOPs per example on a synthetic sample and at max length)."""
    import torch

    from ingest.convert import table_to_batch
    from ingest.synth import generate_table
    from model import build_model

    model = build_model(schema, cfg, device="meta")  # shapes only: no table memory, no init time
    counts = model.parameter_counts()
    sparse = counts.pop("sparse", 0)
    dense = sum(counts.values())
    lines = [f"model '{schema.name}' schema, d_model {cfg.d_model}, {cfg.num_heads} heads, "
             f"encoder layers {[k if k == 'full' else f'{k}:{w or s}' for k, w, s in cfg.layer_attention()]}, "
             f"interaction {cfg.interaction.kind}, "
             f"MoE {'off' if not cfg.moe.num_experts else f'{cfg.moe.num_experts} experts top-{cfg.moe.top_k}'}, "
             f"attention_impl {cfg.attention_impl}, history {'on' if model.use_history else 'off'}",
             "", f"{'parameters':<28}{'count':>16}"]
    lines.append(f"{'sparse (torchrec tables)':<28}{sparse:>16,}")
    for part, n in counts.items():
        lines.append(f"{'dense: ' + part:<28}{n:>16,}")
    lines.append(f"{'dense total':<28}{dense:>16,}")
    lines.append(f"{'total':<28}{sparse + dense:>16,}")

    batch = table_to_batch(generate_table(schema, rows, seed=seed), schema)
    sample = model.flops_for_lengths(rows, {k: v.to(torch.int64) for k, v in batch.seq_offsets.items()})
    at_max = model.flops_for_lengths(1, {s.name: torch.tensor([0, s.max_length]) for s in schema.sequences})
    mean_len = {s.name: float(batch.seq_offsets[s.name][-1]) / max(rows, 1) for s in schema.sequences}
    head_sample = "sample (" + ", ".join(f"mean L {v:.0f}" for v in mean_len.values()) + ")"
    head_max = "at max L (" + ", ".join(str(s.max_length) for s in schema.sequences) + ")"
    lines += ["", "forward FLOPs per example (matmuls over real tokens; attention counts visible pairs; "
              "embeddings 0)", f"{'part':<28}{head_sample:>28}{head_max:>24}"]
    for part in sample:
        lines.append(f"{part:<28}{_fmt(sample[part] / max(rows, 1)):>28}{_fmt(at_max[part]):>24}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    from features.errors import GemtrainError

    if args.rows < 1:
        raise GemtrainError(f"--rows must be >= 1, got {args.rows}")
    schema, cfg, _ = _load(args.config, args.overrides)
    print(summarize(schema, cfg, rows=args.rows, seed=args.seed))
    return 0


COMMANDS = [Command("model", "summary", "print a model's parameters per part and FLOPs per example",
                    _add, _run, allow_unknown=True)]
