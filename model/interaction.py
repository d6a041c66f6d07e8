"""Feature interaction over the token set (non-sequential tokens + history summaries).

- ``wukong`` (Wukong, Zhang et al. 2024): each layer maps ``N`` tokens to ``fm_tokens + lcb_tokens``
  tokens: a factorization-machine block (pairwise dot products of the tokens against a rank-``k``
  projection of them, ``X (X^T P)``, flattened, through an MLP) next to a linear compression block (a
  learned mix of the tokens), plus a residual and LayerNorm.
- ``dcn`` (DCN-v2, low-rank): cross layers ``x_{l+1} = x_0 * (U V x_l + b) + x_l`` on the flattened tokens.
- ``none``: the tokens, flattened.

``forward(tokens [B, N, d]) -> [B, out_dim]``.
"""

from __future__ import annotations

import torch
from torch import nn

from model.config import InteractionConfig
from model.layers import Norm, linear_flops


class WukongLayer(nn.Module):
    def __init__(self, n_in: int, d: int, cfg: InteractionConfig):
        super().__init__()
        self.n_in, self.n_out, self.d = n_in, cfg.fm_tokens + cfg.lcb_tokens, d
        self.fm_tokens = cfg.fm_tokens
        self.fm_proj = nn.Parameter(torch.randn(n_in, cfg.fm_rank) / n_in ** 0.5)
        self.fm_norm = Norm(n_in * cfg.fm_rank)
        self.fm_mlp1 = nn.Linear(n_in * cfg.fm_rank, cfg.mlp_dim)
        self.fm_act = nn.GELU()
        self.fm_mlp2 = nn.Linear(cfg.mlp_dim, cfg.fm_tokens * d)
        self.lcb = nn.Parameter(torch.randn(n_in, cfg.lcb_tokens) / n_in ** 0.5)
        self.residual = nn.Parameter(torch.randn(n_in, self.n_out) / n_in ** 0.5) if n_in != self.n_out else None
        self.norm = Norm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        compressed = torch.einsum("bnd,nk->bkd", x, self.fm_proj.to(x.dtype))  # [B, k, d]
        inter = torch.einsum("bnd,bkd->bnk", x, compressed).reshape(b, -1)  # [B, N*k]
        fm = self.fm_mlp2(self.fm_act(self.fm_mlp1(self.fm_norm(inter)))).view(b, self.fm_tokens, self.d)
        lcb = torch.einsum("bnd,nm->bmd", x, self.lcb.to(x.dtype))
        res = x if self.residual is None else torch.einsum("bnd,nm->bmd", x, self.residual.to(x.dtype))
        return self.norm(torch.cat([fm.to(lcb.dtype), lcb], dim=1) + res)

    def flops(self, batch: int) -> int:
        n, k, d = self.n_in, self.fm_proj.shape[1], self.d
        f = 2 * batch * n * k * d * 2  # compression and the pairwise products
        f += linear_flops(self.fm_mlp1, batch) + linear_flops(self.fm_mlp2, batch)
        f += 2 * batch * n * self.lcb.shape[1] * d
        if self.residual is not None:
            f += 2 * batch * n * self.n_out * d
        return f


class DCNLayer(nn.Module):
    def __init__(self, width: int, rank: int):
        super().__init__()
        self.v = nn.Linear(width, rank, bias=False)
        self.u = nn.Linear(rank, width)

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x0 * self.u(self.v(x)) + x

    def flops(self, batch: int) -> int:
        return linear_flops(self.v, batch) + linear_flops(self.u, batch)


class Interaction(nn.Module):
    precision_kind = "interaction"

    def __init__(self, num_tokens: int, d: int, cfg: InteractionConfig):
        super().__init__()
        self.kind = cfg.kind
        self.layers = nn.ModuleList()
        n = num_tokens
        if cfg.kind == "wukong":
            for _ in range(cfg.num_layers):
                layer = WukongLayer(n, d, cfg)
                self.layers.append(layer)
                n = layer.n_out
        elif cfg.kind == "dcn":
            for _ in range(cfg.num_layers):
                self.layers.append(DCNLayer(n * d, cfg.dcn_rank))
        self.out_dim = n * d

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b = tokens.shape[0]
        if self.kind == "dcn":
            x0 = tokens.reshape(b, -1)
            x = x0
            for layer in self.layers:
                x = layer(x0, x)
            return x
        x = tokens
        for layer in self.layers:
            x = layer(x)
        return x.reshape(b, -1)

    def flops(self, batch: int) -> int:
        return sum(layer.flops(batch) for layer in self.layers)
