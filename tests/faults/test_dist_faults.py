"""`kill -9` of one of 2 gloo ranks (`gemtrain launch --nproc-per-node 2`, CPU) at a seeded random step;
`--resume` at 2 ranks: each rank's row-id stream and the global loss curve equal an uninterrupted run's."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.faults.test_process_faults import CONFIG, SCHEMA, _losses

ROWS, STEPS, EVERY, BATCH = 96, 10, 3, 8
SEED = 23


def _launch(run: Path, data: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    e = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [sys.executable, "-m", "train.cli", "launch", "--nproc-per-node", "2", str(CONFIG), "--run-dir", str(run),
           *extra, f"--data.train_url={data}", f"--train.steps={STEPS}", f"--train.checkpoint_every={EVERY}",
           f"--train.batch_size={BATCH}", "--distributed.timeout_s=60"]
    return subprocess.Popen(cmd, cwd=run.parent, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _finish(p: subprocess.Popen, timeout: float = 240) -> str:
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise
    return out.decode(errors="replace")


def _steps_done(run: Path, rank: int) -> int:
    path = run / f"rows.rank{rank}.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from features import load_schema
    from ingest.synth import write_synthetic

    d = tmp_path_factory.mktemp("dist-data") / "train"
    write_synthetic(load_schema(SCHEMA), str(d), ROWS, seed=6, files=2, row_group_rows=24)
    return d


@pytest.mark.timeout(600)
def test_kill9_one_of_two_ranks_then_resume(data, tmp_path):
    from train import checkpoint as ckpt
    from train.ledger import read_ledger, read_rows

    ref = tmp_path / "ref"
    out = _finish(_launch(ref, data))
    assert (ref / "summary.json").exists(), out[-4000:]
    ref_rows = [read_rows(ref, r) for r in (0, 1)]
    assert all(len(r) == STEPS for r in ref_rows)
    first_epoch = sum(ref_rows[0][:ROWS // 2 // BATCH], []) + sum(ref_rows[1][:ROWS // 2 // BATCH], [])
    assert sorted(first_epoch) == list(range(ROWS))  # the ranks split each epoch's rows exactly

    run = tmp_path / "run"
    kill_at = random.Random(SEED).randint(EVERY + 1, STEPS - 2)
    p = _launch(run, data, env={"GEMTRAIN_FAULT_STEP_DELAY_S": "0.3"})
    deadline = time.monotonic() + 240
    while _steps_done(run, 1) < kill_at:
        assert p.poll() is None, _finish(p)[-4000:]
        assert time.monotonic() < deadline, "timed out waiting for the kill step"
        time.sleep(0.01)
    victim = read_ledger(run, 1)["pid"]
    os.kill(victim, signal.SIGKILL)
    out = _finish(p)
    assert p.returncode != 0  # the launcher reports the lost rank (and stops the other)
    reached = min(_steps_done(run, 0), _steps_done(run, 1))
    latest = ckpt.latest_checkpoint(run)
    assert latest is not None and int(latest.name[len(ckpt.PREFIX):]) in {reached // EVERY * EVERY,
                                                                          reached // EVERY * EVERY - EVERY}
    for r in (0, 1):  # what each rank trained before the kill is the reference's
        got = read_rows(run, r)
        assert got == ref_rows[r][:len(got)]

    out = _finish(_launch(run, data, "--resume"))
    assert (run / "summary.json").exists(), out[-4000:]
    epoch0 = 0
    for r in (0, 1):
        assert read_rows(run, r) == ref_rows[r]  # no row lost, none repeated
        led = read_ledger(run, r)
        assert [x["resumed_at_step"] for x in led["restarts"]] == [int(latest.name[len(ckpt.PREFIX):])]
        assert all(e["rows_total"] == ROWS and e["rows_quarantined"] == 0 for e in led["epochs"])
        epoch0 += led["epochs"][0]["rows_read"]
    assert epoch0 == ROWS  # the first epoch, complete: its rows over both ranks = the rows in the data
    assert _losses(run) == _losses(ref)  # bit for bit
    assert json.loads((run / "summary.json").read_text())["steps"] == STEPS
