"""Triton jagged attention kernels (TRITON_INTERPRET=1, CPU) against the PyTorch reference."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.utils.flop_counter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels import jagged_attention, jagged_attention_flops
from tests.kernels.attention_cases import assert_accurate, make_problem, offsets, run

# Row lengths include 0, 1 and the maximum (24); the unequal case has Lq < Lkv, Lq > Lkv and Lq = 0 rows.
EQUAL = ([0, 1, 24, 9, 17], [0, 1, 24, 9, 17])
UNEQUAL = ([3, 1, 0, 5, 16], [0, 7, 24, 2, 20])
MASKS = {
    "none": {},
    "causal": {"causal": True},
    "targets": {"causal": True, "targets": True},
    "block": {"block_size": 8, "causal": True},
    "window": {"window": 5},
}
CASES = [(act, mask, lengths) for act, mask, lengths in
         itertools.product(("softmax", "silu", "gelu"), MASKS, ("equal", "unequal"))]


@pytest.mark.parametrize("act,mask,lengths", CASES)
def test_kernel_matches_reference(act, mask, lengths):
    i = CASES.index((act, mask, lengths))
    kw = dict(MASKS[mask])
    targets = kw.pop("targets", False)
    lq, lk = EQUAL if lengths == "equal" else UNEQUAL
    # Bias and dtype alternate over the cases so every activation x mask sees both of each.
    p = make_problem(seed=i, lq=lq, lk=lk, heads=1 + i % 2, bias=i % 2 == 0, targets=targets)
    dtype = torch.float32 if (i // 2) % 2 == 0 else torch.float16
    assert_accurate(p, dtype, activation=act, **kw)


def test_fixed_pointwise_norm_and_scale():
    p = make_problem(seed=100, lq=[6, 11], lk=[6, 11], bias=True)
    assert_accurate(p, torch.float32, activation="silu", causal=True, pointwise_norm=32, scale=0.3)


def test_head_dim_not_power_of_two_and_int32_offsets():
    p = make_problem(seed=101, lq=[5, 13], lk=[5, 13], dim=24, bias=False)
    p.q_offsets, p.kv_offsets = p.q_offsets.int(), p.kv_offsets.int()
    assert_accurate(p, torch.float32, causal=True)


def test_no_queries_at_all():
    p = make_problem(seed=102, lq=[0, 0], lk=[3, 4], bias=True)
    out, dq, dk, dv, dpos, dtime = run(p, torch.float32, "triton", causal=True)
    assert out.shape == (0, 2, 16) and dk.abs().sum() == 0 and dpos.abs().sum() == 0


@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    lengths=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=3),
    dim=st.sampled_from([16, 32]),
    heads=st.integers(1, 3),
    act=st.sampled_from(["softmax", "silu"]),
    causal=st.booleans(),
)
def test_shapes_property(lengths, dim, heads, act, causal):
    lq, lk = [a for a, _ in lengths], [b for _, b in lengths]
    p = make_problem(seed=7, lq=lq, lk=lk, heads=heads, dim=dim, bias=causal)
    assert_accurate(p, torch.float32, activation=act, causal=causal)


def test_flop_counter_counts_useful_flops():
    import kernels.attention_op  # noqa: F401  (registers the flop formulas before the counter snapshots them)

    p = make_problem(seed=103, lq=[9, 20, 1], lk=[9, 20, 1], bias=False)
    q, k, v = (t.float().requires_grad_() for t in (p.q, p.k, p.v))
    with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
        jagged_attention(q, k, v, p.q_offsets, p.kv_offsets, causal=True, impl="triton").sum().backward()
    expected = jagged_attention_flops(p.q_offsets, p.kv_offsets, 2, 16, causal=True, backward=True)
    assert counter.get_total_flops() == expected


def test_compiles_without_graph_breaks_and_checkpoints():
    p = make_problem(seed=104, lq=[4, 12], lk=[4, 12], bias=False)
    q, k, v = (t.float().requires_grad_() for t in (p.q, p.k, p.v))

    def f(q, k, v):
        return jagged_attention(q, k, v, p.q_offsets, p.kv_offsets, causal=True, impl="triton") * 2

    eager = f(q, k, v)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    torch.testing.assert_close(compiled, eager)
    ck = torch.utils.checkpoint.checkpoint(f, q, k, v, use_reentrant=False)
    ck.sum().backward()
    dq = q.grad.clone()
    q.grad = None
    eager.sum().backward()
    torch.testing.assert_close(dq, q.grad)


def test_work_list_covers_every_tile_once_longest_first():
    from kernels.attention_op import work_list

    lq, lk = [5, 0, 40, 17], [30, 3, 40, 17]
    work, n = work_list(offsets(lq), offsets(lk), 16, sum(lq))
    pairs = [tuple(x) for x in work.tolist() if x[0] >= 0]
    expected = {(b, t) for b, n_q in enumerate(lq) for t in range((n_q + 15) // 16)}
    assert len(pairs) == len(expected) and set(pairs) == expected and n >= len(pairs)
    assert [b for b, _ in pairs][:3] == [2, 2, 2] and pairs[0] == (2, 2)  # longest row, last tile first
    assert n == -(-sum(lq) // 16) + len(lq)  # a bound known without a device sync
    assert all(x == [-1, 0] for x in work.tolist()[len(pairs):])  # the rest: programs that exit at once


@pytest.mark.parametrize("cross", [False, True])
def test_backward_reuses_the_forward_work_list(monkeypatch, cross):
    from kernels import attention_op as op

    calls = []
    real = op.work_list
    monkeypatch.setattr(op, "work_list", lambda *a: calls.append(a[2]) or real(*a))
    lk = [40, 0, 17]
    lq = [3, 0, 5] if cross else lk
    q = torch.randn(sum(lq), 2, 16, requires_grad=True)
    k, v = (torch.randn(sum(lk), 2, 16, requires_grad=True) for _ in range(2))
    qo = offsets(lq)
    ko = offsets(lk) if cross else qo
    jagged_attention(q, k, v, qo, ko, causal=True, impl="triton").sum().backward()
    assert len(calls) == (2 if cross else 1)  # cross: the KV tiles are other rows than the query tiles


def test_config_prune_keeps_what_fits_in_shared_memory():
    import triton

    from kernels.attention_triton_common import smem_prune

    configs = [triton.Config({"BLOCK_N": bn}, num_warps=4, num_stages=3) for bn in (32, 64, 128)]
    prune = smem_prune("BLOCK_N", "BLOCK_M")
    bf16 = {"Q": torch.zeros(1, dtype=torch.bfloat16)}
    fp32 = {"Q": torch.zeros(1, dtype=torch.float32)}
    # bf16, D=128: every config fits; fp32, D=256: 64-wide tiles do not (the compiler asked 344 KB).
    assert prune(configs, bf16, BLOCK_D=128, BLOCK_M=128) == configs
    assert prune(configs, fp32, BLOCK_D=256, BLOCK_M=64) == configs[:1]
    kept = prune(configs[1:], fp32, BLOCK_D=256, BLOCK_M=128)  # nothing fits: a small single-stage one
    assert len(kept) == 1 and kept[0].num_stages == 1 and kept[0].kwargs["BLOCK_N"] == 16


def test_without_autotuning_each_head_dim_gets_its_measured_default(monkeypatch):
    from kernels import attention_triton_bwd as bwd
    from kernels import attention_triton_common as common
    from kernels import attention_triton_fwd as fwd

    monkeypatch.setattr(common, "INTERPRET", False)
    monkeypatch.setattr(common, "AUTOTUNE", False)
    bf16 = {"Q": torch.zeros(1, dtype=torch.bfloat16)}
    choose = lambda configs, prune, d, outer: prune(configs, bf16, BLOCK_D=d, **outer)
    fwd_configs = common.kernel_configs("BLOCK_N", fwd.DEFAULTS, fwd.CANDIDATES, None)
    assert len(fwd_configs) >= 2  # Triton prunes only when given more than one
    prune = common.config_prune("BLOCK_N", "BLOCK_M")
    for d, outer in ((32, 128), (64, 128), (128, 64)):
        (cfg,) = choose(fwd_configs, prune, d, {"BLOCK_M": outer})
        bound = min(b for b in fwd.DEFAULTS if b >= d)
        assert (cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages) == fwd.DEFAULTS[bound]
    dkdv = common.kernel_configs("BLOCK_M", bwd.DKDV_DEFAULTS, bwd.CANDIDATES, None)
    (cfg,) = choose(dkdv, common.config_prune("BLOCK_M", "BLOCK_N"), 128, {"BLOCK_N": 64})
    assert (cfg.kwargs["BLOCK_M"], cfg.num_warps, cfg.num_stages) == bwd.DKDV_DEFAULTS[128]
    monkeypatch.setattr(common, "AUTOTUNE", True)
    tuned = common.kernel_configs("BLOCK_N", fwd.DEFAULTS, fwd.CANDIDATES, None)
    assert len(tuned) > len(fwd_configs) and len(prune(tuned, bf16, BLOCK_D=64, BLOCK_M=128)) > 1


@pytest.mark.parametrize("cross", [False, True])
def test_eager_autograd_node_equals_the_ops_registered_autograd(monkeypatch, cross):
    # Eager calls run both ops under one autograd.Function; compiled code (and callers of the raw op) use
    # the forward op's registered autograd. Both must give the same output and gradients bit for bit.
    lk = [9, 0, 1, 16]
    p = make_problem(seed=107, lq=[3, 0, 1, 2] if cross else lk, lk=lk, bias=True)
    kw = dict(causal=not cross)
    eager = run(p, torch.float32, "triton", **kw)
    q = p.q.float().requires_grad_()
    node = jagged_attention(q, p.k.float(), p.v.float(), p.q_offsets, p.kv_offsets, impl="triton", **kw).grad_fn
    assert type(node).__name__ == "_JaggedAttentionBackward"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    registered = run(p, torch.float32, "triton", **kw)
    assert len(eager) == len(registered) == 6
    for a, b in zip(eager, registered):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dim", [32, 48, 128])
def test_softmax_delta_pass_equals_the_float_product(dim):
    """The backward's one-pass ``delta`` against the fp32 row dot product: jagged rows of 0, 1, the tile and
    beyond it (partial last tiles), and a head dim that is not a power of two."""
    from kernels.attention_op import softmax_delta, work_list

    g = torch.Generator().manual_seed(dim)
    offs = offsets([5, 0, 1, 32, 39])
    total = int(offs[-1])
    out = torch.randn(total, 3, dim, generator=g).to(torch.float16)
    do = torch.randn(total, 3, dim, generator=g).to(torch.float16)
    delta = softmax_delta(out, do, offs, work_list(offs, offs, 16, total)[0], 16)
    assert delta.shape == (total, 3) and delta.dtype == torch.float32
    torch.testing.assert_close(delta, (do.float() * out.float()).sum(-1), rtol=1e-5, atol=1e-5)


def test_softmax_statistics_by_query_tile():
    """With the log-sum-exp, the pass lays out both statistics by (head, work item, query of the tile), the
    fused window backward's layout: every tile's run whole, +inf and 0 at queries past the row's end."""
    from kernels.attention_op import softmax_delta, work_list

    g = torch.Generator().manual_seed(5)
    lens = [5, 0, 1, 32, 39]
    offs = offsets(lens)
    total, heads, tile = int(offs[-1]), 3, 16
    out = torch.randn(total, heads, 32, generator=g).to(torch.float16)
    do = torch.randn(total, heads, 32, generator=g).to(torch.float16)
    lse = torch.randn(total, heads, generator=g)
    work = work_list(offs, offs, tile, total)[0]
    stats = softmax_delta(out, do, offs, work, tile, lse)
    assert stats.shape == (2, heads, work.shape[0] * tile)
    want = torch.stack([torch.full_like(stats[0], float("inf")), torch.zeros_like(stats[1])])
    delta = (do.float() * out.float()).sum(-1)
    seen = 0
    for item, (row, first) in enumerate(work.tolist()):
        if row < 0:  # an unused item: no program reads its run
            stats[:, :, item * tile:(item + 1) * tile] = want[:, :, item * tile:(item + 1) * tile]
            continue
        start, end = int(offs[row]) + first * tile, min(int(offs[row]) + (first + 1) * tile, int(offs[row + 1]))
        seen += end - start
        run = slice(item * tile, item * tile + end - start)
        want[0, :, run], want[1, :, run] = lse[start:end].T, delta[start:end].T
    assert seen == total
    torch.testing.assert_close(stats, want, rtol=1e-5, atol=1e-5)


