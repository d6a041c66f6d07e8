"""Checkpoints on S3 (through fsspec): complete ones only are visible, the newest is resumed, the last K
are kept; a checkpoint half written by a crash is ignored and replaced; loading survives read faults."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def s3_conf(fault_proxy, monkeypatch):
    """fsspec's default S3 options point at the fault proxy (what FSSPEC_S3_* variables do for a user)."""
    import fsspec.config
    import s3fs

    monkeypatch.setitem(fsspec.config.conf, "s3", {"client_kwargs": {"endpoint_url": fault_proxy.endpoint_url},
                                                   "skip_instance_cache": True})
    s3fs.S3FileSystem(client_kwargs={"endpoint_url": fault_proxy.endpoint_url}, skip_instance_cache=True).mkdir("ckpt")
    return fault_proxy


def _states(seed: int):
    g = torch.Generator().manual_seed(seed)
    model = {"w": torch.randn(8, 4, generator=g), "b": torch.randn(4, generator=g)}
    optim = {"state": {"w": {"exp_avg": torch.randn(8, 4, generator=g)}}, "param_groups": [{"lr": 0.1, "params": ["w"]}]}
    return model, optim


@pytest.mark.timeout(120)
def test_s3_checkpoints_atomic_newest_keep_last(s3_conf):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    from train import checkpoint as ckpt

    run = "s3://ckpt/run"
    for step in (2, 3):
        model, optim = _states(step)
        ckpt.save_checkpoint(run, step, model, optim, {"step": step, "loader": {"pos": step * 16}}, keep_last=1)
    assert [c.rsplit("/", 1)[-1] for c in ckpt.complete_checkpoints(run)] == ["step_00000003"]

    # a crash mid-save: the tensors of step 4 are there, its COMPLETE marker is not
    model4, optim4 = _states(4)
    dcp.save({"model": model4, "optim": optim4, "trainer": b""},
             storage_writer=FsspecWriter("s3://ckpt/run/checkpoints/step_00000004"))
    assert ckpt.latest_checkpoint(run).endswith("step_00000003")

    # resume reads the newest complete one, with read faults on the way
    s3_conf.plan.rates = {"503": 0.2, "drop": 0.1}
    model, optim = _states(99)
    state = ckpt.load_checkpoint(run, model, optim)
    s3_conf.plan.rates = {}
    want_model, want_optim = _states(3)
    assert state == {"step": 3, "loader": {"pos": 48}}
    assert all(torch.equal(model[k], want_model[k]) for k in want_model)
    assert torch.equal(optim["state"]["w"]["exp_avg"], want_optim["state"]["w"]["exp_avg"])

    # the next save at step 4 replaces the half-written folder; retention keeps the last two
    ckpt.save_checkpoint(run, 4, model4, optim4, {"step": 4}, keep_last=2)  # keeps 3 and 4
    assert [c.rsplit("/", 1)[-1] for c in ckpt.complete_checkpoints(run)] == ["step_00000003", "step_00000004"]
    m, o = _states(0)
    assert ckpt.load_checkpoint(run, m, o) == {"step": 4} and torch.equal(m["w"], model4["w"])


def test_local_half_written_checkpoint_is_ignored(tmp_path):
    from train import checkpoint as ckpt

    model, optim = _states(1)
    ckpt.save_checkpoint(tmp_path, 1, model, optim, {"step": 1}, keep_last=3)
    half = tmp_path / "checkpoints" / ".tmp-step_00000002"
    half.mkdir()
    (half / ".metadata").write_bytes(b"partial")
    broken = tmp_path / "checkpoints" / "step_00000003"  # a folder without the marker (copied by hand, say)
    broken.mkdir()
    assert ckpt.latest_checkpoint(tmp_path).name == "step_00000001"
    ckpt.save_checkpoint(tmp_path, 2, model, optim, {"step": 2}, keep_last=3)
    assert not half.exists()  # the next save clears what a crash left
    assert [c.name for c in ckpt.complete_checkpoints(tmp_path)] == ["step_00000001", "step_00000002"]
    with pytest.raises(ckpt.CheckpointError, match="no complete checkpoint"):
        ckpt.resolve_checkpoint(tmp_path / "empty")
