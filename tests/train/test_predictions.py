"""`eval.save_predictions`: the held-out rows of an evaluation, one row each, as the metrics saw them."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch

from train.metrics import TaskMetrics
from train.predictions import PredictionLog, last_predictions, predictions_path
from train.trainer import Trainer


def metrics_from_file(path, tasks) -> dict:
    """The file's rows fed back through the metrics: every row weighted as it was in the evaluation."""
    t = pq.read_table(path).to_pydict()
    col = lambda name: torch.tensor(t[name], dtype=torch.float64)
    stack = lambda kind: torch.stack([col(f"{k}_{kind}") for k in tasks], dim=1)
    m = TaskMetrics(tasks)
    w = stack("weight")
    m.update(stack("prob"), stack("label"), torch.ones_like(w), w, {k: col(f"{k}_true") for k in tasks})
    return m.compute()


def test_the_last_evaluation_writes_every_held_out_row_once(tiny_cfg, tmp_path):
    tr = Trainer(tiny_cfg(train__steps=6, eval__save_predictions="true", eval__batch_size=256), tmp_path / "r",
                 quiet=True)
    s = tr.fit()
    path = last_predictions(tmp_path / "r")
    assert path == predictions_path(tmp_path / "r", 6)
    t = pq.read_table(path)
    assert s["eval_rows"] == 3000 and t.num_rows >= 3000  # a last batch filled with repeats keeps them at weight 0
    ids = t.column("row_id").to_pylist()
    counted = [i for i, w in zip(ids, t.column("click_weight").to_pylist()) if w > 0]
    assert len(set(counted)) == len(counted) == 3000
    assert {"click_prob", "click_label", "click_weight", "click_true", "conversion_prob"} <= set(t.column_names)
    again = metrics_from_file(path, tr.tasks)
    for task in tr.tasks:
        for key in ("ne", "ne_expected", "oracle_ne"):
            assert again[task][key] == pytest.approx(s["eval"][task][key], rel=1e-6), (task, key)


def test_other_held_out_data_is_named_in_its_file_and_not_read_as_the_runs_own(tmp_path):
    run = tmp_path / "r"
    other = predictions_path(run, 6, "s3://bucket/held out/day=2026-12-01/")
    assert other.name.startswith("predictions-step6-day_2026-12-01-") and other.parent == run
    assert other != predictions_path(run, 6, "s3://other-bucket/held out/day=2026-12-01")  # the whole URL counts
    log = PredictionLog(["a"])
    log.update(torch.tensor([0]), torch.tensor([[0.5]]), torch.tensor([[1.0]]), torch.ones(1, 1), torch.ones(1, 1))
    log.write(other)
    assert last_predictions(run) is None
    for step in (6, 12):
        log.write(predictions_path(run, step))
    assert last_predictions(run) == predictions_path(run, 12)


def test_without_the_switch_no_file_is_written(tiny_cfg, tmp_path):
    Trainer(tiny_cfg(train__steps=2), tmp_path / "r", quiet=True).fit()
    assert last_predictions(tmp_path / "r") is None


def test_the_log_keeps_each_batch_in_order(tmp_path):
    log = PredictionLog(["a", "b"])
    for start in (0, 3):
        ids = torch.arange(start, start + 3)
        probs = torch.rand(3, 2)
        log.update(ids, probs, torch.ones(3, 2), torch.tensor([[1.0, 0.0]] * 3), torch.full((3, 2), 2.0),
                   {"a": probs[:, 0]})
    t = pq.read_table(log.write(tmp_path / "p.parquet")).to_pydict()
    assert t["row_id"] == list(range(6))
    assert t["a_weight"] == [2.0] * 6 and t["b_weight"] == [0.0] * 6  # the mask times the weight
    assert t["a_true"] == pytest.approx(t["a_prob"]) and "b_true" not in t
    assert PredictionLog(["a"]).table().num_rows == 0
