"""Configuration sweep of the jagged attention kernels on one standard batch (device README).

    python benchmarks/attention_configs.py A          # batch A: tiles, warps, stages; descriptors on/off
    python benchmarks/attention_configs.py B --quick  # only the shipped configuration, descriptors on/off

Each configuration runs the production ops (``gemtrain::jagged_attn_fwd`` / ``_bwd``) with that one
configuration pinned, so the times include everything a training step pays (work lists, the ``delta``
pass). The backward is swept one kernel at a time (the other kept at the shipped configuration), so a
row's difference to the shipped row is that kernel's. Times are CUDA-event medians in ms. A configuration
that does not compile or launch (shared memory, registers) is reported as such. ``--tiny`` runs a small
batch (the interpreter's CPU path) so the script is exercised in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Callable, Iterator

import torch
import triton

from benchmarks.attention import BATCHES as STANDARD_BATCHES
from benchmarks.attention import cuda_time, lengths
from kernels import attention_op as op
from kernels import attention_triton_common as common
from kernels.attention_triton_bwd import jagged_attn_bwd_dkdv_kernel, jagged_attn_bwd_dq_kernel
from kernels.attention_triton_fwd import jagged_attn_fwd_kernel

BATCHES = {**STANDARD_BATCHES, "tiny": (4, 96, 2, 32)}
# (outer tile, inner tile, warps, stages): forward and dq loop over KV under a query tile, dk/dv over Q.
FWD = [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (128, 32, 4, 3), (128, 32, 8, 4),
       (64, 64, 4, 3), (64, 128, 4, 3)]
DKDV = [(64, 32, 4, 2), (128, 32, 4, 2), (64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 8, 2), (128, 64, 4, 2),
        (128, 64, 8, 2), (64, 32, 4, 3)]
DQ = [(128, 32, 4, 2), (64, 32, 4, 2), (64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 4, 2), (128, 64, 8, 2),
      (64, 128, 4, 2), (128, 128, 8, 2)]
CALLS_PER_TIMING = 5
KERNELS = {"fwd": (jagged_attn_fwd_kernel, "BLOCK_N", "tile_q"),
           "dkdv": (jagged_attn_bwd_dkdv_kernel, "BLOCK_M", "tile_kv"),
           "dq": (jagged_attn_bwd_dq_kernel, "BLOCK_N", "tile_q_bwd")}


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median ms per call, five calls back to back per timing, after a 500 ms warm-up."""
    return cuda_time(fn, reps=reps, warm_ms=500.0, calls=CALLS_PER_TIMING)


@contextlib.contextmanager
def pinned(choice: dict[str, tuple[int, int, int, int]], tma: str) -> Iterator[None]:
    """Run the ops with one configuration per kernel (``None`` keeps the shipped one) and a descriptor mode."""
    saved = {name: (kern.configs, kern.cache) for name, (kern, _, _) in KERNELS.items()}
    plan, mode = op._plan, common.TMA
    tiles: dict[str, int] = {}
    for name, cfg in choice.items():
        kern, inner, outer = KERNELS[name]
        if cfg is None:
            continue
        hook = kern.configs[0].pre_hook
        kern.configs, kern.cache = [triton.Config({inner: cfg[1]}, num_warps=cfg[2], num_stages=cfg[3],
                                                  pre_hook=hook)], {}
        tiles[outer] = cfg[0]

    def pinned_plan(*args, **kwargs):
        p = plan(*args, **kwargs)
        return {**p, **{key: tiles[key] for key in ("tile_q", "tile_q_bwd", "tile_kv") if key in tiles}}

    common.TMA = tma
    op._plan = pinned_plan
    common._SETTLED.clear()  # settled launches are keyed by id(kernel.configs), which a new list may reuse
    try:
        yield
    finally:
        op._plan, common.TMA = plan, mode
        common._SETTLED.clear()
        for name, (kern, _, _) in KERNELS.items():
            kern.configs, kern.cache = saved[name][0], {}


def sweep(name: str, quick: bool, reps: int, lists: dict[str, list] | None = None) -> list[str]:
    B, max_len, H, D = BATCHES[name]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    lens = lengths(B, max_len)
    offs = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(dev)
    T = int(lens.sum())
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v, do = (torch.randn(T, H, D, device=dev, dtype=dtype, generator=g) for _ in range(4))
    len_key = triton.next_power_of_2(max_len)
    rows = [f"### Batch {name}: B={B}, max_len={max_len}, H={H}, D={D}, {str(dtype)[6:]}, ΣL={T}", "",
            "| mask | kernel | tiles (outer, inner), warps, stages | descriptors | fwd ms | bwd ms |",
            "|---|---|---|---|---|---|"]

    def args(causal: bool) -> tuple:
        return ("softmax", causal, D ** -0.5, 0, -1, 0, len_key, 0)

    def fwd(causal: bool):
        return torch.ops.gemtrain.jagged_attn_fwd(q, k, v, offs, offs, None, None, None, None, None, *args(causal))

    def run(causal: bool, kernel: str, choice: dict, tma: str) -> tuple[float, float]:
        t_f = t_b = math.inf
        try:
            with pinned(choice, tma):
                out, lse = fwd(causal)
                t_f = timed(lambda: fwd(causal), reps)
                t_b = timed(lambda: torch.ops.gemtrain.jagged_attn_bwd(
                    do, q, k, v, out, lse, offs, offs, None, None, None, None, None, *args(causal)), reps)
            res = f"{t_f:.3f} | {t_b:.3f}"
        except Exception as e:  # out of shared memory / registers: reported, the sweep goes on
            res = f"failed: {type(e).__name__} {str(e)[:60]} | -"
        cfg = choice.get(kernel)
        rows.append(f"| {'causal' if causal else 'full'} | {kernel} | {cfg or 'shipped'} | {tma} | {res} |")
        print(rows[-1], flush=True)
        return t_f, t_b

    lists = {"fwd": FWD, "dkdv": DKDV, "dq": DQ, **(lists or {})}
    best: dict[str, list] = {}
    for causal in (True, False):
        for tma in ("0", "1"):
            run(causal, "all", {}, tma)
        if quick:
            continue
        for kernel, configs in lists.items():
            # causal: every configuration; full: the two best of the causal sweep
            todo = configs if causal else best[kernel][:2]
            scored = []
            for cfg in todo:
                for tma in ("0", "1"):
                    t_f, t_b = run(causal, kernel, {kernel: cfg}, tma)
                    scored.append((t_f if kernel == "fwd" else t_b, cfg))
            if causal:
                best[kernel] = [cfg for _, cfg in sorted(scored, key=lambda x: x[0])]
                best[kernel] = list(dict.fromkeys(best[kernel]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("batch", choices=sorted(BATCHES))
    ap.add_argument("--quick", action="store_true", help="only the shipped configuration, descriptors off/on")
    ap.add_argument("--reps", type=int, default=10)
    for kernel in ("fwd", "dkdv", "dq"):
        ap.add_argument(f"--{kernel}", help=f"{kernel} configurations to try instead of the built-in list, "
                        "'outer,inner,warps,stages;...'")
    a = ap.parse_args()
    lists = {kernel: [tuple(int(x) for x in c.split(",")) for c in getattr(a, kernel).split(";")]
             for kernel in ("fwd", "dkdv", "dq") if getattr(a, kernel)}
    rows = sweep(a.batch, a.quick, a.reps, lists)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
