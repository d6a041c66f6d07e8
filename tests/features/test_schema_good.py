"""The example schemas load and expose what the other packages read."""

from __future__ import annotations

import pytest

from features import load_schema
from tests.conftest import SCHEMAS


def test_demo_schema(demo_schema):
    s = demo_schema
    assert s.name == "demo"
    assert [t.name for t in s.tables] == ["item", "category", "action", "user", "ad", "country", "interest"]
    seq = s.sequence("history")
    assert seq.max_length == 128
    assert [f.name for f in seq.id_fields] == ["item_id", "item_category", "action_type"]
    assert [f.name for f in seq.float_fields] == ["dwell_time"] and seq.timestamp_field.name == "ts"
    assert s.sparse_keys == ("history.item_id", "history.item_category", "history.action_type", "user_id",
                             "ad_id", "ad_category", "user_country", "user_interests")
    assert s.key_table()["ad_category"] == s.key_table()["history.item_category"] == "category"
    assert s.key_hashed()["user_id"] and not s.key_hashed()["ad_id"]
    assert s.dense_dim == 16 + 2  # ad_creative (16) + user_age + ad_bid
    assert s.label_names == ("click", "conversion") and s.labels[1].mask == "click"
    assert s.metadata == {"row_id": "int64", "request_ts": "int64", "p_click": "float32",
                          "p_conversion": "float32"}
    assert s.sequence_tables() == {"item", "category", "action"}


def test_gem_medium_schema():
    s = load_schema(SCHEMAS / "gem_medium.yaml")
    assert s.sequence("history").max_length == 4096
    assert s.table("item").num_embeddings == 2_000_000 and s.table("item").sharding == "row_wise"
    assert {t.sharding for t in s.tables} >= {"row_wise", "table_wise", "column_wise"}
    assert len(s.column_names()) == len(set(s.column_names())) == len(s.arrow_schema())


def test_lookups_raise_key_error(demo_schema):
    with pytest.raises(KeyError):
        demo_schema.table("nope")
    with pytest.raises(KeyError):
        demo_schema.sequence("nope")


def test_load_from_an_fsspec_url():
    import fsspec

    with fsspec.open("memory://schemas/demo.yaml", "wb") as fh:
        fh.write((SCHEMAS / "demo.yaml").read_bytes())
    s = load_schema("memory://schemas/demo.yaml")
    assert s.name == "demo" and s.source == "memory://schemas/demo.yaml"
    from features import SchemaError

    with pytest.raises(SchemaError, match="memory://schemas/none.yaml: cannot read schema file"):
        load_schema("memory://schemas/none.yaml")
