"""Padding-savings numbers: what padding the histories would cost, per sequence and per strategy.

Two sources give the same report:
- `report_from_lengths`: the length of every row (from `ingest.padding_scan.scan_lengths`), batched
  the way a loader would (consecutive rows, `batch_size` rows or a `token_budget`);
- `report_from_stats`: a `PaddingStats` summed over the batches a training run actually saw
  (`render_padding_html(stats)` turns that straight into the HTML page).

Strategies: jagged (what gemtrain does: no padding), pad every row to the schema's `max_length`,
pad every batch to its longest row, pad every row to a length bucket (powers of two, capped at
`max_length`). Lengths are counted after truncation to `max_length` (the loader keeps the most
recent events), so jagged "real events" are the events the model sees.

Assumptions, also printed with every report: memory is that of ONE activation tensor of one layer,
padded events x token width x bytes per value; attention FLOPs are those of one full (non-causal)
self-attention layer's forward pass, 4 x pairs x token width (QK^T and PV, 2 FLOPs per multiply-add),
with pairs = sum of L^2 over rows (jagged) or of padded L^2.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from features.schema import FeatureSchema, SequenceSpec

if TYPE_CHECKING:  # ingest.batch imports torch and torchrec: not needed to report on lengths
    from ingest.batch import PaddingStats

__all__ = [
    "PaddingReport",
    "SequenceReport",
    "StrategyRow",
    "format_table",
    "render_padding_html",
    "report_from_lengths",
    "report_from_stats",
    "token_width",
]

JAGGED = "jagged (no padding)"
SCHEMA_MAX = "pad to schema max"
BATCH_MAX = "pad to batch max"
BUCKETS = "pad to pow2 buckets"
PERCENTILES = (50, 90, 99, 99.9)


@dataclass
class StrategyRow:
    strategy: str
    events: int  # tokens the strategy computes on (real + padding)
    real_events: int
    attn_pairs: int
    attn_pairs_real: int

    @property
    def wasted(self) -> float:
        """Fraction of the events that are padding."""
        return 1.0 - self.real_events / self.events if self.events else 0.0

    @property
    def attn_ratio(self) -> float:
        """Attention work relative to jagged (>= 1)."""
        return self.attn_pairs / self.attn_pairs_real if self.attn_pairs_real else 1.0

    def memory_bytes(self, width: int, bytes_per_value: int) -> int:
        return self.events * width * bytes_per_value

    def attn_flops(self, width: int) -> int:
        return 4 * self.attn_pairs * width


@dataclass
class SequenceReport:
    name: str
    max_length: int
    rows: int
    token_width: int
    strategies: list[StrategyRow]
    truncated_rows: int | None = None
    truncated_events: int = 0
    mean_length: float = 0.0  # as stored, before truncation
    percentiles: dict[str, int] = field(default_factory=dict)  # "p50" -> length, as stored
    max_seen: int | None = None
    histogram: list[tuple[int, int, int]] | None = None  # (lo, hi inclusive, rows); None: no lengths

    def strategy(self, name: str) -> StrategyRow | None:
        return next((s for s in self.strategies if s.strategy == name), None)


@dataclass
class PaddingReport:
    title: str
    source: str
    batching: str  # how batches were formed, in words
    sequences: list[SequenceReport]
    bytes_per_value: int = 4
    rows: int = 0
    scan: dict[str, float | int | str] = field(default_factory=dict)  # files, row groups, seconds, ...

    @property
    def assumptions(self) -> list[str]:
        widths = ", ".join(f"{s.name}: {s.token_width}" for s in self.sequences)
        return [
            "Lengths are counted after truncation to the sequence's max_length (most recent events kept).",
            f"Token width ({widths}): --token-dim when given (e.g. the model's d_model), else the summed dims "
            "of the tables a sequence's id fields look up.",
            f"Memory: one activation tensor of one layer = events x token width x {self.bytes_per_value} "
            "bytes per value.",
            "Attention FLOPs: one full (non-causal) self-attention layer, forward: 4 x pairs x token width; "
            "pairs = sum over rows of L^2 (padded L for padding strategies).",
        ]

    def to_dict(self) -> dict:
        out = asdict(self)
        for seq, sd in zip(self.sequences, out["sequences"]):
            for row, rd in zip(seq.strategies, sd["strategies"]):
                rd["wasted"] = row.wasted
                rd["attn_ratio"] = row.attn_ratio
                rd["memory_bytes"] = row.memory_bytes(seq.token_width, self.bytes_per_value)
                rd["attn_flops"] = row.attn_flops(seq.token_width)
        out["assumptions"] = self.assumptions
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def token_width(schema: FeatureSchema | None, seq: SequenceSpec | None) -> int:
    """Assumed width of one history token: the summed dims of the tables its id fields look up."""
    if schema is None or seq is None:
        return 128
    return sum(schema.table(f.table).dim for f in seq.id_fields)  # type: ignore[arg-type]


# ---- from lengths ---------------------------------------------------------------------------


def batch_groups(events: np.ndarray, batch_size: int | None, token_budget: int | None,
                 window_rows: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """How rows form batches: `(order, starts)`: batch k holds rows `order[starts[k]:starts[k+1]]`.

    `batch_size` only: B consecutive rows per batch (the last one may be short). With `token_budget`:
    as the loader does (`ingest.batching.token_batches`): within each window of `window_rows`
    consecutive rows, rows are grouped so that each batch holds at most `token_budget` events
    (`events`: per row, after truncation, summed over sequences) and at most `batch_size` rows.
    """
    n = int(events.size)
    if token_budget is None:
        return np.arange(n, dtype=np.int64), np.arange(0, n, batch_size or max(n, 1), dtype=np.int64)
    from ingest.batching import token_batches

    order, starts, pos = [], [], 0
    for w0 in range(0, n, window_rows):
        for idx in token_batches(events[w0:w0 + window_rows], token_budget, batch_size or window_rows):
            starts.append(pos)
            order.append(idx + w0)
            pos += len(idx)
    if not order:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(order).astype(np.int64), np.asarray(starts, np.int64)


def _bucket(lengths: np.ndarray, max_length: int) -> np.ndarray:
    """Next power of two >= L (0 stays 0), capped at max_length."""
    b = np.zeros_like(lengths)
    pos = lengths > 0
    b[pos] = np.left_shift(1, np.ceil(np.log2(lengths[pos])).astype(np.int64))
    return np.minimum(b, max_length)


def _log2_histogram(lengths: np.ndarray) -> list[tuple[int, int, int]]:
    """Rows per length bin [0], [1], [2,3], [4,7], ... up to the longest row."""
    if lengths.size == 0:
        return []
    top = int(lengths.max())
    nbins = 1 + (int(np.ceil(np.log2(top + 1))) if top > 0 else 0)
    idx = np.zeros(lengths.shape, np.int64)
    pos = lengths > 0
    idx[pos] = np.floor(np.log2(lengths[pos])).astype(np.int64) + 1
    counts = np.bincount(idx, minlength=nbins)
    out = [(0, 0, int(counts[0]))]
    for k in range(1, len(counts)):
        out.append((1 << (k - 1), (1 << k) - 1, int(counts[k])))
    return out


def sequence_report_from_lengths(name: str, stored: np.ndarray, max_length: int, width: int,
                                 order: np.ndarray, starts: np.ndarray) -> SequenceReport:
    """One sequence's numbers; batches are given by `batch_groups` (shared by all sequences)."""
    stored = np.asarray(stored, np.int64)
    eff = np.minimum(stored, max_length)
    n = int(eff.size)
    real = int(eff.sum())
    real_pairs = int((eff * eff).sum())
    if n:
        bmax = np.maximum.reduceat(eff[order], starts)
        bcount = np.diff(np.append(starts, n))
        bm_events, bm_pairs = int((bcount * bmax).sum()), int((bcount * bmax * bmax).sum())
    else:
        bm_events = bm_pairs = 0
    buckets = _bucket(eff, max_length)
    rows = [
        StrategyRow(JAGGED, real, real, real_pairs, real_pairs),
        StrategyRow(SCHEMA_MAX, n * max_length, real, n * max_length * max_length, real_pairs),
        StrategyRow(BATCH_MAX, bm_events, real, bm_pairs, real_pairs),
        StrategyRow(BUCKETS, int(buckets.sum()), real, int((buckets * buckets).sum()), real_pairs),
    ]
    pct = {}
    if n:
        vals = np.percentile(stored, PERCENTILES, method="inverted_cdf")
        pct = {f"p{p:g}": int(v) for p, v in zip(PERCENTILES, vals)}
    over = stored > max_length
    return SequenceReport(
        name=name, max_length=max_length, rows=n, token_width=width, strategies=rows,
        truncated_rows=int(over.sum()), truncated_events=int((stored - eff).sum()),
        mean_length=float(stored.mean()) if n else 0.0, percentiles=pct,
        max_seen=int(stored.max()) if n else 0, histogram=_log2_histogram(stored))


