"""`Trainer.fit()` on several processes (started by torchrun / `gemtrain launch`).

The Trainer calls `fit_distributed(trainer)` when WORLD_SIZE > 1. This module reuses the trainer's
config, schema, model, data and logging, and adds what a sharded run needs:

- the process group (train/distributed.py) and `model.parallelize.parallelize` (torchrec DMP for
  the tables, FSDP2 for the dense blocks; or the tables replicated with `distributed.sparse: replicate`);
- the optimizers: AdamW for the dense parameters (the trainer's LR schedule and gradient clipping)
  and torchrec's fused in-backward optimizer for sharded tables (`optim.sparse`), one
  `CombinedOptimizer`, so checkpoints key the state by parameter name;
- the loop: torchrec `TrainPipelineSparseDist` when the tables are sharded and
  `distributed.pipeline` is on (input all-to-all and copies overlap compute), else a plain loop;
- each rank reads its own slice of the data (`Loader(rank, world_size)`); the loader state (global)
  is saved with the checkpoint, taken after exactly the batches trained on (the pipeline reads ahead);
- logs aggregated across ranks: the global-batch loss, global examples/s over the slowest rank,
  the per-rank step-time spread (min/mean/max and the slowest rank: load imbalance);
- checkpoints via train/dist_checkpoint.py (DCP, any world size), and held-out metrics computed
  on rank 0 from every rank's predictions.

Non-finite steps: the update is skipped on every rank (the gradient norm is global), on the device
(fused AdamW's `found_inf`; replicated tables' rows zeroed), and the flag is read on the host a step
or two later without blocking (`SkipCounter`): the step is counted, logged and training stops after
`train.nan_guard_max` of them, up to two steps after the one that reached it. The fused table update
of sharded tables has already happened in backward. No per-step host read: the window's loss is
summed on the device and read at log time.
"""

from __future__ import annotations

import collections
import json
import math
import os
import sys
import time
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

from train import distributed as tdist


