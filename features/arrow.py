"""FeatureSchema -> the exact Arrow schema, and the check of a file's schema against it."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from features.schema import FeatureSchema

_SEQ_FIELD_TYPES = {"id": pa.int64(), "float": pa.float32(), "timestamp": pa.int64()}
_METADATA_TYPES = {"int64": pa.int64(), "int32": pa.int32(), "float32": pa.float32(),
                   "float64": pa.float64(), "string": pa.string()}


def sequence_type(seq) -> pa.DataType:
    return pa.list_(pa.struct([pa.field(f.name, _SEQ_FIELD_TYPES[f.type]) for f in seq.fields]))


def feature_type(feat) -> pa.DataType:
    if feat.type == "id":
        return pa.int64()
    if feat.type == "id_list":
        return pa.list_(pa.int64())
    if feat.type == "float":
        return pa.float32()
    return pa.list_(pa.float32(), feat.dim)  # float_vector: fixed-size list


def arrow_schema(schema: FeatureSchema) -> pa.Schema:
    fields = [pa.field(s.name, sequence_type(s)) for s in schema.sequences]
    fields += [pa.field(f.name, feature_type(f)) for f in schema.features]
    for label in schema.labels:
        fields.append(pa.field(label.name, pa.float32()))
    for label in schema.labels:
        if label.weight:
            fields.append(pa.field(label.weight, pa.float32()))
    fields += [pa.field(name, _METADATA_TYPES[t]) for name, t in schema.metadata.items()]
    return pa.schema(fields, metadata={"gemtrain.schema": schema.name})


@dataclass(frozen=True)
class SchemaMismatch:
    column: str
    problem: str  # "missing" | "wrong type" | "extra"
    expected: str | None = None
    found: str | None = None

    def __str__(self) -> str:
        if self.problem == "missing":
            return f"column '{self.column}' is missing (expected {self.expected})"
        if self.problem == "extra":
            return f"column '{self.column}' is not in the schema (found {self.found})"
        return f"column '{self.column}' has type {self.found}, expected {self.expected}"


def check_arrow_schema(expected: pa.Schema, found: pa.Schema, *, allow_extra: bool = False) -> list[SchemaMismatch]:
    """Every difference between a file's schema and the expected one (empty list when they match).

    Nullability and field metadata are not compared; types are, including nested struct fields.
    """
    problems = []
    found_by_name = {f.name: f for f in found}
    for f in expected:
        got = found_by_name.get(f.name)
        if got is None:
            problems.append(SchemaMismatch(f.name, "missing", expected=str(f.type)))
        elif not _same_type(f.type, got.type):
            problems.append(SchemaMismatch(f.name, "wrong type", expected=str(f.type), found=str(got.type)))
    if not allow_extra:
        names = set(expected.names)
        problems += [SchemaMismatch(f.name, "extra", found=str(f.type)) for f in found if f.name not in names]
    return problems


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    # Large lists are accepted for lists: offsets width differs, values are the same.
    if pa.types.is_list(a) and (pa.types.is_list(b) or pa.types.is_large_list(b)):
        return _same_type(a.value_type, b.value_type)
    if pa.types.is_fixed_size_list(a) and pa.types.is_fixed_size_list(b):
        return a.list_size == b.list_size and _same_type(a.value_type, b.value_type)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        if a.num_fields != b.num_fields:
            return False
        return all(a.field(i).name == b.field(i).name and _same_type(a.field(i).type, b.field(i).type)
                   for i in range(a.num_fields))
    return a.equals(b)
