"""`gemtrain data inspect DATA --schema S`: schema check, counts, per-feature statistics, rejected rows."""

from __future__ import annotations

import argparse
import sys

from train.cli import Command
from train.commands.report_cmd import add_output_flags, positive_int


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", metavar="DATA", help="Parquet file, folder or glob (any fsspec URL)")
    p.add_argument("--schema", required=True, help="the feature schema (YAML) the data should follow")
    p.add_argument("--max-row-groups", type=positive_int, default=None,
                   help="inspect at most this many row groups (default: all)")
    add_output_flags(p)


def _run(args: argparse.Namespace) -> int:
    from features import load_schema
    from ingest.inspect_data import format_report, inspect_dataset

    schema = load_schema(args.schema)
    rep = inspect_dataset(schema, args.data, max_row_groups=args.max_row_groups)
    if args.json:
        import json

        json.dump(rep.to_dict(), sys.stdout, indent=2)
        print()
    elif not args.quiet:
        print(format_report(rep))
    if rep.failed:
        n = sum(1 for p in rep.problems if p.severity in ("quarantine", "error"))
        print(f"gemtrain: error: {args.data}: {n} problem(s) would make the loader skip rows or stop the run "
              "(listed above)", file=sys.stderr)
        return 1
    return 0


COMMANDS = [Command("data", "inspect", "inspect a dataset against a schema: counts, per-feature statistics, and "
                    "the rows the loader would quarantine or stop on", _add, _run)]
