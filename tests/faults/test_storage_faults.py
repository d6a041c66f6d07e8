"""The loader over s3:// through the fault proxy: every fault kind is survived with exactly the rows of a
clean run; a file that stays unreadable past the retry budget follows `on_bad_file`.

The proxy sits between s3fs and the moto server and faults GET requests (reads) from a seeded plan.
Accounting is exact in every case: rows in the data = rows read + rows quarantined.
"""

from __future__ import annotations

import pytest

from tests.faults.fault_proxy import FAULTS
from tests.faults.test_process_faults import SCHEMA

ROWS = 120
BUCKET = "faults-data"


def _options(proxy) -> dict:
    # One botocore attempt per call: the retries under test are s3fs's and the loader's own.
    return {"client_kwargs": {"endpoint_url": proxy.endpoint_url},
            "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}}, "skip_instance_cache": True}


@pytest.fixture(scope="module")
def schema():
    from features import load_schema

    return load_schema(SCHEMA)


@pytest.fixture(scope="module")
def s3_data(s3_upstream, schema):
    """Synthetic data written to the S3 server (4 files of 30 rows, 2 row groups each)."""
    import s3fs

    from ingest.synth import write_synthetic

    host, port = s3_upstream
    opts = {"client_kwargs": {"endpoint_url": f"http://{host}:{port}"}, "skip_instance_cache": True}
    s3fs.S3FileSystem(**opts).mkdir(BUCKET)
    files = write_synthetic(schema, f"s3://{BUCKET}/train", ROWS, seed=5, files=4, row_group_rows=15,
                            storage_options=opts)
    return f"s3://{BUCKET}/train", files


def _load(schema, url, proxy, **kw):
    from ingest.loader import Loader, LoaderConfig

    cfg = LoaderConfig(url=url, batch_size=16, shuffle=True, seed=1, shuffle_buffer_rows=64, num_threads=0,
                       storage_options=_options(proxy), **kw)
    return Loader(schema, cfg)


def _stream(loader) -> list[list[int]]:
    return [b.row_ids.tolist() for b in loader]


@pytest.fixture
def small_s3fs_budget(monkeypatch):
    """s3fs retries a refused request 5 times with growing sleeps; 2 keep the always-failing tests short."""
    import s3fs

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 2)


@pytest.fixture(scope="module")
def clean(s3_upstream, s3_data, schema):
    from tests.faults.fault_proxy import FaultPlan, FaultProxy

    host, port = s3_upstream
    with FaultProxy(host, port, FaultPlan(rates={}, seed=0)) as proxy:
        loader = _load(schema, s3_data[0], proxy)
        rows = _stream(loader)
    assert sorted(sum(rows, [])) == list(range(ROWS))
    assert loader.stats.rows_quarantined == 0
    return rows


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", FAULTS)
def test_loader_survives_each_storage_fault(fault_proxy, s3_data, schema, clean, fault):
    fault_proxy.plan.rates = {fault: 0.25}
    fault_proxy.plan.delay_s = 0.05
    fault_proxy.plan.seed = 7
    fault_proxy.plan.__post_init__()  # re-seed the plan's generator
    loader = _load(schema, s3_data[0], fault_proxy, retries=4)
    rows = _stream(loader)
    assert fault_proxy.counts[fault] > 0, "the plan injected no fault"
    assert rows == clean  # the same rows, in the same batches, in the same order
    s = loader.stats
    assert (s.rows_read, s.rows_quarantined) == (ROWS, 0)


@pytest.mark.timeout(120)
def test_row_groups_unreadable_past_the_retry_budget_are_quarantined(fault_proxy, s3_data, schema, clean,
                                                                      small_s3fs_budget):
    url, files = s3_data
    bad = files[1]
    name = bad.rsplit("/", 1)[-1]
    loader = _load(schema, url, fault_proxy, retries=2, on_bad_file="quarantine")
    fault_proxy.plan.always_fail_paths = (name,)  # footers were read at start; now every read of it fails
    rows = _stream(loader)
    s = loader.stats
    lost = {r.row_group: r for r in s.quarantined}
    assert sorted(lost) == [0, 1] and all(r.path.endswith(name) and r.rows_lost == 15 for r in lost.values())
    assert all("cannot read" in r.reason for r in lost.values())
    assert s.rows_read + s.rows_quarantined == ROWS and s.rows_quarantined == 30
    # the other rows are exactly the clean run's, in its order (the bad file's rows leave holes)
    flat = sum(rows, [])
    assert len(set(flat)) == len(flat) == ROWS - 30
    assert flat == [r for r in sum(clean, []) if r in set(flat)]
    assert fault_proxy.counts["503"] >= 4  # every attempt of both row groups was refused


@pytest.mark.timeout(120)
def test_file_unreadable_from_the_start_error_and_quarantine(fault_proxy, s3_data, schema, small_s3fs_budget):
    from ingest.errors import BadFileError

    url, files = s3_data
    name = files[2].rsplit("/", 1)[-1]
    fault_proxy.plan.always_fail_paths = (name,)
    with pytest.raises(BadFileError) as e:
        _load(schema, url, fault_proxy, retries=2)
    assert name in str(e.value) and "footer" in str(e.value) and "on_bad_file: quarantine" in str(e.value)
    loader = _load(schema, url, fault_proxy, retries=2, on_bad_file="quarantine")
    rows = sum(_stream(loader), [])
    (rec,) = loader.stats.quarantined
    assert rec.path.endswith(name) and rec.row_group is None and "footer" in rec.reason
    # the footer was never read, so the file's row count is unknown: the accounting uses the known total
    assert rec.rows_lost is None and loader.total_rows == ROWS - 30
    assert len(rows) == len(set(rows)) == loader.stats.rows_read == ROWS - 30
