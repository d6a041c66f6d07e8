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
        local = st.to_local() if hasattr(st, "to_local") else None
        if local is not None and hasattr(local, "local_shards"):  # DTensor of torchrec's LocalShardsWrapper (2D)
            for shard, o in zip(local.local_shards(), local.local_offsets()):
                z = shard.shape
                worst = max(worst, float((shard - ref[o[0]:o[0] + z[0], o[1]:o[1] + z[1]]).abs().max()))
        elif hasattr(st, "local_shards"):
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
    variants = variants or {k: v for k, v in ALL_VARIANTS.items()
                            if not k.startswith("2d_") and (info.world_size == 2 or k in (
                                "row_wise", "column_wise", "replicate_tables_ddp"))}
    return _check_sharded(info, variants)


ALL_VARIANTS = {
    "table_wise": {"item": "table_wise", "category": "table_wise", "user": "table_wise", "ad": "table_wise",
                   "interest": "table_wise"},
    "row_wise": {"item": "row_wise", "category": "row_wise", "user": "table_wise", "ad": "table_wise",
                 "interest": "table_wise"},
    "column_wise": {"item": "column_wise", "category": "column_wise", "user": "column_wise",
                    "ad": "column_wise", "interest": "column_wise"},
    "replicate_tables": {},
    "activation_checkpointing": {"item": "row_wise", "category": "row_wise"},
    "ddp": {"item": "row_wise", "category": "row_wise"},
    "replicate_tables_ddp": {},
    # 2D sparse parallelism (4 ranks: tables sharded over groups of 2, replicated across the groups)
    "2d_row_wise": {"item": "row_wise", "category": "row_wise", "user": "table_wise", "ad": "table_wise",
                    "interest": "table_wise"},
    "2d_column_wise": {"item": "column_wise", "category": "column_wise", "user": "column_wise",
                       "ad": "column_wise", "interest": "column_wise"},
}


# the tables replicated (no torchrec sharding; what a GPU without fbgemm's CUDA kernels runs) and HSDP
PCFG = {"replicate_tables": {"sparse": "replicate", "replicate": 2},
        "activation_checkpointing": {"activation_checkpointing": True},
        "ddp": {"dense": "ddp"},  # torch DDP on the dense part, the sharded tables ignored
        "replicate_tables_ddp": {"sparse": "replicate", "dense": "ddp"},
        "2d_row_wise": {"sharding_group_size": 2}, "2d_column_wise": {"sharding_group_size": 2}}  # the GPU benchmark's layout


def _check_sharded(info, variants) -> dict:
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
        pz = par.parallelize(model, schema, par.ParallelConfig(**PCFG.get(name, {})), info.device,
                             sparse_optim={"name": "sgd", "lr": SPARSE_LR}, batch_size=ROWS_PER_RANK,
                             loss_tasks=tasks, log=lambda _m: None)
        loss, _ = pz.model(lb)
        loss.backward()
        before_sync = None
        if pz.after_step is not None:  # 2D: average the table replicas over the replica groups
            before_sync = table_errors(pz.model.state_dict(), ref_tables)
            pz.after_step()
        if pz.replicated_sync is not None:  # replicated tables: compare their averaged gradients
            pz.replicated_sync.sync()
            sd_tables = {n: (p - SPARSE_LR * p.grad).detach() for n, p in pz.model.named_parameters()
                         if n.startswith(("embeddings.ec.", "embeddings.ebc."))}
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
        sd = sd_tables if pz.replicated_sync is not None else pz.model.state_dict()
        out[name] = {
            "loss_ref": float(loss_ref), "loss": float(mean_loss), "dense_grad_max_err": grad_err,
            "dense_grads_compared": len(ref_grads) - len(missing), "missing": missing,
            "table_max_err": table_errors(sd, ref_tables),
            "table_update_max": max(float((SPARSE_LR * p.grad).abs().max()) for n, p in ref.named_parameters()
                                    if n.startswith(("embeddings.ec.", "embeddings.ebc."))),
            "plan": pz.plan_dict, "notes": [n.__dict__ for n in pz.notes], "fsdp_units": pz.fsdp_units,
            "checkpointed_blocks": sum(bool(getattr(m, "activation_checkpointed", False))
                                       for m in pz.train_module.modules()),
            "seconds": time.perf_counter() - t0,
        }
        if before_sync is not None:
            out[name]["table_max_err_before_sync"] = before_sync
    return out


