"""Per-row held-out predictions (`eval.save_predictions`), written as Parquet for offline analysis.

One file per evaluation, `predictions-step{N}.parquet` in the run dir (`predictions-step{N}-{data}.parquet` for
held-out data other than the config's `data.eval_url`, e.g. `gemtrain eval --url`, so that file is kept): `row_id`, and per task `{task}_prob`
(the model's probability), `{task}_label`, `{task}_weight` (the weight the row carries in the metrics: 0 where the
label is not observed) and, where the data carries it (synthetic data), `{task}_true` (the true probability).
Two runs evaluated on the same rows can then be compared row by row: `paired_ne_difference` gives their NE
difference with its standard error over the rows (`gemtrain report compare` prints it where both runs saved
their predictions).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torchrec.metrics.ne import compute_cross_entropy

from train.metrics import ETA


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


def predictions_path(run_dir: str | Path, step: int, other_data: str | None = None) -> Path:
    """The file of the evaluation at `step`; `other_data`: the URL of held-out data other than the run's own, named
    in the file (its last part and a hash of the whole URL)."""
    if other_data is None:
        return Path(run_dir) / f"predictions-step{step}.parquet"
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", other_data.rstrip("/").rsplit("/", 1)[-1])[:40]
    return Path(run_dir) / f"predictions-step{step}-{name}-{hashlib.sha1(other_data.encode()).hexdigest()[:8]}.parquet"


_OWN = re.compile(r"predictions-step(\d+)\.parquet")


def last_predictions(run_dir: str | Path) -> Path | None:
    """The predictions file of a run's last evaluation on its own held-out data, or None where it saved none."""
    found = [(int(m.group(1)), p) for p in Path(run_dir).glob("predictions-step*.parquet")
             if (m := _OWN.fullmatch(p.name))]
    return max(found)[1] if found else None


def read_predictions(path: str | Path) -> dict[str, np.ndarray]:
    table = pq.read_table(path)
    return {name: col.to_numpy() for name, col in zip(table.column_names, table.columns)}


def _cross_entropy(p: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per-row weighted cross entropy as torchrec's NE (and so train.metrics) computes it."""
    t = lambda x: torch.from_numpy(np.asarray(x, dtype=np.float64))
    return compute_cross_entropy(t(y), t(p), t(w), ETA).numpy()


class PairingError(ValueError):
    """Two predictions files that do not score the same rows the same way."""


def paired_ne_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray], task: str) -> tuple[float, float]:
    """(NE of run b against run a in %, its standard error in % over the held-out rows both scored).

    Both runs see the same labels and weights, so NE's normaliser (the entropy of the rows' mean label) cancels
    and the relative difference is that of the two cross-entropy sums, R - 1 with R = sum(b) / sum(a). Its error
    over the choice of rows is the delta method's for a ratio of sums over the same rows,
    sqrt(n) * sd(b_i - R a_i) / sum(a): the part of the difference that scoring other rows would change.
    """
    if any(f"{task}_{c}" not in r for r in (a, b) for c in ("prob", "label", "weight")):
        raise PairingError(f"no {task} predictions in both runs' files")
    order_a, order_b = np.argsort(a["row_id"], kind="stable"), np.argsort(b["row_id"], kind="stable")
    if not np.array_equal(a["row_id"][order_a], b["row_id"][order_b]):
        raise PairingError("the two runs scored different held-out rows")
    col = lambda cols, order, name: cols[f"{task}_{name}"][order]
    y, w = col(a, order_a, "label"), col(a, order_a, "weight")
    if not (np.array_equal(y, col(b, order_b, "label")) and np.array_equal(w, col(b, order_b, "weight"))):
        raise PairingError(f"the two runs' {task} labels or weights differ row by row")
    keep = w > 0
    ce_a = _cross_entropy(col(a, order_a, "prob"), y, w)[keep]
    ce_b = _cross_entropy(col(b, order_b, "prob"), y, w)[keep]
    if ce_a.size < 2:
        raise PairingError(f"fewer than two held-out rows carry a {task} label")
    ratio = ce_b.sum() / ce_a.sum()
    se = float(np.std(ce_b - ratio * ce_a, ddof=1) * np.sqrt(ce_a.size) / ce_a.sum())
    return 100.0 * (ratio - 1.0), 100.0 * se
