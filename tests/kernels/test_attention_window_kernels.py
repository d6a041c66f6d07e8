"""Sliding-window self-attention kernels (``kernels.attention_window_op``, interpreter): accuracy against the
float64 reference, locality, and that ``jagged_attention`` routes window self-attention to them."""

from __future__ import annotations

import pytest
import torch

import kernels.attention_op  # noqa: F401
import kernels.attention_window_op  # noqa: F401  (registers the FLOP formulas before a counter starts)
from kernels.attention_flops import visible_pairs
from tests.kernels.attention_cases import assert_accurate, op_flops, run, self_problem

# Lengths (tiles of 16 under the interpreter): 0, 1, shorter than the windows below, longer, and the maximum
# (several whole tiles, so the kernels' unmasked middle tiles run).
LENGTHS = [0, 1, 5, 70, 17]


def _self_problem(seed: int, heads: int = 2, bias: bool = True, targets: bool = False, lengths=LENGTHS):
    return self_problem(seed, lengths, heads=heads, bias=bias, targets=targets)


@pytest.mark.parametrize("act,causal", [("softmax", True), ("softmax", False), ("silu", True), ("gelu", False)])
def test_window_kernels_match_reference(act, causal):
    # W=36 over tiles of 16: a query tile's keys span a masked far-edge tile, a whole tile every query sees
    # and the masked diagonal (the dk/dv kernel likewise over query tiles). Softmax with both tables in
    # fp32, pointwise activations with the position table alone in fp16; two heads in one case (head offsets).
    p = _self_problem(seed=7, heads=2 if causal and act == "softmax" else 1, bias=True)
    dtype = torch.float32 if act == "softmax" else torch.float16
    if act != "softmax":
        p.time = None
    assert_accurate(p, dtype, activation=act, causal=causal, window=36)


def test_window_kernels_window_shorter_than_a_tile():
    p = _self_problem(seed=13, heads=1, bias=True)
    assert_accurate(p, torch.float32, causal=True, window=3)


@pytest.mark.parametrize("act", ["softmax", "silu"])
def test_window_kernels_without_bias_and_with_targets(act):
    p = _self_problem(seed=23, bias=False, targets=True)
    assert_accurate(p, torch.float16 if act == "softmax" else torch.float32, activation=act, causal=True,
                    window=20)


def test_window_kernels_targets_bias_non_causal_fixed_norm():
    p = _self_problem(seed=29, heads=1, bias=True, targets=True)
    assert_accurate(p, torch.float32, activation="silu", causal=False, window=18, pointwise_norm=7, scale=0.3)


def test_window_kernels_empty_batch():
    p = _self_problem(seed=31, lengths=[0, 0])
    out, dq, dk, dv, dpos, dtime = run(p, torch.float32, "triton", causal=True, window=8)
    assert out.shape == (0, 2, 16) and dq.shape == dk.shape == dv.shape == (0, 2, 16)
    assert torch.count_nonzero(dpos) == 0 and torch.count_nonzero(dtime) == 0


@pytest.mark.parametrize("act", ["softmax", "gelu"])
def test_keys_outside_the_window_do_not_touch_the_query(act):
    from kernels import attention_window_op as wop

    assert wop.fused_slots(20, True, 16)[0] > 0  # the fused backward serves these calls
    row, query, window = 3, 50, 20  # row of length 70; query 50 sees keys 30 .. 50
    base_p = _self_problem(seed=3, heads=1, bias=False)
    results = {}
    for name, key in (("base", None), ("outside", 29), ("inside", 31)):
        p = _self_problem(seed=3, heads=1, bias=False)
        if key is not None:
            j = int(p.q_offsets[row]) + key
            g = torch.Generator().manual_seed(7)
            p.k[j] += torch.randn(p.k[j].shape, generator=g, dtype=torch.float64)
            p.v[j] += torch.randn(p.v[j].shape, generator=g, dtype=torch.float64)
        results[name] = run(p, torch.float32, "triton", activation=act, causal=True, window=window)
    i = int(base_p.q_offsets[row]) + query
    for n, name in enumerate(("out", "dq")):
        assert torch.equal(results["base"][n][i], results["outside"][n][i]), f"{name} moved with a key outside"
        assert not torch.equal(results["base"][n][i], results["inside"][n][i]), f"{name} ignored a key inside"
    # Keys whose windows do not reach the perturbed key (its queries 29 .. 49) keep their gradients: 50 .. 69.
    keys = slice(int(base_p.q_offsets[row]) + 50, int(base_p.q_offsets[row]) + 70)
    for n in (2, 3):
        assert torch.equal(results["base"][n][keys], results["outside"][n][keys])


