"""`gemtrain launch --nproc-per-node 2` end to end on CPU: the Trainer's distributed path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]


def test_launch_trains_sharded_and_checkpoints(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cfg = REPO / "tests" / "distributed" / "tiny_run.yaml"
    proc = subprocess.run([sys.executable, "-m", "train.cli", "launch", "--nproc-per-node", "2", str(cfg),
                           "--run-dir", str(tmp_path / "run"), "--train.steps=4", "--train.checkpoint_every=0",
                           "--distributed.timeout_s=60", "--eval.save_predictions=true"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-5000:]
    # one summary on stdout (rank 0's), the plan and the per-rank step times on stderr
    assert proc.stdout.count("run 'tiny-dist': 4 steps") == 1, proc.stdout
    assert "sharding plan:" in proc.stderr and "embeddings.ec" in proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4
    assert summary["setup_seconds"] > 0 and 0 < summary["first_step_seconds"] <= summary["train_seconds"]
    assert summary["log_seconds"] is None and summary["data_wait_seconds"] is None  # not measured apart
    assert summary["eval"]["click"]["auc"] == summary["eval"]["click"]["auc"]  # held-out metrics computed
    assert summary["eval_rows"] == 48  # every held-out row once, over both ranks
    rows = pq.read_table(tmp_path / "run" / "predictions-step4.parquet").to_pydict()  # rank 0 writes all ranks' rows
    assert sorted(i for i, w in zip(rows["row_id"], rows["click_weight"]) if w > 0) == sorted(set(rows["row_id"]))
    assert len(set(rows["row_id"])) == 48
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train] == [2, 4]
    for r in train:
        assert r["world_size"] == 2 and r["examples_per_s"] > 0
        assert 0 < r["step_s_min"] <= r["step_s_mean"] <= r["step_s_max"] and r["slowest_rank"] in (0, 1)
    ck = tmp_path / "run" / "checkpoints" / "step_00000004"
    assert (ck / "COMPLETE").is_file()
    assert json.loads((ck / "COMPLETE").read_text())["world_size"] == 2
    plan = json.loads((ck / "sharding_plan.json").read_text())
    assert set(plan) == {"embeddings.ec.item", "embeddings.ec.category", "embeddings.ebc.user",
                         "embeddings.ebc.ad", "embeddings.ebc.interest"}
