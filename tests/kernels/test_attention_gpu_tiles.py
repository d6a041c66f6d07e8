"""The attention kernels at the tile sizes the GPU runs, under the interpreter, against the reference.

The interpreter normally runs 32x32 tiles (``attention_op._tiles``, ``kernel_configs``); on the GPU the query
and key tiles are 64 rows and the autotuner's inner tiles 32, 64 or 128, so a query tile may span two inner
tiles or half of one. These tests give the interpreter the GPU's sizes: the defaults, and the autotuning
candidates at both ends, on rows that end inside, at and past tile edges. The window kernels likewise run
16-row tiles under the interpreter and 64-row ones on the GPU (with their fixed inner tiles), and the FP8 forward
32-key tiles against the GPU's 64 (inside one V scale block of 64 or 128 tokens).
"""

from __future__ import annotations

import pytest
import torch

from kernels import (
    RelativeBias,
    attention_op,
    attention_triton_bwd,
    attention_triton_common,
    attention_triton_fwd,
    attention_window_op,
)
from kernels.attention_fp8 import jagged_attention_fp8, jagged_attention_fp8_ref
from kernels.attention_fp8_triton import jagged_attn_fp8_fwd_kernel
from tests.kernels.attention_cases import assert_accurate, make_problem, rel_err, self_problem

LONG = [197, 128, 1, 0, 129, 64, 260]
FEW_Q = [16, 3, 0, 16, 1, 9, 16]  # cross attention: a few candidates over each history

# (outer tile, forward inner tile, backward inner tile)
TILINGS = {"defaults": (64, 64, 64), "autotune extremes": (64, 128, 32)}


@pytest.fixture
def gpu_tiles(monkeypatch, request):
    outer, inner_fwd, inner_bwd = TILINGS[request.param]
    set_tiles(monkeypatch, outer, [(attention_triton_fwd.jagged_attn_fwd_kernel, "BLOCK_N", inner_fwd),
                                   (attention_triton_bwd.jagged_attn_bwd_dkdv_kernel, "BLOCK_M", inner_bwd),
                                   (attention_triton_bwd.jagged_attn_bwd_dq_kernel, "BLOCK_N", inner_bwd)])


def set_tiles(monkeypatch, outer: int, inner: list) -> None:
    """Query and key tiles of ``outer`` rows (``attention_op``'s plan), and each (kernel, meta-parameter, size) of
    ``inner`` as that kernel's inner tile."""
    plain = attention_op._tiles

    def tiles(*args):
        return tuple({**dict(plain(*args)), "tile_q": outer, "tile_q_bwd": outer, "tile_kv": outer}.items())

    monkeypatch.setattr(attention_op, "_cached_tiles", tiles)
    monkeypatch.setattr(attention_triton_common, "_SETTLED", {})  # launches settled at other sizes
    for kernel, name, size in inner:
        assert len(kernel.configs) == 1  # the interpreter's one configuration
        monkeypatch.setitem(kernel.configs[0].kwargs, name, size)


CASES = {
    "causal softmax, bias, targets": dict(activation="softmax", causal=True, bias=True, targets=True),
    "non-causal softmax": dict(activation="softmax", causal=False, bias=False),
    "causal silu, bias": dict(activation="silu", causal=True, bias=True),
}


@pytest.mark.parametrize("gpu_tiles", list(TILINGS), indirect=True)
@pytest.mark.parametrize("name", list(CASES))
def test_self_attention_at_gpu_tiles(gpu_tiles, name):
    c = dict(CASES[name])
    p = make_problem(seed=1, lq=LONG, lk=LONG, heads=1, dim=64, bias=c.pop("bias"), targets=c.pop("targets", False))
    assert_accurate(p, torch.float32, **c)


@pytest.mark.parametrize("gpu_tiles", list(TILINGS), indirect=True)
def test_cross_attention_at_gpu_tiles(gpu_tiles):
    p = make_problem(seed=2, lq=FEW_Q, lk=LONG, heads=1, dim=64, bias=True)
    assert_accurate(p, torch.float32, activation="softmax", causal=True)


@pytest.mark.parametrize("gpu_tiles", ["defaults"], indirect=True)
@pytest.mark.parametrize("window", [None, 256])
def test_descriptor_path_at_gpu_tiles(gpu_tiles, monkeypatch, window):
    # On Hopper, calls this size and larger stream their tiles through tensor descriptors (GEMTRAIN_ATTN_TMA=auto).
    monkeypatch.setattr(attention_triton_common, "TMA", "1")
    monkeypatch.setattr(attention_window_op, "INTERPRET_TILE", attention_window_op.TILE)
    made = []
    plain, windowed = attention_op.descriptor, attention_window_op._desc
    monkeypatch.setattr(attention_op, "descriptor", lambda t, on: made.append(on) or plain(t, on))
    monkeypatch.setattr(attention_window_op, "_desc", lambda t, tile, on: made.append(on) or windowed(t, tile, on))
    p = make_problem(seed=5, lq=LONG, lk=LONG, heads=2, dim=64, bias=True, targets=True)
    if window is not None:
        p = self_problem(5, LONG, heads=2, bias=True, targets=True)
    assert_accurate(p, torch.float32, activation="softmax", causal=True, window=window)
    assert made and all(made), "the kernels did not take the descriptor path"


@pytest.mark.parametrize("window,causal", [(256, True), (100, False)])
def test_window_attention_at_gpu_tiles(monkeypatch, window, causal):
    # W=256 reaches 4 key tiles of 64 on one side, W=100 two on each: the fused backward's dS slots at GPU sizes.
    monkeypatch.setattr(attention_window_op, "INTERPRET_TILE", attention_window_op.TILE)
    p = self_problem(3, [0, 1, 5, 300, 200, 64, 129], heads=1, bias=True, targets=causal)
    assert_accurate(p, torch.float32, activation="softmax", causal=causal, window=window)


@pytest.mark.parametrize("causal,quant_block", [(True, 64), (True, 128), (False, 64)])
def test_fp8_attention_forward_at_gpu_tiles(monkeypatch, causal, quant_block):
    set_tiles(monkeypatch, 64, [(jagged_attn_fp8_fwd_kernel, "BLOCK_N", 64)])
    p = make_problem(seed=4, lq=LONG, lk=LONG, heads=2, dim=64, bias=True)
    args = (p.q.float(), p.k.float(), p.v.float(), p.q_offsets, p.kv_offsets)
    kw = dict(activation="softmax", causal=causal, quant_block=quant_block,
              bias=RelativeBias(p.pos.float(), p.time.float(), p.q_ts, p.kv_ts))
    out = jagged_attention_fp8(*args, impl="triton", **kw)
    ref = jagged_attention_fp8_ref(*args, tile_n=64, **kw)  # the same quantized numbers, P per 64-key tile
    # fp32 scores summed in another order can put a probability on the other side of an e4m3 rounding step (one
    # token of this problem, by 1e-2); a wrong scale or tile edge moves most tokens of a tile.
    off_tokens = (out - ref).abs().amax(dim=(1, 2)) > 1e-4
    assert int(off_tokens.sum()) <= 0.01 * len(out) and rel_err(out, ref.double()) <= 1e-3
