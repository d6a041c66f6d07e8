"""Row lengths from Parquet levels alone (ingest.parquet_levels) equal pyarrow's, for every layout we write."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from features import parse_schema
from ingest import padding_scan
from ingest.padding_scan import scan_lengths

SCHEMA = parse_schema("""name: lv
tables:
  item: {num_embeddings: 1000, dim: 4}
sequences:
  history:
    max_length: 64
    fields:
      item_id: {type: id, table: item}
      dwell: {type: float}
labels:
  click: {}
""", "lv.yaml")


def history(rng, n, *, null_rows: bool, null_values: bool, nullable: bool = True) -> pa.Array:
    # Mix of empty, short and long lists so levels get RLE runs of 0s, of 1s and bit-packed groups.
    lengths = np.where(rng.random(n) < 0.15, 0, rng.geometric(0.05, n))
    lengths[rng.random(n) < 0.03] = rng.integers(200, 900)
    total = int(lengths.sum())
    item = pa.array(rng.integers(0, 1000, total), mask=(rng.random(total) < 0.1) if null_values else None)
    dwell = pa.array(rng.random(total, dtype=np.float32))
    fields = [pa.field("item_id", pa.int64(), nullable), pa.field("dwell", pa.float32(), nullable)]
    st = pa.StructArray.from_arrays([item, dwell], fields=fields)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    mask = pa.array(rng.random(n) < 0.1) if null_rows else None
    arr = pa.ListArray.from_arrays(offsets, st, mask=mask)
    if not nullable:
        arr = arr.cast(pa.list_(pa.field("element", pa.struct(fields), False)))
    return arr


def expected(path) -> np.ndarray:
    col = pq.read_table(path, columns=["history"]).column(0)
    return pc.fill_null(pc.list_value_length(col), 0).to_numpy()


CASES = [
    dict(compression="zstd", data_page_version="1.0"),
    dict(compression="zstd", data_page_version="2.0"),
    dict(compression="snappy", data_page_version="1.0", use_dictionary=False),
    dict(compression="gzip", data_page_version="1.0", use_dictionary=False),
    dict(compression="none", data_page_version="1.0"),
    dict(compression="zstd", data_page_version="1.0", data_page_size=256),  # many small pages
    dict(compression="lz4", data_page_version="2.0", data_page_size=512),  # V2: levels need no codec
    dict(compression="lz4", data_page_version="1.0"),  # Parquet's LZ4 framing in V1: pyarrow reads it
]


@pytest.mark.parametrize("opts", CASES, ids=[f"{c['compression']}-v{c['data_page_version']}-{i}"
                                             for i, c in enumerate(CASES)])
@pytest.mark.parametrize("nulls", [(True, True), (False, False)], ids=["nulls", "no-nulls"])
def test_levels_match_pyarrow(tmp_path, opts, nulls):
    rng = np.random.default_rng(hash((str(opts), nulls)) % 2**32)
    n = 1500
    t = pa.table({"history": history(rng, n, null_rows=nulls[0], null_values=nulls[1]),
                  "click": pa.array(np.zeros(n, np.float32))})
    path = tmp_path / "d.parquet"
    pq.write_table(t, path, row_group_size=550, **opts)
    scan = scan_lengths(SCHEMA, str(path))
    fast = not (opts["compression"] == "lz4" and opts["data_page_version"] == "1.0")
    assert scan.row_groups == 3 and scan.row_groups_by_levels == (3 if fast else 0)
    np.testing.assert_array_equal(scan.lengths["history"], expected(path))


def test_non_nullable_layout(tmp_path):
    rng = np.random.default_rng(3)
    arr = history(rng, 500, null_rows=False, null_values=False, nullable=False)
    schema = pa.schema([pa.field("history", arr.type, False), pa.field("click", pa.float32())])
    t = pa.table({"history": arr, "click": pa.array(np.zeros(500, np.float32))}, schema=schema)
    pq.write_table(t, tmp_path / "d.parquet", row_group_size=200)
    scan = scan_lengths(SCHEMA, str(tmp_path / "d.parquet"))
    assert scan.row_groups_by_levels == 3
    np.testing.assert_array_equal(scan.lengths["history"], expected(tmp_path / "d.parquet"))


def test_falls_back_to_pyarrow_when_the_fast_path_cannot_read(tmp_path, monkeypatch):
    from ingest import parquet_levels

    rng = np.random.default_rng(4)
    t = pa.table({"history": history(rng, 400, null_rows=True, null_values=False),
                  "click": pa.array(np.zeros(400, np.float32))})
    pq.write_table(t, tmp_path / "d.parquet", row_group_size=150)

    def unsupported(*_a, **_k):  # fault injection: a layout the fast path rejects
        raise parquet_levels.Unsupported("injected")

    monkeypatch.setattr(parquet_levels, "chunk_list_lengths", unsupported)
    scan = padding_scan.scan_lengths(SCHEMA, str(tmp_path / "d.parquet"))
    assert scan.row_groups_by_levels == 0 and scan.row_groups == 3
    np.testing.assert_array_equal(scan.lengths["history"], expected(tmp_path / "d.parquet"))
