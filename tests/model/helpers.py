"""Small schemas and batches for the model tests: real synthetic rows through the real converter."""

from __future__ import annotations

import dataclasses

import pyarrow.compute as pc

from features import load_schema
from features.schema import FeatureSchema
from tests.conftest import SCHEMAS


def shrink(schema: FeatureSchema, *, max_length: int = 24, max_rows: int = 512) -> FeatureSchema:
    """The schema with tiny tables and short histories (same features, so the same model shape)."""
    tables = tuple(dataclasses.replace(t, num_embeddings=min(t.num_embeddings, max_rows)) for t in schema.tables)
    seqs = tuple(dataclasses.replace(s, max_length=max_length) for s in schema.sequences)
    return dataclasses.replace(schema, tables=tables, sequences=seqs)


def tiny_schema(name: str = "demo", **kw) -> FeatureSchema:
    return shrink(load_schema(SCHEMAS / f"{name}.yaml"), **kw)


def synth_batch(schema: FeatureSchema, rows: int = 8, seed: int = 0):
    from ingest.convert import table_to_batch
    from ingest.synth import generate_table

    return table_to_batch(generate_table(schema, rows, seed=seed), schema)


def equal_length_batch(schema: FeatureSchema, length: int, rows: int = 6, seed: int = 0):
    """A batch whose histories all hold exactly ``length`` events (synthetic rows cut to their latest events)."""
    from ingest.convert import table_to_batch
    from ingest.synth import generate_table

    seq = schema.sequences[0]
    table = generate_table(schema, rows * 8, seed=seed)
    table = table.filter(pc.greater_equal(pc.list_value_length(table[seq.name]), length)).slice(0, rows)
    assert table.num_rows == rows, "not enough long histories in the synthetic sample"
    cut = dataclasses.replace(schema, sequences=(dataclasses.replace(seq, max_length=length),))
    return table_to_batch(table, cut)
