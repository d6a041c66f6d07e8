"""How much of an FP8-vs-bf16 pair's NE difference the choice of held-out rows explains.

Two runs of one seed scored on the same held-out rows differ in NE for two reasons: the models differ (short runs
are chaotic), and a finite set of rows measures that difference with an error of its own. The second part is the
standard error of the paired difference over the rows (`train.predictions.paired_ne_difference`), computed from
the per-row predictions the runs saved (`eval.save_predictions`). Where it is a large share of the spread of the
pairs, more held-out rows narrow the pairs; where it is small, only more seeds do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

from benchmarks.quality_stats import TARGET_PCT, TASKS, mean_std, pairs_for, split_seed, with_seed
from train.predictions import last_predictions, paired_ne_difference, read_predictions

MORE_ROWS = 4  # the held-out set's growth for which the sampling table counts the pairs needed


def attach_sampling(results: dict[str, dict | None], run_dir_of: Callable[[str], Path]) -> int:
    """Adds ``sampling: {task: {rel_diff, se}}`` to each finished non-bf16 run whose bf16 run of the same seed
    finished too and both saved predictions; returns how many runs got it."""
    done = 0
    for name, summary in results.items():
        variant, seed = split_seed(name)
        base = with_seed("bf16", seed)
        if variant == "bf16" or not summary or "error" in summary or not results.get(base) \
                or "error" in results[base]:
            continue
        fa, fb = last_predictions(run_dir_of(base)), last_predictions(run_dir_of(name))
        if fa is None or fb is None:
            continue
        a, b = read_predictions(fa), read_predictions(fb)
        summary["sampling"] = {t: dict(zip(("rel_diff", "se"), paired_ne_difference(a, b, t)))
                               for t in TASKS if f"{t}_prob" in a}
        done += 1
    return done


def sampling_table(result_sets: Iterable[dict[str, dict | None]]) -> list[str]:
    """Per variant and task: the pairs' NE spread (sd of the paired differences) against the held-out rows'
    share of it (root mean square of the pairs' standard errors over the rows)."""
    by: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for results in result_sets:
        for name, summary in results.items():
            for task, r in ((summary or {}).get("sampling") or {}).items():
                by.setdefault((split_seed(name)[0], task), []).append((r["rel_diff"], r["se"]))
    if not by:
        return []
    out = ["| variant | task | pairs | sd of the pairs | held-out rows' s.e. (rms) | share of the pairs' variance | "
           f"pairs for ±{TARGET_PCT:g}%: now, at {MORE_ROWS}x the rows |", "|---|---|---|---|---|---|---|"]
    for (variant, task), rows in sorted(by.items()):
        diffs = [d for d, _ in rows]
        rms = math.sqrt(sum(se * se for _, se in rows) / len(rows))
        sd_s = share = need = ""
        if len(diffs) > 1:
            var = mean_std(diffs)[1] ** 2
            rows_var = min(var, rms * rms)
            sd_s = f"{math.sqrt(var):.3f}%"
            share = f"{rows_var / var * 100:.0f}%" if var > 0 else ""
            # the rows' part of the variance falls with the number of rows; the models' part stays
            need = f"{pairs_for(var)}, {pairs_for(var - rows_var + rows_var / MORE_ROWS)}"
        out.append(f"| {variant} | {task} | {len(rows)} | {sd_s} | {rms:.3f}% | {share} | {need} |")
    return out

