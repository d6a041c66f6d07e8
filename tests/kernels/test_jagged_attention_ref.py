"""The PyTorch reference of jagged attention against a per-query loop written from the documented rules."""

import math

import pytest
import torch
import torch.nn.functional as F

from kernels import AttentionError, RelativeBias, jagged_attention, jagged_attention_flops
from kernels.attention_flops import visible_pairs

H, D = 2, 8
LQ = [3, 0, 5, 1, 4, 2]
LK = [3, 2, 7, 1, 4, 0]
NT = [1, 0, 2, 0, 1, 0]


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])


def _visible(b: int, i: int, causal: bool, block: int | None, window: int | None) -> list[int]:
    p = LK[b] - LQ[b] + i
    hist = LK[b] - NT[b]
    keys = []
    for j in range(LK[b]):
        ok = (j < hist or j == p) and (not causal or j <= p)
        if block:
            ok = ok and p >= 0 and j // block == p // block
        if window is not None:
            ok = ok and p - window <= j <= (p if causal else p + window)
        if ok:
            keys.append(j)
    return keys


def _loop(q, k, v, bias, act, causal, block, window):
    qo, ko = _offsets(LQ), _offsets(LK)
    out = torch.zeros_like(q)
    for b in range(len(LQ)):
        for i in range(LQ[b]):
            keys = _visible(b, i, causal, block, window)
            if not keys:
                continue
            p = LK[b] - LQ[b] + i
            qi, kj = int(qo[b]) + i, int(ko[b]) + torch.tensor(keys)
            s = (k[kj] * q[qi]).sum(-1) / math.sqrt(D)
            rel = torch.tensor([p - j for j in keys])
            s = s + bias.pos_weight[rel.clamp(-4, 4) + 4]
            dt = (bias.q_timestamps[qi] - bias.kv_timestamps[kj]).abs() + 1
            s = s + bias.time_weight[torch.floor(torch.log2(dt.double())).long().clamp(0, 5)]
            if act == "softmax":
                a = torch.softmax(s, 0)
            else:
                a = (F.silu(s) if act == "silu" else F.gelu(s, approximate="tanh")) / LK[b]
            out[qi] = (a[:, :, None] * v[kj]).sum(0)
    return out


@pytest.mark.parametrize("act", ["softmax", "silu", "gelu"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block,window", [(None, None), (2, None), (None, 2)])
def test_reference_matches_per_query_loop(act, causal, block, window):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(sum(LQ), H, D, dtype=torch.float64, generator=g)
    k = torch.randn(sum(LK), H, D, dtype=torch.float64, generator=g)
    v = torch.randn(sum(LK), H, D, dtype=torch.float64, generator=g)
    bias = RelativeBias(
        pos_weight=torch.randn(9, H, dtype=torch.float64, generator=g),
        time_weight=torch.randn(6, H, dtype=torch.float64, generator=g),
        q_timestamps=torch.randint(0, 100, (sum(LQ),), generator=g),
        kv_timestamps=torch.randint(0, 100, (sum(LK),), generator=g),
    )
    out = jagged_attention(q, k, v, _offsets(LQ), _offsets(LK), activation=act, causal=causal, bias=bias,
                           block_size=block, window=window, num_targets=torch.tensor(NT))
    torch.testing.assert_close(out, _loop(q, k, v, bias, act, causal, block, window), rtol=1e-12, atol=1e-12)
    pairs = sum(len(_visible(b, i, causal, block, window)) for b in range(len(LQ)) for i in range(LQ[b]))
    assert visible_pairs(_offsets(LQ), _offsets(LK), causal=causal, block_size=block, window=window,
                         num_targets=torch.tensor(NT)) == pairs
    assert jagged_attention_flops(_offsets(LQ), _offsets(LK), H, D, causal=causal, block_size=block,
                                  window=window, num_targets=torch.tensor(NT)) == 4 * pairs * D * H


def test_reference_gradients_reach_bias_tables():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(sum(LQ), H, D, generator=g, requires_grad=True)
    k = torch.randn(sum(LK), H, D, generator=g)
    pos = torch.randn(9, H, generator=g, requires_grad=True)
    bias = RelativeBias(pos_weight=pos)
    jagged_attention(q, k, k, _offsets(LQ), _offsets(LK), causal=True, bias=bias).square().sum().backward()
    assert q.grad is not None and pos.grad is not None and pos.grad.abs().sum() > 0


def test_bad_inputs_raise_attention_error():
    q = torch.randn(4, H, D)
    with pytest.raises(AttentionError, match="end at 4"):
        jagged_attention(q, q, q, torch.tensor([0, 3]), torch.tensor([0, 3]))
    with pytest.raises(AttentionError, match="activation"):
        jagged_attention(q, q, q, torch.tensor([0, 4]), torch.tensor([0, 4]), activation="relu")
    with pytest.raises(AttentionError, match="pos_weight"):
        jagged_attention(q, q, q, torch.tensor([0, 4]), torch.tensor([0, 4]),
                         bias=RelativeBias(pos_weight=torch.zeros(5, H + 1)))
