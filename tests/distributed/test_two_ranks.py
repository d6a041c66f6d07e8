"""2 CPU ranks (gloo): sharded training equals one process, the pipeline equals the plain loop,
expert parallelism equals the single-device MoE, a dead rank fails fast."""

from __future__ import annotations

import pytest

# float32, the same sums in another order: per-rank batches, sharded lookups, all-to-alls
TOL = 2e-5
VARIANTS = ("table_wise", "row_wise", "column_wise", "replicate_tables", "activation_checkpointing", "ddp",
            "replicate_tables_ddp")


@pytest.mark.parametrize("variant", VARIANTS)
def test_sharded_step_equals_single_process(two_ranks, variant):
    results, _ = two_ranks
    for r, res in enumerate(results):
        v = res["sharded"][variant]
        assert abs(v["loss"] - v["loss_ref"]) <= TOL * max(1.0, abs(v["loss_ref"])), (r, v["loss"], v["loss_ref"])
        assert v["dense_grads_compared"] > 50 and not v["missing"], v["missing"]
        assert v["dense_grad_max_err"] <= TOL, (r, v["dense_grad_max_err"])
        # one SGD step of the fused table optimizer against the reference update (~6e-3 at most)
        assert v["table_max_err"] <= TOL * 0.1, (r, v["table_max_err"])
        assert v["table_update_max"] > 1e-3  # the tables did move: the comparison is not vacuous
        if variant.endswith("ddp"):  # torch DDP (composable replicate) on the whole dense part, no FSDP2 unit
            assert v["fsdp_units"] == ["<root: ddp>"] and v["checkpointed_blocks"] == 0
        else:  # activation checkpointing wraps every dense block (and only in that variant)
            assert (v["checkpointed_blocks"] == len(v["fsdp_units"]) - 1) == (variant == "activation_checkpointing")
        if variant.startswith("replicate_tables"):  # no torchrec sharding; tables all-reduced (dense: 2x1 HSDP or DDP)
            assert v["plan"] == {}
            continue
        types = {p["sharding_type"] for p in v["plan"].values()}
        want = {"table_wise": {"table_wise"}, "row_wise": {"row_wise", "table_wise"},
                "column_wise": {"column_wise"}}.get(variant)
        assert want is None or types == want, types
        assert v["plan"]["embeddings.ec.item"]["sharding_type"] == ("column_wise" if variant == "column_wise"
                                                                    else variant if variant == "table_wise"
                                                                    else "row_wise")
        if variant == "column_wise":  # column-wise really splits each table over both ranks
            ranks = {s["rank"] for s in v["plan"]["embeddings.ec.item"]["shards"]}
            assert ranks == {0, 1}


def test_fsdp_units_cover_the_dense_blocks(two_ranks):
    units = two_ranks[0][0]["sharded"]["table_wise"]["fsdp_units"]
    assert "interaction" in units and "encoders.history.layers.0.attn" in units and units[-1] == "<root>"
    assert not any(u.startswith("embeddings.ec") or u.startswith("embeddings.ebc") for u in units)


def test_pipeline_losses_equal_plain_loop(two_ranks):
    results, _ = two_ranks
    for res in results:
        p = res["pipeline"]
        assert len(p["pipelined"]) == len(p["plain"]) == 4
        assert p["pipelined"] == pytest.approx(p["plain"], rel=1e-6, abs=1e-7)
        # torchrec really pipelined both sharded modules (their forward was swapped by the pipeline)
        assert set(p["pipelined_modules"].values()) == {"PipelinedForward"}, p["pipelined_modules"]


def test_expert_parallel_moe_equals_single_device(two_ranks):
    results, _ = two_ranks
    owned = []
    for res in results:
        m = res["moe_ep"]
        assert m["y_err"] <= 1e-6
        assert m["aux"] == pytest.approx(m["aux_ref"], rel=1e-6)
        assert m["router_grad_err"] <= 1e-6
        assert m["expert_grad_err"] <= 1e-6
        owned += m["local_experts"]
        # state-dict keys carry global expert indices
        assert {k.split(".")[1] for k in m["state_dict_keys"] if k.startswith("experts.")} == {
            str(i) for i in m["local_experts"]}
    assert sorted(owned) == [0, 1, 2, 3]


def test_dead_rank_fails_fast_with_a_clear_error(two_ranks):
    results, _ = two_ranks
    d = results[0]["dead_rank"]
    assert d["raised"], d
    assert d["seconds"] < 30  # a third of the 90 s collective timeout: the failure is detected, not waited out
    assert "rank 0 of 2" in d["message"] and "another rank died" in d["message"] and "--resume" in d["message"]


def test_stuck_rank_fails_at_the_collective_timeout(two_ranks):
    results, _ = two_ranks
    s = results[0]["stuck_rank"]
    assert s["raised"], s
    assert 2.5 < s["seconds"] < 20  # the group's 3 s timeout, not a hang
    assert "collective timeout 3s" in s["message"] and "another rank died or stopped responding" in s["message"]
    assert results[1]["stuck_rank"] == {}  # the stuck rank itself went on (and both met at a barrier after)
