"""Fixtures for fault-injection tests: a moto S3 server behind a fault-injecting proxy."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from tests.faults.fault_proxy import FaultPlan, FaultProxy


@pytest.fixture(scope="session")
def s3_upstream(s3_server):
    """(host, port) of the shared moto S3 server (tests/conftest.py), for the proxy to forward to."""
    endpoint = urlparse(s3_server["client_kwargs"]["endpoint_url"])
    return endpoint.hostname, endpoint.port


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
