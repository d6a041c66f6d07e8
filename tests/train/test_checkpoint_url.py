"""`checkpoint.url` puts a run's checkpoints on any fsspec URL; --resume finds the newest complete one there."""

from __future__ import annotations

import fsspec

from train.trainer import Trainer


def test_checkpoints_to_an_object_store_url_and_resume(tiny_cfg, tmp_path, s3_server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["client_kwargs"]["endpoint_url"])
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir("gemtrain-ckpt")
    url = "s3://gemtrain-ckpt/runs/tiny"
    common = dict(train__steps=4, train__checkpoint_every=2, train__log_every=2, checkpoint__url=url,
                  checkpoint__keep_last=1)
    first = Trainer(tiny_cfg(**common), tmp_path / "run", quiet=True)
    first.fit()
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{url}/checkpoints"))
    assert names == ["step_00000004"], names  # keep_last=1: only the newest complete checkpoint remains
    assert not (tmp_path / "run" / "checkpoints").exists()

    again = Trainer(tiny_cfg(**{**common, "train__steps": 6}), tmp_path / "run", resume=True, quiet=True)
    summary = again.fit()
    assert summary["steps"] == 6 and again.step_at_start == 4  # resumed from the object store, not step 0
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{url}/checkpoints")) == ["step_00000006"]
