"""Per-row held-out predictions (`eval.save_predictions`), written as Parquet for offline analysis.

One file per evaluation, `predictions-step{N}.parquet` in the run dir: `row_id`, and per task `{task}_prob`
(the model's probability), `{task}_label`, `{task}_weight` (the weight the row carries in the metrics: 0 where the
label is not observed) and, where the data carries it (synthetic data), `{task}_true` (the true probability).
Two runs evaluated on the same rows can then be compared row by row, for example to tell how much of their NE
difference the choice of held-out rows explains (`benchmarks/quality_stats.paired_ne_bootstrap`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch


class PredictionLog:
    """Collects what `TaskMetrics.update` sees, row by row, and writes it as one table."""

    def __init__(self, tasks: list[str]):
        self.tasks = list(tasks)
        self._parts: list[dict[str, np.ndarray]] = []

    @torch.no_grad()
    def update(self, row_ids: torch.Tensor, probs: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
               weights: torch.Tensor, oracle: dict[str, torch.Tensor] | None = None) -> None:
        """row_ids: [B]; probs/labels/mask/weights: [B, T] as `TaskMetrics.update` takes them."""
        cpu = lambda x: x.detach().float().cpu().numpy()
        w = cpu(mask * weights)
        part = {"row_id": row_ids.detach().cpu().numpy().astype(np.int64)}
        p, y = cpu(probs), cpu(labels)
        for i, t in enumerate(self.tasks):
            part[f"{t}_prob"], part[f"{t}_label"], part[f"{t}_weight"] = p[:, i], y[:, i], w[:, i]
            if oracle is not None and t in oracle:
                part[f"{t}_true"] = cpu(oracle[t])
        self._parts.append(part)

    def table(self) -> pa.Table:
        if not self._parts:
            return pa.table({"row_id": pa.array([], pa.int64())})
        cols = self._parts[0].keys()
        return pa.table({c: np.concatenate([p[c] for p in self._parts]) for c in cols})

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(self.table(), path)
        return path


def predictions_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / f"predictions-step{step}.parquet"


def last_predictions(run_dir: str | Path) -> Path | None:
    """The predictions file of a run's last evaluation, or None where it saved none."""
    found = sorted(Path(run_dir).glob("predictions-step*.parquet"),
                   key=lambda p: int(p.stem.removeprefix("predictions-step")))
    return found[-1] if found else None