def report_from_lengths(schema: FeatureSchema, lengths: dict[str, np.ndarray], *, batch_size: int | None = None,
                        token_budget: int | None = None, window_rows: int = 8192, token_dim: int | None = None,
                        bytes_per_value: int = 4, source: str = "", title: str | None = None) -> PaddingReport:
    """The padding report of a dataset from its per-row history lengths (see the module docstring)."""
    if batch_size is None and token_budget is None:
        raise ValueError("give batch_size or token_budget")
    from ingest.batching import row_events

    events = row_events([np.asarray(lengths[s.name]) for s in schema.sequences],
                        [s.max_length for s in schema.sequences])
    order, starts = batch_groups(events, batch_size, token_budget, window_rows)
    seqs = []
    for seq in schema.sequences:
        width = token_dim or token_width(schema, seq)
        seqs.append(sequence_report_from_lengths(seq.name, lengths[seq.name], seq.max_length, width, order, starts))
    if token_budget is None:
        batching = f"consecutive rows, batches of {batch_size} rows"
    else:
        batching = (f"token budget {token_budget} events per batch" + (f", at most {batch_size} rows" if batch_size
                    else "") + f", rows grouped by length within windows of {window_rows} rows (as the loader does)")
    rows = seqs[0].rows if seqs else 0
    return PaddingReport(title=title or f"Padding report: {schema.name}", source=source, batching=batching,
                         sequences=seqs, bytes_per_value=bytes_per_value, rows=rows)


