"""Small building blocks shared by the model's parts: norm, MLP, the matmul FLOP rule."""

from __future__ import annotations

import torch
from torch import nn


def linear_flops(layer: nn.Linear, tokens: int) -> int:
    """Forward FLOPs of a linear layer over ``tokens`` rows: ``2 * m * n * k``."""
    return 2 * tokens * layer.in_features * layer.out_features


class Norm(nn.LayerNorm):
    precision_kind = "norm"


class MLP(nn.Module):
    """``d -> hidden -> out`` (GELU); also the expert of the MoE."""

    precision_kind = "mlp"

    def __init__(self, d: int, hidden: int, out: int | None = None):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, out or d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))

    def flops(self, tokens: int) -> int:
        return linear_flops(self.fc1, tokens) + linear_flops(self.fc2, tokens)
