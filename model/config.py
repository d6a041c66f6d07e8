"""`ModelConfig`: the model's shape and options, as nested dataclasses built from a plain dict (YAML).

Every field has a default, so ``ModelConfig.from_dict({})`` is a working (small) model. Unknown keys,
wrong types and invalid values raise `ModelConfigError` naming the key path and what is allowed.

Sequence-encoder attention per layer: ``sequence_encoder.attention`` is one kind for every layer
(``full``, ``window`` or ``block``) or a list with one entry per layer; an entry may carry its size,
``window:128`` or ``block:64`` (otherwise ``sequence_encoder.window`` / ``block_size`` apply). A mixed
stack such as ``[window:256, window:256, block:64, block:64]`` windows the first layers and runs the
later ones block-local.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from features.errors import GemtrainError

ATTENTION_KINDS = ("full", "window", "block")
ACTIVATIONS = ("softmax", "silu", "gelu")
ATTENTION_IMPLS = ("jagged", "padded")
INTERACTION_KINDS = ("wukong", "dcn", "none")


class ModelConfigError(GemtrainError, ValueError):
    """A model config is wrong: the message names the key path, the value and what is allowed."""


@dataclass
class RelativeBiasConfig:
    """Learnable relative position / time-difference biases inside the encoder's attention."""

    position: bool = True
    # Off by default: each event token already carries its time gaps, and on CPU the per-row time-bias
    # gather of the attention reference is the costliest part of a small model's step.
    time: bool = False
    num_position_buckets: int = 129  # odd: as many buckets before as after the query
    num_time_buckets: int = 32  # log2 buckets of seconds: 32 covers ~136 years


@dataclass
class SequenceEncoderConfig:
    num_layers: int = 2
    attention: str | list[str] = "full"  # one kind, or one entry per layer ("window:128", "block:64", ...)
    window: int = 256
    block_size: int = 64
    activation: str = "softmax"  # softmax | silu | gelu (pointwise, HSTU style)
    causal: bool = True
    mlp_ratio: int = 4
    time_gap_buckets: int = 32  # buckets of the time-gap encoding of each event
    recency_positions: int = 64  # learned embedding of "events ago" (0 = most recent), clipped; 0 = off
    bias: RelativeBiasConfig = field(default_factory=RelativeBiasConfig)


@dataclass
class CrossAttentionConfig:
    """Target-aware cross attention: the non-sequential tokens attend over each encoded history."""

    enabled: bool = True
    activation: str = "softmax"
    # Relative position bias over the history (queries sit after its last event, so it learns recency).
    position_bias: bool = True
    num_position_buckets: int = 129


@dataclass
class InteractionConfig:
    """Feature interaction over the non-sequential and history-summary tokens."""

    kind: str = "wukong"  # wukong | dcn | none
    num_layers: int = 2
    # wukong: factorization-machine block (rank, output tokens, MLP width) + linear compression block
    fm_rank: int = 16
    fm_tokens: int = 8
    lcb_tokens: int = 8
    mlp_dim: int = 256
    # dcn: low-rank cross layers over the flattened tokens
    dcn_rank: int = 64


@dataclass
class MoEConfig:
    """Mixture-of-experts MLP in the top tower; ``num_experts: 0`` turns it off."""

    num_experts: int = 0
    top_k: int = 2
    hidden_dim: int = 512
    load_balance_weight: float = 0.01