def test_autotune_reset_arguments_never_alias_an_input(monkeypatch):
    """The dk/dv kernel's autotuner zeroes DPOSW/DTIMEW between trial runs: without tables their stand-ins
    must be scratch, not an input (an aliased lse would be zeroed before the real run)."""
    from kernels import attention_op

    kernel = attention_op.jagged_attn_bwd_dkdv_kernel
    launches = []
    real_launch = attention_op.launch

    def spy(kern, grid, args, meta, key):
        if kern is kernel:
            launches.append(dict(zip(kernel.arg_names, args)))
        return real_launch(kern, grid, args, meta, key)

    monkeypatch.setattr(attention_op, "launch", spy)
    p = make_problem(seed=300, lq=[5, 9], lk=[5, 9], heads=1, bias=False)
    run(p, torch.float32, "triton", causal=True)
    assert launches and set(kernel.reset_to_zero) == {"DPOSW", "DTIMEW"}
    inputs = [t for name, t in launches[0].items() if name in ("Q", "K", "V", "DO", "LSE", "DELTA", "DK", "DV")]
    for name in kernel.reset_to_zero:
        assert all(launches[0][name].data_ptr() != t.data_ptr() for t in inputs), name


def test_pointwise_activations_through_tanh_equal_the_exact_forms():
    """The GPU's bf16 path computes sigmoid(x) as 0.5 + 0.5 tanh(x / 2) and gelu's inner 2 sigmoid(2u) - 1 as
    tanh(u) (``attention_triton_common``); the interpreter (these tests) takes the exact forms."""
    from kernels import attention_triton_common as common

    x = torch.linspace(-30, 30, 2001, dtype=torch.float64)
    torch.testing.assert_close(0.5 + 0.5 * torch.tanh(0.5 * x), torch.sigmoid(x), rtol=1e-12, atol=1e-15)
    u = 0.7978845608028654 * (x + 0.044715 * x**3)
    torch.testing.assert_close(torch.tanh(u), 2.0 * torch.sigmoid(2.0 * u) - 1.0, rtol=1e-12, atol=1e-12)
    assert not common.FAST_TANH.value, "under the interpreter the kernels must take the exact formulas"


