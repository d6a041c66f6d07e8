"""`logging.local_mfu_every`: the trainer's mfu records (local / end-to-end MFU, scaling ratio, per block),
the run report's MFU section, and that measuring leaves the training run unchanged."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from train.config import ConfigError
from train.mfu import dense_blocks
from train.trainer import Trainer


def _records(run_dir, kind: str) -> list[dict]:
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == kind]


def test_mfu_records_report_and_unchanged_losses(tiny_cfg, tmp_path, capsys):
    # dropout on, so a measurement that consumed random numbers would change the losses
    common = dict(train__steps=12, train__log_every=1, eval__at_end="false", model__dropout=0.1,
                  checkpoint__at_end="false")
    off = Trainer(tiny_cfg(**common), tmp_path / "off", quiet=True)
    off.fit()
    on = Trainer(tiny_cfg(**common, logging__local_mfu_every=5, logging__peak_tflops=0.5,
                          logging__report="true"), tmp_path / "on")
    summary = on.fit()

    # the training is the same, step for step and in the final weights
    assert [r["loss"] for r in _records(tmp_path / "on", "train")] == \
           [r["loss"] for r in _records(tmp_path / "off", "train")]
    for (name, a), b in zip(off.model.state_dict().items(), on.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert on.model.training and all(p.grad is None for p in on.model.parameters())

    # a record at every 5th step and at the last one
    recs = _records(tmp_path / "on", "mfu")
    assert [r["step"] for r in recs] == [5, 10, 12]
    blocks = dense_blocks(on.model)
    has_matmul = {n for n, m in blocks.items() if any(isinstance(x, nn.Linear) for x in m.modules())}
    for r in recs:
        names = [x["name"] for x in r["layers"]]
        assert names == list(blocks) and len(has_matmul) >= 5
        assert all(x["flops"] > 0 for x in r["layers"] if x["name"] in has_matmul)
        assert all(x["flops"] >= 0 and x["ms"] > 0 for x in r["layers"])
        assert 0 < sum(x["flops"] for x in r["layers"]) <= r["step_flops"]
        # a peak given: every MFU field is a number, and consistent with the rates
        assert r["peak_tflops"] == 0.5
        for k in ("local_mfu", "e2e_mfu", "scaling_ratio", "local_tflops_per_s", "e2e_tflops_per_s"):
            assert isinstance(r[k], float) and r[k] > 0, (k, r[k])
        assert r["local_mfu"] == pytest.approx(r["local_tflops_per_s"] / 0.5)
        assert r["scaling_ratio"] == pytest.approx(r["e2e_mfu"] / r["local_mfu"])
        assert all(isinstance(x["mfu"], float) for x in r["layers"])
    assert recs[2]["window_steps"] == 2
    # the train records' end-to-end MFU uses the same peak override
    assert all(isinstance(r["mfu"], float) for r in _records(tmp_path / "on", "train"))

    # one printed line per record
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("mfu @ step")]
    assert len(lines) == 3 and "local" in lines[0] and "end-to-end" in lines[0] and "scaling ratio" in lines[0]
    assert "(MFU " in lines[0]

    # summary.json and the run report carry the last record
    assert summary["mfu"] == recs[-1]
    assert json.loads((tmp_path / "on" / "summary.json").read_text())["mfu"]["step"] == 12
    page = (tmp_path / "on" / "report.html").read_text()
    assert "<h2>MFU</h2>" in page and "scaling ratio" in page
    assert all(f"<td>{name}</td>" in page for name in blocks)


def test_without_a_peak_mfu_fields_are_null_and_the_ratio_remains(tiny_cfg, tmp_path):
    cfg = tiny_cfg(train__steps=3, train__log_every=3, eval__at_end="false", checkpoint__at_end="false",
                   logging__local_mfu_every=10)
    Trainer(cfg, tmp_path / "run", quiet=True).fit()
    (r,) = _records(tmp_path / "run", "mfu")  # only at the end: the interval is longer than the run
    assert r["step"] == 3 and r["peak_tflops"] is None
    assert r["local_mfu"] is None and r["e2e_mfu"] is None
    assert all(x["mfu"] is None for x in r["layers"])
    assert r["local_tflops_per_s"] > 0 and r["e2e_tflops_per_s"] > 0 and r["scaling_ratio"] > 0
    assert r["scaling_ratio"] == pytest.approx(r["e2e_tflops_per_s"] / r["local_tflops_per_s"])


@pytest.mark.parametrize("key,value", [("logging__local_mfu_every", "-1"), ("logging__peak_tflops", "0")])
def test_bad_settings_are_config_errors(tiny_cfg, key, value):
    with pytest.raises(ConfigError, match=key.replace("__", ".")):
        tiny_cfg(**{key: value})
