"""Ingest test datasets: one small synthetic demo dataset, on local disk and on the moto S3 server."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

ROWS = 600
FILES = 3
ROW_GROUP_ROWS = 100


@dataclass(frozen=True)
class Store:
    kind: str  # "file" | "s3"
    url: str
    storage_options: dict
    rows: int


@pytest.fixture(scope="session")
def local_store(demo_schema, tmp_path_factory) -> Store:
    from ingest.synth import write_synthetic

    root = tmp_path_factory.mktemp("demo-data")
    write_synthetic(demo_schema, f"file://{root}", ROWS, seed=0, files=FILES, row_group_rows=ROW_GROUP_ROWS)
    return Store("file", f"file://{root}", {}, ROWS)


@pytest.fixture(scope="session")
def s3_store(demo_schema, s3_server) -> Store:
    import s3fs

    from ingest.synth import write_synthetic

    fs = s3fs.S3FileSystem(**s3_server)
    fs.mkdir("gemtrain-test")
    write_synthetic(demo_schema, "s3://gemtrain-test/demo", ROWS, seed=0, files=FILES,
                    row_group_rows=ROW_GROUP_ROWS, storage_options=s3_server)
    return Store("s3", "s3://gemtrain-test/demo", dict(s3_server), ROWS)


@pytest.fixture(params=["file", "s3"])
def store(request) -> Store:
    return request.getfixturevalue("local_store" if request.param == "file" else "s3_store")
