"""A warp-specialized GEMM in Gluon (Triton's explicit layer) against cuBLAS: the route for warp-specialized
attention kernels on this Triton.

    python benchmarks/gluon_ws_gemm.py            # on the GPU: C = A @ B^T, bf16, against torch's matmul
    python benchmarks/gluon_ws_gemm.py --offline  # compile for sm_90a on a machine without a GPU

Triton 3.6's automatic warp specialization (``tl.range(..., warp_specialize=True)``) aborts on the attention
kernels (benchmarks/RESULTS.md, "Warp specialization through Triton 3.6"). Gluon states the partitions itself:
here one producer warp issues the tensor-memory copies of A and B tiles into a ring of ``NUM_BUF`` shared-memory
stages, and the default partition (one or two warpgroups) runs the wgmma products and the epilogue. The two sides
hand stages over through mbarriers (``ready``: a stage's tiles landed; ``empty``: its product is done). Each row
times our kernel and cuBLAS in the same run and prints the ratio; the outputs are compared first.
``--offline`` prints registers, spills, and whether the PTX holds wgmma and the register hand-over of warp
specialization (``setmaxnreg``). The CPU test runs it with the CI's Triton.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (BLOCK_M, BLOCK_N, BLOCK_K, NUM_BUF, warps of the default partition)
CONFIGS = [(128, 128, 64, 4, 4), (128, 256, 64, 3, 8)]
SHAPE = (16384, 4096, 4096)  # M, N, K


@gluon.jit
def _load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, off_m, off_n, k_tiles, BLOCK_K: gl.constexpr,
                    NUM_BUF: gl.constexpr):
    """One warp: the tiles of A and B for each K step, into the next free stage."""
    for i in range(k_tiles):
        s = i % NUM_BUF
        mbarrier.wait(empty.index(s), ((i // NUM_BUF) & 1) ^ 1)  # barriers start "completed": the first pass is free
        mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(a_desc, [off_m, i * BLOCK_K], ready.index(s), a_bufs.index(s))
        tma.async_copy_global_to_shared(b_desc, [off_n, i * BLOCK_K], ready.index(s), b_bufs.index(s))


@gluon.jit
def _mma_partition(c_desc, a_bufs, b_bufs, ready, empty, off_m, off_n, k_tiles, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, num_warps: gl.constexpr):
    """The default partition: one wgmma per K step, one in flight while the next stage lands; then the tile's
    store through shared memory."""
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BLOCK_N, 16])
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
    for i in range(k_tiles):
        s = i % NUM_BUF
        mbarrier.wait(ready.index(s), (i // NUM_BUF) & 1)
        acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        if i > 0:  # the previous step's product is done: its stage can be refilled
            mbarrier.arrive(empty.index((i - 1) % NUM_BUF), count=1)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    c_smem.store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def ws_gemm_kernel(a_desc, b_desc, c_desc, K, NUM_BUF: gl.constexpr, num_warps: gl.constexpr):
    """One ``[BLOCK_M, BLOCK_N]`` tile of C = A @ B^T per program."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_BUF] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_BUF] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    off_m = gl.program_id(0) * BLOCK_M
    off_n = gl.program_id(1) * BLOCK_N
    k_tiles = gl.cdiv(K, BLOCK_K)
    # Triton 3.6's partitions return nothing here (a returned tensor fails to lower), so the epilogue stays in the
    # default partition.
    gl.warp_specialize([
        (_mma_partition, (c_desc, a_bufs, b_bufs, ready, empty, off_m, off_n, k_tiles, BLOCK_M, BLOCK_N, NUM_BUF,
                          num_warps)),
        (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, off_m, off_n, k_tiles, BLOCK_K, NUM_BUF)),
    ], [1], [24])


def ws_gemm(a: torch.Tensor, b: torch.Tensor, config: tuple, compile_only: bool = False):
    """C = a @ b^T (bf16 ``[M, K]`` and ``[N, K]``); ``compile_only``: the compiled kernel, nothing launched."""
    block_m, block_n, block_k, num_buf, warps = config
    c = torch.empty(a.shape[0], b.shape[0], dtype=a.dtype, device=a.device)

    def desc(t, block):
        return TensorDescriptor(t, list(t.shape), list(t.stride()), block,
                                gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))

    args = (desc(a, [block_m, block_k]), desc(b, [block_n, block_k]), desc(c, [block_m, block_n]), a.shape[1],
            num_buf)
    grid = (triton.cdiv(a.shape[0], block_m), triton.cdiv(b.shape[0], block_n))
    if compile_only:
        return ws_gemm_kernel.warmup(*args, num_warps=warps, grid=grid)
    ws_gemm_kernel[grid](*args, num_warps=warps)
    return c


