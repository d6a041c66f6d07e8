"""The loader on file:// and s3:// (moto): exactly once over ranks and threads, resume, epochs."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from features.errors import GemtrainError
from ingest.loader import Loader, LoaderConfig, merge_state_dicts


def _cfg(store, **kw) -> LoaderConfig:
    d = dict(url=store.url, storage_options=store.storage_options, batch_size=32, shuffle_buffer_rows=70,
             num_threads=2, seed=3)
    d.update(kw)
    return LoaderConfig(**d)


def _ids(loader) -> list[list[int]]:
    return [b.row_ids.tolist() for b in loader]


@pytest.mark.parametrize("threads", [0, 2, 4])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_exactly_once_over_ranks_and_threads(demo_schema, store, world, threads):
    seen, batches, dropped = [], [], set()
    for rank in range(world):
        loader = Loader(demo_schema, _cfg(store, num_threads=threads), rank=rank, world_size=world)
        out = _ids(loader)
        batches.append(len(out))
        seen += [i for b in out for i in b]
        dropped.add(loader.stats.rows_dropped_remainder)
        assert loader.stats.rows_read == sum(len(b) for b in out)
    counts = Counter(seen)
    assert max(counts.values()) == 1
    assert set(counts) <= set(range(store.rows))
    assert dropped == {store.rows % world} and len(seen) == store.rows - store.rows % world
    assert len(set(batches)) == 1  # ranks step in lockstep


def test_thread_count_does_not_change_the_stream(demo_schema, local_store):
    streams = [_ids(Loader(demo_schema, _cfg(local_store, num_threads=t))) for t in (0, 1, 4)]
    assert streams[0] == streams[1] == streams[2]


@pytest.mark.parametrize("mode", ["fixed", "tokens"])
def test_resume_equals_uninterrupted(demo_schema, store, mode):
    kw = dict(epochs=2) if mode == "fixed" else dict(epochs=2, token_budget=1500)
    full = _ids(Loader(demo_schema, _cfg(store, **kw)))
    n = len(full)
    for k in (0, 1, n // 2, n - 1, n):
        first = Loader(demo_schema, _cfg(store, **kw))
        it = iter(first)
        got = [next(it).row_ids.tolist() for _ in range(k)]
        state = first.state_dict()
        second = Loader(demo_schema, _cfg(store, num_threads=4 if k % 2 else 0, **kw))
        second.load_state_dict(state)
        got += _ids(second)
        assert got == full, f"resume after {k} of {n} batches"


@pytest.mark.parametrize("mode", ["fixed", "tokens", "pad"])
def test_resume_at_another_world_size(demo_schema, store, mode):
    kw = {"fixed": {}, "tokens": {"token_budget": 1500}, "pad": {"remainder": "pad_with_repeat"}}[mode]
    olds = [Loader(demo_schema, _cfg(store, **kw), rank=r, world_size=2) for r in range(2)]
    its = [iter(x) for x in olds]
    seen = []
    for _ in range(3):
        for it in its:
            seen += next(it).row_ids.tolist()
    state = merge_state_dicts([x.state_dict() for x in olds])
    news = [Loader(demo_schema, _cfg(store, **kw), rank=r, world_size=3) for r in range(3)]
    for x in news:
        x.load_state_dict(state)
        seen += [i for b in x for i in b.row_ids.tolist()]
    counts = Counter(seen)
    lost = news[0].stats.rows_dropped_remainder
    repeats = news[0].stats.rows_repeated
    assert set(counts) <= set(range(store.rows))
    if mode == "pad":
        assert len(counts) == store.rows and len(seen) == store.rows + repeats
    else:
        assert max(counts.values()) == 1 and len(seen) == store.rows - lost and lost < 3


def test_token_state_needs_every_rank(demo_schema, local_store):
    olds = [Loader(demo_schema, _cfg(local_store, token_budget=1500), rank=r, world_size=2) for r in range(2)]
    next(iter(olds[0]))
    new = Loader(demo_schema, _cfg(local_store, token_budget=1500), rank=0, world_size=3)
    with pytest.raises(GemtrainError, match="missing \\[1\\]"):
        new.load_state_dict(olds[0].state_dict())


def test_epochs_reshuffle_and_each_is_complete(demo_schema, local_store):
    out = _ids(Loader(demo_schema, _cfg(local_store, epochs=2, batch_size=50)))
    e1, e2 = [i for b in out[:12] for i in b], [i for b in out[12:] for i in b]
    assert sorted(e1) == sorted(e2) == list(range(local_store.rows))
    assert e1 != e2
    plain = [i for b in _ids(Loader(demo_schema, _cfg(local_store, shuffle=False, batch_size=50))) for i in b]
    assert plain == list(range(local_store.rows))


def test_token_budget_bounds_and_balances(demo_schema, local_store):
    budget = 1500
    loader = Loader(demo_schema, _cfg(local_store, token_budget=budget, batch_size=64, shuffle_buffer_rows=300))
    events, rows = [], []
    for b in loader:
        offs = b.seq_offsets["history"]
        n = int(offs[-1])
        assert n <= budget or b.batch_size == 1
        events.append(n)
        rows.append(b.batch_size)
    assert sum(rows) == local_store.rows
    # Serpentine grouping: batches of one window carry similar event counts.
    full = np.array(events[:-2], dtype=float)
    assert full.std() / full.mean() < 0.25


def test_padding_stats_accumulate(demo_schema, local_store):
    loader = Loader(demo_schema, _cfg(local_store))
    real = sum(int(b.seq_offsets["history"][-1]) for b in loader)
    st = loader.stats.padding.sequences["history"]
    assert st.real_events == real and st.rows == local_store.rows
    assert st.padded_batch_max_events > real and st.attn_pairs_padded_batch_max > st.attn_pairs_real
    assert loader.stats.to_dict()["padding"]["history"]["real_events"] == real


def test_state_mismatch_is_an_error(demo_schema, local_store):
    state = Loader(demo_schema, _cfg(local_store)).state_dict()
    with pytest.raises(GemtrainError, match="seed"):
        Loader(demo_schema, _cfg(local_store, seed=4)).load_state_dict(state)
    state["fingerprint"] = "0"
    with pytest.raises(GemtrainError, match="dataset changed"):
        Loader(demo_schema, _cfg(local_store)).load_state_dict(state)


def test_config_errors(demo_schema, local_store):
    for bad in (dict(batch_size=0), dict(remainder="keep"), dict(on_bad_file="skip"), dict(epochs=0)):
        with pytest.raises(GemtrainError):
            _cfg(local_store, **bad)
    with pytest.raises(GemtrainError, match="rank 2"):
        Loader(demo_schema, _cfg(local_store), rank=2, world_size=2)
