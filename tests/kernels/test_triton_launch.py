"""``kernels.triton_launch.run``: the launch it makes equals ``fn[grid]`` (on CPU: the interpreter's path, which
``run`` hands to ``fn[grid]``; the direct launch of compiled kernels is checked on a GPU by
``benchmarks/attention_host.py launchcheck``)."""

import torch
import triton
import triton.language as tl

from kernels import triton_launch


@triton.jit
def _add_kernel(src, dst, n, delta, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + i, tl.load(src + i, mask=i < n) + delta, mask=i < n)


def test_run_launches_like_the_grid_call_and_leaves_the_callers_arguments_alone():
    src = torch.randn(50)
    for n in (1, 16, 17, 50):
        ours, theirs = torch.zeros(n), torch.zeros(n)
        kwargs = dict(BLOCK=16)
        triton_launch.run(_add_kernel, (triton.cdiv(n, 16),), src[:n], ours, n, 2.5, **kwargs)
        _add_kernel[(triton.cdiv(n, 16),)](src[:n], theirs, n, 2.5, BLOCK=16)
        assert torch.equal(ours, theirs) and torch.equal(ours, src[:n] + 2.5)
        assert kwargs == dict(BLOCK=16)
    assert not triton_launch._COMPILED  # the interpreter has no compiled kernels to launch directly
