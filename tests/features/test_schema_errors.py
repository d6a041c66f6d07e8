"""Bad schemas: every error names the file, the line and the field, and says what is allowed."""

from __future__ import annotations

import textwrap

import pytest

from features import SchemaError, load_schema

GOOD = """\
name: t
tables:
  item: {num_embeddings: 100, dim: 8}
  cat: {num_embeddings: 10, dim: 8}
  user: {num_embeddings: 50, dim: 4}
sequences:
  history:
    max_length: 16
    fields:
      item_id: {type: id, table: item}
      ts: {type: timestamp}
features:
  user_id: {type: id, table: user, hash: true}
  age: {type: float}
labels:
  click: {}
  conversion: {mask: click}
"""


def _edit(line_no: int, new: str) -> str:
    """GOOD with line `line_no` (1-based) replaced by `new` (which may span several lines)."""
    lines = GOOD.splitlines()
    lines[line_no - 1] = new
    return "\n".join(lines) + "\n"


# (id, yaml text, expected line, expected field, fragments the message must contain)
CASES = [
    ("unknown key, close match", _edit(2, "tabels:"), 2, "tabels", ["unknown key", "did you mean 'tables'"]),
    ("unknown nested key", _edit(3, "  item: {num_embedings: 100, dim: 8}"), 3, "tables.item.num_embedings",
     ["unknown key", "did you mean 'num_embeddings'"]),
    ("wrong type: string for an integer", _edit(4, "  cat: {num_embeddings: ten, dim: 8}"), 4,
     "tables.cat.num_embeddings", ["expected an integer", "'ten'"]),
    ("wrong type: boolean for an integer", _edit(8, "    max_length: true"), 8, "sequences.history.max_length",
     ["expected an integer"]),
    ("table that does not exist", _edit(10, "      item_id: {type: id, table: itme}"), 10,
     "sequences.history.fields.item_id.table", ["table 'itme' does not exist", "did you mean 'item'"]),
    ("negative size", _edit(5, "  user: {num_embeddings: -5, dim: 4}"), 5, "tables.user.num_embeddings",
     ["must be >= 1", "-5"]),
    ("zero max_length", _edit(8, "    max_length: 0"), 8, "sequences.history.max_length", ["must be >= 1"]),
    ("duplicate names across sections", _edit(14, "  history: {type: float}"), 14, "features.history",
     ["name 'history' is already used by sequences.history"]),
    ("key given twice in one mapping", _edit(14, "  age: {type: float}\n  age: {type: float}"), 15,
     "features.age", ["given twice", "first on line 14"]),
    ("sequence id field names no table", _edit(10, "      item_id: {type: id}"), 10,
     "sequences.history.fields.item_id.table", ["must name the table", "tables: cat, item, user"]),
    ("empty file", "", 1, "(document)", ["empty"]),
    ("comments only", "# nothing here\n", 1, "(document)", ["empty"]),
    ("not valid YAML", _edit(13, "  user_id: {type: id, table: user"), 14, "(document)", ["not valid YAML"]),
    ("document is a list", "- a\n- b\n", 1, "(document)", ["expected a mapping, got a list"]),
    ("bad enum value with suggestion", _edit(14, "  age: {type: flaot}"), 14, "features.age.type",
     ["'flaot' is not allowed", "did you mean 'float'"]),
    ("missing required section", _edit(15, "labelz:"), 15, "labelz", ["unknown key", "did you mean 'labels'"]),
    ("required section missing", GOOD.split("labels:")[0], 1, "labels", ["is required but missing"]),
    ("mask names no label", _edit(17, "  conversion: {mask: clik}"), 17, "labels.conversion.mask",
     ["'clik' is not another label", "did you mean 'click'"]),
    ("mask cycle", _edit(16, "  click: {mask: conversion}"), 16, "labels.click.mask", ["cycle"]),
    ("two timestamps", _edit(11, "      ts: {type: timestamp}\n      ts2: {type: timestamp}"), 9,
     "sequences.history.fields", ["at most one timestamp"]),
    ("hash on a float", _edit(14, "  age: {type: float, hash: true}"), 14, "features.age.hash",
     ["only id and id_list features can be hashed"]),
    ("float_vector without dim", _edit(14, "  age: {type: float_vector}"), 14, "features.age.dim",
     ["needs its dim"]),
    ("id_list on a sequence table", _edit(14, "  items: {type: id_list, table: item}"), 14,
     "features.items.table", ["used by a sequence"]),
    ("invalid name (a dot)", _edit(14, "  user.age: {type: float}"), 14, "features.user.age",
     ["not a valid name"]),
    ("wrong sharding value", _edit(3, "  item: {num_embeddings: 100, dim: 8, sharding: rows}"), 3,
     "tables.item.sharding", ["'rows' is not allowed", "row_wise"]),
    ("non-string key", _edit(14, "  1: {type: float}"), 14, "features.1", ["keys must be strings"]),
    ("weight column collides", _edit(16, "  click: {weight: age}"), 16, "labels.click.weight",
     ["name 'age' is already used by features.age"]),
    ("a float field with a table", _edit(11, "      ts: {type: timestamp, table: item}"), 11,
     "sequences.history.fields.ts.table", ["has no table"]),
    ("ids sharing a table hashed differently", _edit(14, "  item: {type: id, table: item, hash: true}"), 14,
     "features.item.hash", ["but sequences.history.fields.item_id (same table 'item') has hash: false"]),
    ("wrong metadata type", GOOD + "metadata:\n  row_id: int128\n", 19, "metadata.row_id",
     ["'int128' is not allowed", "allowed: int64"]),
]


@pytest.mark.parametrize("text,line,field,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_schema_names_file_line_field(tmp_path, text, line, field, fragments):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SchemaError) as info:
        load_schema(path)
    err = info.value
    msg = str(err)
    assert err.file == str(path) and msg.startswith(f"{path}:{line}: {field}: "), msg
    assert (err.line, err.field) == (line, field), msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"


def test_at_least_twelve_distinct_cases():
    assert len({c[0] for c in CASES}) >= 12


def test_good_base_schema_loads(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    s = load_schema(path)
    assert s.name == "t" and s.label_names == ("click", "conversion")
    assert s.sparse_keys == ("history.item_id", "user_id")


def test_missing_file_and_binary_file(tmp_path):
    with pytest.raises(SchemaError, match="cannot read schema file"):
        load_schema(tmp_path / "nope.yaml")
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SchemaError, match="not a text"):
        load_schema(p)


def test_error_is_a_gemtrain_error_and_value_error():
    from features import GemtrainError, parse_schema

    with pytest.raises(GemtrainError) as info:
        parse_schema(textwrap.dedent("tables: {}\nlabels: {click: {}}\n"), source="x.yaml")
    assert isinstance(info.value, ValueError)
    assert "x.yaml:1: tables: at least one embedding table" in str(info.value)