class _ClippedOptimizer:
    """The combined optimizer with the trainer's gradient clipping and NaN guard in `step()`
    (torchrec's pipeline calls `step()` itself).

    Device guard (the default, when every optimizer can skip a step on the device): no host read.
    The gradient norm, the clipping factor `clamp(clip / (norm + 1e-6), max=1)` (as `clip_grad_norm_`)
    and the finite flag stay on the device; a non-finite step sets `found_inf` on the fused dense
    optimizers (the update and its step count are skipped inside the kernel), zeroes the replicated
    tables' touched rows (their row-wise Adagrad step is then a no-op) and `last_ok` is the device flag,
    which the loop reads later without blocking (`SkipCounter`). Sharded tables take their fused
    update in backward either way. Host guard (`device_guard=False`, or an optimizer that cannot skip on
    the device): the norm is read on the host and the update skipped there; `last_ok` is a bool.
    `distributed=False`: the norm of this process's gradients only (a single-GPU step; benchmarks).
    """

    def __init__(self, opt, dense_params, clip: float, replicated_sync=None, after_step=None, *,
                 distributed: bool = True, device_guard: bool = True):
        self.opt, self.dense_params, self.clip, self.sync = opt, dense_params, clip, replicated_sync
        self.after_step = after_step  # 2D sparse parallelism: average the table replicas
        self.distributed = distributed
        self.last_ok: bool | torch.Tensor = True
        self.param_groups = opt.param_groups
        self._skippers: list[tuple[torch.optim.Optimizer, Any]] = []  # take `found_inf` (fused Adam / AdamW)
        self.device_guard = device_guard and self._find_skippers()

    def _find_skippers(self) -> bool:
        """Whether a step can be skipped on the device by every optimizer (collects those taking found_inf)."""
        for name, o in getattr(self.opt, "optimizers", [("dense", self.opt)]):
            inner = getattr(o, "_optimizer", o)
            if isinstance(inner, torch.optim.Optimizer) and all(g.get("fused") for g in inner.param_groups):
                meshes = {getattr(p, "device_mesh", None) for g in inner.param_groups for p in g["params"]}
                if len(meshes) > 1:  # DTensor (FSDP2) and plain parameters in one kernel: no one found_inf fits
                    return False
                self._skippers.append((inner, meshes.pop() if meshes else None))
            elif name == "sparse" and self.sync is None:
                continue  # sharded tables: torchrec's fused update ran in backward
            elif name == "sparse" and all(g.get("weight_decay", 0) == 0 and g.get("lr_decay", 0) == 0
                                          for g in getattr(inner, "param_groups", [{"weight_decay": 1}])):
                continue  # replicated tables: zeroed rows make a decay-free (row-wise) Adagrad step a no-op
            else:
                return False
        return True

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.opt.zero_grad(set_to_none=set_to_none)

    def _norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        if self.distributed:
            return global_grad_norm(grads, self.dense_params)
        return torch.nn.utils.get_total_norm(grads, 2.0)

    @staticmethod
    def _local(grads: list[torch.Tensor]) -> list[torch.Tensor]:
        from torch.distributed.tensor import DTensor

        # in place on the local shards (a list may mix DTensor and plain gradients)
        return [g.to_local() if isinstance(g, DTensor) else g for g in grads]

    def step(self, closure=None) -> None:
        grads = [p.grad for p in self.dense_params if p.grad is not None]
        norm = self._norm(grads) if grads else None
        if self.device_guard:
            ok = torch.isfinite(norm) if norm is not None else None
            if norm is not None and self.clip > 0:
                coef = torch.clamp(self.clip / (norm + 1e-6), max=1.0).float()
                torch._foreach_mul_(self._local(grads), coef)
            if self.sync is not None:
                self.sync.sync(ok)
            if ok is not None:
                from torch.distributed.tensor import DTensor, Replicate

                found = (~ok).float()
                for o, mesh in self._skippers:  # FSDP2's DTensor parameters take a replicated DTensor flag
                    o.grad_scale, o.found_inf = None, found if mesh is None else DTensor.from_local(
                        found, mesh, [Replicate()] * mesh.ndim, run_check=False)
            self.opt.step()
            self.last_ok = ok if ok is not None else True
        else:
            counts = self.sync.counts() if self.sync is not None else None
            n = float(norm) if norm is not None else 0.0  # the host read
            ok = math.isfinite(n)
            if self.sync is not None:
                self.sync.finish(counts)
            if ok and self.clip > 0 and n > self.clip:
                torch._foreach_mul_(self._local(grads), self.clip / (n + 1e-6))
            self.last_ok = ok
            if ok:
                self.opt.step()
        if self.after_step is not None:  # the fused table update happened in backward either way
            self.after_step()

    def state_dict(self):
        return self.opt.state_dict()

    def load_state_dict(self, sd) -> None:
        self.opt.load_state_dict(sd)

    def init_state(self) -> None:
        for o, _mesh in self._skippers:  # torchrec steps once on zero gradients to create the state
            o.found_inf = None
        self.opt.init_state()


