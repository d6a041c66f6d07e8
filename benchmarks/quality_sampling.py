"""How much of an FP8-vs-bf16 pair's NE difference the choice of held-out rows explains.

Two runs of one seed scored on the same held-out rows differ in NE for two reasons: the models differ (short runs
are chaotic), and a finite set of rows measures that difference with an error of its own. The second part is the
bootstrap standard error of the paired difference over the rows (both runs' rows drawn together), computed from
the per-row predictions the runs saved (`eval.save_predictions`, train/predictions.py). Where it is a large share
of the spread of the pairs, more held-out rows narrow the pairs; where it is small, only more seeds do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from benchmarks.quality_stats import TASKS, QualityError, split_seed
from train.predictions import last_predictions

ETA = 1e-12  # as train.metrics (torchrec's clamp of the probabilities)


def _cross_entropy(p: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    p = np.clip(p.astype(np.float64), ETA, 1 - ETA)
    return -w * (y * np.log2(p) + (1 - y) * np.log2(1 - p))


def paired_ne_bootstrap(a: dict[str, np.ndarray], b: dict[str, np.ndarray], task: str, draws: int = 1000,
                        seed: int = 0) -> tuple[float, float]:
    """(NE of run b against run a in %, its bootstrap standard error in %) over the rows both scored.

    a, b: columns of two predictions files. Both runs see the same labels and weights, so NE's normaliser (the
    entropy of the rows' mean label) cancels and the relative difference is that of the cross-entropy sums.
    """
    order_a, order_b = np.argsort(a["row_id"]), np.argsort(b["row_id"])
    if not np.array_equal(a["row_id"][order_a], b["row_id"][order_b]):
        raise QualityError("paired_ne_bootstrap: the two runs scored different held-out rows")
    pick = lambda cols, order, name: cols[f"{task}_{name}"][order]
    y, w = pick(a, order_a, "label"), pick(a, order_a, "weight")
    if not (np.array_equal(y, pick(b, order_b, "label")) and np.array_equal(w, pick(b, order_b, "weight"))):
        raise QualityError(f"paired_ne_bootstrap: the two runs' {task} labels or weights differ row by row")
    keep = w > 0
    ce_a = _cross_entropy(pick(a, order_a, "prob"), y, w)[keep]
    ce_b = _cross_entropy(pick(b, order_b, "prob"), y, w)[keep]
    n = int(keep.sum())
    if n == 0:
        raise QualityError(f"paired_ne_bootstrap: no held-out row carries a {task} label")
    counts = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=draws).astype(np.float64)
    ratio = (counts @ ce_b) / (counts @ ce_a)
    return 100.0 * (ce_b.sum() / ce_a.sum() - 1.0), 100.0 * float(ratio.std(ddof=1))


def read_columns(path: Path) -> dict[str, np.ndarray]:
    table = pq.read_table(path)
    return {name: col.to_numpy() for name, col in zip(table.column_names, table.columns)}


def attach_sampling(results: dict[str, dict | None], run_dir_of: Callable[[str], Path]) -> int:
    """Adds ``sampling: {task: {rel_diff, se}}`` to each finished non-bf16 run whose bf16 run of the same seed
    finished too and both saved predictions; returns how many runs got it."""
    done = 0
    for name, summary in results.items():
        variant, seed = split_seed(name)
        base = "bf16" if seed is None else f"bf16 seed={seed}"
        if variant == "bf16" or not summary or "error" in summary or not results.get(base) \
                or "error" in results[base]:
            continue
        fa, fb = last_predictions(run_dir_of(base)), last_predictions(run_dir_of(name))
        if fa is None or fb is None:
            continue
        a, b = read_columns(fa), read_columns(fb)
        summary["sampling"] = {t: dict(zip(("rel_diff", "se"), paired_ne_bootstrap(a, b, t)))
                               for t in TASKS if f"{t}_prob" in a}
        done += 1
    return done


def sampling_table(result_sets: Iterable[dict[str, dict | None]]) -> list[str]:
    """Per variant and task: the pairs' NE spread (sd of the paired differences) against the held-out rows'
    share of it (root mean square of the pairs' bootstrap standard errors)."""
    by: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for results in result_sets:
        for name, summary in results.items():
            for task, r in ((summary or {}).get("sampling") or {}).items():
                by.setdefault((split_seed(name)[0], task), []).append((r["rel_diff"], r["se"]))
    if not by:
        return []
    out = ["| variant | task | pairs | sd of the pairs | held-out rows' s.e. (rms) | share of the pairs' variance |",
           "|---|---|---|---|---|---|"]
    for (variant, task), rows in sorted(by.items()):
        diffs = [d for d, _ in rows]
        rms = math.sqrt(sum(se * se for _, se in rows) / len(rows))
        if len(diffs) > 1:
            mean = sum(diffs) / len(diffs)
            sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))
            share = f"{min(1.0, rms * rms / (sd * sd)) * 100:.0f}%" if sd > 0 else ""
            sd_s = f"{sd:.3f}%"
        else:
            sd_s = share = ""
        out.append(f"| {variant} | {task} | {len(rows)} | {sd_s} | {rms:.3f}% | {share} |")
    return out
