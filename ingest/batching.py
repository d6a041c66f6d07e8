"""Batch formation inside one shuffle window: fixed size, or a token budget with length-aware grouping.

Token-budget mode bounds each batch by the total history events it holds (each row counted at
most `max_length` per sequence). Rows are grouped GEM-style: sorted by length and dealt to the
batches in a serpentine order (0..n-1, n-1..0, ...), so every batch pairs heavy rows with light
ones and all batches carry about the same number of events; this is what evens the work of the
ranks at each step. A single row over the budget forms its own batch.

How many batches a window gives depends on its rows' lengths, so ranks would get different
batch counts; `split_to` brings every rank of a window to the count the ranks agreed on (the
largest), so distributed steps stay in lockstep.
"""

from __future__ import annotations

import numpy as np


def row_events(lengths_per_sequence: list[np.ndarray], max_lengths: list[int]) -> np.ndarray:
    """Events each row contributes after truncation, summed over sequences."""
    if not lengths_per_sequence:
        return np.zeros(0, dtype=np.int64)
    total = np.zeros(len(lengths_per_sequence[0]), dtype=np.int64)
    for lens, m in zip(lengths_per_sequence, max_lengths):
        total += np.minimum(lens.astype(np.int64), m)
    return total


def token_batches(events: np.ndarray, token_budget: int, max_rows: int) -> list[np.ndarray]:
    """Indices (into `events`) of each batch, in emission order; every index exactly once."""
    n = len(events)
    if n == 0:
        return []
    total = int(events.sum())
    k = max(-(-total // max(1, token_budget)), -(-n // max(1, max_rows)), 1)
    order = np.argsort(-events, kind="stable")
    while True:
        k = min(k, n)
        rounds = np.arange(n) // k
        lane = np.arange(n) % k
        bins = np.where(rounds % 2 == 0, lane, k - 1 - lane)
        load = np.bincount(bins, weights=events[order], minlength=k)
        count = np.bincount(bins, minlength=k)
        # A bin over budget is fine only when it is a single (overlong) row.
        over = ((load > token_budget) & (count > 1)) | (count > max_rows)
        if not over.any() or k == n:
            break
        k = min(n, max(k + 1, int(k * 1.25)))
    members = order[np.argsort(bins, kind="stable")]
    bounds = np.cumsum(count)[:-1]
    # Within a batch keep the window's (shuffled) order.
    return [np.sort(idx) for idx in np.split(members, bounds) if len(idx)]


def split_to(groups: list[np.ndarray], events: np.ndarray, count: int) -> list[np.ndarray]:
    """`groups` (from `token_batches`) split until there are `count` of them (ranks agree on a
    common count so that their steps stay in lockstep).

    The heaviest group of two or more rows is split in two, its rows dealt alternately by weight
    (heavy with light), in place, so the order of the other batches is kept; a subset never breaks
    the budget or the row cap. When no group has two rows left, the remaining batches are empty.
    Deterministic: the same groups and count always give the same batches.
    """
    out = list(groups)
    while len(out) < count:
        loads = [int(events[g].sum()) if len(g) > 1 else -1 for g in out]
        i = int(np.argmax(loads)) if out else 0
        if not out or loads[i] < 0:
            out += [np.zeros(0, dtype=np.int64)] * (count - len(out))
            break
        g = out[i]
        by_weight = g[np.argsort(-events[g], kind="stable")]
        out[i:i + 1] = [np.sort(by_weight[0::2]), np.sort(by_weight[1::2])]
    return out
