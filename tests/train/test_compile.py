"""`train.compile`: the dense blocks compile once, and a batch of another total history length does not recompile."""

from __future__ import annotations

import time

import torch
import torch._dynamo

from model import build_model, multitask_loss
from tests.model.helpers import synth_batch, tiny_schema
from train.compile import compile_dense_blocks
from train.config import run_config_from_dict

SCHEMA = tiny_schema(max_length=20)
# Dynamo's guards and AOT autograd's symbolic shapes decide recompiles; inductor's C++ build of the kernels
# would take minutes on a 2-core CI machine, so the test traces through the same stack minus code generation.
BACKEND = "aot_eager"
MODEL = {"d_model": 16, "num_heads": 2, "top_dim": 32, "head_hidden": 8, "sequence_encoder": {"num_layers": 1},
         "interaction": {"kind": "dcn", "num_layers": 1}}


def _step(model, batch) -> torch.Tensor:
    out = model(batch)
    loss, _ = multitask_loss(out.logits, batch.labels, batch.label_mask, batch.weights, SCHEMA.label_names)
    loss.backward()
    return out.logits.detach()


def test_compiled_blocks_do_not_recompile_for_new_lengths():
    t0 = time.perf_counter()
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = build_model(SCHEMA, MODEL)
    model = build_model(SCHEMA, MODEL)
    model.load_state_dict(eager.state_dict())
    names = compile_dense_blocks(model, backend=BACKEND)
    assert "interaction" in names and "encoders.history.layers.0.mlp" in names and "heads.click" in names
    assert not any(n.startswith("encoders.history.layers.0.attn") for n in names)  # attention stays eager
    a, b = synth_batch(SCHEMA, rows=6, seed=1), synth_batch(SCHEMA, rows=6, seed=2)
    assert int(a.seq_offsets["history"][-1]) != int(b.seq_offsets["history"][-1])
    torch._dynamo.utils.counters.clear()
    got_a = _step(model, a)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert frames > 0  # the blocks really went through dynamo
    torch.testing.assert_close(got_a, _step(eager, a), rtol=1e-4, atol=1e-5)
    with torch._dynamo.config.patch(error_on_recompile=True):
        got_b = _step(model, b)  # other ΣL: would raise on a recompile
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames
    torch.testing.assert_close(got_b, _step(eager, b), rtol=1e-4, atol=1e-5)
    for name, p in model.named_parameters():  # gradients equal too (the compiled backward ran)
        q = dict(eager.named_parameters())[name]
        if p.grad is not None and q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5)
    assert set(model.state_dict()) == set(eager.state_dict())  # in place: checkpoint keys unchanged
    print(f"compile test: {time.perf_counter() - t0:.1f} s")


def test_compile_is_a_validated_train_field():
    cfg = run_config_from_dict({"schema": "s.yaml", "data": {"train_url": "x"}, "train": {"compile": True}})
    assert cfg.train.compile is True
    import pytest

    from train.config import ConfigError

    with pytest.raises(ConfigError, match="train.compile"):
        run_config_from_dict({"schema": "s.yaml", "data": {"train_url": "x"}, "train": {"compile": "maybe"}})


def test_trainer_compiles_and_trains_without_recompiling(tiny_cfg, tmp_path, monkeypatch):
    import functools

    import train.compile
    from train.trainer import Trainer

    monkeypatch.setattr(train.compile, "compile_dense_blocks",
                        functools.partial(compile_dense_blocks, backend=BACKEND))
    torch._dynamo.reset()
    cfg = tiny_cfg(train__compile="true", train__steps=3, train__batch_size=32, train__log_every=1, eval__at_end="false",
                   model__sequence_encoder__num_layers=1)
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    assert "encoders.history.layers.0.mlp" in tr.compiled_blocks and "heads.click" in tr.compiled_blocks
    tr.fit()  # warm-up: the first step compiles every block
    torch._dynamo.utils.counters.clear()
    tr.cfg.train.steps = 6
    with torch._dynamo.config.patch(error_on_recompile=True):
        summary = tr.fit()  # three more steps, new batches (other ΣL): would raise on a recompile
    assert summary["steps"] == 6
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0
