"""Scoring held-out batches: each row counted once, into the metrics and (`eval.save_predictions`) the per-row file.

Shared by the single-process evaluation (`Trainer.evaluate`) and the distributed one
(`train.dist_trainer.evaluate_distributed`, on rank 0 over every rank's batches).
"""

from __future__ import annotations

from pathlib import Path

import torch

from train.metrics import TaskMetrics
from train.predictions import PredictionLog, predictions_path


class HeldOutScorer:
    def __init__(self, tasks: list[str], save_predictions: bool = False):
        self.metrics = TaskMetrics(tasks)
        self.predictions = PredictionLog(tasks) if save_predictions else None
        self._seen: set[int] = set()
        self.written: Path | None = None  # the predictions file, once finish() wrote it

    @property
    def rows(self) -> int:
        return len(self._seen)

    @torch.no_grad()
    def update(self, row_ids: torch.Tensor, probs: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
               weights: torch.Tensor, oracle: dict[str, torch.Tensor] | None = None) -> None:
        """One batch, as `TaskMetrics.update` takes it, with its rows' ids: a row seen before (a last batch filled
        with repeats, or a row two ranks both scored) gets weight 0."""
        seen = self._seen
        keep = torch.tensor([i not in seen and not seen.add(i) for i in row_ids.tolist()], dtype=torch.float32,
                            device=probs.device).unsqueeze(1)
        mask = mask * keep
        self.metrics.update(probs, labels, mask, weights, oracle)
        if self.predictions is not None:
            self.predictions.update(row_ids, probs, labels, mask, weights, oracle)

    def finish(self, run_dir: str | Path, step: int, other_data: str | None = None) -> dict:
        """The metrics per task; writes the predictions file of this evaluation where asked (`other_data`: the URL
        of held-out data other than the run's own, named in the file: `train.predictions.predictions_path`)."""
        if self.predictions is not None:
            self.written = self.predictions.write(predictions_path(run_dir, step, other_data))
        return self.metrics.compute()
