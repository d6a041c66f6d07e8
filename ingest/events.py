"""Event logs -> training Parquet: each labelled impression with the user's history strictly before it.

Runs out-of-core in DuckDB (window functions spill to disk); the events are scanned as an Arrow
dataset, so any fsspec URL works (local, s3://, gs://, memory://) and Parquet or CSV alike.
The expected event table and the same SQL for Spark are in docs/from-events.md.

Event table (one row per event; column names follow the schema):
- `user_id` (the `user_column`) and `ts` (the `time_column`: int64 seconds, or a timestamp/date);
- a row is a HISTORY EVENT of sequence `s` when its first id field (e.g. `item_id`) is not null; the
  sequence's fields are read from columns named `<field>` (or `<sequence>.<field>`); its timestamp
  field, if any, is the event time;
- a row is a LABELLED IMPRESSION when its first label (e.g. `click`) is not null; it carries the
  non-sequential features, the labels and weight columns under their schema names (`user_id` the
  feature may be the user column itself). Other labels that are null become 0.
A row may be both (an impression that is also an activity event).

History of an impression at time t: that user's events with time < t (strictly: an event at the
same second is NOT before it), the most recent `max_length`, oldest first. Ties among events are
broken by input order. Metadata: `row_id` is 0.. in output order (time, user, input order);
`request_ts` (when the schema declares it and the events do not carry it) is the impression time;
other metadata columns come from the events when present, else null.
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field

import pyarrow as pa

from features.arrow import arrow_schema
from features.schema import FeatureSchema
from ingest.errors import DataError

__all__ = ["EventsResult", "build_query", "events_to_parquet", "parse_split_time"]


@dataclass
class EventsResult:
    outputs: dict[str, list[str]] = field(default_factory=dict)  # split -> files written
    rows: dict[str, int] = field(default_factory=dict)  # split -> rows
    split_time: int | None = None
    input_rows: int = 0
    events: int = 0
    impressions: int = 0
    ignored_rows: int = 0  # rows without a user or a time: they can be neither history nor impression
    seconds: float = 0.0


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def parse_split_time(text: str) -> int:
    """Seconds since the epoch from an integer or an ISO date/time (UTC unless it says otherwise)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        t = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise DataError(f"--split-time '{text}': expected seconds since the epoch or an ISO date/time "
                        "such as 2024-05-01 or 2024-05-01T12:00:00") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.UTC)
    return int(t.timestamp())


_DUCK = {"id": "BIGINT", "timestamp": "BIGINT", "float": "FLOAT"}
_META_DUCK = {"int64": "BIGINT", "int32": "INTEGER", "float32": "FLOAT", "float64": "DOUBLE", "string": "VARCHAR"}


def _time_expr(tcol: str, time_type: pa.DataType) -> str:
    """The event time in int64 seconds, whatever the column's type."""
    if pa.types.is_timestamp(time_type) or pa.types.is_date(time_type):
        return f"CAST(floor(epoch({_q(tcol)})) AS BIGINT)"
    return f"CAST({_q(tcol)} AS BIGINT)"


@dataclass
class _Plan:
    sql: str
    count_sql: str


def _resolve(columns: set[str], schema: FeatureSchema, user: str, tcol: str) -> dict[str, str]:
    """Maps every needed schema column to an event-table column; raises naming all that are missing."""
    need: dict[str, str] = {}
    missing: list[str] = []
    for c, what in ((user, "the user column"), (tcol, "the event time column")):
        if c not in columns:
            missing.append(f"'{c}' ({what})")
    for s in schema.sequences:
        for f in s.fields:
            if f.type == "timestamp":
                continue
            for cand in (f"{s.name}.{f.name}", f.name):
                if cand in columns:
                    need[f"{s.name}.{f.name}"] = cand
                    break
            else:
                missing.append(f"'{f.name}' (field of sequence '{s.name}')")
    for f in schema.features:
        if f.name in columns:
            need[f.name] = f.name
        elif f.name == "user_id":
            need[f.name] = user
        else:
            missing.append(f"'{f.name}' ({f.type} feature)")
    for i, label in enumerate(schema.labels):
        if label.name in columns:
            need[label.name] = label.name
        elif i == 0:
            missing.append(f"'{label.name}' (the first label: it marks the labelled impressions)")
        if label.weight:
            if label.weight in columns:
                need[label.weight] = label.weight
            else:
                missing.append(f"'{label.weight}' (weight of label '{label.name}')")
    if missing:
        raise DataError("the event table lacks " + ", ".join(missing) + " (see docs/from-events.md for the "
                        "expected columns)")
    return need


