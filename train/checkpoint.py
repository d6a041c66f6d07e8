"""Checkpoints with `torch.distributed.checkpoint` (DCP): atomic, newest-complete resume, keep the last K.

Layout under a run directory::

    checkpoints/step_00000200/      a complete checkpoint (DCP files + COMPLETE marker)
    checkpoints/.tmp-step_00000400/ one being written (ignored by resume; removed on the next save)

A checkpoint is written into a temporary folder, the marker is written last, then the folder is
renamed into place: a crash leaves either the previous checkpoint or a complete new one. The state is
`{"model": ..., "optim": ..., "trainer": bytes}`: model and optimizer tensors go through DCP (so a
sharded model saves and loads the same way); the rest (step, LR schedule, RNG states, loader state,
counters) is one pickled object that DCP stores as bytes.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from features.errors import GemtrainError

MARKER = "COMPLETE"
PREFIX = "step_"


class CheckpointError(GemtrainError):
    pass


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def complete_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under `root` (a run dir or its checkpoints/ folder), oldest first."""
    if is_url(root):
        return _url_complete_checkpoints(str(root))  # type: ignore[return-value]
    root = Path(root)
    if (root / "checkpoints").is_dir():
        root = root / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest_checkpoint(root: str | Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder itself, or the newest complete one under a run dir / checkpoints dir."""
    if is_url(path):
        return _url_resolve(str(path))  # type: ignore[return-value]
    p = Path(path)
    if (p / MARKER).is_file():
        return p
    latest = latest_checkpoint(p)
    if latest is None:
        raise CheckpointError(f"{p}: no complete checkpoint here (a checkpoint folder holds a '{MARKER}' "
                              "marker; give a step_* folder, its checkpoints/ folder or the run dir)")
    return latest


def _pack(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def save_checkpoint(run_dir: str | Path, step: int, model_sd: dict, optim_sd: dict, trainer_state: dict,
                    keep_last: int) -> Path:
    if is_url(run_dir):
        return _url_save(str(run_dir), step, model_sd, optim_sd, trainer_state, keep_last)  # type: ignore[return-value]
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # left by a crash mid-save
        shutil.rmtree(stale, ignore_errors=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}"
    t0 = time.perf_counter()
    state = {"model": model_sd, "optim": optim_sd, "trainer": _pack(trainer_state)}
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.save(state, checkpoint_id=str(tmp))
    fault_pause(step)
    (tmp / MARKER).write_text(json.dumps({"step": step, "time": time.time(),
                                          "save_s": round(time.perf_counter() - t0, 3)}) + "\n")
    _fsync_dir(tmp)
    if final.exists():  # the same step saved again (e.g. at the end): replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in complete_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | Path, model_sd: dict, optim_sd: dict | None) -> dict:
    """Loads in place into the given state dicts (their tensors); returns the trainer state."""
    path = resolve_checkpoint(path)
    state: dict[str, Any] = {"model": model_sd, "trainer": b""}
    if optim_sd is not None:
        state["optim"] = optim_sd
    try:
        if is_url(path):
            dcp.load(state, storage_reader=_fsspec_reader(str(path)))
        else:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
                dcp.load(state, checkpoint_id=str(path))
    except Exception as e:  # DCP raises several types; all mean this checkpoint does not fit this run
        raise CheckpointError(f"{path}: cannot load this checkpoint into the configured model: "
                              f"{type(e).__name__}: {str(e)[:500]} (was it written with another model "
                              "config or schema?)") from e
    raw = state["trainer"]
    if isinstance(raw, io.BytesIO):
        raw = raw.getvalue()
    return pickle.loads(raw)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def rng_state(device: torch.device) -> dict[str, Any]:
    import random

    import numpy as np

    out: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                           "numpy": np.random.get_state()}
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    import random

    import numpy as np

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


# ---- checkpoints on object storage (any fsspec URL: s3://, gs://, memory://) ---------------------------
# Object stores have no atomic rename, so there a checkpoint is written straight into its step_*
# folder and the COMPLETE marker, written last, is what makes it visible: readers list only folders
# holding the marker, exactly as for local folders. Storage options (endpoint, credentials) come
# from fsspec's configuration (e.g. FSSPEC_S3_* environment variables or fsspec.config.conf).


def is_url(path: str | Path) -> bool:
    p = str(path)
    return "://" in p and not p.startswith("file://")


def _url_fs(url: str):
    import fsspec

    return fsspec.core.url_to_fs(url)


def _url_root(url: str) -> str:
    fs, p = _url_fs(url)
    p = p.rstrip("/")
    if fs.isdir(p + "/checkpoints"):
        p += "/checkpoints"
    return p


def _url_complete_checkpoints(url: str) -> list[str]:
    fs, _ = _url_fs(url)
    root = _url_root(url)
    try:
        entries = fs.ls(root, detail=False, refresh=True) if fs.isdir(root) else []
    except FileNotFoundError:
        entries = []
    proto = url.split("://", 1)[0]
    found = [e.rstrip("/") for e in entries if e.rstrip("/").rsplit("/", 1)[-1].startswith(PREFIX)]
    found = [e for e in found if fs.exists(f"{e}/{MARKER}")]
    found.sort(key=lambda e: int(e.rsplit("/", 1)[-1][len(PREFIX):]))
    return [f"{proto}://{e}" for e in found]


def _url_resolve(url: str) -> str:
    fs, p = _url_fs(url)
    if fs.exists(p.rstrip("/") + f"/{MARKER}"):
        return url.rstrip("/")
    found = _url_complete_checkpoints(url)
    if not found:
        raise CheckpointError(f"{url}: no complete checkpoint here (a checkpoint folder holds a '{MARKER}' "
                              "marker; give a step_* folder, its checkpoints/ folder or the run dir)")
    return found[-1]


def _fsspec_reader(url: str):
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(url)


def _url_save(run_url: str, step: int, model_sd: dict, optim_sd: dict, trainer_state: dict, keep_last: int) -> str:
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    fs, p = _url_fs(run_url)
    proto = run_url.split("://", 1)[0]
    final = f"{p.rstrip('/')}/checkpoints/{step_dir_name(step)}"
    if fs.exists(final):  # an incomplete attempt at this step, or the same step saved again
        fs.rm(final, recursive=True)
    t0 = time.perf_counter()
    state = {"model": model_sd, "optim": optim_sd, "trainer": _pack(trainer_state)}
    dcp.save(state, storage_writer=FsspecWriter(f"{proto}://{final}"))
    fault_pause(step)
    fs.pipe(f"{final}/{MARKER}", (json.dumps({"step": step, "time": time.time(),
                                              "save_s": round(time.perf_counter() - t0, 3)}) + "\n").encode())
    for old in _url_complete_checkpoints(run_url)[:-keep_last]:
        fs.rm(_url_fs(old)[1], recursive=True)
    return f"{proto}://{final}"


# ---- fault injection (tests only) ------------------------------------------------------------------------
PAUSE_ENV = "GEMTRAIN_FAULT_CHECKPOINT_PAUSE"  # "STEP:SECONDS": pause that save before its marker


def fault_pause(step: int) -> None:
    """Sleeps between the tensors and the marker of the checkpoint at the step named by PAUSE_ENV, so a
    test can kill the process while a checkpoint is half written."""
    spec = os.environ.get(PAUSE_ENV)
    if not spec:
        return
    at, _, seconds = spec.partition(":")
    if int(at) == step:
        time.sleep(float(seconds or 60))
