"""Event log -> training Parquet on a small hand-made log: exact histories, no future events, splits."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from features import parse_schema
from features.arrow import check_arrow_schema
from ingest.errors import DataError
from ingest.events import events_to_parquet, parse_split_time
from train.cli import main

SCHEMA_YAML = """name: ev
tables:
  item: {num_embeddings: 100, dim: 4}
  ad: {num_embeddings: 200, dim: 4}
  user: {num_embeddings: 100, dim: 4}
sequences:
  history:
    max_length: 3
    fields:
      item_id: {type: id, table: item}
      dwell: {type: float}
      ts: {type: timestamp}
features:
  user_id: {type: id, table: user}
  ad_id: {type: id, table: ad}
  bid: {type: float}
labels:
  click: {}
  conversion: {mask: click}
metadata:
  row_id: int64
  request_ts: int64
"""

N = None
# (user_id, ts, item_id, dwell, ad_id, bid, click, conversion), deliberately out of time order.
ROWS = [
    (1, 8, N, N, 101, 0.5, 0.0, N),      # impression: history before 8 = 11 12 16 15 17 -> last 3
    (1, 5, 16, 1.6, N, N, N, N),         # event tied at t=5 with item 15 (listed first: kept first)
    (2, 4, N, N, 201, 0.1, 1.0, 1.0),    # impression: history [21]
    (1, 1, 11, 1.1, N, N, N, N),
    (1, 5, N, N, 100, 0.2, 1.0, 0.0),    # impression at 5: events at 5 are NOT before it -> [11, 12]
    (3, 6, N, N, 300, 0.3, 0.0, N),      # a user with no events at all -> []
    (1, 5, 15, 1.5, N, N, N, N),
    (N, 3, 99, 9.9, 999, 9.0, 1.0, N),   # no user: ignored (counted)
    (2, 3, 21, 2.1, N, N, N, N),         # user 2's one event
    (1, 9, 19, 1.9, 103, 0.4, 1.0, N),   # impression AND event at 9: history [16 15 17], not itself
    (1, 2, 12, 1.2, N, N, N, N),
    (2, 2, N, N, 202, 0.6, 0.0, N),      # before user 2's only event -> []
    (1, 7, 17, 1.7, N, N, N, N),
    (1, 1, N, N, 102, 0.7, 0.0, N),      # tie with the event at t=1 -> []
]
# Expected output in (time, user) order: (user, request_ts, ad_id, history item ids).
EXPECTED = [
    (1, 1, 102, []),
    (2, 2, 202, []),
    (2, 4, 201, [21]),
    (1, 5, 100, [11, 12]),
    (3, 6, 300, []),
    (1, 8, 101, [16, 15, 17]),
    (1, 9, 103, [16, 15, 17]),
]


@pytest.fixture(scope="module")
def schema():
    return parse_schema(SCHEMA_YAML, "ev.yaml")


def event_table(time_type=pa.int64()) -> pa.Table:
    names = ["user_id", "ts", "item_id", "dwell", "ad_id", "bid", "click", "conversion"]
    types = [pa.int64(), pa.int64(), pa.int64(), pa.float64(), pa.int64(), pa.float64(), pa.float64(), pa.float64()]
    cols = {n: pa.array([r[i] for r in ROWS], t) for i, (n, t) in enumerate(zip(names, types))}
    if time_type != pa.int64():
        cols["ts"] = pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=r[1]) for r in ROWS],
                              time_type)
    return pa.table(cols)


def read_split(res, split: str) -> pa.Table:
    return pa.concat_tables([pq.read_table(p.removeprefix("file://")) for p in res.outputs[split]])


def check_rows(table: pa.Table, expected, ts0: int = 0) -> None:
    got = [(r["user_id"], r["request_ts"] - ts0, r["ad_id"], [e["item_id"] for e in r["history"]])
           for r in table.to_pylist()]
    assert got == expected
    for r in table.to_pylist():  # no leakage: every history event strictly before the impression
        assert all(e["ts"] < r["request_ts"] for e in r["history"])
        assert [e["ts"] for e in r["history"]] == sorted(e["ts"] for e in r["history"])
        assert all(abs(e["dwell"] - e["item_id"] / 10) < 1e-6 for e in r["history"])


def test_histories_exact_and_strictly_before(tmp_path, schema):
    pq.write_table(event_table(), tmp_path / "events.parquet")
    res = events_to_parquet(schema, str(tmp_path / "events.parquet"), str(tmp_path / "out"))
    t = read_split(res, "train")
    assert not check_arrow_schema(schema.arrow_schema(), pq.read_schema(res.outputs["train"][0].removeprefix("file://")))
    check_rows(t, EXPECTED)
    assert t.column("row_id").to_pylist() == list(range(7))
    assert t.column("click").to_pylist() == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert t.column("conversion").to_pylist() == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # null -> 0
    assert (res.input_rows, res.ignored_rows, res.impressions, res.events) == (14, 1, 7, 7)


def test_time_split_and_timestamp_column(tmp_path, schema):
    pq.write_table(event_table(pa.timestamp("ms", tz="UTC")), tmp_path / "events.parquet")
    ts0 = int(dt.datetime(2024, 1, 1, tzinfo=dt.UTC).timestamp())
    res = events_to_parquet(schema, str(tmp_path / "events.parquet"), str(tmp_path / "out"), split_time=ts0 + 6)
    check_rows(read_split(res, "train"), EXPECTED[:4], ts0)
    check_rows(read_split(res, "validation"), EXPECTED[4:], ts0)
    assert res.rows == {"train": 4, "validation": 3}


def test_validation_fraction_from_csv_to_memory_url(tmp_path, schema):
    pcsv.write_csv(event_table(), tmp_path / "events.csv")
    res = events_to_parquet(schema, str(tmp_path / "events.csv"), "memory://evout/run1", validation_fraction=0.3)
    # The 70% quantile of impression times (1 2 4 5 6 8 9) is 6: impressions from t=6 on validate.
    assert res.split_time == 6 and res.rows == {"train": 4, "validation": 3}
    import fsspec

    fs = fsspec.filesystem("memory")
    with fs.open(res.outputs["validation"][0].removeprefix("memory://"), "rb") as f:
        check_rows(pq.read_table(f), EXPECTED[4:])


def test_bad_input_is_named(tmp_path, schema):
    pq.write_table(event_table().drop_columns(["ad_id", "dwell"]), tmp_path / "e.parquet")
    with pytest.raises(DataError, match="lacks 'dwell' .*'ad_id'"):
        events_to_parquet(schema, str(tmp_path / "e.parquet"), str(tmp_path / "o"))
    with pytest.raises(DataError, match="no such file"):
        events_to_parquet(schema, str(tmp_path / "nope.parquet"), str(tmp_path / "o"))
    with pytest.raises(DataError, match="between 0 and 1"):
        events_to_parquet(schema, str(tmp_path / "e.parquet"), str(tmp_path / "o"), validation_fraction=1.5)
    assert parse_split_time("2024-01-01") == 1704067200 and parse_split_time("17") == 17
    with pytest.raises(DataError, match="ISO"):
        parse_split_time("yesterday")


def test_cli(tmp_path, schema, capsys):
    pq.write_table(event_table(), tmp_path / "events.parquet")
    (tmp_path / "ev.yaml").write_text(SCHEMA_YAML)
    args = ["data", "from-events", str(tmp_path / "events.parquet"), "--schema", str(tmp_path / "ev.yaml"),
            "--out", str(tmp_path / "out")]
    assert main(args + ["--split-time", "6", "--json"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    assert d["rows"] == {"train": 4, "validation": 3} and d["split_time"] == 6
    assert main(args[:-2] + ["--out", str(tmp_path / "o2")]) == 0
    assert "7 rows" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(args + ["--split-time", "6", "--validation-fraction", "0.2"])
    assert e.value.code == 2
    assert main(args + ["--split-time", "soon"]) == 1
    assert "ISO date" in capsys.readouterr().err


def test_demo_schema_output_feeds_the_batch_converter(tmp_path, demo_schema):
    """A random log for the demo schema (list and vector features too): the output is exactly the
    schema's Arrow schema, converts to a JaggedBatch, and no history holds an event at or after its row."""
    from ingest.convert import table_to_batch

    rng = np.random.default_rng(0)
    n = 3000
    is_imp = rng.random(n) < 0.2
    users = rng.integers(0, 40, n)
    ts = rng.integers(0, 500, n)  # many ties
    ev = ~is_imp  # events carry the sequence fields, impressions the features and labels
    t = pa.table({
        "user_id": users, "ts": ts,
        "item_id": pa.array(rng.integers(0, 20000, n), mask=~ev),
        "item_category": pa.array(rng.integers(0, 100, n), mask=~ev),
        "action_type": pa.array(rng.integers(0, 8, n), mask=~ev),
        "dwell_time": pa.array(rng.random(n, dtype=np.float32), mask=~ev),
        "ad_id": pa.array(rng.integers(0, 5000, n), mask=~is_imp),
        "ad_category": pa.array(rng.integers(0, 100, n), mask=~is_imp),
        "user_country": pa.array(rng.integers(0, 64, n), mask=~is_imp),
        "user_interests": pa.array([list(rng.integers(0, 500, rng.integers(0, 4))) if i else None for i in is_imp],
                                   pa.list_(pa.int64())),
        "ad_creative": pa.array([list(rng.random(16)) if i else None for i in is_imp], pa.list_(pa.float32(), 16)),
        "user_age": pa.array(rng.random(n, dtype=np.float32), mask=~is_imp),
        "ad_bid": pa.array(rng.random(n, dtype=np.float32), mask=~is_imp),
        "click": pa.array(rng.integers(0, 2, n).astype(np.float32), mask=~is_imp),
        "conversion": pa.array(rng.integers(0, 2, n).astype(np.float32), mask=~is_imp),
    })
    pq.write_table(t, tmp_path / "events.parquet", row_group_size=700)
    res = events_to_parquet(demo_schema, str(tmp_path / "events.parquet"), str(tmp_path / "out"),
                            validation_fraction=0.25, rows_per_file=200)
    assert res.rows["train"] + res.rows["validation"] == int(is_imp.sum())
    assert len(res.outputs["train"]) >= 2  # rows_per_file splits the output
    for split in ("train", "validation"):
        for url in res.outputs[split]:
            path = url.removeprefix("file://")
            assert not check_arrow_schema(demo_schema.arrow_schema(), pq.read_schema(path))
            out = pq.read_table(path)
            batch = table_to_batch(out, demo_schema)
            assert batch.batch_size == out.num_rows
            for r in out.select(["history", "request_ts", "user_id"]).to_pylist():
                assert all(e["ts"] < r["request_ts"] for e in r["history"]) and len(r["history"]) <= 128
                # Exactly the user's events strictly before, most recent 128:
                mask = ev & (users == r["user_id"]) & (ts < r["request_ts"])
                assert len(r["history"]) == min(128, int(mask.sum()))
    tr = read_split(res, "train").column("request_ts").to_numpy()
    va = read_split(res, "validation").column("request_ts").to_numpy()
    assert tr.max() < res.split_time <= va.min()
