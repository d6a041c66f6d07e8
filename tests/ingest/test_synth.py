"""Synthetic data: exact schema, determinism, lengths, timestamps, ids, labels and the planted signal."""

from __future__ import annotations

import io
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features import GemtrainError, parse_schema
from ingest.synth import (
    RECENT,
    chunk_rows,
    generate_table,
    normalized_entropy,
    parquet_write_options,
    signal_report,
    write_synthetic,
)

ROWS = 20_000


@pytest.fixture(scope="module")
def table(demo_schema) -> pa.Table:
    return generate_table(demo_schema, ROWS, seed=0)


@pytest.fixture(scope="module")
def report(demo_schema):
    return signal_report(demo_schema, ROWS, seed=0)


def _lengths(table: pa.Table, column: str = "history") -> np.ndarray:
    return np.diff(table.column(column).combine_chunks().offsets.to_numpy())


def _events(table: pa.Table, column: str = "history") -> pa.StructArray:
    return table.column(column).combine_chunks().values


def test_exact_schema_and_row_ids(demo_schema, table):
    assert table.schema.equals(demo_schema.arrow_schema(), check_metadata=True)
    assert table.num_rows == ROWS
    assert np.array_equal(table.column("row_id").to_numpy(), np.arange(ROWS))
    assert table.column("history").null_count == 0


def test_deterministic_and_independent_of_split(demo_schema, table):
    n = chunk_rows(demo_schema)
    again = generate_table(demo_schema, 3 * n + 17, seed=0)
    assert again.equals(table.slice(0, 3 * n + 17))
    cuts = [0, 5, n - 1, n + 3, 2 * n + 100, 3 * n + 17]
    pieces = [generate_table(demo_schema, b - a, seed=0, start_row=a) for a, b in zip(cuts, cuts[1:])]
    assert pa.concat_tables(pieces).equals(again)
    other = generate_table(demo_schema, 100, seed=1)
    assert not other.column("click").equals(table.slice(0, 100).column("click"))
    assert generate_table(demo_schema, 0, seed=0).num_rows == 0


def test_history_lengths(demo_schema, table, report):
    lengths = _lengths(table)
    assert lengths.min() == 0 and lengths.max() <= demo_schema.sequence("history").max_length
    assert 0.005 < (lengths == 0).mean() < 0.05  # some empty histories
    assert report.mean_length["history"] == pytest.approx(lengths.mean())
    assert 0.4 < report.padding_waste["history"] < 0.6  # padding to the batch max wastes about half


def test_timestamps_increase_and_precede_the_request(table):
    lengths = _lengths(table)
    ts = _events(table).field("ts").to_numpy()
    row = np.repeat(np.arange(table.num_rows), lengths)
    same_row = row[1:] == row[:-1]
    assert (np.diff(ts)[same_row] > 0).all()
    assert (ts < table.column("request_ts").to_numpy()[row]).all()


def test_ids_in_table_ranges_hashed_ids_raw(demo_schema, table):
    ev = _events(table)
    for f in demo_schema.sequence("history").id_fields:
        v = ev.field(f.name).to_numpy()
        assert v.min() >= 0 and v.max() < demo_schema.table(f.table).num_embeddings, f.name
    for f in demo_schema.features:
        if f.type == "id":
            v = table.column(f.name).to_numpy()
            if f.hash:  # raw int64 ids of any value, repeating (a pool of users)
                assert v.min() < 0 and v.max() > 2**40 and len(np.unique(v)) < len(v)
            else:
                assert v.min() >= 0 and v.max() < demo_schema.table(f.table).num_embeddings, f.name
    interests = table.column("user_interests").combine_chunks().values.to_numpy()
    assert interests.min() >= 0 and interests.max() < demo_schema.table("interest").num_embeddings
    # an item's category is its id modulo the number of categories (items belong to categories)
    assert np.array_equal(ev.field("item_id").to_numpy() % 100, ev.field("item_category").to_numpy())