def check_sharded_2d(info) -> dict:
    """2D sparse parallelism (DMPCollection, groups of 2): one step + sync equals one process."""
    return _check_sharded(info, {k: v for k, v in ALL_VARIANTS.items() if k.startswith("2d_")})


def make_optimizer(pz, lr: float = 0.05):
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

    dense = KeyedOptimizerWrapper(pz.dense_named_parameters(), lambda ps: torch.optim.Adam(ps, lr=lr))
    return CombinedOptimizer([("dense", dense), ("sparse", pz.sparse_optimizer)])


def sharded_model(info, schema, seed: int = 0, sparse_name: str = "rowwise_adagrad"):
    model = fresh_model(schema, seed)
    pz = par.parallelize(model, schema, par.ParallelConfig(), info.device,
                         sparse_optim={"name": sparse_name, "lr": 0.05}, batch_size=ROWS_PER_RANK,
                         loss_tasks=list(schema.label_names), log=lambda _m: None)
    return pz, make_optimizer(pz)


def check_pipeline(info) -> dict:
    """TrainPipelineSparseDist gives the same losses as the plain loop (same model, data, optimizer)."""
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    schema = schema_with({"item": "row_wise", "user": "column_wise"})
    batches = [local_batch(schema, ROWS_PER_RANK, 10 + i, info.rank, info.world_size) for i in range(4)]
    pz, opt = sharded_model(info, schema)
    plain = []
    for b in batches:
        opt.zero_grad()
        loss, out = pz.model(b)
        loss.backward()
        opt.step()
        plain.append(float(out.loss))
    pz2, opt2 = sharded_model(info, schema)
    pipe = TrainPipelineSparseDist(pz2.model, opt2, info.device, execute_all_batches=True)
    piped = []
    it = iter(batches)
    while True:
        try:
            out = pipe.progress(it)
        except StopIteration:
            break
        piped.append(float(out.loss))
    emb = pz2.train_module.embeddings
    pipelined = {m: type(getattr(emb, m).__dict__.get("forward")).__name__ for m in ("ec", "ebc")}
    return {"plain": plain, "pipelined": piped, "pipelined_modules": pipelined}


def check_moe_ep(info) -> dict:
    """Expert-parallel MoE (experts spread over all ranks) == the single-device MoE on the global batch."""
    from model.moe import MoE

    e = 2 * info.world_size
    torch.manual_seed(3)
    moe = MoE(8, 16, e, 2, load_balance_weight=0.1)
    ref = copy.deepcopy(moe)
    n_per = [5, 7, 3][: info.world_size] if info.world_size <= 3 else [5] * info.world_size
    n_total = sum(n_per)
    gen = torch.Generator().manual_seed(4)
    x_all = torch.randn(n_total, 8, generator=gen)
    c_all = torch.randn(n_total, 8, generator=gen)
    y_ref, aux_ref = ref(x_all)
    ((y_ref * c_all).sum() / n_total + aux_ref).backward()
    a = sum(n_per[: info.rank])
    x, c = x_all[a:a + n_per[info.rank]], c_all[a:a + n_per[info.rank]]
    mesh = par.build_mesh("cpu", ep=info.world_size)
    ep = par.ExpertParallelMoE(moe, mesh["ep"].get_group())
    y, aux = ep(x)
    # this rank's share of the global objective, scaled so the mean over ranks is the global objective
    (info.world_size * (y * c).sum() / n_total + aux).backward()
    expert_err = 0.0
    for i, ex in enumerate(ep.experts):
        for (_n, p), (_, q) in zip(ex.named_parameters(), ref.experts[ep.first + i].named_parameters()):
            expert_err = max(expert_err, float((p.grad - q.grad).abs().max()))
    sd_keys = sorted(ep.state_dict())
    return {"y_err": float((y - y_ref[a:a + len(x)]).abs().max()), "aux": float(aux), "aux_ref": float(aux_ref),
            "router_grad_err": float((ep.router.weight.grad - ref.router.weight.grad).abs().max()),
            "expert_grad_err": expert_err, "local_experts": [ep.first + i for i in range(ep.local)],
            "state_dict_keys": sd_keys}


def local_sums(osd: dict) -> dict[str, float]:
    """Sum of this rank's shards of each table's fused optimizer state (not collective: ranks hold
    different tables); the sums over ranks are the tables' totals."""
    out = {}
    for k, v in osd["state"].items():
        if not k.startswith("sparse."):
            continue
        total = 0.0
        for t in v.values():
            shards = t.local_shards() if hasattr(t, "local_shards") else []
            total += sum(float(sh.tensor.double().sum()) for sh in shards)
        out[k] = total
    return out


