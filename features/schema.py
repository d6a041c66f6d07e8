"""Feature schemas: YAML -> `FeatureSchema`, the single description every package reads.

A schema names the embedding tables, the event histories (sequences), the non-sequential
features, the labels and the metadata columns. From it come the exact Arrow schema of the
training Parquet (`features.arrow`) and the torchrec table configs (`features.torchrec_configs`).

YAML layout (see schemas/demo.yaml for a complete example)::

    name: demo
    tables:
      item: {num_embeddings: 100000, dim: 64, sharding: row_wise}
    sequences:
      history:                      # one Parquet column: list<struct<fields...>>
        max_length: 256             # keep the most recent events
        fields:
          item_id: {type: id, table: item}
          dwell: {type: float}
          ts: {type: timestamp}     # int64 seconds; at most one per sequence
    features:
      user_id: {type: id, table: user, hash: true}
      interests: {type: id_list, table: category}
      creative: {type: float_vector, dim: 16}
      age: {type: float}
    labels:
      click: {}
      conversion: {mask: click, weight: conversion_weight}
    metadata:
      row_id: int64
      p_click: float32

Column names are the sequence names and the feature, label and metadata names; every name
is unique across the schema. Sequence events share one offsets array by construction: a
sequence is a single `list<struct>` column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from features.errors import SchemaError
from features.yaml_loader import Node, load_yaml_with_lines

TABLE_SHARDING = ("table_wise", "row_wise", "column_wise", "grid", "data_parallel")
SEQ_FIELD_TYPES = ("id", "float", "timestamp")
FEATURE_TYPES = ("id", "id_list", "float", "float_vector")
METADATA_TYPES = ("int64", "int32", "float32", "float64", "string")


@dataclass(frozen=True)
class TableSpec:
    name: str
    num_embeddings: int
    dim: int
    sharding: str | None = None
    pooling: str = "sum"


@dataclass(frozen=True)
class SeqFieldSpec:
    name: str
    type: str  # id | float | timestamp
    table: str | None = None
    hash: bool = False


@dataclass(frozen=True)
class SequenceSpec:
    name: str
    max_length: int
    fields: tuple[SeqFieldSpec, ...]

    @property
    def id_fields(self) -> tuple[SeqFieldSpec, ...]:
        return tuple(f for f in self.fields if f.type == "id")

    @property
    def float_fields(self) -> tuple[SeqFieldSpec, ...]:
        return tuple(f for f in self.fields if f.type == "float")

    @property
    def timestamp_field(self) -> SeqFieldSpec | None:
        return next((f for f in self.fields if f.type == "timestamp"), None)

    def key(self, field_name: str) -> str:
        """The KeyedJaggedTensor key of one of this sequence's id fields."""
        return f"{self.name}.{field_name}"


@dataclass(frozen=True)
class FeatureSpec:
    name: str
    type: str  # id | id_list | float | float_vector
    table: str | None = None
    dim: int = 1
    hash: bool = False


@dataclass(frozen=True)
class LabelSpec:
    name: str
    mask: str | None = None  # another label: this one is observed only where that label is 1
    weight: str | None = None  # a float32 column of per-row weights


@dataclass(frozen=True)
class FeatureSchema:
    name: str
    tables: tuple[TableSpec, ...]
    sequences: tuple[SequenceSpec, ...]
    features: tuple[FeatureSpec, ...]
    labels: tuple[LabelSpec, ...]
    metadata: dict[str, str] = field(default_factory=dict)
    source: str = "<memory>"

    # ---- lookups -------------------------------------------------------------------------
    def table(self, name: str) -> TableSpec:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def sequence(self, name: str) -> SequenceSpec:
        for s in self.sequences:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def id_features(self) -> tuple[FeatureSpec, ...]:
        return tuple(f for f in self.features if f.type in ("id", "id_list"))

    @property
    def dense_features(self) -> tuple[FeatureSpec, ...]:
        return tuple(f for f in self.features if f.type in ("float", "float_vector"))

    @property
    def dense_dim(self) -> int:
        """Width of the batch's `dense` tensor: floats and flattened float vectors, in schema order."""
        return sum(f.dim if f.type == "float_vector" else 1 for f in self.dense_features)

    @property
    def label_names(self) -> tuple[str, ...]:
        return tuple(label.name for label in self.labels)

    @property
    def sparse_keys(self) -> tuple[str, ...]:
        """KeyedJaggedTensor keys in batch order: sequence id fields, then non-sequential ids."""
        keys = [s.key(f.name) for s in self.sequences for f in s.id_fields]
        keys += [f.name for f in self.id_features]
        return tuple(keys)

    def key_table(self) -> dict[str, str]:
        """KJT key -> table name."""
        out = {s.key(f.name): f.table for s in self.sequences for f in s.id_fields}
        out.update({f.name: f.table for f in self.id_features})
        return out  # type: ignore[return-value]

    def key_hashed(self) -> dict[str, bool]:
        """KJT key -> whether raw ids are hashed into the table's range."""
        out = {s.key(f.name): f.hash for s in self.sequences for f in s.id_fields}
        out.update({f.name: f.hash for f in self.id_features})
        return out

    def sequence_tables(self) -> set[str]:
        return {f.table for s in self.sequences for f in s.id_fields}  # type: ignore[misc]

    def column_names(self) -> list[str]:
        cols = [s.name for s in self.sequences] + [f.name for f in self.features]
        cols += [label.name for label in self.labels]
        cols += [label.weight for label in self.labels if label.weight]
        cols += list(self.metadata)
        return cols

    def arrow_schema(self):
        """The exact Arrow schema of this schema's training Parquet."""
        from features.arrow import arrow_schema

        return arrow_schema(self)


# ---- loading ------------------------------------------------------------------------------


def load_schema(path: str | Path, storage_options: dict | None = None) -> FeatureSchema:
    """Loads and validates a schema file (a path or any fsspec URL); raises SchemaError naming
    file, line and field."""
    source = str(path)
    try:
        if isinstance(path, str) and "://" in path:
            import fsspec

            with fsspec.open(path, "rb", **(storage_options or {})) as fh:
                data = fh.read()
        else:
            data = Path(path).read_bytes()
        text = data.decode("utf-8")
    except (OSError, ValueError, ImportError) as e:
        if isinstance(e, UnicodeDecodeError):
            raise SchemaError(f"not a text (UTF-8) file: {e.reason} at byte {e.start}", file=source) from None
        raise SchemaError(f"cannot read schema file: {getattr(e, 'strerror', None) or e}", file=source) from None
    return parse_schema(text, source=source)


def parse_schema(text: str, source: str = "<string>") -> FeatureSchema:
    from features.validate import build_schema

    root = load_yaml_with_lines(text, source)
    return build_schema(root, source)


__all__ = [
    "FeatureSchema",
    "FeatureSpec",
    "LabelSpec",
    "Node",
    "SchemaError",
    "SeqFieldSpec",
    "SequenceSpec",
    "TableSpec",
    "load_schema",
    "parse_schema",
]
