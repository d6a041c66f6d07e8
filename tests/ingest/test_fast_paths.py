"""The loader's shortcuts keep its output exact: id range checks proven by footer statistics, and
the unshuffled stream that holds no shuffle window."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

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
