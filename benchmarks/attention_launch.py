"""Host time of the jagged attention forward's parts on the GPU: work list, kernel launch, whole op.

    python benchmarks/attention_launch.py B

Each part runs back to back many times with the GPU kept busy, so the wall time per call is the
host's (the launches queue behind the GPU); descriptors off and on.
"""

from __future__ import annotations

import sys
import time

import torch
import triton

from benchmarks.attention import BATCHES, lengths
from kernels import attention_op as op
from kernels import attention_triton_common as common


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
    offs = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).cuda()
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


if __name__ == "__main__":
    main(*(sys.argv[1:2] or ["B"]))