def build_query(schema: FeatureSchema, columns: set[str], *, time_type: pa.DataType, user: str = "user_id",
                tcol: str = "ts", split_time: int | None = None, source: str = "events") -> _Plan:
    """The DuckDB SQL that produces the training rows (ordered by time, user, input order)."""
    need = _resolve(columns, schema, user, tcol)
    t_expr = _time_expr(tcol, time_type)
    first_label = schema.labels[0].name
    ev_ctes, hist_cols = [], []
    for s in schema.sequences:
        first_id = need[f"{s.name}.{s.id_fields[0].name}"]
        sel = ", ".join(f"CAST({_q(need[f'{s.name}.{f.name}'])} AS {_DUCK[f.type]}) AS {_q(f.name)}"
                        if f.type != "timestamp" else f"_t AS {_q(f.name)}" for f in s.fields)
        pack = ", ".join(f"{_q(f.name)} := {_q(f.name)}" for f in s.fields)
        stype = "STRUCT(" + ", ".join(f"{_q(f.name)} {_DUCK[f.type]}" for f in s.fields) + ")[]"
        # One timeline per user: this sequence's events (1) and the impressions (0). Ordered by time with
        # impressions first among equal times, the running count of events is, for an event, its
        # 1-based index k and, for an impression, the number of events STRICTLY before it.
        ev_ctes.append(f"""
tl_{s.name} AS (
  SELECT _u, _t, _ord, 1 AS _is_ev, struct_pack({pack}) AS _e
  FROM (SELECT _u, _t, _ord, {sel} FROM src WHERE {_q(first_id)} IS NOT NULL)
  UNION ALL
  SELECT _u, _t, _ord, 0 AS _is_ev, NULL AS _e FROM imp
),
cnt_{s.name} AS MATERIALIZED (  -- used three times below: computed once
  SELECT *, sum(_is_ev) OVER (PARTITION BY _u ORDER BY _t, _is_ev, _ord
                              ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS _c
  FROM tl_{s.name}
),
ev_{s.name} AS (  -- events by (user, bucket of max_length consecutive indices)
  SELECT _u, _c AS _k, _c // {s.max_length} AS _b, _e FROM cnt_{s.name} WHERE _is_ev = 1
),
want_{s.name} AS (  -- an impression's window (c - max_length, c] spans its bucket and the one before
  SELECT _u, _ord, _c, _c // {s.max_length} AS _b FROM cnt_{s.name} WHERE _is_ev = 0
  UNION ALL
  SELECT _u, _ord, _c, _c // {s.max_length} - 1 AS _b FROM cnt_{s.name} WHERE _is_ev = 0
),
h_{s.name} AS (  -- equi-join on (user, bucket): at most 2 x max_length candidates per impression
  SELECT w._ord, list(e._e ORDER BY e._k) AS _h
  FROM want_{s.name} w JOIN ev_{s.name} e ON e._u = w._u AND e._b = w._b
  WHERE e._k > w._c - {s.max_length} AND e._k <= w._c
  GROUP BY w._ord
)""")
        hist_cols.append((s.name, f"h_{s.name}", stype))
    feat_sel = []
    for f in schema.features:
        feat_sel.append(f"{_q(need[f.name])} AS {_q(f.name)}")
    for i, label in enumerate(schema.labels):
        if label.name in need:
            expr = f"CAST({_q(label.name)} AS FLOAT)" if i == 0 else f"CAST(coalesce({_q(label.name)}, 0) AS FLOAT)"
        else:
            expr = "CAST(0 AS FLOAT)"
        feat_sel.append(f"{expr} AS {_q(label.name)}")
    for label in schema.labels:
        if label.weight:
            feat_sel.append(f"CAST({_q(label.weight)} AS FLOAT) AS {_q(label.weight)}")
    meta_sel = []
    for name in schema.metadata:
        if name == "row_id":
            continue
        if name in columns:
            meta_sel.append(f"{_q(name)} AS {_q(name)}")
        elif name == "request_ts":
            meta_sel.append(f"_t AS {_q(name)}")
        else:
            meta_sel.append(f"CAST(NULL AS {_META_DUCK[schema.metadata[name]]}) AS {_q(name)}")
    imp_cols = ", ".join(["_u", "_t", "_ord"] + feat_sel + meta_sel)
    # An impression with no earlier event has no row in h_: its history is the empty list.
    out_cols = [f"coalesce({h}._h, []::{stype}) AS {_q(name)}" for name, h, stype in hist_cols]
    out_cols += [f"imp.{_q(f.name)}" for f in schema.features]
    out_cols += [f"imp.{_q(label.name)}" for label in schema.labels]
    out_cols += [f"imp.{_q(label.weight)}" for label in schema.labels if label.weight]
    for name in schema.metadata:
        if name == "row_id":
            out_cols.append(f"row_number() OVER (ORDER BY imp._t, imp._u, imp._ord) - 1 AS {_q(name)}")
        else:
            out_cols.append(f"imp.{_q(name)}")
    split = "FALSE" if split_time is None else f"imp._t >= {int(split_time)}"
    joins = " ".join(f"LEFT JOIN {h} ON {h}._ord = imp._ord" for _, h, _ in hist_cols)
    # MATERIALIZED: src is read twice (impressions, events); both must see the same _ord numbering.
    with_src = f"""WITH src AS MATERIALIZED (
  SELECT *, {_q(user)} AS _u, {t_expr} AS _t, row_number() OVER () AS _ord FROM {source}
  WHERE {_q(user)} IS NOT NULL AND {_q(tcol)} IS NOT NULL
),
imp AS (SELECT {imp_cols} FROM src WHERE {_q(first_label)} IS NOT NULL),"""
    sql = (with_src + ",".join(ev_ctes)
           + f"\nSELECT {', '.join(out_cols)}, {split} AS _is_validation\nFROM imp {joins}\n"
           + "ORDER BY imp._t, imp._u, imp._ord")
    count_sql = f"""SELECT count(*) AS n,
  count(*) FILTER (WHERE {_q(user)} IS NULL OR {_q(tcol)} IS NULL) AS ignored,
  count(*) FILTER (WHERE {_q(user)} IS NOT NULL AND {_q(tcol)} IS NOT NULL AND {_q(first_label)} IS NOT NULL) AS imp
FROM {source}"""
    return _Plan(sql=sql, count_sql=count_sql)


