"""Held-out metrics: NE against torchrec's formula, and the recalibrated NE that removes a calibration offset."""

import math

import torch

from train.metrics import TaskMetrics, logit_shift, recalibrated_ne


def _task(n: int = 20000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, generator=g, dtype=torch.float64) * 1.5 - 1.5
    y = (torch.rand(n, generator=g, dtype=torch.float64) < torch.sigmoid(z)).double()
    return z, y


def _metrics(p: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    m = TaskMetrics(["t"])
    ones = torch.ones(len(y), 1)
    m.update(p.float().unsqueeze(1), y.float().unsqueeze(1), ones, ones)
    return m.compute()["t"]


def test_recalibrated_ne_removes_a_logit_offset_that_raw_ne_pays_for():
    z, y = _task()
    calibrated = _metrics(torch.sigmoid(z), y)
    for offset in (0.5, -0.7):
        shifted = _metrics(torch.sigmoid(z + offset), y)
        assert shifted["ne"] > calibrated["ne"] * 1.02  # a 0.5-logit offset costs several percent of NE
        assert abs(shifted["ne_recalibrated"] / calibrated["ne_recalibrated"] - 1) < 1e-6
    # on calibrated predictions the out-of-fold shift is near zero, so both NEs agree closely
    assert abs(calibrated["ne_recalibrated"] / calibrated["ne"] - 1) < 1e-3


def test_logit_shift_recovers_the_offset_and_refuses_one_class():
    z, y = _task(n=200000, seed=1)
    w = torch.ones_like(y)
    assert abs(logit_shift(z + 0.8, y, w) + 0.8) < 0.03
    # the fitted shift makes the mean prediction equal the mean label
    b = logit_shift(z + 0.8, y, w)
    assert abs(float(torch.sigmoid(z + 0.8 + b).mean() - y.mean())) < 1e-9
    assert math.isnan(logit_shift(z, torch.zeros_like(y), w))
    assert math.isnan(recalibrated_ne(torch.sigmoid(z), torch.ones_like(y), w))


def test_recalibration_is_fitted_out_of_fold():
    # A constant prediction over folds with different base rates (even positions 80% positive, odd 20%): a
    # shift fitted in sample would give each fold its own rate; fitted on the other fold, each fold gets the
    # other's rate, and pays for it.
    y = torch.tensor([1, 0, 1, 0, 1, 0, 1, 0, 0, 1] * 100, dtype=torch.float64)  # even: 80% ones, odd: 20%
    p = torch.full_like(y, 0.5)
    w = torch.ones_like(y)
    ne = recalibrated_ne(p, y, w)
    h = lambda q: -(q * math.log2(q) + (1 - q) * math.log2(1 - q))
    out_of_fold = -(0.8 * math.log2(0.2) + 0.2 * math.log2(0.8)) / h(0.5)  # each fold predicted at the other's rate
    assert abs(ne - out_of_fold) < 1e-6
    assert ne > h(0.8) / h(0.5) * 2  # far above what an in-sample fit (each fold at its own rate) would give


def test_expected_ne_scores_predictions_against_true_probabilities_not_label_draws():
    g = torch.Generator().manual_seed(3)
    n = 5000
    p_true = torch.sigmoid(torch.randn(n, generator=g, dtype=torch.float64) * 1.5 - 1.5)
    model = torch.sigmoid(torch.logit(p_true) + 0.3 * torch.randn(n, generator=g, dtype=torch.float64))
    ones = torch.ones(n, 1)
    runs = []
    for seed in (0, 1):  # two draws of the labels from the same probabilities
        y = (torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) < p_true).float()
        m = TaskMetrics(["t"])
        m.update(model.float().unsqueeze(1), y.unsqueeze(1), ones, ones, oracle={"t": p_true.float()})
        runs.append(m.compute()["t"])
    assert abs(runs[0]["ne"] / runs[1]["ne"] - 1) > 1e-3  # the coin flips move NE
    assert runs[0]["ne_expected"] == runs[1]["ne_expected"]  # and not the expected NE
    # its definition: cross-entropy of the predictions against the true probabilities, over the entropy of
    # their mean (torchrec's NE with soft labels)
    pt, q = p_true.float().double(), model.float().double()
    h = lambda a, b: -(a * torch.log2(b) + (1 - a) * torch.log2(1 - b))
    rate = pt.mean()
    assert abs(runs[0]["ne_expected"] - float(h(pt, q).sum() / (n * h(rate, rate)))) < 1e-6
    # the true probabilities themselves score the least
    assert runs[0]["ne_expected"] > float(h(pt, pt).sum() / (n * h(rate, rate)))
