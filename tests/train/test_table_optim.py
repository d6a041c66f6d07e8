"""Row-sparse table updates: the same result as torchrec's dense row-wise Adagrad, rows untouched stay put."""

import copy

import pytest
import torch
from torch import nn
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from train.table_optim import RowSparseAdagrad, sparse_grad_values, use_row_sparse_gradients


def _batches(rows: int, steps: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    # duplicates within a batch (the same item seen twice) and rows never seen
    return [torch.randint(0, rows // 2, (40,), generator=g) for _ in range(steps)]


def _train(module: nn.Module, opt_cls, batches, **kw) -> tuple[nn.Module, torch.optim.Optimizer]:
    opt = opt_cls(module.parameters(), lr=0.1, eps=1e-8, **kw)
    for ids in batches:
        out = module(ids) if isinstance(module, nn.Embedding) else module(ids, torch.tensor([0, 10, 25]))
        (out.sin() * torch.arange(out.shape[-1], dtype=out.dtype)).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return module, opt


@pytest.mark.parametrize("kind", ["embedding", "bag"])
def test_sparse_update_equals_torchrec_dense_update(kind):
    torch.manual_seed(0)
    base = nn.Embedding(64, 8) if kind == "embedding" else nn.EmbeddingBag(64, 8, mode="sum")
    sparse = copy.deepcopy(base)
    assert use_row_sparse_gradients([sparse]) == 1 and sparse.sparse
    batches = _batches(64, 5)
    dense_m, dense_opt = _train(base, RowWiseAdagrad, batches)
    sparse_m, sparse_opt = _train(sparse, RowSparseAdagrad, batches)
    torch.testing.assert_close(sparse_m.weight, dense_m.weight, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(sparse_opt.state[sparse_m.weight]["sum"], dense_opt.state[dense_m.weight]["sum"],
                               rtol=1e-6, atol=1e-9)
    assert sparse_opt.state[sparse_m.weight]["step"].item() == 5
    assert sparse_opt.state_dict()["state"][0].keys() == dense_opt.state_dict()["state"][0].keys()


def test_untouched_rows_and_their_state_stay_bit_identical_with_weight_decay():
    torch.manual_seed(1)
    emb = nn.Embedding(32, 4)
    use_row_sparse_gradients([emb])
    before = emb.weight.detach().clone()
    ids = torch.tensor([3, 3, 7, 0])
    _, opt = _train(emb, RowSparseAdagrad, [ids], weight_decay=0.5)
    touched = torch.zeros(32, dtype=torch.bool)
    touched[ids] = True
    assert torch.equal(emb.weight[~touched], before[~touched])  # no decay on rows the batch did not touch
    assert not torch.isclose(emb.weight[touched], before[touched]).any()
    state_sum = opt.state[emb.weight]["sum"]
    assert torch.equal(state_sum[~touched], torch.zeros_like(state_sum[~touched]))
    # the touched rows follow the dense formula with the decay added to their gradient
    ref = nn.Embedding(32, 4)
    ref.weight.data.copy_(before)
    _train(ref, RowWiseAdagrad, [ids], weight_decay=0.5)
    torch.testing.assert_close(emb.weight[touched], ref.weight[touched], rtol=1e-6, atol=1e-7)


def test_dense_gradients_take_torchrecs_update():
    torch.manual_seed(2)
    a, b = nn.Embedding(16, 4), None
    b = copy.deepcopy(a)
    batches = _batches(16, 3, seed=3)
    _train(a, RowWiseAdagrad, batches)
    _train(b, RowSparseAdagrad, batches)  # b keeps dense gradients
    assert torch.equal(a.weight, b.weight)


def test_sparse_grad_values_reads_rows_of_a_sparse_gradient():
    emb = nn.Embedding(8, 2, sparse=True)
    emb(torch.tensor([1, 1, 5])).sum().backward()
    (vals,) = sparse_grad_values([emb.weight.grad])
    assert vals.shape == (3, 2) and not vals.is_sparse
    assert torch.isfinite(torch.nn.utils.get_total_norm([vals]))


def test_trainer_tables_train_on_row_sparse_gradients(tiny_cfg, tmp_path):
    from train.optimizers import embedding_modules
    from train.trainer import Trainer

    tr = Trainer(tiny_cfg(train__steps=2, eval__at_end="false"), tmp_path / "r", quiet=True)
    lookups = [m for _, t in embedding_modules(tr.model) for m in t.modules()
               if isinstance(m, nn.Embedding | nn.EmbeddingBag)]
    assert lookups and all(m.sparse for m in lookups)
    before = [p.detach().clone() for p in tr.sparse_params]
    assert tr.fit()["steps"] == 2
    assert any(not torch.equal(b, p) for b, p in zip(before, tr.sparse_params))


def test_touched_rows_sums_duplicates_like_coalesce():
    from train.table_optim import touched_rows

    emb = nn.Embedding(50, 3, sparse=True)
    ids = torch.cat([torch.full((500,), 7), torch.randint(0, 50, (300,), generator=torch.Generator().manual_seed(4))])
    (emb(ids) * torch.arange(800.0)[:, None]).sum().backward()
    rows, vals, valid = touched_rows(emb.weight.grad)
    ref = emb.weight.grad.coalesce()
    n = ref.indices().shape[1]
    assert rows.shape == (800,) and valid.sum() == n and valid[:n].all()  # one slot per lookup, distinct rows first
    assert torch.equal(rows[:n], ref.indices()[0])
    torch.testing.assert_close(vals[:n], ref.values(), rtol=1e-6, atol=1e-4)
    assert not rows[n:].any() and not vals[n:].any()  # the other slots: row 0, zeros
