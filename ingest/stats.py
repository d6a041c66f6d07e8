"""Loader statistics: rows read, rows lost to bad files (with reasons), truncation, padding."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field

from ingest.batch import PaddingStats


@dataclass(frozen=True)
class QuarantineRecord:
    """Rows skipped because a file or row group could not be used."""

    path: str
    row_group: int | None  # None: the whole file
    reason: str
    rows_lost: int | None  # None: unknown (the footer itself was unreadable)


@dataclass
class LoaderStats:
    rows_read: int = 0
    batches: int = 0
    rows_quarantined: int = 0
    quarantined: list[QuarantineRecord] = field(default_factory=list)
    rows_dropped_remainder: int = 0  # global count per epoch plan (remainder="drop")
    rows_repeated: int = 0  # global count per epoch plan (remainder="pad_with_repeat")
    events_truncated: int = 0
    retries: int = 0
    dense_nonfinite_zeroed: int = 0  # NaN/Inf dense values replaced by 0 (nonfinite: zero)
    padding: PaddingStats = field(default_factory=PaddingStats)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def quarantine(self, record: QuarantineRecord) -> None:
        with self._lock:
            self.quarantined.append(record)
            self.rows_quarantined += record.rows_lost or 0

    def nonfinite_zeroed(self, n: int) -> None:
        with self._lock:
            self.dense_nonfinite_zeroed += n

    def retried(self, _exc: BaseException) -> None:
        with self._lock:
            self.retries += 1

    def to_dict(self) -> dict:
        return {
            "rows_read": self.rows_read,
            "batches": self.batches,
            "rows_quarantined": self.rows_quarantined,
            "quarantined": [asdict(r) for r in self.quarantined],
            "rows_dropped_remainder": self.rows_dropped_remainder,
            "rows_repeated": self.rows_repeated,
            "events_truncated": self.events_truncated,
            "retries": self.retries,
            "dense_nonfinite_zeroed": self.dense_nonfinite_zeroed,
            "padding": self.padding.to_dict(),
        }
