"""The streaming loader: Parquet on any fsspec URL -> `JaggedBatch`, exactly once, resumable.

Pipeline (torchdata.nodes): the rank's read slices -> `ParallelMapper` reading row groups in a
thread pool (in order) -> window assembly, shuffle and batching -> `ParallelMapper` converting
Arrow to `JaggedBatch` -> `Prefetcher` -> `PinMemory` (when an accelerator is present).

Which rows a rank gets and in which order depends only on (seed, epoch, world size) and the
files' row counts (see `ingest.plan`), never on the number of threads. The loader state counts
what has been YIELDED (not what the threads read ahead), so a restored loader continues with
exactly the batches an uninterrupted one would have produced.

State is global: with a fixed batch size every rank consumes the same number of stream positions
per batch, so any rank's state describes every rank's progress; with a token budget the ranks'
cursors differ (each rank batches its own rows, then the ranks agree on a common number of batches
per shuffle window, the largest, and the others split their heaviest batches to reach it, so the
ranks step in lockstep: see `Loader.__init__`), and `state_dict()` gathers them over torch.distributed (or `merge_state_dicts`
joins the per-rank states). A state loaded at another world size re-plans the rows that no rank
had consumed, so each row of the epoch is still yielded exactly once.

Bad input: every file's schema is checked from its footer before any of its rows are read. With
`on_bad_file="error"` (default) a bad file raises `BadFileError` naming it; with "quarantine" its
rows are skipped and recorded in `stats.quarantined` (path, row group, reason, rows lost). A row
group that fails mid-epoch leaves a hole: with a fixed batch size, the batches that would have
held its rows are that much smaller, so every rank still yields the same number of batches.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torchdata.nodes as tn

from features.errors import GemtrainError
from features.schema import FeatureSchema
from ingest.batch import JaggedBatch
from ingest.batching import row_events, split_to, token_batches
from ingest.convert import Rows, table_to_batch
from ingest.errors import BadFileError, DataError
from ingest.id_stats import id_leaves
from ingest.listing import FileRef, list_files
from ingest.pipeline import LIVE_STREAMS, End, Raised, catching, distributed_max, ended, release_in_background
from ingest.plan import REMAINDER_POLICIES, EpochPlan, ReadSlice, fresh_pieces
from ingest.reader import RetryPolicy, read_footers, read_row_group
from ingest.stats import LoaderStats, QuarantineRecord
from ingest.window import split_rows, table_rows, take_rows, window_rows

STATE_VERSION = 1
NONFINITE_POLICIES = ("error", "zero")


@dataclass
class LoaderConfig:
    url: str | list[str]
    batch_size: int = 256
    token_budget: int | None = None  # max history events per batch (then batch_size caps the rows)
    shuffle: bool = True
    seed: int = 0
    shuffle_buffer_rows: int = 8192  # rows held and permuted at once (per rank)
    num_threads: int = 2  # reader threads and converter threads (0: everything inline)
    prefetch: int = 2  # batches converted ahead
    pin_memory: bool = False
    remainder: str = "drop"  # or "pad_with_repeat": how ranks get equal rows per epoch
    on_bad_file: str = "error"  # or "quarantine"
    epochs: int | None = 1  # None: forever
    storage_options: dict = field(default_factory=dict)
    retries: int = 4  # attempts per read on transient storage errors
    nonfinite: str = "error"  # NaN/Inf in dense features: "error", or "zero" (replace by 0 and count)
    # Files written without page checksums are bad files (error or quarantine): a flipped bit in them
    # would reach training unnoticed.
    require_page_checksums: bool = False

    def __post_init__(self) -> None:
        def bad(what: str) -> GemtrainError:
            return GemtrainError(f"loader config: {what}")

        if self.batch_size < 1:
            raise bad(f"batch_size must be >= 1, got {self.batch_size}")
        if self.token_budget is not None and self.token_budget < 1:
            raise bad(f"token_budget must be >= 1 or unset, got {self.token_budget}")
        if self.shuffle_buffer_rows < 1:
            raise bad(f"shuffle_buffer_rows must be >= 1, got {self.shuffle_buffer_rows}")
        if self.num_threads < 0 or self.prefetch < 0:
            raise bad("num_threads and prefetch must be >= 0")
        if self.remainder not in REMAINDER_POLICIES:
            raise bad(f"remainder must be one of {REMAINDER_POLICIES}, got '{self.remainder}'")
        if self.on_bad_file not in ("error", "quarantine"):
            raise bad(f"on_bad_file must be 'error' or 'quarantine', got '{self.on_bad_file}'")
        if self.epochs is not None and self.epochs < 1:
            raise bad(f"epochs must be >= 1 or None (forever), got {self.epochs}")
        if self.nonfinite not in NONFINITE_POLICIES:
            raise bad(f"nonfinite must be one of {NONFINITE_POLICIES}, got '{self.nonfinite}'")
        if self.retries < 1:
            raise bad(f"retries must be >= 1, got {self.retries}")


@dataclass(frozen=True)
class WorkUnit:
    """One Parquet row group."""

    file: int  # index into the loader's files
    row_group: int
    rows: int


@dataclass(frozen=True)
class _Task:
    """Consecutive read slices of one unit, read with one row-group read."""

    unit: int
    slices: tuple[ReadSlice, ...]

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.slices)


def _tasks(slices: list[ReadSlice]) -> list[_Task]:
    out: list[_Task] = []
    run: list[ReadSlice] = []
    for s in slices:
        if run and run[-1].unit != s.unit:
            out.append(_Task(run[0].unit, tuple(run)))
            run = []
        run.append(s)
    if run:
        out.append(_Task(run[0].unit, tuple(run)))
    return out


class Loader:
    """Iterable of `JaggedBatch` for one rank; see the module docstring."""

    def __init__(self, schema: FeatureSchema, config: LoaderConfig, rank: int = 0, world_size: int = 1,
                 agree_batches: Callable[[int], int] | None = None):
        """`agree_batches` (token budget only): given this rank's number of batches in a shuffle window,
        returns the number every rank uses (the largest), called once per window by every rank in
        the same order. Left out with `world_size > 1` under an initialised torch.distributed, it is
        an all-reduce (MAX) over a gloo group the loader creates here (so every rank must build its
        loader); without torch.distributed, ranks keep their own counts (not in lockstep)."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise GemtrainError(f"loader: rank {rank} is not in [0, world_size={world_size})")
        self.schema, self.config, self.rank, self.world_size = schema, config, rank, world_size
        self._agree = agree_batches
        if self._agree is None and config.token_budget is not None and world_size > 1:
            self._agree = distributed_max(world_size)
        self.stats = LoaderStats()
        self._columns = schema.column_names()
        self._policy = RetryPolicy(attempts=config.retries)
        self._max_lengths = [s.max_length for s in schema.sequences]
        self._discover()
        self._epoch = 0
        self._plan: EpochPlan | None = None
        self._pos = 0  # fixed batch size: stream positions consumed (yielded or lost)
        self._tw, self._tlocal, self._tbatches = 0, [], 0  # token budget: window, its done rows, batches

    # ---- discovery -------------------------------------------------------------------------
    def _discover(self) -> None:
        refs = list_files(self.config.url, self.config.storage_options)
        leaves = id_leaves(self.schema)
        footers = read_footers(refs, self.schema.arrow_schema(), self._policy,
                               require_checksums=self.config.require_page_checksums, id_leaves=leaves)
        proven = set(leaves)
        self.files: list[FileRef] = []
        self._metadata = []
        self.units: list[WorkUnit] = []
        for f in footers:
            if f.error is not None:
                if self.config.on_bad_file == "error":
                    raise BadFileError(f.ref.url, f.error)
                self.stats.quarantine(QuarantineRecord(f.ref.url, None, f.error, f.rows))
                continue
            idx = len(self.files)
            proven &= f.ids_in_range
            self.files.append(f.ref)
            self._metadata.append(f.metadata)
            self.units += [WorkUnit(idx, i, n) for i, n in enumerate(f.row_group_rows)]
        h = hashlib.sha1()
        for u in self.units:
            h.update(f"{self.files[u.file].url}\0{u.row_group}\0{u.rows}\n".encode())
        self.fingerprint = h.hexdigest()
        self.total_rows = sum(u.rows for u in self.units)
        # Id keys every file's statistics prove in range: the converter skips their range check.
        self.ids_in_range = frozenset(proven)

    # ---- plans -----------------------------------------------------------------------------
    def _make_plan(self, epoch: int, pieces: np.ndarray | None, world_size: int, generation: int) -> EpochPlan:
        if pieces is None:
            pieces = fresh_pieces([u.rows for u in self.units], seed=self.config.seed, epoch=epoch,
                                  shuffle=self.config.shuffle)
        return EpochPlan(pieces, world_size=world_size, remainder=self.config.remainder,
                         window_rows=self.config.shuffle_buffer_rows, shuffle=self.config.shuffle,
                         seed=self.config.seed, epoch=epoch, generation=generation)

    def _start_plan(self, plan: EpochPlan) -> None:
        self._plan = plan
        self.stats.rows_dropped_remainder += plan.dropped
        self.stats.rows_repeated += plan.repeated

    @property
    def _token_mode(self) -> bool:
        return self.config.token_budget is not None

    # ---- iteration -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[JaggedBatch]:
        epochs = self.config.epochs
        while epochs is None or self._epoch < epochs:
            if self._plan is None:
                self._start_plan(self._make_plan(self._epoch, None, self.world_size, 0))
            stream = self._run_plan(self._plan)
            LIVE_STREAMS.add(stream)
            yield from stream
            self._epoch += 1
            self._plan = None
            self._pos, self._tw, self._tlocal, self._tbatches = 0, 0, [], 0

    def _run_plan(self, plan: EpochPlan) -> Iterator[JaggedBatch]:
        s = plan.window_rows
        start_w = self._tw if self._token_mode else self._pos // s
        if start_w >= plan.num_windows:
            return
        skip = self._tbatches if self._token_mode else self._pos - start_w * s
        # Without shuffling, fixed-size batches stream: no window is held (the window order is
        # the identity, so the rows and batches are the same as through windows).
        streaming = not plan.shuffle and not self._token_mode
        tasks = _tasks(plan.slices(self.rank, self._pos if streaming else start_w * s))
        t = self.config.num_threads
        read: tn.BaseNode = tn.IterableWrapper(tasks)
        read = tn.ParallelMapper(read, catching(self._read), num_workers=t, in_order=True, method="thread") \
            if t else tn.Mapper(read, catching(self._read))
        read.reset()
        # Take exactly the tasks' results: waiting for the pool to signal its end costs a 0.1 s poll.
        results = itertools.islice(read, len(tasks))
        batches = self._stream(results) if streaming else self._assemble(results, plan, start_w, skip)
        node: tn.BaseNode = tn.IterableWrapper(ended(batches))
        node = tn.ParallelMapper(node, catching(self._convert), num_workers=t, in_order=True,
                                 method="thread") if t else tn.Mapper(node, catching(self._convert))
        if t and self.config.prefetch:
            node = tn.Prefetcher(node, prefetch_factor=self.config.prefetch)
        if self.config.pin_memory and torch.cuda.is_available():
            node = tn.PinMemory(node)
        node.reset()
        try:
            for item in node:
                if isinstance(item, Raised):
                    raise item.error
                if isinstance(item, End):
                    break
                batch, info = item
                self._advance(info)
                self.stats.rows_read += batch.batch_size
                self.stats.batches += 1
                self.stats.padding += batch.stats
                self.stats.events_truncated += sum(st.truncated_events for st in batch.stats.sequences.values())
                yield batch
        finally:
            if t:
                # The thread pools join their threads when released (up to a 0.1 s poll each):
                # release them in the background instead of in the consumer's next().
                objs = [node, read, results, batches]
                del node, read, results, batches  # the list holds the last references
                release_in_background(objs)

    def _advance(self, info: dict[str, Any]) -> None:
        if not self._token_mode:
            self._pos += info["positions"]
            return
        if info["window"] != self._tw:
            self._tw, self._tlocal, self._tbatches = info["window"], [], 0
        self._tlocal.extend(info["local"])
        self._tbatches += 1
        if info["last"]:
            self._tw, self._tlocal, self._tbatches = info["window"] + 1, [], 0

    # ---- stages (run in the thread pools) ----------------------------------------------------
    def _read(self, task: _Task) -> tuple[_Task, pa.Table | None]:
        unit = self.units[task.unit]
        ref = self.files[unit.file]
        try:
            table = read_row_group(ref, self._metadata[unit.file], unit.row_group, self._columns,
                                   self._policy, self.stats.retried, chunk_rows=self.config.batch_size)
        except BadFileError as e:
            if self.config.on_bad_file == "error":
                raise
            self.stats.quarantine(QuarantineRecord(ref.url, unit.row_group, e.reason, task.rows))
            return task, None
        if table.num_rows != unit.rows:
            err = BadFileError(ref.url, f"row group has {table.num_rows} rows, the footer says {unit.rows}",
                               row_group=unit.row_group)
            if self.config.on_bad_file == "error":
                raise err
            self.stats.quarantine(QuarantineRecord(ref.url, unit.row_group, err.reason, task.rows))
            return task, None
        parts = [table.slice(s.start, s.rows) for s in task.slices]
        return task, (parts[0] if len(parts) == 1 else pa.concat_tables(parts))

    def _convert(self, item: tuple[Rows, dict[str, Any]]) -> tuple[JaggedBatch, dict[str, Any]]:
        table, info = item
        # Files were checked from their footers: no per-batch column check, no range check of
        # the ids their statistics cover.
        batch = table_to_batch(table, self.schema, check=False, ids_in_range=self.ids_in_range)
        _nonfinite_dense(batch, self.schema, self.config.nonfinite, self.stats)
        return batch, info

    # ---- windows and batches (one thread, in stream order) ----------------------------------------
    def _assemble(self, read: Iterator, plan: EpochPlan, w: int, skip: int):
        pending: list[tuple[pa.Table | None, int]] = []
        have = 0
        acc: Rows = []
        acc_pos = 0
        for item in read:
            if isinstance(item, Raised):
                yield item
                return
            task, table = item
            pending.append((table, task.rows))
            have += task.rows
            while w < plan.num_windows and have >= plan.window_len(w):
                n = plan.window_len(w)
                window, pending = split_rows(pending, n)
                have -= n
                if self._token_mode:
                    yield from self._token_window(plan, w, window, skip)
                else:
                    for part, positions in self._fixed_window(plan, w, window, skip):
                        acc += part
                        acc_pos += positions
                        if acc_pos == self.config.batch_size:
                            yield acc, {"positions": acc_pos}
                            acc, acc_pos = [], 0
                skip = 0
                w += 1
        if acc_pos:
            yield acc, {"positions": acc_pos}

    def _stream(self, read: Iterator):
        """Batches of stream positions `[k * batch_size, (k + 1) * batch_size)`, cut as rows arrive."""
        bs = self.config.batch_size
        need = bs - self._pos % bs  # a resumed stream first completes the open batch
        pending: list[tuple[pa.Table | None, int]] = []
        have = 0
        for item in read:
            if isinstance(item, Raised):
                yield item
                return
            task, table = item
            pending.append((table, task.rows))
            have += task.rows
            while have >= need:
                part, pending = split_rows(pending, need)
                have -= need
                yield table_rows([t for t, _ in part if t is not None]), {"positions": need}
                need = bs
        if have:
            yield table_rows([t for t, _ in pending if t is not None]), {"positions": have}

    def _fixed_window(self, plan: EpochPlan, w: int, window: list[tuple[pa.Table | None, int]], skip: int):
        """(rows as `Rows` parts, stream positions) pieces in emission order, cut at batch boundaries."""
        table, valid = window_rows(window)
        perm = plan.window_perm(self.rank, w)
        i = skip
        bs = self.config.batch_size
        # The first piece tops up the batch that the previous window left open.
        first = (bs - (self._pos_in_batch(plan, w, skip))) if i < len(perm) else 0
        sizes = []
        if first:
            sizes.append(min(first, len(perm) - i))
        rest = len(perm) - i - (sizes[0] if sizes else 0)
        sizes += [bs] * (rest // bs) + ([rest % bs] if rest % bs else [])
        for n in sizes:
            idx = perm[i:i + n]
            i += n
            if valid is not None:
                keep = idx[valid[idx]]
                rows = np.cumsum(valid)[keep] - 1
            else:
                rows = idx
            # A batch's membership is random; inside it rows keep stream order (cheaper gathers).
            yield take_rows(table, np.sort(rows)), n

    def _pos_in_batch(self, plan: EpochPlan, w: int, skip: int) -> int:
        # Positions already in the open batch when window `w` starts (batches run across windows).
        return (w * plan.window_rows + skip) % self.config.batch_size

    def _token_window(self, plan: EpochPlan, w: int, window: list[tuple[pa.Table | None, int]], skip: int):
        table, valid = window_rows(window)
        perm = plan.window_perm(self.rank, w)
        if valid is not None:
            perm = perm[valid[perm]]
            row_of = np.cumsum(valid) - 1
        else:
            row_of = None
        rows = perm if row_of is None else row_of[perm]
        lengths = [table.column_lengths(s.name) if table is not None else np.zeros(0, np.int64)
                   for s in self.schema.sequences]
        events = row_events([ln[rows] for ln in lengths], self._max_lengths) if lengths \
            else np.zeros(len(rows), np.int64)
        groups = token_batches(events, self.config.token_budget, self.config.batch_size)
        if self._agree is not None:  # every rank, every window, in window order (a collective)
            groups = split_to(groups, events, self._agree(len(groups)))
        for b, g in enumerate(groups):
            if b < skip:
                continue
            yield (take_rows(table, np.sort(rows[g])),
                   {"window": w, "local": perm[g].tolist(), "last": b == len(groups) - 1})

    # ---- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        plan = self._plan
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint,
            "seed": self.config.seed,
            "shuffle": self.config.shuffle,
            "window_rows": self.config.shuffle_buffer_rows,
            "remainder": self.config.remainder,
            "token_budget": self.config.token_budget,
            "batch_size": self.config.batch_size,
            "epoch": self._epoch,
            "world_size": plan.world_size if plan else self.world_size,
            "generation": plan.generation if plan else 0,
            "pieces": plan.pieces.tolist() if plan is not None and plan.generation > 0 else None,
            "positions": self._pos,
            "cursors": {},
        }
        if self._token_mode:
            mine = {"window": self._tw, "local": list(self._tlocal), "batches": self._tbatches}
            cursors = {self.rank: mine}
            if self.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
                gathered: list[Any] = [None] * torch.distributed.get_world_size()
                torch.distributed.all_gather_object(gathered, (self.rank, mine))
                cursors = {r: c for r, c in gathered}
            state["cursors"] = cursors
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise GemtrainError(f"loader state version {state.get('version')} is not {STATE_VERSION}")
        if state["fingerprint"] != self.fingerprint:
            raise DataError("loader state: the dataset changed since the state was saved (files, row groups "
                            "or row counts differ); resume on the same data or start a fresh loader")
        for key, mine in (("seed", self.config.seed), ("shuffle", self.config.shuffle),
                          ("window_rows", self.config.shuffle_buffer_rows),
                          ("remainder", self.config.remainder), ("token_budget", self.config.token_budget)):
            if state[key] != mine:
                raise GemtrainError(f"loader state: saved with {key}={state[key]!r}, this loader has {mine!r}; "
                                    "they must match to resume")
        epoch, old_w, gen = int(state["epoch"]), int(state["world_size"]), int(state["generation"])
        pieces = None if state["pieces"] is None else np.asarray(state["pieces"], dtype=np.int64)
        self._epoch = epoch
        old = self._make_plan(epoch, pieces, old_w, gen)
        cursors = {int(r): c for r, c in state["cursors"].items()}
        self._pos, self._tw, self._tlocal, self._tbatches = 0, 0, [], 0
        if old_w == self.world_size:
            self._start_plan(old)
            if self._token_mode:
                if self.rank not in cursors:
                    raise GemtrainError(f"loader state holds no cursor for rank {self.rank}")
                c = cursors[self.rank]
                self._tw, self._tlocal, self._tbatches = int(c["window"]), list(c["local"]), int(c["batches"])
            else:
                self._pos = int(state["positions"])
            return
        consumed: dict[int, tuple[int, np.ndarray]] = {}
        if self._token_mode:
            missing = sorted(set(range(old_w)) - set(cursors))
            if missing:
                raise GemtrainError(f"loader state: resuming at world size {self.world_size} from {old_w} needs the "
                                    f"cursors of all old ranks; missing {missing} (save under torch.distributed, "
                                    "or join the ranks' states with merge_state_dicts)")
            for r, c in cursors.items():
                consumed[r] = (int(c["window"]), np.asarray(c["local"], dtype=np.int64))
        else:
            pos = int(state["positions"])
            w = pos // old.window_rows
            for r in range(old_w):
                consumed[r] = (w, old.window_perm(r, w)[: pos - w * old.window_rows] if w < old.num_windows
                               else np.zeros(0, np.int64))
        remaining = old.remaining_pieces(consumed)
        self._start_plan(self._make_plan(epoch, remaining, self.world_size, gen + 1))


