"""Padding report numbers against a hand-computed dataset, the one-leaf scan, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ingest.batch import PaddingStats, SequenceStats
from ingest.padding_scan import scan_lengths
from train.cli import main
from train.padding_report import (
    BATCH_MAX,
    BUCKETS,
    JAGGED,
    SCHEMA_MAX,
    format_table,
    report_from_lengths,
    report_from_stats,
)

# Stored lengths; the schema below has max_length 8, so the last row is truncated to 8.
LENGTHS = [0, 1, 3, 5, 10]
TINY_YAML = """name: tiny
tables:
  item: {num_embeddings: 100, dim: 3}
  action: {num_embeddings: 4, dim: 1}
sequences:
  history:
    max_length: 8
    fields:
      item_id: {type: id, table: item}
      action_type: {type: id, table: action}
      ts: {type: timestamp}
labels:
  click: {}
"""


@pytest.fixture(scope="module")
def schema8(tmp_path_factory):
    from features import parse_schema

    return parse_schema(TINY_YAML, "tiny.yaml")


def history_array(lengths, nulls=()):
    n = sum(lengths)
    st = pa.StructArray.from_arrays([pa.array(np.arange(n) % 97, pa.int64()), pa.array(np.zeros(n, np.int64)),
                                     pa.array(np.arange(n), pa.int64())], names=["item_id", "action_type", "ts"])
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    mask = pa.array([i in nulls for i in range(len(lengths))])
    return pa.ListArray.from_arrays(offsets, st, mask=mask if nulls else None)


def write(path, lengths, nulls=(), row_group_size=2):
    t = pa.table({"history": history_array(lengths, nulls), "click": pa.array(np.zeros(len(lengths), np.float32))})
    pq.write_table(t, path, row_group_size=row_group_size)


def test_batch_size_numbers_match_hand_computation(schema8):
    r = report_from_lengths(schema8, {"history": np.array(LENGTHS)}, batch_size=2, token_dim=4)
    seq = r.sequences[0]
    # eff = [0,1,3,5,8]: 17 real events, sum L^2 = 99; batches [0,1] [3,5] [8].
    assert (seq.rows, seq.truncated_rows, seq.truncated_events) == (5, 1, 2)
    got = {s.strategy: (s.events, s.attn_pairs) for s in seq.strategies}
    assert got == {JAGGED: (17, 99), SCHEMA_MAX: (40, 320), BATCH_MAX: (2 + 10 + 8, 2 + 50 + 64),
                   BUCKETS: (0 + 1 + 4 + 8 + 8, 0 + 1 + 16 + 64 + 64)}
    bm = seq.strategy(BATCH_MAX)
    assert bm.wasted == pytest.approx(0.15)
    assert bm.attn_ratio == pytest.approx(116 / 99)
    assert seq.strategy(JAGGED).memory_bytes(4, 4) == 17 * 16
    assert seq.strategy(SCHEMA_MAX).attn_flops(4) == 4 * 320 * 4
    assert seq.percentiles["p50"] == 3 and seq.percentiles["p90"] == 10 and seq.max_seen == 10
    assert seq.histogram == [(0, 0, 1), (1, 1, 1), (2, 3, 1), (4, 7, 1), (8, 15, 1)]
    table = format_table(r)
    assert "15.0%" in table and "pad to batch max" in table


def test_token_budget_batches_like_the_loader(schema8):
    r = report_from_lengths(schema8, {"history": np.array(LENGTHS)}, token_budget=8)
    bm = r.sequences[0].strategy(BATCH_MAX)
    # ingest.batching.token_batches over eff [0,1,3,5,8], budget 8: k = ceil(17/8) = 3 batches dealt
    # serpentine by length: {8} {5, 0} {3, 1}.
    assert (bm.events, bm.attn_pairs) == (8 + 2 * 5 + 2 * 3, 64 + 2 * 25 + 2 * 9)
    capped = report_from_lengths(schema8, {"history": np.array(LENGTHS)}, token_budget=100, batch_size=2)
    # A budget that never binds, but at most 2 rows per batch: again 3 batches, the same grouping.
    assert capped.sequences[0].strategy(BATCH_MAX).events == 8 + 2 * 5 + 2 * 3
def test_default_token_width_is_summed_table_dims(schema8):
    r = report_from_lengths(schema8, {"history": np.array(LENGTHS)}, batch_size=2)
    assert r.sequences[0].token_width == 3 + 1


def test_scan_reads_one_leaf_and_keeps_file_order(tmp_path, schema8):
    write(tmp_path / "a.parquet", [2, 0, 7], nulls=(1,))
    write(tmp_path / "b.parquet", [4, 1, 9, 3], row_group_size=3)
    scan = scan_lengths(schema8, str(tmp_path))
    assert scan.lengths["history"].tolist() == [2, 0, 7, 4, 1, 9, 3]
    assert (scan.files, scan.row_groups, scan.rows) == (2, 2 + 2, 7)
    # action_type is all zeros: its dictionary-coded chunk is the smallest, so it is the one read.
    assert scan.leaf == {"history": "history.list.element.action_type"}


def test_stats_report_matches_lengths_report(schema8):
    """A run's PaddingStats summed over its batches gives the same numbers as the length scan."""
    stats = PaddingStats()
    eff = torch.tensor([min(x, 8) for x in LENGTHS])
    for chunk in torch.split(eff, 2):
        stats += PaddingStats({"history": SequenceStats.of_lengths(chunk, 8)})
    a = report_from_stats(stats, schema=schema8, token_dim=4).sequences[0]
    b = report_from_lengths(schema8, {"history": np.array(LENGTHS)}, batch_size=2, token_dim=4).sequences[0]
    for name in (JAGGED, SCHEMA_MAX, BATCH_MAX):
        sa, sb = a.strategy(name), b.strategy(name)
        assert (sa.events, sa.attn_pairs, sa.real_events) == (sb.events, sb.attn_pairs, sb.real_events)
    assert a.strategy(BUCKETS) is None and a.max_length == 8


