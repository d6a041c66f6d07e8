"""The jagged sequence encoder: N pre-norm layers (attention + MLP, residual) over a history; never pads.

Each layer picks its own attention locality (full, sliding window or block-local; see
`ModelConfig.layer_attention`), so a stack can window its first layers and run later ones block-local.
With ``attention_impl: padded`` the encoder pads the history once to the batch's longest row and runs
every layer on the padded box (the baseline that measures what jagged processing saves).
"""

from __future__ import annotations

import torch
from torch import nn

from model.attention import SelfAttention
from model.config import ModelConfig
from model.embeddings import History, row_index
from model.layers import MLP, Norm, linear_flops
from model.padded import PaddedLayout


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, kind: str, window: int | None, block_size: int | None):
        super().__init__()
        d = cfg.d_model
        self.norm_attn = Norm(d)
        self.attn = SelfAttention(cfg, kind, window, block_size)
        self.norm_mlp = Norm(d)
        self.mlp = MLP(d, cfg.sequence_encoder.mlp_ratio * d)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, hist: History, layout: PaddedLayout | None = None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm_attn(x), hist, layout))
        return x + self.drop(self.mlp(self.norm_mlp(x)))


class SequenceEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.padded = cfg.attention_impl == "padded"
        self.layers = nn.ModuleList([EncoderLayer(cfg, kind, w, s) for kind, w, s in cfg.layer_attention()])
        self.norm = Norm(cfg.d_model)

    def forward(self, hist: History) -> History:
        x = hist.tokens
        layout = None
        if self.padded and len(self.layers):
            layout = PaddedLayout.of(hist.offsets, x.shape[0])
            x = layout.pad(x)
        for layer in self.layers:
            x = layer(x, hist, layout)
        if layout is not None:
            x = layout.unpad(x)
        return History(tokens=self.norm(x), offsets=hist.offsets, timestamps=hist.timestamps,
                       max_length=hist.max_length)

    def flops(self, offsets: torch.Tensor, total: int) -> dict[str, int]:
        out = {"attention_proj": 0, "attention_core": 0, "mlp": 0}
        for layer in self.layers:
            a = layer.attn.flops(offsets, total)
            out["attention_proj"] += a["proj"]
            out["attention_core"] += a["core"]
            out["mlp"] += layer.mlp.flops(total)
        return out


class HistorySummary(nn.Module):
    """One token per row summarising the encoded history: its mean and its most recent event, projected."""

    precision_kind = "mlp"

    def __init__(self, d: int):
        super().__init__()
        self.proj = nn.Linear(2 * d, d)

    def forward(self, hist: History) -> torch.Tensor:
        x, offsets = hist.tokens, hist.offsets
        b = offsets.numel() - 1
        lengths = offsets[1:] - offsets[:-1]
        rows = row_index(offsets, x.shape[0])
        mean = x.new_zeros(b, x.shape[1]).index_add(0, rows, x) / lengths.clamp_min(1)[:, None].to(x.dtype)
        has = (lengths > 0)[:, None]
        last = x[(offsets[1:] - 1).clamp_min(0).clamp_max(max(x.shape[0] - 1, 0))] if x.shape[0] else x.new_zeros(b, x.shape[1])
        last = torch.where(has, last, torch.zeros_like(last))
        return self.proj(torch.cat([mean, last], dim=-1))

    def flops(self, batch: int) -> int:
        return linear_flops(self.proj, batch)
