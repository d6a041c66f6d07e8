"""Arrow -> `JaggedBatch`, vectorised, without padding and copying only where it must.

The input is a table or record batch, or the rows a shuffle window picked: a list of
`(record batch, rows)` parts (`rows` ascending indices into the record batch, None: all of it).
A batch of picked rows is gathered straight from the window's record batches into the batch's
buffers, once; no Arrow-level `take` or concatenation comes first.

A sequence is one `list<struct<fields>>` column: its offsets come straight from the Arrow offsets
buffer (sliced arrays and `offsets[0] != 0` handled, int32 or int64 offsets) and, for one record
batch of consecutive rows, each field's values are a zero-copy view of the child buffer. A copy
happens only where it must:

- picked (shuffled) rows: each field's kept values are gathered with one vectorised index;
- a list longer than the sequence's `max_length` is cut to its most recent events (its END), which
  gathers the kept events with one vectorised index (no per-row loop);
- a null list whose slot still spans child values (Arrow allows that) is treated as empty (same gather);
- nulls inside values are filled with 0 (an id 0, a float 0.0);
- the KeyedJaggedTensor needs all ids in one values tensor: each id field is copied (or gathered)
  straight into its place in that tensor, once;
- `hash: true` ids are hashed into the table range (`features.hashing.hash_ids`);
- sequences with several float fields are stacked into `[ΣL, k]` (one float field stays a view);
- `dense` and `labels` gather several columns into one `[B, F]` / `[B, T]` tensor.

Non-hashed ids outside `[0, num_embeddings)` are an error (the embedding lookup would fail later
with a message naming nothing), except for keys the caller knows to be in range (`ids_in_range`,
from the files' statistics). Null labels count as unobserved (`label_mask` 0); a label with
`mask: other` is observed only where `other` is 1 (and observed). A null weight counts as 1.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
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

__all__ = ["table_to_batch", "list_offsets", "JaggedColumn", "Rows"]

# Rows picked from record batches: (record batch, ascending row indices or None for all rows).
Rows = list[tuple[pa.RecordBatch, "np.ndarray | None"]]


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
    """Rows of one list array (all, or picked ones), each cut to at most `max_length` most recent events.

    `offsets` are rebased int64 `[B+1]`; `take(child)` returns the kept values of a child array of
    the list's values, a zero-copy view when all rows are kept whole and in order.
    """

    offsets: np.ndarray
    lengths: np.ndarray
    truncated: int
    _start: int
    _stop: int
    _index: np.ndarray | None  # child indices to gather, relative to _start; None = all of [_start, _stop)
    truncated_rows: int = 0  # rows whose history was longer than max_length

    @staticmethod
    def of(arr: pa.Array, max_length: int | None = None, rows: np.ndarray | None = None) -> JaggedColumn:
        offs, valid = list_offsets(arr)
        raw = offs.astype(np.int64, copy=False)
        if rows is None:
            starts, ends = raw[:-1], raw[1:]
        else:
            starts, ends = raw[rows], raw[rows + 1]
            valid = None if valid is None else valid[rows]
        lengths = ends - starts
        if valid is not None:
            lengths = np.where(valid, lengths, 0)
        kept = lengths if max_length is None else np.minimum(lengths, max_length)
        b = len(kept)
        out = np.empty(b + 1, dtype=np.int64)
        out[0] = 0
        np.cumsum(kept, out=out[1:])
        total = int(out[-1])
        truncated = int(lengths.sum()) - total
        start = int(raw[0]) if len(raw) else 0
        stop = int(raw[-1]) if len(raw) else 0
        index = None
        if rows is not None or total != stop - start:
            # Row i keeps child[ends[i] - kept[i] : ends[i]]: shift a running arange per row.
            index = np.repeat(ends - kept - out[:-1] - start, kept) + np.arange(total, dtype=np.int64)
        cut_rows = int((lengths > max_length).sum()) if truncated else 0
        return JaggedColumn(out, kept.astype(np.int64, copy=False), truncated, start, stop, index, cut_rows)

    @property
    def size(self) -> int:
        return int(self.offsets[-1])

    def take(self, child: pa.Array, fill=0, out: np.ndarray | None = None) -> np.ndarray:
        """The kept values of `child` (a view where possible), or written into `out`."""
        src = _np(child.slice(self._start, self._stop - self._start), fill)
        if self._index is None:
            if out is None:
                return src
            out[...] = src
            return out
        if out is None:
            return src[self._index]
        if out.dtype == src.dtype:
            # mode="clip": the indices are in range by construction, and numpy's default mode
            # ("raise") first gathers into a temporary and then copies it into `out`.
            np.take(src, self._index, out=out, mode="clip")
        else:
            out[...] = src[self._index]
        return out


def _parts(data: pa.Table | pa.RecordBatch | Rows, schema: FeatureSchema) -> Rows:
    if isinstance(data, pa.RecordBatch):
        parts = [(data, None)] if data.num_rows else []
        empty_schema = data.schema
    elif isinstance(data, pa.Table):
        parts = [(rb, None) for rb in data.to_batches() if rb.num_rows]
        empty_schema = data.schema
    else:
        parts = [(rb, rows) for rb, rows in data if (rb.num_rows if rows is None else len(rows))]
        empty_schema = schema.arrow_schema()
    if parts:
        return parts
    empty = pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in empty_schema], schema=empty_schema)
    return [(empty, None)]


def _flat(parts: Rows, name: str, fill=0) -> np.ndarray:
    """A primitive column over the parts: a view for one part of consecutive rows, else one gather."""
    arrs = []
    for rb, rows in parts:
        a = _np(rb.column(name), fill)
        arrs.append(a if rows is None else a[rows])
    return arrs[0] if len(arrs) == 1 else np.concatenate(arrs)


def _valid(parts: Rows, name: str) -> np.ndarray | None:
    """Validity of a column over the parts, None when it holds no nulls."""
    if not any(rb.column(name).null_count for rb, _ in parts):
        return None
    out = []
    for rb, rows in parts:
        v = rb.column(name).is_valid().to_numpy(zero_copy_only=False)
        out.append(v if rows is None else v[rows])
    return np.concatenate(out)


def _dtype(arr: pa.Array) -> np.dtype:
    return np.dtype(arr.type.to_pandas_dtype())


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


class _Jagged:
    """A list column over the parts: offsets across all of them, and per-field kept values.

    One part of consecutive rows: the values are views of its buffers. Several parts (a shuffled
    batch picked from a window's record batches): each part's kept values are gathered into one
    output, once.
    """

    def __init__(self, parts: Rows, name: str, max_length: int | None):
        self.arrays = [rb.column(name) for rb, _ in parts]
        self.cols = [JaggedColumn.of(a, max_length, rows) for a, (_, rows) in zip(self.arrays, parts)]
        if len(self.cols) == 1:
            self.offsets, self.lengths = self.cols[0].offsets, self.cols[0].lengths
        else:
            self.lengths = np.concatenate([c.lengths for c in self.cols])
            self.offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
            np.cumsum(self.lengths, out=self.offsets[1:])
        self.size = int(self.offsets[-1])
        self.truncated = sum(c.truncated for c in self.cols)
        self.truncated_rows = sum(c.truncated_rows for c in self.cols)

    @staticmethod
    def _child(arr: pa.Array, name: str | None) -> pa.Array:
        return arr.values if name is None else arr.values.field(name)

    def field(self, name: str | None, fill=0, out: np.ndarray | None = None) -> np.ndarray:
        """Kept values of a struct field (`name`) or of the list's own values (`None`), or into `out`."""
        if len(self.cols) == 1:
            return self.cols[0].take(self._child(self.arrays[0], name), fill, out)
        if out is None:
            out = np.empty(self.size, dtype=_dtype(self._child(self.arrays[0], name)))
        pos = 0
        for arr, c in zip(self.arrays, self.cols):
            c.take(self._child(arr, name), fill, out[pos:pos + c.size])
            pos += c.size
        return out


def _id_writer(values: Callable[[np.ndarray | None], np.ndarray], key: str, n: int, hashed: bool,
               proven: frozenset[str]) -> Callable[[np.ndarray], None]:
    """Writes a key's ids into its slice of the KJT values: copied (or gathered) once, then checked
    in place, or hashed."""
    def write(dst: np.ndarray) -> None:
        if hashed:
            dst[...] = hash_ids(values(None), n)
            return
        values(dst)
        if key not in proven:
            _check_ids(dst, n, key)
    return write


def _sequence(parts: Rows, seq: SequenceSpec, schema: FeatureSchema, proven: frozenset[str], writers, sizes):
    col = _Jagged(parts, seq.name, seq.max_length)
    for f in seq.id_fields:
        key = seq.key(f.name)
        sizes[key] = (col.size, col.lengths)
        writers[key] = _id_writer(lambda out, name=f.name: col.field(name, 0, out), key,
                                  schema.table(f.table).num_embeddings, f.hash, proven)
    floats = [col.field(f.name, 0.0) for f in seq.float_fields]
    if len(floats) == 1:
        seq_floats = _t(floats[0]).view(-1, 1)  # still a view of the Arrow buffer (one part)
    elif floats:
        seq_floats = _t(np.stack(floats, axis=1))
    else:
        seq_floats = torch.empty((col.size, 0), dtype=torch.float32)
    ts = None
    if seq.timestamp_field is not None:
        ts = _t(col.field(seq.timestamp_field.name))
    stats = SequenceStats.of_lengths(_t(col.lengths), seq.max_length, col.truncated)
    stats.truncated_rows = col.truncated_rows
    return col, seq_floats, ts, stats


def table_to_batch(data: pa.Table | pa.RecordBatch | Rows, schema: FeatureSchema, *, check: bool = True,
                   ids_in_range: frozenset[str] = frozenset()) -> JaggedBatch:
    """One Arrow table or record batch (columns as in `schema.arrow_schema()`), or rows picked from
    record batches (`Rows`), -> a `JaggedBatch`.

    `check=False` skips the column check, for callers that checked the file's schema already.
    `ids_in_range`: sparse keys whose ids are known to lie in their tables' ranges (from the
    files' column statistics, `ingest.id_stats`); their per-batch range check is skipped.
    """
    parts = _parts(data, schema)
    if check:
        for got in {id(rb.schema): rb.schema for rb, _ in parts}.values():
            problems = check_arrow_schema(schema.arrow_schema(), got, allow_extra=True)
            if problems:
                raise DataError("batch does not match schema '" + schema.name + "': "
                                + "; ".join(str(p) for p in problems))
    b = sum(rb.num_rows if rows is None else len(rows) for rb, rows in parts)
    writers: dict[str, Callable[[np.ndarray], None]] = {}
    sizes: dict[str, tuple[int, np.ndarray]] = {}
    seq_offsets, seq_floats, seq_timestamps = {}, {}, {}
    stats = PaddingStats()
    for seq in schema.sequences:
        col, floats, ts, st = _sequence(parts, seq, schema, ids_in_range, writers, sizes)
        seq_offsets[seq.name] = _t(col.offsets)
        seq_floats[seq.name] = floats
        if ts is not None:
            seq_timestamps[seq.name] = ts
        stats.sequences[seq.name] = st

    for f in schema.id_features:
        n = schema.table(f.table).num_embeddings
        if f.type == "id":
            def flat(out, name=f.name):
                v = _flat(parts, name)
                if out is None:
                    return v
                out[...] = v
                return out
            sizes[f.name] = (b, np.ones(b, dtype=np.int64))
            writers[f.name] = _id_writer(flat, f.name, n, f.hash, ids_in_range)
        else:
            col = _Jagged(parts, f.name, None)
            sizes[f.name] = (col.size, col.lengths)
            writers[f.name] = _id_writer(lambda out, c=col: c.field(None, 0, out), f.name, n, f.hash, ids_in_range)

    keys = list(schema.sparse_keys)
    values = np.empty(sum(sizes[k][0] for k in keys), dtype=np.int64)
    pos = 0
    for k in keys:
        writers[k](values[pos:pos + sizes[k][0]])
        pos += sizes[k][0]
    lengths = np.concatenate([sizes[k][1] for k in keys]) if keys else np.empty(0, dtype=np.int64)
    # The per-key totals are known here; given to the KJT, a device copy of it never reads them back from the GPU.
    per_key = [int(sizes[k][0]) for k in keys]
    sparse = KeyedJaggedTensor(keys=keys, values=_t(values), lengths=_t(lengths), stride=b,
                               length_per_key=per_key, offset_per_key=[0, *np.cumsum(per_key).tolist()])

    dense = _dense(parts, schema, b)
    labels, label_mask, weights = _labels(parts, schema, b)
    row_ids, metadata = _metadata(parts, schema, b)
    return JaggedBatch(sparse=sparse, seq_offsets=seq_offsets, seq_floats=seq_floats,
                       seq_timestamps=seq_timestamps, dense=dense, labels=labels, label_mask=label_mask,
                       weights=weights, row_ids=row_ids, metadata=metadata, stats=stats)


def _dense(parts: Rows, schema: FeatureSchema, b: int) -> torch.Tensor:
    out = np.zeros((b, schema.dense_dim), dtype=np.float32)
    j = 0
    for f in schema.dense_features:
        if f.type == "float":
            out[:, j] = _flat(parts, f.name, 0.0)
            j += 1
            continue
        i = 0
        for rb, rows in parts:
            arr = rb.column(f.name)
            n = len(arr)
            block = _np(arr.values.slice(arr.offset * f.dim, n * f.dim), 0.0).reshape(n, f.dim)
            if arr.null_count:
                block = np.where(arr.is_valid().to_numpy(zero_copy_only=False)[:, None], block, 0.0)
            if rows is not None:
                block = block[rows]
            out[i:i + len(block), j:j + f.dim] = block
            i += len(block)
        j += f.dim
    return _t(out)


def _labels(parts: Rows, schema: FeatureSchema, b: int):
    t = len(schema.labels)
    labels = np.zeros((b, t), dtype=np.float32)
    observed = np.ones((b, t), dtype=np.float32)
    weights = np.ones((b, t), dtype=np.float32)
    index = {label.name: i for i, label in enumerate(schema.labels)}
    for i, label in enumerate(schema.labels):
        labels[:, i] = _flat(parts, label.name, 0.0)
        valid = _valid(parts, label.name)
        if valid is not None:
            observed[:, i] = valid
        if label.weight:
            weights[:, i] = _flat(parts, label.weight, 1.0)
    mask = observed.copy()
    for i, label in enumerate(schema.labels):
        parent, seen = label.mask, set()
        while parent is not None and parent not in seen:  # a chain of masks: all must hold
            seen.add(parent)
            p = index[parent]
            mask[:, i] *= observed[:, p] * (labels[:, p] > 0.5)
            parent = schema.labels[p].mask
    return _t(labels), _t(mask), _t(weights)


def _metadata(parts: Rows, schema: FeatureSchema, b: int):
    row_ids = None
    meta: dict[str, torch.Tensor] = {}
    for name, kind in schema.metadata.items():
        if kind == "string":
            continue  # strings are carried in the Parquet only; a tensor cannot hold them
        v = _t(_flat(parts, name))
        if name == "row_id":
            row_ids = v.to(torch.int64)
        else:
            meta[name] = v
    if row_ids is None:
        row_ids = torch.full((b,), -1, dtype=torch.int64)
    return row_ids, meta
