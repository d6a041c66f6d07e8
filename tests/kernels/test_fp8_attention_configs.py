"""FP8 attention kernel configs: a KV tile never straddles a V scale block, with or without autotuning.

Triton applies ``early_config_prune`` only when it is given more than one config; with a single
128-key config the 64-token scale blocks ran with the wrong V scale on half of each tile (H200 run,
benchmarks/RESULTS.md). These tests pin the config list and the prune on CPU."""

import pytest
import torch

from kernels import attention_fp8_triton as k8


def _nargs():
    return {"Q": torch.empty(1, dtype=torch.float8_e4m3fn)}


@pytest.mark.parametrize("autotune", [False, True])
@pytest.mark.parametrize("qb", [64, 128])
def test_pruned_configs_fit_the_scale_block(monkeypatch, autotune, qb):
    monkeypatch.setattr(k8, "INTERPRET", False)
    monkeypatch.setattr(k8, "AUTOTUNE", autotune)
    configs = k8._configs()
    assert len(configs) > 1  # one config would bypass the prune
    kept = k8._prune(configs, _nargs(), QUANT_BLOCK=qb, BLOCK_D=128, BLOCK_M=128)
    assert kept and all(qb % c.kwargs["BLOCK_N"] == 0 for c in kept)
    if not autotune:
        assert len(kept) == 1 and kept[0].kwargs["BLOCK_N"] == 64


@pytest.mark.parametrize("meta,cap", [
    (dict(ACT=0, HAS_POS=False, HAS_TIME=False), 136),
    (dict(ACT=0, HAS_POS=False, HAS_TIME=False, BLOCK_D=64), 136),
    (dict(ACT=0, HAS_POS=True, HAS_TIME=False), None),
    (dict(ACT=0, HAS_POS=False, HAS_TIME=True), None),
    (dict(ACT=1, HAS_POS=False, HAS_TIME=False), None),
    (dict(ACT=1, HAS_POS=False, HAS_TIME=False, BLOCK_D=64), 136),
    (dict(ACT=2, HAS_POS=False, HAS_TIME=False, BLOCK_D=64), None),
    (dict(ACT=1, HAS_POS=True, HAS_TIME=True, BLOCK_D=64), None),
    (dict(ACT=0, HAS_POS=False, HAS_TIME=False, BLOCK_M=16), None),
    (dict(ACT=1, HAS_POS=False, HAS_TIME=False, BLOCK_D=64, BLOCK_M=16), None),
])
def test_default_config_is_the_measured_one(monkeypatch, meta, cap):
    """Without autotuning the GPU runs 64-key tiles, 4 warps, 3 stages, capped at 136 registers where that timed
    faster on an H100 (benchmarks/RESULTS.md): 64-query tiles of softmax, and of silu at head dim 64. Bias tables,
    silu at head dim 128, gelu (not timed) and 16-query tiles (cross attention) run uncapped."""
    monkeypatch.setattr(k8, "INTERPRET", False)
    monkeypatch.setattr(k8, "AUTOTUNE", False)
    meta = {"BLOCK_D": 128, "BLOCK_M": 64, **meta}
    for qb in (64, 128):
        (c,) = k8._prune(k8._configs(), _nargs(), QUANT_BLOCK=qb, **meta)
        assert (c.kwargs["BLOCK_N"], c.num_warps, c.num_stages, c.maxnreg) == (64, 4, 3, cap)
        assert ("maxnreg" in c.all_kwargs()) == (cap is not None)  # the cap reaches the compiler's options
