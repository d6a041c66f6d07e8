"""Which id features a Parquet footer already proves to be inside their tables' ranges.

Every non-hashed id must lie in `[0, num_embeddings)`. The converter checks that with one pass over
the values of every batch; when the footer's column statistics (min/max of each column chunk,
written by Arrow, Spark and most writers) already show `0 <= min` and `max < num_embeddings` for
every row group of a file, that pass is redundant for the file's rows. Statistics are trusted the
way predicate push-down trusts them; a column without usable statistics (none written, unsigned
logical type, non-integer physical type) is never trusted, so the converter still checks it.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from features.schema import FeatureSchema

__all__ = ["id_leaves", "ids_in_range"]


def id_leaves(schema: FeatureSchema) -> dict[str, tuple[tuple[str, ...], int]]:
    """Non-hashed sparse key -> (leaf path prefix and last part, table size).

    A sequence id field is the leaf `<seq>.<list levels>.<field>`, an `id` feature the column
    `<name>`, an `id_list` feature the leaf `<name>.<list levels>`.
    """
    out: dict[str, tuple[tuple[str, ...], int]] = {}
    for seq in schema.sequences:
        for f in seq.id_fields:
            if not f.hash:
                out[seq.key(f.name)] = ((seq.name, f.name), schema.table(f.table).num_embeddings)
    for f in schema.id_features:
        if not f.hash:
            out[f.name] = ((f.name, "" if f.type == "id" else "*"), schema.table(f.table).num_embeddings)
    return out


def _matches(path: tuple[str, ...], first_last: tuple[str, ...]) -> bool:
    first, last = first_last
    if last == "":  # a flat column
        return path == (first,)
    if last == "*":  # the one leaf of a list column
        return len(path) >= 2 and path[0] == first
    return len(path) >= 3 and path[0] == first and path[-1] == last


def _signed_int(stats) -> bool:
    if stats.physical_type not in ("INT32", "INT64"):
        return False
    logical = json.loads(stats.logical_type.to_json())
    return logical.get("isSigned", True) is not False


def ids_in_range(md: pq.FileMetaData, leaves: dict[str, tuple[tuple[str, ...], int]]) -> frozenset[str]:
    """The keys of `leaves` whose values the statistics of every row group of `md` prove in range."""
    columns: dict[str, int] = {}
    for key, (match, _) in leaves.items():
        hits = [i for i in range(md.num_columns)
                if _matches(tuple(md.schema.column(i).path.split(".")), match)]
        if len(hits) == 1:
            columns[key] = hits[0]
    proven = set(columns)
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        for key in list(proven):
            st = rg.column(columns[key]).statistics
            n = leaves[key][1]
            if st is None or not _signed_int(st):
                proven.discard(key)
            elif st.has_min_max:
                if not (st.min >= 0 and st.max < n):
                    proven.discard(key)
            elif st.num_values != 0:  # values but no min/max: unknown
                proven.discard(key)
        if not proven:
            break
    return frozenset(proven)
