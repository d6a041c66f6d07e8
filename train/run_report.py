"""The HTML run report: one self-contained file (plots embedded as PNG) written at the end of a run.

Curves of the training loss, NE and AUC per task (train windows and held-out evaluations),
throughput (examples/s and events/s), the padding savings of the batches seen: how much of
a padded layout would have been padding, and how much attention work padding would have added, and
(with `logging.local_mfu_every`) the last MFU measurement: local / end-to-end MFU, scaling ratio, per block.

``compare_runs`` puts the held-out metrics of finished runs side by side (each run's ``summary.json``),
the first run as the baseline; ``python -m train.run_report RUN_A RUN_B [--out FILE.html]`` prints that
table as markdown and can write it as HTML.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from features.errors import GemtrainError
from train.provenance import differences


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _series(history: list[dict], kind: str, key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in history:
        v = r.get(key)
        if r.get("kind") == kind and isinstance(v, int | float) and math.isfinite(v):
            xs.append(r["step"])
            ys.append(v)
    return xs, ys


def _plots(history: list[dict], tasks: list[str]) -> list[tuple[str, str]]:
    try:
        import matplotlib
    except ImportError:  # the report keeps its tables
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    specs = [("Training loss", [("train", "loss", "total")] + [("train", f"loss/{t}", t) for t in tasks])]
    for metric in ("ne", "auc"):
        lines = []
        for t in tasks:
            lines.append(("train", f"{metric}/{t}", f"{t} (train window)"))
            lines.append(("eval", f"{metric}/{t}", f"{t} (held-out)"))
        specs.append((metric.upper(), lines))
    specs.append(("Throughput", [("train", "examples_per_s", "examples/s"), ("train", "events_per_s", "events/s")]))
    for title, lines in specs:
        fig, ax = plt.subplots(figsize=(6.4, 3.2))
        drawn = False
        for kind, key, label in lines:
            xs, ys = _series(history, kind, key)
            if xs:
                ax.plot(xs, ys, marker="o" if kind == "eval" else None, label=label)
                drawn = True
        if title == "NE":
            for t in tasks:
                xs, ys = _series(history, "eval", f"oracle_ne/{t}")
                if xs:
                    ax.axhline(ys[-1], linestyle="--", linewidth=1, color="gray")
                    ax.annotate(f"oracle {t}", (xs[-1], ys[-1]), fontsize=7, color="gray")
        if title == "Throughput":
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
        out.append((title, _png(fig)))
        plt.close(fig)
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "n/a" if not math.isfinite(v) else (f"{v:,.4f}" if abs(v) < 100 else f"{v:,.0f}")
    return html.escape(str(v))


def _table(rows: list[list[Any]], head: list[str]) -> str:
    h = "".join(f"<th>{html.escape(x)}</th>" for x in head)
    b = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{b}</table>"


def _mfu_section(rec: dict) -> list[str]:
    """The last `{"kind": "mfu"}` record: the local / end-to-end / scaling-ratio line and the per-block table."""
    def rate(tflops: Any, mfu: Any) -> str:
        s = f"{tflops:.4g} TFLOP/s" if isinstance(tflops, int | float) else "n/a"
        return s + (f" (MFU {100 * mfu:.1f}%)" if isinstance(mfu, int | float) else "")

    ratio = rec.get("scaling_ratio")
    peak = rec.get("peak_tflops")
    parts = ["<h2>MFU</h2>",
             f"<p>At step {_fmt(rec.get('step'))}: local {rate(rec.get('local_tflops_per_s'), rec.get('local_mfu'))}"
             f" / end-to-end {rate(rec.get('e2e_tflops_per_s'), rec.get('e2e_mfu'))} / scaling ratio "
             + (f"{ratio:.2f}" if isinstance(ratio, int | float) else "n/a")
             + (f"; peak {peak:g} TFLOP/s" if peak else "; no peak known for this device (logging.peak_tflops)")
             + ".</p>"]
    rows = [[x["name"], f"{x['flops'] / 1e9:.4g}", f"{x['ms']:.3f}", f"{x['tflops_per_s']:.4g}",
             f"{100 * x['mfu']:.1f}%" if isinstance(x.get("mfu"), int | float) else "n/a"]
            for x in rec.get("layers", [])]
    parts.append(_table(rows, ["block", "GFLOP (fwd + bwd)", "ms alone", "TFLOP/s", "MFU"]))
    parts.append("<p>Local: each dense block timed alone (forward + backward, no recompute, no communication) on "
                 "the inputs it saw in that step; end-to-end: the step's counted FLOPs over the wall time of the "
                 "steps since the previous measurement (data wait included); scaling ratio = end-to-end / local."
                 "</p>")
    return parts


def write_report(run_dir: str | Path, history: list[dict], summary: dict) -> Path:
    run_dir = Path(run_dir)
    eval_ = summary.get("eval") or {}
    tasks = list(eval_) or sorted({k.split("/", 1)[1] for r in history for k in r if k.startswith("ne/")})
    parts = [f"<h1>gemtrain run report: {html.escape(str(summary.get('name')))}</h1>"]
    parts.append(_table([[summary["steps"], summary["skipped_steps"], summary["examples"], summary["examples_per_s"],
                          summary["events_per_s"], summary["wall_seconds"], summary["device"]]],
                        ["steps", "skipped", "examples", "examples/s", "events/s", "wall s", "device"]))
    if eval_:
        parts.append("<h2>Held-out metrics</h2>")
        rows = [[t, r.get("ne"), r.get("oracle_ne", float("nan")), r.get("auc"), r.get("calibration"),
                 r.get("examples")] for t, r in eval_.items()]
        parts.append(_table(rows, ["task", "NE", "oracle NE", "AUC", "calibration", "examples"]))
    parts.append("<h2>Curves</h2>")
    for title, uri in _plots(history, tasks):
        parts.append(f'<figure><img alt="{html.escape(title)}" src="{uri}"/></figure>')
    pad = summary.get("padding") or {}
    if pad:
        parts.append("<h2>Padding savings of the batches seen</h2>")
        rows = []
        for name, s in pad.items():
            rows.append([name, s["real_events"], s["padded_batch_max_events"], s["padding_waste_batch_max"],
                         s["padding_waste_schema_max"], s["attn_saving_batch_max"], s["truncated_events"]])
        parts.append(_table(rows, ["sequence", "real events", "padded events (batch max)",
                                   "padding share (batch max)", "padding share (schema max)",
                                   "attention work padded / jagged", "truncated events"]))
        parts.append("<p>Jagged batches carry only the real events; a padded layout would process the padded "
                     "counts above.</p>")
        if summary.get("padding_report"):
            parts.append('<p>The full padding report of these batches: '
                         '<a href="padding_report.html">padding_report.html</a>.</p>')
    sw = summary.get("software")
    if sw:
        parts.append("<h2>Software</h2>")
        parts.append(_table([[sw.get(k) for k in ("torch", "cuda", "triton", "device_name", "revision")]
                             + [", ".join(f"{k}={v}" for k, v in (sw.get("env") or {}).items()) or "none"]],
                            ["torch", "CUDA", "Triton", "device", "revision", "environment switches"]))
    mfu = summary.get("mfu") or next((r for r in reversed(history) if r.get("kind") == "mfu"), None)
    if mfu:
        parts += _mfu_section(mfu)
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}th{background:#eee}")
    doc = (f"<!doctype html><html><head><meta charset='utf-8'><title>gemtrain {html.escape(str(summary.get('name')))}"
           f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>\n")
    path = run_dir / "report.html"
    path.write_text(doc)
    return path


@dataclass
class Comparison:
    """Held-out metrics of several runs, task by task; the first run is the baseline of the deltas."""

    runs: list[str]
    head: list[str]
    rows: list[list[Any]]

    def markdown(self) -> str:
        def cell(v: Any) -> str:
            return (f"{v:.4f}" if isinstance(v, float) and math.isfinite(v) else
                    "n/a" if isinstance(v, float) else str(v))
        lines = ["| " + " | ".join(self.head) + " |", "|" + "---|" * len(self.head)]
        lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in self.rows]
        return "\n".join(lines)

    def html(self) -> str:
        return _table(self.rows, self.head)


def _summary(run_dir: str | Path) -> dict:
    path = Path(run_dir) / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise GemtrainError(f"cannot read {path}: {e}; give the folder of a finished run "
                            "(it writes summary.json at its end)") from None
    if not summary.get("eval"):
        raise GemtrainError(f"{path} has no held-out metrics (eval); run the evaluation at the end of the run")
    return summary


def _with_rows_error(delta: str, base: dict | None, run: dict | None, task: str) -> str:
    """The NE change with its standard error over the held-out rows, where both runs saved their predictions
    (`eval.save_predictions`) of the same rows: the part of the change that scoring other rows would move."""
    if not delta or base is None or run is None:
        return delta
    from train.predictions import PairingError, paired_ne_difference

    try:
        diff, se = paired_ne_difference(base, run, task)
    except PairingError as e:
        return f"{delta} ({e})"
    return f"{diff:+.3f}% ± {se:.3f}%"


def compare_runs(run_dirs: list[str | Path], names: list[str] | None = None) -> Comparison:
    """Side-by-side held-out NE, recalibrated NE (where the runs report it), AUC and calibration per task; the
    change of either NE vs the first run in %, and for NE its standard error over the held-out rows where both
    runs saved their predictions."""
    if len(run_dirs) < 2:
        raise GemtrainError(f"compare needs at least two run folders, got {len(run_dirs)}")
    names = names or [Path(d).name for d in run_dirs]
    from train.metrics import NE_KINDS
    from train.predictions import last_predictions, read_predictions

    summaries = [_summary(d) for d in run_dirs]
    tasks = [t for t in summaries[0]["eval"] if all(t in s["eval"] for s in summaries)]
    if not tasks:
        raise GemtrainError(f"the runs {', '.join(names)} share no evaluated task")
    head = ["task", "metric"] + names + [f"NE vs {names[0]}: {n}" for n in names[1:]]
    files = [last_predictions(d) for d in run_dirs]
    preds = [read_predictions(f) if f and files[0] else None for f in files]  # read once, for every task
    rows: list[list[Any]] = []
    for t in tasks:
        evals = [s["eval"][t] for s in summaries]
        for metric in (*NE_KINDS, "oracle_ne", "auc", "calibration"):
            vals = [float(e.get(metric, float("nan"))) for e in evals]
            if all(math.isnan(v) for v in vals):
                continue
            base = vals[0]
            deltas = [f"{100 * (v / base - 1):+.3f}%" if metric in NE_KINDS and base else ""
                      for v in vals[1:]]
            if metric == "ne":
                deltas = [_with_rows_error(d, preds[0], p, t) for d, p in zip(deltas, preds[1:])]
            rows.append([t, metric.replace("_", " ")] + vals + deltas)
    steps = [s.get("steps") for s in summaries]
    rows.append(["(run)", "steps"] + steps + ["" for _ in steps[1:]])
    # Runs of one config on other software (versions, device, revision, kernel switches) can differ for that alone.
    sw = [s.get("software") for s in summaries]
    rows.append(["(run)", f"software differs from {names[0]} in"] + ["" if i == 0 else differences(sw[0], x)
                                                                  for i, x in enumerate(sw)] + ["" for _ in sw[1:]])
    return Comparison(runs=[str(d) for d in run_dirs], head=head, rows=rows)


def write_comparison(run_dirs: list[str | Path], path: str | Path, names: list[str] | None = None) -> Path:
    """The comparison as one self-contained HTML page."""
    comp = compare_runs(run_dirs, names)
    title = "gemtrain run comparison: " + " vs ".join(html.escape(Path(d).name) for d in run_dirs)
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}th{background:#eee}")
    body = (f"<h1>{title}</h1><p>Held-out metrics of each run's final evaluation; the NE change is relative "
            f"to {html.escape(comp.runs[0])}.</p>{comp.html()}")
    path = Path(path)
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
                    f"<style>{style}</style></head><body>{body}</body></html>\n")
    return path


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m train.run_report",
                                description="held-out metrics of finished runs side by side (first = baseline)")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", metavar="FILE.html", default=None, help="also write the table as an HTML page")
    args = p.parse_args(argv)
    try:
        print(compare_runs(args.runs).markdown())
        if args.out:
            print(f"wrote {write_comparison(args.runs, args.out)}")
    except GemtrainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
