"""YAML loading that keeps line numbers and refuses duplicate keys.

Plain YAML loaders silently keep the last of two equal keys in one mapping; a schema with a key
given twice is almost always a mistake, so it is an error here. Every node remembers its line so
that schema errors can point at it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from features.errors import SchemaError


@dataclass
class Node:
    """A YAML value with the 1-based line it starts on."""

    value: Any  # dict[str, Node] | list[Node] | scalar
    line: int

    def plain(self) -> Any:
        """The value with all line information stripped."""
        if isinstance(self.value, dict):
            return {k: v.plain() for k, v in self.value.items()}
        if isinstance(self.value, list):
            return [v.plain() for v in self.value]
        return self.value


class _LineLoader(yaml.SafeLoader):
    pass


def _construct(loader: _LineLoader, node: yaml.Node, source: str, path: str = "") -> Node:
    line = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Node] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node)
            key_line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise SchemaError(f"mapping keys must be strings, got {_kind(key)} {key!r}", file=source,
                                  line=key_line, field=f"{path}.{key}" if path else str(key),
                                  hint="quote the key or use a name")
            child_path = f"{path}.{key}" if path else key
            if key in out:
                raise SchemaError(
                    f"key '{key}' is given twice in one mapping (first on line {out[key].line})",
                    file=source, line=key_line, field=child_path,
                    hint="YAML would silently keep the last one; remove one of them")
            child = _construct(loader, value_node, source, child_path)
            child.line = key_line  # point errors at the key the user wrote
            out[key] = child
        return Node(out, line)
    if isinstance(node, yaml.SequenceNode):
        return Node([_construct(loader, child, source, f"{path}[{i}]") for i, child in enumerate(node.value)],
                    line)
    return Node(loader.construct_object(node), line)


def _kind(v: Any) -> str:
    return type(v).__name__


def load_yaml_with_lines(text: str, source: str) -> Node:
    loader = _LineLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise SchemaError("the file is empty (no YAML document)", file=source, line=1, field="(document)",
                              hint="a schema needs at least 'tables', 'labels' and sequences or features")
        return _construct(loader, root, source)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e)
        raise SchemaError(f"not valid YAML: {problem}", file=source, line=line, field="(document)") from None
    finally:
        loader.dispose()
