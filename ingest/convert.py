"""Arrow -> `JaggedBatch`, vectorised, without padding and copying only where it must.

A sequence is one `list<struct<fields>>` column: its offsets come straight from the Arrow offsets
buffer (sliced arrays and `offsets[0] != 0` handled, int32 or int64 offsets) and each field's values
are a zero-copy view of the child buffer. A copy happens only where it must:

- a list longer than the sequence's `max_length` is cut to its most recent events (its END), which
  gathers the kept events with one vectorised index (no per-row loop);
- a null list whose slot still spans child values (Arrow allows that) is treated as empty (same gather);
- nulls inside values are filled with 0 (an id 0, a float 0.0);
- the KeyedJaggedTensor needs all ids in one values tensor (one concatenation);
- `hash: true` ids are hashed into the table range (`features.hashing.hash_ids`);
- sequences with several float fields are stacked into `[ΣL, k]` (one float field stays a view);
- `dense` and `labels` gather several columns into one `[B, F]` / `[B, T]` tensor.

Non-hashed ids outside `[0, num_embeddings)` are an error (the embedding lookup would fail later
with a message naming nothing). Null labels count as unobserved (`label_mask` 0); a label with
`mask: other` is observed only where `other` is 1 (and observed). A null weight counts as 1.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from features.arrow import check_arrow_schema
from features.hashing import hash_ids
from features.schema import FeatureSchema, SequenceSpec
from ingest.batch import JaggedBatch, PaddingStats, SequenceStats
from ingest.errors import DataError

# Arrow buffers are immutable; torch only warns that the tensor must not be written in place.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

__all__ = ["table_to_batch", "list_offsets", "JaggedColumn"]


def _np(arr: pa.Array, fill=0) -> np.ndarray:
    """A primitive Arrow array as numpy: a zero-copy view unless it holds nulls (then filled)."""
    if arr.null_count:
        arr = arr.fill_null(fill)
    return arr.to_numpy(zero_copy_only=False)


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a)


def list_offsets(arr: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """The raw offsets `[B+1]` of a (large) list array, NOT rebased, and its validity (None: no nulls).

    `arr.offsets` already minds the slice offset; the values it points into are `arr.values`.
    """
    offs = arr.offsets.to_numpy(zero_copy_only=False)
    valid = None
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
    return offs, valid


@dataclass
class JaggedColumn:
    """A list column cut to at most `max_length` most recent events.

    `offsets` are rebased int64 `[B+1]`; `take(child)` returns the kept values of a child array of
    the list's values, a zero-copy view when nothing had to be dropped.
    """

    offsets: np.ndarray
    lengths: np.ndarray
    truncated: int
    _start: int
    _stop: int
    _index: np.ndarray | None  # absolute child indices to gather, None = contiguous [_start, _stop)
    truncated_rows: int = 0  # rows whose history was longer than max_length

    @staticmethod
    def of(arr: pa.Array, max_length: int | None = None) -> JaggedColumn:
        offs, valid = list_offsets(arr)
        raw = offs.astype(np.int64, copy=False)
        starts, ends = raw[:-1], raw[1:]
        lengths = ends - starts
        gather = False
        if valid is not None and np.any(lengths[~valid]):
            lengths = np.where(valid, lengths, 0)
            gather = True
        elif valid is not None:
            lengths = lengths.copy()  # zero-length null slots: nothing to move
        kept = lengths if max_length is None else np.minimum(lengths, max_length)
        truncated = int(lengths.sum() - kept.sum()) if max_length is not None else 0
        gather = gather or truncated > 0
        b = len(lengths)
        out = np.empty(b + 1, dtype=np.int64)
        out[0] = 0
        np.cumsum(kept, out=out[1:])
        start = int(raw[0]) if b else 0
        stop = int(raw[-1]) if b else 0
        index = None
        if gather:
            total = int(out[-1])
            # Row i keeps child[ends[i] - kept[i] : ends[i]]: shift a running arange per row.
            index = np.repeat(ends - kept - out[:-1], kept) + np.arange(total, dtype=np.int64)
        cut_rows = int((lengths > max_length).sum()) if truncated else 0
        return JaggedColumn(out, kept.astype(np.int64, copy=False), truncated, start, stop, index, cut_rows)

    def take(self, child: pa.Array, fill=0) -> np.ndarray:
        if self._index is None:
            return _np(child.slice(self._start, self._stop - self._start), fill)
        part = _np(child.slice(self._start, self._stop - self._start), fill)
        return part[self._index - self._start]


def _column(data: pa.Table | pa.RecordBatch, name: str) -> pa.Array:
    col = data.column(name)
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            return col.chunk(0)
        if col.num_chunks == 0:
            return pa.array([], type=col.type)
        return pa.concat_arrays(col.chunks)  # one copy; the loader feeds single-chunk batches
    return col


def _check_ids(values: np.ndarray, num_embeddings: int, key: str) -> None:
    if values.size == 0:
        return
    # One pass: as unsigned, negative ids are huge, so the max alone finds both kinds of bad id.
    if int(values.view(np.uint64).max()) >= num_embeddings:
        lo, hi = int(values.min()), int(values.max())
        bad = lo if lo < 0 else hi
        raise DataError(
            f"id feature '{key}' holds id {bad}, outside its table's range [0, {num_embeddings}) "
            f"(set `hash: true` on the feature to hash raw ids, or raise num_embeddings)"
        )


def _ids(values: np.ndarray, key: str, schema: FeatureSchema, table: str, hashed: bool,
         proven: frozenset[str]) -> np.ndarray:
    n = schema.table(table).num_embeddings
    if hashed:
        return hash_ids(values, n)
    if key not in proven:
        _check_ids(values, n, key)
    return values


class _Jagged:
    """A list column over one or more chunks: offsets across all of them, and per-field values.

    One chunk: the values are views of its buffers. Several chunks (a shuffled batch gathered from
    several row groups): each chunk's kept values are concatenated once, with no Arrow-level concat.
    """

    def __init__(self, data, name: str, max_length: int | None):
        col = data.column(name)
        self.chunks = [c for c in col.chunks if len(c)] if isinstance(col, pa.ChunkedArray) else [col]
        if not self.chunks:
            self.chunks = [pa.array([], type=col.type)]
        self.cols = [JaggedColumn.of(c, max_length) for c in self.chunks]
        if len(self.cols) == 1:
            self.offsets, self.lengths = self.cols[0].offsets, self.cols[0].lengths
        else:
            self.lengths = np.concatenate([c.lengths for c in self.cols])
            self.offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
            np.cumsum(self.lengths, out=self.offsets[1:])
        self.truncated = sum(c.truncated for c in self.cols)
        self.truncated_rows = sum(c.truncated_rows for c in self.cols)

    def field(self, name: str | None, fill=0) -> np.ndarray:
        """Kept values of a struct field (`name`) or of the list's own values (`None`)."""
        parts = [c.take(ch.values if name is None else ch.values.field(name), fill)
                 for c, ch in zip(self.cols, self.chunks)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _sequence(data, seq: SequenceSpec, schema: FeatureSchema, proven: frozenset[str]):
    col = _Jagged(data, seq.name, seq.max_length)
    ids = {}
    for f in seq.id_fields:
        key = seq.key(f.name)
        ids[key] = _ids(col.field(f.name), key, schema, f.table, f.hash, proven)
    floats = [col.field(f.name, 0.0) for f in seq.float_fields]
    if len(floats) == 1:
        seq_floats = _t(floats[0]).view(-1, 1)  # still a view of the Arrow buffer (one chunk)
    elif floats:
        seq_floats = _t(np.stack(floats, axis=1))
    else:
        seq_floats = torch.empty((int(col.offsets[-1]), 0), dtype=torch.float32)
    ts = None
    if seq.timestamp_field is not None:
        ts = _t(col.field(seq.timestamp_field.name))
    stats = SequenceStats.of_lengths(_t(col.lengths), seq.max_length, col.truncated)
    stats.truncated_rows = col.truncated_rows
    return col, ids, seq_floats, ts, stats


def table_to_batch(data: pa.Table | pa.RecordBatch, schema: FeatureSchema, *, check: bool = True,
                   ids_in_range: frozenset[str] = frozenset()) -> JaggedBatch:
    """One Arrow table or record batch (columns as in `schema.arrow_schema()`) -> a `JaggedBatch`.

    `check=False` skips the column check, for callers that checked the file's schema already.
    `ids_in_range`: sparse keys whose ids are known to lie in their tables' ranges (from the
    files' column statistics, `ingest.id_stats`); their per-batch range check is skipped.
    """
    problems = check_arrow_schema(schema.arrow_schema(), data.schema, allow_extra=True) if check else []
    if problems:
        raise DataError("batch does not match schema '" + schema.name + "': "
                        + "; ".join(str(p) for p in problems))
    b = data.num_rows
    key_values: dict[str, np.ndarray] = {}
    key_lengths: dict[str, np.ndarray] = {}
    seq_offsets, seq_floats, seq_timestamps = {}, {}, {}
    stats = PaddingStats()
    for seq in schema.sequences:
        col, ids, floats, ts, st = _sequence(data, seq, schema, ids_in_range)
        for key, v in ids.items():
            key_values[key] = v
            key_lengths[key] = col.lengths
        seq_offsets[seq.name] = _t(col.offsets)
        seq_floats[seq.name] = floats
        if ts is not None:
            seq_timestamps[seq.name] = ts
        stats.sequences[seq.name] = st

    for f in schema.id_features:
        if f.type == "id":
            values = _np(_column(data, f.name))
            lengths = np.ones(b, dtype=np.int64)
        else:
            col = _Jagged(data, f.name, None)
            values = col.field(None)
            lengths = col.lengths
        key_values[f.name] = _ids(values, f.name, schema, f.table, f.hash, ids_in_range)
        key_lengths[f.name] = lengths

    keys = list(schema.sparse_keys)
    values = np.concatenate([key_values[k].astype(np.int64, copy=False) for k in keys]) if keys \
        else np.empty(0, dtype=np.int64)
    lengths = np.concatenate([key_lengths[k] for k in keys]) if keys else np.empty(0, dtype=np.int64)
    sparse = KeyedJaggedTensor(keys=keys, values=_t(values), lengths=_t(lengths))

    dense = _dense(data, schema, b)
    labels, label_mask, weights = _labels(data, schema, b)
    row_ids, metadata = _metadata(data, schema, b)
    return JaggedBatch(sparse=sparse, seq_offsets=seq_offsets, seq_floats=seq_floats,
                       seq_timestamps=seq_timestamps, dense=dense, labels=labels, label_mask=label_mask,
                       weights=weights, row_ids=row_ids, metadata=metadata, stats=stats)


def _dense(data, schema: FeatureSchema, b: int) -> torch.Tensor:
    out = np.zeros((b, schema.dense_dim), dtype=np.float32)
    j = 0
    for f in schema.dense_features:
        arr = _column(data, f.name)
        if f.type == "float":
            out[:, j] = _np(arr, 0.0)
            j += 1
            continue
        flat = arr.values.slice(arr.offset * f.dim, b * f.dim)
        out[:, j:j + f.dim] = _np(flat, 0.0).reshape(b, f.dim)
        if arr.null_count:
            out[~arr.is_valid().to_numpy(zero_copy_only=False), j:j + f.dim] = 0.0
        j += f.dim
    return _t(out)


def _labels(data, schema: FeatureSchema, b: int):
    t = len(schema.labels)
    labels = np.zeros((b, t), dtype=np.float32)
    observed = np.ones((b, t), dtype=np.float32)
    weights = np.ones((b, t), dtype=np.float32)
    index = {label.name: i for i, label in enumerate(schema.labels)}
    for i, label in enumerate(schema.labels):
        arr = _column(data, label.name)
        labels[:, i] = _np(arr, 0.0)
        if arr.null_count:
            observed[:, i] = arr.is_valid().to_numpy(zero_copy_only=False)
        if label.weight:
            weights[:, i] = _np(_column(data, label.weight), 1.0)
    mask = observed.copy()
    for i, label in enumerate(schema.labels):
        parent, seen = label.mask, set()
        while parent is not None and parent not in seen:  # a chain of masks: all must hold
            seen.add(parent)
            p = index[parent]
            mask[:, i] *= observed[:, p] * (labels[:, p] > 0.5)
            parent = schema.labels[p].mask
    return _t(labels), _t(mask), _t(weights)


def _metadata(data, schema: FeatureSchema, b: int):
    row_ids = None
    meta: dict[str, torch.Tensor] = {}
    for name, kind in schema.metadata.items():
        if kind == "string":
            continue  # strings are carried in the Parquet only; a tensor cannot hold them
        v = _t(_np(_column(data, name)))
        if name == "row_id":
            row_ids = v.to(torch.int64)
        else:
            meta[name] = v
    if row_ids is None:
        row_ids = torch.full((b,), -1, dtype=torch.int64)
    return row_ids, meta
