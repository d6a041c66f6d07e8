"""3 CPU ranks: sharded step and expert parallelism equal one process; resume of a 2-rank checkpoint."""

from __future__ import annotations

import pytest

TOL = 2e-5


def test_sharded_step_equals_single_process_3(three_ranks):
    for r, res in enumerate(three_ranks):
        for variant, v in res["sharded"].items():
            assert abs(v["loss"] - v["loss_ref"]) <= TOL * max(1.0, abs(v["loss_ref"])), (r, variant)
            assert v["dense_grad_max_err"] <= TOL, (r, variant, v["dense_grad_max_err"])
            assert v["table_max_err"] <= TOL * 0.1, (r, variant, v["table_max_err"])
    # row-wise over 3 ranks: the 96-row item table in three 32-row shards
    shards = three_ranks[0]["sharded"]["row_wise"]["plan"]["embeddings.ec.item"]["shards"]
    assert [s["sizes"][0] for s in shards] == [32, 32, 32]


def test_expert_parallel_moe_equals_single_device_3(three_ranks):
    for res in three_ranks:
        m = res["moe_ep"]
        assert m["y_err"] <= 1e-6 and m["router_grad_err"] <= 1e-6 and m["expert_grad_err"] <= 1e-6
        assert m["aux"] == pytest.approx(m["aux_ref"], rel=1e-6)


def test_resume_at_three_ranks_from_two(two_ranks, three_ranks):
    results2, _ = two_ranks
    saved = results2[0]["ckpt_save"]
    before = [row for res in results2 for row in res["ckpt_save"]["rows"]]
    after = [row for res in three_ranks for row in res["ckpt_resume"]["rows"]]
    for res in three_ranks:
        c = res["ckpt_resume"]
        assert c["step"] == 3
        # every tensor, resharded from 2 to 3 ranks, holds exactly what was saved
        assert c["sums"].keys() == saved["sums"].keys()
        for k, v in saved["sums"].items():
            assert c["sums"][k] == pytest.approx(v, rel=1e-9, abs=1e-9), k
        assert all(loss == loss and loss < 50 for loss in c["losses"])
    # the fused table optimizer state (row-wise Adagrad), resharded 2 -> 3, is what was saved
    keys = set().union(*(res["ckpt_save"]["fused"] for res in results2))
    assert len(keys) == 5  # every table
    for k in keys:
        before_sum = sum(res["ckpt_save"]["fused"].get(k, 0.0) for res in results2)
        after_sum = sum(res["ckpt_resume"]["fused"].get(k, 0.0) for res in three_ranks)
        assert before_sum > 0 and after_sum == pytest.approx(before_sum, rel=1e-6), k
    # the loader stream: every row of the epoch exactly once across the two runs
    assert len(before) == len(set(before)) == 24
    assert sorted(before + after) == list(range(72))
