"""The single-process optimizers and the learning-rate schedule (`Trainer` builds them here).

- Dense parameters: AdamW (one fused kernel, on CUDA and CPU). Embedding tables (every torchrec
  EmbeddingCollection / EmbeddingBagCollection in the model): row-wise Adagrad on row-sparse gradients
  (`train/table_optim.py`: only the rows a batch touched are updated) or Adam. Both are
  `KeyedOptimizerWrapper`s in one torchrec `CombinedOptimizer`, so the optimizer state is keyed by parameter
  name (what DCP and torchrec's sharded optimizers use), and stepped after backward (not fused into
  backward), so the NaN/Inf guard and gradient clipping see the gradients before any update. Sharded runs get
  torchrec's fused (in-backward) optimizers from DMP instead.
- LR: linear warm-up, then linear or cosine decay to `min_lr_ratio` at `train.steps` (dense only; the sparse
  optimizer keeps its learning rate, as row-wise Adagrad is usually run).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from features.errors import GemtrainError
from train.config import RunConfig


def lr_factor(step: int, warmup: int, total: int, decay: str, min_ratio: float) -> float:
    """LR multiplier for the update made at `step` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if decay == "none" or total <= warmup:
        return 1.0
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    if decay == "linear":
        return 1.0 - (1.0 - min_ratio) * frac
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * frac))


def embedding_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    return [(n, m) for n, m in model.named_modules() if isinstance(m, EmbeddingCollection | EmbeddingBagCollection)]


def split_params(model: nn.Module) -> tuple[dict[str, nn.Parameter], dict[str, nn.Parameter]]:
    """(dense, sparse) trainable parameters by name; sparse = the embedding tables."""
    sparse_ids = set()
    for _, m in embedding_modules(model):
        sparse_ids.update(id(p) for p in m.parameters())
    dense, sparse = {}, {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            (sparse if id(p) in sparse_ids else dense)[name] = p
    return dense, sparse


def build_optimizer(model: nn.Module, cfg: RunConfig):
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

    from train.table_optim import RowSparseAdagrad, use_row_sparse_gradients

    o = cfg.optim
    dense, sparse = split_params(model)
    opts = []
    dense_opt = None
    if dense:
        # one fused kernel for all parameters (torch's foreach path takes several passes); it can skip a step
        # on the device (train/step_guard.py)
        fused = all(p.device.type in ("cuda", "cpu") and p.is_floating_point() for p in dense.values()) or None
        dense_opt = KeyedOptimizerWrapper(dense, lambda ps: torch.optim.AdamW(
            ps, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay, fused=fused))
        opts.append(("dense", dense_opt))
    if sparse:
        s = o.sparse
        if s.name == "rowwise_adagrad":  # row-sparse table gradients: only touched rows are updated
            use_row_sparse_gradients([m for _, m in embedding_modules(model)])
            factory = lambda ps: RowSparseAdagrad(ps, lr=s.lr, eps=s.eps, weight_decay=s.weight_decay)
        else:
            fused_t = all(p.device.type in ("cuda", "cpu") for p in sparse.values()) or None  # as the dense AdamW
            factory = lambda ps: torch.optim.Adam(ps, lr=s.lr, eps=s.eps, weight_decay=s.weight_decay, fused=fused_t)
        opts.append(("sparse", KeyedOptimizerWrapper(sparse, factory)))
    if not opts:
        raise GemtrainError("the model has no trainable parameters")
    return CombinedOptimizer(opts), dense_opt, list(dense.values()), list(sparse.values())
