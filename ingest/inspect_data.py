"""`gemtrain data inspect`: what is in a dataset, and what the loader would reject, before training on it.

One pass over every row group (all schema columns) gives:
- per file: the schema check and row/row-group counts; files or row groups the loader would
  quarantine (`on_bad_file: quarantine`) or stop on, with the same reasons (`ingest.reader`);
- per feature: null rate, a cardinality estimate (k-minimum-values sketch over splitmix64 hashes,
  exact below `SKETCH_K` distinct values), the id range against the table size;
- row problems that would stop a run (`ingest.convert` raises on them): non-hashed ids outside
  `[0, num_embeddings)`; and warnings: histories longer than `max_length` (truncated), events not
  in time order or not before `request_ts`, labels outside {0, 1}, a masked label set where its mask
  label is 0, NaN/inf floats, duplicate `row_id`s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.hashing import splitmix64
from features.schema import FeatureSchema
from ingest.errors import BadFileError
from ingest.listing import list_files
from ingest.reader import RetryPolicy, read_footer, read_row_group

SKETCH_K = 4096
EXAMPLES = 3


def _smallest_distinct(h: np.ndarray, sketch: np.ndarray) -> np.ndarray:
    """The SKETCH_K smallest distinct values of `h` that could still enter a sketch (cheaply)."""
    if sketch.size >= SKETCH_K:
        h = h[h < sketch[-1]]  # a full sketch admits only hashes below its largest
    m = 8 * SKETCH_K
    if h.size > m:
        part = np.unique(np.partition(h, m - 1)[:m])  # every value below part's max is in part
        if part.size >= SKETCH_K:
            return part[:SKETCH_K]
    return np.unique(h)[:SKETCH_K]


@dataclass
class ColumnStats:
    name: str
    kind: str  # id | id_list | float | float_vector | sequence id | sequence float | timestamp | label | ...
    table: str | None = None
    table_size: int | None = None
    hashed: bool = False
    values: int = 0  # values seen (list elements for lists)
    nulls: int = 0
    min: int | float | None = None
    max: int | float | None = None
    out_of_range: int = 0  # values outside [0, table_size) for non-hashed ids
    non_finite: int = 0
    _sketch: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64), repr=False)

    @property
    def null_rate(self) -> float:
        return self.nulls / (self.values + self.nulls) if self.values + self.nulls else 0.0

    @property
    def cardinality(self) -> int | None:
        """Distinct values: exact below SKETCH_K, else the KMV estimate (about 1.6% error)."""
        if self.kind not in ("id", "id_list", "sequence id"):
            return None
        k = self._sketch.size
        if k < SKETCH_K:
            return int(k)
        return int((SKETCH_K - 1) / (float(self._sketch[-1]) / 2.0**64))

    def add(self, values: np.ndarray, nulls: int) -> None:
        self.values += int(values.size)
        self.nulls += nulls
        if values.size == 0:
            return
        if values.dtype.kind == "f":
            finite = np.isfinite(values)
            self.non_finite += int(values.size - finite.sum())
            values = values[finite]
            if values.size == 0:
                return
        lo, hi = values.min().item(), values.max().item()  # ints stay ints
        self.min = lo if self.min is None else min(self.min, lo)
        self.max = hi if self.max is None else max(self.max, hi)
        if self.kind in ("id", "id_list", "sequence id"):
            self._sketch = np.union1d(self._sketch, _smallest_distinct(splitmix64(values), self._sketch))[:SKETCH_K]

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "table": self.table, "table_size": self.table_size,
                "hashed": self.hashed, "values": self.values, "nulls": self.nulls, "null_rate": self.null_rate,
                "cardinality": self.cardinality, "min": self.min, "max": self.max,
                "out_of_range": self.out_of_range, "non_finite": self.non_finite}


@dataclass
class Problem:
    severity: str  # "quarantine" (the loader skips these rows) | "error" (stops a run) | "warning"
    what: str
    rows: int
    where: list[str] = field(default_factory=list)  # up to EXAMPLES places (file, row group, row)

    def __str__(self) -> str:
        at = f" (e.g. {'; '.join(self.where)})" if self.where else ""
        return f"{self.severity}: {self.what}: {self.rows:,} row(s){at}"


@dataclass
class FileInfo:
    url: str
    rows: int | None
    row_groups: int | None
    ok: bool
    reason: str | None = None


@dataclass
class InspectReport:
    schema: str
    files: list[FileInfo] = field(default_factory=list)
    rows: int = 0  # rows in readable row groups
    row_groups: int = 0
    columns: dict[str, ColumnStats] = field(default_factory=dict)
    sequences: dict[str, dict] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return any(p.severity in ("quarantine", "error") for p in self.problems)

    def to_dict(self) -> dict:
        return {"schema": self.schema, "rows": self.rows, "row_groups": self.row_groups,
                "files": [vars(f) for f in self.files], "columns": [c.to_dict() for c in self.columns.values()],
                "sequences": self.sequences,
                "problems": [{"severity": p.severity, "what": p.what, "rows": p.rows, "where": p.where}
                             for p in self.problems], "seconds": self.seconds, "failed": self.failed}


class _Problems:
    """Accumulates problems by (severity, what), keeping a few example places."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[str, str], Problem] = {}

    def add(self, severity: str, what: str, rows: int, where: str | list[str]) -> None:
        if rows <= 0 and severity != "quarantine":  # a bad file is reported even when its rows are unknown
            return
        p = self.by_key.setdefault((severity, what), Problem(severity, what, 0))
        p.rows += rows
        for w in [where] if isinstance(where, str) else where:
            if len(p.where) < EXAMPLES:
                p.where.append(w)


