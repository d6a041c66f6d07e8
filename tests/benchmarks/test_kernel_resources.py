"""The attention backward compiled for sm_90 on this CPU machine (``benchmarks/kernel_resources.py``): without bias
tables the dk/dv kernels compute [keys, queries] tiles, so no register tile is transposed on its way to a tensor-core
product, every kernel runs Hopper's tensor-core instructions (HGMMA), and the FP8 backward's score products take the
e4m3 ones (QGMMA); and the driver builds every kernel's launcher."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _compile(dump: Path, *opts: str) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """(row of the report per kernel, TTGIR per kernel) of one call compiled for sm_90."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the kernels' GPU code, not the interpreter
    env["KERNEL_RESOURCES_DUMP"] = str(dump)
    out = subprocess.run([sys.executable, "benchmarks/kernel_resources.py", *opts], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[1:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
        rows[cells["kernel"]] = cells
    return rows, {p.stem: p.read_text() for p in dump.glob("*.ttgir")}


@pytest.mark.slow
@pytest.mark.parametrize("mask, dkdv", [("causal", "jagged_attn_bwd_dkdv_kernel"),
                                        ("window:256", "window_attn_bwd_dkdv_ds_kernel")])
def test_dkdv_tiles_without_tables_transpose_nothing(tmp_path, mask, dkdv):
    rows, ir = _compile(tmp_path, f"mask={mask}")
    assert dkdv in ir, sorted(ir)
    # [queries, keys] tiles put a `tt.trans` of P and of dS before dV += P^T dO and dK += dS^T Q (six in the
    # generic kernel's three loops before the change); [keys, queries] tiles need none.
    assert "tt.trans" not in ir[dkdv]
    assert "ttg.memdesc_trans" in ir[dkdv]  # Q and dO enter S^T = K Q^T, dP^T = V dO^T as transposed views
    for name, row in rows.items():
        if "attn" in name:
            assert int(row["HGMMA"]) > 0, (name, row)
        assert row["launcher"] == "yes", (name, row)
    # the dumps carry no source locations, so two dumps of code that compiles alike are equal
    for name, text in ir.items():
        assert "#loc" not in text and "callsite(" not in text, name
        ptx = (tmp_path / f"{name}.ptx").read_text()
        assert ".entry " + name in ptx and "\t.loc\t" not in ptx and ".debug_" not in ptx, name


@pytest.mark.slow
def test_fp8_backward_runs_its_score_products_on_fp8_tensor_cores(tmp_path):
    # precision=fp8 compiles the FP8 forward and the backward with fp8_backward: S = QK^T and dP = dO V^T take the
    # e4m3 instructions (QGMMA), dV, dK and dQ stay bf16 (HGMMA), and no register tile is transposed.
    rows, ir = _compile(tmp_path, "precision=fp8")
    for name in ("jagged_attn_fp8_fwd_kernel", "jagged_attn_bwd_dq_kernel", "jagged_attn_bwd_dkdv_kernel"):
        assert int(rows[name]["QGMMA"]) > 0, (name, rows[name])
        assert "tt.trans" not in ir[name]
    for name in ("jagged_attn_bwd_dq_kernel", "jagged_attn_bwd_dkdv_kernel"):
        assert int(rows[name]["HGMMA"]) > 0, (name, rows[name])
    for name, row in rows.items():  # a tensor descriptor inside the CODES tuple compiled, then failed to launch
        assert row["launcher"] == "yes", (name, row)
