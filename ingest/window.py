"""A shuffle window's rows: cutting the read stream into windows and gathering a batch's rows.

Rows stay in the record batches they were decoded into (zero-copy slices of the row groups); a
batch is a list of `(record batch, rows)` parts that the converter gathers from, once.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ingest.convert import Rows, list_offsets


def split_rows(pending: list[tuple[pa.Table | None, int]], n: int):
    """The first `n` rows of the pending parts, and the rest."""
    out, rest, need = [], [], n
    for i, (t, rows) in enumerate(pending):
        if need == 0:
            rest = pending[i:]
            break
        if rows <= need:
            out.append((t, rows))
            need -= rows
        else:
            out.append((None if t is None else t.slice(0, need), need))
            rest = [(None if t is None else t.slice(need), rows - need)] + pending[i + 1:]
            need = 0
            break
    return out, rest


class WindowRows:
    """A window's rows as record batches (zero-copy pieces of the row groups read)."""

    def __init__(self, tables: list[pa.Table]):
        self.batches = [rb for t in tables for rb in t.to_batches() if rb.num_rows]
        self.starts = np.cumsum([0] + [rb.num_rows for rb in self.batches]).astype(np.int64)
        self.lengths_cache: dict[str, np.ndarray] = {}

    def column_lengths(self, column: str) -> np.ndarray:
        if column not in self.lengths_cache:
            parts = []
            for rb in self.batches:
                offs, valid = list_offsets(rb.column(column))
                ln = np.diff(offs.astype(np.int64))
                parts.append(np.where(valid, ln, 0) if valid is not None else ln)
            self.lengths_cache[column] = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return self.lengths_cache[column]


def window_rows(window: list[tuple[pa.Table | None, int]]):
    tables = [t for t, _ in window if t is not None]
    valid = None
    if len(tables) != len(window):
        valid = np.concatenate([np.full(n, t is not None) for t, n in window]) if window \
            else np.zeros(0, bool)
    return (WindowRows(tables) if tables else None), valid


def take_rows(rows_of: WindowRows | None, rows: np.ndarray) -> Rows:
    """Rows (ascending) of a window as `(record batch, rows)` parts for `table_to_batch`: a slice
    where they are consecutive, else the record batch and the picked indices (gathered once, by
    the converter, straight into the batch's buffers)."""
    if rows_of is None or len(rows) == 0:
        return []
    k = np.searchsorted(rows_of.starts, rows, side="right") - 1
    cut = np.flatnonzero(np.diff(k)) + 1
    parts: Rows = []
    for grp in np.split(np.arange(len(rows)), cut):
        b = int(k[grp[0]])
        local = rows[grp] - rows_of.starts[b]
        rb = rows_of.batches[b]
        if local[-1] - local[0] == len(local) - 1:
            parts.append((rb.slice(int(local[0]), len(local)), None))
        else:
            parts.append((rb, local))
    return parts


def table_rows(tables: list[pa.Table]) -> Rows:
    """All rows of the tables, in order, as `(record batch, None)` parts (no copy)."""
    return [(rb, None) for t in tables for rb in t.to_batches() if rb.num_rows]
