"""Embeddings and input tokens: torchrec EC/EBC lookups, per-event history tokens, non-sequential tokens.

- `ec` (torchrec `EmbeddingCollection`, unpooled): every table a sequence looks up; non-sequential `id`
  features on those tables share them (a candidate ad's category and the history's categories live in
  one space).
- `ebc` (torchrec `EmbeddingBagCollection`, pooled): every other table.

A history event's token is the sum of its projected id embeddings, its projected per-event floats and a
time-gap encoding (learned embeddings of log2-bucketed seconds to the row's latest event and to the
previous event). Non-sequential tokens: one per id feature, one per `float_vector`, one for all scalar
floats together. Everything is `d_model` wide.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from features.schema import FeatureSchema, SequenceSpec
from features.torchrec_configs import embedding_bag_configs, embedding_configs, pooled_keys, unpooled_keys
from kernels.attention_spec import time_bucket
from model.config import ModelConfig, ModelConfigError


@dataclass
class History:
    """One encoded-or-raw jagged history: tokens ``[ΣL, d]``, offsets ``[B+1]``, optional timestamps ``[ΣL]``."""

    tokens: torch.Tensor
    offsets: torch.Tensor
    timestamps: torch.Tensor | None
    max_length: int  # the schema's upper bound of a row's length (no device sync needed)
    # Raw (unprojected) table embeddings: the events' ids per KJT key ``[ΣL, dim]`` and the
    # non-sequential id features per name ``[B, dim]`` (for target matching); empty once encoded.
    ids: dict[str, torch.Tensor] = field(default_factory=dict)
    targets: dict[str, torch.Tensor] = field(default_factory=dict)


def row_index(offsets: torch.Tensor, total: int) -> torch.Tensor:
    """Row of each jagged token, ``[ΣL]`` (output_size given, so no device sync)."""
    lengths = offsets[1:] - offsets[:-1]
    rows = torch.arange(lengths.numel(), device=offsets.device)
    return torch.repeat_interleave(rows, lengths, output_size=total)


class SequenceTokenizer(nn.Module):
    """Per-event tokens of one sequence from its id embeddings, floats and timestamps."""

    precision_kind = "embedding"

    def __init__(self, seq: SequenceSpec, schema: FeatureSchema, d_model: int, time_buckets: int,
                 recency_positions: int = 0):
        super().__init__()
        self.name = seq.name
        self.keys = [seq.key(f.name) for f in seq.id_fields]
        self.id_proj = nn.ModuleDict({
            f.name: nn.Linear(schema.table(f.table).dim, d_model, bias=False) for f in seq.id_fields  # type: ignore[arg-type]
        })
        self.num_floats = len(seq.float_fields)
        self.float_proj = nn.Linear(self.num_floats, d_model) if self.num_floats else None
        self.has_time = seq.timestamp_field is not None
        self.time_buckets = time_buckets
        if self.has_time:
            self.gap_to_last = nn.Embedding(time_buckets, d_model)
            self.gap_to_prev = nn.Embedding(time_buckets, d_model)
        self.recency = nn.Embedding(recency_positions, d_model) if recency_positions else None
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, ids: dict[str, torch.Tensor], floats: torch.Tensor | None, offsets: torch.Tensor,
                timestamps: torch.Tensor | None) -> torch.Tensor:
        parts = [proj(ids[key]) for key, proj in zip(self.keys, self.id_proj.values())]
        if self.float_proj is not None and floats is not None:
            parts.append(self.float_proj(floats))
        if self.has_time and timestamps is not None:
            parts.append(self.time_encoding(timestamps, offsets))
        if self.recency is not None:
            parts.append(self.recency_encoding(offsets, parts[0].shape[0] if parts else 0))
        x = parts[0]
        for p in parts[1:]:
            x = x + p
        return x + self.bias

    def recency_encoding(self, offsets: torch.Tensor, total: int) -> torch.Tensor:
        """Embedding of how many events ago each event happened (0 = the row's latest), clipped."""
        assert self.recency is not None
        rows = row_index(offsets, total)
        ago = offsets[1:][rows] - 1 - torch.arange(total, device=offsets.device)
        return self.recency(ago.clamp_max(self.recency.num_embeddings - 1))

    def time_encoding(self, ts: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        total = ts.shape[0]
        rows = row_index(offsets, total)
        latest = torch.full((offsets.numel() - 1,), torch.iinfo(torch.int64).min, dtype=ts.dtype, device=ts.device)
        latest = latest.scatter_reduce(0, rows, ts, reduce="amax", include_self=True)
        prev = torch.cat([ts[:1], ts[:-1]])
        first = rows != torch.cat([rows.new_full((1,), -1), rows[:-1]])  # a row's first event has no previous
        prev = torch.where(first, ts, prev)
        return (self.gap_to_last(time_bucket(latest[rows] - ts, self.time_buckets))
                + self.gap_to_prev(time_bucket(ts - prev, self.time_buckets)))


class GEMEmbeddings(nn.Module):
    """torchrec lookups plus the token projections; ``forward`` -> (histories, non-sequential tokens)."""

    precision_kind = "embedding"

    def __init__(self, schema: FeatureSchema, cfg: ModelConfig, device: torch.device | str | None = None):
        super().__init__()
        self.schema = schema
        d = cfg.d_model
        ec_cfgs = embedding_configs(schema)
        dims = {c.embedding_dim for c in ec_cfgs}
        if len(dims) > 1:
            detail = ", ".join(f"{c.name}: {c.embedding_dim}" for c in ec_cfgs)
            raise ModelConfigError(
                f"schema {schema.source}: tables looked up by a sequence must share one dim (torchrec's "
                f"EmbeddingCollection needs it); got {detail}. Give these tables the same `dim`."
            )
        dev = torch.device(device) if device is not None else None
        self.ec = EmbeddingCollection(tables=ec_cfgs, device=dev) if ec_cfgs else None
        ebc_cfgs = embedding_bag_configs(schema)
        self.ebc = EmbeddingBagCollection(tables=ebc_cfgs, device=dev) if ebc_cfgs else None
        self.unpooled = unpooled_keys(schema)
        self.pooled = pooled_keys(schema)
        self.ec_single = {f.name for f in schema.id_features if f.name in self.unpooled}  # one id per row
        for mod in (self.ec, self.ebc):
            if mod is not None:
                mod.precision_kind = "embedding"

        self.sequences = nn.ModuleDict({
            s.name: SequenceTokenizer(s, schema, d, cfg.sequence_encoder.time_gap_buckets,
                                      cfg.sequence_encoder.recency_positions)
            for s in schema.sequences
        })
        # Non-sequential tokens, in schema feature order; scalar floats share one token at the end.
        self.id_proj = nn.ModuleDict({
            f.name: nn.Linear(schema.table(f.table).dim, d) for f in schema.id_features  # type: ignore[arg-type]
        })
        self.dense_slices: dict[str, tuple[int, int]] = {}
        scalar_cols: list[int] = []
        j = 0
        for f in schema.dense_features:
            width = f.dim if f.type == "float_vector" else 1
            if f.type == "float_vector":
                self.dense_slices[f.name] = (j, j + width)
            else:
                scalar_cols.append(j)
            j += width
        self.vector_proj = nn.ModuleDict({n: nn.Linear(b - a, d) for n, (a, b) in self.dense_slices.items()})
        self.register_buffer("scalar_cols", torch.tensor(scalar_cols, dtype=torch.long), persistent=False)
        self.scalar_proj = nn.Linear(len(scalar_cols), d) if scalar_cols else None
        self.num_tokens = len(self.id_proj) + len(self.vector_proj) + (1 if scalar_cols else 0)
        if self.num_tokens == 0:
            raise ModelConfigError(f"schema {schema.source}: no non-sequential features; the model needs at "
                                   "least one (an id, a float or a float_vector) to attend from")

    def lookup(self, sparse: KeyedJaggedTensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(unpooled values per key ``[Σn, dim]``, pooled values per key ``[B, dim]``).

        A non-sequential ``id`` on an EC table (the schema allows no ``id_list`` there) has exactly one id
        per row, so its unpooled values are already ``[B, dim]``.
        """
        unpooled: dict[str, torch.Tensor] = {}
        pooled: dict[str, torch.Tensor] = {}
        if self.ec is not None:
            for key, jt in self.ec(sparse).items():
                if key in self.ec_single:
                    pooled[key] = jt.values().view(jt.lengths().numel(), -1)
                else:
                    unpooled[key] = jt.values()
        if self.ebc is not None:
            pooled.update(self.ebc(sparse).to_dict())
        return unpooled, pooled

    def forward(self, batch) -> tuple[list[History], torch.Tensor]:
        """-> (one raw `History` per sequence, non-sequential tokens ``[B, N, d]``)."""
        unpooled, pooled = self.lookup(batch.sparse)
        histories = []
        for seq in self.schema.sequences:
            offsets = batch.seq_offsets[seq.name]
            ts = batch.seq_timestamps.get(seq.name)
            floats = batch.seq_floats.get(seq.name)
            tokens = self.sequences[seq.name](unpooled, floats, offsets, ts)
            ids = {k: unpooled[k] for k in self.sequences[seq.name].keys}
            histories.append(History(tokens=tokens, offsets=offsets, timestamps=ts, max_length=seq.max_length,
                                     ids=ids, targets=pooled))

        toks = []
        for name, proj in self.id_proj.items():
            toks.append(proj(pooled[name]))
        dense = batch.dense
        for name, proj in self.vector_proj.items():
            a, z = self.dense_slices[name]
            toks.append(proj(dense[:, a:z]))
        if self.scalar_proj is not None:
            toks.append(self.scalar_proj(dense.index_select(1, self.scalar_cols)))
        return histories, torch.stack(toks, dim=1)
