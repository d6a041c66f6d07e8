"""Parallelism for the GEM model, applied from outside the model code (as torchtitan does).

`parallelize(model, schema, cfg, device)`:

- **Sparse**: torchrec `DistributedModelParallel` shards `model.embeddings.ec` / `.ebc` with the
  planner; per-table constraints come from the schema's `sharding:` (table_wise, row_wise,
  column_wise, grid, data_parallel). The plan is printed and returned (it is saved with checkpoints).
  `sharding_group_size` switches to 2D sparse parallelism (`DMPCollection`: shard inside groups of
  that size, replicate across groups). The tables train with torchrec's fused (in-backward) optimizer.
- **Dense**: FSDP2 `fully_shard` on each dense block (the top-most modules declaring a
  `precision_kind` of attention, mlp or interaction) and then on the root for the remaining
  parameters (norms, heads, input projections; the tables are left out), over a 1D mesh or a 2D
  ("replicate", "shard") mesh (HSDP); `MixedPrecisionPolicy` bf16 params and compute with fp32
  gradient reduction on GPU for the blocks; optional activation checkpointing per block.
  `dense: ddp` replicates instead: torch DDP (composable `replicate`, in place) on the root with the
  tables and expert-parallel MoEs ignored, gradients all-reduced in buckets while backward runs
  (`reduce_dtype: bf16` sends them as bf16). For a dense part of a few MB this moves one copy of
  the gradients per step instead of FSDP2's per-block gathers and reduce-scatters.
- **Tables replicated** (`sparse: replicate`, for GPUs without fbgemm's CUDA kernels): no DMP; after
  backward each rank's touched rows are all-gathered and averaged (`ReplicatedGradSync`: a fixed
  number of collectives; the rows are marked from the batch's ids at forward time and their counts
  reach the host without a read that waits for backward).
- **Experts**: `ExpertParallelMoE` (model/expert_parallel.py) swaps each `MoE` for one that keeps num_experts / ep of
  the experts and moves tokens by all-to-all. Every MoE of a multi-rank run is swapped (also at
  ep = 1), so its load-balance loss uses the routing statistics of the global batch.
- **Loss**: `make_loss_fn` normalises each task by its global (all-reduced) denominator, so the mean
  of the ranks' losses is exactly the single-process loss of the global batch, masked tasks included.
- **Traceable root**: the model's forward is not fx-traceable (it iterates over lookups), which
  torchrec's `TrainPipelineSparseDist` needs up to the sharded modules. `TrainModule` has the
  model's children under the same names (so state-dict keys are unchanged) and a forward that calls
  the sharded EC/EBC on `batch.sparse` and then the rest of the model as one opaque (leaf) module.

Sharding types that torchrec's CPU kernels support (torchrec 1.8, fbgemm-gpu-cpu 1.8): EmbeddingCollection
table_wise / row_wise / column_wise (fused) and data_parallel (dense); EmbeddingBagCollection
table_wise / column_wise / table_column_wise (fused) and data_parallel; no row_wise, table_row_wise or
grid for an EmbeddingBagCollection and no grid at all. data_parallel on CPU failed in a 2-rank trial
(the dense kernel's batch split), so on CPU it is not used either. A table asking for a type the
device lacks falls back (row_wise -> table_wise, grid -> table_column_wise / column_wise,
data_parallel -> table_wise), said in the plan; `strict_sharding: true` makes that an error instead.
2D sparse parallelism: torchrec's `DMPCollection` on CUDA; on CPU `model.dmp_cpu.CpuDMPCollection`
(torchrec 1.8 asserts CUDA in its constructor; the rest runs on gloo). The tables of each replica
group take their own fused update and `Parallelized.after_step` (`sync()`) averages the replicas
after every step, which for SGD equals the single-process update exactly. 2D plans leave out
table_column_wise (`NOT_2D`) and, like 1D plans, are made on rank 0 and broadcast.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import nn

from features.schema import FeatureSchema
from model.expert_parallel import ExpertParallelMoE, _has_moe, apply_expert_parallel  # noqa: F401
from model.replicated_tables import ReplicatedGradSync  # noqa: F401
from model.sharding_plan import (  # noqa: F401
    NOT_2D,
    ParallelConfigError,
    PlanNote,
    describe_plan,
    plan_to_dict,
    table_constraints,
)

DENSE_BLOCK_KINDS = ("attention", "mlp", "interaction")


@dataclass
class ParallelConfig:
    """The `distributed:` section of a run config."""

    sparse: str = "model_parallel"  # model_parallel (DMP shards the tables) | replicate (no DMP)
    sharding_group_size: int = 0  # > 0: 2D sparse parallelism (DMPCollection) with groups this size
    dense: str = "fsdp"  # fsdp | ddp (torch DDP: bucketed all-reduce overlapped with backward)
    reshard_after_forward: bool = True  # fsdp: False keeps each block's gathered parameters until backward
    reduce_dtype: str = "fp32"  # fp32 | bf16: dtype of gradients on the wire (dense; replicated-table rows)
    replicate: int = 1  # HSDP: replicate degree of the ("replicate", "shard") mesh; 1 = plain FSDP
    mixed_precision: str = "auto"  # auto (bf16 on GPU) | bf16 | none
    activation_checkpointing: bool = False
    expert_parallel: int = 1  # experts spread over this many ranks (1: every rank has all experts)
    pipeline: bool = True  # torchrec TrainPipelineSparseDist drives the loop when sharded
    strict_sharding: bool = False  # a schema sharding type the device lacks is an error, not a fallback
    timeout_s: float = 300.0  # every collective fails after this instead of hanging
    planner_batch_size: int = 0  # 0: the train batch size

    @staticmethod
    def from_dict(d: dict[str, Any] | None) -> ParallelConfig:
        d = dict(d or {})
        names = {f.name for f in fields(ParallelConfig)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ParallelConfigError(f"distributed: unknown key(s) {', '.join(unknown)}; allowed: "
                                      + ", ".join(sorted(names)))
        types = {f.name: type(f.default) for f in fields(ParallelConfig)}
        for k, v in list(d.items()):
            d[k] = _coerce(k, v, types[k])
        cfg = ParallelConfig(**d)
        if cfg.sparse not in ("model_parallel", "replicate"):
            raise ParallelConfigError(f"distributed.sparse={cfg.sparse!r}: use model_parallel or replicate")
        if cfg.dense not in ("fsdp", "ddp"):
            raise ParallelConfigError(f"distributed.dense={cfg.dense!r}: use fsdp or ddp")
        if cfg.reduce_dtype not in ("fp32", "bf16"):
            raise ParallelConfigError(f"distributed.reduce_dtype={cfg.reduce_dtype!r}: fp32 or bf16")
        if cfg.mixed_precision not in ("auto", "bf16", "none"):
            raise ParallelConfigError(f"distributed.mixed_precision={cfg.mixed_precision!r}: auto, bf16 or none")
        return cfg


def _coerce(key: str, v: Any, tp: type) -> Any:
    """Values from `--distributed.key=value` overrides arrive as strings."""
    if isinstance(v, tp) and not (tp is int and isinstance(v, bool)):
        return v
    try:
        if tp is bool and isinstance(v, str) and v.lower() in ("true", "false", "1", "0", "yes", "no"):
            return v.lower() in ("true", "1", "yes")
        if tp in (int, float) and not isinstance(v, bool):
            return tp(v)
        if tp is str:
            return str(v)
    except (TypeError, ValueError):
        pass
    raise ParallelConfigError(f"distributed.{key}={v!r}: expected {tp.__name__}")


# ---- the traceable root ------------------------------------------------------------------------


@dataclass
class TrainOutput:
    loss: torch.Tensor  # this rank's loss (detached); the global loss is the mean over ranks
    logits: torch.Tensor
    per_task: dict[str, torch.Tensor]
    aux_loss: torch.Tensor


class _Body(nn.Module):
    """Runs the whole model given the already computed EC/EBC outputs; a leaf for fx (no tables)."""

    def __init__(self, model: nn.Module, loss_fn):
        super().__init__()
        object.__setattr__(self, "_model", model)  # not a child: keeps state-dict keys unchanged
        object.__setattr__(self, "_loss_fn", loss_fn)

    def forward(self, batch, ec_out, ebc_out):
        model = self._model
        emb = model.embeddings
        with _returning(emb.ec, ec_out), _returning(emb.ebc, ebc_out):
            out = model(batch)
        if self._loss_fn is None:
            return out
        return self._loss_fn(out, batch)


@contextlib.contextmanager
def _returning(module: nn.Module | None, value):
    """Inside: calling `module` returns `value` (its output, computed by the root already)."""
    if module is None:
        yield
        return
    had = "forward" in module.__dict__
    saved = module.__dict__.get("forward")
    module.forward = lambda *_a, **_k: value
    try:
        yield
    finally:
        if had:
            module.forward = saved
        else:
            del module.forward


class TrainModule(nn.Module):
    """The model with an fx-traceable forward up to its embedding lookups (for torchrec's pipelines).

    Its children are the model's children (same names, so the same state-dict keys). With
    `loss_fn` set, forward returns `(loss, TrainOutput)`, the form torchrec's train pipelines use;
    without, the model's own output.
    """

    def __init__(self, model: nn.Module, loss_fn=None):
        super().__init__()
        if not hasattr(model, "embeddings") or not hasattr(model.embeddings, "ec"):
            raise ParallelConfigError("parallelize: the model has no `embeddings.ec` / `embeddings.ebc`")
        for name, child in model.named_children():
            self.add_module(name, child)
        if any(True for _ in model.named_parameters(recurse=False)):
            raise ParallelConfigError("parallelize: parameters directly on the model root are not supported; "
                                      "put them in a submodule")
        object.__setattr__(self, "inner", model)
        self._body = _Body(model, loss_fn)

    def set_loss(self, loss_fn) -> None:
        object.__setattr__(self._body, "_loss_fn", loss_fn)

    def forward(self, batch):
        sparse = batch.sparse
        ec = self.embeddings.ec
        ebc = self.embeddings.ebc
        ec_out = ec(sparse) if ec is not None else None
        ebc_out = ebc(sparse) if ebc is not None else None
        return self._body(batch, ec_out, ebc_out)


def make_loss_fn(tasks: list[str], group=None):
    """(ModelOutput, batch) -> (loss, TrainOutput) for one rank of a data-parallel run.

    The multitask loss (model/losses.py: per task sum(mask * weight * bce) / sum(mask * weight)) of
    the GLOBAL batch: the denominators are all-reduced over ranks, and rank r's loss is
    world * (its share of each task's numerator) / (global denominator), so the mean of the ranks'
    losses, whose gradient data parallelism computes, is exactly the single-process loss of the
    global batch, masked tasks included. `TrainOutput.per_task` holds this rank's share of each
    task's global loss (they add up over ranks). The MoE auxiliary loss is added as is (an
    expert-parallel MoE already computes it over the global batch).
    """
    import torch.distributed as dist
    import torch.nn.functional as F

    def loss_fn(out, batch):
        ws = dist.get_world_size(group) if dist.is_initialized() else 1
        logits = out.logits.float()
        bce = F.binary_cross_entropy_with_logits(logits, batch.labels.float(), reduction="none")
        w = batch.label_mask.float() * batch.weights.float()
        num = (bce * w).sum(dim=0)
        den = w.sum(dim=0).detach()
        if ws > 1:
            den = den.clone()
            dist.all_reduce(den, group=group)
        share = torch.where(den > 0, num / den.clamp_min(torch.finfo(torch.float32).tiny), num * 0)
        total = share.sum() * ws
        aux = out.aux_loss
        if isinstance(aux, torch.Tensor):
            total = total + aux.float()
        else:
            aux = torch.zeros((), device=logits.device)
        per_task = {name: share[i].detach() for i, name in enumerate(tasks)}
        return total, TrainOutput(loss=total.detach(), logits=logits.detach(), per_task=per_task, aux_loss=aux.detach())

    return loss_fn


# ---- sparse optimizer ------------------------------------------------------------------------------


def apply_sparse_optimizer(model: nn.Module, name: str, lr: float, eps: float = 1e-8,
                           weight_decay: float = 0.0) -> None:
    """Registers the in-backward (fused) optimizer of the embedding tables before sharding."""
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    emb = model.embeddings
    params = [p for m in (emb.ec, emb.ebc) if m is not None for p in m.parameters()]
    if name == "rowwise_adagrad":
        cls, kw = RowWiseAdagrad, {"lr": lr, "eps": eps, "weight_decay": weight_decay}
    elif name == "adam":
        cls, kw = torch.optim.Adam, {"lr": lr, "eps": eps, "weight_decay": weight_decay}
    elif name == "adagrad":
        cls, kw = torch.optim.Adagrad, {"lr": lr, "eps": eps, "weight_decay": weight_decay}
    elif name == "sgd":
        cls, kw = torch.optim.SGD, {"lr": lr, "weight_decay": weight_decay}
    else:
        raise ParallelConfigError(f"sparse optimizer {name!r}: use rowwise_adagrad, adam, adagrad or sgd")
    apply_optimizer_in_backward(cls, params, kw)


# ---- dense: FSDP2 --------------------------------------------------------------------------------


def dense_blocks(root: nn.Module, keep_out=lambda _m: False) -> list[tuple[str, nn.Module]]:
    """The top-most modules declaring a precision_kind of attention, mlp or interaction that hold
    parameters and no kept-out module (sharded tables, expert-parallel MoEs): one FSDP2 unit each."""
    out: list[tuple[str, nn.Module]] = []

    def visit(prefix: str, m: nn.Module) -> None:
        for name, child in m.named_children():
            if keep_out(child):
                continue
            path = prefix + name
            inner_kept = any(keep_out(x) for x in child.modules())
            if (getattr(child, "precision_kind", None) in DENSE_BLOCK_KINDS and not inner_kept
                    and any(True for _ in child.parameters())):
                out.append((path, child))
            else:
                visit(path + ".", child)

    visit("", root)
    return out


def apply_fsdp(root: nn.Module, mesh, *, mixed_precision: bool, activation_checkpointing: bool,
               keep_out=lambda _m: False, reshard_after_forward: bool = True,
               reduce_dtype: torch.dtype = torch.float32) -> list[str]:
    """fully_shard on each dense block, then on the root for every other parameter (heads, norms,
    input projections) except those of kept-out modules; returns the unit names."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    bf16 = (MixedPrecisionPolicy(param_dtype=torch.bfloat16 if mixed_precision else None, reduce_dtype=reduce_dtype)
            if mixed_precision or reduce_dtype != torch.float32 else None)
    blocks = dense_blocks(root, keep_out)
    names = []
    for path, block in blocks:
        if activation_checkpointing:
            _checkpoint_block(block)
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward,
                    **({"mp_policy": bf16} if bf16 is not None else {}))
        names.append(path)
    ignored = {p for m in root.modules() if keep_out(m) for p in m.parameters()}
    # the root keeps float32 (heads, norms, projections of the inputs); under autocast matmuls run bf16
    fully_shard(root, mesh=mesh, ignored_params=ignored)
    names.append("<root>")
    return names


