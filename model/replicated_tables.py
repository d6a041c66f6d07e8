"""Replicated embedding tables under data parallelism (`distributed.sparse: replicate`): after backward,
each rank's touched rows are exchanged and averaged (`ReplicatedGradSync`). Used where torchrec's
sharded kernels are missing (a GPU without fbgemm's CUDA kernels); applied by `model.parallelize`.
"""

from __future__ import annotations

import torch
from torch import nn

from features.errors import GemtrainError


class ReplicatedSyncError(GemtrainError, RuntimeError):
    pass


def _nonzero(mask: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the `count` non-zero entries of `mask`; with the count known, without a device sync."""
    try:
        return torch.nonzero_static(mask, size=count).flatten()
    except (NotImplementedError, RuntimeError):  # a build without nonzero_static on this device
        return mask.nonzero().flatten()


class ReplicatedGradSync:
    """Averages the gradients of replicated embedding tables over ranks after backward
    (`distributed.sparse: replicate`, for machines without torchrec's sharded kernels).

    A batch touches few rows of a large table, so only the rows a rank touched travel, with a fixed
    number of collectives and one host read per step whatever the number of tables:
    - `start()` marks each table's rows with a gradient on this rank and all-gathers the per-table
      row counts (one small collective); it returns them, on the device, `[world, tables]`;
    - `finish(counts)` (those counts, read on the host) gathers this rank's rows of every table
      (ids and values, each table padded to the largest count over ranks) into one buffer per
      dtype, all-gathers ids and values once, and forms the average: own rows scaled by 1/world,
      every other rank's rows added with weight 1/world.
    Each rank sends its own rows once (an all-reduce of the union would move the union twice).
    `sync()` does both; `_ClippedOptimizer` reads the counts and the gradient norm in one transfer.
    """

    def __init__(self, params: list[nn.Parameter], group=None, wire_dtype: torch.dtype | None = None):
        import torch.distributed as dist

        self.params = params
        self.group = group
        self.wire_dtype = wire_dtype  # rows travel in this dtype (None: the gradient's own)
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.rows_sent = 0  # rows this rank sent in the last sync (for logs / benchmarks)
        self.rows_received = 0  # rows it received from the other ranks
        self._masks: list[torch.Tensor] | None = None

    def start(self) -> torch.Tensor:
        """Marks this rank's touched rows; returns every rank's per-table row counts `[world, tables]`."""
        import torch.distributed as dist

        masks = []
        for p in self.params:
            g = p.grad
            if g is None:  # every rank must still take part: no rows of this table here
                masks.append(torch.zeros(p.shape[0], dtype=torch.bool, device=p.device))
            else:  # any() reads the float rows directly (no temporary of the table's size)
                masks.append(g.view(g.shape[0], -1).any(dim=1))
        self._masks = masks
        counts = torch.stack([m.sum() for m in masks])
        if self.world == 1:
            return counts.view(1, -1)
        out = torch.empty(self.world * counts.numel(), dtype=counts.dtype, device=counts.device)
        dist.all_gather_into_tensor(out, counts, group=self.group)
        return out.view(self.world, -1)

    def finish(self, counts: list[list[int]]) -> None:
        """Exchanges the touched rows and averages them (`counts`: `start()`'s result on the host)."""
        import torch.distributed as dist

        if self._masks is None:
            raise ReplicatedSyncError("ReplicatedGradSync.finish() called without start(): call start() after "
                                       "backward, then finish() with its counts")
        masks, self._masks = self._masks, None
        w, me = self.world, self.rank
        self.rows_sent = sum(counts[me])
        self.rows_received = sum(sum(c) for r, c in enumerate(counts) if r != me)
        groups: dict[torch.dtype, list[tuple]] = {}  # dtype -> (grad rows view, own ids, table index, padded rows)
        for t, (p, m) in enumerate(zip(self.params, masks)):
            pad = max(c[t] for c in counts)
            if pad == 0:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            g2 = p.grad.view(p.shape[0], -1)
            own = _nonzero(m, counts[me][t])
            groups.setdefault(g2.dtype, []).append((g2, own, t, pad))
        for items in groups.values():
            dev = items[0][0].device
            n_ids = sum(pad for *_, pad in items)
            n_vals = sum(pad * g2.shape[1] for g2, *_, pad in items)
            ids = torch.zeros(n_ids, dtype=torch.int64, device=dev)
            vals = torch.zeros(n_vals, dtype=self.wire_dtype or items[0][0].dtype, device=dev)
            i = v = 0
            for g2, own, _t, pad in items:
                k = own.numel()
                ids[i:i + k] = own
                rows = g2.index_select(0, own)
                vals[v:v + k * g2.shape[1]] = rows.flatten()
                g2.index_copy_(0, own, rows.div_(w))  # own share of the average
                i += pad
                v += pad * g2.shape[1]
            if w > 1:
                all_ids = torch.empty(w * n_ids, dtype=ids.dtype, device=dev)
                all_vals = torch.empty(w * n_vals, dtype=vals.dtype, device=dev)
                dist.all_gather_into_tensor(all_ids, ids, group=self.group)
                dist.all_gather_into_tensor(all_vals, vals, group=self.group)
                for r in range(w):
                    if r == me:
                        continue
                    i, v = r * n_ids, r * n_vals
                    for g2, _own, t, pad in items:
                        k = counts[r][t]
                        if k:
                            g2.index_add_(0, all_ids[i:i + k],
                                          all_vals[v:v + k * g2.shape[1]].view(k, -1).to(g2.dtype), alpha=1.0 / w)
                        i += pad
                        v += pad * g2.shape[1]

    def sync(self) -> None:
        self.finish(self.start().tolist())