def offline_target() -> None:
    """Compile for sm_90a from here on, on a machine without a GPU (nothing can launch)."""
    from triton.runtime.driver import driver

    from benchmarks.kernel_resources import _TargetOnlyDriver

    driver.set_active(_TargetOnlyDriver())


def ws_report(ptx: str) -> dict:
    """A warp-specialized kernel's PTX: ptxas registers and spills, wgmma instructions, and the register budgets
    its partitions set (``setmaxnreg``; none without warp specialization)."""
    import re

    from benchmarks.kernel_resources import _ptxas_report

    budgets = sorted(set(re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)), key=int)
    return {**_ptxas_report(ptx), "wgmma": ptx.count("wgmma.mma_async"), "budgets": [int(b) for b in budgets]}


def ws_cells(ptx: str) -> str:
    """The table cells ``registers | spill stores/loads | wgmma | setmaxnreg of the partitions`` of a kernel."""
    rep = ws_report(ptx)
    return f"{rep['regs']} | {rep['spill']} | {rep['wgmma']} | {', '.join(map(str, rep['budgets'])) or 'none'}"


def offline() -> list[str]:
    """Each configuration compiled for sm_90a without a GPU: registers, spills, wgmma, setmaxnreg."""
    offline_target()
    a, b = torch.zeros(1024, 512, dtype=torch.bfloat16), torch.zeros(512, 512, dtype=torch.bfloat16)
    rows = ["| config (BLOCK_M, BLOCK_N, BLOCK_K, NUM_BUF, warps) | registers | spill stores/loads | wgmma | "
            "setmaxnreg |", "|---|---|---|---|---|"]
    for config in CONFIGS:
        rep = ws_report(ws_gemm(a, b, config, compile_only=True).asm["ptx"])
        rows.append(f"| {config} | {rep['regs']} | {rep['spill']} | {'yes' if rep['wgmma'] else 'no'} | "
                    f"{'yes' if rep['budgets'] else 'no'} |")
    return rows


def bench() -> list[str]:
    from triton.testing import do_bench

    m, n, k = SHAPE
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
    ref = a @ b.T
    flops = 2 * m * n * k
    rows = [f"C = A @ B^T, M={m}, N={n}, K={k}, bf16", "",
            "| config (BLOCK_M, BLOCK_N, BLOCK_K, NUM_BUF, warps) | rel. error vs cuBLAS | ours ms | cuBLAS ms | "
            "ours TFLOP/s | cuBLAS TFLOP/s | ours / cuBLAS |", "|---|---|---|---|---|---|---|"]
    for config in CONFIGS:
        c = ws_gemm(a, b, config)
        err = ((c.float() - ref.float()).norm() / ref.float().norm()).item()
        ours, theirs = do_bench(lambda c=config: ws_gemm(a, b, c)), do_bench(lambda: a @ b.T)
        rows.append(f"| {config} | {err:.1e} | {ours:.3f} | {theirs:.3f} | {flops / ours / 1e9:.0f} | "
                    f"{flops / theirs / 1e9:.0f} | {theirs / ours:.2f}x |")
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str], doc: str, script: str, offline_rows, bench_rows) -> None:
    """The Gluon benchmarks' command line: ``--help``, ``--offline`` (compile only), else the GPU run."""
    if any(a in ("-h", "--help") for a in argv):
        sys.exit(doc)
    if "--offline" in argv:
        print("\n".join(offline_rows()))
    elif not torch.cuda.is_available():
        sys.exit(f"{script} times the kernels on the GPU: run it on a CUDA machine (or pass --offline)")
    else:
        print("\n".join(bench_rows()))


if __name__ == "__main__":
    main(sys.argv[1:], __doc__, "gluon_ws_gemm.py", offline, bench)
