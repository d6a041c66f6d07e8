"""`GEMModel`: embeddings -> jagged sequence encoder -> target-aware cross attention -> interaction ->
top tower (MLP or MoE) -> one head per label.

``forward(batch: JaggedBatch) -> ModelOutput(logits [B, T] float32, aux_loss scalar)``. Shapes come only
from the schema and the `ModelConfig`. Blocks carry ``precision_kind`` ("attention", "mlp",
"interaction", "embedding", "head", "norm") for the precision policy; ``iter_precision_blocks`` lists them.

``forward_flops(batch)``: the forward FLOPs of a batch (matmuls ``2*m*n*k`` over real tokens, attention
through ``kernels.jagged_attention_flops``, embedding lookups 0), per part; ``/ B`` gives per example.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from features.schema import FeatureSchema
from model.attention import TargetCrossAttention
from model.config import ModelConfig
from model.embeddings import GEMEmbeddings
from model.encoder import HistorySummary, SequenceEncoder
from model.interaction import Interaction
from model.layers import MLP, Norm, linear_flops
from model.match import TargetMatch, match_pairs
from model.moe import MoE


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [B, T] float32
    aux_loss: torch.Tensor  # scalar, already weighted (MoE load balance); 0 without MoE


class TopBlock(nn.Module):
    """Pre-norm residual block of the top tower: an MLP, or an MoE when ``moe.num_experts > 0``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.top_dim
        self.norm = Norm(d)
        m = cfg.moe
        self.ffn: nn.Module
        if m.num_experts:
            self.ffn = MoE(d, m.hidden_dim, m.num_experts, m.top_k, m.load_balance_weight)
        else:
            self.ffn = MLP(d, 2 * d)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        y = self.ffn(self.norm(x))
        aux = None
        if isinstance(y, tuple):
            y, aux = y
        return x + self.drop(y), aux

    def flops(self, batch: int) -> int:
        return self.ffn.flops(batch)


class Head(nn.Module):
    precision_kind = "head"

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x))).squeeze(-1)

    def flops(self, batch: int) -> int:
        return linear_flops(self.fc1, batch) + linear_flops(self.fc2, batch)