def test_settled_launch_skips_the_autotuner_and_matches_it(monkeypatch):
    """After a kernel's first launch per key, ``common.launch`` calls the JIT function with the configuration
    the autotuner chose (its descriptor hook and table-size heuristics applied): same outputs bit for bit."""
    from kernels import attention_op
    from kernels import attention_triton_common as common

    monkeypatch.setattr(common, "_SETTLED", {})
    kernel = attention_op.jagged_attn_fwd_kernel
    through_autotuner = []
    real_run = kernel.run
    monkeypatch.setattr(kernel, "run", lambda *a, **kw: through_autotuner.append(1) or real_run(*a, **kw))
    p = make_problem(seed=31, lq=[7, 0, 1, 40], lk=[7, 0, 1, 40], bias=True)
    first = run(p, torch.float32, "triton", causal=True)
    assert len(through_autotuner) == 1 and len(common._SETTLED) >= 1
    second = run(p, torch.float32, "triton", causal=True)
    assert len(through_autotuner) == 1, "the second forward must skip the autotuner"
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    run(p, torch.float16, "triton", causal=True)  # another key: through the autotuner again
    assert len(through_autotuner) == 2


def test_eager_calls_run_the_op_body_unless_a_dispatch_mode_watches(monkeypatch):
    """Eager autograd calls the op's Python body directly; under a dispatch mode (FLOP counting, fake tensors)
    the registered op runs, so the mode sees it."""
    from torch.utils.flop_counter import FlopCounterMode

    from kernels import attention_op

    body = attention_op._BODIES["jagged_attn_fwd"]
    direct = []
    monkeypatch.setitem(attention_op._BODIES, "jagged_attn_fwd", lambda *a: direct.append(1) or body(*a))
    call = attention_op.eager_call("jagged_attn_fwd")
    p = make_problem(seed=5, lq=[3, 4], lk=[3, 4], bias=False)
    q, k, v = p.q.float(), p.k.float(), p.v.float()
    args = (q, k, v, p.q_offsets, p.kv_offsets, None, None, None, None, None, "softmax", True, 0.5, 0, -1, 0, 16, 0)
    out, _ = call(*args)
    assert direct == [1]
    with FlopCounterMode(display=False) as counter:
        out_mode, _ = call(*args)
    assert direct == [1] and counter.get_total_flops() > 0
    assert torch.equal(out, out_mode)


def test_generic_backward_takes_delta_from_its_dq_kernel(monkeypatch):
    """The generic backward's dq kernel computes softmax's delta (no separate pass), before the dk/dv kernel
    reads it: gradients still match the float64 reference, rows of 0, 1 and several tiles."""
    from kernels import attention_op

    def no_pass(*args, **kwargs):
        raise AssertionError("the generic backward must not run the separate delta pass")

    monkeypatch.setattr(attention_op, "softmax_delta", no_pass)
    p = make_problem(seed=77, lq=[0, 1, 40, 70], lk=[0, 1, 40, 70], bias=True, targets=True)
    got = run(p, torch.float32, "triton", causal=True)
    want = run(p, torch.float64, "ref", causal=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)