def merge_state_dicts(states: list[dict[str, Any]]) -> dict[str, Any]:
    """One global state from the per-rank states of one step (needed with a token budget)."""
    if not states:
        raise GemtrainError("merge_state_dicts: no states given")
    base = {k: v for k, v in states[0].items() if k != "cursors"}
    cursors: dict[int, Any] = {}
    for s in states:
        if {k: v for k, v in s.items() if k != "cursors"} != base:
            raise GemtrainError("merge_state_dicts: the states are not of one step of one run")
        cursors.update({int(r): c for r, c in s["cursors"].items()})
    return {**base, "cursors": cursors}


# ---- helpers ---------------------------------------------------------------------------------


def _nonfinite_dense(batch: JaggedBatch, schema: FeatureSchema, policy: str, stats: LoaderStats) -> None:
    """NaN/Inf in the dense features: an error naming the feature and rows, or zeroed and counted."""
    dense = batch.dense
    if dense.numel() == 0:
        return
    bad = ~torch.isfinite(dense)
    if not bool(bad.any()):
        return
    if policy == "error":
        cols = set(bad.any(0).nonzero().flatten().tolist())
        names = [n for n, c, w in _dense_columns(schema) if cols & set(range(c, c + w))]
        rows = batch.row_ids[bad.any(1)].tolist()[:5] if batch.row_ids is not None else []
        raise DataError(f"NaN or Inf in dense feature(s) {', '.join(names)} (row_id {rows}); clean the "
                        "data, or set the loader's nonfinite: zero to replace them by 0 and count them")
    n = int(bad.sum())
    dense.masked_fill_(bad, 0.0)
    stats.nonfinite_zeroed(n)


def _dense_columns(schema: FeatureSchema) -> list[tuple[str, int, int]]:
    """(feature name, first column in `dense`, width) of every dense feature, in `dense` column order."""
    out, col = [], 0
    for f in schema.dense_features:
        w = f.dim if f.type == "float_vector" else 1
        out.append((f.name, col, w))
        col += w
    return out
