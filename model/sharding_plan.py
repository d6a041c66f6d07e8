"""The sparse sharding plan's inputs and outputs: per-table torchrec constraints from the schema's
`sharding:` and the device's kernels (with fallbacks said as `PlanNote`s), and the plan printed and
saved as a dict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from features.errors import GemtrainError
from features.schema import FeatureSchema


class ParallelConfigError(GemtrainError, ValueError):
    pass


SCHEMA_TO_TORCHREC = {
    "table_wise": "table_wise",
    "row_wise": "row_wise",
    "column_wise": "column_wise",
    "grid": "grid_shard",
    "data_parallel": "data_parallel",
}
# When a device's kernels lack the asked-for type, the nearest one that keeps the table sharded.
FALLBACK = {
    "row_wise": ["table_row_wise", "table_wise"],
    "grid_shard": ["table_column_wise", "column_wise", "table_wise"],
    "column_wise": ["table_column_wise", "table_wise"],
    "table_wise": [],
    "data_parallel": ["table_wise"],
}


@dataclass
class PlanNote:
    table: str
    asked: str
    used: str
    why: str


# 2D sparse parallelism (DMPCollection) cannot build a table-column-wise table on a rank that holds none
# of its shards: torchrec 1.8's empty-shard path (distributed/embeddingbag.py, line 1299) takes the global
# shape from create_global_tensor_shape_stride_from_metadata (distributed/utils.py, line 601), which
# knows column-, row-, table-wise and grid shards only.
NOT_2D = {"table_column_wise"}


def table_constraints(schema: FeatureSchema, device_type: str, strict: bool = False, two_d: bool = False):
    """torchrec ParameterConstraints per table from the schema's `sharding:` and the device's kernels.

    Returns (constraints, notes): a note for each table whose asked-for type the device (or, with
    `two_d`, 2D sparse parallelism) lacks.
    """
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import ParameterConstraints

    from features.torchrec_configs import embedding_bag_configs, embedding_configs

    supported = {
        "ec": EmbeddingCollectionSharder().sharding_types(device_type),
        "ebc": EmbeddingBagCollectionSharder().sharding_types(device_type),
    }
    kind_of = {c.name: "ec" for c in embedding_configs(schema)}
    kind_of.update({c.name: "ebc" for c in embedding_bag_configs(schema)})
    constraints: dict[str, Any] = {}
    notes: list[PlanNote] = []
    for t in schema.tables:
        if t.name not in kind_of:
            continue
        kind = kind_of[t.name]
        ok = [s for s in supported[kind] if (s != "data_parallel" or device_type != "cpu")
              and not (two_d and s in NOT_2D)]
        if t.sharding is None:
            # the planner picks; on CPU not data_parallel (a 2-rank trial failed in its batch split)
            constraints[t.name] = ParameterConstraints(sharding_types=ok)
            continue
        asked = SCHEMA_TO_TORCHREC[t.sharding]
        used = asked if asked in ok else None
        if used is None:
            if strict:
                raise ParallelConfigError(
                    f"schema {schema.source}: table {t.name}: sharding {t.sharding} is not supported by "
                    f"torchrec's {device_type} kernels for an {'EmbeddingCollection' if kind == 'ec' else 'EmbeddingBagCollection'}"
                    f" (supported: {', '.join(ok)}); change the table's sharding or set "
                    "distributed.strict_sharding: false to fall back")
            used = next((f for f in FALLBACK[asked] if f in ok), None)
            if used is None:
                raise ParallelConfigError(f"table {t.name}: no sharding type close to {t.sharding} on {device_type}")
            notes.append(PlanNote(t.name, asked, used, f"{device_type} kernels lack {asked} for {kind}"))
        extra = {}
        if used in ("column_wise", "table_column_wise"):
            # column shards of max(4, dim / 8) columns: small tables really split over the ranks
            extra["min_partition"] = max(4, t.dim // 8)
        constraints[t.name] = ParameterConstraints(sharding_types=[used], **extra)
    return constraints, notes


def describe_plan(plan, notes: list[PlanNote]) -> str:
    """A readable table of the plan: table, sharding type, kernel, shards (rank: offsets/sizes)."""
    lines = ["sharding plan:", f"  {'module':<22} {'table':<14} {'type':<18} {'kernel':<8} shards (rank: offset size)"]
    for module_path, param_plan in plan.plan.items():
        for table, ps in param_plan.items():
            shards = ""
            if ps.sharding_spec is not None and hasattr(ps.sharding_spec, "shards"):
                shards = " ".join(f"{s.placement.rank()}:{list(s.shard_offsets)}/{list(s.shard_sizes)}"
                                  for s in ps.sharding_spec.shards)
            elif ps.ranks:
                shards = "ranks " + ",".join(map(str, ps.ranks))
            lines.append(f"  {module_path:<22} {table:<14} {ps.sharding_type:<18} {ps.compute_kernel:<8} {shards}")
    for n in notes:
        lines.append(f"  note: table {n.table}: asked {n.asked}, using {n.used} ({n.why})")
    return "\n".join(lines)


def plan_to_dict(plan) -> dict[str, Any]:
    """The plan as plain data (saved next to the checkpoint)."""
    out: dict[str, Any] = {}
    for module_path, param_plan in plan.plan.items():
        for table, ps in param_plan.items():
            shards = []
            if ps.sharding_spec is not None and hasattr(ps.sharding_spec, "shards"):
                shards = [{"rank": s.placement.rank(), "offsets": list(s.shard_offsets), "sizes": list(s.shard_sizes)}
                          for s in ps.sharding_spec.shards]
            out[f"{module_path}.{table}"] = {"sharding_type": ps.sharding_type, "compute_kernel": ps.compute_kernel,
                                            "ranks": list(ps.ranks or []), "shards": shards}
    return out
