"""`gemtrain data inspect` on synthetic data with planted problems: each is found, counted and placed."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from ingest.inspect_data import SKETCH_K, ColumnStats, inspect_dataset
from ingest.synth import generate_table
from train.cli import main


def _set(table: pa.Table, name: str, values) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))


@pytest.fixture()
def data(tmp_path, demo_schema):
    t = generate_table(demo_schema, 300, seed=1)
    ad = t.column("ad_id").to_numpy().copy()
    ad[[5, 17]] = [5000, -1]  # outside [0, 5000): the run would stop on these two rows
    t = _set(t, "ad_id", ad)
    click = t.column("click").to_numpy().copy()
    conv = t.column("conversion").to_numpy().copy()
    click[7], conv[7] = 0.0, 1.0  # conversion without click
    t = _set(t, "click", click)
    t = _set(t, "conversion", conv)
    rid = t.column("row_id").to_numpy().copy()
    rid[9] = rid[8]
    t = _set(t, "row_id", rid)
    pq.write_table(t.slice(0, 200), tmp_path / "a.parquet", row_group_size=100)
    pq.write_table(t.slice(200), tmp_path / "b.parquet", row_group_size=100)
    pq.write_table(t.drop_columns(["user_age"]).slice(0, 40), tmp_path / "c_missing_column.parquet")
    (tmp_path / "d_garbage.parquet").write_bytes(b"PAR1 this is not parquet")
    return tmp_path


def test_problems_found_counted_and_placed(data, demo_schema):
    rep = inspect_dataset(demo_schema, str(data))
    assert rep.rows == 300 and rep.row_groups == 3
    assert [f.ok for f in rep.files] == [True, True, False, False]
    by = {(p.severity, p.what.split(":")[0]): p for p in rep.problems}
    q_schema = next(p for p in rep.problems if p.severity == "quarantine" and "user_age" in p.what)
    assert q_schema.rows == 40 and "missing" in q_schema.what
    assert any(p.severity == "quarantine" and "footer" in p.what for p in rep.problems)
    ad = by[("error", "ad_id")]
    assert ad.rows == 2 and "row group 0 row 5, row_id 5" in ad.where[0] and "row 17" in ad.where[1]
    assert by[("warning", "conversion")].rows == 1 and "row 7" in by[("warning", "conversion")].where[0]
    assert by[("warning", "row_id")].rows == 2
    assert rep.columns["ad_id"].out_of_range == 2 and rep.columns["ad_id"].min == -1
    assert rep.failed
    # Exact distinct counts below the sketch size; the hashed user ids are not range-checked.
    assert rep.columns["user_country"].cardinality == len(np.unique(
        pa.concat_tables([pq.read_table(data / "a.parquet"), pq.read_table(data / "b.parquet")])
        .column("user_country").to_numpy()))
    assert rep.columns["user_id"].out_of_range == 0


def test_cardinality_estimate_within_five_percent():
    c = ColumnStats("x", "id")
    rng = np.random.default_rng(0)
    true = 50_000
    for chunk in np.array_split(rng.permutation(np.repeat(np.arange(true), 2)), 7):
        c.add(chunk.astype(np.int64), 0)
    assert c._sketch.size == SKETCH_K
    assert abs(c.cardinality - true) / true < 0.05


def test_cli_exit_codes(data, demo_schema, repo_root, tmp_path, capsys):
    demo = str(repo_root / "schemas" / "demo.yaml")
    assert main(["data", "inspect", str(data), "--schema", demo]) == 1
    out, err = capsys.readouterr()
    assert "error: ad_id: ids outside table 'ad' range [0, 5000)" in out and "would make the loader" in err
    clean = tmp_path / "clean"
    clean.mkdir()
    pq.write_table(generate_table(demo_schema, 50, seed=2), clean / "x.parquet")
    assert main(["data", "inspect", str(clean), "--schema", demo, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rows"] == 50 and d["problems"] == [] and not d["failed"]
    hist = next(c for c in d["columns"] if c["name"] == "history.item_id")
    assert hist["table_size"] == 20000 and 0 <= hist["min"] <= hist["max"] < 20000
    assert main(["data", "inspect", str(tmp_path / "none"), "--schema", demo]) == 1
    assert "no such file or folder" in capsys.readouterr().err
    assert pc.sum(pq.read_table(clean / "x.parquet").column("click")).as_py() >= 0