def apply_ddp(root: nn.Module, device: torch.device, *, activation_checkpointing: bool,
              keep_out=lambda _m: False, bucket_cap_mb: float = 25.0, reduce_bf16: bool = False) -> list[str]:
    """torch DDP on the root, in place (composable `replicate`: module names and state-dict keys
    stay as they are), the kept-out modules (tables, expert-parallel MoEs) ignored. Gradients are
    all-reduced in buckets of `bucket_cap_mb` while backward still runs, with the parameters in
    float32 as on one device (bf16 compute comes from autocast). For a dense part this small,
    replication costs one all-reduce of the gradients instead of FSDP2's gathers per block."""
    from torch.distributed._composable.replicate import replicate

    names = []
    if activation_checkpointing:
        for path, block in dense_blocks(root, keep_out):
            _checkpoint_block(block)
            names.append(path)
    ignored = [m for m in root.modules() if m is not root and keep_out(m)]
    replicate(root, ignored_modules=ignored, device_id=device, bucket_cap_mb=bucket_cap_mb,
              gradient_as_bucket_view=True)
    if reduce_bf16:  # buckets travel as bf16, the average is written back to the float32 gradients
        root.register_comm_hook(None, _bf16_bucket_hook)
    return names + ["<root: ddp>"]


def _bf16_bucket_hook(_state, bucket):
    """DDP comm hook: all-reduce the bucket as bf16 (half the bytes), averaged, back into float32.
    (torch's bf16_compress_hook does the same on NCCL only; this one runs on gloo too.)"""
    import torch.distributed as dist

    buf = bucket.buffer()
    low = buf.to(torch.bfloat16).div_(dist.get_world_size())
    fut = dist.all_reduce(low, async_op=True).get_future()

    def back(f):
        buf.copy_(f.value()[0])
        return buf

    return fut.then(back)