def _train_steps(pz, opt, it, steps: int, rows: list[int]) -> list[float]:
    losses = []
    for _ in range(steps):
        b = next(it)
        rows.extend(b.row_ids.tolist())
        opt.zero_grad()
        loss, out = pz.model(b)
        loss.backward()
        opt.step()
        losses.append(float(out.loss))
    return losses


def make_loader(schema, data: str, rank: int, world: int):
    from ingest.loader import Loader, LoaderConfig

    cfg = LoaderConfig(url=data, batch_size=ROWS_PER_RANK, shuffle=True, seed=0, shuffle_buffer_rows=32,
                       num_threads=0, prefetch=1, epochs=1)
    return Loader(schema, cfg, rank=rank, world_size=world)


CKPT_ROWS = 72
CKPT_STEPS = 3


def check_ckpt_save(info) -> dict:
    """Train 3 steps at this world size from a synthetic dataset, then checkpoint (DCP + loader state)."""
    from ingest.synth import write_synthetic
    from train import dist_checkpoint as dckpt

    schema = load_schema(SCHEMA)
    out_dir = Path(os.environ["GEMTRAIN_TEST_OUT"])
    data = str(out_dir / "data")
    if info.rank == 0:
        write_synthetic(schema, data, CKPT_ROWS, seed=5, files=3, row_group_rows=8)
    dist.barrier()
    pz, opt = sharded_model(info, schema)
    loader = make_loader(schema, data, info.rank, info.world_size)
    it = iter(loader)
    rows: list[int] = []
    losses = _train_steps(pz, opt, it, CKPT_STEPS, rows)
    lstate = loader.state_dict()
    sd = pz.model.state_dict()
    osd = opt.state_dict()
    path = dckpt.save(out_dir / "run", CKPT_STEPS, sd, osd, {"step": CKPT_STEPS, "loader": lstate},
                      plan=pz.plan_dict, sparse_name="rowwise_adagrad")
    # the tables' fused row-wise Adagrad state (momentum1, one value per row), summed per table
    return {"rows": rows, "losses": losses, "sums": dckpt.state_sums(sd), "path": str(path),
            "fused": local_sums(osd)}


def check_ckpt_resume(info) -> dict:
    """Resume the 2-rank checkpoint at this world size; train to the end of the epoch."""
    from train import dist_checkpoint as dckpt

    schema = load_schema(SCHEMA)
    src = Path(os.environ["GEMTRAIN_TEST_CKPT"])
    pz, opt = sharded_model(info, schema)
    opt.init_state()
    opt.zero_grad(set_to_none=True)
    sd = pz.model.state_dict()
    osd = opt.state_dict()
    state = dckpt.load(src, sd, osd, sparse_name="rowwise_adagrad")
    pz.model.load_state_dict(sd)
    opt.load_state_dict(osd)
    sums = dckpt.state_sums(pz.model.state_dict())
    fused = local_sums(osd)
    loader = make_loader(schema, str(src.parents[2] / "data"), info.rank, info.world_size)
    loader.load_state_dict(state["loader"])
    rows: list[int] = []
    losses = []
    it = iter(loader)
    while True:
        try:
            losses += _train_steps(pz, opt, it, 1, rows)
        except StopIteration:
            break
    return {"rows": rows, "losses": losses, "sums": sums, "step": state["step"], "fused": fused}


