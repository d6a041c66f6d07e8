"""`JaggedBatch`: one training batch, histories kept jagged (values + offsets), never padded.

It is a torchrec `Pipelineable`, so torchrec's train pipelines can move it (`to`, `pin_memory`,
`record_stream`). Layout (B rows, T tasks):

- `sparse`: KeyedJaggedTensor of every id feature, keys in `FeatureSchema.sparse_keys` order.
  A sequence's id fields share the sequence's lengths; a non-sequential `id` has length 1.
  Its per-key totals and offsets are given when it is built (no read back from the GPU in the lookups).
- `seq_offsets[name]`: `[B+1]` int64 offsets of each sequence (equal to the KJT offsets of its id keys).
- `seq_floats[name]`: `[ΣL, k]` float32 per-event floats (k = the sequence's float fields, may be 0).
- `seq_timestamps[name]`: `[ΣL]` int64 event timestamps (seconds), for sequences that declare one.
- `dense`: `[B, F]` float32: float features then flattened float vectors, in schema order.
- `labels`, `label_mask`, `weights`: `[B, T]` float32, in schema label order.
- `row_ids`: `[B]` int64; `metadata`: every other metadata column as a `[B]` tensor.
- `stats`: padding statistics of this batch (`PaddingStats`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable


@dataclass
class SequenceStats:
    """Padding statistics of one sequence over a batch (or a sum of batches)."""

    rows: int = 0
    real_events: int = 0
    padded_batch_max_events: int = 0  # B * max(L) per batch
    padded_schema_max_events: int = 0  # B * max_length
    attn_pairs_real: int = 0  # sum(L^2): attention work is proportional to it
    attn_pairs_padded_batch_max: int = 0  # B * max(L)^2
    attn_pairs_padded_schema_max: int = 0  # B * max_length^2
    truncated_events: int = 0  # events dropped by max_length (oldest first)
    truncated_rows: int = 0  # rows that lost events to max_length

    def __iadd__(self, other: SequenceStats) -> SequenceStats:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    @property
    def padding_waste_batch_max(self) -> float:
        """Fraction of a pad-to-batch-max box that is padding."""
        return 1.0 - self.real_events / self.padded_batch_max_events if self.padded_batch_max_events else 0.0

    @property
    def padding_waste_schema_max(self) -> float:
        return 1.0 - self.real_events / self.padded_schema_max_events if self.padded_schema_max_events else 0.0

    @property
    def attn_saving_batch_max(self) -> float:
        """Padded attention work over real attention work (>= 1)."""
        return self.attn_pairs_padded_batch_max / self.attn_pairs_real if self.attn_pairs_real else 1.0

    @staticmethod
    def of_lengths(lengths: torch.Tensor, max_length: int, truncated: int = 0) -> SequenceStats:
        lengths = lengths.to(torch.int64)
        b = int(lengths.numel())
        mx = int(lengths.max()) if b else 0
        return SequenceStats(
            rows=b,
            real_events=int(lengths.sum()),
            padded_batch_max_events=b * mx,
            padded_schema_max_events=b * max_length,
            attn_pairs_real=int((lengths * lengths).sum()),
            attn_pairs_padded_batch_max=b * mx * mx,
            attn_pairs_padded_schema_max=b * max_length * max_length,
            truncated_events=truncated,
        )

    def to_dict(self) -> dict[str, float]:
        d: dict[str, float] = {f.name: getattr(self, f.name) for f in fields(self)}
        d["padding_waste_batch_max"] = self.padding_waste_batch_max
        d["padding_waste_schema_max"] = self.padding_waste_schema_max
        d["attn_saving_batch_max"] = self.attn_saving_batch_max
        return d


@dataclass
class PaddingStats:
    """Per-sequence `SequenceStats`; adds up across batches with `+=`."""

    sequences: dict[str, SequenceStats] = field(default_factory=dict)

    def __iadd__(self, other: PaddingStats) -> PaddingStats:
        for name, s in other.sequences.items():
            self.sequences.setdefault(name, SequenceStats())
            self.sequences[name] += s
        return self

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {name: s.to_dict() for name, s in self.sequences.items()}


@dataclass
class JaggedBatch(Pipelineable):
    sparse: KeyedJaggedTensor
    seq_offsets: dict[str, torch.Tensor]
    seq_floats: dict[str, torch.Tensor]
    seq_timestamps: dict[str, torch.Tensor]
    dense: torch.Tensor
    labels: torch.Tensor
    label_mask: torch.Tensor
    weights: torch.Tensor
    row_ids: torch.Tensor
    metadata: dict[str, torch.Tensor] = field(default_factory=dict)
    stats: PaddingStats = field(default_factory=PaddingStats)

    @property
    def batch_size(self) -> int:
        return int(self.row_ids.numel())

    def _map(self, fn) -> JaggedBatch:
        return JaggedBatch(
            sparse=fn(self.sparse),
            seq_offsets={k: fn(v) for k, v in self.seq_offsets.items()},
            seq_floats={k: fn(v) for k, v in self.seq_floats.items()},
            seq_timestamps={k: fn(v) for k, v in self.seq_timestamps.items()},
            dense=fn(self.dense),
            labels=fn(self.labels),
            label_mask=fn(self.label_mask),
            weights=fn(self.weights),
            row_ids=fn(self.row_ids),
            metadata={k: fn(v) for k, v in self.metadata.items()},
            stats=self.stats,
        )

    def to(self, device: torch.device, non_blocking: bool = False) -> JaggedBatch:
        return self._map(lambda t: t.to(device=device, non_blocking=non_blocking))

    def pin_memory(self) -> JaggedBatch:
        return self._map(lambda t: t.pin_memory())

    def record_stream(self, stream: torch.Stream) -> None:
        self.sparse.record_stream(stream)
        for t in self._tensors():
            t.record_stream(stream)

    def _tensors(self) -> list[torch.Tensor]:
        out = [self.dense, self.labels, self.label_mask, self.weights, self.row_ids]
        for d in (self.seq_offsets, self.seq_floats, self.seq_timestamps, self.metadata):
            out.extend(d.values())
        return out
