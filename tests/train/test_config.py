"""Run config: YAML + overrides -> RunConfig; every mistake names the key, the file and what is allowed."""

from __future__ import annotations

import pytest

from features.errors import GemtrainError
from tests.train.conftest import DEMO_CONFIG
from train.config import ConfigError, load_run_config, parse_overrides


def test_demo_config_loads_with_typed_overrides():
    cfg = load_run_config(DEMO_CONFIG, ["--train.steps=7", "--optim.lr", "0.5", "--train.bf16=false",
                                        "--model.d_model=48", "--data.epochs=null", "--optim.sparse.name=adam"])
    assert cfg.name == "demo"
    assert cfg.train.steps == 7 and isinstance(cfg.train.steps, int)
    assert cfg.optim.lr == 0.5 and cfg.train.bf16 is False
    assert cfg.model.d_model == 48  # the model section is a ModelConfig
    assert cfg.data.epochs is None and cfg.optim.sparse.name == "adam"
    assert cfg.schema_path().is_file()


def test_unknown_key_names_key_file_line_and_allowed(tmp_path):
    text = DEMO_CONFIG.read_text()
    assert "\ntrain:\n" in text
    text = text.replace("\ntrain:\n", "\ntrain:\n  stpes: 3\n")
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_run_config(p)
    msg = str(e.value)
    line = text.splitlines().index("  stpes: 3") + 1
    assert f"bad.yaml:{line}" in msg and "train.stpes" in msg and "unknown key" in msg
    assert "steps" in msg and "batch_size" in msg  # the allowed keys are listed
    assert isinstance(e.value, GemtrainError)


def test_unknown_section_and_override_errors():
    with pytest.raises(ConfigError, match=r"unknown key 'trian'.*allowed here: .*train"):
        load_run_config(DEMO_CONFIG, ["--trian.steps=3"])
    with pytest.raises(ConfigError, match=r"train.steps: expected int, got 'ten'"):
        load_run_config(DEMO_CONFIG, ["--train.steps=ten"])
    with pytest.raises(ConfigError, match="has no value"):
        load_run_config(DEMO_CONFIG, ["--train.steps"])
    with pytest.raises(ConfigError, match="optim.decay"):
        load_run_config(DEMO_CONFIG, ["--optim.decay=exponential"])
    with pytest.raises(GemtrainError, match="model.sequence_encoder.depth|depth"):
        load_run_config(DEMO_CONFIG, ["--model.sequence_encoder.depth=2"])


def test_parse_overrides_forms():
    assert parse_overrides(["--a.b=1", "--c.d", "x=y"]) == [("a.b", "1"), ("c.d", "x=y")]
    with pytest.raises(ConfigError, match="section"):
        parse_overrides(["--steps=3"])
    with pytest.raises(ConfigError, match="cannot read"):
        parse_overrides(["steps"])


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the run config"):
        load_run_config(tmp_path / "nope.yaml")
