"""Runs distributed checks on N CPU ranks (gloo) in one process group; each rank writes its results.

    python -m tests.distributed.harness --nproc 2 --out DIR --checks sharded,pipeline,moe_ep

The heavy imports (torch, torchrec, the model) happen once here, then the ranks are forked, so a
run costs one interpreter start-up, not N. Each rank writes DIR/rank<r>.json: {check: result}.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torchrec.distributed.model_parallel  # noqa: E402,F401  (import once, before forking)
import torchrec.distributed.planner  # noqa: E402,F401
import torchrec.distributed.train_pipeline  # noqa: E402,F401

from features import load_schema  # noqa: E402
from ingest.convert import table_to_batch  # noqa: E402
from ingest.synth import generate_table  # noqa: E402
from model import build_model  # noqa: E402
from model import parallelize as par  # noqa: E402
from train import distributed as tdist  # noqa: E402

SCHEMA = REPO / "tests" / "distributed" / "tiny.yaml"
MODEL = {"d_model": 16, "num_heads": 2, "sequence_encoder": {"num_layers": 1},
         "interaction": {"kind": "dcn", "num_layers": 1}, "top_dim": 16, "head_hidden": 8,
         "moe": {"num_experts": 6, "top_k": 2, "hidden_dim": 16}}
ROWS_PER_RANK = 4
SPARSE_LR = 0.5  # large, so a wrong embedding gradient moves the tables visibly
TOL = 2e-5  # float32, the same math in another order (per-rank batches, sharded lookups)


def schema_with(sharding: dict[str, str | None]):
    import dataclasses

    s = load_schema(SCHEMA)
    tables = tuple(dataclasses.replace(t, sharding=sharding.get(t.name, t.sharding)) for t in s.tables)
    return dataclasses.replace(s, tables=tables)


def global_batch(schema, rows: int, seed: int):
    return table_to_batch(generate_table(schema, rows, seed=seed), schema)


def local_batch(schema, rows_per_rank: int, seed: int, rank: int, world: int):
    g = generate_table(schema, rows_per_rank * world, seed=seed)
    return table_to_batch(g.slice(rank * rows_per_rank, rows_per_rank), schema)


def fresh_model(schema, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(schema, MODEL)


def ref_loss(model, batch, tasks):
    from model.losses import multitask_loss

    out = model(batch)
    total, _ = multitask_loss(out.logits.float(), batch.labels, batch.label_mask, batch.weights, tasks)
    return total + out.aux_loss.float()


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def table_errors(dmp_sd: dict, ref_tables: dict[str, torch.Tensor]) -> float:
    """Max |sharded - reference| over this rank's shards of every table."""
    worst = 0.0
    for key, ref in ref_tables.items():
        st = dmp_sd[key]
        if hasattr(st, "local_shards"):
            for shard in st.local_shards():
                o, z = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                want = ref[o[0]:o[0] + z[0], o[1]:o[1] + z[1]]
                worst = max(worst, float((shard.tensor - want).abs().max()))
        else:
            worst = max(worst, float((full(st) - ref).abs().max()))
    return worst


# ---- checks --------------------------------------------------------------------------------------


def check_sharded(info, variants=None) -> dict:
    """Loss, dense gradients and table updates of one step equal a single process on the global batch."""
    variants = variants or {
        "table_wise": {"item": "table_wise", "category": "table_wise", "user": "table_wise", "ad": "table_wise",
                       "interest": "table_wise"},
        "row_wise": {"item": "row_wise", "category": "row_wise", "user": "table_wise", "ad": "table_wise",
                     "interest": "table_wise"},
        "column_wise": {"item": "column_wise", "category": "column_wise", "user": "column_wise",
                        "ad": "column_wise", "interest": "column_wise"},
    }
    out = {}
    for name, sharding in variants.items():
        t0 = time.perf_counter()
        schema = schema_with(sharding)
        tasks = list(schema.label_names)
        model = fresh_model(schema)
        ref = copy.deepcopy(model)
        gb = global_batch(schema, ROWS_PER_RANK * info.world_size, seed=1)
        lb = local_batch(schema, ROWS_PER_RANK, 1, info.rank, info.world_size)
        # reference: one process, the global batch
        loss_ref = ref_loss(ref, gb, tasks)
        loss_ref.backward()
        ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters() if p.grad is not None
                     and not n.startswith(("embeddings.ec.", "embeddings.ebc."))}
        ref_tables = {n: (p - SPARSE_LR * p.grad).detach() for n, p in ref.named_parameters()
                      if n.startswith(("embeddings.ec.", "embeddings.ebc."))}
        # sharded
        pz = par.parallelize(model, schema, par.ParallelConfig(pipeline=False), info.device,
                             sparse_optim={"name": "sgd", "lr": SPARSE_LR}, batch_size=ROWS_PER_RANK,
                             loss_tasks=tasks, log=lambda _m: None)
        loss, _ = pz.model(lb)
        loss.backward()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss /= info.world_size
        dense = pz.dense_named_parameters()
        grad_err = 0.0
        missing = []
        for n in sorted(ref_grads):
            p = dense.get(n)
            if p is None or p.grad is None:
                missing.append(n)
                continue
            grad_err = max(grad_err, float((full(p.grad) - ref_grads[n]).abs().max()))
        sd = pz.model.state_dict()
        out[name] = {
            "loss_ref": float(loss_ref), "loss": float(mean_loss), "dense_grad_max_err": grad_err,
            "dense_grads_compared": len(ref_grads) - len(missing), "missing": missing,
            "table_max_err": table_errors(sd, ref_tables),
            "table_update_max": max(float((SPARSE_LR * p.grad).abs().max()) for n, p in ref.named_parameters()
                                    if n.startswith(("embeddings.ec.", "embeddings.ebc."))),
            "plan": pz.plan_dict, "notes": [n.__dict__ for n in pz.notes], "fsdp_units": pz.fsdp_units,
            "seconds": time.perf_counter() - t0,
        }
    return out


CHECKS = {"sharded": check_sharded}


def _worker(rank: int, nproc: int, out: str, checks: list[str], port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nproc),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc))
    torch.set_num_threads(1)
    info = tdist.setup(device="cpu", timeout_s=float(os.environ.get("GEMTRAIN_TEST_TIMEOUT", "60")))
    results = {}
    for name in checks:
        results[name] = CHECKS[name](info)
        Path(out, f"rank{rank}.json").write_text(json.dumps(results, indent=1, default=str))
    dist.barrier()
    tdist.teardown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checks", required=True)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args(argv)
    port = a.port or _free_port()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    mp.start_processes(_worker, args=(a.nproc, a.out, a.checks.split(","), port), nprocs=a.nproc,
                       start_method="fork", join=True)
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
