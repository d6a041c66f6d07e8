"""A training step's gradient clipping and NaN guard, shared by the single-process and the distributed loop.

`ClippedOptimizer` wraps the combined optimizer: it clips the dense gradients and skips a step whose loss or
gradients are not finite, on the device where every optimizer can skip there (no host read per step), and
`SkipCounter` / `count_skipped` read the step's flag a step or two later without blocking: the step is
counted, logged, and training stops after `train.nan_guard_max` of them.
"""

from __future__ import annotations

import collections
import math
from typing import Any

import torch
import torch.distributed as dist
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad


class ClippedOptimizer:
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
    `distributed=False`: the norm of this process's gradients only (the single-process trainer; benchmarks).
    `tables`: the tables the optimizer's "sparse" part updates in `step()` (the single-process trainer's): their
    gradients enter the finite check (not the clipping); a fused Adam skips them by `found_inf`, a decay-free
    row-wise Adagrad (`RowSparseAdagrad`) by their gradients zeroed on the device. `step(loss=...)`: a
    non-finite loss skips the step too.
    """

    def __init__(self, opt, dense_params, clip: float, replicated_sync=None, after_step=None, *,
                 distributed: bool = True, device_guard: bool = True, tables=None):
        self.opt, self.dense_params, self.clip, self.sync = opt, dense_params, clip, replicated_sync
        self.tables = list(tables or [])
        self._zero_tables = False  # a skipped step zeroes the tables' gradients (set by _find_skippers)
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
            elif name == "sparse" and self.sync is None and not self.tables:
                continue  # sharded tables: torchrec's fused update ran in backward
            elif name == "sparse" and isinstance(inner, RowWiseAdagrad) and all(
                    g.get("weight_decay", 0) == 0 and g.get("lr_decay", 0) == 0 for g in inner.param_groups):
                self._zero_tables = bool(self.tables)  # replicated tables: their rows are zeroed by the sync
                continue  # zeroed gradient rows make a decay-free row-wise Adagrad step a no-op
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

    def step(self, closure=None, *, loss: torch.Tensor | None = None) -> None:
        from train.table_optim import sparse_grad_values

        grads = [p.grad for p in self.dense_params if p.grad is not None]
        norm = self._norm(grads) if grads else None
        table_vals = sparse_grad_values([p.grad for p in self.tables if p.grad is not None])
        # what must be finite: the dense gradients' norm, the loss, the tables' gradients (not clipped)
        checks = ([] if norm is None else [norm]) + ([] if loss is None else [loss.detach().reshape(())]) + (
            [torch.nn.utils.get_total_norm(table_vals)] if table_vals else [])
        if self.device_guard:
            ok = torch.isfinite(torch.stack([c.float() for c in checks])).all() if checks else None
            if ok is not None and self._zero_tables:
                for v in table_vals:  # a finite step: unchanged; else zeros (NaN * 0 is NaN, hence nan_to_num_)
                    v.nan_to_num_(0.0, 0.0, 0.0).mul_(ok)
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
            read = torch.stack([c.double() for c in checks]).tolist() if checks else []  # the one host read
            n = read[0] if norm is not None else 0.0
            ok = all(math.isfinite(x) for x in read)
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


def count_skipped(tr, skips: SkipCounter, log, wait: bool = False, note: str = "") -> None:
    """Adds the skipped steps whose flags have arrived to `tr.skipped`, logs each (with `note`), and stops
    training (`TrainingStopped`) once `train.nan_guard_max` is reached."""
    from train.trainer import TrainingStopped

    limit = tr.cfg.train.nan_guard_max
    for s in skips.poll(wait):
        tr.skipped += 1
        log(f"step {s}: non-finite loss or gradients; update skipped ({tr.skipped} of at most {limit}{note})")
        if tr.skipped >= limit:
            raise TrainingStopped(f"training stopped at step {tr.step}: {tr.skipped} non-finite steps, the last at "
                                  f"step {s} (train.nan_guard_max={limit}); check the data for NaN/Inf values, "
                                  "or lower optim.lr")
