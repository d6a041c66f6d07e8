"""`gemtrain launch`, the process-group set-up from the environment, the distributed config."""

from __future__ import annotations

import argparse

import pytest

from features.errors import GemtrainError


def _args(**kw):
    base = {"config": "configs/demo.yaml", "nproc_per_node": 2, "nnodes": 1, "node_rank": 0,
            "master_addr": "127.0.0.1", "master_port": 29500, "dry_run": True}
    base.update(kw)
    return argparse.Namespace(**base)


def test_launch_runs_train_under_torchrun(repo_root, monkeypatch):
    from train.commands.launch_cmd import torchrun_argv

    monkeypatch.chdir(repo_root)
    cmd = torchrun_argv(_args(), ["--train.steps=5"])
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--nproc-per-node=2"]
    assert "--standalone" in cmd
    assert cmd[-4:] == ["train", "configs/demo.yaml", "--train.steps=5"][-4:] or cmd[-3:] == [
        "train", "configs/demo.yaml", "--train.steps=5"]
    multi = torchrun_argv(_args(nnodes=2, node_rank=1, master_addr="10.0.0.1"), [])
    assert "--nnodes=2" in multi and "--node-rank=1" in multi and "--master-addr=10.0.0.1" in multi


def test_launch_rejects_bad_input(repo_root, monkeypatch):
    from train.commands.launch_cmd import torchrun_argv

    monkeypatch.chdir(repo_root)
    with pytest.raises(GemtrainError, match="not found"):
        torchrun_argv(_args(config="nope.yaml"), [])
    with pytest.raises(GemtrainError, match="nproc-per-node"):
        torchrun_argv(_args(nproc_per_node=0), [])
    with pytest.raises(GemtrainError, match="node-rank"):
        torchrun_argv(_args(nnodes=2, node_rank=2), [])


def test_launch_cli_dry_run(repo_root, monkeypatch, capsys):
    from train.cli import main

    monkeypatch.chdir(repo_root)
    assert main(["launch", "--nproc-per-node", "3", "configs/demo.yaml", "--train.steps=2", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "--nproc-per-node=3" in err and "train configs/demo.yaml --train.steps=2" in err


def test_setup_without_torchrun_is_single_process(monkeypatch):
    from train import distributed as d

    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    info = d.setup(device="cpu")
    assert (info.rank, info.world_size, info.backend, info.distributed) == (0, 1, None, False)
    assert not d.is_distributed()


def test_setup_names_a_missing_variable(monkeypatch):
    from train import distributed as d

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(d.DistributedError, match="MASTER_ADDR"):
        d.setup(device="cpu")
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(d.DistributedError, match="WORLD_SIZE"):
        d.env_world_size()


def test_collective_guard_passes_other_errors_through():
    from train import distributed as d

    with pytest.raises(ValueError):
        with d.collective_guard("step"):
            raise ValueError("shape mismatch")
    with pytest.raises(d.DistributedError, match="another rank died"):
        with d.collective_guard("step"):
            raise RuntimeError("[gloo] Connection reset by peer")


def test_parallel_config_rejects_unknown_keys():
    from model.parallelize import ParallelConfig, ParallelConfigError

    assert ParallelConfig.from_dict({"replicate": 2}).replicate == 2
    with pytest.raises(ParallelConfigError, match="unknown key"):
        ParallelConfig.from_dict({"sharding": "x"})
    with pytest.raises(ParallelConfigError, match="sparse"):
        ParallelConfig.from_dict({"sparse": "nope"})


def test_cpu_sharding_fallback_is_reported(demo_schema):
    from model.parallelize import ParallelConfigError, table_constraints

    # demo: `user` (an EmbeddingBagCollection table) asks for row_wise, which the CPU kernels lack
    cons, notes = table_constraints(demo_schema, "cpu")
    assert [(n.table, n.asked, n.used) for n in notes] == [("user", "row_wise", "table_wise")]
    assert cons["user"].sharding_types == ["table_wise"]
    with pytest.raises(ParallelConfigError, match="strict_sharding"):
        table_constraints(demo_schema, "cpu", strict=True)
    cons, notes = table_constraints(demo_schema, "cuda")
    assert not notes and cons["user"].sharding_types == ["row_wise"]


def test_2d_sparse_parallelism_needs_a_process_group(demo_schema):
    # 2D sparse parallelism runs on CPU too (tests/distributed/test_dmp_collection.py); without
    # torchrun's process group it is refused with a clear error
    import torch

    from model import build_model
    from model.parallelize import ParallelConfig, ParallelConfigError, parallelize

    model = build_model(demo_schema, {"d_model": 8, "num_heads": 2, "top_dim": 8, "head_hidden": 4,
                                      "sequence_encoder": {"num_layers": 1}}, device="meta")
    with pytest.raises(ParallelConfigError, match="no process group"):
        parallelize(model, demo_schema, ParallelConfig(sharding_group_size=2), torch.device("cpu"))