@dataclass
class ModelConfig:
    d_model: int = 64
    num_heads: int = 4
    dropout: float = 0.0
    attention_impl: str = "jagged"  # jagged | padded (SDPA on [B, H, L, D] after padding to the batch max)
    use_history: bool = True  # False: the same model without the history (encoder, cross attention, summary)
    sequence_encoder: SequenceEncoderConfig = field(default_factory=SequenceEncoderConfig)
    cross_attention: CrossAttentionConfig = field(default_factory=CrossAttentionConfig)
    # Target match token (model/match.py): recency-weighted count of history events whose id equals the
    # candidate's id on a shared table (e.g. ad_category among history.item_category).
    target_match: bool = True
    target_match_positions: int = 64  # "events ago" buckets of its learnable recency weights
    interaction: InteractionConfig = field(default_factory=InteractionConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)
    top_dim: int = 256
    top_layers: int = 1  # residual MLP (or MoE) blocks in the top tower
    head_hidden: int = 64

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, *, path: str = "model") -> ModelConfig:
        cfg = _build(cls, d or {}, path)
        cfg.validate(path)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # ---- derived ----------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def layer_attention(self) -> list[tuple[str, int | None, int | None]]:
        """(kind, window, block_size) of each encoder layer."""
        enc = self.sequence_encoder
        kinds = enc.attention if isinstance(enc.attention, list) else [enc.attention] * enc.num_layers
        out = []
        for entry in kinds:
            kind, _, size = entry.partition(":")
            n = int(size) if size else None
            if kind == "window":
                out.append(("window", n if n is not None else enc.window, None))
            elif kind == "block":
                out.append(("block", None, n if n is not None else enc.block_size))
            else:
                out.append(("full", None, None))
        return out

    # ---- validation --------------------------------------------------------------------------
    def validate(self, path: str = "model") -> None:
        def bad(key: str, msg: str) -> ModelConfigError:
            return ModelConfigError(f"{path}.{key}: {msg}")

        for key in ("d_model", "num_heads", "top_dim", "top_layers", "head_hidden"):
            if getattr(self, key) < (0 if key == "top_layers" else 1):
                raise bad(key, f"must be a positive integer, got {getattr(self, key)}")
        if self.d_model % self.num_heads:
            raise bad("num_heads", f"d_model={self.d_model} must be divisible by num_heads={self.num_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise bad("dropout", f"must be in [0, 1), got {self.dropout}")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise bad("attention_impl", f"{self.attention_impl!r} is not one of {', '.join(ATTENTION_IMPLS)}")
        enc = self.sequence_encoder
        if enc.num_layers < 0:
            raise bad("sequence_encoder.num_layers", f"must be >= 0, got {enc.num_layers}")
        if enc.activation not in ACTIVATIONS:
            raise bad("sequence_encoder.activation", f"{enc.activation!r} is not one of {', '.join(ACTIVATIONS)}")
        if self.cross_attention.activation not in ACTIVATIONS:
            raise bad("cross_attention.activation",
                      f"{self.cross_attention.activation!r} is not one of {', '.join(ACTIVATIONS)}")
        for key in ("window", "block_size", "mlp_ratio", "time_gap_buckets"):
            if getattr(enc, key) < 1:
                raise bad(f"sequence_encoder.{key}", f"must be a positive integer, got {getattr(enc, key)}")
        if enc.recency_positions < 0:
            raise bad("sequence_encoder.recency_positions", f"must be >= 0 (0 turns it off), got {enc.recency_positions}")
        if self.cross_attention.num_position_buckets < 1:
            raise bad("cross_attention.num_position_buckets",
                      f"must be a positive integer, got {self.cross_attention.num_position_buckets}")
        for key in ("num_position_buckets", "num_time_buckets"):
            if getattr(enc.bias, key) < 1:
                raise bad(f"sequence_encoder.bias.{key}", f"must be a positive integer, got {getattr(enc.bias, key)}")
        entries = enc.attention if isinstance(enc.attention, list) else [enc.attention]
        if isinstance(enc.attention, list) and len(entries) != enc.num_layers:
            raise bad("sequence_encoder.attention", f"a list needs one entry per layer: got {len(entries)} "
                      f"entries for num_layers={enc.num_layers}")
        for entry in entries:
            kind, sep, size = str(entry).partition(":")
            ok = kind in ATTENTION_KINDS and (not sep or (kind != "full" and size.isdigit() and int(size) > 0))
            if not ok:
                raise bad("sequence_encoder.attention", f"{entry!r} is not valid: use full, window, block, "
                          "window:<W> or block:<S> (W, S positive integers)")
        it = self.interaction
        if it.kind not in INTERACTION_KINDS:
            raise bad("interaction.kind", f"{it.kind!r} is not one of {', '.join(INTERACTION_KINDS)}")
        for key in ("num_layers", "fm_rank", "fm_tokens", "lcb_tokens", "mlp_dim", "dcn_rank"):
            if getattr(it, key) < (0 if key == "num_layers" else 1):
                raise bad(f"interaction.{key}", f"must be a positive integer, got {getattr(it, key)}")
        m = self.moe
        if m.num_experts < 0:
            raise bad("moe.num_experts", f"must be >= 0 (0 turns MoE off), got {m.num_experts}")
        if m.num_experts and not 1 <= m.top_k <= m.num_experts:
            raise bad("moe.top_k", f"must be in [1, num_experts={m.num_experts}], got {m.top_k}")
        if m.hidden_dim < 1:
            raise bad("moe.hidden_dim", f"must be a positive integer, got {m.hidden_dim}")
        if m.load_balance_weight < 0:
            raise bad("moe.load_balance_weight", f"must be >= 0, got {m.load_balance_weight}")


# ---- dict -> dataclass ---------------------------------------------------------------------------


def _build(cls: type, d: Any, path: str) -> Any:
    if not isinstance(d, dict):
        raise ModelConfigError(f"{path}: expected a mapping of keys to values, got {type(d).__name__} {d!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in d if k not in names]
    if unknown:
        raise ModelConfigError(f"{path}: unknown key{'s' if len(unknown) > 1 else ''} "
                               f"{', '.join(map(repr, unknown))}; allowed keys: {', '.join(names)}")
    kwargs = {k: _convert(hints[k], v, f"{path}.{k}") for k, v in d.items()}
    return cls(**kwargs)


def _convert(tp: Any, v: Any, path: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return _build(tp, v, path)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            try:
                return _convert(arg, v, path)
            except ModelConfigError as e:
                errors.append(str(e))
        raise ModelConfigError(f"{path}: {v!r} fits none of the allowed types ({_type_name(tp)})")
    if origin is list:
        if not isinstance(v, list | tuple):
            raise ModelConfigError(f"{path}: expected a list, got {type(v).__name__} {v!r}")
        (arg,) = typing.get_args(tp)
        return [_convert(arg, x, f"{path}[{i}]") for i, x in enumerate(v)]
    if tp is bool:
        if isinstance(v, bool):
            return v
    elif tp is int:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    elif tp is float:
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    elif tp is str:
        if isinstance(v, str):
            return v
    elif tp is type(None):
        if v is None:
            return None
    raise ModelConfigError(f"{path}: expected {_type_name(tp)}, got {type(v).__name__} {v!r}")


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))
