"""The statistics of the FP8 quality runs (``benchmarks/fp8_quality.py``): run names with seeds, the held-out NE
of a run's summary, the paired relative differences against the bf16 run of the same seed, their tables over
seeds, the 95% interval against the issue's 0.1% target, and the pooling of kept ``--json`` files
(``benchmarks/quality/``). Plain Python: no torch, no GPU."""

from __future__ import annotations

import json
import math
from pathlib import Path

from train.provenance import differences

TASKS = ("click", "conversion")

class QualityError(RuntimeError):
    """A variant name or run that the quality comparison cannot use."""


SEED_SEP = " seed="


def with_seed(name: str, seed: int | None) -> str:
    """The run name of a variant trained with ``train.seed = seed`` (the plain name for None)."""
    return name if seed is None else f"{name}{SEED_SEP}{seed}"


def split_seed(run: str) -> tuple[str, int | None]:
    """(variant, seed) of a run name made by :func:`with_seed`."""
    name, sep, seed = run.rpartition(SEED_SEP)
    return (name, int(seed)) if sep and seed.isdigit() else (run, None)


# Held-out NE as the issue defines it, and NE after one out-of-fold logit shift per task (train.metrics): the
# part a run's calibration offset does not explain (most of the run-to-run spread of short runs sits there).
METRICS = {"ne": "NE", "ne_recalibrated": "recalibrated NE", "ne_expected": "expected NE"}
TARGET_PCT = 0.1  # the bound on the relative NE difference, in %


def ne_of(summary: dict | None, task: str, metric: str = "ne") -> float:
    ev = (summary or {}).get("eval") or {}
    return float(ev.get(task, {}).get(metric, math.nan))


def pct_diff(run: dict | None, against: dict | None, task: str, metric: str = "ne") -> float:
    """(run's NE / the other run's NE - 1) in %; NaN where either run has no NE."""
    ne, b = ne_of(run, task, metric), ne_of(against, task, metric)
    return (ne / b - 1.0) * 100 if b and math.isfinite(b) and math.isfinite(ne) else math.nan


def rel_diff(results: dict[str, dict | None], run: str, task: str, baseline: str = "bf16",
             metric: str = "ne") -> float:
    """(run / bf16 run of the same seed - 1) in %; NaN where either run has no NE."""
    return pct_diff(results.get(run), results.get(with_seed(baseline, split_seed(run)[1])), task, metric)


# Where a run's wall time went (train.trainer's summary): column heads.
SECONDS = {"setup_seconds": "setup s", "train_seconds": "train s", "first_step_seconds": "first step s",
           "data_wait_seconds": "data wait s", "log_seconds": "log s", "eval_seconds": "eval s"}


def table(results: dict[str, dict | None], baseline: str = "bf16") -> list[str]:
    """Markdown rows: held-out NE, recalibrated and expected NE per task and their relative differences (variant /
    baseline of the same seed - 1) in %."""
    head = [f"{t} {label} | rel. diff" for label in METRICS.values() for t in TASKS]
    rows = ["| variant | " + " | ".join(head) + " | steps | wall s | " + " | ".join(SECONDS.values())
            + " | last-window ex/s | status |", "|---" * (2 * len(head) + 5 + len(SECONDS)) + "|"]
    for name, s in results.items():
        cells = [name]
        is_base = split_seed(name)[0] == baseline
        for metric in METRICS:
            for t in TASKS:
                cells += [f"{ne_of(s, t, metric):.5f}",
                          "" if is_base else f"{rel_diff(results, name, t, baseline, metric):+.3f}%"]
        ok = s is not None and "error" not in s
        last = (s or {}).get("train_last") or {}
        secs = [f"{s[k]:.1f}" if s and isinstance(s.get(k), int | float) else ""
                for k in ("wall_seconds", *SECONDS)]
        cells += [str(s.get("steps", "")) if s else "", *secs,
                  f"{last['examples_per_s']:.0f}" if "examples_per_s" in last else "",
                  "ok" if ok else f"FAILED {(s or {}).get('error', 'no summary')}"[:160]]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def mean_std(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else math.nan)


