"""A 2-rank checkpoint resumed by one process without a process group (2 -> 1)."""

from __future__ import annotations

import pytest


def test_resume_at_one_process_from_two(two_ranks):
    import torch
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from features import load_schema
    from model.parallelize import TrainModule, make_loss_fn
    from tests.distributed.harness import SCHEMA, fresh_model, make_loader
    from train import dist_checkpoint as dckpt

    results2, out2 = two_ranks
    saved = results2[0]["ckpt_save"]
    schema = load_schema(SCHEMA)
    model = fresh_model(schema, seed=7)  # other initial values: the load must replace all of them
    tables = {n: p for n, p in model.named_parameters() if n.startswith("embeddings.e")}
    dense = {n: p for n, p in model.named_parameters() if n not in tables}
    opt = CombinedOptimizer([("dense", KeyedOptimizerWrapper(dense, lambda ps: torch.optim.Adam(ps, lr=0.05))),
                             ("sparse", KeyedOptimizerWrapper(tables, lambda ps: RowWiseAdagrad(ps, lr=0.05)))])
    opt.init_state()
    opt.zero_grad(set_to_none=True)
    sd, osd = model.state_dict(), opt.state_dict()
    state = dckpt.load(out2 / "run", sd, osd, sparse_name="rowwise_adagrad")
    model.load_state_dict(sd)
    opt.load_state_dict(osd)
    assert state["step"] == 3
    sums = dckpt.state_sums(model.state_dict())
    for k, v in saved["sums"].items():
        assert sums[k] == pytest.approx(v, rel=1e-9, abs=1e-9), k
    # the tables' row-wise Adagrad state came back from the fused optimizer's (stored under `sum` too)
    loaded = {k: float(v["sum"].double().sum()) for k, v in opt.state_dict()["state"].items()
              if k.startswith("sparse.")}
    saved_fused = {k: sum(res["ckpt_save"]["fused"].get(k, 0.0) for res in results2) for k in loaded}
    assert set().union(*(res["ckpt_save"]["fused"] for res in results2)) == loaded.keys()
    for k, v in saved_fused.items():
        assert v > 0 and loaded[k] == pytest.approx(v, rel=1e-6), k
    # the dense Adam state came back too (step count 3 on every dense parameter)
    steps = {float(s["step"]) for k, s in opt.state_dict()["state"].items() if k.startswith("dense.")}
    assert steps == {3.0}
    # the loader continues at world size 1 with exactly the rows no rank had consumed
    before = [row for res in results2 for row in res["ckpt_save"]["rows"]]
    loader = make_loader(schema, str(out2 / "data"), 0, 1)
    loader.load_state_dict(state["loader"])
    tm = TrainModule(model, make_loss_fn(list(schema.label_names)))
    after = []
    for batch in loader:
        after += batch.row_ids.tolist()
        loss, _ = tm(batch)
        assert torch.isfinite(loss)
    assert sorted(before + after) == list(range(72))
