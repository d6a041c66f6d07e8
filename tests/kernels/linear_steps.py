"""One training step of a linear layer for the Fp8Linear tests: outputs and gradients to compare."""

from __future__ import annotations

import torch
from torch import nn


def run(lin: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    """(y, dx, dW, db) of one forward and backward of ``lin`` on ``x`` with output gradient ``dy``."""
    x = x.clone().requires_grad_()
    for p in lin.parameters():
        p.grad = None
    y = lin(x)
    y.backward(dy)
    return y.detach(), x.grad, lin.weight.grad.clone(), lin.bias.grad.clone()
