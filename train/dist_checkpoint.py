"""Checkpoints of a sharded run: DCP save/load on every rank, in train/checkpoint.py's layout.

Every rank writes its shards (torchrec's sharded tables, FSDP2's DTensor parameters, the optimizer
states keyed by parameter name) with `torch.distributed.checkpoint`; rank 0 writes the trainer
state (step, the global loader state, counters) and the sharding plan, then the COMPLETE marker,
then renames the folder into place. A checkpoint therefore loads at any world size, sharded or
not: DCP reads each rank's slices of every tensor from whatever shards hold them (2 -> 1, 1 -> 2,
2 -> 3). The tables' fused-optimizer state (e.g. row-wise Adagrad's `momentum1`) reloads on any
sharded world size. A single-process run keeps its own (non-fused) optimizer for the tables, whose
state is keyed differently (`sum` for row-wise Adagrad, `exp_avg` / `exp_avg_sq` for Adam, and
`step`); a sharded checkpoint also stores the fused state under those names (the same tensors), and
a sharded load falls back to them, so table optimizer state carries over 2 -> 1 and 1 -> 2 too.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from train import checkpoint as ckpt


def _is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    if _is_dist():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if _is_dist() else 0


# fused (torchrec TBE) optimizer state name -> the single-process optimizer's name, per optimizer
FUSED_ALIASES = {
    "rowwise_adagrad": {"momentum1": "sum"},
    "adagrad": {"momentum1": "sum"},
    "adam": {"momentum1": "exp_avg", "momentum2": "exp_avg_sq"},
    "sgd": {},
}


def _fused_entries(optim_sd: dict, sparse_name: str):
    """(param key, fused state name, single-process name) of each fused table optimizer state."""
    aliases = FUSED_ALIASES.get(sparse_name, {})
    for pkey, pstate in optim_sd.get("state", {}).items():
        if not isinstance(pstate, dict):
            continue
        for name in list(pstate):
            suffix = name.rsplit(".", 1)[-1]
            if "." in name and suffix in aliases:  # "<table>.momentum1"
                yield pkey, name, aliases[suffix]


def _as_column(t):
    """A [rows] (sharded) tensor as a [rows, 1] view: row-wise Adagrad's `sum` has that shape."""
    if t.dim() != 1:
        return t
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):  # 2D sparse (DMPCollection) states are DTensors over torchrec's shard wrapper
        return _dtensor_as_column(t)
    if not hasattr(t, "local_shards"):
        return t.view(-1, 1)
    import copy

    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor

    def col(md):
        return ShardMetadata([md.shard_offsets[0], 0], [md.shard_sizes[0], 1], md.placement)

    meta = copy.copy(t.metadata())
    meta.shards_metadata = [col(m) for m in meta.shards_metadata]
    meta.size = torch.Size([t.size(0), 1])
    shards = [Shard(sh.tensor.view(-1, 1), col(sh.metadata)) for sh in t.local_shards()]
    # not collective: ranks own different tables, so they reach this for different tensors
    return ShardedTensor._init_from_local_shards_and_global_metadata(shards, meta)


def _dtensor_as_column(t):
    """`_as_column` of a row-sharded DTensor whose local part is a torchrec `LocalShardsWrapper`
    (the layout torchrec gives row-wise optimizer state under DMPCollection)."""
    from torch.distributed.tensor import DTensor
    from torchrec.distributed.shards_wrapper import LocalShardsWrapper

    local = t.to_local()
    if isinstance(local, LocalShardsWrapper):
        local = LocalShardsWrapper(local_shards=[s.view(-1, 1) for s in local.local_shards()],
                                   local_offsets=[(int(o[0]), 0) for o in local.local_offsets()])
    else:
        local = local.view(-1, 1)
    return DTensor.from_local(local, device_mesh=t.device_mesh, placements=t.placements,
                              shape=torch.Size([t.size(0), 1]), stride=(1, 1), run_check=False)


def with_aliases(optim_sd: dict, sparse_name: str, step: int) -> dict:
    """A copy of `optim_sd` that also holds the fused table state under the single-process names."""
    out = {**optim_sd, "state": {k: dict(v) if isinstance(v, dict) else v for k, v in optim_sd.get("state", {}).items()}}
    for pkey, name, alias in _fused_entries(optim_sd, sparse_name):
        value = optim_sd["state"][pkey][name]
        out["state"][pkey][alias] = _as_column(value) if alias == "sum" else value
        out["state"][pkey].setdefault("step", torch.tensor(float(step)))
    return out


