"""Hand-built Arrow tables for the demo schema (small, seeded), for the ingest tests."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def demo_table(schema, lengths, *, seed: int = 0, start_row: int = 0, large_list: bool = False) -> pa.Table:
    """A table matching `schema.arrow_schema()` (the demo schema) with the given history lengths."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, dtype=np.int64)
    b = len(lengths)
    total = int(lengths.sum())
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64 if large_list else np.int32)
    seq = schema.sequence("history")
    children = {}
    for f in seq.fields:
        if f.type == "id":
            n = schema.table(f.table).num_embeddings
            children[f.name] = pa.array(rng.integers(0, n, total), pa.int64())
        elif f.type == "float":
            children[f.name] = pa.array(rng.random(total, dtype=np.float32), pa.float32())
        else:
            children[f.name] = pa.array(np.arange(total, dtype=np.int64) + 1_000_000, pa.int64())
    struct = pa.StructArray.from_arrays(list(children.values()), names=list(children))
    list_cls = pa.LargeListArray if large_list else pa.ListArray
    cols = {"history": list_cls.from_arrays(pa.array(offsets), struct)}
    for f in schema.features:
        if f.type == "id":
            n = schema.table(f.table).num_embeddings
            hi = 2**40 if f.hash else n
            cols[f.name] = pa.array(rng.integers(0, hi, b), pa.int64())
        elif f.type == "id_list":
            n = schema.table(f.table).num_embeddings
            ll = rng.integers(0, 4, b)
            offs = np.concatenate([[0], np.cumsum(ll)]).astype(np.int32)
            cols[f.name] = pa.ListArray.from_arrays(pa.array(offs), pa.array(rng.integers(0, n, int(ll.sum())),
                                                                             pa.int64()))
        elif f.type == "float":
            cols[f.name] = pa.array(rng.random(b, dtype=np.float32), pa.float32())
        else:
            vals = pa.array(rng.random(b * f.dim, dtype=np.float32), pa.float32())
            cols[f.name] = pa.FixedSizeListArray.from_arrays(vals, f.dim)
    click = (rng.random(b) < 0.3).astype(np.float32)
    conv = (click * (rng.random(b) < 0.5)).astype(np.float32)
    for label in schema.labels:
        cols[label.name] = pa.array(click if label.name == "click" else conv, pa.float32())
    for label in schema.labels:
        if label.weight:
            cols[label.weight] = pa.array(np.ones(b, np.float32))
    for name, kind in schema.metadata.items():
        if name == "row_id":
            cols[name] = pa.array(np.arange(start_row, start_row + b, dtype=np.int64))
        elif kind in ("int64", "int32"):
            cols[name] = pa.array(rng.integers(0, 1000, b), pa.int64() if kind == "int64" else pa.int32())
        elif kind == "string":
            cols[name] = pa.array([str(i) for i in range(b)])
        else:
            t = pa.float32() if kind == "float32" else pa.float64()
            cols[name] = pa.array(rng.random(b), t)
    target = schema.arrow_schema()
    if large_list:
        fields = [pa.field("history", cols["history"].type) if f.name == "history" else f for f in target]
        target = pa.schema(fields, metadata=target.metadata)
    return pa.table(cols, schema=target)
