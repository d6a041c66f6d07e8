"""The loader's shortcuts keep its output exact: id range checks proven by footer statistics, and
the unshuffled stream that holds no shuffle window."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ingest.errors import DataError
from ingest.id_stats import id_leaves, ids_in_range
from ingest.loader import Loader, LoaderConfig
from ingest.synth import generate_table, write_synthetic


def _cfg(url, **kw) -> LoaderConfig:
    d = dict(url=str(url), batch_size=45, shuffle_buffer_rows=70, num_threads=2, seed=1)
    d.update(kw)
    return LoaderConfig(**d)


def test_footer_statistics_prove_id_ranges(demo_schema, tmp_path):
    root = tmp_path / "data"
    write_synthetic(demo_schema, str(root), 120, seed=4, files=2, row_group_rows=40)
    keys = set(id_leaves(demo_schema))
    assert "user_id" not in keys  # hashed ids are never range-checked
    assert Loader(demo_schema, _cfg(root)).ids_in_range == keys

    # No statistics: nothing is proven, the per-batch check runs and the data is still fine.
    extra = generate_table(demo_schema, 30, seed=5, start_row=120)
    pq.write_table(extra, root / "part-nostats.parquet", write_statistics=False)
    assert ids_in_range(pq.read_metadata(root / "part-nostats.parquet"), id_leaves(demo_schema)) == frozenset()
    loader = Loader(demo_schema, _cfg(root))
    assert loader.ids_in_range == frozenset()
    assert sorted(i for b in loader for i in b.row_ids.tolist()) == list(range(150))

    # An id outside its table: its statistics prove nothing, and the per-batch check names it.
    (root / "part-nostats.parquet").unlink()
    bad = generate_table(demo_schema, 30, seed=6, start_row=120)
    ad = bad.column("ad_id").to_numpy().copy()
    ad[7] = demo_schema.table("ad").num_embeddings
    bad = bad.set_column(bad.schema.get_field_index("ad_id"), "ad_id", pa.array(ad))
    pq.write_table(bad, root / "part-bad.parquet")
    loader = Loader(demo_schema, _cfg(root))
    assert loader.ids_in_range == keys - {"ad_id"}
    with pytest.raises(DataError, match="ad_id"):
        list(loader)


def test_unshuffled_stream_over_ranks_and_resume(demo_schema, local_store):
    n = local_store.rows
    for world in (1, 2):
        for rank in range(world):
            full = [b.row_ids.tolist() for b in Loader(demo_schema, _cfg(local_store.url, shuffle=False),
                                                       rank=rank, world_size=world)]
            per = n // world
            assert [i for b in full for i in b] == list(range(rank * per, (rank + 1) * per))
            assert all(len(b) == 45 for b in full[:-1])
            for k in (1, len(full) // 2):
                first = Loader(demo_schema, _cfg(local_store.url, shuffle=False), rank=rank, world_size=world)
                it = iter(first)
                got = [next(it).row_ids.tolist() for _ in range(k)]
                second = Loader(demo_schema, _cfg(local_store.url, shuffle=False, num_threads=0),
                                rank=rank, world_size=world)
                second.load_state_dict(first.state_dict())
                assert got + [b.row_ids.tolist() for b in second] == full


def test_picked_rows_gather_equals_arrow_take(demo_schema):
    from ingest.convert import table_to_batch
    from tests.ingest.tables import demo_table

    m = demo_schema.sequence("history").max_length
    rng = np.random.default_rng(0)
    batches = []
    for i, lengths in enumerate(([3, 0, m + 9, 5, 1, 2], [7, 4, 0, 2 * m], [1, 2, 3, 4, 5])):
        t = demo_table(demo_schema, lengths, seed=10 + i, start_row=10 * i)
        # Nulls: a null history spanning values, a null label, a null float vector; one batch sliced.
        if i == 0:
            hist = t.column("history").combine_chunks()
            mask = pa.array([False, False, False, True, False, False])
            t = t.set_column(0, "history", pa.ListArray.from_arrays(hist.offsets, hist.values, mask=mask))
            t = t.set_column(t.schema.get_field_index("click"), "click",
                             pa.array([1.0, None, 0.0, 1.0, None, 0.0], pa.float32()))
        rb = t.to_batches()[0]
        batches.append(rb.slice(1) if i == 1 else rb)
    parts = []
    for rb in batches:
        rows = np.sort(rng.choice(rb.num_rows, size=3, replace=False))
        parts.append((rb, rows))
    got = table_to_batch(parts, demo_schema)
    want = table_to_batch(pa.Table.from_batches([rb.take(pa.array(r)) for rb, r in parts]), demo_schema)
    assert got.sparse.keys() == want.sparse.keys()
    assert torch.equal(got.sparse.values(), want.sparse.values())
    assert torch.equal(got.sparse.lengths(), want.sparse.lengths())
    for name in ("seq_offsets", "seq_floats", "seq_timestamps"):
        assert torch.equal(getattr(got, name)["history"], getattr(want, name)["history"])
    for name in ("dense", "labels", "label_mask", "weights", "row_ids"):
        assert torch.equal(getattr(got, name), getattr(want, name))
    assert got.stats.to_dict() == want.stats.to_dict()
    assert got.stats.sequences["history"].truncated_events > 0


class _MaxOverThreads:
    """`agree_batches` for ranks run as threads of one process: the max of the ranks' counts per call."""

    def __init__(self, world: int):
        self.barrier = threading.Barrier(world, timeout=30)
        self.values: dict[tuple[int, int], int] = {}
        self.calls = [0] * world

    def for_rank(self, rank: int):
        def agree(n: int) -> int:
            call = self.calls[rank]
            self.calls[rank] += 1
            self.values[(call, rank)] = n
            self.barrier.wait()
            return max(v for (c, _), v in self.values.items() if c == call)
        return agree


def test_token_budget_ranks_step_in_lockstep(demo_schema, local_store):
    budget, world = 1500, 3

    def run(agree=None):
        out = [None] * world

        def one(rank):
            loader = Loader(demo_schema, _cfg(local_store.url, token_budget=budget, batch_size=64,
                                              shuffle_buffer_rows=100, num_threads=0),
                            rank=rank, world_size=world, agree_batches=agree and agree.for_rank(rank))
            out[rank] = [(b.row_ids.tolist(), int(b.seq_offsets["history"][-1])) for b in loader]

        threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    natural = run()
    assert len({len(b) for b in natural}) > 1  # without agreeing, the ranks' batch counts differ
    agreed = run(_MaxOverThreads(world))
    assert len({len(b) for b in agreed}) == 1
    for rank in range(world):
        assert len(agreed[rank]) == max(len(b) for b in natural)
        assert all(ev <= budget or len(ids) == 1 for ids, ev in agreed[rank])
        # Same rows per rank, same order inside each split batch's window.
        assert sorted(i for ids, _ in agreed[rank] for i in ids) == sorted(i for ids, _ in natural[rank] for i in ids)
    seen = [i for r in agreed for ids, _ in r for i in ids]
    assert len(seen) == len(set(seen)) == local_store.rows
