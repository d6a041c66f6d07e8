"""Fixtures of the trainer tests: one small synthetic dataset per session and tiny run configs."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO / "configs" / "demo.yaml"

# A model small enough for a few hundred CPU steps in seconds; the history reaches the heads
# through target-aware cross attention over the raw event tokens.
TINY_MODEL = [
    "--model.d_model=16", "--model.num_heads=2", "--model.sequence_encoder.num_layers=0",
    "--model.interaction.kind=none", "--model.top_dim=32", "--model.head_hidden=16",
]


def tiny_overrides(data_dir: Path, **extra: object) -> list[str]:
    out = [
        f"--data.train_url={data_dir / 'train'}", f"--data.eval_url={data_dir / 'eval'}",
        "--data.synth.train_rows=32000", "--data.synth.eval_rows=3000", "--data.synth.files=2",
        "--train.batch_size=128", "--train.steps=20", "--train.log_every=5", "--train.device=cpu",
        "--train.checkpoint_every=0", "--optim.warmup_steps=5",
        "--logging.progress=false", "--logging.tensorboard=false", "--logging.report=false",
        "--eval.batch_size=1000",
    ] + TINY_MODEL
    out += [f"--{k.replace('__', '.')}={v}" for k, v in extra.items()]
    return out


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """The synthetic train/eval splits, written once (through the trainer's own first-run path)."""
    from features import load_schema
    from train.config import load_run_config
    from train.data import ensure_synthetic

    d = tmp_path_factory.mktemp("tiny-data")
    cfg = load_run_config(DEMO_CONFIG, tiny_overrides(d))
    ensure_synthetic(cfg, load_schema(cfg.schema_path()), log=lambda _m: None)
    return d


@pytest.fixture()
def tiny_cfg(tiny_data):
    from train.config import load_run_config

    def make(**extra: object):
        return load_run_config(DEMO_CONFIG, tiny_overrides(tiny_data, **extra))

    return make


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models run faster on one thread (and do not fight other processes for cores)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
