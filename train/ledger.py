"""The run ledger: what each epoch of a run read, lost and skipped, and every row id trained on.

Two files in the run dir, both plain text:

- `rows.jsonl`: one line per training step, `{"step": s, "epoch": e, "rows": [row ids of its batch]}`.
  Concatenated, the lines are the exact stream of rows the model was trained on.
- `ledger.json`: per epoch, rows in the data, rows read (trained on), rows quarantined with their
  reasons, rows dropped to equalise ranks, truncated history events, steps and steps skipped by the
  NaN guard; plus the restarts of the run. `gemtrain runs show DIR` prints it.

A run killed and resumed from a checkpoint at step c must not count what it did after c twice: on
resume `rows.jsonl` is cut back to the steps <= c and the ledger restarts from the snapshot it
took at step c (a snapshot is kept at every checkpoint step), with `restarts` one higher.

The trainer calls `attach` once (as the device prefetcher's batch transform: it runs right after
the loader yields a batch, while the loader's epoch is still that batch's) and `after_step` once
per step. Both are cheap: one small line appended and one small JSON file replaced per step.

Fault-injection knob (tests only): `GEMTRAIN_FAULT_STEP_DELAY_S` sleeps that long after each step's
record is written, so an external `kill -9` can land at a chosen step.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from features.errors import GemtrainError

ROWS_FILE = "rows.jsonl"
LEDGER_FILE = "ledger.json"
STEP_DELAY_ENV = "GEMTRAIN_FAULT_STEP_DELAY_S"


@dataclass
class EpochRecord:
    epoch: int
    rows_total: int | None = None  # rows in the data (readable files + known rows of unreadable ones)
    rows_read: int = 0  # rows in the batches trained on
    rows_quarantined: int = 0
    quarantined: list[dict] = field(default_factory=list)  # path, row_group, reason, rows_lost
    rows_dropped_remainder: int = 0
    rows_repeated: int = 0
    events_truncated: int = 0  # history events cut by max_length (oldest first)
    rows_truncated: int = 0  # rows whose history was cut (when the loader reports it)
    dense_nonfinite_zeroed: int = 0  # NaN/Inf dense values replaced by 0 (loader nonfinite: zero)
    steps: int = 0
    steps_skipped: int = 0  # steps the NaN/Inf guard skipped


@dataclass
class _Tagged:
    """What the loader had done when it yielded one batch."""

    epoch: int
    rows: list[int]
    events_truncated: int
    rows_truncated: int
    quarantined: list[dict]
    dropped: int
    repeated: int
    zeroed: int = 0


class RunLedger:
    def __init__(self, run_dir: Path, loader: Any, step: int, resumed: bool, checkpoint_steps: Callable[[int], bool],
                 keep_snapshots: int, rank: int | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rows_path = self.run_dir / _name(ROWS_FILE, rank)
        self.ledger_path = self.run_dir / _name(LEDGER_FILE, rank)
        self.rank = rank
        self.loader = loader
        self.checkpoint_steps = checkpoint_steps
        self.keep_snapshots = max(2, keep_snapshots + 1)
        self.delay = float(os.environ.get(STEP_DELAY_ENV, "0") or 0)
        self._queue: deque[_Tagged] = deque()
        self._seen_quarantine = 0
        self._dropped, self._repeated, self._zeroed = 0, 0, 0
        self._skipped_before = 0
        self._file_level: list[dict] = []
        self.restarts: list[dict] = []
        self.epochs: dict[int, EpochRecord] = {}
        self.snapshots: dict[str, dict] = {}
        self.step = step
        old = read_ledger(self.run_dir, rank) if resumed else None
        if old is not None:
            self.restarts = list(old.get("restarts", []))
            snap = old.get("snapshots", {}).get(str(step))
            if snap is not None:
                self.epochs = {int(e["epoch"]): EpochRecord(**e) for e in snap["epochs"]}
            self.snapshots = {k: v for k, v in old.get("snapshots", {}).items() if int(k) <= step}
            self.restarts.append({"resumed_at_step": step, "last_step_before": old.get("step"),
                                  "time": time.time(), "ledger_snapshot": snap is not None})
        self._truncate_rows(step)
        self._take_loader_counts(initial=True)
        self._snapshot()
        self._write()

    # ---- the trainer's two calls -----------------------------------------------------------------
    def tag(self, batch: Any) -> Any:
        """Device-prefetcher transform: remembers the batch's epoch and the loader's new counts."""
        quarantined, dropped, repeated = self._take_loader_counts()
        stats = getattr(self.loader, "stats", None)
        zeroed_total = int(getattr(stats, "dense_nonfinite_zeroed", 0) or 0)
        zeroed, self._zeroed = zeroed_total - self._zeroed, zeroed_total
        ev = rows_cut = 0
        for st in batch.stats.sequences.values():
            ev += int(st.truncated_events)
            rows_cut += int(getattr(st, "truncated_rows", 0) or 0)
        self._queue.append(_Tagged(int(getattr(self.loader, "_epoch", 0)), batch.row_ids.tolist(), ev, rows_cut,
                                   quarantined, dropped, repeated, zeroed))
        return batch

    def after_step(self, step: int, skipped_total: int) -> None:
        """Step `step` (1-based) trained on the oldest tagged batch; `skipped_total` is the NaN guard's count."""
        if not self._queue:
            return
        t = self._queue.popleft()
        rec = self._epoch(t.epoch)
        rec.rows_read += len(t.rows)
        rec.events_truncated += t.events_truncated
        rec.rows_truncated += t.rows_truncated
        rec.rows_dropped_remainder += t.dropped
        rec.rows_repeated += t.repeated
        rec.dense_nonfinite_zeroed += t.zeroed
        for q in t.quarantined:
            _add_quarantine(rec, q)
        rec.steps += 1
        skipped_now = skipped_total - self._skipped_before
        if skipped_now > 0:
            rec.steps_skipped += skipped_now
        self._skipped_before = skipped_total
        self.step = step
        with open(self.rows_path, "a") as f:
            f.write(json.dumps({"step": step, "epoch": t.epoch, "rows": t.rows}, separators=(",", ":")) + "\n")
        if self.checkpoint_steps(step):
            self._snapshot()
        self._write()
        if self.delay:
            time.sleep(self.delay)

    # ---- internals -----------------------------------------------------------------------------------
    def _epoch(self, e: int) -> EpochRecord:
        if e not in self.epochs:
            rec = EpochRecord(e, rows_total=self._rows_total())
            for q in self._file_level:  # an unreadable file loses its rows in every epoch
                _add_quarantine(rec, q)
            self.epochs[e] = rec
        return self.epochs[e]

    def _rows_total(self) -> int | None:
        total = getattr(self.loader, "total_rows", None)
        if total is None:
            return None
        for q in self._file_level:
            if q["rows_lost"] is None:
                return None
            total += q["rows_lost"]
        return int(total)

    def _take_loader_counts(self, initial: bool = False) -> tuple[list[dict], int, int]:
        stats = getattr(self.loader, "stats", None)
        if stats is None:
            return [], 0, 0
        records = list(stats.quarantined)
        new = [asdict(r) for r in records[self._seen_quarantine:]]
        self._seen_quarantine = len(records)
        dropped = stats.rows_dropped_remainder - self._dropped
        repeated = stats.rows_repeated - self._repeated
        self._dropped, self._repeated = stats.rows_dropped_remainder, stats.rows_repeated
        if initial:  # found while listing the files: whole files, lost in every epoch
            self._file_level = [q for q in new if q["row_group"] is None]
            new = [q for q in new if q["row_group"] is not None]
        return new, dropped, repeated

    def _truncate_rows(self, step: int) -> None:
        path = self.rows_path
        if step == 0 or not path.exists():
            path.write_text("")
            return
        keep = []
        for ln in path.read_text().splitlines():
            try:
                if json.loads(ln)["step"] <= step:
                    keep.append(ln)
            except (ValueError, KeyError):  # a line cut by a crash mid-write: past the checkpoint
                continue
        path.write_text("".join(ln + "\n" for ln in keep))

    def _snapshot(self) -> None:
        self.snapshots[str(self.step)] = {"epochs": [asdict(r) for r in self.epochs.values()]}
        for k in sorted(self.snapshots, key=int)[:-self.keep_snapshots]:
            del self.snapshots[k]

    def to_dict(self) -> dict:
        return {"run_dir": str(self.run_dir), "rank": self.rank, "pid": os.getpid(), "step": self.step,
                "restarts": self.restarts,
                "file_quarantine": self._file_level,
                "epochs": [asdict(self.epochs[e]) for e in sorted(self.epochs)], "snapshots": self.snapshots}

    def _write(self) -> None:
        path = self.ledger_path
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        os.replace(tmp, path)  # a crash leaves the old or the new ledger, never half of one


