"""The Gluon dk/dv prototype (``benchmarks/gluon_dkdv.py``) compiled for sm_90a on this CPU machine: every
configuration, causal and full, lowers to wgmma products with partitions of their own register budgets (the
producer warp down to 24, the warpgroups up)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_every_configuration_compiles_warp_specialized():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # GPU code, not the interpreter
    out = subprocess.run([sys.executable, "benchmarks/gluon_dkdv.py", "--offline"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith(("| causal", "| full"))]
    assert len(rows) == 6, out.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert int(cells[4]) >= 4, row  # the four products per pair, at least once each
        budgets = [int(r) for r in cells[5].split(",")]
        assert budgets[0] == 24 and budgets[-1] > int(cells[2]), row
