"""Random jagged attention problems and the accuracy rule shared by the kernel tests."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported by the kernels

from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402

from kernels import RelativeBias, jagged_attention  # noqa: E402

NUM_POS, NUM_TIME = 11, 8


@dataclass
class Problem:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    q_offsets: torch.Tensor
    kv_offsets: torch.Tensor
    pos: torch.Tensor | None
    time: torch.Tensor | None
    q_ts: torch.Tensor
    kv_ts: torch.Tensor
    num_targets: torch.Tensor | None


def offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int64)


def make_problem(seed: int, lq: list[int], lk: list[int], heads: int = 2, dim: int = 16, bias: bool = True,
                 targets: bool = False) -> Problem:
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lq), sum(lk)
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)
    nt = None
    if targets:
        nt = torch.tensor([int(torch.randint(0, min(n, 3) + 1, (1,), generator=g)) for n in lk])
    return Problem(
        q=rnd(tq, heads, dim), k=rnd(tk, heads, dim), v=rnd(tk, heads, dim), do=rnd(tq, heads, dim),
        q_offsets=offsets(lq), kv_offsets=offsets(lk),
        pos=rnd(NUM_POS, heads) if bias else None, time=rnd(NUM_TIME, heads) if bias else None,
        # Ascending event times (as in real histories), so the log time buckets spread over the table.
        q_ts=torch.randint(0, 6, (tq,), generator=g).cumsum(0), kv_ts=torch.randint(0, 6, (tk,), generator=g).cumsum(0),
        num_targets=nt,
    )


def self_problem(seed: int, lengths: list[int], heads: int = 2, bias: bool = True, targets: bool = False) -> Problem:
    """A problem whose rows attend to themselves through one offsets tensor (the block and window ops' case)."""
    p = make_problem(seed=seed, lq=lengths, lk=lengths, heads=heads, bias=bias, targets=targets)
    p.kv_offsets = p.q_offsets
    p.kv_ts = p.q_ts
    return p


def op_flops(p: Problem, **kw) -> dict[str, int]:
    """FLOPs by op name of one forward+backward through the Triton path (which ops ran)."""
    from torch.utils.flop_counter import FlopCounterMode

    leaves = [t.detach().float().requires_grad_() for t in (p.q, p.k, p.v)]
    with FlopCounterMode(display=False) as fc:
        out = jagged_attention(*leaves, p.q_offsets, p.kv_offsets, impl="triton", **kw)
        out.backward(p.do.float())
    return {str(op): n for op, n in fc.get_flop_counts()["Global"].items()}


def run(p: Problem, dtype: torch.dtype, impl: str, **kw) -> list[torch.Tensor]:
    """Output and gradients (q, k, v, tables) of one call, inputs cast to ``dtype``."""
    leaves = [t.detach().to(dtype).clone().requires_grad_() for t in (p.q, p.k, p.v)]
    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    tables = [None if t is None else t.detach().to(table_dtype).clone().requires_grad_() for t in (p.pos, p.time)]
    bias = None
    if p.pos is not None:
        bias = RelativeBias(tables[0], tables[1], p.q_ts, p.kv_ts)
    out = jagged_attention(*leaves, p.q_offsets, p.kv_offsets, bias=bias, num_targets=p.num_targets,
                           impl=impl, **kw)
    out.backward(p.do.to(dtype))
    grads = [t.grad for t in leaves] + [t.grad for t in tables if t is not None]
    return [out.detach()] + [torch.zeros(0) if gr is None else gr for gr in grads]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    denom = ref.norm().clamp_min(1e-12)
    return float((x.double() - ref).norm() / denom)


FLOOR = {torch.float32: 2e-6, torch.float16: 2e-4}


def assert_accurate(p: Problem, dtype: torch.dtype, **kw) -> None:
    """Kernel error vs float64 reference <= 2x the reference's own error in ``dtype`` (+ a small floor)."""
    exact = run(p, torch.float64, "ref", **kw)
    lowp = run(p, dtype, "ref", **kw)
    ours = run(p, dtype, "triton", **kw)
    names = ["out", "dq", "dk", "dv", "dpos", "dtime"]
    for name, o, lp, ex in zip(names, ours, lowp, exact):
        if ex.numel() == 0 or ex.norm() == 0:
            assert o.numel() == ex.numel() and torch.count_nonzero(o) == 0, name
            continue
        e, e_lp = rel_err(o, ex), rel_err(lp, ex)
        assert e <= 2 * e_lp + FLOOR[dtype], f"{name}: kernel error {e:.2e} > 2 x reference error {e_lp:.2e}"
