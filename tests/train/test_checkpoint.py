"""Checkpoint folders: only complete ones (with the marker) count; half-written ones are ignored."""

from __future__ import annotations

import pytest

from train.checkpoint import MARKER, CheckpointError, latest_checkpoint, resolve_checkpoint, save_checkpoint


def test_newest_complete_checkpoint_wins_and_partial_ones_are_ignored(tmp_path):
    import torch

    w = torch.arange(6.0)
    for step in (2, 4):
        save_checkpoint(tmp_path, step, {"w": w * step}, {"state": {}}, {"step": step}, keep_last=5)
    ck = tmp_path / "checkpoints"
    (ck / "step_00000006").mkdir()  # crashed before its marker
    (ck / ".tmp-step_00000008").mkdir()  # crashed mid-write
    assert latest_checkpoint(tmp_path).name == "step_00000004"
    assert resolve_checkpoint(ck / "step_00000002").name == "step_00000002"
    # the next save removes the stale temporary folder and keeps the last K complete ones
    save_checkpoint(tmp_path, 10, {"w": w}, {"state": {}}, {"step": 10}, keep_last=2)
    assert not (ck / ".tmp-step_00000008").exists()
    assert sorted(p.name for p in ck.iterdir() if (p / MARKER).exists()) == ["step_00000004", "step_00000010"]
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        resolve_checkpoint(ck / "step_00000006")
