"""Process group, device meshes and rank helpers for multi-process training.

A run started by `torchrun` (or `gemtrain launch`) finds RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT in its environment; `setup()` turns them into a process group (NCCL on
GPU, gloo on CPU) with a timeout, so a rank that dies makes the others fail with an error naming
the collective instead of waiting forever. A single process without those variables runs as
world size 1 and no process group is created.

Meshes: `build_mesh` makes the 1D data-parallel mesh, the 2D ("replicate", "shard") mesh of HSDP,
and an ("ep",) expert-parallel mesh (a sub-mesh of the world).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from features.errors import GemtrainError

DEFAULT_TIMEOUT_S = 300.0


class DistributedError(GemtrainError):
    """A multi-process run cannot start or a peer rank failed."""


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str | None  # None: single process, no process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def env_world_size() -> int:
    """WORLD_SIZE from the environment (1 when unset)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError as e:
        raise DistributedError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not an integer") from e


def is_distributed() -> bool:
    """True when this process is one of several (started by torchrun) or a group exists."""
    return (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1) or env_world_size() > 1


def rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return env_world_size()


def is_main() -> bool:
    return rank() == 0


def _env_int(name: str, default: int | None = None) -> int:
    v = os.environ.get(name)
    if v is None:
        if default is None:
            raise DistributedError(f"environment variable {name} is not set; start the run with "
                                   "`gemtrain launch --nproc-per-node N CONFIG` or torchrun")
        return default
    try:
        return int(v)
    except ValueError as e:
        raise DistributedError(f"environment variable {name}={v!r} is not an integer") from e


def pick_device(local_rank: int, device: str | None = None) -> torch.device:
    """`cuda:<local_rank>` when CUDA is there (or asked for), else CPU."""
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise DistributedError("device 'cuda' asked for but CUDA is not available; use device: cpu")
        if local_rank >= torch.cuda.device_count():
            raise DistributedError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs "
                                   "are visible; lower --nproc-per-node")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device(device)


def setup(device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> DistInfo:
    """Creates the default process group from the torchrun environment (once) and returns DistInfo.

    Without WORLD_SIZE > 1 in the environment it returns a world-size-1 DistInfo and creates nothing.
    The timeout bounds every collective: a dead or stuck peer turns into an exception after it.
    """
    ws = env_world_size()
    if ws <= 1 and not (dist.is_available() and dist.is_initialized()):
        dev = pick_device(0, device)
        return DistInfo(0, 1, 0, 1, dev, None)
    r = _env_int("RANK", 0 if dist.is_initialized() else None)
    local = _env_int("LOCAL_RANK", r)
    local_ws = _env_int("LOCAL_WORLD_SIZE", ws)
    dev = pick_device(local, device)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            raise DistributedError("environment variable MASTER_ADDR is not set; start the run with "
                                   "`gemtrain launch` or torchrun")
        _env_int("MASTER_PORT")
        # NCCL: abort communicators on timeout/error rather than blocking the process.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        try:
            dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s),
                                    rank=r, world_size=ws, **kwargs)
        except Exception as e:  # rendezvous failures come as several exception types
            raise DistributedError(f"rank {r}/{ws}: cannot join the process group at "
                                   f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
                                   f"({type(e).__name__}: {e}); check that every rank started") from e
    else:
        backend = dist.get_backend()
        r, ws = dist.get_rank(), dist.get_world_size()
    return DistInfo(r, ws, local, local_ws, dev, backend)


_COLLECTIVE_SIGNS = ("gloo", "nccl", "connection", "timed out", "timeout", "peer", "closed", "broken pipe",
                     "socket", "collective", "process group", "watchdog")


def _looks_collective(e: BaseException) -> bool:
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(e, dist_error):
        return True
    return isinstance(e, RuntimeError) and any(s in str(e).lower() for s in _COLLECTIVE_SIGNS)


@contextlib.contextmanager
def collective_guard(what: str, timeout_s: float | None = None):
    """Turns a failed collective (a dead or stuck peer) into a DistributedError saying so.

    Other exceptions pass through unchanged.
    """
    t0 = time.monotonic()
    try:
        yield
    except DistributedError:
        raise
    except Exception as e:
        if not _looks_collective(e):
            raise
        r, ws = rank(), world_size()
        limit = f" (collective timeout {timeout_s:.0f}s)" if timeout_s else ""
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise DistributedError(
            f"rank {r} of {ws}: {what} failed in a collective after {time.monotonic() - t0:.1f}s{limit}: "
            f"another rank died or stopped responding ({type(e).__name__}: {first}). The run stops here; "
            "restart it with --resume to continue from the last checkpoint") from e


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# ---- meshes --------------------------------------------------------------------------------


def build_mesh(device_type: str, *, replicate: int = 1, shard: int | None = None, ep: int | None = None):
    """A DeviceMesh over the world: ("shard",), ("replicate", "shard") for HSDP or ("ep_replicate", "ep")."""
    from model.parallelize import build_mesh as _build

    return _build(device_type, replicate=replicate, shard=shard, ep=ep)


# ---- cross-rank reductions for metrics -----------------------------------------------------


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sums floats over ranks (identity in a single process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return t.cpu().tolist()


def all_gather_floats(value: float) -> list[float]:
    """Every rank's value of one float (e.g. step time), in rank order."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    t = torch.tensor([value], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [float(x.item()) for x in out]


@dataclass(frozen=True)
class StepTimeSpread:
    """Per-rank step time over an interval: the spread shows load imbalance."""

    per_rank_s: tuple[float, ...]

    @property
    def max_s(self) -> float:
        return max(self.per_rank_s)

    @property
    def min_s(self) -> float:
        return min(self.per_rank_s)

    @property
    def mean_s(self) -> float:
        return sum(self.per_rank_s) / len(self.per_rank_s)

    @property
    def imbalance(self) -> float:
        """(max - min) / max: 0 when every rank takes the same time."""
        return (self.max_s - self.min_s) / self.max_s if self.max_s > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        return {"step_s_min": self.min_s, "step_s_mean": self.mean_s, "step_s_max": self.max_s,
                "step_s_imbalance": self.imbalance, "slowest_rank": float(self.per_rank_s.index(self.max_s))}


def step_time_spread(local_step_s: float) -> StepTimeSpread:
    return StepTimeSpread(tuple(all_gather_floats(local_step_s)))


def aggregate_throughput(examples: int, seconds: float) -> dict[str, float]:
    """Global examples/s: examples summed over ranks over the slowest rank's wall time."""
    total, = all_reduce_sum([float(examples)])
    slowest = max(all_gather_floats(seconds))
    return {"examples": total, "examples_per_s": total / slowest if slowest > 0 else 0.0}