def test_labels_follow_their_probabilities(table):
    click = table.column("click").to_numpy()
    conv = table.column("conversion").to_numpy()
    p_click = table.column("p_click").to_numpy()
    p_conv = table.column("p_conversion").to_numpy()
    assert set(np.unique(click)) == {0.0, 1.0} and set(np.unique(conv)) == {0.0, 1.0}
    assert (conv[click == 0] == 0).all()  # conversion happens only after a click
    assert ((p_click > 0) & (p_click < 1)).all() and ((p_conv > 0) & (p_conv < 1)).all()
    # calibration: observed rates match the true probabilities (4 standard errors)
    for y, p in ((click, p_click), (conv[click == 1], p_conv[click == 1])):
        se = np.sqrt((p * (1 - p)).sum()) / len(p)
        assert abs(y.mean() - p.mean()) < 4 * se
        hi = p > np.median(p)
        assert y[hi].mean() > y[~hi].mean() + 0.05


def test_click_depends_on_recent_history_match(table):
    """Rows whose ad category is among the most recent events click far more often."""
    lengths = _lengths(table)
    cats = _events(table).field("item_category").to_numpy()
    ad_cat = table.column("ad_category").to_numpy()
    row = np.repeat(np.arange(table.num_rows), lengths)
    ends = np.cumsum(lengths)
    age = ends[row] - 1 - np.arange(len(row))
    recent_hit = np.zeros(table.num_rows, bool)
    recent_hit[row[(age < RECENT) & (cats == ad_cat[row])]] = True
    old_only = np.zeros(table.num_rows, bool)
    old_only[row[(age >= RECENT) & (cats == ad_cat[row])]] = True
    old_only &= ~recent_hit
    click = table.column("click").to_numpy()
    assert click[recent_hit].mean() > 2 * click[~recent_hit].mean()
    # matches older than the recent window do not count
    assert abs(click[old_only].mean() - click[~recent_hit & ~old_only].mean()) < 0.05


def test_oracle_ne_beats_the_best_no_history_predictor(table, report):
    rep = report
    print("\n".join(rep.lines()))
    assert rep.oracle_ne["click"] == pytest.approx(
        normalized_entropy(table.column("click").to_numpy(), table.column("p_click").to_numpy()))
    assert rep.oracle_ne["click"] < rep.no_history_ne["click"] - 0.1
    assert rep.no_history_ne["click"] < 0.99  # the non-sequential features carry signal too
    assert rep.oracle_ne["conversion"] < rep.no_history_ne["conversion"] < 0.95
    assert 0.1 < rep.label_rate["click"] < 0.3 and 0.1 < rep.label_rate["conversion"] < 0.5


def test_write_synthetic_files_row_groups_checksums(demo_schema, tmp_path):
    paths = write_synthetic(demo_schema, str(tmp_path / "d"), 1000, seed=3, files=3, row_group_rows=120)
    assert paths == [str(tmp_path / "d" / f"part-{i:05d}.parquet") for i in range(3)]
    mds = [pq.ParquetFile(p).metadata for p in paths]
    assert [m.num_rows for m in mds] == [334, 334, 332]
    assert [m.num_row_groups for m in mds] == [3, 3, 3]
    assert {mds[0].row_group(0).column(i).compression for i in range(mds[0].num_columns)} == {"ZSTD"}
    back = pa.concat_tables([pq.read_table(p, page_checksum_verification=True) for p in paths])
    assert back.equals(generate_table(demo_schema, 1000, seed=3).replace_schema_metadata(back.schema.metadata))
    # page checksums are written: a flipped byte inside a data page is detected on read
    data = bytearray(open(paths[0], "rb").read())
    col = mds[0].row_group(0).column(mds[0].num_columns - 1)
    data[col.data_page_offset + col.total_compressed_size - 5] ^= 0xFF
    pq.read_table(io.BytesIO(bytes(data)))  # unverified: silently wrong
    with pytest.raises(OSError, match="CRC checksum"):
        pq.read_table(io.BytesIO(bytes(data)), page_checksum_verification=True)


