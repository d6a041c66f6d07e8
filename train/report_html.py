"""`PaddingReport` -> one self-contained HTML page (inline CSS, plots as base64 SVG images, no network).

Plots are small hand-written SVGs (no plotting library needed, exact and fast); each is embedded as
`<img src="data:image/svg+xml;base64,...">` so the page is one file that opens anywhere.
"""

from __future__ import annotations

import base64
import html
import math

from train.padding_report import (
    BATCH_MAX,
    TABLE_HEADER,
    PaddingReport,
    SequenceReport,
    human,
    table_rows,
)

__all__ = ["render_html", "svg_data_uri", "histogram_svg", "strategy_bars_svg"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:980px;color:#1d2330;
background:#fafbfc;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.25rem;margin-top:2.2rem;border-bottom:1px solid #dde1e7}
.meta{color:#5a6473;font-size:.9rem}.cards{display:flex;gap:1rem;flex-wrap:wrap;margin:1rem 0}
.card{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:.8rem 1rem;flex:1 1 0;min-width:160px}
.card .v{font-size:1.6rem;font-weight:650}.card .k{color:#5a6473;font-size:.85rem}
table{border-collapse:collapse;background:#fff;margin:.6rem 0;font-size:.92rem}
th,td{border:1px solid #dde1e7;padding:.35rem .7rem;text-align:right}th{background:#f0f2f5}
td:first-child,th:first-child{text-align:left}tr.jagged td{font-weight:600;background:#eef7ee}
.plots{display:flex;gap:1rem;flex-wrap:wrap}.plots img{background:#fff;border:1px solid #dde1e7;border-radius:6px}
ul.notes{color:#5a6473;font-size:.85rem}
"""

_COLORS = {"real": "#2f7d4f", "pad": "#d9534f", "bar": "#3a6fb0", "axis": "#5a6473", "line": "#e08a00"}


def svg_data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


def _text(x: float, y: float, s: str, size: int = 11, anchor: str = "middle", fill: str = "#1d2330",
          extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}" '
            f'font-family="sans-serif"{extra}>{html.escape(s)}</text>')


def histogram_svg(hist: list[tuple[int, int, int]], max_length: int, title: str, width: int = 460,
                  height: int = 260) -> str:
    """Rows per log2 length bin; the bin holding max_length is marked (longer rows are truncated)."""
    ml, mr, mt, mb = 52, 12, 28, 46
    pw, ph = width - ml - mr, height - mt - mb
    top = max((c for _, _, c in hist), default=0) or 1
    n = max(len(hist), 1)
    bw = pw / n
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}">', f'<rect width="{width}" height="{height}" fill="#fff"/>',
             _text(width / 2, 17, title, 13)]
    for k in range(5):
        v = top * k / 4
        y = mt + ph - ph * k / 4
        parts.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eceff3"/>')
        parts.append(_text(ml - 5, y + 4, human(v), 10, "end", _COLORS["axis"]))
    for i, (lo, hi, c) in enumerate(hist):
        h = ph * c / top
        x = ml + i * bw
        color = _COLORS["pad"] if lo > max_length else _COLORS["bar"]  # red: rows that get truncated
        parts.append(f'<rect x="{x + 1:.1f}" y="{mt + ph - h:.1f}" width="{max(bw - 2, 1):.1f}" height="{h:.1f}" '
                     f'fill="{color}"><title>{lo}-{hi}: {c} rows</title></rect>')
        parts.append(_text(x + bw / 2, mt + ph + 13, str(lo), 9, fill=_COLORS["axis"]))
        if lo <= max_length <= hi and max_length > 0:
            # Bins are log2-spaced: place the marker at log2(max_length) inside its bin.
            lx = x + bw * (math.log2(max_length) - math.log2(lo)) if lo > 0 else x + bw
            parts.append(f'<line x1="{lx:.1f}" x2="{lx:.1f}" y1="{mt}" y2="{mt + ph}" '
                         f'stroke="{_COLORS["line"]}" stroke-width="2" stroke-dasharray="4 3"/>')
            parts.append(_text(lx - 3, mt + 10, f"max_length {max_length}", 10, "end", _COLORS["line"]))
    parts.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{mt + ph}" y2="{mt + ph}" stroke="{_COLORS["axis"]}"/>')
    parts.append(_text(ml + pw / 2, height - 8, "history length (log2 bins: lower edge shown)", 11,
                       fill=_COLORS["axis"]))
    parts.append(_text(14, mt + ph / 2, "rows", 11, fill=_COLORS["axis"],
                       extra=f' transform="rotate(-90 14 {mt + ph / 2:.1f})"'))
    parts.append("</svg>")
    return "".join(parts)


def strategy_bars_svg(labels: list[str], real: list[float], total: list[float], title: str, unit: str,
                      width: int = 460, height: int = 260) -> str:
    """Horizontal bars per strategy: the real part in green, the padding part in red."""
    ml, mr, mt, mb = 140, 70, 28, 14
    pw = width - ml - mr
    n = max(len(labels), 1)
    bh = (height - mt - mb) / n
    top = max(total, default=0) or 1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}">', f'<rect width="{width}" height="{height}" fill="#fff"/>',
             _text(width / 2, 17, title, 13)]
    for i, (lab, r, t) in enumerate(zip(labels, real, total)):
        y = mt + i * bh + 3
        wr, wt = pw * r / top, pw * t / top
        parts.append(_text(ml - 6, y + bh / 2 + 1, lab, 10, "end"))
        parts.append(f'<rect x="{ml}" y="{y:.1f}" width="{wr:.1f}" height="{bh - 6:.1f}" fill="{_COLORS["real"]}"/>')
        if wt > wr:
            parts.append(f'<rect x="{ml + wr:.1f}" y="{y:.1f}" width="{wt - wr:.1f}" height="{bh - 6:.1f}" '
                         f'fill="{_COLORS["pad"]}" opacity="0.8"/>')
        parts.append(_text(ml + wt + 4, y + bh / 2 + 1, human(t, unit), 10, "start", _COLORS["axis"]))
    parts.append("</svg>")
    return "".join(parts)


def _img(svg: str, alt: str) -> str:
    return f'<img class="plot" alt="{html.escape(alt)}" src="{svg_data_uri(svg)}">'


def _sequence_section(report: PaddingReport, seq: SequenceReport) -> str:
    e = html.escape
    bm = seq.strategy(BATCH_MAX)
    cards = []
    if bm is not None:
        cards.append((f"{100 * bm.wasted:.1f}%", "of pad-to-batch-max events are padding",
                      f"{seq.name}.wasted_batch_max"))
        cards.append((f"{bm.attn_ratio:.2f}x", "attention FLOPs padded (batch max) vs jagged",
                      f"{seq.name}.attn_ratio_batch_max"))
    cards.append((f"{seq.rows:,}", "rows", f"{seq.name}.rows"))
    if seq.percentiles:
        cards.append((f"{seq.percentiles.get('p50', 0)} / {seq.percentiles.get('p99', 0)}",
                      "median / p99 length", f"{seq.name}.p50_p99"))
    out = [f'<h2>Sequence <code>{e(seq.name)}</code></h2>',
           f'<p class="meta">max_length {seq.max_length} &middot; token width {seq.token_width} &middot; '
           f'mean length {seq.mean_length:.1f}'
           + (f' &middot; truncated: {seq.truncated_rows:,} rows, {seq.truncated_events:,} events'
              if seq.truncated_rows is not None else f' &middot; truncated events: {seq.truncated_events:,}')
           + '</p>', '<div class="cards">']
    for v, k, key in cards:
        out.append(f'<div class="card"><div class="v headline" data-key="{e(key)}">{e(v)}</div>'
                   f'<div class="k">{e(k)}</div></div>')
    out.append("</div>")
    out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in TABLE_HEADER) + "</tr>")
    for i, row in enumerate(table_rows(report, seq)):
        cls = ' class="jagged"' if i == 0 else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
    out.append("</table>")
    if seq.percentiles:
        out.append("<table><tr><th>length (as stored)</th>" + "".join(f"<th>{e(k)}</th>" for k in seq.percentiles)
                   + "<th>max</th><th>mean</th></tr><tr><td>events</td>"
                   + "".join(f"<td>{v}</td>" for v in seq.percentiles.values())
                   + f"<td>{seq.max_seen}</td><td>{seq.mean_length:.1f}</td></tr></table>")
    out.append('<div class="plots">')
    if seq.histogram:
        out.append(_img(histogram_svg(seq.histogram, seq.max_length, f"{seq.name}: length distribution"),
                        f"{seq.name} length histogram"))
    labels = [r.strategy for r in seq.strategies]
    out.append(_img(strategy_bars_svg(labels, [r.real_events for r in seq.strategies],
                                      [r.events for r in seq.strategies], f"{seq.name}: events computed", ""),
                    f"{seq.name} events per strategy"))
    w = seq.token_width
    out.append(_img(strategy_bars_svg(labels, [r.attn_flops(w) * r.attn_pairs_real / r.attn_pairs if r.attn_pairs
                                               else 0 for r in seq.strategies],
                                      [r.attn_flops(w) for r in seq.strategies],
                                      f"{seq.name}: attention FLOPs per layer", ""),
                    f"{seq.name} attention FLOPs per strategy"))
    out.append("</div>")
    return "\n".join(out)


def render_html(report: PaddingReport) -> str:
    """The whole page: header, one section per sequence (cards, tables, plots), assumptions."""
    e = html.escape
    scan = ""
    if report.scan:
        sc = report.scan
        scan = (f" &middot; scanned {int(sc.get('rows', 0)):,} rows, {sc.get('files', 0)} files, "
                f"{sc.get('row_groups', 0)} row groups in {float(sc.get('seconds', 0.0)):.2f}s")
    body = [f"<h1>{e(report.title)}</h1>",
            f'<p class="meta">source: {e(report.source)} &middot; batching: {e(report.batching)}{scan}</p>',
            '<p class="meta">Green: real events (what gemtrain computes on, jagged). Red: padding the strategy '
            'would add.</p>']
    body += [_sequence_section(report, s) for s in report.sequences]
    body.append('<h2>Assumptions</h2><ul class="notes">' + "".join(f"<li>{e(a)}</li>" for a in report.assumptions)
                + "</ul>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{e(report.title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
