"""The held-out rows' share of a pair's NE difference: a paired bootstrap over per-row predictions."""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest
import torch

from benchmarks import quality_sampling as qs
from benchmarks.quality_stats import QualityError, ne_of
from tests.conftest import REPO
from train.metrics import TaskMetrics


def _run(rng: np.random.Generator, n: int, noise: float, base: np.ndarray | None = None) -> dict[str, np.ndarray]:
    true = rng.uniform(0.05, 0.6, n) if base is None else base["click_true"]
    label = (rng.random(n) < true).astype(np.float32) if base is None else base["click_label"]
    prob = np.clip(true * np.exp(noise * rng.standard_normal(n)), 1e-3, 0.999).astype(np.float32)
    return {"row_id": np.arange(n), "click_prob": prob, "click_label": label,
            "click_weight": np.ones(n, np.float32), "click_true": true}


def _ne(run: dict[str, np.ndarray]) -> float:
    m = TaskMetrics(["click"])
    col = lambda k: torch.tensor(run[k], dtype=torch.float64).unsqueeze(1)
    m.update(col("click_prob"), col("click_label"), torch.ones(len(run["row_id"]), 1), col("click_weight"))
    return m.compute()["click"]["ne"]


def test_the_difference_is_the_metrics_ne_difference_and_its_error_shrinks_with_the_rows():
    rng = np.random.default_rng(0)
    a = _run(rng, 4000, 0.3)
    b = _run(rng, 4000, 0.4, base=a)
    diff, se = qs.paired_ne_bootstrap(a, b, "click", draws=400)
    assert diff == pytest.approx(100 * (_ne(b) / _ne(a) - 1), rel=1e-6)  # NE's normaliser cancels in a pair
    # the delta method's standard error of a ratio of two sums over the same rows
    ce_a = qs._cross_entropy(a["click_prob"], a["click_label"], a["click_weight"])
    ce_b = qs._cross_entropy(b["click_prob"], b["click_label"], b["click_weight"])
    r = ce_b.sum() / ce_a.sum()
    delta = 100 * np.std(ce_b - r * ce_a, ddof=1) * math.sqrt(len(ce_a)) / ce_a.sum()
    assert se == pytest.approx(delta, rel=0.15)
    four = {k: np.concatenate([v] * 4) if k != "row_id" else np.arange(16000) for k, v in a.items()}
    four_b = {k: np.concatenate([v] * 4) if k != "row_id" else np.arange(16000) for k, v in b.items()}
    assert qs.paired_ne_bootstrap(four, four_b, "click", draws=400)[1] == pytest.approx(se / 2, rel=0.2)


def test_rows_pair_by_id_and_a_run_against_itself_differs_by_nothing():
    rng = np.random.default_rng(1)
    a = _run(rng, 500, 0.3)
    assert qs.paired_ne_bootstrap(a, a, "click", draws=50) == (0.0, 0.0)
    b = _run(rng, 500, 0.5, base=a)
    shuffled = {k: v[::-1].copy() for k, v in b.items()}
    assert qs.paired_ne_bootstrap(a, shuffled, "click", draws=50) == qs.paired_ne_bootstrap(a, b, "click", draws=50)
    with pytest.raises(QualityError, match="different held-out rows"):
        qs.paired_ne_bootstrap(a, {**b, "row_id": b["row_id"] + 1}, "click")
    with pytest.raises(QualityError, match="labels or weights differ"):
        qs.paired_ne_bootstrap(a, {**b, "click_label": 1 - b["click_label"]}, "click")
    with pytest.raises(QualityError, match="no held-out row"):
        qs.paired_ne_bootstrap({**a, "click_weight": 0 * a["click_weight"]},
                               {**b, "click_weight": 0 * b["click_weight"]}, "click")


def test_the_table_sets_the_rows_error_against_the_pairs_spread():
    runs = {f"tensorwise seed={i}": {"sampling": {"click": {"rel_diff": d, "se": 0.1}}}
            for i, d in enumerate((0.2, -0.2, 0.0))}
    rows = qs.sampling_table([runs, {"bf16 seed=0": {}}])
    assert rows[2] == "| tensorwise | click | 3 | 0.200% | 0.100% | 25% |"


@pytest.mark.timeout(180)
def test_fp8_quality_reports_the_rows_share_for_runs_that_saved_predictions(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("fp8_quality", REPO / "benchmarks" / "fp8_quality.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "q.json"
    assert mod.main(["--cpu", "--steps", "2", "--variants", "bf16,tensorwise", "--seeds", "0,1", "--run-root",
                     str(tmp_path / "runs"), "--json", str(out), "--", "--eval.save_predictions=true"]) == 0
    res = json.loads(out.read_text())
    for seed in (0, 1):
        run, base = res[f"tensorwise seed={seed}"], res[f"bf16 seed={seed}"]
        assert "sampling" not in base
        for task in ("click", "conversion"):
            s = run["sampling"][task]
            assert s["rel_diff"] == pytest.approx(100 * (ne_of(run, task) / ne_of(base, task) - 1), rel=1e-5)
            assert s["se"] > 0
    assert "Held-out rows' share of the pairs' NE spread" in capsys.readouterr().out