def _checkpoint_block(block: nn.Module) -> None:
    """Recomputes the block's activations in backward (non-reentrant torch.utils.checkpoint)."""
    from torch.utils.checkpoint import checkpoint

    fwd = block.forward

    def forward(*args, **kwargs):
        return checkpoint(fwd, *args, use_reentrant=False, **kwargs)

    block.forward = forward
    block.activation_checkpointed = True


# ---- the entry point ---------------------------------------------------------------------------------


@dataclass
class Parallelized:
    model: nn.Module  # what the trainer calls: DMP(TrainModule) (or the TrainModule when sparse: replicate)
    train_module: TrainModule
    plan: Any = None  # torchrec ShardingPlan (None when the tables are replicated)
    plan_text: str = ""
    plan_dict: dict[str, Any] = field(default_factory=dict)
    mesh: Any = None
    fsdp_units: list[str] = field(default_factory=list)
    sparse_optimizer: Any = None  # DMP's fused optimizer (a torchrec KeyedOptimizer)
    replicated_sync: ReplicatedGradSync | None = None
    notes: list[PlanNote] = field(default_factory=list)
    # called after every optimizer step: 2D sparse parallelism averages the table replicas
    # (weights and optimizer state) over the replica groups (`DMPCollection.sync`)
    after_step: Any = None

    def dense_named_parameters(self) -> dict[str, nn.Parameter]:
        """Trainable parameters outside the embedding tables (for the dense optimizer)."""
        tables = set()
        emb = self.train_module.embeddings
        for m in (emb.ec, emb.ebc):
            if m is not None:
                tables.update(id(p) for p in m.parameters())
        out = {}
        for name, p in self.model.named_parameters():
            if p.requires_grad and id(p) not in tables:
                out[name] = p
        return out


