"""benchmarks/attention_configs.py in its tiny mode (interpreter), so the sweep script cannot rot."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported

from benchmarks import attention_configs as sweep  # noqa: E402
from kernels import attention_triton_common as common  # noqa: E402


def test_quick_sweep_times_both_descriptor_modes_and_restores_the_shipped_configs():
    shipped = {name: list(kern.configs) for name, (kern, _, _) in sweep.KERNELS.items()}
    rows = sweep.sweep("tiny", quick=True, reps=1)
    timed = [r for r in rows if r.startswith("| causal") or r.startswith("| full")]
    assert len(timed) == 4
    assert not any("failed" in r for r in timed), timed
    assert {r.split("|")[4].strip() for r in timed} == {"0", "1"}
    assert common.TMA == os.environ.get("GEMTRAIN_ATTN_TMA", "auto")
    assert {name: list(kern.configs) for name, (kern, _, _) in sweep.KERNELS.items()} == shipped


def test_pinned_configuration_reaches_the_kernels():
    kern = sweep.KERNELS["fwd"][0]
    shipped_inner, shipped_tile = kern.configs[0].kwargs["BLOCK_N"], sweep.op._plan(*_plan_args())["tile_q"]
    with sweep.pinned({"fwd": (16, 64, 4, 1), "dq": (64, 16, 4, 1)}, "0"):
        assert [c.kwargs["BLOCK_N"] for c in kern.configs] == [64]
        plan = sweep.op._plan(*_plan_args())
        assert (plan["tile_q"], plan["tile_q_bwd"]) == (16, 64)
    assert kern.configs[0].kwargs["BLOCK_N"] == shipped_inner
    assert sweep.op._plan(*_plan_args())["tile_q"] == shipped_tile


def _plan_args():
    import torch

    q = torch.zeros(8, 2, 32)
    return q, q, 128, 0, 0
