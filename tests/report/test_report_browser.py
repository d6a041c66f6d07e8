"""The HTML reports rendered by a real headless Chromium: page loads, every plot decodes, numbers show."""

from __future__ import annotations

import numpy as np
import torch

from ingest.batch import PaddingStats, SequenceStats
from tests.report.browser import ARTIFACTS, load_in_chromium
from tests.report.test_padding_report import LENGTHS, TINY_YAML, write
from train.cli import main
from train.padding_report import render_padding_html


def test_dataset_report_renders_in_chromium(tmp_path):
    rng = np.random.default_rng(0)
    lengths = LENGTHS + rng.integers(0, 12, 200).tolist()
    write(tmp_path / "d.parquet", lengths, row_group_size=64)
    (tmp_path / "tiny.yaml").write_text(TINY_YAML)
    out = tmp_path / "out"
    assert main(["report", "padding", str(tmp_path / "d.parquet"), "--schema", str(tmp_path / "tiny.yaml"),
                 "--batch-size", "2", "--out", str(out), "--quiet"]) == 0
    import json

    d = json.loads((out / "padding_report.json").read_text())
    bm = next(s for s in d["sequences"][0]["strategies"] if s["strategy"] == "pad to batch max")
    result, text = load_in_chromium(out / "padding_report.html", ARTIFACTS / "padding_report.png")
    assert result["images"] == 3 and result["decoded"] == 3, result
    assert result["title"] == "Padding report: tiny"
    assert f"{100 * bm['wasted']:.1f}%" in text and f"{bm['attn_ratio']:.2f}x" in text
    assert f"{len(lengths):,}" in text
    assert (ARTIFACTS / "padding_report.png").stat().st_size > 10_000


def test_run_stats_report_renders_in_chromium(tmp_path):
    stats = PaddingStats()
    eff = torch.tensor([min(x, 8) for x in LENGTHS])
    for chunk in torch.split(eff, 2):
        stats += PaddingStats({"history": SequenceStats.of_lengths(chunk, 8)})
    page = tmp_path / "run_padding.html"
    page.write_text(render_padding_html(stats, token_dim=4))
    result, text = load_in_chromium(page)  # one screenshot (the dataset report's) is enough
    # No length histogram from sums: two plots (events, attention FLOPs).
    assert result["images"] == 2 and result["decoded"] == 2, result
    assert "15.0%" in text and "1.17x" in text and "Padding seen by training" in text
