"""Run configuration: YAML -> `RunConfig` (dataclasses), with `--section.key=value` overrides.

A run config names the feature schema, the data (train and held-out URLs, synthetic data to
generate on first run, loader settings), the model (`model.config.ModelConfig`), and the train,
optim, eval, checkpoint and logging sections. Every key is checked: an unknown one is an error
naming the key, the file (and line) and the keys allowed there. Example: configs/demo.yaml.

Overrides come from the command line: `--train.steps=200`, `--optim.sparse.lr=0.1`,
`--model.encoder.num_layers=1`; values are coerced to the field's type (`true`/`false` for bools,
`null` for optional fields, YAML for dicts and lists).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from features.errors import GemtrainError


class ConfigError(GemtrainError, ValueError):
    """A run config (or an override) is wrong: says where, what, and what is allowed."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key: str | None = None, hint: str | None = None):
        where = ""
        if file:
            where = file + (f":{line}" if line is not None else "") + ": "
        what = f"{key}: " if key else ""
        text = f"{where}{what}{message}"
        if hint:
            text += f" ({hint})"
        self.file, self.line, self.key = file, line, key
        super().__init__(text)


# ---- sections ---------------------------------------------------------------------------------


@dataclass
class SynthConfig:
    """Synthetic data written on first run when the data URLs hold no data yet."""

    enabled: bool = False
    train_rows: int = 100_000
    eval_rows: int = 20_000
    files: int = 4
    seed: int = 0


@dataclass
class DataConfig:
    train_url: str = ""
    eval_url: str = ""
    synth: SynthConfig = field(default_factory=SynthConfig)
    # Extra `ingest.loader.LoaderConfig` fields (num_threads, prefetch, shuffle_buffer_rows, ...);
    # url, batch_size and seed come from this config's data/train sections.
    loader: dict[str, Any] = field(default_factory=dict)
    # Train passes over the data; null = repeat until `train.steps`.
    epochs: int | None = None


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 256
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    bf16: bool = True  # autocast to bfloat16 on CUDA (CPU always runs float32)
    log_every: int = 50
    eval_every: int = 0  # 0: evaluate only at the end
    checkpoint_every: int = 0  # 0: checkpoint only at the end (if checkpoint.at_end)
    nan_guard_max: int = 10  # stop after this many skipped non-finite steps
    torch_threads: int = 0  # 0: torch's default
    compile: bool = False  # torch.compile the dense blocks (dynamic shapes; train/compile.py)


@dataclass
class SparseOptimConfig:
    name: str = "rowwise_adagrad"  # rowwise_adagrad | adam
    lr: float = 0.05
    eps: float = 1e-8
    weight_decay: float = 0.0


@dataclass
class OptimConfig:
    lr: float = 1e-3
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 100
    decay: str = "cosine"  # none | linear | cosine (from the end of warm-up to train.steps)
    min_lr_ratio: float = 0.1
    clip_grad_norm: float = 1.0  # 0: no clipping (dense parameters)
    sparse: SparseOptimConfig = field(default_factory=SparseOptimConfig)


@dataclass
class EvalConfig:
    batch_size: int = 0  # 0: the train batch size
    max_batches: int = 0  # 0: the whole held-out set
    at_end: bool = True
    save_predictions: bool = False  # per-row predictions of each evaluation, in the run dir (train/predictions.py)


@dataclass
class CheckpointConfig:
    keep_last: int = 3
    at_end: bool = True
    url: str = ""  # where checkpoints go (any fsspec URL, e.g. s3://bucket/run); default: the run dir


@dataclass
class LoggingConfig:
    progress: bool = True  # tqdm progress bar
    tensorboard: bool = True  # scalars, when tensorboard is installed
    report: bool = True  # HTML run report at the end
    # Every N steps (and at the end) time each dense block alone on the step's batch: local MFU, end-to-end
    # MFU, their scaling ratio and a per-block breakdown ({"kind": "mfu"} in metrics.jsonl). 0: off.
    local_mfu_every: int = 0
    # The device's dense bf16 peak in TFLOP/s for MFU; null: the datasheet table (none known on CPU).
    peak_tflops: float | None = None


@dataclass
class RunConfig:
    name: str = "run"
    schema: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    model: Any = None  # model.config.ModelConfig
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    distributed: dict[str, Any] = field(default_factory=dict)  # model.parallelize.ParallelConfig
    precision: dict[str, Any] = field(default_factory=dict)  # train.precision.PrecisionPolicy; empty: bf16/fp32
    source: str = "<memory>"  # the YAML file this came from (not a key)
    model_dict: dict[str, Any] = field(default_factory=dict)  # the model section as written (not a key)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)
             if f.name not in ("model", "model_dict", "source")}
        d["model"] = _plain(self.model) if dataclasses.is_dataclass(self.model) else dict(self.model_dict)
        return d

    def schema_path(self) -> Path:
        return resolve_path(self.schema, self.source)


