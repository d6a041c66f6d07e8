"""`kill -9` of `gemtrain train` mid-checkpoint and at a random step; `--resume` loses and repeats no row.

One chain of three processes shares one run dir (so the CI cost is three process start-ups):

1. a run whose checkpoint at step 8 pauses after its tensors are written and before its COMPLETE
   marker is killed there: the half-written checkpoint is ignored, the one at step 4 stays usable;
2. `--resume` (from step 4) is killed at a seeded random step;
3. `--resume` runs to the end.

The uninterrupted reference is the same config trained in this process. After every kill the steps
up to the newest complete checkpoint are the reference's; after the last resume the concatenated
row-id stream (rows.jsonl) and the per-step loss curve equal the reference's bit for bit.
"""

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

CONFIG = Path(__file__).with_name("tiny_run.yaml")
SCHEMA = Path(__file__).with_name("tiny_schema.yaml")
ROWS, STEPS, EVERY, BATCH = 160, 20, 4, 16
SEED = 11


def _overrides(data: Path) -> list[str]:
    return [f"--data.train_url={data}", f"--train.steps={STEPS}", f"--train.checkpoint_every={EVERY}",
            f"--train.batch_size={BATCH}"]


def _losses(run: Path) -> dict[int, float]:
    out = {}
    for ln in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(ln)
        if rec.get("kind") == "train":
            out[rec["step"]] = rec["loss"]
    return out


def _start(run: Path, data: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    e = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    cmd = [sys.executable, "-m", "train.cli", "train", str(CONFIG), "--run-dir", str(run), *extra, *_overrides(data)]
    return subprocess.Popen(cmd, cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _wait_for(cond, proc: subprocess.Popen, what: str, timeout: float = 150.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before {what}:\n"
                                 + proc.stdout.read().decode(errors="replace")[-3000:])
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _kill9(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL


def _raw_rows(run: Path) -> dict[int, list[int]]:
    """rows.jsonl as the killed process left it (a last line cut mid-write is skipped)."""
    out = {}
    for ln in (run / "rows.jsonl").read_text().splitlines():
        try:
            rec = json.loads(ln)
        except ValueError:
            continue
        out[rec["step"]] = rec["rows"]
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from features import load_schema
    from ingest.synth import write_synthetic

    d = tmp_path_factory.mktemp("proc-data") / "train"
    write_synthetic(load_schema(SCHEMA), str(d), ROWS, seed=3, files=2, row_group_rows=40)
    return d


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    from train.config import load_run_config
    from train.ledger import read_rows
    from train.trainer import Trainer

    run = tmp_path_factory.mktemp("proc-ref") / "run"
    Trainer(load_run_config(CONFIG, _overrides(data)), run, quiet=True).fit()
    return run, read_rows(run), _losses(run)


@pytest.mark.timeout(420)
def test_kill9_mid_checkpoint_and_at_random_step_then_resume(data, reference, tmp_path):
    from train import checkpoint as ckpt
    from train.cli import main
    from train.ledger import read_ledger, read_rows

    ref_run, ref_rows, ref_losses = reference
    assert len(ref_rows) == STEPS and sorted(sum(ref_rows[:ROWS // BATCH], [])) == list(range(ROWS))
    run = tmp_path / "run"

    # 1) killed while the checkpoint at step 8 is half written (tensors there, no marker)
    half = run / "checkpoints" / f".tmp-{ckpt.step_dir_name(8)}"
    p = _start(run, data, env={ckpt.PAUSE_ENV: "8:120"})
    _wait_for(lambda: (half / ".metadata").exists(), p, "the paused checkpoint write")
    _kill9(p)
    assert not (half / ckpt.MARKER).exists()
    assert [c.name for c in ckpt.complete_checkpoints(run)] == [ckpt.step_dir_name(4)]
    raw = _raw_rows(run)
    assert max(raw) == 8  # it trained 5..8 after the checkpoint: those are trained again on resume
    assert [raw[s] for s in range(1, 9)] == ref_rows[:8]

    # 2) resumed from step 4, killed at a seeded random step
    kill_at = random.Random(SEED).randint(10, STEPS - 3)
    p = _start(run, data, "--resume", env={"GEMTRAIN_FAULT_STEP_DELAY_S": "0.2"})
    _wait_for(lambda: max(_raw_rows(run), default=0) >= kill_at and
              len(_raw_rows(run)) >= kill_at, p, f"step {kill_at}")
    time.sleep(random.Random(SEED + 1).uniform(0.0, 0.2))  # somewhere inside the next step
    _kill9(p)
    raw = _raw_rows(run)
    reached = max(raw)
    assert kill_at <= reached < STEPS
    latest = ckpt.latest_checkpoint(run)
    assert latest is not None
    # the newest checkpoint at or before the step reached (or the one before, if killed while saving that)
    newest = reached // EVERY * EVERY
    assert latest.name in {ckpt.step_dir_name(newest), ckpt.step_dir_name(newest - EVERY)}
    assert [raw[s] for s in range(1, reached + 1)] == ref_rows[:reached]

    # 3) resumed to the end
    p = _start(run, data, "--resume")
    out, _ = p.communicate(timeout=200)
    assert p.returncode == 0, out.decode(errors="replace")[-3000:]
    assert read_rows(run) == ref_rows  # no row lost, none repeated
    losses = _losses(run)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses == ref_losses  # bit for bit (float equality of every step's loss)

    led = read_ledger(run)
    assert [r["resumed_at_step"] for r in led["restarts"]] == [4, int(latest.name[len(ckpt.PREFIX):])]
    epochs = led["epochs"]
    assert [e["rows_read"] for e in epochs] == [ROWS, ROWS]  # 20 steps x 16 rows = two whole epochs
    for e in epochs:  # exact accounting per epoch
        assert e["rows_total"] == e["rows_read"] + e["rows_quarantined"] + e["rows_dropped_remainder"] == ROWS
    assert sum(e["steps"] for e in epochs) == STEPS
    assert {k: v for k, v in led.items() if k not in ("restarts", "run_dir", "snapshots", "pid")} == \
        {k: v for k, v in read_ledger(ref_run).items() if k not in ("restarts", "run_dir", "snapshots", "pid")}

    # the ledger as the CLI shows it
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["runs", "show", str(run)]) == 0
    text = buf.getvalue()
    assert "20 steps, 2 restarts" in text and "resumed at step 4" in text
