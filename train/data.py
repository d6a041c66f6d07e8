"""The trainer's data side: synthetic data on first run, loaders from the run config, device prefetch."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from features.errors import GemtrainError
from features.schema import FeatureSchema
from ingest.batch import JaggedBatch
from train.config import ConfigError, RunConfig

DONE_MARKER = "_SYNTH_DONE"


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _local_path(url: str) -> Path:
    return Path(url[len("file://"):] if url.startswith("file://") else url)


def has_parquet(url: str) -> bool:
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(url)
        return bool(fs.glob(root.rstrip("/") + "/**.parquet")) or (root.endswith(".parquet") and fs.exists(root))
    except (FileNotFoundError, OSError, ValueError):
        return False


def ensure_synthetic(cfg: RunConfig, schema: FeatureSchema, log: Callable[[str], None] = print) -> None:
    """Writes the train and held-out splits when synthetic data is enabled and they are not there yet.

    Local folders are written to a temporary sibling and renamed, so an interrupted run never
    leaves a half-written split that later looks complete. Both splits share the synthetic ground
    truth (it depends on the schema only); the held-out split uses another seed, so other rows.
    """
    s = cfg.data.synth
    if not s.enabled:
        return
    from ingest.synth import write_synthetic

    splits = [(cfg.data.train_url, s.train_rows, s.seed)]
    if cfg.data.eval_url:
        splits.append((cfg.data.eval_url, s.eval_rows, s.seed + 1_000_003))
    for url, rows, seed in splits:
        if _is_local(url):
            final = _local_path(url)
            marker = final / DONE_MARKER
            if marker.exists():
                made = marker.read_text().strip()
                if made == f"rows={rows} seed={seed}":
                    continue
                # A split this code wrote for other settings (its marker says which): written again, so a
                # changed train_rows or seed never trains on the old rows.
                log(f"{final}: synthetic split holds '{made}', the config asks for 'rows={rows} seed={seed}': "
                    "writing it again")
                shutil.rmtree(final)
            if final.exists() and any(final.iterdir()):
                raise GemtrainError(f"{final}: the folder holds files but no '{DONE_MARKER}' marker of a "
                                    "finished synthetic split (remove the folder to regenerate it, or "
                                    "set data.synth.enabled=false to train on what is there)")
            log(f"generating {rows:,} synthetic rows into {final} ...")
            tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            write_synthetic(schema, str(tmp), rows, seed=seed, files=s.files)
            (tmp / DONE_MARKER).write_text(f"rows={rows} seed={seed}\n")
            if final.exists():
                final.rmdir()
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
        elif not has_parquet(url):
            log(f"generating {rows:,} synthetic rows into {url} ...")
            write_synthetic(schema, url, rows, seed=seed, files=s.files)


def make_loader(schema: FeatureSchema, cfg: RunConfig, url: str, *, batch_size: int, shuffle: bool,
                epochs: int | None, seed: int, remainder: str | None = None, rank: int = 0,
                world_size: int = 1) -> Any:
    from ingest.loader import Loader, LoaderConfig

    allowed = {f.name for f in dataclasses.fields(LoaderConfig)}
    fixed = {"url", "batch_size", "shuffle", "epochs", "seed"}
    extra = dict(cfg.data.loader)
    for k in extra:
        if k not in allowed or k in fixed:
            raise ConfigError(f"unknown loader setting '{k}'", file=cfg.source, key=f"data.loader.{k}",
                              hint="allowed here: " + ", ".join(sorted(allowed - fixed)))
    if remainder is not None:
        extra["remainder"] = remainder
    lc = LoaderConfig(url=url, batch_size=batch_size, shuffle=shuffle, epochs=epochs, seed=seed, **extra)
    return Loader(schema, lc, rank=rank, world_size=world_size)


class DevicePrefetcher:
    """Yields (batch on device, loader state after it) with the next batch already on its way.

    On CUDA the next batch is copied on a side stream while the current step computes (call
    `preload()` once the step's work is queued); the compute stream waits for the copy before use.
    The loader's state is read right after a batch is taken, only for the batches `want_state`
    selects (checkpoint steps), so a checkpoint resumes after exactly the batches trained on.
    """

    def __init__(self, loader: Any, device: torch.device, want_state: Callable[[int], bool],
                 transform: Callable[[JaggedBatch], JaggedBatch] | None = None):
        self.loader = loader
        self.it: Iterator[JaggedBatch] = iter(loader)
        self.device = device
        self.want_state = want_state
        self.transform = transform
        self.index = 0  # index of the next batch taken from the loader
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._next: tuple[JaggedBatch, Any, JaggedBatch] | None = None
        self._done = False

    def preload(self) -> None:
        if self._next is not None or self._done:
            return
        try:
            cpu = next(self.it)
        except StopIteration:
            self._done = True
            return
        if self.transform is not None:
            cpu = self.transform(cpu)
        state = self.loader.state_dict() if self.want_state(self.index) else None
        self.index += 1
        if self.stream is not None:
            with torch.cuda.stream(self.stream):
                dev = cpu.to(self.device, non_blocking=True)
        elif self.device.type != "cpu":
            dev = cpu.to(self.device)
        else:
            dev = cpu
        self._next = (dev, state, cpu)

    def next(self) -> tuple[JaggedBatch, Any] | None:
        """The next (device batch, loader state or None), or None when the data is exhausted."""
        self.preload()
        if self._next is None:
            return None
        dev, state, _ = self._next
        self._next = None
        if self.stream is not None:
            cur = torch.cuda.current_stream(self.device)
            cur.wait_stream(self.stream)
            dev.record_stream(cur)
        return dev, state


def real_events(batch: JaggedBatch) -> int:
    return int(sum(s.real_events for s in batch.stats.sequences.values()))


def log_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)

