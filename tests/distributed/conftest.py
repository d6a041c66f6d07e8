"""Runs the distributed harness once per world size (a session fixture each) and hands the tests
every rank's results. The 3-rank run resumes the checkpoint the 2-rank run wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TWO_RANK_CHECKS = "sharded,pipeline,moe_ep,guard,ckpt_save,stuck_rank,dead_rank"  # dead_rank last: it breaks the group
THREE_RANK_CHECKS = "sharded,moe_ep,ckpt_resume"


def run_harness(nproc: int, out: Path, checks: str, env_extra: dict[str, str] | None = None) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "GEMTRAIN_TEST_TIMEOUT": "90", "OMP_NUM_THREADS": "1"}
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-m", "tests.distributed.harness", "--nproc", str(nproc), "--out",
                           str(out), "--checks", checks], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)
    if proc.returncode != 0:
        raise AssertionError(f"harness with {nproc} ranks failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture(scope="session")
def two_ranks(tmp_path_factory) -> tuple[list[dict], Path]:
    out = tmp_path_factory.mktemp("dist2")
    return run_harness(2, out, TWO_RANK_CHECKS), out


@pytest.fixture(scope="session")
def three_ranks(tmp_path_factory, two_ranks) -> list[dict]:
    _, out2 = two_ranks
    out = tmp_path_factory.mktemp("dist3")
    ckpt = out2 / "run" / "checkpoints" / "step_00000003"
    return run_harness(3, out, THREE_RANK_CHECKS, {"GEMTRAIN_TEST_CKPT": str(ckpt)})
