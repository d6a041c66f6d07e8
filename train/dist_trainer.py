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
or two later without blocking (`train/step_guard.py`, shared with the single-process loop): the step is counted, logged and training stops after
`train.nan_guard_max` of them, up to two steps after the one that reached it. The fused table update
of sharded tables has already happened in backward. No per-step host read: the window's loss is
summed on the device and read at log time.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

from train import distributed as tdist
from train.step_guard import ClippedOptimizer, SkipCounter, count_skipped


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
    from train.optimizers import lr_factor

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
    opt = ClippedOptimizer(opt, dense_params, c.optim.clip_grad_norm, pz.replicated_sync, pz.after_step)
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
        count_skipped(tr, skips, log, wait, note="; sharded tables take their fused update in backward regardless")

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