def check_ckpt_2d(info) -> dict:
    """2D sparse (groups of 2, row-wise Adagrad tables): a DCP checkpoint after one step, loaded into a
    fresh 2D model, continues exactly like the model that wrote it (tables, fused and dense optimizer state)."""
    from train import dist_checkpoint as dckpt

    schema = schema_with(ALL_VARIANTS["2d_row_wise"])
    tasks = list(schema.label_names)

    def build():
        pz = par.parallelize(fresh_model(schema), schema, par.ParallelConfig(sharding_group_size=2), info.device,
                             sparse_optim={"name": "rowwise_adagrad", "lr": 0.05}, batch_size=ROWS_PER_RANK,
                             loss_tasks=tasks, log=lambda _m: None)
        return pz, make_optimizer(pz)

    def step(pz, opt, seed):
        opt.zero_grad()
        loss, _ = pz.model(local_batch(schema, ROWS_PER_RANK, seed, info.rank, info.world_size))
        loss.backward()
        opt.step()
        pz.after_step()
        return float(loss)

    pz, opt = build()
    step(pz, opt, 1)
    path = dckpt.save(Path(os.environ["GEMTRAIN_TEST_OUT"]) / "run2d", 1, pz.model.state_dict(), opt.state_dict(),
                      {"step": 1}, plan=pz.plan_dict, sparse_name="rowwise_adagrad")
    pz2, opt2 = build()
    opt2.init_state()
    sd, osd = pz2.model.state_dict(), opt2.state_dict()
    dckpt.load(path, sd, osd, sparse_name="rowwise_adagrad")
    pz2.model.load_state_dict(sd)
    opt2.load_state_dict(osd)
    # two more steps on both: equal losses need equal tables and equal optimizer state
    written = [step(pz, opt, s) for s in (2, 3)]
    resumed = [step(pz2, opt2, s) for s in (2, 3)]
    fresh_pz, fresh_opt = build()  # the control: without the checkpoint the losses differ
    fresh = [step(fresh_pz, fresh_opt, s) for s in (2, 3)]
    return {"written": written, "resumed": resumed, "fresh": fresh}


def check_guard(info) -> dict:
    """The distributed step's guard on replicated tables + DDP, device guard against host guard: three
    steps (the second with a NaN in rank 0's inputs), clipping active. Per step: whether the touched rows
    were marked at forward time (and equal the rows with a gradient), the flag, and how far every
    parameter and the optimizers' step counts moved."""
    from train.config import RunConfig
    from train.dist_trainer import build_optimizer
    from train.step_guard import ClippedOptimizer, SkipCounter, global_grad_norm

    schema = load_schema(SCHEMA)
    tasks = list(schema.label_names)
    cfg = RunConfig()
    cfg.optim.lr, cfg.optim.sparse.lr = 0.05, 0.5
    out: dict = {}
    for mode in ("device", "host"):
        pz = par.parallelize(fresh_model(schema), schema, par.ParallelConfig(sparse="replicate", dense="ddp"),
                             info.device, batch_size=ROWS_PER_RANK, loss_tasks=tasks, log=lambda _m: None)
        copt, dparams = build_optimizer(pz, cfg)
        opt = ClippedOptimizer(copt, dparams, 0.05, pz.replicated_sync, device_guard=mode == "device")
        sync = pz.replicated_sync
        skips = SkipCounter()
        steps = []
        for k, seed in enumerate((1, 2, 3)):
            b = local_batch(schema, ROWS_PER_RANK, seed, info.rank, info.world_size)
            if k == 1 and info.rank == 0:
                b.dense[0, 0] = float("nan")
            before = [p.detach().clone() for p in pz.model.parameters()]
            opt.zero_grad(set_to_none=True)
            loss, _ = pz.model(b)
            marked = bool(sync._pending)
            loss.backward()
            masks = [m.clone() for m in sync._masks] if marked else []
            rows_match = all(bool((m == p.grad.view(p.shape[0], -1).ne(0).any(1)).all())
                             for m, p in zip(masks, sync.params) if p.grad is not None) if marked else None
            norm = float(global_grad_norm([p.grad for p in dparams if p.grad is not None], dparams))
            opt.step()
            skips.push(k + 1, opt.last_ok)
            moved = max(float((p.detach() - q).abs().max()) for p, q in zip(pz.model.parameters(), before))
            adam_steps = sorted({float(st["step"]) for st in copt.optimizers[0][1]._optimizer.state.values()})
            steps.append({"ok": bool(opt.last_ok), "norm": norm, "marked_at_forward": marked, "marked_rows_match": rows_match,
                          "moved": moved, "adam_steps": adam_steps})
        out[mode] = {"device_guard": opt.device_guard, "steps": steps, "skipped": skips.poll(wait=True),
                     "params": [p.detach().clone() for p in pz.model.parameters()]}
    diff = max(float((p - q).abs().max()) for p, q in zip(out["device"].pop("params"), out["host"].pop("params")))
    return {**out, "device_vs_host_max_diff": diff, "fsdp": _guard_fsdp(info, schema, tasks, cfg)}