_NOT_KEYS = ("source", "model_dict")


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def resolve_path(p: str, config_source: str) -> Path:
    """A relative path is taken from the working directory, else from the config file's folder or its parent."""
    path = Path(p)
    if path.is_absolute() or path.exists() or config_source.startswith("<"):
        return path
    base = Path(config_source).resolve().parent
    for cand in (base / path, base.parent / path):
        if cand.exists():
            return cand
    return path


# ---- building dataclasses from plain dicts -------------------------------------------------------


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name not in _NOT_KEYS}


def _optional_inner(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _coerce(value: Any, tp: Any, key: str, file: str | None, line: int | None) -> Any:
    """Checks / converts one value to a field type; strings from the command line are parsed."""
    inner, optional = _optional_inner(tp)
    if value is None or (isinstance(value, str) and value.lower() in ("null", "none", "~")):
        if optional:
            return None
        raise ConfigError("must not be null", file=file, line=line, key=key)
    tp = inner
    origin = typing.get_origin(tp)
    bad = ConfigError(f"expected {getattr(tp, '__name__', str(tp))}, got {value!r}", file=file, line=line,
                      key=key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        raise bad
    if tp is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                raise bad from None
        raise bad
    if tp is float:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if tp is str:
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return str(value)
        raise bad
    if origin is dict or tp is dict:
        if isinstance(value, str):
            value = yaml.safe_load(value)
        if not isinstance(value, dict):
            raise ConfigError(f"expected a mapping, got {value!r}", file=file, line=line, key=key)
        return value
    if origin in (list, tuple):
        if isinstance(value, str):
            value = yaml.safe_load(value)
        if not isinstance(value, list):
            raise ConfigError(f"expected a list, got {value!r}", file=file, line=line, key=key)
        return value
    return value


def _build(cls: type, d: Any, prefix: str, file: str | None, lines: dict[str, int]) -> Any:
    if not isinstance(d, dict):
        raise ConfigError(f"expected a mapping of keys {sorted(_field_types(cls))}, got {d!r}", file=file,
                          line=lines.get(prefix), key=prefix or None)
    types_ = _field_types(cls)
    kwargs: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        if k not in types_:
            raise ConfigError(f"unknown key '{k}'", file=file, line=lines.get(key), key=key,
                              hint="allowed here: " + ", ".join(sorted(types_)))
        tp = types_[k]
        inner, _ = _optional_inner(tp)
        if dataclasses.is_dataclass(inner):
            kwargs[k] = _build(inner, v if v is not None else {}, key, file, lines)
        else:
            kwargs[k] = _coerce(v, tp, key, file, lines.get(key))
    return cls(**kwargs)


# ---- overrides --------------------------------------------------------------------------------


def parse_overrides(args: list[str]) -> list[tuple[str, str]]:
    """`['--train.steps=200', '--optim.lr', '0.01']` -> `[('train.steps', '200'), ('optim.lr', '0.01')]`."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--") or len(a) <= 2:
            raise ConfigError(f"cannot read the argument '{a}'",
                              hint="overrides look like --section.key=value, e.g. --train.steps=200")
        body = a[2:]
        if "=" in body:
            k, v = body.split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            k, v = body, args[i + 1]
            i += 1
        else:
            raise ConfigError(f"the override '{a}' has no value",
                              hint="write --section.key=value, e.g. --train.steps=200")
        if "." not in k and k not in ("name", "schema"):
            raise ConfigError(f"the override '{a}' names no section",
                              hint="write --section.key=value, e.g. --train.steps=200")
        out.append((k, v))
        i += 1
    return out


def _apply_override(raw: dict[str, Any], key: str, value: str) -> None:
    parts = key.split(".")
    node = raw
    for p in parts[:-1]:
        nxt = node.get(p)
        if nxt is None:
            nxt = node[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"cannot set '{key}': '{p}' is not a section", key=key)
        node = nxt
    # Keep the string: typed fields coerce it; free-form sections (model, data.loader) parse it as YAML.
    node[parts[-1]] = _OverrideValue(value)


class _OverrideValue(str):
    """A string from the command line (parsed as YAML where the field has no declared type)."""


def _yaml_values(d: Any) -> Any:
    if isinstance(d, _OverrideValue):
        return yaml.safe_load(str(d))
    if isinstance(d, dict):
        return {k: _yaml_values(v) for k, v in d.items()}
    return d


def _walk_lines(node: Any, prefix: str, out: dict[str, int]) -> None:
    from features.yaml_loader import Node

    if isinstance(node, Node) and isinstance(node.value, dict):
        for k, child in node.value.items():
            key = f"{prefix}.{k}" if prefix else k
            out[key] = child.line
            _walk_lines(child, key, out)


# ---- entry points -----------------------------------------------------------------------------


def build_model_config(d: dict[str, Any], file: str | None = None) -> Any:
    from model.config import ModelConfig

    try:
        return ModelConfig.from_dict(d)
    except GemtrainError as e:
        if file and file not in str(e):
            raise ConfigError(f"model section: {e}", file=file) from None
        raise


def run_config_from_dict(raw: dict[str, Any], source: str = "<memory>",
                         lines: dict[str, int] | None = None) -> RunConfig:
    lines = lines or {}
    raw = dict(raw)
    model_d = _yaml_values(raw.pop("model", None) or {})
    if not isinstance(model_d, dict):
        raise ConfigError("the model section must be a mapping", file=source, line=lines.get("model"),
                          key="model")
    # data.loader is free-form here; its keys are checked against LoaderConfig when the loader is built.
    if isinstance(raw.get("data"), dict) and "loader" in raw["data"]:
        raw["data"] = dict(raw["data"])
        raw["data"]["loader"] = _yaml_values(raw["data"]["loader"]) or {}
    cfg = _build(RunConfig, raw, "", source, lines)
    cfg.source = source
    cfg.model_dict = model_d
    cfg.model = build_model_config(model_d, source)
    _validate(cfg)
    return cfg


def load_run_config(path: str | Path, overrides: list[str] | list[tuple[str, str]] | None = None) -> RunConfig:
    """Reads a run config file and applies overrides (`--section.key=value` strings or (key, value) pairs)."""
    from features.yaml_loader import load_yaml_with_lines

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read the run config: {e.strerror}", file=str(path)) from None
    try:
        root = load_yaml_with_lines(text, str(path))
    except GemtrainError as e:
        raise ConfigError(str(e)) from None
    raw = root.plain()
    if not isinstance(raw, dict):
        raise ConfigError("a run config is a mapping of sections", file=str(path), line=1,
                          hint="sections: " + ", ".join(sorted(_field_types(RunConfig))))
    lines: dict[str, int] = {}
    _walk_lines(root, "", lines)
    pairs = overrides or []
    if pairs and isinstance(pairs[0], str):
        pairs = parse_overrides(pairs)  # type: ignore[arg-type]
    for k, v in pairs:
        _apply_override(raw, k, v)
    raw.setdefault("name", path.stem)
    return run_config_from_dict(raw, str(path), lines)


def _validate(cfg: RunConfig) -> None:
    f = cfg.source
    checks = [
        (cfg.train.steps >= 0, "train.steps", "must be >= 0"),
        (cfg.train.batch_size > 0, "train.batch_size", "must be > 0"),
        (cfg.train.log_every > 0, "train.log_every", "must be > 0"),
        (cfg.train.nan_guard_max >= 0, "train.nan_guard_max", "must be >= 0"),
        (cfg.optim.decay in ("none", "linear", "cosine"), "optim.decay", "must be one of none, linear, cosine"),
        (cfg.optim.sparse.name in ("rowwise_adagrad", "adam"), "optim.sparse.name",
         "must be one of rowwise_adagrad, adam"),
        (cfg.checkpoint.keep_last >= 1, "checkpoint.keep_last", "must be >= 1"),
        (cfg.logging.local_mfu_every >= 0, "logging.local_mfu_every", "must be >= 0 (0: off)"),
        (cfg.logging.peak_tflops is None or cfg.logging.peak_tflops > 0, "logging.peak_tflops",
         "must be > 0 (or null: the datasheet table)"),
        (bool(cfg.schema), "schema", "is required: the feature schema file"),
        (bool(cfg.data.train_url), "data.train_url", "is required"),
    ]
    for ok, key, msg in checks:
        if not ok:
            raise ConfigError(msg, file=f, key=key)
    if cfg.train.device not in ("auto", "cpu", "cuda") and not cfg.train.device.startswith("cuda:"):
        raise ConfigError(f"unknown device '{cfg.train.device}'", file=f, key="train.device",
                          hint="use auto, cpu, cuda or cuda:N")
