"""Arrow -> JaggedBatch: offsets, slices, nulls, truncation, hashing, zero-copy, padding stats."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from features.hashing import hash_ids
from ingest.convert import table_to_batch
from ingest.errors import DataError
from tests.ingest.tables import demo_table


def _reference(table: pa.Table, schema):
    """Per-row Python reference: history ids per row after keeping the last max_length events."""
    seq = schema.sequence("history")
    out = []
    for row in table.column("history").to_pylist():
        events = (row or [])[-seq.max_length:] if seq.max_length else (row or [])
        out.append(events)
    return out


def _check_history(batch, table, schema):
    ref = _reference(table, schema)
    offs = batch.seq_offsets["history"].numpy()
    assert offs[0] == 0 and len(offs) == table.num_rows + 1
    assert np.array_equal(np.diff(offs), [len(r) for r in ref])
    kjt = batch.sparse.to_dict()
    for f in ("item_id", "item_category", "action_type"):
        jt = kjt[f"history.{f}"]
        assert np.array_equal(jt.lengths().numpy(), np.diff(offs))
        assert jt.values().tolist() == [e[f] for r in ref for e in r]
    assert batch.seq_timestamps["history"].tolist() == [e["ts"] for r in ref for e in r]
    got = batch.seq_floats["history"][:, 0].numpy()
    assert np.allclose(got, [e["dwell_time"] for r in ref for e in r])


def test_basic_layout_and_keys(demo_schema):
    table = demo_table(demo_schema, [3, 0, 5, 1], seed=1)
    batch = table_to_batch(table, demo_schema)
    assert batch.batch_size == 4
    assert batch.sparse.keys() == list(demo_schema.sparse_keys)
    _check_history(batch, table, demo_schema)
    assert batch.row_ids.tolist() == [0, 1, 2, 3]
    assert batch.dense.shape == (4, demo_schema.dense_dim)
    assert batch.seq_offsets["history"].dtype == torch.int64
    # dense: ad_creative (16 floats), then user_age, ad_bid (schema order).
    creative = np.array(table.column("ad_creative").to_pylist(), dtype=np.float32)
    assert np.array_equal(batch.dense[:, :16].numpy(), creative)
    assert np.array_equal(batch.dense[:, 16].numpy(), table.column("user_age").to_numpy())
    interests = batch.sparse["user_interests"]
    assert interests.values().tolist() == [i for r in table.column("user_interests").to_pylist() for i in r]


@pytest.mark.parametrize("large_list", [False, True])
def test_sliced_table_offsets_not_zero(demo_schema, large_list):
    table = demo_table(demo_schema, [4, 2, 7, 0, 3, 5], seed=2, large_list=large_list)
    part = table.slice(2, 3)
    assert part.column("history").chunk(0).offsets[0].as_py() != 0
    batch = table_to_batch(part, demo_schema)
    _check_history(batch, part, demo_schema)
    assert batch.row_ids.tolist() == [2, 3, 4]
    assert batch.sparse["user_interests"].values().tolist() == [
        i for r in part.column("user_interests").to_pylist() for i in r]
    # The same rows as a record batch slice.
    rb = table.to_batches()[0].slice(2, 3)
    assert torch.equal(table_to_batch(rb, demo_schema).sparse.values(), batch.sparse.values())


def test_truncation_keeps_most_recent_events(demo_schema):
    max_len = demo_schema.sequence("history").max_length
    lengths = [max_len + 10, 3, max_len, max_len + 1]
    table = demo_table(demo_schema, lengths, seed=3)
    batch = table_to_batch(table.slice(1), demo_schema)  # also sliced
    _check_history(batch, table.slice(1), demo_schema)
    ts = batch.seq_timestamps["history"].numpy()
    offs = batch.seq_offsets["history"].numpy()
    full_ts = np.array([r["ts"] for r in table.column("history").to_pylist()[3]])
    assert np.array_equal(ts[offs[2]:offs[3]], full_ts[1:])  # the oldest event was dropped
    st = batch.stats.sequences["history"]
    assert st.truncated_events == 1
    assert st.real_events == 3 + max_len + max_len


def test_null_lists_and_null_values(demo_schema):
    table = demo_table(demo_schema, [2, 3, 1], seed=4)
    hist = table.column("history").chunk(0)
    # Row 1 null, and its slot still spans 3 child values (Arrow allows it).
    mask = pa.array([False, True, False])
    nulled = pa.ListArray.from_arrays(hist.offsets, hist.values, mask=mask)
    assert nulled.null_count == 1 and nulled.offsets[2].as_py() - nulled.offsets[1].as_py() == 3
    table = table.set_column(0, "history", nulled)
    table = table.set_column(table.schema.get_field_index("user_age"), "user_age",
                             pa.array([1.0, None, 2.0], pa.float32()))
    table = table.set_column(table.schema.get_field_index("click"), "click",
                             pa.array([1.0, None, 0.0], pa.float32()))
    batch = table_to_batch(table, demo_schema)
    assert batch.seq_offsets["history"].tolist() == [0, 2, 2, 3]
    _check_history(batch, table, demo_schema)
    assert batch.dense[:, 16].tolist() == [1.0, 0.0, 2.0]
    # click null -> unobserved; conversion (mask: click) observed only where click == 1.
    assert batch.label_mask[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert batch.label_mask[:, 1].tolist() == [1.0, 0.0, 0.0]


def test_hashing_and_id_range(demo_schema):
    table = demo_table(demo_schema, [1, 2], seed=5)
    batch = table_to_batch(table, demo_schema)
    raw = table.column("user_id").to_numpy()
    n = demo_schema.table("user").num_embeddings
    assert batch.sparse["user_id"].values().tolist() == hash_ids(raw, n).tolist()
    bad = table.set_column(table.schema.get_field_index("ad_id"), "ad_id", pa.array([1, 10**9], pa.int64()))
    with pytest.raises(DataError, match="ad_id"):
        table_to_batch(bad, demo_schema)


def test_zero_copy_views_of_arrow_buffers(demo_schema):
    table = demo_table(demo_schema, [5, 0, 7, 2], seed=6)
    rb = table.to_batches()[0].slice(1, 3)
    batch = table_to_batch(rb, demo_schema)
    struct = rb.column("history").values

    def inside(t: torch.Tensor, arr: pa.Array) -> bool:
        buf = arr.buffers()[1]
        return buf.address <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= buf.address + buf.size

    assert inside(batch.seq_timestamps["history"], struct.field("ts"))
    assert inside(batch.seq_floats["history"], struct.field("dwell_time"))
    assert inside(batch.row_ids, rb.column("row_id"))
    assert np.shares_memory(batch.seq_timestamps["history"].numpy(),
                            np.frombuffer(struct.field("ts").buffers()[1], dtype=np.int64))


def test_padding_stats(demo_schema):
    table = demo_table(demo_schema, [1, 4, 2], seed=7)
    st = table_to_batch(table, demo_schema).stats.sequences["history"]
    m = demo_schema.sequence("history").max_length
    assert (st.rows, st.real_events, st.padded_batch_max_events, st.padded_schema_max_events) == (3, 7, 12, 3 * m)
    assert st.attn_pairs_real == 1 + 16 + 4 and st.attn_pairs_padded_batch_max == 3 * 16


def test_chunked_table_and_missing_column(demo_schema):
    a, b = demo_table(demo_schema, [2, 1], seed=8), demo_table(demo_schema, [3], seed=9, start_row=2)
    table = pa.concat_tables([a, b])
    assert table.column("history").num_chunks == 2
    batch = table_to_batch(table, demo_schema)
    _check_history(batch, table, demo_schema)
    assert batch.row_ids.tolist() == [0, 1, 2]
    with pytest.raises(DataError, match="ad_bid"):
        table_to_batch(a.drop_columns(["ad_bid"]), demo_schema)


@pytest.mark.parametrize("lengths", [[3, 0, 5, 1], [0, 0], []])
def test_per_key_totals_known_without_reading_lengths(demo_schema, lengths):
    # A device copy of the batch keeps these, so the embedding lookups never read lengths back from the GPU.
    batch = table_to_batch(demo_table(demo_schema, lengths, seed=3), demo_schema)
    kjt = batch.sparse
    given = kjt.length_per_key_or_none(), kjt.offset_per_key_or_none()
    assert given[0] is not None and given[1] is not None
    per_key = kjt.lengths().view(len(kjt.keys()), len(lengths)).sum(dim=1).tolist() if kjt.keys() else []
    assert given[0] == per_key
    assert given[1] == [0, *np.cumsum(per_key).tolist()]
    assert kjt.stride() == len(lengths)
    moved = kjt.to(torch.device("cpu"))
    assert moved.length_per_key_or_none() == per_key