def _add_quarantine(rec: EpochRecord, q: dict) -> None:
    key = (q["path"], q["row_group"])
    if any((o["path"], o["row_group"]) == key for o in rec.quarantined):
        return  # the same file or row group found again (e.g. re-read after a restart)
    rec.quarantined.append(dict(q))
    rec.rows_quarantined += q["rows_lost"] or 0


def attach(trainer: Any, loader: Any) -> Callable[[Any], Any]:
    """Starts (or, on resume, continues) the ledger of `trainer`'s run; returns the prefetcher transform."""
    c = trainer.cfg
    every, total = c.train.checkpoint_every, c.train.steps

    def checkpoint_step(s: int) -> bool:
        return (every > 0 and s % every == 0) or (s == total and c.checkpoint.at_end)

    rank = None  # one process: rows.jsonl / ledger.json; several: one pair per rank (rows.rank1.jsonl, ...)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        rank = dist.get_rank()
    ledger = RunLedger(trainer.run_dir, loader, trainer.step, trainer.resume, checkpoint_step, c.checkpoint.keep_last,
                       rank)
    ledger._skipped_before = trainer.skipped
    trainer._ledger = ledger
    return ledger.tag


def after_step(trainer: Any) -> None:
    """The trainer's per-step call (a no-op for a trainer stepped without `attach`)."""
    ledger = getattr(trainer, "_ledger", None)
    if ledger is not None:
        ledger.after_step(trainer.step, trainer.skipped)


