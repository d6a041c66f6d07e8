"""`train.run_report.compare_runs`: held-out metrics of finished runs side by side."""

from __future__ import annotations

import json

import pytest

from features.errors import GemtrainError
from train.run_report import compare_runs, main, write_comparison


def _run(tmp_path, name: str, click_ne: float, conv_ne: float | None = 0.87) -> str:
    d = tmp_path / name
    d.mkdir()
    ev = {"click": {"ne": click_ne, "ne_recalibrated": click_ne - 0.01, "oracle_ne": 0.75, "auc": 0.8,
                    "calibration": 1.0, "examples": 100.0}}
    if conv_ne is not None:
        ev["conversion"] = {"ne": conv_ne, "auc": 0.7, "calibration": 0.99, "examples": 20.0}
    (d / "summary.json").write_text(json.dumps({"name": name, "steps": 500, "eval": ev}))
    return str(d)


def test_side_by_side_ne_with_change_against_the_first_run(tmp_path, capsys):
    full = _run(tmp_path, "full", 0.80)
    block = _run(tmp_path, "block", 0.82, conv_ne=None)  # no conversion eval: only shared tasks appear
    comp = compare_runs([full, block])
    assert comp.head == ["task", "metric", "full", "block", "NE vs full: block"]
    ne = next(r for r in comp.rows if r[:2] == ["click", "ne"])
    assert ne[2:] == [0.80, 0.82, "+2.500%"]
    recal = next(r for r in comp.rows if r[:2] == ["click", "ne recalibrated"])
    assert recal[4] == "+2.532%" and recal[2] == 0.79  # against the first run's own recalibrated NE
    assert not any(r[0] == "conversion" for r in comp.rows)
    assert "| click | ne | 0.8000 | 0.8200 | +2.500% |" in comp.markdown().splitlines()
    page = write_comparison([full, block], tmp_path / "cmp.html")
    assert "<td>+2.500%</td>" in page.read_text() and "full vs block" in page.read_text()
    assert main([full, block]) == 0 and "| click | ne | 0.8000 | 0.8200 | +2.500% |" in capsys.readouterr().out


def test_unfinished_run_or_single_run_is_a_clear_error(tmp_path, capsys):
    full = _run(tmp_path, "full", 0.80)
    (tmp_path / "unfinished").mkdir()
    with pytest.raises(GemtrainError, match="summary.json"):
        compare_runs([full, str(tmp_path / "unfinished")])
    with pytest.raises(GemtrainError, match="at least two"):
        compare_runs([full])
    assert main([full, str(tmp_path / "unfinished")]) == 2 and "error:" in capsys.readouterr().err


def test_gemtrain_report_compare_command(tmp_path, capsys):
    from train.cli import main as gemtrain

    full = _run(tmp_path, "full", 0.80)
    block = _run(tmp_path, "block", 0.804)
    assert gemtrain(["report", "compare", full, block, "--out", str(tmp_path / "cmp.html")]) == 0
    out = capsys.readouterr().out
    assert "| click | ne | 0.8000 | 0.8040 | +0.500% |" in out and (tmp_path / "cmp.html").exists()
    assert gemtrain(["report", "compare", full]) == 1 and "at least two" in capsys.readouterr().err


def test_compare_names_the_software_a_run_differs_in(tmp_path):
    runs = [_run(tmp_path, n, 0.80) for n in ("a", "b", "c", "old")]
    sw = {"torch": "2.11", "revision": "abc", "device_name": "H100", "env": {"GEMTRAIN_ATTN_AUTOTUNE": "0"}}
    for d, record in zip(runs[:3], (sw, sw, {**sw, "revision": "def", "env": {}})):
        summary = json.loads((tmp_path / d / "summary.json").read_text())
        (tmp_path / d / "summary.json").write_text(json.dumps({**summary, "software": record}))
    row = next(r for r in compare_runs(runs).rows if r[1] == "software differs from a in")
    assert row[2:6] == ["", "nothing", "env GEMTRAIN_ATTN_AUTOTUNE, revision", "not recorded"]


def test_ne_change_carries_its_error_over_the_held_out_rows_where_both_runs_saved_predictions(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from train.predictions import paired_ne_difference, predictions_path, read_predictions

    rng = np.random.default_rng(0)
    true = rng.uniform(0.1, 0.5, 2000)
    label = (rng.random(2000) < true).astype(np.float32)

    def preds(d: str, noise: float, rows: np.ndarray) -> None:
        p = np.clip(true * np.exp(noise * rng.standard_normal(2000)), 0.01, 0.99)
        pq.write_table(pa.table({"row_id": rows, "click_prob": p.astype(np.float32), "click_label": label,
                                 "click_weight": np.ones(2000, np.float32)}), predictions_path(d, 500))

    runs = [_run(tmp_path, n, 0.80) for n in ("a", "b", "c", "d")]
    for d, noise in zip(runs[:2], (0.2, 0.4)):
        preds(d, noise, np.arange(2000))
    preds(runs[2], 0.4, np.arange(1, 2001))  # another held-out set
    row = next(r for r in compare_runs(runs).rows if r[:2] == ["click", "ne"])
    diff, se = paired_ne_difference(read_predictions(predictions_path(runs[0], 500)),
                                    read_predictions(predictions_path(runs[1], 500)), "click")
    assert se > 0 and row[6] == f"{diff:+.3f}% ± {se:.3f}%"
    assert row[7] == "+0.000% (the two runs scored different held-out rows)"
    assert row[8] == "+0.000%"  # no predictions saved: the change from the summaries alone
