"""The `gemtrain` command line.

Commands live in `train/commands/*.py`; each module defines `COMMANDS`, a list of `Command`s
(group, name, help, add_arguments, run). Heavy imports happen inside `run`, so `--help` is fast.
Exit codes: 0 ok, 1 bad input (a `GemtrainError`, printed without a traceback), 2 usage.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

# One line per command module; each module owns its commands.
COMMAND_MODULES = [
    "train.commands.schema_cmd",
    "train.commands.data_cmd",
    "train.commands.model_cmd",
    "train.commands.train_cmd",
    "train.commands.launch_cmd",
    "train.commands.report_cmd",
    "train.commands.events_cmd",
    "train.commands.inspect_cmd",
    "train.commands.runs_cmd",
]


@dataclass(frozen=True)
class Command:
    group: str | None  # e.g. "data" for `gemtrain data synth`; None for a top-level command
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]
    # Top-level commands that accept `--section.key=value` overrides set this.
    allow_unknown: bool = False


def _commands() -> list[Command]:
    out: list[Command] = []
    for mod in COMMAND_MODULES:
        out.extend(importlib.import_module(mod).COMMANDS)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gemtrain", description="Train GEM-style ads ranking models "
                                     "on jagged user histories streamed from Parquet.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for cmd in _commands():
        if cmd.group is None:
            p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        else:
            if cmd.group not in groups:
                gp = sub.add_parser(cmd.group, help=f"{cmd.group} commands")
                groups[cmd.group] = gp.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
                gp.set_defaults(_group_parser=gp)
            p = groups[cmd.group].add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run, _allow_unknown=cmd.allow_unknown)
    return parser


def main(argv: list[str] | None = None) -> int:
    from features.errors import GemtrainError

    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if not hasattr(args, "_run"):
        (getattr(args, "_group_parser", None) or parser).print_help(sys.stderr)
        return 2
    if unknown and not args._allow_unknown:
        parser.error("unrecognized arguments: " + " ".join(unknown))
    args.overrides = unknown
    try:
        return int(args._run(args) or 0)
    except GemtrainError as e:
        print(f"gemtrain: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gemtrain: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
