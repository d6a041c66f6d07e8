"""`gemtrain data from-events EVENTS --schema S --out URL`: an event log -> training Parquet."""

from __future__ import annotations

import argparse
import sys

from train.cli import Command
from train.commands.report_cmd import add_output_flags, positive_int


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got '{text}'") from None
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1 (exclusive), got {v}")
    return v


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("events", metavar="EVENTS", help="event table: Parquet or CSV file, folder or glob, any fsspec "
                   "URL (columns: see docs/from-events.md)")
    p.add_argument("--schema", required=True, help="the feature schema (YAML) of the training data to write")
    p.add_argument("--out", required=True, metavar="URL", help="output folder (any fsspec URL); rows go to "
                   "URL/train/ and, with a split, URL/validation/")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--split-time", metavar="T", default=None,
                   help="impressions at or after T (epoch seconds or ISO date/time, UTC) go to validation/")
    g.add_argument("--validation-fraction", metavar="F", type=_fraction, default=None,
                   help="put the latest fraction F of impressions (by time) into validation/")
    p.add_argument("--user-column", default="user_id", help="the event table's user column (default user_id)")
    p.add_argument("--time-column", default="ts", help="the event time column: int64 seconds or a timestamp "
                   "(default ts)")
    p.add_argument("--format", choices=("parquet", "csv"), default=None,
                   help="input format (default: csv when every file ends in .csv, else parquet)")
    p.add_argument("--rows-per-file", type=positive_int, default=1_000_000, help="rows per output file")
    p.add_argument("--memory-limit", default="2GB", help="DuckDB memory limit; beyond it work spills to a "
                   "temporary folder (default 2GB)")
    add_output_flags(p)


def _run(args: argparse.Namespace) -> int:
    from features import load_schema
    from ingest.events import events_to_parquet, parse_split_time

    schema = load_schema(args.schema)
    split = parse_split_time(args.split_time) if args.split_time is not None else None
    res = events_to_parquet(schema, args.events, args.out, split_time=split,
                            validation_fraction=args.validation_fraction, user_column=args.user_column,
                            time_column=args.time_column, fmt=args.format, rows_per_file=args.rows_per_file,
                            memory_limit=args.memory_limit)
    if args.json:
        import dataclasses
        import json

        json.dump(dataclasses.asdict(res), sys.stdout, indent=2)
        print()
    elif not args.quiet:
        total = sum(res.rows.values())
        print(f"{args.events}: {res.input_rows:,} input rows, {res.events:,} history events, "
              f"{res.impressions:,} labelled impressions -> {total:,} rows in {res.seconds:.1f}s")
        if res.ignored_rows:
            print(f"  ignored {res.ignored_rows:,} rows without a user or a time")
        if res.split_time is not None:
            print(f"  split at t={res.split_time}: impressions at or after it are validation")
        for split_name, files in res.outputs.items():
            print(f"  {split_name}: {res.rows[split_name]:,} rows in {len(files)} files under "
                  f"{files[0].rsplit('/', 1)[0]}")
    return 0


COMMANDS = [Command("data", "from-events", "turn an event log into training Parquet: each labelled impression "
                    "with the user's events strictly before it", _add, _run)]
