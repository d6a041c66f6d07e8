"""The held-out rows' share of a pair's NE difference, from the runs' per-row predictions."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from benchmarks import quality_sampling as qs
from benchmarks.quality_stats import ne_of
from tests.conftest import REPO
from train.metrics import TaskMetrics
from train.predictions import PairingError, paired_ne_difference


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


def _bootstrap_se(a, b, draws: int = 400) -> float:
    """The same error drawn the slow way: resample the rows (both runs' together) and take the spread of R - 1."""
    ce = [qs_ce(r["click_prob"], r["click_label"]) for r in (a, b)]
    n = ce[0].size
    counts = np.random.default_rng(0).multinomial(n, np.full(n, 1.0 / n), size=draws).astype(np.float64)
    return 100 * float(((counts @ ce[1]) / (counts @ ce[0])).std(ddof=1))


def qs_ce(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    p = p.astype(np.float64)
    return -(y * np.log2(p) + (1 - y) * np.log2(1 - p))


def test_the_difference_is_the_metrics_ne_difference_and_its_error_the_rows_bootstrap():
    rng = np.random.default_rng(0)
    a = _run(rng, 4000, 0.3)
    b = _run(rng, 4000, 0.4, base=a)
    diff, se = paired_ne_difference(a, b, "click")
    assert diff == pytest.approx(100 * (_ne(b) / _ne(a) - 1), rel=1e-6)  # NE's normaliser cancels in a pair
    assert se == pytest.approx(_bootstrap_se(a, b), rel=0.15)
    four, four_b = ({k: np.concatenate([v] * 4) if k != "row_id" else np.arange(16000) for k, v in r.items()}
                    for r in (a, b))
    assert paired_ne_difference(four, four_b, "click")[1] == pytest.approx(se / 2, rel=0.02)  # 4x rows: half


def test_rows_pair_by_id_and_a_run_against_itself_differs_by_nothing():
    rng = np.random.default_rng(1)
    a = _run(rng, 500, 0.3)
    assert paired_ne_difference(a, a, "click") == (0.0, 0.0)
    b = _run(rng, 500, 0.5, base=a)
    shuffled = {k: v[::-1].copy() for k, v in b.items()}
    assert paired_ne_difference(a, shuffled, "click") == pytest.approx(paired_ne_difference(a, b, "click"))
    with pytest.raises(PairingError, match="different held-out rows"):
        paired_ne_difference(a, {**b, "row_id": b["row_id"] + 1}, "click")
    with pytest.raises(PairingError, match="labels or weights differ"):
        paired_ne_difference(a, {**b, "click_label": 1 - b["click_label"]}, "click")
    with pytest.raises(PairingError, match="no conversion predictions"):
        paired_ne_difference(a, b, "conversion")
    with pytest.raises(PairingError, match="fewer than two"):
        paired_ne_difference({**a, "click_weight": 0 * a["click_weight"]},
                             {**b, "click_weight": 0 * b["click_weight"]}, "click")


def test_the_table_sets_the_rows_error_against_the_pairs_spread():
    runs = {f"tensorwise seed={i}": {"sampling": {"click": {"rel_diff": d, "se": 0.1}}}
            for i, d in enumerate((0.2, -0.2, 0.0))}
    rows = qs.sampling_table([runs, {"bf16 seed=0": {}}])
    # variance 0.04 (%²), of which the rows' 0.01; at 4x the rows 0.0325: 16 and 13 pairs for ±0.1%
    assert rows[2] == "| tensorwise | click | 3 | 0.200% | 0.100% | 25% | 16, 13 |"


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