def save(run_dir: str | Path, step: int, model_sd: dict, optim_sd: dict | None, trainer_state: dict,
         keep_last: int = 3, plan: dict | None = None, sparse_name: str | None = None) -> Path:
    """Collective: every rank calls it with its own state dicts; returns the final folder.

    `sparse_name` (the tables' optimizer) adds the single-process aliases of the fused state.
    """
    if optim_sd is not None and sparse_name:
        optim_sd = with_aliases(optim_sd, sparse_name, step)
    root = ckpt.checkpoint_dir(run_dir)
    final = root / ckpt.step_dir_name(step)
    tmp = root / f".tmp-{final.name}"
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
    _barrier()
    t0 = time.perf_counter()
    state: dict[str, Any] = {"model": model_sd, "trainer": pickle.dumps(trainer_state)}
    if optim_sd is not None:
        state["optim"] = optim_sd
    dcp.save(state, checkpoint_id=str(tmp))
    _barrier()
    if _rank() == 0:
        if plan is not None:
            (tmp / "sharding_plan.json").write_text(json.dumps(plan, indent=1) + "\n")
        world = dist.get_world_size() if _is_dist() else 1
        (tmp / ckpt.MARKER).write_text(json.dumps({"step": step, "time": time.time(), "world_size": world,
                                                   "save_s": round(time.perf_counter() - t0, 3)}) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in ckpt.complete_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def load(path: str | Path, model_sd: dict, optim_sd: dict | None, sparse_name: str | None = None) -> dict:
    """Collective: loads in place into the given state dicts (any world size); returns the trainer state.

    A fused table state the checkpoint lacks is read from its single-process name (`sparse_name`);
    other optimizer entries the checkpoint does not hold keep their values.
    """
    from torch.distributed.checkpoint import DefaultLoadPlanner

    path = ckpt.resolve_checkpoint(path)
    state: dict[str, Any] = {"model": model_sd, "trainer": b""}
    if optim_sd is not None:
        if sparse_name:
            have = set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
            request = {**optim_sd, "state": {k: dict(v) if isinstance(v, dict) else v
                                             for k, v in optim_sd.get("state", {}).items()}}
            for pkey, name, alias in _fused_entries(optim_sd, sparse_name):
                if f"optim.state.{pkey}.{name}" not in have and f"optim.state.{pkey}.{alias}" in have:
                    value = request["state"][pkey].pop(name)  # a view of the same storage: loads in place
                    request["state"][pkey][alias] = _as_column(value) if alias == "sum" else value
            optim_sd = request
        state["optim"] = optim_sd
    try:
        dcp.load(state, checkpoint_id=str(path), planner=DefaultLoadPlanner(allow_partial_load=True))
    except Exception as e:
        raise ckpt.CheckpointError(f"{path}: cannot load this checkpoint: {type(e).__name__}: {str(e)[:500]} "
                                   "(was it written with another model config or schema?)") from e
    missing = _missing_model_keys(path, model_sd)
    if missing:
        raise ckpt.CheckpointError(f"{path}: the checkpoint lacks model entries {missing[:5]} "
                                   f"({len(missing)} in all); it was written for another model")
    raw = state["trainer"]
    if hasattr(raw, "getvalue"):
        raw = raw.getvalue()
    return pickle.loads(raw)


def _missing_model_keys(path: Path, model_sd: dict) -> list[str]:
    reader = dcp.FileSystemReader(str(path))
    keys = set(reader.read_metadata().state_dict_metadata)
    return [k for k in model_sd if f"model.{k}" not in keys and isinstance(model_sd[k], torch.Tensor)]


def state_sums(model_sd: dict) -> dict[str, float]:
    """Sum of every tensor of a (possibly sharded) state dict, over all ranks: a cheap fingerprint
    that must match across world sizes after a reshard. Collective when distributed."""
    out = {}
    for k in sorted(model_sd):
        v = model_sd[k]
        if not isinstance(v, torch.Tensor):
            continue
        if hasattr(v, "local_shards"):  # ShardedTensor: sum this rank's shards, add over ranks
            s = sum((sh.tensor.double().sum() for sh in v.local_shards()), torch.zeros((), dtype=torch.float64))
            if _is_dist():
                dist.all_reduce(s)
            out[k] = float(s)
        elif hasattr(v, "full_tensor"):
            out[k] = float(v.full_tensor().double().sum())
        else:
            out[k] = float(v.double().sum())
    return out
