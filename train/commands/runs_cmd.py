"""`gemtrain runs show DIR`: a run's ledger (per epoch: rows read, quarantined with reasons, truncated,
steps skipped by the NaN guard; restarts)."""

from __future__ import annotations

import argparse
import json

from train.cli import Command


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="DIR", help="a run directory (holds ledger.json)")
    p.add_argument("--json", action="store_true", help="print the ledger as JSON (without its snapshots)")


def _run(args: argparse.Namespace) -> int:
    from features.errors import GemtrainError
    from train.ledger import LEDGER_FILE, format_ledger, ranks_of, read_ledger

    ranks = ranks_of(args.run_dir)
    if not ranks:
        raise GemtrainError(f"{args.run_dir}: no {LEDGER_FILE} here (give the run dir of a `gemtrain train` run)")
    ledgers = [read_ledger(args.run_dir, r) for r in ranks]  # one per rank of a distributed run
    if args.json:
        out = [{k: v for k, v in d.items() if k != "snapshots"} for d in ledgers if d is not None]
        print(json.dumps(out[0] if ranks == [None] else out, indent=1))
    else:
        print("\n".join(format_ledger(d) for d in ledgers if d is not None))
    return 0


COMMANDS = [Command("runs", "show", "show a run's ledger: rows read, quarantined, truncated and skipped per "
                    "epoch, and restarts", _add, _run)]
