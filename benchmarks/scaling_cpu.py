"""Scaling on CPU with gloo: correctness and communication volume per step at 1, 2, 4 and 8 ranks.

    python benchmarks/scaling_cpu.py [--nprocs 1,2,4,8] [--tiny] [--out scaling.json]

Not a speed benchmark (2 cores run all the ranks): for each world size N the ranks are forked
from this process (heavy imports once) into one gloo process group, and every rank runs each
layout of `model.parallelize.parallelize` for one step on its slice of a global batch:

- ddp: `distributed.dense: ddp` (torch DDP on the dense part: whole-gradient all-reduce in buckets);
- fsdp: FSDP2 over a 1D mesh of N;
- hsdp RxS: FSDP2 over a 2D ("replicate", "shard") mesh (2x2 at 4, 2x4 and 4x2 at 8);
- ep E: like fsdp, with the MoE's experts spread over E ranks (all-to-all dispatch/combine).
Tables: torchrec DMP in every layout (row-wise EmbeddingCollections, table-wise bags, fused SGD).
Model: the tiny schema of the distributed tests, d_model 16, an MoE of 8 experts (top 2).

(a) Correctness: each rank also runs one process on the whole global batch; printed are the largest
|difference| over ranks of the loss (mean of the ranks' losses), the dense gradients, and the tables
after their fused update.

(b) Bytes per step per rank and collective type. A TorchDispatchMode is active for the step
(forward, backward with the fused table update, and the trainer's global gradient-norm all-reduce); every
torch.distributed call, DeviceMesh / FSDP2 collective (all_gather_single, reduce_scatter_single),
torchrec comm op and functional (DTensor) collective reaches the dispatcher as a `c10d::` or
`_c10d_functional::` op, which is where they are counted: one place for every path. Counted is what
this rank RECEIVES from its peers, by the collective's definition, for a group of G ranks:
all_gather: output bytes x (G-1)/G; reduce_scatter: input bytes x (G-1)/G; all_reduce: 2 x bytes x
(G-1)/G (a reduce-scatter then an all-gather, what ring and halving-doubling move); all_to_all: output
bytes minus the part from itself; broadcast: the bytes on every rank but the root. So a 1-rank group
moves 0 and the numbers do not depend on gloo's or NCCL's algorithm choice. "pred" columns: what
FSDP2 must move for the dense parameters (padded shards, float32): all_gather = (S-1)/S x (2 x block
bytes + root bytes) (blocks are re-gathered in backward, the root is not resharded), reduce_scatter =
(S-1)/S x all unit bytes, for shard size S.

(c) Length balancing at 8 ranks (no process group: 8 `Loader`s with rank r of 8 over the same
synthetic data): per step and rank the attention work sum(L^2) over the rank's batch (L: history
length after truncation), the spread max/mean over ranks per step, its mean over the steps, and
the slowest-rank overhead (max/mean - 1); fixed `batch_size` vs `token_budget` (the serpentine
length-balancing batcher, budget = batch_size x mean events per row). The CPU stand-in for the
slowest rank's step time.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torchrec.distributed.model_parallel  # noqa: E402,F401  (import once, before forking)
import torchrec.distributed.planner  # noqa: E402,F401

from features import load_schema  # noqa: E402
from ingest.convert import table_to_batch  # noqa: E402
from ingest.synth import generate_table  # noqa: E402
from model import build_model  # noqa: E402
from model import parallelize as par  # noqa: E402
from train import distributed as tdist  # noqa: E402

SCHEMA = REPO / "tests" / "distributed" / "tiny.yaml"
MODEL = {"d_model": 16, "num_heads": 2, "sequence_encoder": {"num_layers": 1},
         "interaction": {"kind": "dcn", "num_layers": 1}, "top_dim": 16, "head_hidden": 8,
         "moe": {"num_experts": 8, "top_k": 2, "hidden_dim": 16}}
SHARDING = {"item": "row_wise", "category": "row_wise", "user": "table_wise", "ad": "table_wise",
            "interest": "table_wise"}
ROWS_PER_RANK = 4
SPARSE_LR = 0.5
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "other")


# ---- (b) counting collectives at the dispatcher ---------------------------------------------------


def _group(pg):
    """(group size, this rank's index in it) of a c10d ProcessGroup or a functional group name."""
    if isinstance(pg, str):
        from torch.distributed.distributed_c10d import _resolve_process_group

        pg = _resolve_process_group(pg)
    elif isinstance(pg, torch.ScriptObject):  # what the dispatcher hands over
        from torch._C._distributed_c10d import ProcessGroup

        pg = ProcessGroup.unbox(pg)
    return pg.size(), pg.rank()


def _nb(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class CollectiveCounter(TorchDispatchMode):
    """Bytes each collective makes this rank receive from its peers, by collective kind (module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = dict.fromkeys(KINDS, 0)
        self.calls = dict.fromkeys(KINDS, 0)
        self.other_ops: set[str] = set()

    def _add(self, kind: str, n: float) -> None:
        self.bytes[kind] += int(round(n))
        self.calls[kind] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ns = func.namespace
        if ns == "c10d":
            self._c10d(func._opname, args)
        elif ns in ("_c10d_functional", "_c10d_functional_autograd") and func._opname != "wait_tensor":
            self._functional(func._opname, args)
        return func(*args, **kwargs)

    def _c10d(self, op: str, a) -> None:
        if op in ("allreduce_", "allreduce_coalesced_"):
            g, _ = _group(a[1])
            self._add("all_reduce", 2 * sum(_nb(t) for t in a[0]) * (g - 1) / g)
        elif op == "_allgather_base_":
            g, _ = _group(a[2])
            self._add("all_gather", _nb(a[0]) * (g - 1) / g)
        elif op == "allgather_into_tensor_coalesced_":
            g, _ = _group(a[2])
            self._add("all_gather", sum(_nb(t) for t in a[0]) * (g - 1) / g)
        elif op in ("allgather_", "allgather_coalesced_"):
            g, _ = _group(a[2])
            self._add("all_gather", sum(_nb(t) for outs in a[0] for t in outs) * (g - 1) / g)
        elif op == "_reduce_scatter_base_":
            g, _ = _group(a[2])
            self._add("reduce_scatter", _nb(a[1]) * (g - 1) / g)
        elif op == "reduce_scatter_tensor_coalesced_":
            g, _ = _group(a[2])
            self._add("reduce_scatter", sum(_nb(t) for t in a[1]) * (g - 1) / g)
        elif op == "reduce_scatter_":
            g, _ = _group(a[2])
            self._add("reduce_scatter", sum(_nb(t) for ins in a[1] for t in ins) * (g - 1) / g)
        elif op == "alltoall_base_":
            out, pg, out_splits = a[0], a[2], list(a[3])
            g, r = _group(pg)
            row = _nb(out) // max(1, out.shape[0]) if out.dim() else _nb(out)
            own = out_splits[r] * row if out_splits else _nb(out) // g
            self._add("all_to_all", _nb(out) - own)
        elif op == "alltoall_":
            g, r = _group(a[2])
            self._add("all_to_all", sum(_nb(t) for i, t in enumerate(a[0]) if i != r))
        elif op == "broadcast_":
            _, r = _group(a[1])
            self._add("broadcast", 0 if r == a[2] else sum(_nb(t) for t in a[0]))
        elif op != "barrier":
            self.other_ops.add(op)
            self._add("other", sum(_nb(t) for t in a[0] if isinstance(t, torch.Tensor))
                      if isinstance(a[0], (list, tuple)) else 0)

    def _functional(self, op: str, a) -> None:
        name = a[-1]
        if op in ("all_reduce", "all_reduce_coalesced"):
            g, _ = _group(name)
            ts = a[0] if isinstance(a[0], (list, tuple)) else [a[0]]
            self._add("all_reduce", 2 * sum(_nb(t) for t in ts) * (g - 1) / g)
        elif op in ("all_gather_into_tensor", "all_gather_into_tensor_coalesced", "all_gather_into_tensor_out"):
            g, _ = _group(a[2])
            ts = a[0] if isinstance(a[0], (list, tuple)) else [a[0]]
            self._add("all_gather", sum(_nb(t) for t in ts) * (g - 1))
        elif op in ("reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"):
            g, _ = _group(name)
            ts = a[0] if isinstance(a[0], (list, tuple)) else [a[0]]
            self._add("reduce_scatter", sum(_nb(t) for t in ts) * (g - 1) / g)
        elif op == "all_to_all_single":
            t, out_splits = a[0], list(a[1])
            g, r = _group(name)
            row = _nb(t) // max(1, t.shape[0])
            total = sum(out_splits) * row if out_splits else _nb(t)
            own = out_splits[r] * row if out_splits else _nb(t) // g
            self._add("all_to_all", total - own)
        elif op == "broadcast":
            _, r = _group(name)
            self._add("broadcast", 0 if r == a[1] else _nb(a[0]))
        else:
            self.other_ops.add(op)
            self._add("other", 0)


# ---- (a) one step against one process -------------------------------------------------------------


def tiny_schema():
    s = load_schema(SCHEMA)
    tables = tuple(dataclasses.replace(t, sharding=SHARDING.get(t.name, t.sharding)) for t in s.tables)
    return dataclasses.replace(s, tables=tables)


def fresh_model(schema, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(schema, MODEL)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _is_table(name: str) -> bool:
    return name.startswith(("embeddings.ec.", "embeddings.ebc."))


def fsdp_prediction(tm: torch.nn.Module) -> dict[str, int]:
    """Bytes FSDP2 must move per rank per step for the dense parameters (padded float32 shards)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    units = [m for m in tm.modules() if isinstance(m, FSDPModule)]
    nested = {id(p) for u in units if u is not tm for p in u.parameters()}
    ag = rs = ar = 0.0
    for u in units:
        params = [p for p in u.parameters() if isinstance(p, DTensor)
                  and (u is not tm or id(p) not in nested)]
        if not params:
            continue
        mesh = params[0].device_mesh
        names = mesh.mesh_dim_names or ("shard",)
        s = mesh.size(names.index("shard")) if "shard" in names else mesh.size(0)
        r = mesh.size(names.index("replicate")) if "replicate" in names else 1
        padded = 0
        for p in params:
            rows = p.shape[0] if p.dim() else 1
            rest = p.numel() // max(1, rows)
            padded += -(-rows // s) * s * rest * p.element_size()
        gathers = 1 if u is tm else 2
        ag += gathers * padded * (s - 1) / s
        rs += padded * (s - 1) / s
        ar += 2 * (padded / s) * (r - 1) / r
    return {"all_gather": int(round(ag)), "reduce_scatter": int(round(rs)), "replicate_all_reduce": int(round(ar))}


def _ep_ref_names(tm: torch.nn.Module) -> dict[str, str]:
    """Expert-parallel parameter name (local expert index) -> the single-process name (global index)."""
    out = {}
    for path, m in tm.named_modules():
        if isinstance(m, par.ExpertParallelMoE):
            for i in range(m.local):
                for n, _ in m.experts[i].named_parameters():
                    out[f"{path}.experts.{i}.{n}"] = f"{path}.experts.{m.first + i}.{n}"
    return out


def run_layout(info, layout: dict) -> dict:
    from model.losses import multitask_loss
    from train.step_guard import global_grad_norm

    schema = tiny_schema()
    tasks = list(schema.label_names)
    n = info.world_size
    model = fresh_model(schema)
    ref = copy.deepcopy(model)
    g = generate_table(schema, ROWS_PER_RANK * n, seed=1)
    gb = table_to_batch(g, schema)
    lb = table_to_batch(g.slice(info.rank * ROWS_PER_RANK, ROWS_PER_RANK), schema)
    out = ref(gb)
    total, _ = multitask_loss(out.logits.float(), gb.labels, gb.label_mask, gb.weights, tasks)
    loss_ref = total + out.aux_loss.float()
    loss_ref.backward()
    loss_ref = loss_ref.detach()
    ref_params = dict(ref.named_parameters())
    ref_tables = {k: (p - SPARSE_LR * p.grad).detach() for k, p in ref_params.items() if _is_table(k)}

    cfg = par.ParallelConfig(dense=layout.get("dense", "fsdp"), replicate=layout.get("replicate", 1),
                             expert_parallel=layout.get("ep", 1))
    pz = par.parallelize(model, schema, cfg, info.device, sparse_optim={"name": "sgd", "lr": SPARSE_LR},
                         batch_size=ROWS_PER_RANK, loss_tasks=tasks, log=lambda _m: None)
    dense = pz.dense_named_parameters()
    dist.barrier()
    counter = CollectiveCounter()
    with counter:
        loss, _ = pz.model(lb)
        loss.backward()
        grads = [p.grad for p in dense.values() if p.grad is not None]
        global_grad_norm(grads, list(dense.values()))
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    mean_loss /= n
    ep_names = _ep_ref_names(pz.train_module)
    grad_err, compared, missing = 0.0, 0, []
    for name in sorted(dense):
        p = dense[name]
        rname = ep_names.get(name, name)
        if p.grad is None or rname not in ref_params or ref_params[rname].grad is None:
            missing.append(name)
            continue
        grad_err = max(grad_err, float((_full(p.grad) - ref_params[rname].grad).abs().max()))
        compared += 1
    table_err = 0.0
    sd = pz.model.state_dict()
    for key, want in ref_tables.items():
        st = sd[key]
        if hasattr(st, "local_shards"):
            for shard in st.local_shards():
                o, z = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                table_err = max(table_err, float((shard.tensor - want[o[0]:o[0] + z[0], o[1]:o[1] + z[1]]).abs().max()))
        else:
            table_err = max(table_err, float((_full(st) - want).abs().max()))
    ref_grad_count = sum(1 for k, p in ref_params.items() if not _is_table(k) and p.grad is not None)
    return {"loss_ref": float(loss_ref), "loss_err": abs(float(mean_loss) - float(loss_ref)),
            "grad_err": grad_err, "table_err": table_err, "grads_compared": compared, "missing": missing,
            "ref_dense_grads": ref_grad_count, "bytes": counter.bytes, "calls": counter.calls,
            "other_ops": sorted(counter.other_ops), "pred": fsdp_prediction(pz.train_module)}


def layouts_for(n: int) -> dict[str, dict]:
    out = {"ddp": {"dense": "ddp"}, "fsdp": {}}
    for r in (2, 4):
        if n >= 4 and n % r == 0 and n // r >= 2:
            out[f"hsdp {r}x{n // r}"] = {"replicate": r}
    out[f"ep {n}"] = {"ep": n}
    if n == 8:
        out["ep 4 (x2 replicas)"] = {"ep": 4}
    return out


def _worker(rank: int, nproc: int, out: str, port: int, names: list[str] | None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nproc),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc))
    torch.set_num_threads(1)
    info = tdist.setup(device="cpu", timeout_s=300)
    if nproc == 1 and not dist.is_initialized():  # setup() makes no group for one process: make a 1-rank one
        dist.init_process_group("gloo", rank=0, world_size=1)
        info = tdist.setup(device="cpu", timeout_s=300)
    results = {}
    for name, layout in layouts_for(nproc).items():
        if names and name.split()[0] not in names:
            continue
        t0 = time.perf_counter()
        results[name] = run_layout(info, layout)
        results[name]["seconds"] = time.perf_counter() - t0
        Path(out, f"n{nproc}.rank{rank}.json").write_text(json.dumps(results, indent=1))
    dist.barrier()
    tdist.teardown()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(n: int, out: str, names: list[str] | None = None) -> dict[str, list[dict]]:
    """Runs every layout at world size n; {layout: [rank 0 result, rank 1 result, ...]}."""
    mp.start_processes(_worker, args=(n, out, _free_port(), names), nprocs=n, start_method="fork", join=True)
    per_rank = [json.loads(Path(out, f"n{n}.rank{r}.json").read_text()) for r in range(n)]
    return {name: [p[name] for p in per_rank] for name in per_rank[0]}


# ---- (c) the length-balancing batcher at 8 ranks ---------------------------------------------------


def balance(schema, data: str, ranks: int, batch_size: int, token_budget: int | None, steps: int) -> dict:
    """Per step, per rank sum(L^2) and sum(L) of the loader's batches; spreads max/mean over ranks."""
    from ingest.loader import Loader, LoaderConfig

    work, tokens, rows = [], [], []
    for r in range(ranks):
        cfg = LoaderConfig(url=data, batch_size=batch_size, token_budget=token_budget, shuffle=True, seed=0,
                           num_threads=0, prefetch=0, epochs=1)
        w, t, n = [], [], []
        for b in Loader(schema, cfg, rank=r, world_size=ranks):
            lens = torch.cat([torch.diff(o) for o in b.seq_offsets.values()]).double()
            w.append(float((lens ** 2).sum()))
            t.append(float(lens.sum()))
            n.append(b.batch_size)
        work.append(w)
        tokens.append(t)
        rows.append(n)
    k = min(min(len(w) for w in work), steps)

    def spread(x):
        per_step = [max(x[r][s] for r in range(ranks)) / (sum(x[r][s] for r in range(ranks)) / ranks)
                    for s in range(k)]
        return sum(per_step) / k, max(per_step)

    (w_mean, w_max), (t_mean, t_max) = spread(work), spread(tokens)
    return {"steps": k, "batches_per_rank": [len(w) for w in work], "work_spread": w_mean, "work_spread_max": w_max,
            "token_spread": t_mean, "token_spread_max": t_max,
            "rows_per_batch": sum(sum(n[:k]) for n in rows) / (k * ranks)}


def run_balance(tiny: bool, ranks: int) -> dict:
    from ingest.synth import write_synthetic

    if tiny:
        s = load_schema(SCHEMA)
        seqs = tuple(dataclasses.replace(q, max_length=256) for q in s.sequences)
        schema, batch, steps, label = dataclasses.replace(s, sequences=seqs), 8, 8, "tiny (history max 256)"
    else:
        schema, batch, steps, label = load_schema(REPO / "schemas" / "gem_medium.yaml"), 32, 32, "gem_medium"
    rows = ranks * batch * steps
    with tempfile.TemporaryDirectory() as d:
        write_synthetic(schema, d, rows, seed=3, files=ranks, row_group_rows=batch * steps // 4)
        fixed = balance(schema, d, ranks, batch, None, steps)
        events = _mean_events(schema, d)
        budget = int(round(batch * events))
        token = balance(schema, d, ranks, 4 * batch, budget, steps)
    return {"schema": label, "ranks": ranks, "rows": rows, "batch_size": batch, "token_budget": budget,
            "mean_events_per_row": events, "fixed": fixed, "token": token}


def _mean_events(schema, data: str) -> float:
    from ingest.loader import Loader, LoaderConfig

    ev = n = 0
    for b in Loader(schema, LoaderConfig(url=data, batch_size=1024, shuffle=False, num_threads=0, prefetch=0)):
        ev += sum(int(o[-1]) for o in b.seq_offsets.values())
        n += b.batch_size
    return ev / max(1, n)


# ---- the table -----------------------------------------------------------------------------------


def _fmt_bytes(vals: list[int]) -> str:
    lo, hi, mean = min(vals), max(vals), sum(vals) / len(vals)
    s = f"{mean:,.0f}"
    return s if lo == hi else f"{s} ({lo:,}-{hi:,})"


def table(results: dict[int, dict[str, list[dict]]], bal: dict | None) -> list[str]:
    lines = ["| N | layout | loss err | dense grad err | table err | all_reduce B | reduce_scatter B | "
             "all_gather B (pred) | all_to_all B | broadcast B | other | HSDP all_reduce over fsdp (pred) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, by_layout in results.items():
        for name, ranks in by_layout.items():
            b = {k: [r["bytes"][k] for r in ranks] for k in KINDS}
            pred = ranks[0]["pred"]
            ag = f"{_fmt_bytes(b['all_gather'])} ({pred['all_gather']:,})"
            rs = f"{_fmt_bytes(b['reduce_scatter'])} ({pred['reduce_scatter']:,})"
            rep = "-"
            if name.startswith("hsdp") and "fsdp" in by_layout:  # the replicate-dim all-reduce FSDP2 adds
                extra = [r["bytes"]["all_reduce"] - f["bytes"]["all_reduce"] for r, f in zip(ranks, by_layout["fsdp"])]
                rep = f"{_fmt_bytes(extra)} ({pred['replicate_all_reduce']:,})"
            lines.append(f"| {n} | {name} | {max(r['loss_err'] for r in ranks):.1e} | "
                         f"{max(r['grad_err'] for r in ranks):.1e} | {max(r['table_err'] for r in ranks):.1e} | "
                         f"{_fmt_bytes(b['all_reduce'])} | {rs} | {ag} | {_fmt_bytes(b['all_to_all'])} | "
                         f"{_fmt_bytes(b['broadcast'])} | {_fmt_bytes(b['other'])} | {rep} |")
    if bal:
        f, t = bal["fixed"], bal["token"]
        lines += ["", f"Length balancing at {bal['ranks']} ranks ({bal['schema']}, {bal['rows']} rows, "
                      f"{bal['mean_events_per_row']:.0f} events/row): attention work sum(L^2) per rank per step, "
                      "max/mean over ranks",
                  "| batching | steps | rows/batch | sum L^2 max/mean (mean over steps) | worst step | "
                  "slowest-rank overhead | sum L max/mean |", "|---|---|---|---|---|---|---|"]
        for label, r in ((f"fixed {bal['batch_size']} rows", f),
                         (f"token budget {bal['token_budget']:,} (<= {4 * bal['batch_size']} rows)", t)):
            lines.append(f"| {label} | {r['steps']} | {r['rows_per_batch']:.1f} | {r['work_spread']:.3f} | "
                         f"{r['work_spread_max']:.3f} | {100 * (r['work_spread'] - 1):.1f}% | {r['token_spread']:.3f} |")
        cut = (t["work_spread"] - 1) / (f["work_spread"] - 1) if f["work_spread"] > 1 else float("nan")
        lines.append(f"\nslowest-rank overhead, token budget / fixed: {cut:.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nprocs", default="1,2,4,8")
    ap.add_argument("--layouts", default="", help="comma-separated layout kinds (ddp,fsdp,hsdp,ep); default all")
    ap.add_argument("--balance-ranks", type=int, default=8)
    ap.add_argument("--tiny", action="store_true", help="small data for the balancing part (CI)")
    ap.add_argument("--no-balance", action="store_true")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    names = [x for x in a.layouts.split(",") if x] or None
    t0 = time.perf_counter()
    results: dict[int, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory() as d:
        for n in (int(x) for x in a.nprocs.split(",")):
            results[n] = run_world(n, d, names)
            print(f"# N={n}: {time.perf_counter() - t0:.0f} s", flush=True)
    bal = None if a.no_balance else run_balance(a.tiny, a.balance_ranks)
    lines = [f"# scaling on CPU (gloo), torch {torch.__version__}, {ROWS_PER_RANK} rows/rank, "
             f"{time.perf_counter() - t0:.0f} s", *table(results, bal)]
    print("\n".join(lines), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"worlds": {str(k): v for k, v in results.items()}, "balance": bal,
                                           "table": lines}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
