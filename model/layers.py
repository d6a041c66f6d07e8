"""Small building blocks shared by the model's parts: norm, MLP, the matmul FLOP rule."""

from __future__ import annotations

import torch
from torch import nn

from kernels import fp8_mlp


def linear_flops(layer: nn.Linear, tokens: int) -> int:
    """Forward FLOPs of a linear layer over ``tokens`` rows: ``2 * m * n * k``."""
    return 2 * tokens * layer.in_features * layer.out_features


def split_projection(layer: nn.Module, x: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
    """``layer(x)`` cut into ``parts`` equal column blocks, each a contiguous tensor.

    A plain ``nn.Linear`` runs as one GEMM per block on row blocks of its weight: slices of one wide
    output (``qkv[:, 0]``) are strided, and the attention kernels need contiguous q, k, v, which costs
    a strided copy per slice forward and another backward. The input is cast to the autocast dtype
    once, not once per GEMM. Other layers (an FP8 linear) run whole and are sliced.
    """
    if type(layer) is not nn.Linear:
        return tuple(layer(x).chunk(parts, dim=-1))
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        x = x.to(torch.get_autocast_dtype(dev))
    ws = layer.weight.chunk(parts, dim=0)
    bs = layer.bias.chunk(parts) if layer.bias is not None else (None,) * parts
    return tuple(nn.functional.linear(x, w, b) for w, b in zip(ws, bs))


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
        if fp8_mlp.fusable(self.fc1, self.act, self.fc2):  # FP8 layers whose casts can take the GELU
            return fp8_mlp.gelu_mlp(x, self.fc1, self.fc2)
        return self.fc2(self.act(self.fc1(x)))

    def flops(self, tokens: int) -> int:
        return linear_flops(self.fc1, tokens) + linear_flops(self.fc2, tokens)