def test_window_self_attention_takes_the_window_kernels():
    p = _self_problem(seed=41, bias=False, lengths=[0, 5, 40])
    kw = dict(causal=True, window=20)
    ops = op_flops(p, **kw)
    pairs = visible_pairs(p.q_offsets, p.q_offsets, causal=True, window=20)
    assert ops.get("gemtrain.window_attn_fwd") == 4 * pairs * 2 * 16, ops
    assert ops.get("gemtrain.window_attn_bwd") == int(2.5 * 4 * pairs * 2 * 16), ops
    assert not any("jagged_attn" in name for name in ops), ops
    # Two offsets tensors (the general case) or a window with blocks keep the generic kernels.
    cross = _self_problem(seed=41, bias=False, lengths=[0, 5, 40])
    cross.kv_offsets = cross.q_offsets.clone()
    for prob, extra in ((cross, kw), (p, dict(causal=True, window=20, block_size=128))):
        ops = op_flops(prob, **extra)
        assert "gemtrain.jagged_attn_fwd" in ops and not any("window_attn" in n for n in ops), (extra, ops)


def test_raw_op_autograd_equals_the_autograd_node():
    # jagged_attention runs the ops under one autograd.Function; the forward op's registered autograd
    # (for callers of the raw op) must give the same gradients bit for bit.
    from kernels.attention_window_op import window_attention, window_work

    p = _self_problem(seed=43, heads=1, bias=True, lengths=[5, 40])
    grads = []
    for raw in (False, True):
        q, k, v = (t.detach().float().requires_grad_() for t in (p.q, p.k, p.v))
        pos = p.pos.detach().float().requires_grad_()
        if raw:
            work = window_work(p.q_offsets, q.shape[0], 16)
            out = torch.ops.gemtrain.window_attn_fwd(q, k, v, p.q_offsets, None, pos, None, None, None, "softmax",
                                                     True, 0.25, 20, 0, work)[0]
        else:
            out = window_attention(q, k, v, p.q_offsets, activation="softmax", causal=True, scale=0.25, window=20,
                                   num_targets=None, pos_weight=pos, time_weight=None, q_timestamps=None,
                                   kv_timestamps=None, norm=0)
        out.backward(p.do.float())
        grads.append([out.detach(), q.grad, k.grad, v.grad, pos.grad])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("config", [(16, 4, 1, True), (8, 4, 1, False)])
def test_window_kernels_other_configurations(monkeypatch, config):
    # Every inner tile masked in one loop, and inner tiles half the outer one: the same function.
    from kernels import attention_window_op as wop

    for name in ("fwd", "dq", "dkdv"):
        monkeypatch.setitem(wop.CONFIG, name, config)
    p = _self_problem(seed=17, heads=1, bias=True, targets=True)
    assert_accurate(p, torch.float32, causal=True, window=36)


def test_kernel_launch_options_reach_gpu_launches_only(monkeypatch):
    # The forward's register cap and pipeline depth are GPU launch options; the interpreter takes none.
    from kernels import attention_window_op as wop

    q = torch.zeros(4, 2, 64)
    args = (q, "softmax", True, 0, None, None, None, False, 64, 32)
    assert set(wop.KERNEL_OPTIONS) <= set(wop.CONFIG)
    monkeypatch.setattr(wop, "INTERPRET", False)
    meta = wop._meta(*args, "fwd")
    assert {k: meta[k] for k in wop.KERNEL_OPTIONS["fwd"]} == wop.KERNEL_OPTIONS["fwd"]
    assert meta["num_warps"] == wop.CONFIG["fwd"][1] and "maxnreg" not in wop._meta(*args, "dq")
    monkeypatch.setattr(wop, "INTERPRET", True)
    assert "maxnreg" not in wop._meta(*args, "fwd")


class _Forbidden:
    """A kernel that must not launch (fault injection: the backward's other path)."""

    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, grid):
        raise AssertionError(f"{self.name} launched")

    def __call__(self, *args, **kwargs):  # a function that launches one (``softmax_delta``)
        raise AssertionError(f"{self.name} called")


