"""The fault proxy injects each fault it is asked for, and reads through it still return the right bytes."""

from __future__ import annotations

import os

import pytest

from tests.faults.conftest import s3fs_through
from tests.faults.fault_proxy import FaultPlan


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["500", "503", "drop", "delay", "truncate"])
def test_reads_survive_each_fault(fault_proxy, fault):
    fs = s3fs_through(fault_proxy, max_attempts=8)
    bucket = f"proxy-{fault}"
    fs.mkdir(bucket)
    data = os.urandom(400_000)
    fs.pipe(f"{bucket}/blob", data)  # writes are not faulted (PUT is not in plan.methods)
    fault_proxy.plan.rates = {fault: 0.3}
    fault_proxy.plan.delay_s = 0.05
    fault_proxy.counts.clear()
    fresh = s3fs_through(fault_proxy, max_attempts=8)
    for i in range(8):
        assert fresh.cat_file(f"{bucket}/blob", start=i * 50_000, end=(i + 1) * 50_000) == \
            data[i * 50_000:(i + 1) * 50_000]
    assert fault_proxy.counts[fault] > 0, "the plan injected no fault"
    assert fault_proxy.counts["ok"] + fault_proxy.counts["delay"] >= 8  # delayed requests are still answered


def test_unknown_fault_is_rejected():
    with pytest.raises(ValueError, match="unknown faults"):
        FaultPlan(rates={"explode": 1.0})


@pytest.mark.timeout(60)
def test_always_failing_path_fails_after_retry_budget(fault_proxy):
    fs = s3fs_through(fault_proxy, max_attempts=2)
    fs.mkdir("proxy-dead")
    fs.pipe("proxy-dead/bad.parquet", b"x" * 100)
    fault_proxy.plan.always_fail_paths = ("bad.parquet",)
    fresh = s3fs_through(fault_proxy, max_attempts=2)
    fresh.retries = 1
    with pytest.raises(OSError):
        fresh.cat_file("proxy-dead/bad.parquet")
    assert fault_proxy.counts["503"] >= 2