def parallelize(model: nn.Module, schema: FeatureSchema, cfg: ParallelConfig, device: torch.device, *,
                sparse_optim: dict[str, Any] | None = None, batch_size: int = 256,
                loss_tasks: list[str] | None = None, log=print) -> Parallelized:
    """Shards `model` over the default process group (see the module docstring).

    `sparse_optim`: {"name", "lr", "eps", "weight_decay"} of the tables' fused optimizer.
    `loss_tasks`: when given, the returned model computes the multitask loss (torchrec pipeline form).
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ParallelConfigError("parallelize: no process group; call train.distributed.setup() first")
    ws = dist.get_world_size()
    mp = cfg.mixed_precision == "bf16" or (cfg.mixed_precision == "auto" and device.type == "cuda")
    if _has_moe(model):
        # every MoE, also at expert_parallel 1: its load-balance statistics are all-reduced, so the
        # auxiliary loss is that of the global batch, as in a single process
        ep_mesh = build_mesh(device.type, ep=cfg.expert_parallel)
        apply_expert_parallel(model, ep_mesh["ep"].get_group(),
                              ep_mesh["ep_replicate"].get_group() if ws > cfg.expert_parallel else None)
    loss_fn = make_loss_fn(loss_tasks) if loss_tasks is not None else None
    tm = TrainModule(model, loss_fn)
    mesh = build_mesh(device.type, replicate=cfg.replicate)
    emb = tm.embeddings
    tables = [m for m in (emb.ec, emb.ebc) if m is not None]

    def is_ep(m):  # expert-parallel MoEs hold different experts per rank: never FSDP them whole
        return getattr(m, "expert_parallel", False)

    if cfg.sparse == "replicate":
        tm.to(device)
        table_params = [p for m in tables for p in m.parameters()]
        sync = ReplicatedGradSync(table_params, wire_dtype=torch.bfloat16 if cfg.reduce_dtype == "bf16" else None)
        sync.watch(tables)  # touched rows marked from the batch's ids at forward time
        units = _dense_wrap(tm, cfg, mesh, mp, keep_out=lambda m: any(m is t for t in tables) or is_ep(m),
                            device=device)
        log(f"distributed: {ws} ranks, tables replicated (gradients all-reduced), dense units: {len(units)}")
        return Parallelized(model=tm, train_module=tm, mesh=mesh, fsdp_units=units, replicated_sync=sync)

    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DataParallelWrapper, DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    so = sparse_optim or {"name": "sgd", "lr": 0.01}
    # DMP builds its own table shards; copy the model's initial values in so a sharded run starts
    # where a single-process one does (skipped for tables built on the meta device)
    init_tables = {f"embeddings.{n}.{k}": v.detach().clone() for n in ("ec", "ebc")
                   if getattr(emb, n) is not None for k, v in getattr(emb, n).state_dict().items()
                   if not v.is_meta}
    apply_sparse_optimizer(model, so["name"], so["lr"], so.get("eps", 1e-8), so.get("weight_decay", 0.0))
    constraints, notes = table_constraints(schema, device.type, cfg.strict_sharding, two_d=bool(cfg.sharding_group_size))
    sharders = [EmbeddingCollectionSharder(), EmbeddingBagCollectionSharder()]
    group = cfg.sharding_group_size or ws
    if ws % group:
        raise ParallelConfigError(f"distributed.sharding_group_size={group} must divide the world size {ws}")
    local_ws = int(__import__("os").environ.get("LOCAL_WORLD_SIZE", group))
    topology = Topology(world_size=group, compute_device=device.type, local_world_size=min(local_ws, group))
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints,
                                       batch_size=cfg.planner_batch_size or batch_size, debug=False)
    # planned on rank 0 and broadcast (also for 2D, whose plan covers one group): ranks planning on their
    # own can disagree (torchrun's processes break the planner's ties in different orders)
    plan = planner.collective_plan(tm, sharders, dist.GroupMember.WORLD)

    units: list[str] = []

    class _DenseWrapper(DataParallelWrapper):
        def wrap(self, dmp, env, device_):
            from torchrec.distributed.types import ShardedModule

            units.extend(_dense_wrap(tm, cfg, mesh, mp, keep_out=lambda m: isinstance(m, ShardedModule) or is_ep(m),
                                     device=device_))

    if group == ws:
        dmp = DistributedModelParallel(tm, device=device, plan=plan, sharders=sharders,
                                       data_parallel_wrapper=_DenseWrapper())
    else:
        if device.type == "cuda":
            from torchrec.distributed.model_parallel import DMPCollection
        else:  # torchrec asserts CUDA in DMPCollection; the rest of it runs on gloo (model/dmp_cpu.py)
            from model.dmp_cpu import CpuDMPCollection as DMPCollection

        dmp = DMPCollection(module=tm, device=device, plan=plan, world_size=ws, sharding_group_size=group,
                            global_pg=dist.GroupMember.WORLD, sharders=sharders,
                            data_parallel_wrapper=_DenseWrapper())
    if init_tables:
        _load_tables(dmp, init_tables)
    text = describe_plan(plan, notes)
    if dist.get_rank() == 0:
        log(text)
        log(f"distributed: {ws} ranks, sparse: {'2D, groups of ' + str(group) if group != ws else 'model parallel'}, "
            f"dense: {cfg.dense} over mesh {tuple(mesh.shape)} ({len(units)} units), bf16: {mp}")
    return Parallelized(model=dmp, train_module=tm, plan=plan, plan_text=text, plan_dict=plan_to_dict(plan),
                        mesh=mesh, fsdp_units=units, sparse_optimizer=dmp.fused_optimizer, notes=notes,
                        after_step=dmp.sync if group != ws else None)


def _load_tables(dmp: nn.Module, full: dict[str, torch.Tensor]) -> None:
    """Copies full table values into this rank's shards."""
    sd = dmp.state_dict()
    with torch.no_grad():
        for key, value in full.items():
            st = sd.get(key)
            if st is None:
                raise ParallelConfigError(f"parallelize: sharded model has no {key}")
            if hasattr(st, "local_shards"):
                for shard in st.local_shards():
                    o, z = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(value[o[0]:o[0] + z[0], o[1]:o[1] + z[1]])
            elif hasattr(st, "to_local") and hasattr(st.to_local(), "local_shards"):
                # DTensor over torchrec's LocalShardsWrapper (2D sparse / DMPCollection state dicts)
                local = st.to_local()
                for shard, o in zip(local.local_shards(), local.local_offsets()):
                    z = shard.shape
                    shard.copy_(value[o[0]:o[0] + z[0], o[1]:o[1] + z[1]])
            elif hasattr(st, "to_local"):  # DTensor
                from torch.distributed.tensor import distribute_tensor

                st.to_local().copy_(distribute_tensor(value.to(st.device), st.device_mesh, st.placements).to_local())
            else:
                st.copy_(value)