def _forbid(monkeypatch, module, *names: str) -> None:
    for name in names:
        monkeypatch.setattr(module, name, _Forbidden(name))


def test_fused_backward_slots():
    from kernels import attention_window_op as wop

    # W=36 over tiles of 16 reaches 3 key tiles back (and 3 ahead without causality): 4 slots, or 7 from slot 3.
    assert wop.fused_slots(36, True, 16) == (4, 0)
    assert wop.fused_slots(36, False, 16) == (7, 3)
    assert wop.fused_slots(0, True, 16) == (1, 0)
    assert wop.fused_slots(256, True, 64) == (5, 0)  # the benchmark's window
    assert wop.fused_slots(200, True, 16) == (0, 0)  # 14 slots: too much scratch, two-kernel backward


@pytest.mark.parametrize("act,causal", [("softmax", True), ("gelu", False)])
def test_dispatch_takes_the_fused_backward(monkeypatch, act, causal):
    # With the two-kernel backward's kernels unable to launch, window backward passes still match the
    # reference (dq, dk, dv, both tables; targets in the softmax case): they took the fused kernels.
    from kernels import attention_window_op as wop

    assert wop.BACKWARD == "fused"
    _forbid(monkeypatch, wop, "window_attn_bwd_dq_kernel", "window_attn_bwd_dkdv_kernel")
    p = _self_problem(seed=47, heads=1, bias=True, targets=causal)
    assert_accurate(p, torch.float32, activation=act, causal=causal, window=20)


@pytest.mark.parametrize("backward,window", [("two", 20), ("fused", 200)])
def test_two_kernel_backward(monkeypatch, backward, window):
    # The two-kernel backward, switched on or for a window too long for the fused one's scratch, is the
    # same function (the fused kernels unable to launch).
    from kernels import attention_window_op as wop

    monkeypatch.setattr(wop, "BACKWARD", backward)
    _forbid(monkeypatch, wop, "window_attn_bwd_dkdv_ds_kernel", "window_attn_bwd_dq_ds_kernel", "softmax_delta")
    p = _self_problem(seed=53, heads=1, bias=True, targets=True)
    assert_accurate(p, torch.float32, causal=True, window=window)


def test_fused_backward_delta_in_the_loop(monkeypatch):
    # delta = rowsum(dO . o) computed in the dk/dv loop instead of by its own pass: same gradients.
    from kernels import attention_window_op as wop

    monkeypatch.setitem(wop.CONFIG, "fused", wop.CONFIG["fused"][:3] + (True,))
    _forbid(monkeypatch, wop, "softmax_delta")
    p = _self_problem(seed=59, heads=2, bias=True)
    assert_accurate(p, torch.float16, causal=False, window=36)


@pytest.mark.parametrize("by_tile,fold", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_backward_statistics_settings(monkeypatch, by_tile, fold, bias):
    # Softmax statistics read every H-th value or by query tile, entering the [keys, queries] products (no
    # bias tables) as their initial sums or subtracted after: the same gradients (the defaults: both on).
    from kernels import attention_window_op as wop

    assert wop.STATS_BY_TILE and wop.FOLD_STATS
    monkeypatch.setattr(wop, "STATS_BY_TILE", by_tile)
    monkeypatch.setattr(wop, "FOLD_STATS", fold)
    p = _self_problem(seed=61, heads=2, bias=bias)
    assert_accurate(p, torch.float32, causal=True, window=36)


def test_work_list_gives_a_rows_tiles_consecutively_last_first():
    # The fused backward finds a query tile's work item from its key tile's: item(i) = item(j) + j - i.
    from kernels.attention_op import work_list
    from tests.kernels.attention_cases import offsets

    offs = offsets([0, 1, 70, 17, 33, 0, 64])
    work, _ = work_list(offs, offs, 16, int(offs[-1]))
    rows = {}
    for item, (row, tile) in enumerate(work.tolist()):
        if row >= 0:
            rows.setdefault(row, []).append((item, tile))
    assert sorted(rows) == [1, 2, 3, 4, 6]
    for row, items in rows.items():
        first = items[0][0]
        assert [t for _, t in items] == list(range(len(items) - 1, -1, -1)), row
        assert [i for i, _ in items] == list(range(first, first + len(items))), row