def _dataset(url: str, fmt: str | None, storage_options: dict | None):
    import fsspec
    import pyarrow.dataset as ds

    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    if any(ch in path for ch in "*?["):
        paths = sorted(fs.glob(path))
    elif fs.isdir(path):
        paths = sorted(p for p in fs.find(path) if not p.rsplit("/", 1)[-1].startswith(("_", ".")))
    elif fs.exists(path):
        paths = [path]
    else:
        raise DataError(f"{url}: no such file or folder (give an event table: a Parquet or CSV file, a folder "
                        "or a glob)")
    if not paths:
        raise DataError(f"{url}: no files found there")
    if fmt is None:
        fmt = "csv" if all(p.endswith((".csv", ".csv.gz")) for p in paths) else "parquet"
    from fsspec.implementations.local import LocalFileSystem as FsLocal
    from pyarrow.fs import FSSpecHandler, LocalFileSystem, PyFileSystem

    afs = LocalFileSystem() if isinstance(fs, FsLocal) else PyFileSystem(FSSpecHandler(fs))
    try:
        return ds.dataset(paths, filesystem=afs, format=fmt)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{url}: cannot read the event table as {fmt}: {e}") from None


def events_to_parquet(schema: FeatureSchema, events_url: str, out_url: str, *, split_time: int | None = None,
                      validation_fraction: float | None = None, user_column: str = "user_id",
                      time_column: str = "ts", fmt: str | None = None, rows_per_file: int = 1_000_000,
                      row_group_rows: int = 65_536, memory_limit: str = "2GB", threads: int | None = None,
                      storage_options: dict | None = None) -> EventsResult:
    """Converts an event table into training Parquet under `out_url` (see the module docstring).

    With `split_time` (seconds) or `validation_fraction`, impressions at or after the split time go to
    `out_url/validation/`, the rest to `out_url/train/`; without, all rows go to `out_url/train/`.
    """
    import tempfile

    import duckdb
    import fsspec
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if split_time is not None and validation_fraction is not None:
        raise DataError("give --split-time or --validation-fraction, not both")
    if validation_fraction is not None and not 0.0 < validation_fraction < 1.0:
        raise DataError(f"--validation-fraction must be between 0 and 1 (exclusive), got {validation_fraction}")
    t0 = time.perf_counter()
    dataset = _dataset(events_url, fmt, storage_options)
    cols = set(dataset.schema.names)
    if time_column not in cols:
        raise DataError(f"{events_url}: the event table lacks '{time_column}' (the event time column); its "
                        f"columns: {', '.join(sorted(cols))}")
    time_type = dataset.schema.field(time_column).type
    target = arrow_schema(schema)
    res = EventsResult()
    with tempfile.TemporaryDirectory(prefix="gemtrain-duckdb-") as tmp:
        con = duckdb.connect(config={"memory_limit": memory_limit, "temp_directory": tmp,
                                     "preserve_insertion_order": True, **({"threads": threads} if threads else {})})
        con.register("events", dataset)
        plan = build_query(schema, cols, time_type=time_type, user=user_column, tcol=time_column)
        n, ignored, n_imp = con.execute(plan.count_sql).fetchall()[0]
        res.input_rows, res.ignored_rows, res.impressions = int(n), int(ignored), int(n_imp)
        if validation_fraction is not None and n_imp:
            first_label = schema.labels[0].name
            t_expr = _time_expr(time_column, time_type)
            split_time = int(con.execute(
                f"SELECT quantile_disc({t_expr}, {1.0 - validation_fraction}) FROM events "
                f"WHERE {_q(first_label)} IS NOT NULL AND {_q(user_column)} IS NOT NULL").fetchall()[0][0])
        res.split_time = split_time
        plan = build_query(schema, cols, time_type=time_type, user=user_column, tcol=time_column,
                           split_time=split_time)
        try:
            reader = con.sql(plan.sql).to_arrow_reader(row_group_rows)
        except duckdb.Error as e:
            raise DataError(f"{events_url}: the conversion query failed: {e}") from None
        fs, root = fsspec.core.url_to_fs(out_url, **(storage_options or {}))
        root = root.rstrip("/")
        writers: dict[str, tuple[pq.ParquetWriter, object, int]] = {}

        def write(split: str, batch: pa.RecordBatch) -> None:
            while batch.num_rows:
                w = writers.get(split)
                if w is not None and w[2] >= rows_per_file:
                    w[0].close()
                    w[1].close()
                    w = None
                if w is None:
                    k = len(res.outputs.get(split, []))
                    path = f"{root}/{split}/part-{k:05d}.parquet"
                    fs.makedirs(f"{root}/{split}", exist_ok=True)
                    f = fs.open(path, "wb")
                    w = (pq.ParquetWriter(f, target, compression="zstd", write_page_checksum=True), f, 0)
                    res.outputs.setdefault(split, []).append(fs.unstrip_protocol(path))
                part = batch.slice(0, rows_per_file - w[2])
                batch = batch.slice(part.num_rows)
                w[0].write_batch(part, row_group_size=row_group_rows)
                writers[split] = (w[0], w[1], w[2] + part.num_rows)
                res.rows[split] = res.rows.get(split, 0) + part.num_rows

        try:
            for batch in reader:
                is_val = batch.column(batch.num_columns - 1)
                data = pa.RecordBatch.from_arrays(
                    [batch.column(i).cast(f.type) for i, f in enumerate(target)], schema=target)
                if split_time is None:
                    write("train", data)
                    continue
                for split, mask in (("train", pc.invert(is_val)), ("validation", is_val)):
                    part = data.filter(mask)
                    if part.num_rows:
                        write(split, part)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise DataError(f"{events_url}: a column of the event table does not convert to the schema's type: "
                            f"{e}") from None
        finally:
            for w, f, _ in writers.values():
                w.close()
                f.close()
        if schema.sequences:
            res.events = int(con.execute("SELECT " + " + ".join(
                f"(SELECT count(*) FROM events WHERE {_q(_first_id_col(s, cols))} IS NOT NULL "
                f"AND {_q(user_column)} IS NOT NULL AND {_q(time_column)} IS NOT NULL)"
                for s in schema.sequences)).fetchall()[0][0])
        con.close()
    res.seconds = time.perf_counter() - t0
    return res


def _first_id_col(seq, cols: set[str]) -> str:
    f = seq.id_fields[0].name
    return f"{seq.name}.{f}" if f"{seq.name}.{f}" in cols else f