def _np(arr: pa.Array) -> tuple[np.ndarray, int]:
    """Non-null values as numpy, and the null count."""
    nulls = arr.null_count
    if nulls:
        arr = pc.drop_null(arr)
    return arr.to_numpy(zero_copy_only=False), nulls


def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    return col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks)


def _row_where(url: str, rg: int, rows: np.ndarray, row_ids: np.ndarray | None) -> list[str]:
    out = []
    for r in rows[:EXAMPLES]:
        rid = f", row_id {int(row_ids[r])}" if row_ids is not None else ""
        out.append(f"{url} row group {rg} row {int(r)}{rid}")
    return out


def _list_rows(arr: pa.ListArray, element_mask: np.ndarray) -> np.ndarray:
    """Rows of a list array holding at least one element where `element_mask` is true."""
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy()
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    rows = np.searchsorted(offsets, np.flatnonzero(element_mask), side="right") - 1
    return np.unique(rows)


def _flat_values(arr: pa.Array) -> pa.Array:
    """The elements of a list array that belong to non-null rows, in row order (handles slices)."""
    return pc.list_flatten(arr)


def inspect_dataset(schema: FeatureSchema, url: str | list[str], *, storage_options: dict | None = None,
                    max_row_groups: int | None = None) -> InspectReport:
    t0 = time.perf_counter()
    expected = schema.arrow_schema()
    rep = InspectReport(schema=schema.name)
    probs = _Problems()
    cols = rep.columns
    for seq in schema.sequences:
        for f in seq.fields:
            kind = {"id": "sequence id", "float": "sequence float", "timestamp": "timestamp"}[f.type]
            t = schema.table(f.table) if f.table else None
            cols[seq.key(f.name)] = ColumnStats(seq.key(f.name), kind, f.table, t.num_embeddings if t else None, f.hash)
        rep.sequences[seq.name] = {"rows": 0, "events": 0, "max_length": seq.max_length, "longest": 0,
                                   "truncated_rows": 0, "truncated_events": 0, "empty_or_null": 0}
    for f in schema.features:
        t = schema.table(f.table) if f.table else None
        cols[f.name] = ColumnStats(f.name, f.type, f.table, t.num_embeddings if t else None, f.hash)
    for label in schema.labels:
        cols[label.name] = ColumnStats(label.name, "label")
        if label.weight:
            cols[label.weight] = ColumnStats(label.weight, "weight")
    for name, typ in schema.metadata.items():
        cols[name] = ColumnStats(name, f"metadata {typ}")
    row_id_parts: list[np.ndarray] = []
    policy = RetryPolicy()
    budget = max_row_groups
    for ref in list_files(url, storage_options):
        footer = read_footer(ref, expected, policy)
        md = footer.metadata
        if md is None:
            rep.files.append(FileInfo(ref.url, footer.rows, len(footer.row_group_rows) if footer.row_group_rows else None,
                                      False, footer.error))
            probs.add("quarantine", f"file: {footer.error}", footer.rows or 0, ref.url)
            continue
        rep.files.append(FileInfo(ref.url, md.num_rows, md.num_row_groups, True))
        for rg in range(md.num_row_groups):
            if budget is not None:
                if budget <= 0:
                    break
                budget -= 1
            want = md.row_group(rg).num_rows
            try:
                table = read_row_group(ref, md, rg, expected.names, policy)
            except BadFileError as e:
                probs.add("quarantine", f"row group: {e.reason.split(':')[0]}", want, f"{ref.url} row group {rg}: "
                          f"{e.reason[:200]}")
                continue
            if table.num_rows != want:
                probs.add("quarantine", "row group: row count differs from the footer", want,
                          f"{ref.url} row group {rg}")
                continue
            rep.rows += table.num_rows
            rep.row_groups += 1
            row_ids = _column(table, "row_id").to_numpy(zero_copy_only=False) if "row_id" in schema.metadata else None
            if row_ids is not None:
                row_id_parts.append(row_ids)
            _inspect_table(schema, table, ref.url, rg, row_ids, rep, probs)
    if row_id_parts:
        ids = np.concatenate(row_id_parts)
        uniq, counts = np.unique(ids, return_counts=True)
        dup = counts > 1
        probs.add("warning", "row_id: duplicate values (exactly-once checks cannot tell these rows apart)",
                  int(counts[dup].sum()), [f"row_id {int(v)}" for v in uniq[dup][:EXAMPLES]])
    order = {"quarantine": 0, "error": 1, "warning": 2}
    rep.problems = sorted(probs.by_key.values(), key=lambda p: (order[p.severity], -p.rows))
    rep.seconds = time.perf_counter() - t0
    return rep