class GEMModel(nn.Module):
    def __init__(self, schema: FeatureSchema, cfg: ModelConfig, device: torch.device | str | None = None):
        super().__init__()
        self.schema, self.cfg = schema, cfg
        self.embeddings = GEMEmbeddings(schema, cfg, device=device)
        use_history = cfg.use_history and len(schema.sequences) > 0
        self.use_history = use_history
        padded = cfg.attention_impl == "padded"
        names = [s.name for s in schema.sequences] if use_history else []
        self.encoders = nn.ModuleDict({n: SequenceEncoder(cfg) for n in names})
        self.cross = nn.ModuleDict(
            {n: TargetCrossAttention(cfg, padded) for n in names} if cfg.cross_attention.enabled else {})
        self.summaries = nn.ModuleDict({n: HistorySummary(cfg.d_model) for n in names})
        pairs = {s.name: match_pairs(schema, s) for s in schema.sequences if s.name in names}
        self.matches = nn.ModuleDict(
            {n: TargetMatch(p, cfg.d_model, cfg.target_match_positions) for n, p in pairs.items() if p}
            if cfg.target_match else {})
        self.num_tokens = self.embeddings.num_tokens + len(names) + len(self.matches)
        self.interaction = Interaction(self.num_tokens, cfg.d_model, cfg.interaction)
        self.top_in = nn.Linear(self.interaction.out_dim, cfg.top_dim)
        self.top_in.precision_kind = "mlp"
        self.top = nn.ModuleList([TopBlock(cfg) for _ in range(cfg.top_layers)])
        self.top_norm = Norm(cfg.top_dim)
        self.heads = nn.ModuleDict({name: Head(cfg.top_dim, cfg.head_hidden) for name in schema.label_names})
        if device is not None:
            self.to(device)  # the torchrec tables were built there already: a no-op for them

    def forward(self, batch) -> ModelOutput:
        histories, tokens = self.embeddings(batch)
        summaries = []
        if self.use_history:
            for seq, hist in zip(self.schema.sequences, histories):
                encoded = self.encoders[seq.name](hist)
                if seq.name in self.cross:
                    tokens = self.cross[seq.name](tokens, encoded)
                summaries.append(self.summaries[seq.name](encoded))
                if seq.name in self.matches:
                    summaries.append(self.matches[seq.name](hist, hist.ids, hist.targets))
        if summaries:
            tokens = torch.cat([tokens, torch.stack(summaries, dim=1).to(tokens.dtype)], dim=1)
        x = self.top_in(self.interaction(tokens))
        aux = x.new_zeros((), dtype=torch.float32)
        for block in self.top:
            x, block_aux = block(x)
            if block_aux is not None:
                aux = aux + block_aux
        x = self.top_norm(x)
        logits = torch.stack([head(x) for head in self.heads.values()], dim=1).float()
        return ModelOutput(logits=logits, aux_loss=aux)

    # ---- accounting ---------------------------------------------------------------------------
    def forward_flops(self, batch, *, padded: bool = False) -> dict[str, int]:
        """Forward FLOPs of ``batch`` per part (and ``total``); real tokens only, embeddings 0.

        ``padded=True``: the same count as if every history were padded to its batch's longest row
        (the work a padded implementation does, for comparing the two; MFU uses the real count).
        """
        b = int(batch.dense.shape[0])
        offsets = {name: off.detach().to("cpu", torch.int64) for name, off in batch.seq_offsets.items()}
        if padded:
            for name, off in offsets.items():
                longest = int(off.diff().max()) if b else 0
                offsets[name] = torch.arange(b + 1, dtype=torch.int64) * longest
        return self.flops_for_lengths(b, offsets)

    def flops_for_lengths(self, batch: int, seq_offsets: dict[str, torch.Tensor]) -> dict[str, int]:
        """Forward FLOPs of a batch of ``batch`` rows whose sequences have these ``[B+1]`` CPU offsets."""
        out = {"embeddings": 0, "encoder_attention_proj": 0, "encoder_attention_core": 0, "encoder_mlp": 0,
               "cross_attention": 0, "interaction": 0, "top": 0, "heads": 0}
        emb = self.embeddings
        for seq in self.schema.sequences:
            total = int(seq_offsets[seq.name][-1])
            tok = emb.sequences[seq.name]
            out["embeddings"] += sum(linear_flops(p, total) for p in tok.id_proj.values())
            if tok.float_proj is not None:
                out["embeddings"] += linear_flops(tok.float_proj, total)
        out["embeddings"] += sum(linear_flops(p, batch) for p in emb.id_proj.values())
        out["embeddings"] += sum(linear_flops(p, batch) for p in emb.vector_proj.values())
        if emb.scalar_proj is not None:
            out["embeddings"] += linear_flops(emb.scalar_proj, batch)
        for name, enc in self.encoders.items():
            offsets = seq_offsets[name]
            total = int(offsets[-1])
            for key, value in enc.flops(offsets, total).items():
                out[f"encoder_{key}"] += value
            if name in self.cross:
                out["cross_attention"] += sum(self.cross[name].flops(
                    batch, self.embeddings.num_tokens, offsets, total).values())
            out["top"] += self.summaries[name].flops(batch)
            if name in self.matches:
                out["top"] += self.matches[name].flops(batch)
        out["interaction"] = self.interaction.flops(batch)
        out["top"] += linear_flops(self.top_in, batch) + sum(block.flops(batch) for block in self.top)
        out["heads"] = sum(head.flops(batch) for head in self.heads.values())
        out["total"] = sum(out.values())
        return out

    def parameter_counts(self) -> dict[str, int]:
        """Parameters per part: ``sparse`` (torchrec tables) and each dense part."""
        counts: dict[str, int] = {}
        for name, child in self.named_children():
            if name == "embeddings":
                for sub, mod in child.named_children():
                    key = "sparse" if sub in ("ec", "ebc") else "embedding_projections"
                    counts[key] = counts.get(key, 0) + sum(p.numel() for p in mod.parameters())
                continue
            key = {"top_in": "top", "top_norm": "top"}.get(name, name)
            counts[key] = counts.get(key, 0) + sum(p.numel() for p in child.parameters())
        return counts


def iter_precision_blocks(model: nn.Module) -> Iterator[tuple[str, nn.Module, str]]:
    """(qualified name, module, precision_kind) of every module that declares a ``precision_kind``."""
    for name, mod in model.named_modules():
        kind = getattr(mod, "precision_kind", None)
        if kind is not None:
            yield name, mod, kind


def build_model(schema: FeatureSchema, cfg: ModelConfig | dict | None = None,
                device: torch.device | str | None = None) -> GEMModel:
    """The model for ``schema``; ``cfg`` a `ModelConfig` or a plain dict (``ModelConfig.from_dict``)."""
    if cfg is None or isinstance(cfg, dict):
        cfg = ModelConfig.from_dict(cfg or {})
    return GEMModel(schema, cfg, device=device)
