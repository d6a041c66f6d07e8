"""MoE: top-k routing, gate-weighted expert mix, load-balance loss."""

from __future__ import annotations

import torch

from model.moe import MoE


def _moe(**kw) -> MoE:
    torch.manual_seed(0)
    return MoE(d=8, hidden=16, num_experts=4, top_k=2, load_balance_weight=1.0, **kw)


def test_output_is_the_gate_weighted_mix_of_the_top_k_experts():
    moe = _moe()
    x = torch.randn(10, 8)
    y, _ = moe(x)
    probs = torch.softmax(moe.router(x), dim=-1)
    top_p, top_i = probs.topk(2, dim=-1)
    want = torch.zeros_like(y)
    for n in range(10):
        for j in range(2):
            want[n] += top_p[n, j] / top_p[n].sum() * moe.experts[int(top_i[n, j])](x[n:n + 1])[0]
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    idx, gates, _ = moe.route(x)
    assert idx.shape == (10, 2) and (idx[:, 0] != idx[:, 1]).all()
    torch.testing.assert_close(gates.sum(-1), torch.ones(10))


def test_load_balance_loss_is_one_when_uniform_and_larger_when_collapsed():
    moe = _moe()
    x = torch.randn(64, 8)
    with torch.no_grad():
        moe.router.weight.zero_()
    _, aux_uniform = moe(x)
    torch.testing.assert_close(aux_uniform, torch.tensor(1.0))
    with torch.no_grad():  # every token prefers experts 0 and 1
        moe.router.weight.zero_()
        moe.router.weight[0] = 5.0
        moe.router.weight[1] = 4.0
    x = x.abs() + 0.1
    _, aux_collapsed = moe(x)
    assert aux_collapsed > 1.5
    moe.zero_grad()
    aux_collapsed.backward()
    assert moe.router.weight.grad.abs().sum() > 0  # the aux loss trains the router


def test_weight_scales_aux_and_gradients_reach_experts_and_router():
    moe = MoE(d=8, hidden=16, num_experts=3, top_k=1, load_balance_weight=0.01)
    x = torch.randn(20, 8, requires_grad=True)
    y, aux = moe(x)
    assert 0.0 < float(aux) <= 0.03 + 1e-6  # weight * E at most
    y.pow(2).sum().backward()
    assert moe.router.weight.grad.abs().sum() > 0  # through the gates
    used = {int(i) for i in moe.route(x)[0].flatten()}
    for e in used:
        assert moe.experts[e].fc1.weight.grad.abs().sum() > 0
    assert x.grad.abs().sum() > 0


def test_empty_input():
    y, aux = _moe()(torch.zeros(0, 8))
    assert y.shape == (0, 8) and float(aux) == 0.0
