"""Host time of the jagged attention forward's parts on the GPU: work list, kernel launch, whole op.

    python benchmarks/attention_launch.py B            # forward parts
    python benchmarks/attention_launch.py B backward   # backward op, autograd round trip, host profile

Each part runs back to back many times with the GPU kept busy, so the wall time per call is the
host's (the launches queue behind the GPU); descriptors off and on.
"""

from __future__ import annotations

import sys
import time

import torch
import triton

from benchmarks.attention import BATCHES, lengths, offsets_of
from kernels import attention_op as op
from kernels import attention_triton_common as common
from kernels import jagged_attention


def per_call_us(fn, n: int = 200) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return host


def main(name: str = "B") -> None:
    B, max_len, H, D = BATCHES[name]
    lens = lengths(B, max_len)
    offs = offsets_of(lens)
    T = int(lens.sum())
    q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    args = ("softmax", True, D ** -0.5, 0, -1, 0, triton.next_power_of_2(max_len), 0)
    fwd = lambda: torch.ops.gemtrain.jagged_attn_fwd(q, k, v, offs, offs, None, None, None, None, None, *args)
    print(f"batch {name}: work_list {per_call_us(lambda: op.work_list(offs, offs, 64, T)):.0f} us/call")
    for mode in ("0", "1"):
        common.TMA = mode
        fwd()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fwd()
        torch.cuda.synchronize()
        one = (time.perf_counter() - t0) * 1e6
        print(f"descriptors {mode}: whole forward op {per_call_us(fwd, 50):.0f} us/call host back to back, "
              f"one synchronized call {one:.0f} us")
        plan = op._plan(q, k, args[6], 0, 0, v)
        both = lambda on=plan["tma"]: (op.descriptor(k, on), op.descriptor(v, on))
        print(f"  descriptor() x2 {per_call_us(both):.1f} us/call")


def backward(name: str = "B") -> None:
    """Host time of the backward op and of an autograd forward+backward, and where the host spends it."""
    B, max_len, H, D = BATCHES[name]
    lens = lengths(B, max_len)
    offs = offsets_of(lens)
    T = int(lens.sum())
    q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    args = ("softmax", True, D ** -0.5, 0, -1, 0, triton.next_power_of_2(max_len), 0)
    out, lse = torch.ops.gemtrain.jagged_attn_fwd(q, k, v, offs, offs, None, None, None, None, None, *args)
    do = torch.randn_like(out)
    bwd = lambda: torch.ops.gemtrain.jagged_attn_bwd(do, q, k, v, out, lse, offs, offs, None, None, None, None,
                                                     None, *args)
    print(f"batch {name}: backward op {per_call_us(bwd, 50):.0f} us/call host back to back")
    delta = lambda: (do.float() * out.float()).sum(-1)
    print(f"  delta pass {per_call_us(delta):.0f} us/call")

    def round_trip() -> None:
        o = jagged_attention(q, k, v, offs, offs, causal=True, max_q_len=max_len, max_kv_len=max_len)
        o.backward(do)

    print(f"  autograd forward+backward {per_call_us(round_trip, 50):.0f} us/call host back to back")
    raw = lambda: op._BODIES["jagged_attn_bwd"](do, q, k, v, out, lse, offs, offs, None, None, None, None, None,
                                              *args)
    print(f"  backward body without the custom-op dispatch {per_call_us(raw, 50):.0f} us/call")
    spent: dict[str, float] = {}
    _time_launches(spent)
    n = 50
    per_call_us(raw, n)
    for name, total in spent.items():
        print(f"  {name} launch {total / (n + 10) * 1e6:.0f} us/call")
    plan = lambda: op._plan(q, k, args[6], 0, 0, v, do)
    print(f"  _plan {per_call_us(plan):.0f} us, 3 empty + 2 zeros "
          f"{per_call_us(lambda: [torch.empty_like(q) for _ in range(3)] + [torch.zeros(0, device='cuda')] * 2):.0f} us")


def _time_launches(spent: dict[str, float]) -> None:
    """Accumulate the host time of each autotuned kernel's launches (``common.launch``) in ``spent``, by kernel."""
    launch = op.launch

    def timed(kernel, grid, args, meta, key):
        t0 = time.perf_counter()
        launch(kernel, grid, args, meta, key)
        name = kernel.base_fn.__name__
        spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

    op.launch = timed


if __name__ == "__main__":
    (backward if sys.argv[2:3] == ["backward"] else main)(*(sys.argv[1:2] or ["B"]))