def test_cli_json_and_files(tmp_path, schema8, capsys):
    write(tmp_path / "d.parquet", LENGTHS)
    schema_file = tmp_path / "tiny.yaml"
    schema_file.write_text(TINY_YAML)
    out = tmp_path / "out"
    rc = main(["report", "padding", str(tmp_path / "d.parquet"), "--schema", str(schema_file), "--batch-size", "2",
               "--out", str(out), "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    bm = next(s for s in d["sequences"][0]["strategies"] if s["strategy"] == BATCH_MAX)
    assert bm["events"] == 20 and bm["wasted"] == pytest.approx(0.15)
    assert (out / "padding_report.html").read_text().startswith("<!DOCTYPE html>")
    assert json.loads((out / "padding_report.json").read_text())["rows"] == 5
    assert main(["report", "padding", str(tmp_path / "d.parquet"), "--schema", str(schema_file), "--quiet"]) == 0
    assert capsys.readouterr().out == ""


def test_cli_bad_input(tmp_path, capsys, repo_root):
    demo = str(repo_root / "schemas" / "demo.yaml")
    assert main(["report", "padding", str(tmp_path / "nope"), "--schema", demo]) == 1
    assert "no such file or folder" in capsys.readouterr().err
    pq.write_table(pa.table({"other": [1, 2]}), tmp_path / "x.parquet")
    assert main(["report", "padding", str(tmp_path / "x.parquet"), "--schema", demo]) == 1
    err = capsys.readouterr().err
    assert "x.parquet" in err and "column 'history' is missing" in err
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    assert main(["report", "padding", str(tmp_path / "bad.parquet"), "--schema", demo]) == 1
    assert "not a readable Parquet file" in capsys.readouterr().err
    assert main(["report", "padding", str(tmp_path / "x.parquet"), "--schema", str(tmp_path / "none.yaml")]) == 1
    with pytest.raises(SystemExit) as e:
        main(["report", "padding", "d", "--schema", demo, "--batch-size", "0"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["report", "padding", "d", "--schema", demo, "--batch-size", "2", "--token-budget", "9"])
    assert e.value.code == 2


def test_scan_through_fsspec_url(tmp_path, schema8):
    """Remote URLs read byte ranges through fsspec (memory:// stands in for s3:// here)."""
    import fsspec

    write(tmp_path / "a.parquet", [2, 0, 7, 4, 1], nulls=(1,))
    fs = fsspec.filesystem("memory")
    fs.pipe("/scan-test/x/a.parquet", (tmp_path / "a.parquet").read_bytes())
    scan = scan_lengths(schema8, "memory://scan-test/x")
    assert scan.lengths["history"].tolist() == [2, 0, 7, 4, 1]
    assert scan.row_groups_by_levels == scan.row_groups == 3
