"""torchrec's 2D sparse parallelism (`DMPCollection`) on CPU process groups (gloo), for CI.

torchrec 1.8 refuses CPU in two places, and nothing else in DMPCollection needs CUDA:
- `DMPCollection.__init__` starts with `assert device.type == "cuda" or device.type == "mtia"`
  (torchrec/distributed/model_parallel.py, line 1141);
- `DMPCollection._remap_sharding_plan` gives every remapped shard the placement
  `rank:<r>/<device type>:<r % local size>` (line 1746), so a CPU shard is placed on "cpu:2", which
  `ShardedTensor` rejects for a tensor on "cpu" (torch/distributed/_shard/sharded_tensor/shard.py,
  raised from torchrec/distributed/batched_embedding_kernel.py, line 1470).
`CpuDMPCollection` is that constructor without the assert, for the default context only (no
per-submodule configs, no sharded relay), and places remapped CPU shards on "cpu". With it, one step
of 4 gloo ranks in groups of 2 plus `sync()` equals one process (tests/distributed/test_dmp_collection.py).
On CUDA `model.parallelize` uses torchrec's own `DMPCollection`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel, DMPCollection
from torchrec.distributed.types import DMPCollectionContext, ShardingEnv2D, ShardingStrategy


class CpuDMPCollection(DMPCollection):
    """`DMPCollection` (torchrec 1.8) that also runs on CPU; same arguments, default context only."""

    def __init__(self, module: nn.Module, device: torch.device, plan, world_size: int, sharding_group_size: int,
                 global_pg, sharders=None, init_data_parallel: bool = True, init_parameters: bool = True,
                 data_parallel_wrapper=None) -> None:
        from torchrec.distributed.sharding_plan import get_default_sharders

        self._device = device
        self._pg = global_pg
        self._global_rank = dist.get_rank(global_pg)
        self._custom_all_reduce = None
        sharders = sharders if sharders is not None else get_default_sharders()
        self._sharder_map = {s.module_type: s for s in sharders}
        ctx = DMPCollectionContext(module=None, plan=plan, sharding_group_size=sharding_group_size,  # type: ignore[arg-type]
                                   node_group_size=None, use_inter_host_allreduce=False,
                                   sharding_strategy=ShardingStrategy.DEFAULT)
        self._default_ctx = ctx
        self._submodule_ctxs = []
        self._ctxs = [ctx]
        ctx.device_mesh, ctx.sharding_pg, ctx.replica_pg = self._create_process_groups(
            global_rank=self._global_rank, world_size=world_size, local_size=sharding_group_size)
        self._remap_sharding_plan(plan=plan, rank=self._global_rank, step=world_size // sharding_group_size,
                                  sharding_group_size=sharding_group_size)
        env = ShardingEnv2D(global_pg=self._pg, sharding_pg=ctx.sharding_pg, replica_pg=ctx.replica_pg,
                            device_mesh=ctx.device_mesh, node_group_size=None, use_inter_host_allreduce=False,
                            sharding_strategy=ShardingStrategy.DEFAULT)
        DistributedModelParallel.__init__(self, module, env, device, plan, sharders, init_data_parallel,
                                          init_parameters, data_parallel_wrapper)
        self._group_sharded_modules(self._ctxs)
        self._cache_sync_tensors(self._ctxs)
        self._use_sharded_relay = False
        self._sharded_relay_state = None

    def _remap_sharding_plan(self, plan, rank: int, step: int, sharding_group_size: int,
                             use_inter_host_allreduce: bool = False) -> None:
        from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
        from torch.distributed.remote_device import _remote_device

        super()._remap_sharding_plan(plan, rank, step, sharding_group_size, use_inter_host_allreduce)
        if self._device.type != "cpu":
            return
        for param_plan in plan.plan.values():
            for ps in param_plan.values():  # type: ignore[attr-defined]
                if isinstance(ps.sharding_spec, EnumerableShardingSpec):
                    for shard in ps.sharding_spec.shards or []:
                        shard.placement = _remote_device(f"rank:{shard.placement.rank()}/cpu")