def test_write_to_memory_url_and_default_row_groups(demo_schema):
    paths = write_synthetic(demo_schema, "memory://synth-test/x/", 2000, seed=0, files=2)
    assert paths == ["memory://synth-test/x/part-00000.parquet", "memory://synth-test/x/part-00001.parquet"]
    import fsspec

    with fsspec.open(paths[1], "rb") as fh:
        md = pq.ParquetFile(fh).metadata
    assert md.num_rows == 1000 and md.num_row_groups == 4
    assert parquet_write_options(demo_schema)["write_page_checksum"] is True


def test_threads_give_the_same_files(demo_schema, tmp_path):
    a = write_synthetic(demo_schema, str(tmp_path / "a"), 3000, seed=5, files=2, row_group_rows=700)
    b = write_synthetic(demo_schema, str(tmp_path / "b"), 3000, seed=5, files=2, row_group_rows=700, threads=3)
    for x, y in zip(a, b):
        assert pq.read_table(x).equals(pq.read_table(y))


OTHER = """\
name: other
tables:
  page: {num_embeddings: 50, dim: 4}
  query: {num_embeddings: 1000, dim: 4}
  seller: {num_embeddings: 30, dim: 4}
sequences:
  pages:
    max_length: 8
    fields:
      page: {type: id, table: page, hash: true}
      score: {type: float}
  queries:
    max_length: 300
    fields:
      q: {type: id, table: query}
features:
  seller: {type: id, table: seller}
  emb: {type: float_vector, dim: 3}
labels:
  like: {weight: like_w}
  share: {}
  buy: {mask: share}
metadata:
  trace: string
  p_like: float64
  extra: int32
"""


def test_any_schema_works():
    schema = parse_schema(OTHER, source="other.yaml")
    t = generate_table(schema, 5000, seed=2, start_row=10)
    assert t.schema.equals(schema.arrow_schema())
    assert t.column("trace").to_pylist()[:2] == ["10", "11"]
    assert (t.column("like_w").to_numpy() == 1).all()
    lengths = _lengths(t, "pages")
    assert lengths.max() <= 8 and _lengths(t, "queries").max() <= 300
    page_ids = _events(t, "pages").field("page").to_numpy()
    assert page_ids.min() < 0  # hashed sequence field: raw ids
    assert (t.column("buy").to_numpy()[t.column("share").to_numpy() == 0] == 0).all()
    rep = signal_report(schema, 5000, seed=2)
    # no non-sequential id shares a table with a sequence: there is no history signal
    assert rep.oracle_ne["like"] == pytest.approx(rep.no_history_ne["like"], abs=0.01)
    assert set(rep.padding_waste) == {"pages", "queries"}


def test_schema_without_sequences():
    schema = parse_schema(textwrap.dedent("""\
        tables: {ad: {num_embeddings: 10, dim: 2}}
        features: {ad: {type: id, table: ad}, x: {type: float}}
        labels: {click: {}}
        """), source="flat.yaml")
    t = generate_table(schema, 300, seed=0)
    assert t.schema.equals(schema.arrow_schema()) and t.num_rows == 300
    assert signal_report(schema, 300).mean_length == {}


def test_bad_arguments(demo_schema, tmp_path):
    with pytest.raises(GemtrainError, match="seed"):
        generate_table(demo_schema, 10, seed=-1)
    with pytest.raises(GemtrainError, match="rows"):
        generate_table(demo_schema, -1, seed=0)
    with pytest.raises(GemtrainError, match="files"):
        write_synthetic(demo_schema, str(tmp_path), 10, files=0)


def test_padding_waste_target_is_settable(monkeypatch):
    import ingest.synth as synth
    from features import load_schema
    from tests.conftest import SCHEMAS

    schema = load_schema(SCHEMAS / "demo.yaml")  # a fresh schema object: a fresh generator plan
    monkeypatch.setattr(synth, "TARGET_WASTE", 0.6)
    rep = synth.signal_report(schema, rows=20_000)
    assert 0.55 < rep.padding_waste["history"] < 0.65  # the device README's standard batches waste ~0.6