class SkipCounter:
    """The NaN guard's count from each step's finite flag, read without making the host wait.

    `push(step, ok)` starts a non-blocking copy of the device flag (CUDA: pinned memory and an event);
    `poll()` returns the skipped steps among the flags that have arrived, waiting only for flags more
    than `max_lag` steps old, so a skipped step is counted at most `max_lag` steps after it ran (its
    update was skipped on the device at once). `poll(wait=True)` reads them all (logs, checkpoints, end).
    """

    def __init__(self, max_lag: int = 2):
        self.max_lag = max_lag
        self._queue: collections.deque = collections.deque()  # (step, flag on the host, event or None)

    def push(self, step: int, ok: bool | torch.Tensor) -> None:
        if isinstance(ok, torch.Tensor) and ok.device.type == "cuda":
            host = torch.empty((), dtype=torch.bool, pin_memory=True)
            host.copy_(ok, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            self._queue.append((step, host, ev))
        else:
            self._queue.append((step, bool(ok), None))

    def poll(self, wait: bool = False) -> list[int]:
        out = []
        while self._queue:
            step, flag, ev = self._queue[0]
            if ev is not None:
                if not (wait or len(self._queue) > self.max_lag or ev.query()):
                    break
                ev.synchronize()
            self._queue.popleft()
            if not bool(flag):
                out.append(step)
        return out


def global_grad_norm(grads: list[torch.Tensor], params: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of the whole (sharded) gradient, the same on every rank (a device scalar; no sync).

    FSDP2 DTensor gradients: each rank's shard counted once (shards replicated over an HSDP
    "replicate" dim divided by that size); expert-parallel experts: counted once per replica set;
    gradients already identical on every rank (DDP, all-reduced by hooks): counted once, locally
    (with no sharded parameter at all, no collective).
    Norms are taken per group with the fused (foreach) kernels, as `clip_grad_norm_` does.
    """
    from torch.distributed.tensor import DTensor, Replicate

    replicas = {id(p.grad): getattr(p, "_ep_replicas", None) for p in params if p.grad is not None}
    shared: dict[float, list[torch.Tensor]] = {}  # divisor -> tensors whose squares are summed over ranks
    local: list[torch.Tensor] = []
    for g in grads:
        if isinstance(g, DTensor):
            rep = 1
            for size, pl in zip(g.device_mesh.shape, g.placements):
                if isinstance(pl, Replicate):
                    rep *= size
            shared.setdefault(float(rep), []).append(g.to_local())
        elif replicas.get(id(g)):
            shared.setdefault(float(replicas[id(g)]), []).append(g)
        else:
            local.append(g)
    dev = (local or [t for ts in shared.values() for t in ts])[0].device

    def sq(ts: list[torch.Tensor]) -> torch.Tensor:
        return torch.nn.utils.get_total_norm(ts, 2.0).double().pow(2) if ts else torch.zeros(
            (), dtype=torch.float64, device=dev)

    summed = torch.zeros((), dtype=torch.float64, device=dev)
    for rep, ts in shared.items():
        summed = summed + sq(ts) / rep
    # every rank, even with nothing shared here, when any parameter is sharded (the same on every rank);
    # none (DDP alone): the norm is local, and the step has one rendezvous fewer
    sharded = any(isinstance(p, DTensor) or getattr(p, "_ep_replicas", None) for p in params)
    if sharded and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(summed)
    return (summed + sq(local)).sqrt()


def build_optimizer(pz, cfg):
    emb = pz.train_module.embeddings
    tables = None
    if pz.sparse_optimizer is None:  # replicated tables: the trainer's (non-fused) table optimizer
        tables = {f"embeddings.{n}.{k}": p for n in ("ec", "ebc") if getattr(emb, n) is not None
                  for k, p in getattr(emb, n).named_parameters()}
    dense = pz.dense_named_parameters()
    return combined_optimizer(dense, tables, cfg, pz.sparse_optimizer), list(dense.values())


def combined_optimizer(dense: dict, tables: dict | None, cfg, sharded_tables=None):
    """One torchrec `CombinedOptimizer`: "dense" (AdamW, fused where the parameters allow: one kernel
    group, and it can skip a non-finite step on the device) and "sparse" (torchrec's fused table optimizer of a sharded run, or,
    for `tables` given, row-wise Adagrad / Adam over them after the gradient exchange)."""
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    o = cfg.optim
    # the fused kernel takes one kind of tensor: FSDP2's DTensors on one mesh, or plain tensors (a mix, as
    # FSDP2 blocks beside expert-parallel experts, keeps the foreach AdamW and the host guard)
    fused = len({getattr(p, "device_mesh", None) for p in dense.values()}) <= 1
    opts = [("dense", KeyedOptimizerWrapper(dense, lambda ps: torch.optim.AdamW(
        ps, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay, fused=fused or None)))]
    if sharded_tables is not None:
        opts.append(("sparse", sharded_tables))
    elif tables:
        s = o.sparse
        if s.name == "rowwise_adagrad":
            factory = lambda ps: RowWiseAdagrad(ps, lr=s.lr, eps=s.eps, weight_decay=s.weight_decay)
        else:
            factory = lambda ps: torch.optim.Adam(ps, lr=s.lr, eps=s.eps, weight_decay=s.weight_decay, fused=True)
        opts.append(("sparse", KeyedOptimizerWrapper(tables, factory)))
    return CombinedOptimizer(opts)


class _StatefulIter:
    """Iterates the loader and keeps the loader state after each batch that a checkpoint will need."""

    def __init__(self, loader, device, want_state, start_index: int = 0):
        self.loader, self.device, self.want = loader, device, want_state
        self.it = iter(loader)
        self.index = start_index
        self.states: dict[int, Any] = {}
        self.taken: collections.deque = collections.deque()  # (events, padding stats) of batches read ahead
        self.transform = None  # the run ledger's batch hook (train/ledger.py)

    def __iter__(self):
        return self

    def __next__(self):
        from train.data import real_events

        b = next(self.it)
        if self.device.type != "cpu":  # per-key offsets as host lists (computed on the device, a sync per step)
            b.sparse.offset_per_key()
        if self.transform is not None:
            b = self.transform(b)
        self.index += 1  # batches taken so far
        self.taken.append((real_events(b), b.stats))
        if self.want(self.index):
            self.states[self.index] = self.loader.state_dict()
        return b if self.device.type == "cpu" else b.to(self.device, non_blocking=True)


def count_skipped(tr, skips: SkipCounter, log, wait: bool = False) -> None:
    """Adds the skipped steps whose flags have arrived to `tr.skipped`, logs each, and stops training
    (`TrainingStopped`) once `train.nan_guard_max` is reached."""
    from train.trainer import TrainingStopped

    limit = tr.cfg.train.nan_guard_max
    for s in skips.poll(wait):
        tr.skipped += 1
        log(f"step {s}: non-finite gradients; update skipped ({tr.skipped} of at most {limit}; sharded "
            "tables take their fused update in backward regardless)")
        if tr.skipped >= limit:
            raise TrainingStopped(f"training stopped at step {tr.step}: {tr.skipped} non-finite steps, the last at "
                                  f"step {s} (train.nan_guard_max={limit}); check the data for NaN/Inf values, "
                                  "or lower optim.lr")


def init_distributed(cfg) -> torch.device:
    """Joins the process group (the `distributed.timeout_s` of the run config); returns this rank's device."""
    from model.parallelize import ParallelConfig

    pcfg = ParallelConfig.from_dict(getattr(cfg, "distributed", None))
    info = tdist.setup(cfg.train.device, pcfg.timeout_s)
    if not info.is_main:  # one summary on stdout, from rank 0 (stderr stays: errors of every rank)
        sys.stdout.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # at the descriptor: also `print(file=<the old sys.stdout>)`
        os.close(devnull)
    return info.device


def fit_distributed(tr) -> dict:
    from model.parallelize import ParallelConfig, parallelize
    from train import checkpoint as ckpt
    from train import dist_checkpoint as dckpt
    from train import ledger
    from train.data import ensure_synthetic
    from train.trainer import lr_factor

    c = tr.cfg
    tr.data_wait = None  # the pipelined loop overlaps data waits with its other stages: not measured apart
    tr.log_time = None  # its log lines wait on collectives: not measured apart
    pcfg = ParallelConfig.from_dict(getattr(c, "distributed", None))
    info = tdist.setup(c.train.device, pcfg.timeout_s)
    main = info.is_main
    log = tr.log if main else (lambda _m: None)
    t_start = time.perf_counter()
    if main:
        ensure_synthetic(c, tr.schema, log)
    dist.barrier()
    pz = parallelize(tr.model, tr.schema, pcfg, info.device, sparse_optim=asdict(c.optim.sparse),
                     batch_size=c.train.batch_size, loss_tasks=tr.tasks, log=log)
    tr.model = pz.model
    opt, dense_params = build_optimizer(pz, c)
    opt = _ClippedOptimizer(opt, dense_params, c.optim.clip_grad_norm, pz.replicated_sync, pz.after_step)
    tr.optimizer = opt
    if c.train.device in ("auto",) or c.train.device.startswith("cuda"):
        tr.device = info.device
    autocast = info.device.type == "cuda" and c.train.bf16

    # ---- resume ---------------------------------------------------------------------------------
    loader_state = None
    if tr.resume:
        latest = ckpt.latest_checkpoint(tr.run_dir)
        if latest is None:
            log(f"resume: no complete checkpoint under {tr.run_dir}; starting from step 0")
        else:
            opt.init_state()
            opt.zero_grad(set_to_none=True)
            sd, osd = pz.model.state_dict(), opt.state_dict()
            st = dckpt.load(latest, sd, osd, sparse_name=c.optim.sparse.name)
            pz.model.load_state_dict(sd)
            opt.load_state_dict(osd)
            tr.step, tr.skipped = st["step"], st.get("skipped", 0)
            tr.examples_seen, tr.events_seen = st.get("examples_seen", 0), st.get("events_seen", 0)
            tr.train_time = st.get("train_time", 0.0)
            loader_state = st.get("loader")
            log(f"resumed from {latest} (step {tr.step}, saved at world size "
                f"{json.loads((latest / ckpt.MARKER).read_text()).get('world_size', '?')}, now {info.world_size})")
    if main:
        tr._open_logs()

    from train.data import make_loader

    loader = make_loader(tr.schema, c, c.data.train_url, batch_size=c.train.batch_size, shuffle=True,
                         epochs=c.data.epochs, seed=c.train.seed, rank=info.rank, world_size=info.world_size)
    if loader_state is not None:
        loader.load_state_dict(loader_state)
    total, every = c.train.steps, c.train.checkpoint_every
    start = tr.step

    def want_state(batches_taken: int) -> bool:  # the state after the batch that step `start + k` trains on
        s = start + batches_taken
        return s == total or (every > 0 and s % every == 0)

    data = _StatefulIter(loader, info.device, want_state)
    data.transform = ledger.attach(tr, loader)  # rows.rank<r>.jsonl and ledger.rank<r>.json (train/ledger.py)
    pipeline = None
    if pcfg.pipeline and pz.plan is not None:
        from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

        pipeline = TrainPipelineSparseDist(pz.model, opt, info.device, execute_all_batches=True)

    def save(step: int) -> None:
        state = {"step": step, "skipped": tr.skipped, "examples_seen": tr.examples_seen,
                 "events_seen": tr.events_seen, "train_time": tr.train_time, "padding": tr.padding,
                 "loader": data.states.pop(step - start, None), "rng": ckpt.rng_state(torch.device("cpu")),
                 "world_size": info.world_size, "distributed": asdict(pcfg)}
        path = dckpt.save(tr.run_dir, step, pz.model.state_dict(), opt.state_dict(), state,
                          c.checkpoint.keep_last, plan=pz.plan_dict or None,
                          sparse_name=c.optim.sparse.name if pz.sparse_optimizer is not None else None)
        log(f"checkpoint: {path}")

    skips = SkipCounter()

    def count_skips(wait: bool = False) -> None:  # the NaN guard's count, read a step or two late
        count_skipped(tr, skips, log, wait)

    # the window's loss stays on the device (a float() per step would make the host wait for each step)
    win_t0, win_steps, win_loss, win_examples, win_events, win_step_s = time.perf_counter(), 0, None, 0, 0, 0.0
    tr.model.train()
    tr.setup_time = time.perf_counter() - t_start
    while tr.step < total:
        f = lr_factor(tr.step, c.optim.warmup_steps, total, c.optim.decay, c.optim.min_lr_ratio)
        for g in opt.opt.optimizers[0][1].param_groups:  # "dense" first: the LR schedule is dense only
            g["lr"] = c.optim.lr * f
        t0 = time.perf_counter()
        try:
            with tdist.collective_guard(f"step {tr.step + 1}", pcfg.timeout_s), \
                    torch.autocast(info.device.type, dtype=torch.bfloat16, enabled=autocast):
                if pipeline is not None:
                    out = pipeline.progress(data)
                else:
                    batch = next(data)
                    opt.zero_grad(set_to_none=True)
                    loss, out = pz.model(batch)
                    loss.backward()
                    opt.step()
        except StopIteration:
            log(f"the training data ran out after {tr.step} steps (data.epochs={c.data.epochs})")
            break
        skips.push(tr.step + 1, opt.last_ok)
        tr.step += 1
        count_skips()
        ledger.after_step(tr)
        n = int(out.logits.shape[0])
        tr.examples_seen += n
        ev, stats = data.taken.popleft()
        tr.events_seen += ev
        win_events += ev
        tr.padding += stats
        win_steps += 1
        win_examples += n
        win_loss = out.loss.detach().float() if win_loss is None else win_loss + out.loss.detach().float()
        dt = time.perf_counter() - t0
        win_step_s += dt
        tr.train_time += dt
        if tr.first_step_time is None:
            tr.first_step_time = dt
        if tr.step % c.train.log_every == 0 or tr.step == total:
            count_skips(wait=True)
            wall = time.perf_counter() - win_t0
            loss_sum, ex_sum, ev_sum = tdist.all_reduce_sum([float(win_loss) if win_loss is not None else 0.0,
                                                             float(win_examples), float(win_events)])
            spread = tdist.step_time_spread(win_step_s / max(win_steps, 1))
            slowest = max(tdist.all_gather_floats(wall))
            rec: dict[str, Any] = {"kind": "train", "step": tr.step, "world_size": info.world_size,
                                   "loss": loss_sum / (info.world_size * max(win_steps, 1)),
                                   "lr": c.optim.lr * f, "examples_per_s": ex_sum / slowest,
                                   "events_per_s": ev_sum / slowest, "skipped_steps": tr.skipped,
                                   **spread.to_dict()}
            if main:
                tr._emit(rec)
                log(f"step {tr.step}: loss {rec['loss']:.4f}  {rec['examples_per_s']:,.0f} ex/s on "
                    f"{info.world_size} ranks  step {spread.mean_s * 1e3:.1f} ms (max {spread.max_s * 1e3:.1f}, "
                    f"slowest rank {int(rec['slowest_rank'])}, imbalance {spread.imbalance:.1%})")
            win_t0, win_steps, win_loss, win_examples, win_events, win_step_s = time.perf_counter(), 0, None, 0, 0, 0.0
        if (every and tr.step % every == 0) or (tr.step == total and c.checkpoint.at_end):
            count_skips(wait=True)  # the checkpoint's skipped count is exact
            save(tr.step)
    count_skips(wait=True)
    if pipeline is not None:
        pipeline.detach()  # the sharded modules compute their own inputs again (evaluation, later use)
    last_eval = None
    if c.eval.at_end and c.data.eval_url:
        last_eval = evaluate_distributed(tr, pz, info, autocast)
        if main:
            from train.metrics import EVAL_RECORD_KEYS

            tr._emit({"kind": "eval", "step": tr.step, **{f"{k}/{t}": v for t, r in last_eval["tasks"].items()
                                                          for k, v in r.items() if k in EVAL_RECORD_KEYS}})
    summary = tr._summary(last_eval, time.perf_counter() - t_start)
    summary.update(world_size=info.world_size, examples_per_s_global=_global_rate(tr))
    if pz.plan_text:
        summary["sharding_plan"] = pz.plan_dict
    if main:
        (tr.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=True, default=str) + "\n")
    dist.barrier()
    return summary


