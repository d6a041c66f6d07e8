"""The training loop on CPU: it learns the history signal, resumes bit for bit, guards against NaN."""

from __future__ import annotations

import json

import pytest
import torch

from train.checkpoint import complete_checkpoints
from train.trainer import Trainer, TrainingStopped


def _losses(run_dir) -> dict[int, float]:
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if r["kind"] == "train"}


@pytest.mark.slow
def test_tiny_model_learns_and_the_no_history_switch_applies(tiny_cfg, tmp_path):
    # Held-out NE below the base-rate predictor (1.0) after a short CPU run, for the model with and
    # without the history; the oracle NE (true probabilities) bounds both from below, and the model
    # with the history beats the one without by a clear margin.
    common = dict(train__steps=250, train__batch_size=128, train__log_every=50, optim__lr=0.01,
                  optim__warmup_steps=20)
    tr_h = Trainer(tiny_cfg(**common), tmp_path / "h", quiet=True)
    tr_nh = Trainer(tiny_cfg(**common, model__use_history="false"), tmp_path / "nh", quiet=True)
    with_h, without = tr_h.fit(), tr_nh.fit()
    for s in (with_h, without):
        click = s["eval"]["click"]
        assert click["oracle_ne"] < click["ne"] < 0.99, click
        assert click["auc"] > 0.6 and s["eval_rows"] == 3000
        assert 0 < click["ne_expected"] < 0.99, click  # scored against the rows' true probabilities
    assert with_h["use_history"] is True and without["use_history"] is False
    # the no-history model has fewer dense parameters: cross attention and the summary are gone
    n = lambda tr: sum(p.numel() for p in tr.dense_params)
    assert n(tr_nh) < n(tr_h)
    assert (tmp_path / "h" / "summary.json").is_file()
    evals = [json.loads(ln) for ln in (tmp_path / "h" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r["kind"] == "eval"]
    assert evals and evals[-1]["ne_expected/click"] == with_h["eval"]["click"]["ne_expected"]
    assert with_h["steps"] == 250 and with_h["examples_per_s"] > 0 and with_h["events_per_s"] > 0
    # where the wall time went: set-up, steps (the first among them), waits for batches, log lines and the final
    # evaluation, none counted twice
    for s in (with_h, without):
        assert s["data_wait_seconds"] >= 0 and s["eval_seconds"] > 0 and s["log_seconds"] > 0
        assert 0 < s["first_step_seconds"] < s["train_seconds"] and s["setup_seconds"] > 0
        parts = ("setup_seconds", "train_seconds", "data_wait_seconds", "log_seconds", "eval_seconds")
        assert sum(s[k] for k in parts) <= s["wall_seconds"]
    assert without["events"] > 0  # the batches still carried histories; the model ignored them
    sw = with_h["software"]  # what the figures depend on besides the config
    assert sw["torch"] == torch.__version__ and sw["device_name"] == "cpu" and isinstance(sw["env"], dict)
    # the planted history signal is learned: clearly better than the same model without the history
    ne_h, ne_nh = with_h["eval"]["click"]["ne"], without["eval"]["click"]["ne"]
    assert ne_h < ne_nh - 0.05, (ne_h, ne_nh)


class _Interrupt(Exception):
    pass


def test_resume_is_bit_exact(tiny_cfg, tmp_path, monkeypatch):
    kw = dict(train__steps=12, train__log_every=1, train__checkpoint_every=4, eval__at_end="false",
              model__dropout=0.1)
    ref = Trainer(tiny_cfg(**kw), tmp_path / "ref", quiet=True)
    ref.fit()
    ref_losses = _losses(tmp_path / "ref")
    assert sorted(ref_losses) == list(range(1, 13))

    # the same run, killed after step 10 (its last checkpoint is at step 8), then resumed
    run = tmp_path / "run"
    original = Trainer._train_step

    def dying(self, *a, **k):
        original(self, *a, **k)
        if self.step == 10:
            raise _Interrupt

    monkeypatch.setattr(Trainer, "_train_step", dying)
    with pytest.raises(_Interrupt):
        Trainer(tiny_cfg(**kw), run, quiet=True).fit()
    monkeypatch.setattr(Trainer, "_train_step", original)
    assert [p.name for p in complete_checkpoints(run)] == ["step_00000004", "step_00000008"]
    resumed = Trainer(tiny_cfg(**kw), run, resume=True, quiet=True)
    resumed.fit()
    assert resumed.step == 12
    assert _losses(run) == ref_losses  # bit for bit, steps 1..12
    for a, b in zip(ref.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)
    # keep_last (3 in the tiny config's default? no: demo keeps 2)
    assert [p.name for p in complete_checkpoints(run)] == ["step_00000008", "step_00000012"]


class _PoisonedLoader:
    """Wraps a loader; batch `bad` gets a NaN dense feature (fault injection)."""

    def __init__(self, inner, bad: set[int]):
        self.inner, self.bad = inner, bad

    def __iter__(self):
        for i, b in enumerate(self.inner):
            if i in self.bad:
                b.dense = b.dense.clone()
                b.dense[0, 0] = float("nan")
            yield b

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, s):
        self.inner.load_state_dict(s)


def _poison(tr: Trainer, bad: set[int]) -> None:
    make = tr._loader
    tr._loader = lambda url, train: _PoisonedLoader(make(url, train=train), bad) if train else make(url, train=train)


def test_nan_guard_skips_and_counts(tiny_cfg, tmp_path):
    tr = Trainer(tiny_cfg(train__steps=8, eval__at_end="false", train__log_every=1), tmp_path / "r", quiet=True)
    _poison(tr, {2})
    s = tr.fit()
    assert s["skipped_steps"] == 1 and s["steps"] == 8
    for p in tr.model.parameters():
        assert torch.isfinite(p).all()
    recs = [json.loads(ln) for ln in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_steps"] for r in recs if r["kind"] == "train"] == [0, 0, 1, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("tables", ["rowwise_adagrad", "adam"])
def test_nan_guard_skips_on_the_device_and_a_skipped_step_moves_nothing(tiny_cfg, tmp_path, tables):
    # every batch poisoned: every step skipped by the device guard (fused AdamW / Adam's found_inf, the
    # row-sparse tables' gradients zeroed), so no parameter moves and no optimizer step is counted
    tr = Trainer(tiny_cfg(train__steps=3, eval__at_end="false", train__nan_guard_max=10, optim__sparse__name=tables),
                 tmp_path / "r", quiet=True)
    _poison(tr, {0, 1, 2})
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    s = tr.fit()
    assert tr._guard.device_guard and s["skipped_steps"] == 3 and s["steps"] == 3
    assert all(torch.equal(p, before[n]) for n, p in tr.model.named_parameters())
    adam_steps = [float(st["step"]) for st in tr.dense_opt._optimizer.state.values()]
    assert adam_steps and set(adam_steps) == {0.0}


def test_nan_guard_stops_after_max(tiny_cfg, tmp_path):
    tr = Trainer(tiny_cfg(train__steps=8, eval__at_end="false", train__nan_guard_max=2), tmp_path / "r", quiet=True)
    _poison(tr, {1, 3})
    with pytest.raises(TrainingStopped, match=r"step 4: 2 non-finite steps, the last at step 4"):
        tr.fit()
