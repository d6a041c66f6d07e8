"""`gemtrain schema check FILE`."""

from __future__ import annotations

import argparse

from train.cli import Command


def _add(p: argparse.ArgumentParser) -> None:
    from train.commands.data_cmd import add_storage_option

    p.add_argument("file", help="a feature schema (YAML): a path or any fsspec URL")
    add_storage_option(p)


def _run(args: argparse.Namespace) -> int:
    from features import load_schema
    from train.commands.data_cmd import parse_storage_options

    s = load_schema(args.file, parse_storage_options(args.storage_option))
    n_ids = len(s.sparse_keys)
    print(f"{args.file}: ok: schema '{s.name}': {len(s.tables)} tables, {len(s.sequences)} sequences, "
          f"{len(s.features)} features ({n_ids} id keys, dense width {s.dense_dim}), labels: "
          + ", ".join(s.label_names))
    return 0


COMMANDS = [Command("schema", "check", "check a feature schema file and summarise it", _add, _run)]
