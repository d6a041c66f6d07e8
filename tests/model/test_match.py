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


def test_gathers_equal_plain_indexing_in_values_and_gradients():
    # The per-event gathers use embedding() (a sorting backward on CUDA); the token and every gradient must
    # equal those of plain indexing, here on random rows including an empty one.
    torch.manual_seed(1)
    offsets = torch.tensor([0, 70, 70, 71, 200])
    table = torch.randn(40, 16, dtype=torch.float64)
    ev = torch.randint(0, 40, (200,))
    cand = torch.randint(0, 40, (4,))
    hist = History(tokens=torch.zeros(200, 8), offsets=offsets, timestamps=None, max_length=256)
    m = TargetMatch([("h.cat", "cat")], d_model=8, positions=16).double()

    def grads(module: TargetMatch, indexing: bool) -> list[torch.Tensor]:
        module.zero_grad()
        hist_ids, cands = table[ev].clone().requires_grad_(), table[cand].clone().requires_grad_()
        if indexing:  # the same token computed with plain indexing
            rows = torch.repeat_interleave(torch.arange(4), offsets.diff())
            c = torch.nn.functional.normalize(cands.float(), dim=-1)  # the token works in fp32, as the module does
            cos = (torch.nn.functional.normalize(hist_ids.float(), dim=-1) * c[rows]).sum(-1)
            g = torch.exp(module.log_beta[0].exp()[None, :] * (cos[:, None] - 1.0))
            ago = (offsets[1:][rows] - 1 - torch.arange(200)).clamp_max(15)
            w = module.log_weight[0][ago].exp()
            x = (g[:, :, None] * w[:, None, :]).reshape(200, -1)
            out = module.proj(torch.log1p(x.new_zeros(4, x.shape[1]).index_add(0, rows, x)))
        else:
            out = module(hist, {"h.cat": hist_ids}, {"cat": cands})
        out.pow(2).sum().backward()
        return [out.detach(), hist_ids.grad, cands.grad, module.log_beta.grad.clone(), module.log_weight.grad.clone()]

    for a, b in zip(grads(m, False), grads(m, True)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