def _inspect_table(schema: FeatureSchema, table: pa.Table, url: str, rg: int, row_ids, rep: InspectReport,
                   probs: _Problems) -> None:
    cols = rep.columns
    request_ts = None
    if "request_ts" in schema.metadata:
        request_ts = _column(table, "request_ts").to_numpy(zero_copy_only=False)
    for seq in schema.sequences:
        arr = _column(table, seq.name)
        lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy().astype(np.int64)
        st = rep.sequences[seq.name]
        st["rows"] += int(lengths.size)
        st["events"] += int(lengths.sum())
        st["longest"] = max(st["longest"], int(lengths.max()) if lengths.size else 0)
        over = lengths > seq.max_length
        st["truncated_rows"] += int(over.sum())
        st["truncated_events"] += int((lengths[over] - seq.max_length).sum())
        st["empty_or_null"] += int((lengths == 0).sum())
        flat = _flat_values(arr)
        for f in seq.fields:
            c = cols[seq.key(f.name)]
            child = flat.field(f.name)
            values, nulls = _np(child)
            c.add(values, nulls)
            if f.type == "id" and not f.hash and values.size:
                bad_mask = child.to_numpy(zero_copy_only=False)
                bad_mask = np.nan_to_num(bad_mask.astype(np.float64), nan=0.0)
                bad = (bad_mask < 0) | (bad_mask >= c.table_size)
                if bad.any():
                    rows = _list_rows(arr, bad)
                    c.out_of_range += int(bad.sum())
                    probs.add("error", f"{c.name}: ids outside table '{f.table}' range [0, {c.table_size}) "
                              "(the run stops on them: set hash: true or raise num_embeddings)", int(rows.size),
                              _row_where(url, rg, rows, row_ids))
            if f.type == "timestamp" and lengths.sum():
                ts = child.to_numpy(zero_copy_only=False).astype(np.float64)
                offsets = np.concatenate([[0], np.cumsum(lengths)])
                back = np.flatnonzero(np.diff(ts) < 0) + 1  # element index that goes back in time
                starts = set(offsets[:-1].tolist())
                back = np.array([i for i in back if i not in starts], np.int64)
                if back.size:
                    rows = np.unique(np.searchsorted(offsets, back, side="right") - 1)
                    probs.add("warning", f"{c.name}: events not in time order (the model sees them in "
                              "stored order)", int(rows.size), _row_where(url, rg, rows, row_ids))
                if request_ts is not None:
                    row_of = np.repeat(np.arange(lengths.size), lengths)
                    late = ts >= request_ts[row_of].astype(np.float64)
                    if late.any():
                        rows = np.unique(row_of[late])
                        probs.add("warning", f"{c.name}: events at or after the row's request_ts (leakage)",
                                  int(rows.size), _row_where(url, rg, rows, row_ids))
        if over.any():
            rows = np.flatnonzero(over)
            probs.add("warning", f"{seq.name}: histories longer than max_length {seq.max_length} (the oldest "
                      "events are dropped)", int(rows.size), _row_where(url, rg, rows, row_ids))
    for f in schema.features:
        c = cols[f.name]
        arr = _column(table, f.name)
        if f.type in ("id_list", "float_vector"):
            row_nulls = arr.null_count
            values, nulls = _np(_flat_values(arr))
            c.add(values, nulls + row_nulls)
        else:
            values, nulls = _np(arr)
            c.add(values, nulls)
        if nulls and f.type in ("id", "float"):
            what = "ids become 0" if f.type == "id" else "floats become 0.0"
            rows = np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))
            probs.add("warning", f"{f.name}: null values ({what})", int(rows.size), _row_where(url, rg, rows, row_ids))
        if f.type in ("id", "id_list") and not f.hash and values.size:
            bad = (values < 0) | (values >= c.table_size)
            if bad.any():
                c.out_of_range += int(bad.sum())
                if f.type == "id":
                    valid = np.flatnonzero(arr.is_valid().to_numpy(zero_copy_only=False))
                    rows = valid[bad]
                else:
                    rows = _list_rows(arr, bad)
                probs.add("error", f"{f.name}: ids outside table '{f.table}' range [0, {c.table_size}) (the run "
                          "stops on them: set hash: true or raise num_embeddings)", int(rows.size),
                          _row_where(url, rg, rows, row_ids))
        if f.type in ("float", "float_vector") and values.size:
            bad = ~np.isfinite(values)
            if bad.any():
                rows = np.flatnonzero(bad) if f.type == "float" else np.unique(np.flatnonzero(bad) // f.dim)
                probs.add("warning", f"{f.name}: NaN or infinite values", int(rows.size),
                          _row_where(url, rg, rows, row_ids))
    labels = {}
    for label in schema.labels:
        arr = _column(table, label.name)
        values, nulls = _np(arr)
        cols[label.name].add(values, nulls)
        full = arr.to_numpy(zero_copy_only=False).astype(np.float64)
        labels[label.name] = full
        bad = ~np.isnan(full) & (full != 0) & (full != 1)
        if bad.any():
            rows = np.flatnonzero(bad)
            probs.add("warning", f"{label.name}: label values other than 0 and 1", int(rows.size),
                      _row_where(url, rg, rows, row_ids))
        if label.weight:
            w, wn = _np(_column(table, label.weight))
            cols[label.weight].add(w, wn)
    for label in schema.labels:
        if label.mask:
            bad = (labels[label.name] == 1) & (labels[label.mask] == 0)
            if bad.any():
                rows = np.flatnonzero(bad)
                probs.add("warning", f"{label.name}: is 1 where its mask label '{label.mask}' is 0 (those rows are "
                          "not learned from)", int(rows.size), _row_where(url, rg, rows, row_ids))
    for name in schema.metadata:
        arr = _column(table, name)
        if pa.types.is_string(arr.type):
            cols[name].values += len(arr) - arr.null_count
            cols[name].nulls += arr.null_count
        else:
            values, nulls = _np(arr)
            cols[name].add(values, nulls)


def format_report(rep: InspectReport) -> str:
    lines = [f"schema '{rep.schema}': {len(rep.files)} files, {rep.row_groups} readable row groups, "
             f"{rep.rows:,} readable rows ({rep.seconds:.1f}s)"]
    for f in rep.files:
        state = "ok" if f.ok else f"QUARANTINED: {f.reason}"
        lines.append(f"  {f.url}: {f.rows if f.rows is not None else '?'} rows, "
                     f"{f.row_groups if f.row_groups is not None else '?'} row groups: {state}")
    for name, s in rep.sequences.items():
        mean = s["events"] / s["rows"] if s["rows"] else 0.0
        lines.append(f"sequence '{name}': mean length {mean:.1f}, longest {s['longest']}, max_length "
                     f"{s['max_length']}, truncated rows {s['truncated_rows']:,}, empty or null {s['empty_or_null']:,}")
    head = ["column", "kind", "table (size)", "null %", "distinct~", "min", "max", "out of range"]
    rows = [head]
    for c in rep.columns.values():
        rows.append([c.name, c.kind, f"{c.table} ({c.table_size:,})" + (" hashed" if c.hashed else "") if c.table else "",
                     f"{100 * c.null_rate:.2f}", "" if c.cardinality is None else f"{c.cardinality:,}",
                     _num(c.min), _num(c.max),
                     str(c.out_of_range) if c.table and not c.hashed else ""])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for k, r in enumerate(rows):
        lines.append("  " + "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if k == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    if rep.problems:
        lines.append("problems:")
        lines += [f"  {p}" for p in rep.problems]
    else:
        lines.append("no problems found")
    return "\n".join(lines)


def _num(v: int | float | None) -> str:
    if v is None:
        return ""
    return str(v) if isinstance(v, int) else f"{v:.6g}"