def _guard_fsdp(info, schema, tasks, cfg) -> dict:
    """The device guard with FSDP2 dense blocks (DTensor parameters, a replicated DTensor found_inf) and
    DMP tables (fused update in backward), without MoE: a good step, then a NaN step; dense parameters only."""
    from train.dist_trainer import build_optimizer
    from train.step_guard import ClippedOptimizer

    out: dict = {}
    for mode in ("device", "host"):
        torch.manual_seed(0)
        model = build_model(schema, {**MODEL, "moe": {"num_experts": 0}})
        pz = par.parallelize(model, schema, par.ParallelConfig(), info.device,
                             sparse_optim={"name": "rowwise_adagrad", "lr": 0.05}, batch_size=ROWS_PER_RANK,
                             loss_tasks=tasks, log=lambda _m: None)
        copt, dparams = build_optimizer(pz, cfg)
        opt = ClippedOptimizer(copt, dparams, 0.05, None, device_guard=mode == "device")
        moved, oks = [], []
        for k, seed in enumerate((1, 2)):
            b = local_batch(schema, ROWS_PER_RANK, seed, info.rank, info.world_size)
            if k == 1 and info.rank == 0:
                b.dense[0, 0] = float("nan")
            before = [full(p.detach()).clone() for p in dparams]
            opt.zero_grad(set_to_none=True)
            loss, _ = pz.model(b)
            loss.backward()
            opt.step()
            oks.append(bool(opt.last_ok))
            moved.append(max(float((full(p.detach()) - q).abs().max()) for p, q in zip(dparams, before)))
        out[mode] = {"device_guard": opt.device_guard, "ok": oks, "dense_moved": moved,
                     "dtensor_params": sum(hasattr(p, "device_mesh") for p in dparams),
                     "params": [full(p.detach()).clone() for p in dparams]}
    diff = max(float((p - q).abs().max()) for p, q in zip(out["device"].pop("params"), out["host"].pop("params")))
    return {**out, "device_vs_host_max_diff": diff}


def check_stuck_rank(info) -> dict:
    """The last rank stays alive but skips a collective: the others fail at the group's timeout."""
    import datetime

    group = dist.new_group(timeout=datetime.timedelta(seconds=3))
    out: dict = {}
    if info.rank != info.world_size - 1:
        t0 = time.perf_counter()
        try:
            with tdist.collective_guard("all-reduce", timeout_s=3):
                dist.all_reduce(torch.ones(4), group=group)
            out = {"raised": False, "seconds": time.perf_counter() - t0}
        except tdist.DistributedError as e:
            out = {"raised": True, "seconds": time.perf_counter() - t0, "message": str(e)}
    dist.barrier()  # the default group still works after a timeout on another group
    return out


def check_dead_rank(info) -> dict:
    """The last rank exits in the middle of a step; the others must fail fast with a clear error."""
    schema = load_schema(SCHEMA)
    pz, opt = sharded_model(info, schema)
    b = local_batch(schema, ROWS_PER_RANK, 20, info.rank, info.world_size)
    last = info.world_size - 1
    if info.rank == last:
        pz.model(b)  # forward done, then the process dies before its backward collectives
        os._exit(0)
    t0 = time.perf_counter()
    try:
        with tdist.collective_guard("train step"):
            loss, _ = pz.model(b)
            loss.backward()
            opt.step()
            dist.barrier()
        return {"raised": False, "seconds": time.perf_counter() - t0}
    except tdist.DistributedError as e:
        return {"raised": True, "seconds": time.perf_counter() - t0, "message": str(e)}


CHECKS = {"sharded": check_sharded, "sharded_2d": check_sharded_2d, "ckpt_2d": check_ckpt_2d, "pipeline": check_pipeline, "moe_ep": check_moe_ep,
          "guard": check_guard, "ckpt_save": check_ckpt_save, "ckpt_resume": check_ckpt_resume, "stuck_rank": check_stuck_rank,
          "dead_rank": check_dead_rank}


def _worker(rank: int, nproc: int, out: str, checks: list[str], port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nproc),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc))
    torch.set_num_threads(1)
    info = tdist.setup(device="cpu", timeout_s=float(os.environ.get("GEMTRAIN_TEST_TIMEOUT", "60")))
    os.environ["GEMTRAIN_TEST_OUT"] = out
    results = {}
    for name in checks:
        results[name] = CHECKS[name](info)
        Path(out, f"rank{rank}.json").write_text(json.dumps(results, indent=1, default=str))
    if "dead_rank" in checks:
        os._exit(0)  # the group is broken on purpose: no barrier, no orderly teardown
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
