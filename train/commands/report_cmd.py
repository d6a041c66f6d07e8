"""`gemtrain report padding DATA --schema S`: what padding the histories would cost, as a table and HTML;
`gemtrain report compare RUN_A RUN_B ...`: the held-out metrics of finished runs side by side."""

from __future__ import annotations

import argparse
import sys

from train.cli import Command

DEFAULT_BATCH_SIZE = 256  # the loader's default (LoaderConfig.batch_size)


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def add_output_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quiet", action="store_true", help="print nothing but errors")
    g.add_argument("--json", action="store_true", help="print the result as JSON on stdout (for scripts)")


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", metavar="DATA", help="Parquet file, folder or glob (any fsspec URL: s3://, gs://, ...)")
    p.add_argument("--schema", required=True, help="the feature schema (YAML) the data follows")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--batch-size", type=positive_int, default=None,
                   help=f"rows per batch for the pad-to-batch-max strategy (default {DEFAULT_BATCH_SIZE})")
    g.add_argument("--token-budget", type=positive_int, default=None,
                   help="form batches by real events instead: a batch closes before the row that would "
                        "take it past this many events")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="write padding_report.html and padding_report.json into this folder")
    p.add_argument("--token-dim", type=positive_int, default=None,
                   help="width of one history token for memory and FLOPs, e.g. the model's d_model "
                        "(default: the summed dims of the tables the sequence's id fields look up, the width "
                        "of an event's embeddings before any projection)")
    p.add_argument("--bytes-per-value", type=positive_int, default=4,
                   help="bytes per activation value for memory (default 4: float32; 2 for bf16)")
    add_output_flags(p)


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from features import load_schema
    from ingest.padding_scan import scan_lengths
    from train.padding_report import format_table, report_from_lengths
    from train.report_html import render_html

    schema = load_schema(args.schema)
    scan = scan_lengths(schema, args.data)
    batch_size = args.batch_size or (None if args.token_budget else DEFAULT_BATCH_SIZE)
    report = report_from_lengths(schema, scan.lengths, batch_size=batch_size, token_budget=args.token_budget,
                                 token_dim=args.token_dim, bytes_per_value=args.bytes_per_value, source=args.data)
    report.scan = {"files": scan.files, "row_groups": scan.row_groups, "rows": scan.rows,
                   "seconds": round(scan.seconds, 4), "compressed_bytes_read": scan.compressed_bytes_read,
                   "leaf_columns": ", ".join(scan.leaf.values())}
    written = []
    if args.out:
        out = Path(args.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / "padding_report.html").write_text(render_html(report))
            (out / "padding_report.json").write_text(report.to_json())
        except OSError as e:
            from features.errors import GemtrainError

            raise GemtrainError(f"cannot write the report into {out}: {e.strerror}") from None
        written = [str(out / "padding_report.html"), str(out / "padding_report.json")]
    if args.json:
        import json

        d = report.to_dict()
        d["written"] = written
        json.dump(d, sys.stdout, indent=2)
        print()
    elif not args.quiet:
        print(format_table(report))
        for w in written:
            print(f"wrote {w}")
    return 0


def _add_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="folders of finished runs; the first is the baseline")
    p.add_argument("--out", metavar="FILE.html", default=None, help="also write the table as an HTML page")


def _run_compare(args: argparse.Namespace) -> int:
    from train.run_report import compare_runs, write_comparison

    print(compare_runs(args.runs).markdown())
    if args.out:
        print(f"wrote {write_comparison(args.runs, args.out)}")
    return 0


COMMANDS = [Command("report", "padding", "padding-savings report of a dataset's history lengths "
                    "(terminal table and self-contained HTML)", _add, _run),
            Command("report", "compare", "held-out NE, AUC and calibration of finished runs side by side, "
                    "and what each run's software differs from the first's in (the first run is the baseline); "
                    "runs trained with eval.save_predictions=true get the NE change's standard error over the "
                    "held-out rows", _add_compare, _run_compare)]
