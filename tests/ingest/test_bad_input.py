"""Bad input: every bad file is a hard error naming it, or (quarantine) skipped with its rows counted."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ingest import reader
from ingest.errors import BadFileError
from ingest.loader import Loader, LoaderConfig
from ingest.synth import generate_table, write_synthetic
from tests.conftest import BAD_PARQUET_DIR

BAD_DIR = BAD_PARQUET_DIR
GOOD_ROWS = 200


def test_the_shared_bad_files_are_there():
    # Guards the parametrised tests below against silently running over no files.
    assert len(list(BAD_DIR.glob("*.parquet"))) >= 5, f"no bad Parquet files under {BAD_DIR}"


def _dataset(schema, root: Path) -> Path:
    write_synthetic(schema, str(root), GOOD_ROWS, seed=1, files=2, row_group_rows=50)
    return root


def _cfg(root: Path, **kw) -> LoaderConfig:
    return LoaderConfig(url=str(root), batch_size=32, shuffle_buffer_rows=64, num_threads=2, **kw)


def _run(schema, root: Path, **kw):
    loader = Loader(schema, _cfg(root, **kw))
    ids = [i for b in loader for i in b.row_ids.tolist()]
    return loader, ids


def _write(table: pa.Table, path: Path, **kw) -> None:
    pq.write_table(table, path, compression="zstd", write_page_checksum=True, **kw)


def _check_bad(schema, root: Path, name: str, rows_lost: int | None, match: str, row_group=None):
    with pytest.raises(BadFileError, match=match) as err:
        _run(schema, root)
    assert name in str(err.value)
    loader, ids = _run(schema, root, on_bad_file="quarantine")
    recs = [r for r in loader.stats.quarantined if name in r.path]
    assert len(recs) == (1 if row_group is None else len(recs)) and recs
    assert all(r.rows_lost == rows_lost for r in recs) and all(r.reason for r in recs)
    if row_group is not None:
        assert {r.row_group for r in recs} == {row_group}
    lost = sum(r.rows_lost or 0 for r in loader.stats.quarantined)
    assert loader.stats.rows_quarantined == lost
    return loader, ids


@pytest.mark.parametrize("bad", sorted(p.name for p in BAD_DIR.glob("*.parquet")))
def test_shared_bad_parquet_files(demo_schema, tmp_path, bad):
    root = _dataset(demo_schema, tmp_path / "data")
    shutil.copy(BAD_DIR / bad, root / bad)
    try:
        rows = pq.read_metadata(root / bad).num_rows
    except Exception:  # noqa: BLE001 - the footer itself is unreadable: rows unknown
        rows = None
    loader, ids = _check_bad(demo_schema, root, bad, rows, "schema mismatch|footer")
    assert sorted(ids) == list(range(GOOD_ROWS))


def test_truncated_and_empty_files(demo_schema, tmp_path):
    root = _dataset(demo_schema, tmp_path / "data")
    data = (root / "part-00001.parquet").read_bytes()
    (root / "part-00001.parquet").write_bytes(data[: len(data) // 2])
    (root / "part-00002.parquet").write_bytes(b"")
    with pytest.raises(BadFileError, match="part-0000[12]"):
        _run(demo_schema, root)
    loader, ids = _run(demo_schema, root, on_bad_file="quarantine")
    assert sorted(r.path.rsplit("/", 1)[-1] for r in loader.stats.quarantined) == [
        "part-00001.parquet", "part-00002.parquet"]
    assert all(r.rows_lost is None and "footer" in r.reason for r in loader.stats.quarantined)
    assert sorted(ids) == list(range(GOOD_ROWS // 2))


def test_flipped_byte_fails_the_page_checksum(demo_schema, tmp_path):
    root = _dataset(demo_schema, tmp_path / "data")
    path = root / "part-00001.parquet"
    md = pq.read_metadata(path)
    col = md.row_group(1).column(md.num_columns - 4)  # row_id, a plain column chunk
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    data = bytearray(path.read_bytes())
    data[start + col.total_compressed_size - 2] ^= 0xFF  # inside the last page's payload
    path.write_bytes(bytes(data))
    loader, ids = _check_bad(demo_schema, root, "part-00001.parquet", 50, "checksum", row_group=1)
    assert sorted(ids) == sorted(set(range(GOOD_ROWS)) - set(range(150, 200)))
    assert loader.stats.retries == 0  # corruption is not retried


@pytest.mark.parametrize("change", ["missing", "wrong_type", "extra"])
def test_schema_mismatch(demo_schema, tmp_path, change):
    root = _dataset(demo_schema, tmp_path / "data")
    table = generate_table(demo_schema, 30, seed=1, start_row=GOOD_ROWS)
    if change == "missing":
        table = table.drop_columns(["ad_bid"])
    elif change == "wrong_type":
        i = table.schema.get_field_index("ad_bid")
        table = table.set_column(i, "ad_bid", table.column("ad_bid").cast(pa.float64()))
    else:
        table = table.append_column("surprise", pa.array(np.zeros(30, np.int64)))
    _write(table, root / "zz-bad.parquet")
    _, ids = _check_bad(demo_schema, root, "zz-bad.parquet", 30,
                        {"missing": "ad_bid.*missing", "wrong_type": "ad_bid.*double",
                         "extra": "surprise"}[change])
    assert sorted(ids) == list(range(GOOD_ROWS))


def test_zero_rows_and_empty_histories_are_fine(demo_schema, tmp_path):
    root = _dataset(demo_schema, tmp_path / "data")
    _write(demo_schema.arrow_schema().empty_table(), root / "empty-rows.parquet")
    table = generate_table(demo_schema, 40, seed=2, start_row=GOOD_ROWS)
    hist = table.column("history").combine_chunks()
    empty = pa.ListArray.from_arrays(pa.array(np.zeros(41, np.int32)), hist.values.slice(0, 0))
    table = table.set_column(0, "history", empty)
    _write(table, root / "no-history.parquet", row_group_size=20)
    loader, ids = _run(demo_schema, root)
    assert sorted(ids) == list(range(GOOD_ROWS + 40))
    assert loader.stats.quarantined == []
    batches = list(Loader(demo_schema, _cfg(root / "no-history.parquet", shuffle=False)))
    assert [int(b.seq_offsets["history"][-1]) for b in batches] == [0, 0]
    assert all(b.sparse["history.item_id"].values().numel() == 0 for b in batches)


def test_transient_errors_are_retried(demo_schema, tmp_path, monkeypatch):
    root = _dataset(demo_schema, tmp_path / "data")
    real_open, calls = reader._open, {"n": 0}

    def flaky(ref, metadata=None):
        calls["n"] += 1
        if calls["n"] in (2, 3):
            raise ConnectionResetError("connection reset by peer")
        return real_open(ref, metadata)

    monkeypatch.setattr(reader, "_open", flaky)
    loader, ids = _run(demo_schema, root)
    assert sorted(ids) == list(range(GOOD_ROWS)) and loader.stats.retries == 2

    def down(ref, metadata=None):
        raise TimeoutError("read timed out")

    monkeypatch.setattr(reader, "_open", down)
    with pytest.raises(BadFileError, match="timed out"):
        _run(demo_schema, root)


@pytest.mark.parametrize("token_budget,shuffle", [(None, True), (3000, True), (None, False)])
def test_quarantined_row_group_mid_epoch_across_ranks(demo_schema, tmp_path, token_budget, shuffle):
    root = _dataset(demo_schema, tmp_path / "data")
    path = root / "part-00000.parquet"
    md = pq.read_metadata(path)
    col = md.row_group(0).column(md.num_columns - 4)
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    data = bytearray(path.read_bytes())
    data[start + col.total_compressed_size - 2] ^= 0xFF
    path.write_bytes(bytes(data))
    seen, counts, lost = [], [], 0
    for rank in range(2):
        loader = Loader(demo_schema, _cfg(root, on_bad_file="quarantine", token_budget=token_budget,
                                          shuffle=shuffle), rank=rank, world_size=2)
        out = [b.row_ids.tolist() for b in loader]
        counts.append(len(out))
        seen += [i for b in out for i in b]
        lost += loader.stats.rows_quarantined
    assert lost == 50 and sorted(seen) == list(range(50, GOOD_ROWS))
    if token_budget is None:
        assert counts[0] == counts[1]  # a hole shrinks batches, never the number of batches
