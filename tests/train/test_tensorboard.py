"""TensorBoard scalars: loss, NE, AUC, throughput and padding savings per logged step."""

from __future__ import annotations

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from train.trainer import Trainer


def test_trainer_writes_tensorboard_scalars(tiny_cfg, tmp_path):
    cfg = tiny_cfg(train__steps=4, train__log_every=2, logging__tensorboard="true")
    Trainer(cfg, tmp_path / "run", quiet=True).fit()
    acc = EventAccumulator(str(tmp_path / "run" / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("train/loss", "train/ne/click", "train/auc/click", "train/examples_per_s",
                "train/events_per_s", "train/tflops_per_s", "train/padding_share/history",
                "train/attn_padded_over_jagged/history"):
        assert tag in tags, sorted(tags)
    assert [e.step for e in acc.Scalars("train/loss")] == [2, 4]
    assert all(e.value > 0 for e in acc.Scalars("train/tflops_per_s"))  # model FLOPs over the window's time