def _global_rate(tr) -> float:
    ex, = tdist.all_reduce_sum([float(tr.examples_seen)])
    slowest = max(tdist.all_gather_floats(tr.train_time))
    return ex / slowest if slowest > 0 else 0.0


@torch.no_grad()
def evaluate_distributed(tr, pz, info, autocast: bool) -> dict:
    """Each rank scores its slice of the held-out data; rank 0 computes the metrics of all rows."""
    from train.data import make_loader
    from train.held_out import HeldOutScorer

    c = tr.cfg
    loader = make_loader(tr.schema, c, c.data.eval_url, batch_size=c.eval.batch_size or c.train.batch_size,
                         shuffle=False, epochs=1, seed=c.train.seed, remainder="pad_with_repeat",
                         rank=info.rank, world_size=info.world_size)
    pz.model.eval()
    t0 = time.perf_counter()
    parts: list[tuple] = []
    batches = 0
    for batch in loader:
        batch = batch.to(info.device)
        with tdist.collective_guard("evaluation"), torch.autocast(info.device.type, dtype=torch.bfloat16,
                                                                  enabled=autocast):
            _, out = pz.model(batch)
        oracle = {t: batch.metadata[f"p_{t}"].cpu() for t in tr.tasks if f"p_{t}" in batch.metadata}
        parts.append((batch.row_ids.cpu(), torch.sigmoid(out.logits.float()).cpu(), batch.labels.cpu(),
                      batch.label_mask.cpu(), batch.weights.cpu(), oracle))
        batches += 1
        if c.eval.max_batches and batches >= c.eval.max_batches:
            break
    pz.model.train()
    gathered: list[Any] = [None] * info.world_size
    dist.all_gather_object(gathered, parts)
    if not info.is_main:
        return {"rows": 0, "seconds": time.perf_counter() - t0, "tasks": {}}
    scorer = HeldOutScorer(tr.tasks, c.eval.save_predictions)
    for rank_parts in gathered:
        for ids, probs, labels, mask, weights, oracle in rank_parts:
            scorer.update(ids, probs, labels, mask, weights, oracle or None)
    tasks = scorer.finish(tr.run_dir, tr.step)
    return {"rows": scorer.rows, "seconds": time.perf_counter() - t0, "tasks": tasks}

