"""The run config's `precision:` section turns layers into FP8 (emulated on CPU) before training."""

from __future__ import annotations

import math

import pytest

from features.errors import GemtrainError
from kernels.fp8_linear import Fp8Linear
from train.trainer import Trainer


def test_precision_section_converts_mlp_layers_and_trains(tiny_cfg, tmp_path):
    cfg = tiny_cfg(train__steps=4, train__log_every=2, precision__mlp="blockwise", precision__emulate="true",
                   precision__attention_kernel="fp8")
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    fp8 = [n for n, m in tr.model.named_modules() if isinstance(m, Fp8Linear)]
    assert fp8 and tr.precision_report is not None and set(tr.precision_report.converted) == set(fp8)
    heads = [n for n in fp8 if n.startswith("heads.")]
    assert not heads, f"heads must stay high precision: {heads}"
    assert any(v == "fp8" for v in tr.precision_report.attention.values())
    summary = tr.fit()
    assert summary["steps"] == 4 and math.isfinite(summary["eval"]["click"]["ne"])


def test_precision_section_errors_name_the_config(tiny_cfg, tmp_path):
    with pytest.raises(GemtrainError, match="precision") as bad_recipe:
        Trainer(tiny_cfg(precision__mlp="fp4"), tmp_path / "bad", quiet=True)
    with pytest.raises(GemtrainError, match="unknown keys") as bad_key:
        Trainer(tiny_cfg(precision__fp4="true"), tmp_path / "bad_key", quiet=True)
    for err in (bad_recipe, bad_key):  # the section is named once, after the config's source
        assert str(err.value).count("precision:") == 1, str(err.value)


def test_no_precision_section_keeps_plain_linears(tiny_cfg, tmp_path):
    tr = Trainer(tiny_cfg(train__steps=1), tmp_path / "plain", quiet=True)
    assert tr.precision_report is None
    assert not any(isinstance(m, Fp8Linear) for m in tr.model.modules())
