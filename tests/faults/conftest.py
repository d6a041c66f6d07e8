"""Fixtures for fault-injection tests: a moto S3 server behind a fault-injecting proxy."""

from __future__ import annotations

import os

import pytest

from tests.faults.fault_proxy import FaultPlan, FaultProxy


@pytest.fixture(scope="module")
def s3_upstream():
    from moto.server import ThreadedMotoServer

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(k, v)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        yield server.get_host_and_port()
    finally:
        server.stop()


@pytest.fixture
def fault_proxy(s3_upstream):
    host, port = s3_upstream
    with FaultProxy(host, port, FaultPlan(rates={}, seed=0)) as proxy:
        yield proxy


def s3fs_through(proxy: FaultProxy, max_attempts: int = 3):
    """A fresh s3fs filesystem whose endpoint is the proxy, with a small client retry budget."""
    import s3fs

    return s3fs.S3FileSystem(
        client_kwargs={"endpoint_url": proxy.endpoint_url},
        config_kwargs={"retries": {"max_attempts": max_attempts, "mode": "standard"}},
        skip_instance_cache=True,
    )
