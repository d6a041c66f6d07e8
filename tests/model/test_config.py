"""ModelConfig: defaults, nested dicts, per-layer attention, and errors that name the key."""

from __future__ import annotations

import pytest

from features.errors import GemtrainError
from model.config import ModelConfig, ModelConfigError


def test_defaults_and_nested_values():
    cfg = ModelConfig.from_dict({"d_model": 32, "num_heads": 2, "sequence_encoder": {"num_layers": 3,
                                 "bias": {"time": False}}, "moe": {"num_experts": 4, "top_k": 1}})
    assert cfg.d_model == 32 and cfg.head_dim == 16
    assert cfg.sequence_encoder.num_layers == 3 and cfg.sequence_encoder.bias.time is False
    assert cfg.sequence_encoder.bias.position is True  # untouched nested default
    assert cfg.moe.num_experts == 4 and cfg.moe.load_balance_weight == 0.01
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


def test_mixed_attention_stack_with_sizes():
    cfg = ModelConfig.from_dict({"sequence_encoder": {"num_layers": 4, "window": 32, "block_size": 16,
                                 "attention": ["window", "window:8", "block", "block:4"]}})
    assert cfg.layer_attention() == [("window", 32, None), ("window", 8, None), ("block", None, 16),
                                     ("block", None, 4)]
    one = ModelConfig.from_dict({"sequence_encoder": {"num_layers": 2, "attention": "block"}})
    assert one.layer_attention() == [("block", None, 64)] * 2


@pytest.mark.parametrize("d, needle", [
    ({"d_modle": 8}, "model: unknown key 'd_modle'; allowed keys: d_model"),
    ({"sequence_encoder": {"layers": 2}}, "model.sequence_encoder: unknown key 'layers'; allowed keys: num_layers"),
    ({"d_model": "big"}, "model.d_model: expected an integer, got str 'big'"),
    ({"d_model": 30, "num_heads": 4}, "d_model=30 must be divisible by num_heads=4"),
    ({"sequence_encoder": {"attention": "sparse"}}, "model.sequence_encoder.attention: 'sparse' is not valid"),
    ({"sequence_encoder": {"attention": "full:3"}}, "'full:3' is not valid"),
    ({"sequence_encoder": {"num_layers": 2, "attention": ["full"]}}, "one entry per layer: got 1 entries"),
    ({"sequence_encoder": {"activation": "relu"}}, "'relu' is not one of softmax, silu, gelu"),
    ({"attention_impl": "dense"}, "model.attention_impl: 'dense' is not one of jagged, padded"),
    ({"moe": {"num_experts": 2, "top_k": 3}}, "model.moe.top_k: must be in [1, num_experts=2]"),
    ({"interaction": {"kind": "dlrm"}}, "model.interaction.kind: 'dlrm' is not one of wukong, dcn, none"),
    ({"moe": 3}, "model.moe: expected a mapping"),
])
def test_errors_name_the_key(d, needle):
    with pytest.raises(ModelConfigError) as info:
        ModelConfig.from_dict(d)
    assert needle in str(info.value)
    assert isinstance(info.value, GemtrainError)  # the CLI prints it and exits 1
