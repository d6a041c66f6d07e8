"""benchmarks/step_guard.py on CPU: both arms train, each with the guard it names, and the ratio is printed."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import REPO


def _load():
    spec = importlib.util.spec_from_file_location("step_guard_bench", REPO / "benchmarks" / "step_guard.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _printed_lines(capsys, *args: str) -> list[str]:
    """The output lines of one `step_guard.py` run on the demo model (which must succeed)."""
    assert _load().main(["--tiny", "--rounds", "1", *args]) == 0
    return capsys.readouterr().out.splitlines()


def _costliest_first(lines: list[str], header: str, n: int) -> list[list[str]]:
    """The n rows of the table under `header`, split into cells, after checking they are sorted by ms, descending."""
    start = lines.index(header)
    rows = [r.strip("|").split("|") for r in lines[start + 2:start + 2 + n]]
    assert len(rows) == n and all(len(r) == 4 for r in rows)
    ms = [float(r[2]) for r in rows]
    assert ms == sorted(ms, reverse=True)
    return rows


@pytest.mark.timeout(300)
def test_both_arms_train_with_their_guard_and_the_ratio_is_printed(capsys):
    mod = _load()
    assert mod.main(["--tiny", "--steps", "4", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    rows = [r.strip("|").split("|") for r in out.splitlines() if r.startswith("| 1 |")]
    assert sorted((r[1].strip(), r[2].strip(), r[3].strip()) for r in rows) == [
        ("device", "device", "4"), ("host", "host", "4")]
    assert all(float(r[4]) > 0 for r in rows)
    assert "median" in out and "x" in out.splitlines()[-1]


@pytest.mark.timeout(300)
def test_profile_counts_the_work_of_a_step(capsys):
    lines = _printed_lines(capsys, "--steps", "3", "--no-warmup", "--profile")
    line = next(ln for ln in lines if ln.startswith("per step ("))
    ops, ms = float(line.split(": ")[1].split()[0]), float(line.split("included), ")[1].split()[0])
    assert ops > 100 and ms > 0  # a training step of the demo model runs hundreds of ops
    # the costliest ops per step, costliest first, each a share of the step's summed time
    rows = _costliest_first(lines, "| kernel (aten op on CPU) | launches per step | ms per step | share |", 15)
    assert all(r[0].strip().startswith("`aten::") for r in rows) and float(rows[0][2]) > 0
    assert sum(float(r[3].strip().rstrip("%")) for r in rows) <= 100.5


@pytest.mark.timeout(300)
def test_host_profile_names_the_functions_a_step_spends_its_host_time_in(capsys):
    lines = _printed_lines(capsys, "--steps", "6", "--no-warmup", "--host-profile")
    total = next(ln for ln in lines if ln.startswith("host time per step by function"))
    assert float(total.split("in all")[0].split()[-2]) > 0
    rows = _costliest_first(lines, "| function | calls per step | ms per step | share |", 20)
    assert all(r[0].strip().startswith("`") for r in rows)
    # one backward per step
    backward = [r for r in rows if "run_backward" in r[0]]
    assert backward and float(backward[0][1]) == 1.0


def test_gpu_kernel_time_leaves_out_the_annotation_ranges():
    """On the GPU's timeline `record_function` ranges (`Optimizer.step#...`) span kernels already counted: the
    kernel time sums kernels only (torch's own profiler events, built as a CUDA trace lists them)."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    def event(name, start, end, **kw):
        return FunctionEvent(id=0, name=name, thread=0, start_us=start, end_us=end, device_type=DeviceType.CUDA, **kw)

    events = [event("gemm", 0, 300), event("gemm", 500, 800), event("cast", 900, 1000),
              event("Optimizer.step#Adagrad.step", 0, 1000, is_user_annotation=True)]
    work = _load().event_work(events, cuda=True)
    assert work == {"gemm": (2, 0.6), "cast": (1, 0.1)}
