"""The Gluon benchmarks' kernels compiled for sm_90a on this CPU machine (``--offline``):

* ``benchmarks/gluon_ws_gemm.py``: every configuration compiles warp-specialized, with wgmma and no spills;
* ``benchmarks/gluon_dkdv.py``: every configuration and variant (serial, products in flight, dQ added by atomics),
  causal and full, lowers to wgmma products with partitions of their own register budgets (the producer warp down
  to 24, the warpgroups up);
* ``benchmarks/gluon_window_dkdv.py``: every configuration of the persistent window dk/dv kernel, one or two
  consumer warpgroups, does the same within one program's shared memory."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _offline_rows(script: str, first_cells: tuple[str, ...]) -> list[list[str]]:
    """The cells of the report rows (those starting with ``first_cells``) of ``script --offline``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # GPU code, not the interpreter
    out = subprocess.run([sys.executable, script, "--offline"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [[c.strip() for c in line.strip("|").split("|")] for line in out.stdout.splitlines()
            if line.startswith(first_cells)]


@pytest.mark.slow
def test_gemm_compiles_warp_specialized_without_spills():
    rows = _offline_rows("benchmarks/gluon_ws_gemm.py", ("| (",))
    assert len(rows) == 2, rows
    for cells in rows:
        assert cells[2] == "0/0" and cells[3] == "yes" and cells[4] == "yes", cells


@pytest.mark.slow
def test_dkdv_compiles_warp_specialized():
    from benchmarks.gluon_dkdv import CONFIGS

    rows = _offline_rows("benchmarks/gluon_dkdv.py", ("| causal", "| full"))
    assert len(rows) == 2 * len(CONFIGS), rows
    for cells in rows:
        assert int(cells[4]) >= 4, cells  # the four products per pair, at least once each
        budgets = [int(r) for r in cells[5].split(",")]
        assert budgets[0] == 24 and budgets[-1] > int(cells[2]), cells


@pytest.mark.slow
def test_window_dkdv_compiles_warp_specialized():
    from benchmarks.gluon_window_dkdv import CONFIGS

    rows = _offline_rows("benchmarks/gluon_window_dkdv.py", ("| (",))
    assert len(rows) == len(CONFIGS), rows
    for cells in rows:
        assert int(cells[3]) >= 4, cells  # the four products per pair (two consumers: twice)
        budgets = [int(r) for r in cells[4].split(",")]
        assert budgets[0] == 24 and budgets[-1] > int(cells[1]), cells
        assert int(cells[5]) <= 232448, cells  # one program's shared-memory limit on sm_90