def _mean_cells(d: list[float], with_sd: bool = True) -> list[str]:
    """Table cells of relative differences in %: mean, (sd,) standard error of the mean (empty below two)."""
    m, sd = mean_std(d) if d else (math.nan, math.nan)
    return [f"{m:+.3f}%", *([f"{sd:.3f}%"] if with_sd else []), f"{sd / math.sqrt(len(d)):.3f}%" if len(d) > 1 else ""]


def seed_table(results: dict[str, dict | None], baseline: str = "bf16", metric: str = "ne") -> list[str]:
    """Per variant, over the seeds whose runs both finished: the mean paired relative NE difference, its
    standard deviation across seeds and the standard error of the mean; for the baseline the spread of its
    NE across seeds (max / min - 1), the scale of seed-to-seed noise. ``metric``: a key of METRICS."""
    rows = ["| variant | seeds | click: mean rel. diff | sd | s.e. | conversion: mean rel. diff | sd | s.e. |",
            "|---|---|---|---|---|---|---|---|"]
    variants = list(dict.fromkeys(split_seed(r)[0] for r in results))
    for v in variants:
        runs = [r for r in results if split_seed(r)[0] == v]
        if v == baseline:  # a bf16 run lent to another file's seeds (pool) is one run, counted once
            runs = list({id(results[r]): r for r in runs}.values())
            cells = [f"{v} (spread across seeds)", str(len(runs))]
            for t in TASKS:
                nes = [ne_of(results[r], t, metric) for r in runs if math.isfinite(ne_of(results[r], t, metric))]
                spread = (max(nes) / min(nes) - 1.0) * 100 if len(nes) > 1 else math.nan
                cells += [f"{spread:.3f}%", "", ""]
            rows.append("| " + " | ".join(cells) + " |")
            continue
        cells = [v, ""]
        n_ok = 0
        for t in TASKS:
            d = [x for x in (rel_diff(results, r, t, baseline, metric) for r in runs) if math.isfinite(x)]
            n_ok = max(n_ok, len(d))
            cells += _mean_cells(d)
        cells[1] = str(n_ok)
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile (two-sided intervals of a mean over few seeds), by bisection on the CDF integrated
    with Simpson's rule: no scipy in the project's dependencies."""
    log_norm = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)

    def cdf(x: float, n: int = 2000) -> float:  # x >= 0
        h = x / n
        f = [math.exp(log_norm - (dof + 1) / 2 * math.log1p((i * h) ** 2 / dof)) for i in range(n + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def pairs_for(var: float, target: float = TARGET_PCT) -> int:
    """About how many pairs give the mean a 95% interval of half-width ``target`` when one pair varies by ``var``."""
    return math.ceil(1.96 ** 2 * var / target ** 2)


def target_table(results: dict[str, dict | None], target: float = TARGET_PCT, baseline: str = "bf16",
                 metric: str = "ne") -> list[str]:
    """Per variant and task, the paired relative NE difference against the target: its 95% interval (Student's
    t over the seed pairs), whether the interval lies inside ±target (the difference is resolved as within the
    target), whether it excludes a loss of more than the target (upper end <= +target: positive is worse), and
    about how many pairs at this spread give an interval of half-width ``target``."""
    rows = [f"| variant | task | pairs | mean rel. diff | 95% interval | inside ±{target:g}% | "
            f"worse by > {target:g}% excluded | pairs for ±{target:g}% |", "|---|---|---|---|---|---|---|---|"]
    for v in dict.fromkeys(split_seed(r)[0] for r in results):
        if v == baseline:
            continue
        runs = [r for r in results if split_seed(r)[0] == v]
        for t in TASKS:
            d = [x for x in (rel_diff(results, r, t, baseline, metric) for r in runs) if math.isfinite(x)]
            if len(d) < 2:
                rows.append(f"| {v} | {t} | {len(d)} | | | | | |")
                continue
            m, sd = mean_std(d)
            half = t_quantile(0.975, len(d) - 1) * sd / math.sqrt(len(d))
            lo, hi = m - half, m + half
            need = pairs_for(sd * sd, target)
            rows.append(f"| {v} | {t} | {len(d)} | {m:+.3f}% | {lo:+.3f}% to {hi:+.3f}% | "
                        f"{'yes' if -target <= lo and hi <= target else 'no'} | {'yes' if hi <= target else 'no'} | "
                        f"{need} |")
    return rows


SETUP_KEYS = ("name", "steps", "eval_rows", "examples")  # what two runs must share to be paired across files
CROSS_CALL = " (bf16 of another call)"  # the variant suffix of runs paired with a bf16 run from another file


def _ok(summary: dict | None) -> bool:
    """A run that finished (a summary without an error)."""
    return bool(summary) and "error" not in summary


def _setup(summary: dict | None) -> tuple:
    return tuple((summary or {}).get(k) for k in SETUP_KEYS)


def pool(result_sets: list[dict[str, dict | None]],
         baseline: str = "bf16") -> tuple[dict[str, dict | None], list[tuple[int, str, int]]]:
    """Several runs' results (``--json`` files) as one, for the seed tables: each set's seeds get numbers of
    their own (seed s of set i becomes the i-th set's next free number), so every run stays paired with the
    bf16 run of its own set and seed, and the tables pool the paired differences over all sets.

    A set without a bf16 run for one of its seeds (``--no-bf16``) borrows the bf16 run of that seed from the
    first other set that has one of the same setup (config, steps, held-out rows, examples). Such pairs are
    kept apart: their runs take the variant name + CROSS_CALL, a row of their own in every table, because runs
    of one call can share a shift that pairs across calls do not cancel (28 fast-accumulation runs paired
    across calls read +0.31% click NE, the 20 paired in their own calls -0.05%: benchmarks/RESULTS.md).
    Returns the pooled runs and, per borrowing, (set, its seeds, lending set)."""
    lenders: dict[tuple[int, tuple], tuple[int, dict | None]] = {}
    for i, results in enumerate(result_sets):
        for run, summary in results.items():
            name, sd = split_seed(run)
            if name == baseline and _ok(summary):
                lenders.setdefault((sd, _setup(summary)), (i, summary))
    out: dict[str, dict | None] = {}
    notes: list[tuple[int, str, int]] = []
    base = 0
    for i, results in enumerate(result_sets):
        by_seed: dict[int, list[str]] = {}
        for run in results:
            sd = split_seed(run)[1]
            if sd is None:
                raise QualityError(f"fp8_quality: --pool needs runs with seeds (name{SEED_SEP}N), got {run!r}")
            by_seed.setdefault(sd, []).append(run)
        borrowed = []
        for k, sd in enumerate(sorted(by_seed)):
            lender = None
            if with_seed(baseline, sd) not in results:
                setups = {_setup(results[r]) for r in by_seed[sd] if _ok(results[r])}
                lender = next((lenders[(sd, st)] for st in setups
                               if (sd, st) in lenders and lenders[(sd, st)][0] != i), None)
            suffix = "" if lender is None else CROSS_CALL
            for run in by_seed[sd]:
                out[with_seed(split_seed(run)[0] + suffix, base + k)] = results[run]
            if lender is not None:
                out[with_seed(baseline, base + k)] = lender[1]
                borrowed.append((sd, lender[0]))
        for j in sorted({j for _, j in borrowed}):
            notes.append((i, ",".join(str(sd) for sd, k in borrowed if k == j), j))
        base += len(by_seed)
    return out, notes


def _compatible(a: dict | None, b: dict | None) -> bool:
    """Two runs' setups agree on every key both summaries record (a transcribed file may lack some)."""
    return all(x is None or y is None or x == y for x, y in zip(_setup(a), _setup(b)))


def across_calls(result_sets: list[dict[str, dict | None]], labels: list[str], metric: str = "ne") -> list[str]:
    """The shift between calls, measured directly: per pair of sets (calls) that both trained some variant on some
    seed, the relative NE difference of each such run (later set / earlier set - 1, in %), its mean and standard
    error over those runs, and what the runs' recorded software (train.provenance) differs in. A pair of one call
    cancels what its runs share; a pair across calls does not."""
    rows = ["| later call | earlier call | runs | click: mean rel. diff | s.e. | conversion: mean rel. diff | s.e. | "
            "software differs in |", "|---|---|---|---|---|---|---|---|"]
    for j, later in enumerate(result_sets):
        for i, earlier in enumerate(result_sets[:j]):
            runs = [r for r, s in later.items() if _ok(s) and _ok(earlier.get(r)) and _compatible(s, earlier[r])]
            if not runs:
                continue
            cells = [labels[j], labels[i], str(len(runs))]
            for t in TASKS:
                d = [pct_diff(later[r], earlier[r], t, metric) for r in runs]
                cells += _mean_cells([x for x in d if math.isfinite(x)], with_sd=False)
            cells.append("; ".join(dict.fromkeys(differences(later[r].get("software"), earlier[r].get("software"))
                                                for r in runs)))
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def between_variants(result_sets: list[dict[str, dict | None]], baseline: str = "bf16", metric: str = "ne") -> list[str]:
    """Two variants other than the baseline trained on one seed in one call, against each other: per pair of
    variants (the later-listed against the earlier), the relative NE difference (in %) over every such seed of
    every set, its mean, sd and standard error. Both runs share their call, so a shift between calls cancels,
    and the baseline's own run-to-run noise does not enter (it does enter each variant's pairs against bf16)."""
    rows = ["| variant | against | pairs | click: mean rel. diff | sd | s.e. | conversion: mean rel. diff | sd | s.e. |",
            "|---|---|---|---|---|---|---|---|---|"]
    diffs: dict[tuple[str, str], dict[str, list[float]]] = {}
    for results in result_sets:
        by_seed: dict[int | None, dict[str, dict]] = {}
        for run, summary in results.items():
            name, sd = split_seed(run)
            if name != baseline and _ok(summary):
                by_seed.setdefault(sd, {})[name] = summary
        for runs in by_seed.values():
            names = list(runs)
            for j, later in enumerate(names):
                for earlier in names[:j]:
                    d = diffs.setdefault((later, earlier), {t: [] for t in TASKS})
                    for t in TASKS:
                        x = pct_diff(runs[later], runs[earlier], t, metric)
                        if math.isfinite(x):
                            d[t].append(x)
    for (later, earlier), d in diffs.items():
        if max(len(x) for x in d.values()) < 2:
            continue
        cells = [later, earlier, str(max(len(x) for x in d.values()))]
        for t in TASKS:
            cells += _mean_cells(d[t]) if d[t] else ["", "", ""]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def call_pairs(results: dict[str, dict | None], baseline: str = "bf16",
               metric: str = "ne") -> dict[str, dict[str, list[float]]]:
    """One call's pairs: per variant and task, each seed's relative difference (in %) against the baseline run
    of the same seed in this call (runs without one are left out)."""
    out: dict[str, dict[str, list[float]]] = {}
    for run in results:
        name = split_seed(run)[0]
        if name == baseline:
            continue
        for t in TASKS:
            x = rel_diff(results, run, t, baseline, metric)
            if math.isfinite(x):
                out.setdefault(name, {k: [] for k in TASKS})[t].append(x)
    return out


def between_calls_f(groups: list[list[float]]) -> float:
    """One-way ANOVA's F: the spread of the calls' mean pair differences against the spread of pairs within a
    call (about 1 where calls share one mean; nan below two groups or without pairs to spare)."""
    groups = [g for g in groups if g]
    n, k = sum(map(len, groups)), len(groups)
    if k < 2 or n <= k:
        return math.nan
    grand = sum(map(sum, groups)) / n
    between = sum(len(g) * (sum(g) / len(g) - grand) ** 2 for g in groups) / (k - 1)
    within = sum((x - sum(g) / len(g)) ** 2 for g in groups for x in g) / (n - k)
    return between / within if within > 0 else math.inf


def permutation_p(groups: list[list[float]], shuffles: int = 2000, seed: int = 0) -> float:
    """How often the pairs dealt to the calls at random (sizes kept) spread the call means as widely as the
    calls did: the p-value of F without assuming normal pair differences."""
    import random

    groups = [g for g in groups if g]
    observed = between_calls_f(groups)
    if not math.isfinite(observed):
        return math.nan
    pooled = [x for g in groups for x in g]
    rng = random.Random(seed)
    hits = 0
    for _ in range(shuffles):
        rng.shuffle(pooled)
        dealt, at = [], 0
        for g in groups:
            dealt.append(pooled[at:at + len(g)])
            at += len(g)
        hits += between_calls_f(dealt) >= observed
    return (hits + 1) / (shuffles + 1)


def clustered_interval(groups: list[list[float]]) -> tuple[float, float, float, float]:
    """The mean over every pair with the calls as clusters: (mean, standard error, 95% interval's ends). The
    error counts each call's summed deviation once (the cluster-robust "sandwich" with the G/(G-1) factor), so
    a shift that a call's pairs share widens it, where the plain s.e. treats the pairs as independent."""
    groups = [g for g in groups if g]
    n, k = sum(map(len, groups)), len(groups)
    if k < 2:
        return math.nan, math.nan, math.nan, math.nan
    m = sum(map(sum, groups)) / n
    se = math.sqrt(k / (k - 1) * sum(sum(x - m for x in g) ** 2 for g in groups)) / n
    h = t_quantile(0.975, k - 1) * se
    return m, se, m - h, m + h


def by_call(result_sets: list[dict[str, dict | None]], labels: list[str], baseline: str = "bf16",
            metric: str = "ne", group: str = "call") -> list[str]:
    """Per variant, each call's pairs against the baseline of that call (mean and standard error), then whether
    the calls' means differ by more than their pairs' spread allows: F and its permutation p-value per task, over
    the calls with two pairs or more. A small p says pairs of one call share something that other calls' pairs do
    not; the pooled interval then understates the uncertainty, and the interval with the calls as clusters (every
    call, also those of one pair) is the one to read. Calls given one label pool into one group (``group`` names
    what the labels are: the card each call ran on, say)."""
    rows = [f"| variant | {group} | pairs | click: mean rel. diff | s.e. | conversion: mean rel. diff | s.e. |",
            "|---|---|---|---|---|---|---|"]
    per_variant: dict[str, dict[str, dict[str, list[float]]]] = {}
    for label, results in zip(labels, result_sets):
        for name, d in call_pairs(results, baseline, metric).items():
            merged = per_variant.setdefault(name, {}).setdefault(label, {t: [] for t in TASKS})
            for t in TASKS:
                merged[t] += d[t]
    tests = []
    for name, by_label in per_variant.items():
        calls = list(by_label.items())
        for label, d in calls:
            cells = [name, label, str(max(len(x) for x in d.values()))]
            for t in TASKS:
                cells += _mean_cells(d[t], with_sd=False) if d[t] else ["", ""]
            rows.append("| " + " | ".join(cells) + " |")
        parts = []
        for t in TASKS:
            groups = [d[t] for _, d in calls if len(d[t]) >= 2]
            f = between_calls_f(groups)
            m, se, lo, hi = clustered_interval([d[t] for _, d in calls])
            if math.isfinite(f):
                parts.append(f"{t} F = {f:.2f}, p = {permutation_p(groups):.3f}, with the {group}s as clusters "
                             f"{m:+.3f}% (s.e. {se:.3f}%, 95% {lo:+.3f}% to {hi:+.3f}%)")
        if parts:
            tests.append(f"- {name}, {sum(1 for _, d in calls if len(d[TASKS[0]]) >= 2)} {group}s of two pairs or "
                         "more: " + "; ".join(parts))
    return rows + ([""] + tests if tests else [])


def card_of(results: dict[str, dict | None]) -> str:
    """The GPU a call's runs recorded (run summary ``software.device_name``), or "not recorded"."""
    names = {(summary.get("software") or {}).get("device_name") for summary in results.values() if summary}
    names.discard(None)
    return ", ".join(sorted(names)) or "not recorded"


def one_setup(files: list[Path], sets: list[dict[str, dict | None]]) -> None:
    """Raises unless the files' finished non-bf16 runs share one setup (config, steps, held-out rows; keys a
    transcribed file lacks are not compared): pairs of 600-step runs and of longer runs are not one population.
    Files holding only bf16 runs (lenders) may be of any setup: ``pool`` lends only within a setup."""
    paired = [(f.name, _setup(summary)) for f, results in zip(files, sets) for run, summary in results.items()
              if split_seed(run)[0] != "bf16" and _ok(summary)]
    for i, key in enumerate(SETUP_KEYS[:3]):
        where: dict[object, list[str]] = {}
        for name, setup in paired:
            if setup[i] is not None and name not in where.setdefault(setup[i], []):
                where[setup[i]].append(name)
        if len(where) > 1:
            listed = "; ".join(f"{key}={v}: {', '.join(n)}" for v, n in where.items())
            raise QualityError(f"fp8_quality --pool: the files' runs differ in {key} ({listed}); pool each setup "
                               "on its own (for example the files named -600- apart from -1500-)")


def pooled_tables(files: list[Path]) -> list[str]:
    """The seed tables (every metric) over the paired runs of several ``--json`` files of one setup."""
    sets = [json.loads(f.read_text()) for f in files]
    one_setup(files, sets)
    results, borrowings = pool(sets)
    rows = [f"## Pooled over {len(files)} result files ({', '.join(f.name for f in files)}): "
            f"{sum(1 for s in sets for r in s if split_seed(r)[0] == 'bf16')} bf16 runs"]
    rows += [f"- {files[i].name}: seeds {seeds} paired with the bf16 runs of {files[j].name}"
             for i, seeds, j in borrowings]
    for metric, label in METRICS.items():
        rows += ["", f"### {label} (each run against the bf16 run of its file and seed)", *seed_table(results, metric=metric)]
    rows += ["", f"### NE against the target (relative difference <= {TARGET_PCT:g}%; positive: the variant's NE is "
             "higher, worse)", *target_table(results)]
    pairs = between_variants(sets)
    if len(pairs) > 2:
        rows += ["", "### Two variants of one call against each other (same seed; NE): no bf16 run, no shift between "
                 "calls", *pairs]
    calls = by_call(sets, [f.name for f in files])
    if len(calls) > 2:
        rows += ["", "### Pairs of one call, by call (NE): do the calls agree? (F: one-way ANOVA over calls; p: "
                 "2,000 random deals of the pairs to the calls)", *calls]
    cards = [card_of(results) for results in sets]
    if len(set(cards) - {"not recorded"}) > 1:
        rows += ["", "### Pairs by card (NE): do the cards agree? (each file is one call on one card; F and p as "
                 "above, over the cards)", *by_call(sets, cards, group="card")]
    shift = across_calls(sets, [f.name for f in files])
    if len(shift) > 2:
        rows += ["", "### The same run in two calls (variant and seed alike; NE): the shift between calls", *shift]
    return rows


def max_rel_diff(results: dict[str, dict | None], baseline: str = "bf16") -> dict[str, float]:
    """Largest |relative NE difference| over the tasks, per variant (NaN where a run failed)."""
    out = {}
    for name, s in results.items():
        base = results.get(with_seed(baseline, split_seed(name)[1]))
        diffs = [abs(ne_of(s, t) / ne_of(base, t) - 1.0) for t in TASKS]
        out[name] = max(diffs) if all(math.isfinite(d) for d in diffs) else math.nan
    return out
