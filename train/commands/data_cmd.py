"""`gemtrain data synth` and `gemtrain data validate`.

Both take any fsspec URL (file://, s3://, gs://, memory://, a plain path). Object-store settings
come from `--storage-option key=value` (repeatable; a dotted key nests, e.g.
`client_kwargs.region_name=us-east-1`) or from the usual environment variables (AWS_*, ...).
"""

from __future__ import annotations

import argparse
import os
import time

from train.cli import Command


def parse_storage_options(items: list[str] | None) -> dict:
    """`["endpoint_url=http://h:9000", "anon=false", "client_kwargs.region_name=x"]` -> fsspec kwargs.

    Values `true`/`false` become booleans and integers become ints; everything else stays a string.
    """
    from features.errors import GemtrainError

    out: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise GemtrainError(f"--storage-option '{item}': expected key=value")
        v: object = value
        if value.lower() in ("true", "false"):
            v = value.lower() == "true"
        elif value.lstrip("-").isdigit():
            v = int(value)
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise GemtrainError(f"--storage-option '{item}': '{p}' is already set to a value")
        node[leaf] = v
    return out


def add_storage_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="fsspec storage option (repeatable), e.g. endpoint_url=http://localhost:9000, "
                        "key=..., secret=...; the usual environment variables work too")


# ---- synth ----------------------------------------------------------------------------------------


def _add_synth(p: argparse.ArgumentParser) -> None:
    p.add_argument("--schema", required=True, help="feature schema (YAML; a path or any fsspec URL)")
    p.add_argument("--out", required=True, help="output folder URL (any fsspec URL or a path)")
    p.add_argument("--rows", required=True, type=int, help="number of rows")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--files", type=int, default=4, help="number of Parquet files (default 4)")
    p.add_argument("--row-group-rows", type=int, default=None,
                   help="rows per row group (default: a quarter of a file, capped at ~128 MB)")
    p.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1),
                   help="files written at once, one thread each (default: the cores, up to 8)")
    p.add_argument("--report-rows", type=int, default=100_000,
                   help="rows used for the oracle / no-history NE summary (0 to skip; default 100000)")
    add_storage_option(p)


def _run_synth(args: argparse.Namespace) -> int:
    from features import load_schema
    from ingest.synth import signal_report, write_synthetic

    options = parse_storage_options(args.storage_option)
    schema = load_schema(args.schema, options)
    t0 = time.perf_counter()
    paths = write_synthetic(schema, args.out, args.rows, seed=args.seed, files=args.files,
                            row_group_rows=args.row_group_rows, storage_options=options,
                            threads=args.threads)
    dt = time.perf_counter() - t0
    print(f"wrote {args.rows} rows of schema '{schema.name}' (seed {args.seed}) to {len(paths)} files "
          f"in {dt:.1f} s ({args.rows / max(dt, 1e-9):,.0f} rows/s, {args.threads} threads):")
    for p in paths:
        print(f"  {p}")
    if args.report_rows > 0:
        rep = signal_report(schema, min(args.rows, args.report_rows) or 1, seed=args.seed)
        print(f"planted signal (first {rep.rows} rows):")
        for line in rep.lines():
            print(f"  {line}")
    return 0


# ---- validate -------------------------------------------------------------------------------------


def _add_validate(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="a Parquet file or a folder of them (any fsspec URL or a path)")
    p.add_argument("--schema", required=True, help="feature schema (YAML; a path or any fsspec URL)")
    p.add_argument("--threads", type=int, default=16, help="files checked in parallel (default 16)")
    p.add_argument("--deep", action="store_true",
                   help="also read all the data: page checksums, nulls, ids outside their tables, labels "
                        "other than 0/1, duplicate row ids (slower: reads every byte)")
    add_storage_option(p)


def _run_validate(args: argparse.Namespace) -> int:
    from features import load_schema
    from features.dataset_check import PAD_BATCH, check_dataset

    options = parse_storage_options(args.storage_option)
    schema = load_schema(args.schema, options)
    t0 = time.perf_counter()
    res = check_dataset(args.url, schema, storage_options=options, threads=args.threads, deep=args.deep)
    dt = time.perf_counter() - t0
    bad = [f for f in res.files if not f.ok]
    for f in res.files:
        if f.ok:
            print(f"ok    {f.url}: {f.rows} rows, {f.row_groups} row groups")
        else:
            print(f"FAIL  {f.url}:")
            for problem in f.problems:
                print(f"        {problem}")
    print(f"{len(res.files)} files, {res.rows} rows, {res.row_groups} row groups "
          f"({sum(f.bytes for f in res.files) / 1e6:.1f} MB uncompressed), checked in {dt:.2f} s")
    for name, s in res.lengths.items():
        max_length = schema.sequence(name).max_length
        print(f"{name} lengths: mean {s.mean:.1f}, min {s.min}, p50 {s.p50:.0f}, p90 {s.p90:.0f}, "
              f"p99 {s.p99:.0f}, max {s.max}; {s.empty} empty; {s.over_max_length} over max_length "
              f"{max_length}; padding to the batch max (batch {PAD_BATCH}) would waste {s.padding_waste:.1%}")
    if bad:
        print(f"{len(bad)} of {len(res.files)} files do not match schema '{schema.name}'")
        return 1
    print(f"all files match schema '{schema.name}'" + (" (values checked too)" if args.deep else ""))
    return 0


COMMANDS = [
    Command("data", "synth", "write a synthetic Parquet dataset for a schema (with a planted signal)",
            _add_synth, _run_synth),
    Command("data", "validate", "check every Parquet file of a dataset against a schema",
            _add_validate, _run_validate),
]
