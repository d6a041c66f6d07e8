"""Arrow mapping: synth -> Parquet -> dataset check round trip, and mismatch detection."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.arrow import check_arrow_schema
from features.dataset_check import check_dataset
from features.errors import GemtrainError


@pytest.fixture(scope="module")
def demo_table(demo_schema):
    from ingest.synth import generate_table

    return generate_table(demo_schema, 600, seed=1)


def test_arrow_schema_layout(demo_schema):
    s = demo_schema.arrow_schema()
    hist = s.field("history").type
    assert pa.types.is_list(hist) and pa.types.is_struct(hist.value_type)
    assert [hist.value_type.field(i).name for i in range(hist.value_type.num_fields)] == [
        "item_id", "item_category", "action_type", "dwell_time", "ts"]
    assert s.field("ad_creative").type == pa.list_(pa.float32(), 16)
    assert s.field("user_interests").type == pa.list_(pa.int64())
    assert s.field("click").type == pa.float32() and s.field("row_id").type == pa.int64()
    assert s.metadata[b"gemtrain.schema"] == b"demo"
    assert s.names == demo_schema.column_names()


def test_round_trip_synth_parquet_check(demo_schema, demo_table, tmp_path):
    pq.write_table(demo_table.slice(0, 400), tmp_path / "a.parquet", row_group_size=100)
    pq.write_table(demo_table.slice(400), tmp_path / "b.parquet", row_group_size=100)
    res = check_dataset(str(tmp_path), demo_schema)
    assert res.ok and [f.rows for f in res.files] == [400, 200] and res.row_groups == 6
    want = np.diff(demo_table.column("history").combine_chunks().offsets.to_numpy())
    got = np.concatenate([f.lengths["history"] for f in res.files])
    assert np.array_equal(got, want)
    st = res.lengths["history"]
    assert st.rows == 600 and st.max == want.max() and st.empty == (want == 0).sum()
    assert st.mean == pytest.approx(want.mean())
    back = pq.read_table(tmp_path / "a.parquet")
    assert back.equals(demo_table.slice(0, 400).replace_schema_metadata(back.schema.metadata))


def test_mismatches_are_all_listed(demo_schema, demo_table):
    expected = demo_schema.arrow_schema()
    t = demo_table.drop_columns(["user_age"])  # missing
    t = t.set_column(t.schema.get_field_index("ad_bid"), pa.field("ad_bid", pa.float64()),
                     t.column("ad_bid").cast(pa.float64()))  # wrong type
    t = t.append_column("extra", pa.array(np.zeros(t.num_rows, np.int32)))  # extra
    problems = {(m.column, m.problem) for m in check_arrow_schema(expected, t.schema)}
    assert problems == {("user_age", "missing"), ("ad_bid", "wrong type"), ("extra", "extra")}
    assert check_arrow_schema(expected, t.schema, allow_extra=True)[-1].column != "extra"


def test_nested_field_type_and_fixed_size_mismatch(demo_schema):
    expected = demo_schema.arrow_schema()
    fields = []
    for f in expected:
        if f.name == "history":  # ts as int32 inside the struct
            st = f.type.value_type
            f = pa.field("history", pa.list_(pa.struct(
                [pa.field(x.name, pa.int32() if x.name == "ts" else x.type) for x in st])))
        elif f.name == "ad_creative":
            f = pa.field("ad_creative", pa.list_(pa.float32(), 8))
        elif f.name == "user_interests":  # large lists are accepted for lists
            f = pa.field("user_interests", pa.large_list(pa.int64()))
        fields.append(f)
    problems = check_arrow_schema(expected, pa.schema(fields))
    assert [(m.column, m.problem) for m in problems] == [("history", "wrong type"), ("ad_creative", "wrong type")]
    assert "expected list<item: struct<" in str(problems[0])


def test_dataset_check_names_each_bad_file(demo_schema, demo_table, tmp_path):
    pq.write_table(demo_table, tmp_path / "good.parquet")
    pq.write_table(demo_table.drop_columns(["click"]), tmp_path / "missing.parquet")
    (tmp_path / "garbage.parquet").write_bytes(b"not parquet at all")
    (tmp_path / "_SUCCESS.parquet").write_bytes(b"")  # hidden names are skipped
    res = check_dataset(f"file://{tmp_path}", demo_schema)
    assert not res.ok
    by_name = {f.url.rsplit("/", 1)[1]: f for f in res.files}
    assert set(by_name) == {"good.parquet", "missing.parquet", "garbage.parquet"}
    assert by_name["good.parquet"].ok
    assert by_name["missing.parquet"].problems == ["column 'click' is missing (expected float)"]
    assert by_name["garbage.parquet"].problems[0].startswith("cannot read")


def test_dataset_check_user_errors(demo_schema, tmp_path):
    with pytest.raises(GemtrainError, match="no such file or folder"):
        check_dataset(str(tmp_path / "nope"), demo_schema)
    with pytest.raises(GemtrainError, match="no .parquet files"):
        check_dataset(str(tmp_path), demo_schema)


def test_deep_check_finds_bad_values_and_duplicate_row_ids(demo_schema, demo_table, tmp_path):
    t = demo_table.slice(0, 200)
    pq.write_table(t, tmp_path / "a.parquet", row_group_size=100)
    assert check_dataset(str(tmp_path), demo_schema, deep=True).ok
    ad = t.column("ad_id").to_numpy().copy()
    ad[:3] = 5000  # the ad table has 5000 rows
    click = t.column("click").to_numpy().copy()
    click[150] = 2.0
    bad = t.set_column(t.schema.get_field_index("ad_id"), "ad_id", pa.array(ad))
    bad = bad.set_column(bad.schema.get_field_index("click"), "click", pa.array(click))
    age = pa.array([None] + t.column("user_age").to_pylist()[1:], pa.float32())
    bad = bad.set_column(bad.schema.get_field_index("user_age"), "user_age", age)
    pq.write_table(bad, tmp_path / "b.parquet", row_group_size=100)  # row ids repeat a.parquet's
    res = check_dataset(str(tmp_path), demo_schema, deep=True)
    a, b = res.files
    assert a.problems == ["200 row ids also appear elsewhere in the dataset (row_id must be unique)"]
    assert b.problems[:3] == ["row group 0: user_age: 1 null values",
                              "row group 0: ad_id: 3 ids outside the table 'ad' [0, 5000) "
                              "(mark the feature `hash: true` if its ids are raw)",
                              "row group 1: click: 1 labels are not 0 or 1"]
    assert not check_dataset(str(tmp_path), demo_schema).files[1].problems  # a footer check cannot see values
