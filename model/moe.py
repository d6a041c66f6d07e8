"""Mixture-of-experts MLP: top-k routing with the Switch-Transformer load-balance loss.

Interface (an expert-parallel wrapper builds on it from outside): ``router`` (``nn.Linear(d, E)``),
``experts`` (``nn.ModuleList`` of ``MLP(d, hidden, d)``), ``top_k``; ``forward(x [N, d]) -> (y [N, d],
aux_loss)``, where ``aux_loss`` is already multiplied by ``load_balance_weight``. ``route(x)`` gives the
routing alone (expert indices ``[N, k]``, gates ``[N, k]`` summing to 1, aux loss).
"""

from __future__ import annotations

import torch
from torch import nn

from model.layers import MLP


class MoE(nn.Module):
    precision_kind = "mlp"

    def __init__(self, d: int, hidden: int, num_experts: int, top_k: int, load_balance_weight: float = 0.01):
        super().__init__()
        self.num_experts, self.top_k, self.load_balance_weight = num_experts, top_k, load_balance_weight
        self.router = nn.Linear(d, num_experts, bias=False)
        self.router.precision_kind = "head"  # routing decisions stay high precision (never FP8)
        self.experts = nn.ModuleList([MLP(d, hidden, d) for _ in range(num_experts)])

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        probs = torch.softmax(self.router(x).float(), dim=-1)  # [N, E], routing in float32
        top_p, top_i = probs.topk(self.top_k, dim=-1)
        gates = top_p / top_p.sum(dim=-1, keepdim=True)
        # Switch load balance: E * sum_e (fraction of assignments to e) * (mean router prob of e); 1 when uniform.
        counts = torch.zeros(self.num_experts, device=x.device, dtype=torch.float32)
        counts = counts.index_add(0, top_i.reshape(-1), torch.ones(top_i.numel(), device=x.device))
        frac = counts / max(top_i.numel(), 1)
        aux = self.num_experts * (frac * probs.mean(dim=0)).sum() if x.shape[0] else probs.sum() * 0
        return top_i, gates, aux * self.load_balance_weight

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top_i, gates, aux = self.route(x)
        flat_e = top_i.reshape(-1)
        order = torch.argsort(flat_e, stable=True)
        token = order // self.top_k  # the token of each sorted assignment
        sizes = torch.bincount(flat_e, minlength=self.num_experts).tolist()  # one host sync per call
        xs = x.index_select(0, token).split(sizes)
        ys = [expert(chunk) for expert, chunk in zip(self.experts, xs)]
        y = torch.cat(ys, dim=0) * gates.reshape(-1)[order][:, None].to(ys[0].dtype)
        out = y.new_zeros(x.shape[0], y.shape[1]).index_add(0, token, y)
        return out, aux

    def flops(self, tokens: int) -> int:
        """Forward FLOPs for ``tokens`` rows: the router plus ``top_k`` experts per token."""
        e = self.experts[0]
        return 2 * tokens * self.router.in_features * self.num_experts + self.top_k * e.flops(tokens)
