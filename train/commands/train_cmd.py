"""`gemtrain train`, `gemtrain eval`, `gemtrain demo`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from train.cli import Command

DEFAULT_CONFIG = "configs/demo.yaml"


def _add_train(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a run config (YAML), e.g. configs/demo.yaml")
    p.add_argument("--run-dir", default=None, help="where checkpoints, metrics and reports go "
                   "(default: runs/<config name>)")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint in the run dir")
    p.epilog = "Any config key can be overridden: --section.key=value (e.g. --train.steps=200)."


def _load(args: argparse.Namespace):
    from train.config import load_run_config

    return load_run_config(args.config, args.overrides)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{x:.4f}"


def _print_summary(summary: dict, out=sys.stdout) -> None:
    print(f"run '{summary['name']}': {summary['steps']} steps ({summary['skipped_steps']} skipped), "
          f"{summary['examples_per_s']:,.0f} examples/s, {summary['events_per_s']:,.0f} events/s, "
          f"wall {summary['wall_seconds']:.1f} s on {summary['device']}", file=out)
    for task, r in (summary.get("eval") or {}).items():
        line = (f"  held-out {task}: NE {_fmt(r.get('ne'))}  AUC {_fmt(r.get('auc'))}  "
                f"calibration {_fmt(r.get('calibration'))}")
        if "oracle_ne" in r:
            gap = (r["ne"] / r["oracle_ne"] - 1) * 100 if r["oracle_ne"] else float("nan")
            line += f"  oracle NE {_fmt(r['oracle_ne'])} (+{gap:.2f}%)"
        print(line, file=out)
    print(f"  run dir: {summary['run_dir']}" + (f"  report: {summary['report']}" if summary.get("report") else ""),
          file=out)


def _run_train(args: argparse.Namespace) -> int:
    from train.trainer import Trainer

    cfg = _load(args)
    summary = Trainer(cfg, args.run_dir, resume=args.resume).fit()
    _print_summary(summary)
    return 0


def _add_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="the run config the checkpoint was trained with")
    p.add_argument("--checkpoint", required=True, help="a checkpoint folder (step_*), or a run dir / its "
                   "checkpoints folder (the newest complete checkpoint is used)")
    p.add_argument("--url", default=None, help="held-out data URL (default: data.eval_url of the config); with "
                   "eval.save_predictions=true other data's rows go to predictions-step{N}-{data}.parquet")


def _run_eval(args: argparse.Namespace) -> int:
    from train.checkpoint import resolve_checkpoint
    from train.trainer import Trainer

    cfg = _load(args)
    path = resolve_checkpoint(args.checkpoint)
    tr = Trainer(cfg, path.parent.parent, quiet=True)
    state = tr.load_checkpoint(path, model_only=True)
    tr.step = state["step"]  # names the predictions file (eval.save_predictions) after the checkpoint's step
    res = tr.evaluate(args.url)
    res["checkpoint"] = str(path)
    res["step"] = state["step"]
    print(json.dumps(res, indent=1, allow_nan=True))
    return 0


def _add_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", default=DEFAULT_CONFIG, help=f"run config (default {DEFAULT_CONFIG})")
    p.add_argument("--run-dir", default=None, help="default: runs/<config name>")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the second run without the history (model.use_history=false)")


def _run_demo(args: argparse.Namespace) -> int:
    """Generates data if missing, trains, evaluates; then the same model without the history."""
    from train.config import load_run_config
    from train.trainer import Trainer

    if not Path(args.config).exists():
        from features.errors import GemtrainError

        raise GemtrainError(f"{args.config}: no such run config (run from the project root, or give a path)")
    cfg = load_run_config(args.config, args.overrides)
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / cfg.name
    summary = Trainer(cfg, run_dir).fit()
    _print_summary(summary)
    if args.no_baseline:
        return 0
    base_cfg = load_run_config(args.config, list(args.overrides) + ["--model.use_history=false"])
    base_cfg.name = cfg.name + "-no-history"
    base_dir = run_dir.parent / (run_dir.name + "-no-history")
    base = Trainer(base_cfg, base_dir).fit()
    _print_summary(base)
    t0 = next(iter(summary.get("eval") or {}), None)
    if t0:
        h, b = summary["eval"][t0], base["eval"][t0]
        print(f"\nheld-out {t0} NE: with history {_fmt(h['ne'])}, without history {_fmt(b['ne'])}, "
              f"oracle {_fmt(h.get('oracle_ne'))}")
        comparison = {"task": t0, "ne_with_history": h["ne"], "ne_without_history": b["ne"],
                      "oracle_ne": h.get("oracle_ne"), "history_run": str(run_dir), "baseline_run": str(base_dir)}
        (run_dir / "comparison.json").write_text(json.dumps(comparison, indent=1) + "\n")
    print(f"report: {summary.get('report')}")
    return 0


COMMANDS = [
    Command(None, "train", "train a model from a run config", _add_train, _run_train, allow_unknown=True),
    Command(None, "eval", "evaluate a checkpoint on held-out data", _add_eval, _run_eval, allow_unknown=True),
    Command(None, "demo", "generate demo data if missing, train, evaluate and compare with the no-history model",
            _add_demo, _run_demo, allow_unknown=True),
]
