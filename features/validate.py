"""Builds a `FeatureSchema` from line-annotated YAML, checking every field on the way.

Each error names the file, the line and the dotted field path, and says what is allowed there.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from features.errors import SchemaError
from features.schema import (
    FEATURE_TYPES,
    METADATA_TYPES,
    SEQ_FIELD_TYPES,
    TABLE_SHARDING,
    FeatureSchema,
    FeatureSpec,
    LabelSpec,
    SeqFieldSpec,
    SequenceSpec,
    TableSpec,
)
from features.yaml_loader import Node

TOP_KEYS = {"name": False, "tables": True, "sequences": False, "features": False, "labels": True,
            "metadata": False, "description": False}
TABLE_KEYS = ("num_embeddings", "dim", "sharding", "pooling")
SEQUENCE_KEYS = ("max_length", "fields")
SEQ_FIELD_KEYS = ("type", "table", "hash")
FEATURE_KEYS = ("type", "table", "dim", "hash")
LABEL_KEYS = ("mask", "weight")
# Names become Parquet column paths and KJT keys ("history.item_id"), so no dots or spaces.
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


class _Ctx:
    def __init__(self, source: str):
        self.source = source

    def fail(self, node: Node | None, path: str, message: str, hint: str | None = None) -> SchemaError:
        return SchemaError(message, file=self.source, line=node.line if node else None,
                           field=path or "(document)", hint=hint)

    def name(self, name: str, node: Node, path: str) -> str:
        if not NAME_RE.match(name):
            raise self.fail(node, path, f"'{name}' is not a valid name",
                            "use letters, digits, '_' or '-', starting with a letter or '_' (no dots or spaces)")
        return name

    def mapping(self, node: Node, path: str, allowed: tuple[str, ...] | None = None) -> dict[str, Node]:
        if not isinstance(node.value, dict):
            raise self.fail(node, path, f"expected a mapping, got {_kind(node.value)}")
        if allowed is not None:
            for key, child in node.value.items():
                if key not in allowed:
                    raise self.fail(child, f"{path}.{key}" if path else key, "unknown key",
                                    _suggest(key, allowed))
        return node.value

    def integer(self, node: Node, path: str, minimum: int = 1) -> int:
        v = node.value
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(node, path, f"expected an integer, got {_kind(v)} {v!r}")
        if v < minimum:
            raise self.fail(node, path, f"must be >= {minimum}, got {v}")
        return v

    def string(self, node: Node, path: str) -> str:
        if not isinstance(node.value, str) or not node.value:
            raise self.fail(node, path, f"expected a non-empty string, got {_kind(node.value)} {node.value!r}")
        return node.value

    def boolean(self, node: Node, path: str) -> bool:
        if not isinstance(node.value, bool):
            raise self.fail(node, path, f"expected true or false, got {node.value!r}")
        return node.value

    def choice(self, node: Node, path: str, allowed: tuple[str, ...]) -> str:
        v = self.string(node, path)
        if v not in allowed:
            raise self.fail(node, path, f"'{v}' is not allowed", _suggest(v, allowed))
        return v


def _kind(v: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "nothing"}.get(type(v), type(v).__name__)


def _suggest(word: str, allowed) -> str:
    allowed = list(allowed)
    close = difflib.get_close_matches(word, allowed, n=1)
    base = "allowed: " + ", ".join(allowed)
    return f"did you mean '{close[0]}'? {base}" if close else base


def build_schema(root: Node, source: str) -> FeatureSchema:
    ctx = _Ctx(source)
    top = ctx.mapping(root, "", tuple(TOP_KEYS))
    for key, required in TOP_KEYS.items():
        if required and key not in top:
            raise ctx.fail(root, key, "is required but missing")
    name = ctx.string(top["name"], "name") if "name" in top else source.rsplit("/", 1)[-1].split(".")[0]

    tables = _tables(ctx, top["tables"])
    table_names = {t.name for t in tables}
    seen: dict[str, str] = {}  # column name -> where it was declared

    def claim(col: str, node: Node, path: str) -> None:
        if col in seen:
            raise ctx.fail(node, path, f"name '{col}' is already used by {seen[col]}",
                           "every sequence, feature, label and metadata name must be unique")
        seen[col] = path

    sequences = _sequences(ctx, top.get("sequences"), table_names, claim)
    features = _features(ctx, top.get("features"), table_names, claim)
    labels = _labels(ctx, top["labels"], claim)
    metadata = _metadata(ctx, top.get("metadata"), claim)

    seq_tables = {f.table for s in sequences for f in s.id_fields}
    for f in features:
        if f.type == "id_list" and f.table in seq_tables:
            node = top["features"].value[f.name].value["table"]
            raise ctx.fail(node, f"features.{f.name}.table",
                           f"table '{f.table}' is used by a sequence, which embeds it unpooled; an id_list "
                           "feature is pooled", "give the id_list feature a table of its own")
    # Every id looked up in one table must be hashed or not alike: a shared table is one id space.
    hashed_by: dict[str, tuple[bool, str]] = {}
    users = [(f"sequences.{q.name}.fields.{f.name}", f, top["sequences"].value[q.name].value["fields"].value[f.name])
             for q in sequences for f in q.id_fields]
    users += [(f"features.{f.name}", f, top["features"].value[f.name]) for f in features if f.table]
    for path, f, node in users:
        first = hashed_by.setdefault(f.table, (f.hash, path))
        if first[0] != f.hash:
            raise ctx.fail(node.value.get("hash", node), f"{path}.hash",
                           f"is {str(f.hash).lower()}, but {first[1]} (same table '{f.table}') has "
                           f"hash: {str(first[0]).lower()}", "ids sharing a table must be hashed alike")
    if not sequences and not features:
        raise ctx.fail(root, "features", "the schema has no sequences and no features: nothing to learn from")
    return FeatureSchema(name=name, tables=tables, sequences=sequences, features=features, labels=labels,
                         metadata=metadata, source=source)


def _tables(ctx: _Ctx, node: Node) -> tuple[TableSpec, ...]:
    entries = ctx.mapping(node, "tables")
    if not entries:
        raise ctx.fail(node, "tables", "at least one embedding table is required")
    out = []
    for name, tnode in entries.items():
        path = f"tables.{name}"
        ctx.name(name, tnode, path)
        t = ctx.mapping(tnode, path, TABLE_KEYS)
        for req in ("num_embeddings", "dim"):
            if req not in t:
                raise ctx.fail(tnode, f"{path}.{req}", "is required but missing")
        sharding = ctx.choice(t["sharding"], f"{path}.sharding", TABLE_SHARDING) if "sharding" in t else None
        pooling = ctx.choice(t["pooling"], f"{path}.pooling", ("sum", "mean")) if "pooling" in t else "sum"
        out.append(TableSpec(name=name, num_embeddings=ctx.integer(t["num_embeddings"], f"{path}.num_embeddings"),
                             dim=ctx.integer(t["dim"], f"{path}.dim"), sharding=sharding, pooling=pooling))
    return tuple(out)


def _table_ref(ctx: _Ctx, node: Node, path: str, table_names: set[str]) -> str:
    name = ctx.string(node, path)
    if name not in table_names:
        raise ctx.fail(node, path, f"table '{name}' does not exist", _suggest(name, sorted(table_names)))
    return name


def _sequences(ctx: _Ctx, node: Node | None, table_names: set[str], claim) -> tuple[SequenceSpec, ...]:
    if node is None:
        return ()
    out = []
    for name, snode in ctx.mapping(node, "sequences").items():
        path = f"sequences.{name}"
        ctx.name(name, snode, path)
        claim(name, snode, path)
        s = ctx.mapping(snode, path, SEQUENCE_KEYS)
        for req in SEQUENCE_KEYS:
            if req not in s:
                raise ctx.fail(snode, f"{path}.{req}", "is required but missing")
        max_length = ctx.integer(s["max_length"], f"{path}.max_length")
        fields = []
        fmap = ctx.mapping(s["fields"], f"{path}.fields")
        if not fmap:
            raise ctx.fail(s["fields"], f"{path}.fields", "a sequence needs at least one field")
        for fname, fnode in fmap.items():
            fpath = f"{path}.fields.{fname}"
            ctx.name(fname, fnode, fpath)
            f = ctx.mapping(fnode, fpath, SEQ_FIELD_KEYS)
            if "type" not in f:
                raise ctx.fail(fnode, f"{fpath}.type", "is required but missing", "allowed: " + ", ".join(SEQ_FIELD_TYPES))
            ftype = ctx.choice(f["type"], f"{fpath}.type", SEQ_FIELD_TYPES)
            table = None
            if ftype == "id":
                if "table" not in f:
                    raise ctx.fail(fnode, f"{fpath}.table", "an id field must name the table it looks up",
                                   "tables: " + ", ".join(sorted(table_names)))
                table = _table_ref(ctx, f["table"], f"{fpath}.table", table_names)
            elif "table" in f:
                raise ctx.fail(f["table"], f"{fpath}.table", f"a {ftype} field has no table")
            hashed = ctx.boolean(f["hash"], f"{fpath}.hash") if "hash" in f else False
            if hashed and ftype != "id":
                raise ctx.fail(f["hash"], f"{fpath}.hash", "only id fields can be hashed")
            fields.append(SeqFieldSpec(name=fname, type=ftype, table=table, hash=hashed))
        if sum(f.type == "timestamp" for f in fields) > 1:
            raise ctx.fail(s["fields"], f"{path}.fields", "a sequence has at most one timestamp field")
        if not any(f.type == "id" for f in fields):
            raise ctx.fail(s["fields"], f"{path}.fields", "a sequence needs at least one id field (its tokens)")
        out.append(SequenceSpec(name=name, max_length=max_length, fields=tuple(fields)))
    return tuple(out)


def _features(ctx: _Ctx, node: Node | None, table_names: set[str], claim) -> tuple[FeatureSpec, ...]:
    if node is None:
        return ()
    out = []
    for name, fnode in ctx.mapping(node, "features").items():
        path = f"features.{name}"
        ctx.name(name, fnode, path)
        claim(name, fnode, path)
        f = ctx.mapping(fnode, path, FEATURE_KEYS)
        if "type" not in f:
            raise ctx.fail(fnode, f"{path}.type", "is required but missing", "allowed: " + ", ".join(FEATURE_TYPES))
        ftype = ctx.choice(f["type"], f"{path}.type", FEATURE_TYPES)
        table, dim = None, 1
        if ftype in ("id", "id_list"):
            if "table" not in f:
                raise ctx.fail(fnode, f"{path}.table", f"an {ftype} feature must name a table",
                               "tables: " + ", ".join(sorted(table_names)))
            table = _table_ref(ctx, f["table"], f"{path}.table", table_names)
        elif "table" in f:
            raise ctx.fail(f["table"], f"{path}.table", f"a {ftype} feature has no table")
        if ftype == "float_vector":
            if "dim" not in f:
                raise ctx.fail(fnode, f"{path}.dim", "a float_vector feature needs its dim")
            dim = ctx.integer(f["dim"], f"{path}.dim")
        elif "dim" in f:
            raise ctx.fail(f["dim"], f"{path}.dim", f"only float_vector features have a dim, not {ftype}")
        hashed = ctx.boolean(f["hash"], f"{path}.hash") if "hash" in f else False
        if hashed and ftype not in ("id", "id_list"):
            raise ctx.fail(f["hash"], f"{path}.hash", "only id and id_list features can be hashed")
        out.append(FeatureSpec(name=name, type=ftype, table=table, dim=dim, hash=hashed))
    return tuple(out)


def _labels(ctx: _Ctx, node: Node, claim) -> tuple[LabelSpec, ...]:
    entries = ctx.mapping(node, "labels")
    if not entries:
        raise ctx.fail(node, "labels", "at least one label (task) is required")
    out = []
    for name, lnode in entries.items():
        path = f"labels.{name}"
        ctx.name(name, lnode, path)
        claim(name, lnode, path)
        spec = {} if lnode.value is None else ctx.mapping(lnode, path, LABEL_KEYS)
        mask = ctx.string(spec["mask"], f"{path}.mask") if "mask" in spec else None
        if mask is not None and (mask not in entries or mask == name):
            raise ctx.fail(spec["mask"], f"{path}.mask", f"'{mask}' is not another label",
                           _suggest(mask, [n for n in entries if n != name]))
        weight = ctx.string(spec["weight"], f"{path}.weight") if "weight" in spec else None
        if weight is not None:
            ctx.name(weight, spec["weight"], f"{path}.weight")
            claim(weight, spec["weight"], f"{path}.weight")
        out.append(LabelSpec(name=name, mask=mask, weight=weight))
    masks = {label.name: label.mask for label in out}
    for label in out:  # masks must not form a cycle (click masked by conversion masked by click)
        chain, cur = [label.name], label.mask
        while cur is not None:
            if cur in chain:
                node = entries[label.name].value["mask"]
                raise ctx.fail(node, f"labels.{label.name}.mask",
                               "label masks form a cycle: " + " -> ".join([*chain, cur]),
                               "at least one label in the chain must be observed on every row (no mask)")
            chain.append(cur)
            cur = masks[cur]
    return tuple(out)


def _metadata(ctx: _Ctx, node: Node | None, claim) -> dict[str, str]:
    if node is None:
        return {}
    out = {}
    for name, mnode in ctx.mapping(node, "metadata").items():
        ctx.name(name, mnode, f"metadata.{name}")
        claim(name, mnode, f"metadata.{name}")
        out[name] = ctx.choice(mnode, f"metadata.{name}", METADATA_TYPES)
    return out
