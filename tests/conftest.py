"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = REPO / "schemas"
# The shared team folder sits beside the checkout (CI lays a copy there); /work/shared in development.
SHARED = next((p for p in (REPO.parent / "shared", Path("/work/shared")) if (p / "data").is_dir()),
              REPO.parent / "shared")
BAD_PARQUET_DIR = SHARED / "data" / "bad-parquet"
os.environ.setdefault("PYTHONHASHSEED", "0")
# Tests run the Triton kernels on CPU through the interpreter. The flag is read when a kernel is
# defined, so it must be set before any test module imports triton (set it to 0 to test on a GPU).
os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def demo_schema():
    from features import load_schema

    return load_schema(SCHEMAS / "demo.yaml")


# ---- S3 test server (moto), shared by the ingest tests ----------------------------------------


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on 127.0.0.1 (free port); yields `storage_options` for s3fs pointing at it."""
    from moto.server import ThreadedMotoServer

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(k, v)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield {"client_kwargs": {"endpoint_url": f"http://{host}:{port}"}}
    finally:
        server.stop()
