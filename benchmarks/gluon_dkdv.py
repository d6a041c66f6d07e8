"""A warp-specialized attention dk/dv kernel in Gluon, against our Triton dk/dv kernel: a prototype.

    python benchmarks/gluon_dkdv.py            # on the GPU: batch A (device README), causal and full softmax
    python benchmarks/gluon_dkdv.py --offline  # compile for sm_90a on a machine without a GPU

The backward's dk/dv pass of ``jagged_attention`` (softmax, no bias tables, self-attention, D = 128, bf16), written
with explicit partitions (``benchmarks/gluon_ws_gemm.py`` is the pattern): one producer warp streams the Q and
dO tiles of the query tiles a key tile sees into a ring of shared-memory stages (tensor-memory copies, mbarrier
hand-over); the default partition holds K and V in shared memory and runs the four products per pair on wgmma,
with P^T and dS^T as register operands (the [keys, queries] tiles of ``attention_triton_bwd``). It reads the
forward's log-sum-exp and softmax's delta as the Triton kernel does. Not wired into ``kernels``: on an H200 it
measured 0.85-0.92x the Triton kernel's speed (benchmarks/RESULTS.md, "A warp-specialized dk/dv kernel in Gluon");
it is the starting point for the warp-specialized backward. The GPU run checks dK and dV against the Triton backward first,
then times both kernels the same way (torch.profiler kernel time) and prints the ratio. ``--offline`` prints
registers, spills and the warp-specialization markers; the CPU test runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (key tile BLOCK_N, warps of the default partition, stages, maxnreg); query tiles are 64 rows
CONFIGS = [(64, 4, 2, 128), (128, 8, 2, 168), (128, 8, 3, 168)]
BLOCK_M = 64


@gluon.jit
def _producer(q_desc, do_desc, q_bufs, do_bufs, ready, empty, start, j0, n_tiles, col,
              BLOCK_M: gl.constexpr, NUM_BUF: gl.constexpr):
    """One warp: the Q and dO tiles of each query tile the key tile sees, into the next free stage."""
    for it in range(n_tiles):
        s = it % NUM_BUF
        mbarrier.wait(empty.index(s), ((it // NUM_BUF) & 1) ^ 1)
        mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        r = (start + (j0 + it) * BLOCK_M).to(gl.int32)
        tma.async_copy_global_to_shared(q_desc, [r, col], ready.index(s), q_bufs.index(s))
        tma.async_copy_global_to_shared(do_desc, [r, col], ready.index(s), do_bufs.index(s))


@gluon.jit
def _consumer(k_smem, v_smem, kv_bar, q_bufs, do_bufs, ready, empty, LSE, DELTA, DK, DV, start, L, k0, j0, n_tiles,
              h, qk_scale, scale, H: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """The default partition: per query tile S^T = K Q^T and dP^T = V dO^T (K, V resident in shared memory), then
    P^T and dS^T from registers into dV += P^T dO and dK += dS^T Q; dK and dV stored at the end. Queries past the
    row (the next row's tokens in a stage) get P = 0 through their log-sum-exp of +inf; key rows past it are not
    stored."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    dk = gl.zeros((BLOCK_N, HEAD_DIM), dtype=gl.float32, layout=acc_layout)
    dv = gl.zeros((BLOCK_N, HEAD_DIM), dtype=gl.float32, layout=acc_layout)
    zero_s = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=s_layout)
    offs_k = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    mbarrier.wait(kv_bar, 0)
    for it in range(n_tiles):
        s = it % NUM_BUF
        mbarrier.wait(ready.index(s), (it // NUM_BUF) & 1)
        q = q_bufs.index(s)
        do = do_bufs.index(s)
        st = warpgroup_mma(k_smem, q.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_smem, do.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        offs_q = (j0 + it) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
        q_ok = offs_q < L
        lse = gl.load(LSE + (start + offs_q) * H + h, mask=q_ok, other=float("inf"))
        delta = gl.load(DELTA + (start + offs_q) * H + h, mask=q_ok, other=0.0)
        st, dpt = warpgroup_mma_wait(num_outstanding=0, deps=(st, dpt))
        pt = gl.exp2(st * qk_scale - lse[None, :])
        if CAUSAL:
            if (j0 + it) * BLOCK_M < k0 + BLOCK_N:  # a diagonal tile: a key sees the queries at or after it
                pt = gl.where(offs_k[:, None] <= offs_q[None, :], pt, 0.0)
        dst = pt * (dpt - delta[None, :])
        pa = gl.convert_layout(pt.to(gl.bfloat16), a_layout)
        dsa = gl.convert_layout(dst.to(gl.bfloat16), a_layout)
        dv = warpgroup_mma(pa, do, dv, is_async=True)
        dk = warpgroup_mma(dsa, q, dk, is_async=True)
        dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
        mbarrier.arrive(empty.index(s), count=1)
    rows = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    ptrs = (start + rows)[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + cols[None, :]
    ok = (rows < L)[:, None] & (cols < HEAD_DIM)[None, :]
    gl.store(DK + ptrs, (dk * scale).to(gl.bfloat16), mask=ok)
    gl.store(DV + ptrs, dv.to(gl.bfloat16), mask=ok)


@gluon.jit
def gluon_dkdv_kernel(q_desc, do_desc, k_desc, v_desc, LSE, DELTA, DK, DV, OFF, WORK, qk_scale, scale,
                      H: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """One program per (key tile of the work list, head); padding items (row -1) run no query tile."""
    pid = gl.program_id(0)
    item = pid // H
    h = pid % H
    row = gl.load(WORK + 2 * item)
    valid = row >= 0
    row = gl.maximum(row, 0)
    nblk = gl.load(WORK + 2 * item + 1)
    start = gl.load(OFF + row).to(gl.int64)
    L = (gl.load(OFF + row + 1) - start).to(gl.int32)
    L = gl.where(valid, L, 0)
    k0 = nblk * BLOCK_N
    j0 = 0
    if CAUSAL:
        j0 = k0 // BLOCK_M
    n_tiles = gl.maximum(gl.cdiv(L, BLOCK_M) - j0, 0)
    col = h * HEAD_DIM
    k_smem = gl.allocate_shared_memory(k_desc.dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [NUM_BUF] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [NUM_BUF] + do_desc.block_type.shape, do_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    kr = (start + k0).to(gl.int32)
    tma.async_copy_global_to_shared(k_desc, [kr, col], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [kr, col], kv_bar, v_smem)
    gl.warp_specialize([
        (_consumer, (k_smem, v_smem, kv_bar, q_bufs, do_bufs, ready, empty, LSE, DELTA, DK, DV, start, L, k0, j0,
                     n_tiles, h, qk_scale, scale, H, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUF, CAUSAL, num_warps)),
        (_producer, (q_desc, do_desc, q_bufs, do_bufs, ready, empty, start, j0, n_tiles, col, BLOCK_M, NUM_BUF)),
    ], [1], [24])


def gluon_dkdv(q, k, v, do, lse, delta, offsets, work, scale: float, causal: bool, config: tuple,
               compile_only: bool = False):
    """(dK, dV) of softmax attention over the jagged rows of ``offsets``; ``work``: ``attention_op.work_list`` at
    the config's key tile; ``lse`` base 2 as the forward stores it; ``delta = rowsum(dO . o)``."""
    block_n, warps, stages, maxnreg = config
    T, H, D = q.shape
    dk, dv = torch.empty_like(k), torch.empty_like(v)

    def desc(t, rows):
        return TensorDescriptor(t.view(T, H * D), [T, H * D], [H * D, 1], [rows, D],
                                gl.NVMMASharedLayout.get_default_for([rows, D], gl.bfloat16))

    grid = (work.shape[0] * H,)
    args = (desc(q, BLOCK_M), desc(do, BLOCK_M), desc(k, block_n), desc(v, block_n), lse, delta, dk, dv, offsets,
            work, scale * 1.4426950408889634, scale)
    meta = dict(H=H, HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=block_n, NUM_BUF=stages, CAUSAL=causal, num_warps=warps,
                maxnreg=maxnreg)
    if compile_only:
        return gluon_dkdv_kernel.warmup(*args, grid=grid, **meta)
    gluon_dkdv_kernel[grid](*args, **meta)
    return dk, dv


def offline() -> list[str]:
    """Each configuration compiled for sm_90a without a GPU (causal and full)."""
    from benchmarks.gluon_ws_gemm import offline_target, ws_report

    offline_target()
    T, H, D = 1000, 8, 128
    x = torch.zeros(T, H, D, dtype=torch.bfloat16)
    stats = torch.zeros(T, H)
    offsets, work = torch.tensor([0, 500, 1000]), torch.zeros(20, 2, dtype=torch.int32)
    rows = ["| mask | config (BLOCK_N, warps, stages, maxnreg) | registers | spill stores/loads | wgmma | "
            "setmaxnreg of the partitions |", "|---|---|---|---|---|---|"]
    for causal in (True, False):
        for config in CONFIGS:
            rep = ws_report(gluon_dkdv(x, x, x, x, stats, stats, offsets, work, 0.088, causal, config, True).asm["ptx"])
            rows.append(f"| {'causal' if causal else 'full'} | {config} | {rep['regs']} | {rep['spill']} | "
                        f"{rep['wgmma']} | {', '.join(map(str, rep['budgets'])) or 'none'} |")
    return rows


def _kernel_us(fn, name: str, calls: int = 5) -> float:
    """Median GPU time of the kernels whose name starts with ``name`` over ``calls`` calls (torch.profiler)."""
    from benchmarks.attention import profiled_kernels

    times = sorted(e.time_range.elapsed_us() for e in profiled_kernels(fn, calls) if e.name.startswith(name))
    return times[len(times) // 2]


def bench() -> list[str]:
    from benchmarks.attention import BATCHES, lengths, offsets_of, rel_err
    from kernels.attention_op import work_list

    B, max_len, H, D = BATCHES["A"]
    lens = lengths(B, max_len)
    offs, T = offsets_of(lens), int(lens.sum())
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    scale = D ** -0.5
    rows = [f"Batch A: B={B}, max_len={max_len}, H={H}, D={D}, ΣL={T}, bf16; GPU us per kernel (profiler medians of 5)",
            "", "| mask | kernel | dK err vs Triton | dV err vs Triton | GPU us | Triton / this |",
            "|---|---|---|---|---|---|"]
    for causal in (True, False):
        op_args = ("softmax", causal, scale, 0, -1, 0, max_len, 0)
        out, lse = torch.ops.gemtrain.jagged_attn_fwd(q, k, v, offs, offs, None, None, None, None, None, *op_args)
        delta = (do.float() * out.float()).sum(-1)

        def triton_bwd(out=out, lse=lse, op_args=op_args):
            return torch.ops.gemtrain.jagged_attn_bwd(do, q, k, v, out, lse, offs, offs, None, None, None, None,
                                                      None, *op_args)

        ref = triton_bwd()
        base = _kernel_us(triton_bwd, "jagged_attn_bwd_dkdv_kernel")
        mask = "causal" if causal else "full"
        rows.append(f"| {mask} | Triton `jagged_attn_bwd_dkdv_kernel` | | | {base:.0f} | |")
        print(rows[-1], flush=True)
        for config in CONFIGS:
            work = work_list(offs, offs, config[0], T)[0]
            run = lambda c=config, w=work, d=delta, s=lse, m=causal: gluon_dkdv(q, k, v, do, s, d, offs, w, scale, m, c)
            dk, dv = run()
            us = _kernel_us(run, "gluon_dkdv_kernel")
            rows.append(f"| {mask} | Gluon {config} | {rel_err(dk, ref[1]):.1e} | {rel_err(dv, ref[2]):.1e} | "
                        f"{us:.0f} | {base / us:.2f}x |")
            print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    from benchmarks.gluon_ws_gemm import main

    main(sys.argv[1:], __doc__, "gluon_dkdv.py", offline, bench)
