"""The HTML run report: one self-contained file (plots embedded as PNG) written at the end of a run.

Curves of the training loss, NE and AUC per task (train windows and held-out evaluations),
throughput (examples/s and events/s), and the padding savings of the batches seen: how much of
a padded layout would have been padding, and how much attention work padding would have added.
"""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path
from typing import Any


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
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}th{background:#eee}")
    doc = (f"<!doctype html><html><head><meta charset='utf-8'><title>gemtrain {html.escape(str(summary.get('name')))}"
           f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>\n")
    path = run_dir / "report.html"
    path.write_text(doc)
    return path
