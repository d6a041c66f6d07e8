"""Bad data, with exact accounting per epoch (rows in the data = rows read + rows quarantined).

The per-file behaviour (every file of the shared bad-parquet set, truncated and empty files, a flipped
byte under page checksums, schema mismatches, empty histories) is tested in tests/ingest/test_bad_input.py;
here a whole training run meets several kinds of bad data at once and its ledger must account for every
row in every epoch, plus what those tests do not cover: flipped bytes without page checksums, ids out of
table range, NaN/Inf dense values and histories longer than max_length.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import BAD_PARQUET_DIR
from tests.faults.test_process_faults import CONFIG, SCHEMA

BAD_SHARED = BAD_PARQUET_DIR / "ARROW-GH-41317.parquet"
GOOD, RG = 96, 24  # good rows (2 files x 2 row groups of 24)
LONG, DRIFT = 24, 30  # rows of the long-history / NaN file, of the schema-drift file
MAX_LEN = 12  # history max_length in tiny_schema.yaml


@pytest.fixture(scope="module")
def schema():
    from features import load_schema

    return load_schema(SCHEMA)


def _write(table: pa.Table, path: Path, checksums: bool = True, **kw) -> None:
    pq.write_table(table, path, compression="zstd", write_page_checksum=checksums, **kw)


def _flip(path: Path, row_group: int, column: str = "row_id", back: int = 2) -> None:
    """Flips one byte inside the last page payload of `column` in `row_group`."""
    md = pq.read_metadata(path)
    names = [md.schema.column(i).path for i in range(md.num_columns)]
    col = md.row_group(row_group).column(names.index(column))
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    data = bytearray(path.read_bytes())
    data[start + col.total_compressed_size - back] ^= 0xFF
    path.write_bytes(bytes(data))


def _long_history_table(schema, rows: int, start_row: int) -> pa.Table:
    """Rows whose histories are 20 events (> max_length), some empty; NaN/Inf dense values; huge raw user ids."""
    from ingest.synth import generate_table

    t = generate_table(schema, rows, seed=9, start_row=start_row)
    hist = t.column("history").combine_chunks()
    lengths = np.where(np.arange(rows) % 4 == 3, 0, 20).astype(np.int32)  # every 4th row: an empty history
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    events = hist.values
    reps = int(np.ceil(offsets[-1] / max(1, len(events))))
    events = pa.concat_arrays([events] * reps).slice(0, int(offsets[-1]))
    t = t.set_column(t.schema.get_field_index("history"), "history",
                     pa.ListArray.from_arrays(pa.array(offsets), events).cast(t.schema.field("history").type))
    bid = t.column("ad_bid").to_numpy().copy()
    bid[[0, 5]] = [np.nan, np.inf]
    t = t.set_column(t.schema.get_field_index("ad_bid"), "ad_bid", pa.array(bid, type=t.schema.field("ad_bid").type))
    uid = t.column("user_id").to_numpy().astype(np.int64) + 10**12  # far outside its table (hash: true)
    return t.set_column(t.schema.get_field_index("user_id"), "user_id",
                        pa.array(uid, type=t.schema.field("user_id").type))


@pytest.fixture(scope="module")
def bad_dataset(schema, tmp_path_factory) -> Path:
    from ingest.synth import generate_table, write_synthetic

    root = tmp_path_factory.mktemp("bad-data") / "train"
    write_synthetic(schema, str(root), GOOD, seed=4, files=2, row_group_rows=RG)
    _flip(root / "part-00001.parquet", row_group=1)  # page checksum catches it: that row group is lost
    _write(_long_history_table(schema, LONG, start_row=GOOD), root / "long-history.parquet")
    drift = generate_table(schema, DRIFT, seed=2, start_row=GOOD + LONG)
    i = drift.schema.get_field_index("ad_bid")
    _write(drift.set_column(i, "ad_bid", drift.column("ad_bid").cast(pa.float64())), root / "zz-drift.parquet")
    shutil.copy(BAD_SHARED, root / BAD_SHARED.name)  # a shared bad file with a readable footer
    return root


@pytest.mark.timeout(180)
def test_training_run_accounts_for_every_row_per_epoch(bad_dataset, tmp_path):
    from train.config import load_run_config
    from train.ledger import format_ledger, read_ledger, read_rows
    from train.trainer import Trainer

    shared_rows = pq.read_metadata(BAD_SHARED).num_rows
    cfg = load_run_config(CONFIG, [f"--data.train_url={bad_dataset}", "--data.epochs=2", "--train.steps=1000",
                                   "--train.checkpoint_every=0", "--train.batch_size=16",
                                   "--data.loader.on_bad_file=quarantine", "--data.loader.nonfinite=zero"])
    run = tmp_path / "run"
    summary = Trainer(cfg, run, quiet=True).fit()
    led = read_ledger(run)
    total = GOOD + LONG + DRIFT + shared_rows
    lost = {"part-00001.parquet": RG, "zz-drift.parquet": DRIFT, BAD_SHARED.name: shared_rows}
    read = GOOD - RG + LONG
    assert len(led["epochs"]) == 2 and summary["skipped_steps"] == 0
    for e in led["epochs"]:
        assert e["rows_total"] == total == e["rows_read"] + e["rows_quarantined"] + e["rows_dropped_remainder"]
        assert (e["rows_read"], e["rows_quarantined"]) == (read, sum(lost.values()))
        got = {q["path"].rsplit("/", 1)[-1]: q for q in e["quarantined"]}
        assert {k: q["rows_lost"] for k, q in got.items()} == lost
        assert "checksum" in got["part-00001.parquet"]["reason"] and got["part-00001.parquet"]["row_group"] == 1
        assert "schema mismatch" in got["zz-drift.parquet"]["reason"] and "ad_bid" in got["zz-drift.parquet"]["reason"]
        # histories of 20 events cut to max_length, oldest first: 18 rows x 8 events; empty ones pass
        assert e["events_truncated"] == (LONG - LONG // 4) * (20 - MAX_LEN)
        assert e["rows_truncated"] == LONG - LONG // 4
        assert e["dense_nonfinite_zeroed"] == 2
    # every readable row trained on exactly once per epoch
    rows = read_rows(run)
    per_epoch = sum(len(r) for r in rows) // 2
    assert per_epoch == read
    ids = sum(rows, [])
    assert sorted(ids[:read]) == sorted(ids[read:]) == sorted(set(range(GOOD + LONG)) - set(range(72, 96)))
    text = format_ledger(led)
    assert "zz-drift.parquet: 30 rows: schema mismatch" in text


def test_bit_flip_without_page_checksums_goes_undetected(schema, tmp_path):
    """Without page checksums a flipped byte in a value page decodes to wrong values that no reader
    can tell from right ones: files must be written with page checksums (synthetic data is)."""
    from ingest.loader import Loader, LoaderConfig
    from ingest.synth import generate_table

    for checksums in (True, False):
        root = tmp_path / f"checksums-{checksums}"
        root.mkdir()
        _write(generate_table(schema, 48, seed=1), root / "a.parquet", checksums=checksums, row_group_size=24)
        _flip(root / "a.parquet", row_group=1)
        loader = Loader(schema, LoaderConfig(url=str(root), batch_size=16, shuffle=False, num_threads=0,
                                             on_bad_file="quarantine"))
        ids = [i for b in loader for i in b.row_ids.tolist()]
        s = loader.stats
        assert s.rows_read + s.rows_quarantined == 48
        if checksums:
            assert ids == list(range(24)) and [r.row_group for r in s.quarantined] == [1]
            assert "checksum" in s.quarantined[0].reason
        else:
            assert len(ids) == 48 and s.quarantined == []
            assert ids[:24] == list(range(24)) and ids[24:] != list(range(24, 48))  # silently wrong


def test_require_page_checksums_refuses_files_written_without_them(schema, tmp_path):
    """With require_page_checksums, a file that could be corrupted undetectably never reaches training:
    a hard error naming it, or (quarantine) all its rows accounted as lost with the reason."""
    from ingest.errors import BadFileError
    from ingest.loader import Loader, LoaderConfig
    from ingest.synth import generate_table

    root = tmp_path / "mixed"
    root.mkdir()
    _write(generate_table(schema, 48, seed=1), root / "a.parquet", checksums=True, row_group_size=24)
    _write(generate_table(schema, 30, seed=2, start_row=48), root / "b.parquet", checksums=False, row_group_size=15)
    _flip(root / "b.parquet", row_group=1)  # undetectable without checksums: the option must stop it

    def config(**kw):
        return LoaderConfig(url=str(root), batch_size=16, shuffle=False, num_threads=0,
                            require_page_checksums=True, **kw)

    with pytest.raises(BadFileError, match="b.parquet.*without page checksums"):
        list(Loader(schema, config()))
    loader = Loader(schema, config(on_bad_file="quarantine"))
    ids = [i for b in loader for i in b.row_ids.tolist()]
    s = loader.stats
    assert ids == list(range(48))  # a.parquet read whole and right
    assert s.rows_read == 48 and s.rows_quarantined == 30 and s.rows_read + s.rows_quarantined == 78
    assert [q.path.rsplit("/", 1)[-1] for q in s.quarantined] == ["b.parquet"]
    assert "without page checksums" in s.quarantined[0].reason
    # the default keeps reading such files (the test above shows what that risks)
    default = Loader(schema, LoaderConfig(url=str(root), batch_size=16, shuffle=False, num_threads=0))
    assert sum(b.batch_size for b in default) == 78


def test_ids_out_of_table_range_error_or_hash(schema, tmp_path):
    from ingest.errors import DataError
    from ingest.loader import Loader, LoaderConfig
    from ingest.synth import generate_table

    t = generate_table(schema, 20, seed=3)
    n_ad = next(tb.num_embeddings for tb in schema.tables if tb.name == "ad")
    ad = t.column("ad_id").to_numpy().copy()
    ad[7] = n_ad + 5  # ad_id has no `hash: true`: an id past its table is an error
    _write(t.set_column(t.schema.get_field_index("ad_id"), "ad_id", pa.array(ad, type=t.schema.field("ad_id").type)),
           tmp_path / "a.parquet")
    loader = Loader(schema, LoaderConfig(url=str(tmp_path), batch_size=8, shuffle=False, num_threads=0))
    with pytest.raises(DataError, match=rf"ad_id.*{n_ad + 5}.*\[0, {n_ad}\).*hash: true"):
        list(loader)
    # user_id has `hash: true`: raw ids far past its table are hashed into range
    big = _long_history_table(schema, 8, start_row=0)
    _write(big, tmp_path / "b.parquet")
    (tmp_path / "a.parquet").unlink()
    (b,) = list(Loader(schema, LoaderConfig(url=str(tmp_path), batch_size=8, shuffle=False, num_threads=0,
                                            nonfinite="zero")))
    uid = b.sparse["user_id"].values()
    assert int(uid.min()) >= 0 and int(uid.max()) < 40


def test_nonfinite_dense_error_names_the_feature(schema, tmp_path):
    from ingest.errors import DataError
    from ingest.loader import Loader, LoaderConfig

    _write(_long_history_table(schema, 8, start_row=0), tmp_path / "a.parquet")
    with pytest.raises(DataError, match=r"NaN or Inf in dense feature\(s\) ad_bid \(row_id \[0, 5\]\)"):
        list(Loader(schema, LoaderConfig(url=str(tmp_path), batch_size=8, shuffle=False, num_threads=0)))
    loader = Loader(schema, LoaderConfig(url=str(tmp_path), batch_size=8, shuffle=False, num_threads=0,
                                         nonfinite="zero"))
    (b,) = list(loader)
    assert bool(b.dense.isfinite().all()) and loader.stats.dense_nonfinite_zeroed == 2


def test_ledger_counts_nan_guard_skips_per_epoch(tmp_path):
    """The NaN guard's skipped steps land in the epoch of the batch that was skipped."""
    import torch

    from train.ledger import RunLedger

    class FakeLoader:
        _epoch, total_rows, stats = 0, 4, None

    class Batch:
        def __init__(self, ids):
            self.row_ids = torch.tensor(ids)
            self.stats = type("S", (), {"sequences": {}})()

    loader = FakeLoader()
    led = RunLedger(tmp_path, loader, 0, False, lambda s: False, 2)
    skipped = 0
    for step, (epoch, ids, skip) in enumerate([(0, [0, 1], False), (0, [2, 3], True), (1, [1, 0], True)], 1):
        loader._epoch = epoch
        led.tag(Batch(ids))
        skipped += skip
        led.after_step(step, skipped)
    assert [(e.epoch, e.rows_read, e.steps, e.steps_skipped) for e in led.epochs.values()] == [(0, 4, 2, 1), (1, 2, 1, 1)]