# ---- from a training run's PaddingStats -------------------------------------------------------


def report_from_stats(stats: PaddingStats, *, schema: FeatureSchema | None = None, token_dim: int | None = None,
                      bytes_per_value: int = 4, source: str = "batches seen by training",
                      title: str = "Padding seen by training") -> PaddingReport:
    """The report of the batches a run saw. No bucket strategy and no histogram: stats hold sums only."""
    seqs = []
    for name, s in stats.sequences.items():
        spec = None
        if schema is not None:
            spec = next((q for q in schema.sequences if q.name == name), None)
        max_length = spec.max_length if spec else (s.padded_schema_max_events // s.rows if s.rows else 0)
        width = token_dim or token_width(schema, spec)
        real, rp = s.real_events, s.attn_pairs_real
        rows = [
            StrategyRow(JAGGED, real, real, rp, rp),
            StrategyRow(SCHEMA_MAX, s.padded_schema_max_events, real, s.attn_pairs_padded_schema_max, rp),
            StrategyRow(BATCH_MAX, s.padded_batch_max_events, real, s.attn_pairs_padded_batch_max, rp),
        ]
        seqs.append(SequenceReport(name=name, max_length=max_length, rows=s.rows, token_width=width,
                                   strategies=rows, truncated_events=s.truncated_events,
                                   mean_length=real / s.rows if s.rows else 0.0))
    rows_total = seqs[0].rows if seqs else 0
    return PaddingReport(title=title, source=source, batching="the batches the run's loader produced",
                         sequences=seqs, bytes_per_value=bytes_per_value, rows=rows_total)


def render_padding_html(stats: PaddingStats, *, schema: FeatureSchema | None = None, token_dim: int | None = None,
                        bytes_per_value: int = 4, title: str = "Padding seen by training",
                        source: str = "batches seen by training") -> str:
    """The self-contained HTML page of a run's padding (for the trainer's run report to embed or link)."""
    from train.report_html import render_html

    return render_html(report_from_stats(stats, schema=schema, token_dim=token_dim,
                                         bytes_per_value=bytes_per_value, title=title, source=source))


# ---- terminal -------------------------------------------------------------------------------


def human(n: float, unit: str = "") -> str:
    """1234567 -> '1.23M' (SI prefixes; bytes use powers of 1024)."""
    if unit == "B":
        for u in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
            if abs(n) < 1024 or u == "PiB":
                return f"{n:.0f} {u}" if u == "B" else f"{n:.2f} {u}"
            n /= 1024
    for u in ("", "K", "M", "G", "T", "P", "E"):
        if abs(n) < 1000 or u == "E":
            return f"{n:.0f}{u}" if u == "" else f"{n:.2f}{u}"
        n /= 1000
    return str(n)


def table_rows(report: PaddingReport, seq: SequenceReport) -> list[list[str]]:
    """The strategy table of one sequence as strings (shared by the terminal and the HTML page)."""
    out = []
    for r in seq.strategies:
        out.append([r.strategy, human(r.events), f"{100 * r.wasted:.1f}%",
                    human(r.memory_bytes(seq.token_width, report.bytes_per_value), "B"),
                    human(r.attn_flops(seq.token_width)), f"{r.attn_ratio:.2f}x"])
    return out


TABLE_HEADER = ["strategy", "events", "wasted", "memory", "attn FLOPs", "attn vs jagged"]


def format_table(report: PaddingReport) -> str:
    lines = [report.title, f"source: {report.source}", f"batching: {report.batching}"]
    if report.scan:
        sc = report.scan
        lines.append(f"scanned {sc.get('rows', 0):,} rows in {sc.get('files', 0)} files, {sc.get('row_groups', 0)} "
                     f"row groups in {float(sc.get('seconds', 0.0)):.2f}s")
    for seq in report.sequences:
        lines.append("")
        head = f"sequence '{seq.name}': {seq.rows:,} rows, max_length {seq.max_length}, token width {seq.token_width}"
        lines.append(head)
        if seq.percentiles:
            pct = "  ".join(f"{k}={v}" for k, v in seq.percentiles.items())
            lines.append(f"  length (as stored): mean={seq.mean_length:.1f}  {pct}  max={seq.max_seen}")
        if seq.truncated_rows is not None:
            lines.append(f"  truncated to max_length: {seq.truncated_rows:,} rows, {seq.truncated_events:,} events")
        rows = [TABLE_HEADER] + table_rows(report, seq)
        widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
        for k, r in enumerate(rows):
            cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
            lines.append("  " + "  ".join(cells))
            if k == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
    lines.append("")
    lines += [f"note: {a}" for a in report.assumptions]
    return "\n".join(lines)
