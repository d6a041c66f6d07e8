"""The distributed step's NaN guard and clipping on the device (no host read per step), against the
host guard, on 2 CPU ranks with replicated tables and DDP (the GPU benchmark's layout); and the
lagged count of skipped steps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from train.step_guard import SkipCounter, count_skipped
from train.trainer import TrainingStopped


@pytest.mark.parametrize("mode", ["device", "host"])
def test_nan_step_is_skipped_whole_and_clipping_matches(two_ranks, mode):
    results, _ = two_ranks
    for r, res in enumerate(results):
        g = res["guard"][mode]
        assert g["device_guard"] == (mode == "device")
        steps = g["steps"]
        assert [s["ok"] for s in steps] == [True, False, True], r
        # rank 0's NaN input reaches every rank (DDP averages the gradients): nothing moves there,
        # the fused AdamW step count included; the steps around it do move
        assert steps[1]["moved"] == 0.0 and steps[0]["moved"] > 1e-3 and steps[2]["moved"] > 1e-3
        assert [s["adam_steps"] for s in steps] == [[1.0], [1.0], [2.0]]
        assert steps[0]["norm"] > 0.05 and steps[2]["norm"] > 0.05  # clipping (at 0.05) was active
        assert g["skipped"] == [2]
        # touched rows come from the batch's ids at forward time and are exactly the rows with a gradient
        assert all(s["marked_at_forward"] and s["marked_rows_match"] for s in steps)


def test_device_guard_equals_host_guard(two_ranks):
    results, _ = two_ranks
    for res in results:
        assert res["guard"]["device_vs_host_max_diff"] <= 1e-7


def test_skip_counter_reads_flags_in_order():
    sc = SkipCounter(max_lag=2)
    for step, ok in ((1, torch.tensor(True)), (2, torch.tensor(False)), (3, True), (4, False)):
        sc.push(step, ok)
    assert sc.poll() == [2, 4]
    assert sc.poll(wait=True) == []


def test_count_skipped_logs_and_stops_at_the_limit():
    tr = SimpleNamespace(step=7, skipped=1, cfg=SimpleNamespace(train=SimpleNamespace(nan_guard_max=3)))
    logs: list[str] = []
    sc = SkipCounter()
    sc.push(5, torch.tensor(False))
    sc.push(6, True)
    count_skipped(tr, sc, logs.append)
    assert tr.skipped == 2 and len(logs) == 1 and "step 5" in logs[0]
    sc.push(7, torch.tensor(False))
    with pytest.raises(TrainingStopped, match="3 non-finite steps, the last at step 7"):
        count_skipped(tr, sc, logs.append, wait=True)


def test_device_guard_with_fsdp2_dense_blocks(two_ranks):
    """FSDP2 (DTensor parameters on one mesh) beside DMP tables: the fused AdamW takes a DTensor found_inf."""
    results, _ = two_ranks
    for res in results:
        g = res["guard"]["fsdp"]
        assert g["device"]["device_guard"] and not g["host"]["device_guard"]
        assert g["device"]["dtensor_params"] > 50
        for mode in ("device", "host"):
            assert g[mode]["ok"] == [True, False]
            assert g[mode]["dense_moved"][0] > 1e-3 and g[mode]["dense_moved"][1] == 0.0
        assert g["device_vs_host_max_diff"] <= 1e-7