# ---- reading -----------------------------------------------------------------------------------------


def _name(base: str, rank: int | None) -> str:
    if rank is None:
        return base
    stem, ext = base.split(".", 1)
    return f"{stem}.rank{rank}.{ext}"


def ranks_of(run_dir: str | Path) -> list[int | None]:
    """[None] for a one-process run; the ranks with a ledger for a distributed one."""
    d = Path(run_dir)
    if (d / LEDGER_FILE).exists():
        return [None]
    return sorted(int(p.name.split(".")[1][len("rank"):]) for p in d.glob("ledger.rank*.json"))


def read_ledger(run_dir: str | Path, rank: int | None = None) -> dict | None:
    path = Path(run_dir) / _name(LEDGER_FILE, rank)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise GemtrainError(f"{path}: not a readable run ledger ({e}); it is rewritten by the next step "
                            "of the run") from None


def read_rows(run_dir: str | Path, rank: int | None = None) -> list[list[int]]:
    """The row ids of each step, in step order (what `rows.jsonl` records)."""
    path = Path(run_dir) / _name(ROWS_FILE, rank)
    out: list[tuple[int, list[int]]] = []
    for ln in path.read_text().splitlines():
        try:
            rec = json.loads(ln)
        except ValueError:
            continue
        out.append((rec["step"], rec["rows"]))
    return [rows for _, rows in out]


def format_ledger(d: dict) -> str:
    """The ledger as a small table (what `gemtrain runs show` prints)."""
    who = f" rank {d['rank']}" if d.get("rank") is not None else ""
    lines = [f"run {d.get('run_dir')}{who}: {d.get('step', 0)} steps, {len(d.get('restarts', []))} restarts"]
    for r in d.get("restarts", []):
        lines.append(f"  restart: resumed at step {r['resumed_at_step']} (the previous attempt reached step "
                     f"{r.get('last_step_before')})")
    cols = ("epoch", "rows_total", "rows_read", "rows_quarantined", "rows_dropped_remainder", "rows_truncated",
            "events_truncated", "dense_nonfinite_zeroed", "steps", "steps_skipped")
    heads = ("epoch", "total", "read", "quarantined", "dropped", "rows_trunc", "events_trunc", "nan_zeroed",
             "steps", "skipped")
    table = [heads] + [tuple("?" if e.get(c) is None else str(e.get(c)) for c in cols) for e in d.get("epochs", [])]
    widths = [max(len(r[i]) for r in table) for i in range(len(heads))]
    for r in table:
        lines.append("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))
    for e in d.get("epochs", []):
        for q in e.get("quarantined", []):
            where = q["path"] + (f" (row group {q['row_group']})" if q.get("row_group") is not None else "")
            lost = "unknown" if q.get("rows_lost") is None else q["rows_lost"]
            lines.append(f"  epoch {e['epoch']} quarantined {where}: {lost} rows: {q['reason']}")
    return "\n".join(lines)