def _dense_wrap(tm: TrainModule, cfg: ParallelConfig, mesh, mp: bool, keep_out, device: torch.device) -> list[str]:
    if cfg.dense == "fsdp":
        return apply_fsdp(tm, mesh, mixed_precision=mp, activation_checkpointing=cfg.activation_checkpointing,
                          keep_out=keep_out, reshard_after_forward=cfg.reshard_after_forward,
                          reduce_dtype=torch.bfloat16 if cfg.reduce_dtype == "bf16" else torch.float32)
    # ddp: the whole dense part replicated, gradients all-reduced in buckets during backward
    return apply_ddp(tm, device, activation_checkpointing=cfg.activation_checkpointing, keep_out=keep_out,
                     reduce_bf16=cfg.reduce_dtype == "bf16")


# ---- meshes ------------------------------------------------------------------------------------------


def build_mesh(device_type: str, *, replicate: int = 1, shard: int | None = None, ep: int | None = None):
    """A DeviceMesh over the world.

    - `build_mesh(t)`: 1D ("shard",) over all ranks (FSDP).
    - `build_mesh(t, replicate=R)`: 2D ("replicate", "shard") of R x world/R (HSDP: shard inside a
      group, replicate across groups).
    - `build_mesh(t, ep=E)`: 2D ("ep_replicate", "ep") of world/E x E; experts are spread over "ep".
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    ws = dist.get_world_size()
    if ep is not None:
        if ep < 1 or ws % ep:
            raise ParallelConfigError(f"distributed.expert_parallel={ep} must divide the world size {ws}")
        return init_device_mesh(device_type, (ws // ep, ep), mesh_dim_names=("ep_replicate", "ep"))
    if shard is None:
        if replicate < 1 or ws % replicate:
            raise ParallelConfigError(f"distributed.replicate={replicate} must divide the world size {ws}")
        shard = ws // replicate
    if replicate * shard != ws:
        raise ParallelConfigError(f"mesh {replicate} x {shard} does not cover the world size {ws}")
    if replicate == 1:
        return init_device_mesh(device_type, (shard,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (replicate, shard), mesh_dim_names=("replicate", "shard"))
