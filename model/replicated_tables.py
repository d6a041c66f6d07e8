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


class _Pending:
    """Row counts `[world, tables]` on their way to the host: a non-blocking copy and its event."""

    def __init__(self, tables: list[int], counts: torch.Tensor):
        self.tables = tables
        if counts.device.type == "cuda":
            self.host = torch.empty(counts.shape, dtype=counts.dtype, pin_memory=True)
            self.host.copy_(counts, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host, self.event = counts, None

    def read(self) -> list[list[int]]:
        if self.event is not None:
            self.event.synchronize()  # recorded at forward time: complete long before backward ends
        return self.host.tolist()


class ReplicatedGradSync:
    """Averages the gradients of replicated embedding tables over ranks after backward
    (`distributed.sparse: replicate`, for machines without torchrec's sharded kernels).

    A batch touches few rows of a large table, so only the rows a rank touched travel, with a fixed
    number of collectives whatever the number of tables, and no host read that waits for backward:
    - at forward time (`watch()`'s hooks on the EmbeddingCollection / EmbeddingBagCollection), each
      table's rows are marked from the batch's ids (a byte mask; the KJT's per-key offsets are host
      lists, so no sync), the per-table row counts are all-gathered (one small collective per module)
      and copied to pinned host memory without blocking; they are read after backward, by which time
      the copy finished long ago (the GPU still has the whole backward queued);
    - `finish(counts, ok)` gathers this rank's rows of every table (ids and values, each table
      padded to the largest count over ranks) into one buffer per dtype, all-gathers ids and values
      once, and forms the average: own rows scaled by 1/world, every other rank's rows added with
      weight 1/world. With `ok` (a device bool, the step's gradients finite) false the touched rows
      become zero, so the table optimizer's step is a no-op (row-wise Adagrad without weight decay)
      without the host knowing.
    Tables with no marks (no `watch()`, or used outside a watched module's forward) fall back to
    marking the rows with a gradient (`any()` over the table's gradient) and one blocking read.
    Each rank sends its own rows once (an all-reduce of the union would move the union twice).
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
        self.mark_at_forward = True  # False: mark rows from the gradients after backward (the fallback)
        self._masks: list[torch.Tensor | None] = [None] * len(params)
        self._pending: dict[tuple[int, ...], _Pending] = {}
        self._hooks: list = []

    # ---- marking ---------------------------------------------------------------------------------

    def watch(self, modules: list[nn.Module]) -> None:
        """Marks touched rows when these torchrec EmbeddingCollection / EmbeddingBagCollection modules
        run forward (with gradients enabled), from the ids of the KJT they are given."""
        index = {id(p): t for t, p in enumerate(self.params)}
        for m in modules:
            if hasattr(m, "embedding_bag_configs"):
                cfgs, holder = m.embedding_bag_configs(), m.embedding_bags
            elif hasattr(m, "embedding_configs"):
                cfgs, holder = m.embedding_configs(), m.embeddings
            else:
                raise ReplicatedSyncError(f"ReplicatedGradSync.watch: {type(m).__name__} is not a torchrec "
                                          "EmbeddingCollection / EmbeddingBagCollection; pass those modules")
            tables, keys = [], []
            for c in cfgs:
                t = index.get(id(holder[c.name].weight))
                if t is None:
                    raise ReplicatedSyncError(f"ReplicatedGradSync.watch: table {c.name!r} of {type(m).__name__} "
                                              "is not among the synced parameters; build the sync with every "
                                              "table's weight")
                tables.append(t)
                keys.append(list(c.feature_names))
            self._hooks.append(m.register_forward_pre_hook(
                lambda _mod, args, tables=tables, keys=keys: self._mark(tables, keys, args[0])))

    def _mark(self, tables: list[int], keys: list[list[str]], kjt) -> None:

        if not (self.mark_at_forward and torch.is_grad_enabled()):
            return
        values = kjt.values()
        offsets = kjt.offset_per_key()  # host list: cached by the loader / the first lookup, else one sync
        where = {k: i for i, k in enumerate(kjt.keys())}
        counts = []
        for t, feats in zip(tables, keys):
            p = self.params[t]
            m = self._masks[t]
            if m is None:  # forwards before one backward (accumulation) add to the same marks
                m = self._masks[t] = torch.zeros(p.shape[0], dtype=torch.bool, device=p.device)
            for f in feats:
                i = where.get(f)
                if i is not None and offsets[i + 1] > offsets[i]:
                    m.index_fill_(0, values[offsets[i]:offsets[i + 1]].long(), True)
            counts.append(m.sum())
        self._pending[tuple(tables)] = _Pending(tables, self._all_counts(torch.stack(counts)))

    def _all_counts(self, c: torch.Tensor) -> torch.Tensor:
        """``[world, tables]``: every rank's per-table counts (one all-gather; no host read)."""
        import torch.distributed as dist

        if self.world > 1:
            out = torch.empty(self.world * c.numel(), dtype=c.dtype, device=c.device)
            dist.all_gather_into_tensor(out, c, group=self.group)
            c = out
        return c.view(self.world, -1)

    def counts(self) -> list[list[int]]:
        """Every rank's touched-row count per table, `[world][tables]`, on the host."""

        out = [[0] * len(self.params) for _ in range(self.world)]
        done: set[int] = set()
        for pend in self._pending.values():
            for r, row in enumerate(pend.read()):
                for t, c in zip(pend.tables, row):
                    out[r][t] = int(c)
            done.update(pend.tables)
        self._pending = {}
        rest = [t for t in range(len(self.params)) if t not in done]
        if rest:  # not marked at forward: the rows with a gradient, and a blocking read
            cs = []
            for t in rest:
                p = self.params[t]
                g = p.grad
                if g is None:  # every rank must still take part: no rows of this table here
                    m = torch.zeros(p.shape[0], dtype=torch.bool, device=p.device)
                else:  # any() reads the float rows directly (no temporary of the table's size)
                    m = g.view(g.shape[0], -1).any(dim=1)
                self._masks[t] = m
                cs.append(m.sum())
            for r, row in enumerate(self._all_counts(torch.stack(cs)).tolist()):
                for t, k in zip(rest, row):
                    out[r][t] = int(k)
        return out

    # ---- the exchange ----------------------------------------------------------------------------

    def finish(self, counts: list[list[int]], ok: torch.Tensor | None = None) -> None:
        """Exchanges the touched rows and averages them (`counts`: `counts()`); `ok` false (a device bool):
        the touched rows are zeroed instead (the step's update skipped on the device)."""
        import torch.distributed as dist

        masks, self._masks = self._masks, [None] * len(self.params)
        if any(m is None for m in masks):
            raise ReplicatedSyncError("ReplicatedGradSync.finish() called without counts(): call counts() "
                                      "after backward, then finish() with its result")
        bad = None if ok is None else ~ok
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
                rows.div_(w)  # own share of the average
                if bad is not None:
                    rows.masked_fill_(bad, 0.0)
                g2.index_copy_(0, own, rows)
                i += pad
                v += pad * g2.shape[1]
            if w > 1:
                if bad is not None:  # ok is the same on every rank (a global norm): zero what is sent
                    vals.masked_fill_(bad, 0.0)
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

    def sync(self, ok: torch.Tensor | None = None) -> None:
        self.finish(self.counts(), ok)
