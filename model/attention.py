"""Attention blocks of the model: jagged self-attention over a history and target-aware cross attention.

Both call ``kernels.jagged_attention`` (Triton on CUDA, the PyTorch reference on CPU) on jagged
``[ΣL, H, D]`` tensors. In padded mode (``attention_impl: padded``) self-attention gets tokens already
padded to ``[B * Lmax, d]`` by the encoder and runs SDPA; cross attention pads its keys itself.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels import RelativeBias, jagged_attention
from model.config import ModelConfig
from model.embeddings import History
from model.layers import MLP, Norm, linear_flops, split_projection
from model.padded import PaddedLayout, padded_attention, sdpa_attention


class SelfAttention(nn.Module):
    """Multi-head self-attention over jagged rows, with block/window locality and relative bias."""

    precision_kind = "attention"

    def __init__(self, cfg: ModelConfig, kind: str, window: int | None, block_size: int | None):
        super().__init__()
        enc = cfg.sequence_encoder
        d, h = cfg.d_model, cfg.num_heads
        self.heads, self.head_dim = h, d // h
        self.kind, self.window, self.block_size = kind, window, block_size
        self.activation, self.causal = enc.activation, enc.causal
        # "fp8" / "fp8_fwd_bwd" (kernels.jagged_attention), "fp8_qkv" (kernels.qkv_fp8: the projection writes the
        # FP8 attention's operands); set by the precision policy
        self.attention_precision = "bf16"
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        b = enc.bias
        # Zero-initialised tables: training starts from plain attention and learns the bias.
        self.pos_weight = nn.Parameter(torch.zeros(b.num_position_buckets, h)) if b.position else None
        self.time_weight = nn.Parameter(torch.zeros(b.num_time_buckets, h)) if b.time else None

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = split_projection(self.qkv, x, 3)
        return tuple(t.reshape(-1, self.heads, self.head_dim) for t in (q, k, v))

    def forward(self, x: torch.Tensor, hist: History, layout: PaddedLayout | None = None) -> torch.Tensor:
        """``x [ΣL, d]`` (jagged) or ``[B * Lmax, d]`` (padded, with ``layout``) -> same shape."""
        ts = hist.timestamps if self.time_weight is not None else None
        if self.attention_precision == "fp8_qkv" and layout is None:
            return self.out(self._projected(x, hist, ts).reshape(x.shape[0], -1))
        q, k, v = self._split(x)
        if layout is None:
            bias = None
            if self.pos_weight is not None or ts is not None:
                bias = RelativeBias(pos_weight=self.pos_weight, time_weight=self.time_weight if ts is not None
                                    else None, q_timestamps=ts, kv_timestamps=ts)
            y = jagged_attention(q, k, v, hist.offsets, hist.offsets, activation=self.activation,
                                 causal=self.causal, bias=bias, block_size=self.block_size, window=self.window,
                                 max_q_len=hist.max_length, max_kv_len=hist.max_length,
                                 precision=self.attention_precision)
        else:
            shape = (layout.batch, layout.max_len, self.heads, self.head_dim)
            pts = layout.pad(ts).view(layout.batch, layout.max_len) if ts is not None else None
            y = sdpa_attention(q.reshape(shape), k.reshape(shape), v.reshape(shape), layout.lengths,
                               layout.lengths, activation=self.activation, causal=self.causal,
                               pos_weight=self.pos_weight, time_weight=self.time_weight if ts is not None else None,
                               q_ts=pts, kv_ts=pts, block_size=self.block_size, window=self.window,
                               same_lengths=True)
        return self.out(y.reshape(x.shape[0], -1))

    def _projected(self, x: torch.Tensor, hist: History, ts: torch.Tensor | None) -> torch.Tensor:
        """Projection and attention in one FP8 step (``kernels.qkv_fp8.projected_attention``)."""
        from kernels.qkv_fp8 import projected_attention

        if self.activation != "softmax":
            raise ValueError(f"attention_kernel fp8_qkv needs softmax attention (V's bias joins the output), this "
                             f"layer's activation is {self.activation!r}: use attention_kernel fp8 for it")
        return projected_attention(
            x, self.qkv.weight, self.qkv.bias, hist.offsets, self.heads, causal=self.causal,
            pos_weight=self.pos_weight, time_weight=self.time_weight if ts is not None else None, timestamps=ts,
            block_size=self.block_size, window=self.window, max_len=hist.max_length,
            dtype=torch.bfloat16 if x.is_cuda else torch.float32)  # fp32 on CPU: the interpreter's bf16 is wrong

    def flops(self, offsets: torch.Tensor, total: int) -> dict[str, int]:
        from kernels import jagged_attention_flops

        core = jagged_attention_flops(offsets, offsets, self.heads, self.head_dim, causal=self.causal,
                                      block_size=self.block_size, window=self.window)
        return {"proj": linear_flops(self.qkv, total) + linear_flops(self.out, total), "core": core}


class TargetCrossAttention(nn.Module):
    """The non-sequential tokens (candidate ad, user, creative...) attend over an encoded history.

    Queries: ``N`` tokens per row; keys/values: the row's history (any length, 0 included, which gives a
    zero update). A residual MLP follows, both pre-norm. The queries sit after the history's last event
    (bottom-right alignment), so the optional relative position bias is a learned recency profile.
    """

    precision_kind = "attention"

    def __init__(self, cfg: ModelConfig, padded: bool):
        super().__init__()
        d, h = cfg.d_model, cfg.num_heads
        self.heads, self.head_dim = h, d // h
        self.activation = cfg.cross_attention.activation
        self.attention_precision = "bf16"  # "fp8" / "fp8_fwd_bwd" (kernels.jagged_attention); "fp8_qkv" runs "fp8"
        self.padded = padded
        self.norm_q, self.norm_kv, self.norm_mlp = Norm(d), Norm(d), Norm(d)
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)
        self.mlp = MLP(d, cfg.sequence_encoder.mlp_ratio * d)
        self.drop = nn.Dropout(cfg.dropout)
        ca = cfg.cross_attention
        self.pos_weight = nn.Parameter(torch.zeros(ca.num_position_buckets, h)) if ca.position_bias else None

    def forward(self, tokens: torch.Tensor, hist: History) -> torch.Tensor:
        b, n, d = tokens.shape
        q = self.q(self.norm_q(tokens)).reshape(b * n, self.heads, self.head_dim)
        k, v = (t.reshape(-1, self.heads, self.head_dim) for t in split_projection(self.kv, self.norm_kv(hist.tokens), 2))
        q_offsets = torch.arange(b + 1, device=tokens.device, dtype=hist.offsets.dtype) * n
        kw = dict(activation=self.activation, causal=False)
        if self.padded:
            y = padded_attention(q, k, v, q_offsets, hist.offsets, pos_weight=self.pos_weight, **kw)
        else:
            bias = RelativeBias(pos_weight=self.pos_weight) if self.pos_weight is not None else None
            # its q and kv projections are apart, so the FP8 projection route is the plain FP8 attention here
            precision = "fp8" if self.attention_precision == "fp8_qkv" else self.attention_precision
            y = jagged_attention(q, k, v, q_offsets, hist.offsets, bias=bias, max_q_len=n,
                                 max_kv_len=hist.max_length, precision=precision, **kw)
        tokens = tokens + self.drop(self.out(y.reshape(b, n, d)))
        return tokens + self.drop(self.mlp(self.norm_mlp(tokens)))

    def flops(self, batch: int, num_tokens: int, offsets: torch.Tensor, total: int) -> dict[str, int]:
        from kernels import jagged_attention_flops

        nq = batch * num_tokens
        q_offsets = torch.arange(batch + 1, dtype=torch.int64) * num_tokens
        core = jagged_attention_flops(q_offsets, offsets, self.heads, self.head_dim)
        proj = linear_flops(self.q, nq) + linear_flops(self.kv, total) + linear_flops(self.out, nq)
        return {"proj": proj, "core": core, "mlp": self.mlp.flops(nq)}
