"""split_projection: the same values and gradients as the whole linear, in contiguous blocks."""

import torch
from torch import nn

from model.layers import split_projection


def test_split_projection_matches_the_whole_linear_and_its_gradients():
    torch.manual_seed(0)
    lin = nn.Linear(16, 24)
    x = torch.randn(10, 16, requires_grad=True)
    parts = split_projection(lin, x, 3)
    assert all(p.shape == (10, 8) and p.is_contiguous() for p in parts)
    ref = lin(x)
    torch.testing.assert_close(torch.cat(parts, dim=1), ref)
    g = torch.randn_like(ref)
    grads = torch.autograd.grad(torch.cat(parts, dim=1).mul(g).sum(), (x, lin.weight, lin.bias))
    ref_grads = torch.autograd.grad(ref.mul(g).sum(), (x, lin.weight, lin.bias))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)


def test_split_projection_casts_once_under_autocast_and_passes_other_layers_whole():
    lin = nn.Linear(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = split_projection(lin, torch.randn(4, 8), 2)
    assert a.dtype == b.dtype == torch.bfloat16

    class Scaled(nn.Linear):  # a subclass (as an FP8 linear is) runs through its own forward
        def forward(self, x):
            return 2 * super().forward(x)

    s = Scaled(8, 8)
    x = torch.randn(4, 8)
    torch.testing.assert_close(torch.cat(split_projection(s, x, 2), dim=1), 2 * nn.Linear.forward(s, x))
