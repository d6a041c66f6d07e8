"""`TargetMatch`: the target-aware token counts history events whose id equals the candidate's."""

from __future__ import annotations

import torch

from model.embeddings import History
from model.match import TargetMatch, match_pairs
from tests.model.helpers import tiny_schema


def test_pairs_are_the_shared_tables():
    schema = tiny_schema()
    assert match_pairs(schema, schema.sequences[0]) == [("history.item_category", "ad_category")]


def test_counts_recent_matches_per_row():
    torch.manual_seed(0)
    table = torch.randn(50, 16)
    m = TargetMatch([("h.cat", "cat")], d_model=8)
    # row 0: 3 events, two match the candidate; row 1: empty; row 2: 2 events, none match
    ev = torch.tensor([3, 7, 3, 4, 5])
    offsets = torch.tensor([0, 3, 3, 5])
    cand = torch.tensor([3, 9, 6])
    hist = History(tokens=torch.zeros(5, 8), offsets=offsets, timestamps=None, max_length=8)
    feats = {}
    m.proj.register_forward_hook(lambda _mod, inp, _out: feats.setdefault("x", inp[0]))
    out = m(hist, {"h.cat": table[ev]}, {"cat": table[cand]})
    x = feats["x"]
    assert out.shape == (3, 8)
    assert torch.all(x[1] == 0)  # an empty history adds nothing
    assert torch.all(x[0] > 0.5) and torch.all(x[2] < 0.2)  # matches counted, non-matches near 0
    # the most recent match weighs more than an older one: moving the match to the latest event grows it
    ev2 = torch.tensor([7, 3, 3, 4, 5])
    feats.clear()
    m(hist, {"h.cat": table[ev2]}, {"cat": table[cand]})
    assert torch.all(feats["x"][0] >= x[0] - 1e-6)
    out.sum().backward()
    assert m.log_beta.grad is not None and m.log_weight.grad is not None
