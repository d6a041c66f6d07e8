"""Row-sparse updates of the embedding tables in single-process training.

A dense table gradient is as large as the table (719M floats for `gem_medium`), although a batch touches
a few hundred thousand rows: allocating and zeroing it in backward, then reading and writing every row in
the optimizer, costs milliseconds per step for rows that did not change. With `use_row_sparse_gradients`
the tables' `nn.Embedding` / `nn.EmbeddingBag` modules return row-sparse (COO) gradients, and
`RowSparseAdagrad` updates only the rows present in them, as FBGEMM's fused table kernels do in sharded
runs. The state (`sum` [rows, 1], `step`) is torchrec's `RowWiseAdagrad`'s, so checkpoints are unchanged;
with `weight_decay = 0` (the default) the update equals the dense one, since an untouched row's gradient
is zero. With a weight decay, untouched rows are not decayed (FBGEMM's behaviour, not torchrec's dense
reference).
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad, adagrad


def use_row_sparse_gradients(tables: list[nn.Module]) -> int:
    """Switch every embedding lookup module under `tables` to row-sparse gradients; how many were switched."""
    n = 0
    for t in tables:
        for m in t.modules():
            if isinstance(m, nn.Embedding | nn.EmbeddingBag):
                m.sparse = True
                n += 1
    return n


def sparse_grad_values(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """The stored values of each gradient (a sparse gradient's rows), e.g. for a finiteness check."""
    return [g._values() if g.is_sparse else g for g in grads]


def touched_rows(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, their summed gradient rows, valid) of a row-sparse gradient, one slot per stored lookup.

    Slots are sorted by row; the first slot of each distinct row holds that row and its summed gradient, and
    `valid` marks those. The other slots hold row 0 and zeros. The sizes do not depend on the data, so the host
    never waits for the device (`torch.unique` does). Not `coalesce()` either: its CUDA kernel sums a row's
    duplicates one after another, and a small table (a category, an action type) is looked up thousands of
    times per batch; the duplicates are added with `index_add_` (atomics) in parallel.
    """
    ids, vals = grad._indices()[0], grad._values()
    sorted_ids, order = torch.sort(ids)
    first = torch.ones_like(sorted_ids, dtype=torch.bool)
    first[1:] = sorted_ids[1:] != sorted_ids[:-1]
    slot = torch.cumsum(first, 0) - 1  # the slot of each sorted lookup's distinct row
    rows = torch.zeros_like(sorted_ids).scatter_(0, slot, sorted_ids)  # a slot's lookups all write its row
    of_lookup = torch.empty_like(slot).scatter_(0, order, slot)  # the slot of each lookup in stored order
    summed = torch.zeros_like(vals).index_add_(0, of_lookup, vals)  # no [lookups, dim] gather
    valid = torch.arange(ids.numel(), device=ids.device) < first.sum()
    return rows, summed, valid


class RowSparseAdagrad(RowWiseAdagrad):
    """torchrec's `RowWiseAdagrad` that also takes row-sparse gradients and then updates only their rows.

    Dense gradients take torchrec's own update unchanged.
    """

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            dense: list[torch.Tensor] = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not p.grad.is_sparse:
                    dense.append(p)
                    continue
                self._sparse_update(p, self.state[p], group)
            if dense:
                adagrad(dense, [p.grad for p in dense], [self.state[p]["sum"] for p in dense],
                        [self.state[p]["step"] for p in dense], lr=group["lr"],
                        weight_decay=group["weight_decay"], lr_decay=group["lr_decay"], eps=group["eps"],
                        maximize=group["maximize"])
        return loss

    @staticmethod
    def _sparse_update(p: torch.Tensor, state: dict, group: dict) -> None:
        state["step"] += 1  # a CPU tensor: reading it does not wait for the device
        clr = group["lr"] / (1 + (state["step"].item() - 1) * group["lr_decay"])
        rows, vals, valid = touched_rows(p.grad)
        valid = valid.unsqueeze(1)
        if group["maximize"]:
            vals = -vals
        if group["weight_decay"]:
            vals = vals + group["weight_decay"] * p[rows] * valid
        state_sum = state["sum"]
        state_sum.index_add_(0, rows, vals.pow(2).mean(dim=1, keepdim=True))  # other slots add zeros to row 0
        std = state_sum[rows].sqrt_().add_(group["eps"])  # advanced indexing copies: in place is safe
        # the other slots stay 0 (with eps = 0 their 0 / 0 would be NaN on row 0)
        p.index_add_(0, rows, torch.where(valid, vals / std, 0.0), alpha=-clr)
