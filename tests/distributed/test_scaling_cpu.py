"""benchmarks/scaling_cpu.py at 2 gloo ranks (tiny mode): every layout's step equals one process,
and the counted collective bytes are positive and agree with the parameter bytes FSDP2 must move."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOL = 2e-5  # float32, the same sums in another order (as in test_two_ranks)
LAYOUTS = ("ddp", "fsdp", "ep 2")


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("scaling") / "scaling.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "scaling_cpu.py"), "--nprocs", "2", "--tiny",
                           "--balance-ranks", "2", "--out", str(out)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "| 2 | fsdp |" in proc.stdout  # the table was printed
    return json.loads(out.read_text())


def dense_fsdp_bytes() -> int:
    """float32 bytes of the parameters FSDP2 manages: all but the tables and the MoE (kept out of FSDP)."""
    from benchmarks.scaling_cpu import fresh_model, tiny_schema
    from model.moe import MoE

    model = fresh_model(tiny_schema())
    moe = {id(p) for m in model.modules() if isinstance(m, MoE) for p in m.parameters()}
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters()
               if not n.startswith(("embeddings.ec.", "embeddings.ebc.")) and id(p) not in moe)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_step_equals_single_process(result, layout):
    ranks = result["worlds"]["2"][layout]
    assert len(ranks) == 2
    for r in ranks:
        assert r["loss_err"] <= TOL * max(1.0, abs(r["loss_ref"])), r["loss_err"]
        assert r["grad_err"] <= TOL and r["table_err"] <= TOL * 0.1, (r["grad_err"], r["table_err"])
        assert r["grads_compared"] > 50 and not r["missing"], r["missing"]
    # expert parallelism: each rank holds half of the experts, together they cover every gradient
    if layout == "ep 2":
        assert ranks[0]["grads_compared"] < ranks[0]["ref_dense_grads"]
        assert sum(r["grads_compared"] for r in ranks) > ranks[0]["ref_dense_grads"]
    else:
        assert all(r["grads_compared"] == r["ref_dense_grads"] for r in ranks)


def test_byte_counts_consistent(result):
    w = result["worlds"]["2"]
    p = dense_fsdp_bytes()
    slack = 0.01 * p  # FSDP2 pads each parameter's first dim to a multiple of the shard size
    for name in LAYOUTS:
        for r in w[name]:
            b = r["bytes"]
            assert b["all_reduce"] > 0 and b["all_to_all"] > 0, (name, b)  # loss denominators; torchrec's input dist
            assert b["other"] == 0 and not r["other_ops"], r["other_ops"]
    for name in ("fsdp", "ep 2"):
        for r in w[name]:
            b, pred = r["bytes"], r["pred"]
            # every parameter gathered in forward (blocks again in backward): (N-1)/N x bytes, once or twice
            assert b["all_gather"] == pred["all_gather"] > 0
            assert p / 2 <= b["all_gather"] <= p + slack
            # one reduce-scatter of every gradient: (N-1)/N x the (padded) parameter bytes
            assert b["reduce_scatter"] == pred["reduce_scatter"]
            assert p / 2 <= b["reduce_scatter"] <= p / 2 + slack
    for rd, rf in zip(w["ddp"], w["fsdp"]):
        # DDP: no sharding, the whole gradient all-reduced: 2 (N-1)/N x bytes more all-reduce than FSDP;
        # DDP is built at the first forward (the counted step): its parameter-shape check all-gathers 8 bytes
        assert rd["bytes"]["reduce_scatter"] == 0 and rd["bytes"]["all_gather"] <= 64
        assert p <= rd["bytes"]["all_reduce"] - rf["bytes"]["all_reduce"] <= p + slack
    for re, rf in zip(w["ep 2"], w["fsdp"]):
        # experts over both ranks: tokens travel by all-to-all instead of all-reducing expert gradients
        assert re["bytes"]["all_to_all"] > rf["bytes"]["all_to_all"]
        assert re["bytes"]["all_reduce"] < rf["bytes"]["all_reduce"]


def test_balancing_batcher(result):
    bal = result["balance"]
    fixed, token = bal["fixed"], bal["token"]
    assert fixed["steps"] > 2 and token["steps"] > 2
    assert fixed["rows_per_batch"] == bal["batch_size"]
    for r in (fixed, token):
        assert 1.0 <= r["work_spread"] <= r["work_spread_max"]
        assert 1.0 <= r["token_spread"] <= r["token_spread_max"]
    # the length-balancing batcher evens both the tokens and the attention work of the ranks
    assert token["token_spread"] < fixed["token_spread"]
    assert token["work_spread"] < fixed["work_spread"]
