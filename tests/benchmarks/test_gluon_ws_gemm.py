"""The warp-specialized Gluon GEMM (``benchmarks/gluon_ws_gemm.py``) compiled for sm_90a on this CPU machine: every
configuration lowers to wgmma products with the partitions' register hand-over (setmaxnreg) and spills nothing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_every_configuration_compiles_warp_specialized_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # GPU code, not the interpreter
    out = subprocess.run([sys.executable, "benchmarks/gluon_ws_gemm.py", "--offline"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| (")]
    assert len(rows) == 2, out.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == "0/0" and cells[3] == "yes" and cells[4] == "yes", row
