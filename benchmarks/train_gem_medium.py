"""Training throughput of `configs/gem_medium.yaml` on one GPU: loss, examples/s and events/s per log window.

    python benchmarks/train_gem_medium.py [--train.steps=300 ...]   # overrides as for `gemtrain train`

Writes synthetic data on first run (under /tmp), trains, and prints one table of the logged windows
plus the totals; the run dir (metrics.jsonl, summary.json, report.html) is runs/gem_medium-bench.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch


def main(argv: list[str]) -> int:
    from train.config import load_run_config
    from train.trainer import Trainer

    t0 = time.perf_counter()
    cfg = load_run_config(Path(__file__).resolve().parents[1] / "configs" / "gem_medium.yaml", argv)
    run_dir = Path("runs") / "gem_medium-bench"
    s = Trainer(cfg, run_dir).fit()
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"\n{cfg.name}: {gpu}, torch {torch.__version__}, batch {cfg.train.batch_size} rows, "
          f"bf16={s['bf16']}, {s['steps']} steps, wall {time.perf_counter() - t0:.0f} s (incl. data + compile)")
    print("| step | loss | click loss | train click NE | examples/s | events/s |")
    print("|---|---|---|---|---|---|")
    for r in recs:
        if r["kind"] == "train":
            print(f"| {r['step']} | {r['loss']:.4f} | {r.get('loss/click', float('nan')):.4f} | "
                  f"{r.get('ne/click', float('nan')):.4f} | {r['examples_per_s']:,.0f} | {r['events_per_s']:,.0f} |")
    ev = (s.get("eval") or {}).get("click", {})
    print(f"totals: {s['examples_per_s']:,.0f} examples/s, {s['events_per_s']:,.0f} events/s over "
          f"{s['train_seconds']:.1f} s of training; held-out click NE {ev.get('ne', float('nan')):.4f} "
          f"(oracle {ev.get('oracle_ne', float('nan')):.4f}), skipped steps {s['skipped_steps']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
