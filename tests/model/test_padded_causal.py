"""The padded baseline's shared-mask path (causal self-attention without a time bias) equals the per-row path."""

from __future__ import annotations

import pytest
import torch

from model.padded import sdpa_attention


@pytest.mark.parametrize("opts", [{}, {"pos": True}, {"pos": True, "block_size": 4}, {"window": 3}])
def test_shared_causal_mask_equals_per_row_mask(opts):
    torch.manual_seed(0)
    b, lmax, h, d = 3, 11, 2, 8
    lens = torch.tensor([11, 5, 0])
    q, k, v = (torch.randn(b, lmax, h, d, dtype=torch.float64) for _ in range(3))
    q.requires_grad_(True)
    valid = (torch.arange(lmax)[None, :] < lens[:, None])[:, :, None, None]
    pos = torch.randn(9, h, dtype=torch.float64) if opts.get("pos") else None
    kw = dict(causal=True, block_size=opts.get("block_size"), window=opts.get("window"))
    outs, grads = [], []
    for same in (True, False):  # True takes the one-mask-for-all-rows path
        w = pos.clone().requires_grad_(True) if pos is not None else None
        out = sdpa_attention(q, k, v, lens, lens, pos_weight=w, same_lengths=same, **kw)
        assert torch.equal(out * ~valid, torch.zeros_like(out))  # padded queries output zeros
        (out * valid).square().sum().backward()
        outs.append(out)
        grads.append((q.grad.clone(), w.grad if w is not None else None))
        q.grad = None
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(grads[0][0], grads[1][0])
    if pos is not None:
        assert grads[0][1].abs().sum() > 0
        torch.testing.assert_close(grads[0][1], grads[1][1])
