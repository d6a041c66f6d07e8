"""Per-task binary metrics: normalized entropy (NE), AUC and calibration.

The formulas are torchrec's (`torchrec.metrics.ne`, `.auc`, `.calibration`): this module only keeps
the running states of several tasks and, for AUC, the predictions of the current window. A task's
examples are the rows where its label is observed (`label_mask`), weighted by `weights`.

``ne_recalibrated`` (where predictions are kept) is the NE after one logit shift per task fitted on the
other half of the examples (two folds, by position): the part of NE a model's overall calibration offset
does not explain. Two training runs that learn the same ranking but end with different offsets (short runs
do) differ in NE and much less in it.

``ne_expected`` (where the data carries each row's true probability, as the synthetic data does) is the NE
with every label replaced by its true probability: the expected NE over the labels' coin flips, so two models
compared on the same rows differ in it by what they predict, not by how the held-out labels happened to fall.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torchrec.metrics.auc import compute_auc
from torchrec.metrics.calibration import compute_calibration, get_calibration_states
from torchrec.metrics.ne import compute_logloss, compute_ne, get_ne_states

ETA = 1e-12
# NE and the two readings of it above; with AUC, calibration and the oracle's NE, what an eval record holds.
NE_KINDS = ("ne", "ne_recalibrated", "ne_expected")
EVAL_RECORD_KEYS = (*NE_KINDS, "auc", "calibration", "oracle_ne")


@dataclass
class _TaskState:
    ce_sum: float = 0.0
    weighted_num_samples: float = 0.0
    pos_labels: float = 0.0
    neg_labels: float = 0.0
    calibration_num: float = 0.0
    calibration_denom: float = 0.0
    preds: list[torch.Tensor] = field(default_factory=list)
    labels: list[torch.Tensor] = field(default_factory=list)
    weights: list[torch.Tensor] = field(default_factory=list)
    oracle_ce_sum: float = 0.0
    has_oracle: bool = False
    expected_ce_sum: float = 0.0  # the model's predictions against the true probabilities (soft labels)
    expected_pos: float = 0.0
    expected_neg: float = 0.0


class TaskMetrics:
    """Accumulates NE, AUC, calibration (and the oracle NE, given true probabilities) for each task."""

    def __init__(self, tasks: list[str] | tuple[str, ...], *, auc: bool = True, max_auc_examples: int = 2_000_000):
        self.tasks = list(tasks)
        self.auc = auc
        self.max_auc_examples = max_auc_examples
        self.reset()

    def reset(self) -> None:
        self._s = {t: _TaskState() for t in self.tasks}
        self._auc_examples = 0

    @torch.no_grad()
    def update(self, probs: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor,
               oracle: dict[str, torch.Tensor] | None = None) -> None:
        """probs/labels/mask/weights: [B, T]; oracle: task -> [B] true probabilities (optional)."""
        probs = probs.detach().float().cpu()
        labels = labels.detach().float().cpu()
        w = (mask * weights).detach().float().cpu()
        store = self.auc and self._auc_examples < self.max_auc_examples
        for i, t in enumerate(self.tasks):
            s = self._s[t]
            p, y, wt = probs[:, i], labels[:, i], w[:, i]
            ne = get_ne_states(y, p, wt, ETA)
            s.ce_sum += float(ne["cross_entropy_sum"])
            s.weighted_num_samples += float(ne["weighted_num_samples"])
            s.pos_labels += float(ne["pos_labels"])
            s.neg_labels += float(ne["neg_labels"])
            cal = get_calibration_states(y, p, wt)
            s.calibration_num += float(cal["calibration_num"])
            s.calibration_denom += float(cal["calibration_denom"])
            if oracle is not None and t in oracle:
                op = oracle[t].detach().float().cpu()
                s.oracle_ce_sum += float(get_ne_states(y, op, wt, ETA)["cross_entropy_sum"])
                soft = get_ne_states(op, p, wt, ETA)
                s.expected_ce_sum += float(soft["cross_entropy_sum"])
                s.expected_pos += float(soft["pos_labels"])
                s.expected_neg += float(soft["neg_labels"])
                s.has_oracle = True
            if store:
                keep = wt > 0
                s.preds.append(p[keep])
                s.labels.append(y[keep])
                s.weights.append(wt[keep])
        if store:
            self._auc_examples += int(probs.shape[0])

    def _ne(self, s: _TaskState, ce_sum: float, pos: float | None = None, neg: float | None = None) -> float:
        t = lambda x: torch.tensor(x, dtype=torch.float64)
        pos, neg = (s.pos_labels, s.neg_labels) if pos is None else (pos, neg)
        return float(compute_ne(t(ce_sum), t(s.weighted_num_samples), t(pos), t(neg), ETA))

    def compute(self) -> dict[str, dict[str, float]]:
        """task -> {ne, logloss, auc, calibration, examples, positives[, oracle_ne, ne_expected,
        ne_recalibrated]} (NaN where undefined)."""
        out: dict[str, dict[str, float]] = {}
        t = lambda x: torch.tensor(x, dtype=torch.float64)
        for name, s in self._s.items():
            r: dict[str, float] = {"examples": s.weighted_num_samples, "positives": s.pos_labels}
            if s.weighted_num_samples <= 0:
                out[name] = r | {"ne": float("nan"), "logloss": float("nan"), "auc": float("nan"),
                                 "calibration": float("nan")}
                continue
            r["ne"] = self._ne(s, s.ce_sum)
            r["logloss"] = float(compute_logloss(t(s.ce_sum), t(s.pos_labels), t(s.neg_labels), ETA))
            r["calibration"] = float(compute_calibration(t(s.calibration_num), t(s.calibration_denom)))
            if s.has_oracle:
                r["oracle_ne"] = self._ne(s, s.oracle_ce_sum)
                r["ne_expected"] = self._ne(s, s.expected_ce_sum, s.expected_pos, s.expected_neg)
            if s.preds:
                p, y, w = torch.cat(s.preds), torch.cat(s.labels), torch.cat(s.weights)
                r["auc"] = float(compute_auc(1, [p.view(1, -1)], [y.view(1, -1)], [w.view(1, -1)])[0])
                r["ne_recalibrated"] = recalibrated_ne(p, y, w)
            else:
                r["auc"] = float("nan")
            out[name] = r
        return out


def logit_shift(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor, iters: int = 50) -> float:
    """The shift ``b`` minimising the weighted log loss of ``sigmoid(z + b)``: where the mean prediction
    equals the mean label (Newton's method on that convex, one-dimensional problem); NaN when the labels
    are all of one class (no finite minimum)."""
    z, y, w = z.double(), y.double(), w.double()
    pos, tot = float((w * y).sum()), float(w.sum())
    if not 0.0 < pos < tot:
        return float("nan")
    b = 0.0
    for _ in range(iters):
        p = torch.sigmoid(z + b)
        step = float((w * (p - y)).sum()) / max(float((w * p * (1 - p)).sum()), 1e-300)
        b -= step
        if abs(step) < 1e-12:
            break
    return b


def recalibrated_ne(p: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> float:
    """NE (torchrec's formula, over these examples) of the predictions after a logit shift fitted on the other
    fold (examples at even / odd positions), so no example's shift was fitted on itself. NaN where a fold has
    one class."""
    z = torch.logit(p.double().clamp(1e-7, 1 - 1e-7))
    y, w = y.double(), w.double()
    idx = torch.arange(z.numel())
    ce = 0.0
    for fold in (0, 1):
        fit, ev = idx % 2 != fold, idx % 2 == fold
        b = logit_shift(z[fit], y[fit], w[fit])
        q = torch.sigmoid(z[ev] + b).clamp(ETA, 1 - ETA)
        ce += float(-(w[ev] * (y[ev] * q.log2() + (1 - y[ev]) * (1 - q).log2())).sum())
    pos = (w * y).sum()
    return float(compute_ne(torch.tensor(ce, dtype=torch.float64), w.sum(), pos, w.sum() - pos, ETA))
