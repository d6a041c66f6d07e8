"""`TargetMatch`: a target-aware history token that counts recent events matching the candidate.

For every id field of a sequence whose table is shared with a non-sequential ``id`` feature (e.g.
``history.item_category`` and ``ad_category``), each event gets a similarity to the candidate: the cosine
of the two raw table embeddings (no projections, so an exact id match scores 1 from the first step),
sharpened by learnable temperatures, ``g = exp(beta * (cos - 1))``. The events' ``g`` are summed
(pointwise, not softmax: the sum counts matches) with learnable recency weights over "events ago"
buckets (initialised to exponential decays of several scales), and the ``log1p`` of those sums is
projected to one ``d_model`` token.
"""

from __future__ import annotations

import torch
from torch import nn

from features.schema import FeatureSchema, SequenceSpec
from model.embeddings import History, row_index
from model.layers import linear_flops

BETAS = (4.0, 16.0)  # initial sharpness of the match per channel group
TAUS = (2.0, 8.0, 32.0, 128.0)  # initial recency scales (events) of the weight channels


def match_pairs(schema: FeatureSchema, seq: SequenceSpec) -> list[tuple[str, str]]:
    """(sequence KJT key, non-sequential feature) pairs that look up the same table."""
    by_table: dict[str, list[str]] = {}
    for f in schema.id_features:
        if f.type == "id":
            by_table.setdefault(f.table, []).append(f.name)
    return [(seq.key(f.name), feat) for f in seq.id_fields for feat in by_table.get(f.table, [])]


class TargetMatch(nn.Module):
    """One token per row from the candidate/history id matches of the given (key, feature) pairs."""

    precision_kind = "embedding"  # a token made from raw table embeddings, like the input projections

    def __init__(self, pairs: list[tuple[str, str]], d_model: int, positions: int = 64):
        super().__init__()
        self.pairs = pairs
        self.positions = positions
        channels = len(BETAS) * len(TAUS)
        self.log_beta = nn.Parameter(torch.tensor(BETAS).log().repeat(len(pairs), 1))  # [P, nb]
        ago = torch.arange(positions, dtype=torch.float32)[:, None]
        decay = -ago / torch.tensor(TAUS)[None, :]  # [positions, nt]
        self.log_weight = nn.Parameter(decay[None].repeat(len(pairs), 1, 1))  # [P, positions, nt]
        self.proj = nn.Linear(len(pairs) * channels, d_model)
        self.channels = channels

    def forward(self, hist: History, seq_ids: dict[str, torch.Tensor], targets: dict[str, torch.Tensor]
                ) -> torch.Tensor:
        offsets = hist.offsets
        b = offsets.numel() - 1
        feats = []
        for p, (key, feat) in enumerate(self.pairs):
            h = seq_ids[key].float()
            total = h.shape[0]
            rows = row_index(offsets, total)
            c = nn.functional.normalize(targets[feat].float(), dim=-1)
            # Per-event gathers go through embedding(): its CUDA backward splits the thousands of repeats of
            # each row (or recency bucket) into parallel partial sums, where indexing's walks them in sequence.
            cos = (nn.functional.normalize(h, dim=-1) * nn.functional.embedding(rows, c)).sum(-1)  # [ΣL]
            g = torch.exp(self.log_beta[p].exp()[None, :] * (cos[:, None] - 1.0))  # [ΣL, nb]
            ago = (offsets[1:][rows] - 1 - torch.arange(total, device=offsets.device)).clamp_max(self.positions - 1)
            w = nn.functional.embedding(ago, self.log_weight[p]).exp()  # [ΣL, nt]
            x = (g[:, :, None] * w[:, None, :]).reshape(total, -1)  # [ΣL, nb * nt]
            m = x.new_zeros(b, x.shape[1]).index_add(0, rows, x)
            feats.append(torch.log1p(m))
        return self.proj(torch.cat(feats, dim=-1))

    def flops(self, batch: int) -> int:
        return linear_flops(self.proj, batch)
