"""Feature schemas: YAML -> FeatureSchema -> Arrow schema and torchrec table configs."""

from features.errors import GemtrainError, SchemaError
from features.schema import (
    FeatureSchema,
    FeatureSpec,
    LabelSpec,
    SeqFieldSpec,
    SequenceSpec,
    TableSpec,
    load_schema,
    parse_schema,
)

__all__ = [
    "FeatureSchema",
    "FeatureSpec",
    "GemtrainError",
    "LabelSpec",
    "SchemaError",
    "SeqFieldSpec",
    "SequenceSpec",
    "TableSpec",
    "load_schema",
    "parse_schema",
]
