"""A warp-specialized attention dk/dv kernel in Gluon, against our Triton dk/dv kernel: a prototype.

    python benchmarks/gluon_dkdv.py            # on the GPU: batch A (device README), causal and full softmax
    python benchmarks/gluon_dkdv.py --offline  # compile for sm_90a on a machine without a GPU

The backward's dk/dv pass of ``jagged_attention`` (softmax, no bias tables, self-attention, D = 128, bf16), written
with explicit partitions (``benchmarks/gluon_ws_gemm.py`` is the pattern): one producer warp streams the Q and
dO tiles of the query tiles a key tile sees into a ring of shared-memory stages (tensor-memory copies, mbarrier
hand-over); the default partition holds K and V in shared memory and runs the four products per pair on wgmma,
with P^T and dS^T as register operands (the [keys, queries] tiles of ``attention_triton_bwd``). It reads the
forward's log-sum-exp and softmax's delta as the Triton kernel does. Three variants (``CONFIGS``): "serial"
waits for each pair's products; "in flight" keeps the next tile's products queued behind this tile's; "dq" also
adds each pair's dQ part into fp32 sums by atomics, so no dq kernel runs (5 products per pair instead of 7). Not
wired into ``kernels``: on an H200 they measured 0.84-0.97x, 0.58-0.92x and 0.52-0.86x the Triton kernels
(benchmarks/RESULTS.md, "The Gluon dk/dv kernel timed, products kept in flight, and dQ added by atomics"). The GPU
run checks dK, dV (and dQ) against the Triton backward first, then times the kernels the same way (torch.profiler
kernel time) and prints the ratio. ``--offline`` prints
registers, spills and the warp-specialization markers; the CPU test runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # the name from triton 3.7 on; 3.6's before

# (key tile BLOCK_N, warps of the default partition, stages, maxnreg, variant); query tiles are 64 rows. Variants:
# "serial" (``_consumer``), "in flight" (``_consumer_pipelined``), "dq" (``_consumer_dq``: dQ too, no dq kernel)
CONFIGS = [(64, 4, 2, 128, "serial"), (128, 8, 2, 168, "serial"), (64, 4, 2, 128, "in flight"),
           (128, 8, 2, 168, "in flight"), (64, 4, 2, 128, "dq"), (128, 8, 2, 168, "dq")]
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
def _store_key_grads(DK, DV, dk, dv, start, L, k0, h, scale, H: gl.constexpr, HEAD_DIM: gl.constexpr,
                     BLOCK_N: gl.constexpr, acc_layout: gl.constexpr):
    """The key tile's dK (times the softmax scale) and dV, rows past the jagged row left alone."""
    rows = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    ptrs = (start + rows)[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + cols[None, :]
    ok = (rows < L)[:, None] & (cols < HEAD_DIM)[None, :]
    gl.store(DK + ptrs, (dk * scale).to(gl.bfloat16), mask=ok)
    gl.store(DV + ptrs, dv.to(gl.bfloat16), mask=ok)


@gluon.jit
def _pair_probs(k_smem, v_smem, q, do, zero_s, offs_k, LSE, DELTA, start, L, k0, q0, h, qk_scale, H: gl.constexpr,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, MASK_KEYS: gl.constexpr,
                s_layout: gl.constexpr):
    """One pair's S^T = K Q^T and dP^T = V dO^T (waited for), and P^T from the forward's log-sum-exp: (P^T, dP^T,
    delta of the query tile at ``q0``). Queries past the row get P = 0 through a log-sum-exp of +inf; keys past it
    only where ``MASK_KEYS`` (their dK/dV rows are never stored, but they would add into dQ)."""
    st = warpgroup_mma(k_smem, q.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    dpt = warpgroup_mma(v_smem, do.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    offs_q = q0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    q_ok = offs_q < L
    lse = gl.load(LSE + (start + offs_q) * H + h, mask=q_ok, other=float("inf"))
    delta = gl.load(DELTA + (start + offs_q) * H + h, mask=q_ok, other=0.0)
    st, dpt = warpgroup_mma_wait(num_outstanding=0, deps=(st, dpt))
    pt = gl.exp2(st * qk_scale - lse[None, :])
    if CAUSAL:
        if q0 < k0 + BLOCK_N:  # a diagonal tile: a key sees the queries at or after it
            pt = gl.where(offs_k[:, None] <= offs_q[None, :], pt, 0.0)
    elif MASK_KEYS:
        pt = gl.where((offs_k < L)[:, None], pt, 0.0)
    return pt, dpt, delta


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
        pt, dpt, delta = _pair_probs(k_smem, v_smem, q, do, zero_s, offs_k, LSE, DELTA, start, L, k0,
                                     (j0 + it) * BLOCK_M, h, qk_scale, H, BLOCK_M, BLOCK_N, CAUSAL, False, s_layout)
        dst = pt * (dpt - delta[None, :])
        pa = gl.convert_layout(pt.to(gl.bfloat16), a_layout)
        dsa = gl.convert_layout(dst.to(gl.bfloat16), a_layout)
        dv = warpgroup_mma(pa, do, dv, is_async=True)
        dk = warpgroup_mma(dsa, q, dk, is_async=True)
        dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
        mbarrier.arrive(empty.index(s), count=1)
    _store_key_grads(DK, DV, dk, dv, start, L, k0, h, scale, H, HEAD_DIM, BLOCK_N, acc_layout)


@gluon.jit
def _consumer_pipelined(k_smem, v_smem, kv_bar, q_bufs, do_bufs, ready, empty, LSE, DELTA, DK, DV, start, L, k0, j0,
                        n_tiles, h, qk_scale, scale, H: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                        BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """``_consumer`` with its products kept in flight: the next query tile's S^T and dP^T are issued behind this
    tile's dV and dK products, P^T is computed while dP^T still runs, and dS^T while dV += P^T dO runs. The wgmma
    queue stays filled; a stage is released once the products reading it are done. The last tile issues its
    "next" products on its own stage (results unused), so the loop body has no branch around async results."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    dk = warpgroup_mma_init(gl.zeros((BLOCK_N, HEAD_DIM), dtype=gl.float32, layout=acc_layout))
    dv = warpgroup_mma_init(gl.zeros((BLOCK_N, HEAD_DIM), dtype=gl.float32, layout=acc_layout))
    pa = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.bfloat16, layout=a_layout)  # register operands kept alive
    dsa = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.bfloat16, layout=a_layout)  # until their products finish
    zero_s = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=s_layout)
    offs_k = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    mbarrier.wait(kv_bar, 0)
    mbarrier.wait(ready.index(0), 0, pred=n_tiles > 0)
    st = warpgroup_mma(k_smem, q_bufs.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    dpt = warpgroup_mma(v_smem, do_bufs.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    offs_q = j0 * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    lse = gl.load(LSE + (start + offs_q) * H + h, mask=offs_q < L, other=float("inf"))
    delta = gl.load(DELTA + (start + offs_q) * H + h, mask=offs_q < L, other=0.0)
    for it in range(n_tiles):
        s = it % NUM_BUF
        # in order: the previous tile's dV, dK and this tile's S^T are done; dP^T may still run
        st, dv, dk, pa, dsa = warpgroup_mma_wait(num_outstanding=1, deps=(st, dv, dk, pa, dsa))
        if it > 0:
            mbarrier.arrive(empty.index((it - 1) % NUM_BUF), count=1)
        pt = gl.exp2(st * qk_scale - lse[None, :])
        if CAUSAL:
            if (j0 + it) * BLOCK_M < k0 + BLOCK_N:
                pt = gl.where(offs_k[:, None] <= offs_q[None, :], pt, 0.0)
        pa = gl.convert_layout(pt.to(gl.bfloat16), a_layout)
        dv = warpgroup_mma(pa, do_bufs.index(s), dv, is_async=True)
        dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt,))
        dsa = gl.convert_layout((pt * (dpt - delta[None, :])).to(gl.bfloat16), a_layout)
        dk = warpgroup_mma(dsa, q_bufs.index(s), dk, is_async=True)
        nxt = gl.minimum(it + 1, n_tiles - 1)
        s2 = nxt % NUM_BUF
        mbarrier.wait(ready.index(s2), (nxt // NUM_BUF) & 1, pred=it + 1 < n_tiles)
        st = warpgroup_mma(k_smem, q_bufs.index(s2).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_smem, do_bufs.index(s2).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        offs_q = (j0 + nxt) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
        lse = gl.load(LSE + (start + offs_q) * H + h, mask=offs_q < L, other=float("inf"))
        delta = gl.load(DELTA + (start + offs_q) * H + h, mask=offs_q < L, other=0.0)
    dk, dv, st, dpt, pa, dsa = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv, st, dpt, pa, dsa))
    _store_key_grads(DK, DV, dk, dv, start, L, k0, h, scale, H, HEAD_DIM, BLOCK_N, acc_layout)


@gluon.jit
def _consumer_dq(k_smem, v_smem, kv_bar, q_bufs, do_bufs, ready, empty, ds_smem, LSE, DELTA, DK, DV, DQA, start, L,
                 k0, j0, n_tiles, h, qk_scale, scale, H: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """``_consumer`` that also adds each pair's dQ part, ``scale · dS K``, into the fp32 sums ``DQA`` (element
    atomics), so no dq kernel has to recompute S and dP: 5 products per pair instead of 7. dS^T goes through
    shared memory to be read transposed as the dQ product's left operand."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    dk = gl.zeros((BLOCK_N, HEAD_DIM), dtype=gl.float32, layout=acc_layout)
    dv = gl.zeros((BLOCK_N, HEAD_DIM), dtype=gl.float32, layout=acc_layout)
    zero_s = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=s_layout)
    HALF: gl.constexpr = HEAD_DIM // 2
    # dQ tiles have 64 rows: one warpgroup's wgmma height; more warpgroups split the columns
    half_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, num_warps // 4],
                                                          instr_shape=[16, HALF // (num_warps // 4), 16])
    zero_q = gl.zeros((BLOCK_M, HALF), dtype=gl.float32, layout=half_layout)
    half_cols = gl.arange(0, HALF, layout=gl.SliceLayout(0, half_layout))
    tile_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, half_layout))
    tile_offs = tile_rows[:, None] * (H * HEAD_DIM) + half_cols[None, :]
    offs_k = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    mbarrier.wait(kv_bar, 0)
    for it in range(n_tiles):
        s = it % NUM_BUF
        mbarrier.wait(ready.index(s), (it // NUM_BUF) & 1)
        q = q_bufs.index(s)
        do = do_bufs.index(s)
        pt, dpt, delta = _pair_probs(k_smem, v_smem, q, do, zero_s, offs_k, LSE, DELTA, start, L, k0,
                                     (j0 + it) * BLOCK_M, h, qk_scale, H, BLOCK_M, BLOCK_N, CAUSAL, True, s_layout)
        dst = (pt * (dpt - delta[None, :])).to(gl.bfloat16)
        ds_smem.store(dst)
        dv = warpgroup_mma(gl.convert_layout(pt.to(gl.bfloat16), a_layout), do, dv, is_async=True)
        dk = warpgroup_mma(gl.convert_layout(dst, a_layout), q, dk, is_async=True)
        fence_async_shared()
        _cta_barrier()
        q_base = DQA + (start + (j0 + it) * BLOCK_M) * (H * HEAD_DIM) + h * HEAD_DIM  # scalar: int32 offsets
        row_ok = (tile_rows < L - (j0 + it) * BLOCK_M)[:, None] & (half_cols < HALF)[None, :]
        for c in gl.static_range(2):  # dQ in two column halves: half the accumulator registers
            dq = warpgroup_mma(ds_smem.permute((1, 0)), k_smem.slice(c * HALF, HALF, dim=1), zero_q, use_acc=False,
                               is_async=True)
            if c == 0:
                dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq))
                mbarrier.arrive(empty.index(s), count=1)
            else:
                dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
            gl.atomic_add(q_base + c * HALF + tile_offs, dq * scale, mask=row_ok, sem="relaxed")
    _store_key_grads(DK, DV, dk, dv, start, L, k0, h, scale, H, HEAD_DIM, BLOCK_N, acc_layout)


@gluon.jit
def gluon_dkdv_kernel(q_desc, do_desc, k_desc, v_desc, LSE, DELTA, DK, DV, DQA, OFF, WORK, qk_scale, scale,
                      H: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr, PIPELINED: gl.constexpr,
                      FUSED_DQ: gl.constexpr, num_warps: gl.constexpr):
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
    if FUSED_DQ:
        ds_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, BLOCK_M],
                                            gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], gl.bfloat16))
        gl.warp_specialize([
            (_consumer_dq, (k_smem, v_smem, kv_bar, q_bufs, do_bufs, ready, empty, ds_smem, LSE, DELTA, DK, DV, DQA,
                            start, L, k0, j0, n_tiles, h, qk_scale, scale, H, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUF,
                            CAUSAL, num_warps)),
            (_producer, (q_desc, do_desc, q_bufs, do_bufs, ready, empty, start, j0, n_tiles, col, BLOCK_M, NUM_BUF)),
        ], [1], [24])
    elif PIPELINED:  # (the partition list is spelled out twice: a tuple variable does not keep its constexprs)
        gl.warp_specialize([
            (_consumer_pipelined, (k_smem, v_smem, kv_bar, q_bufs, do_bufs, ready, empty, LSE, DELTA, DK, DV, start,
                                   L, k0, j0, n_tiles, h, qk_scale, scale, H, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUF,
                                   CAUSAL, num_warps)),
            (_producer, (q_desc, do_desc, q_bufs, do_bufs, ready, empty, start, j0, n_tiles, col, BLOCK_M, NUM_BUF)),
        ], [1], [24])
    else:
        gl.warp_specialize([
            (_consumer, (k_smem, v_smem, kv_bar, q_bufs, do_bufs, ready, empty, LSE, DELTA, DK, DV, start, L, k0, j0,
                         n_tiles, h, qk_scale, scale, H, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUF, CAUSAL, num_warps)),
            (_producer, (q_desc, do_desc, q_bufs, do_bufs, ready, empty, start, j0, n_tiles, col, BLOCK_M, NUM_BUF)),
        ], [1], [24])


def gluon_dkdv(q, k, v, do, lse, delta, offsets, work, scale: float, causal: bool, config: tuple,
               compile_only: bool = False):
    """(dK, dV) of softmax attention over the jagged rows of ``offsets`` ((dQ, dK, dV) for the ``"dq"``
    variant); ``work``: ``attention_op.work_list`` at the config's key tile; ``lse`` base 2 as the forward stores
    it; ``delta = rowsum(dO . o)``."""
    block_n, warps, stages, maxnreg, variant = config
    T, H, D = q.shape
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dqa = torch.zeros(q.shape if variant == "dq" else (1,), dtype=torch.float32, device=q.device)

    def desc(t, rows):
        return TensorDescriptor(t.view(T, H * D), [T, H * D], [H * D, 1], [rows, D],
                                gl.NVMMASharedLayout.get_default_for([rows, D], gl.bfloat16))

    grid = (work.shape[0] * H,)
    args = (desc(q, BLOCK_M), desc(do, BLOCK_M), desc(k, block_n), desc(v, block_n), lse, delta, dk, dv, dqa,
            offsets, work, scale * 1.4426950408889634, scale)
    meta = dict(H=H, HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=block_n, NUM_BUF=stages, CAUSAL=causal,
                PIPELINED=variant == "in flight", FUSED_DQ=variant == "dq", num_warps=warps, maxnreg=maxnreg)
    if compile_only:
        return gluon_dkdv_kernel.warmup(*args, grid=grid, **meta)
    gluon_dkdv_kernel[grid](*args, **meta)
    return (dqa.to(q.dtype), dk, dv) if variant == "dq" else (dk, dv)


def offline_problem(tokens: int, items: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stand-in operands for compile-only calls on the sm_90a offline target (set here): a bf16 ``[tokens, 8,
    128]`` tensor, fp32 ``[tokens, 8]`` statistics, two rows of half the tokens, a work list of ``items``."""
    from benchmarks.gluon_ws_gemm import offline_target

    offline_target()
    x = torch.zeros(tokens, 8, 128, dtype=torch.bfloat16)
    offsets = torch.tensor([0, tokens // 2, tokens])
    return x, torch.zeros(tokens, 8), offsets, torch.zeros(items, 2, dtype=torch.int32)


def offline() -> list[str]:
    """Each configuration compiled for sm_90a without a GPU (causal and full)."""
    from benchmarks.gluon_ws_gemm import ws_cells

    x, stats, offsets, work = offline_problem(1000, 20)
    rows = ["| mask | config (BLOCK_N, warps, stages, maxnreg, variant) | registers | spill stores/loads | wgmma | "
            "setmaxnreg of the partitions |", "|---|---|---|---|---|---|"]
    for causal in (True, False):
        for config in CONFIGS:
            c = gluon_dkdv(x, x, x, x, stats, stats, offsets, work, 0.088, causal, config, True)
            rows.append(f"| {'causal' if causal else 'full'} | {config} | {ws_cells(c.asm['ptx'])} |")
    return rows


def _kernel_us(fn, name: str, calls: int = 5) -> float:
    """Median GPU time of the kernels whose name starts with ``name`` over ``calls`` calls (torch.profiler)."""
    from benchmarks.attention import profiled_kernels

    times = sorted(e.time_range.elapsed_us() for e in profiled_kernels(fn, calls) if e.name.startswith(name))
    return times[len(times) // 2]


def bench() -> list[str]:
    from benchmarks.attention import BATCHES, gpu_ms, lengths, offsets_of, rel_err
    from kernels.attention_op import work_list

    B, max_len, H, D = BATCHES["A"]
    lens = lengths(B, max_len)
    offs, T = offsets_of(lens), int(lens.sum())
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    scale = D ** -0.5
    rows = [f"Batch A: B={B}, max_len={max_len}, H={H}, D={D}, ΣL={T}, bf16; GPU us (profiler medians of 5). "
            "Variant dq: all its kernels (zero fill, kernel, dq cast) against the Triton dk/dv + dq kernels.",
            "", "| mask | kernel | dQ err vs Triton | dK err vs Triton | dV err vs Triton | GPU us | Triton / this |",
            "|---|---|---|---|---|---|---|"]
    for causal in (True, False):
        op_args = ("softmax", causal, scale, 0, -1, 0, max_len, 0)
        out, lse = torch.ops.gemtrain.jagged_attn_fwd(q, k, v, offs, offs, None, None, None, None, None, *op_args)
        delta = (do.float() * out.float()).sum(-1)

        def triton_bwd(out=out, lse=lse, op_args=op_args):
            return torch.ops.gemtrain.jagged_attn_bwd(do, q, k, v, out, lse, offs, offs, None, None, None, None,
                                                      None, *op_args)

        ref = triton_bwd()
        base = _kernel_us(triton_bwd, "jagged_attn_bwd_dkdv_kernel")
        base_dq = _kernel_us(triton_bwd, "jagged_attn_bwd_dq_kernel")
        mask = "causal" if causal else "full"
        rows.append(f"| {mask} | Triton `jagged_attn_bwd_dkdv_kernel` / + `dq_kernel` | | | | {base:.0f} / "
                    f"{base + base_dq:.0f} | |")
        print(rows[-1], flush=True)
        for config in CONFIGS:
            work = work_list(offs, offs, config[0], T)[0]
            run = lambda c=config, w=work, d=delta, s=lse, m=causal: gluon_dkdv(q, k, v, do, s, d, offs, w, scale, m, c)
            grads = run()
            fused = config[4] == "dq"
            us = gpu_ms(run) * 1e3 if fused else _kernel_us(run, "gluon_dkdv_kernel")
            dq_err = f"{rel_err(grads[0], ref[0]):.1e}" if fused else ""
            ratio = (base + base_dq if fused else base) / us
            rows.append(f"| {mask} | Gluon {config} | {dq_err} | {rel_err(grads[-2], ref[1]):.1e} | "
                        f"{rel_err(grads[-1], ref[2]):.1e} | {us:.0f} | {ratio:.2f}x |")
            print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    from benchmarks.gluon_ws_gemm import main

    main(sys.argv[1:], __doc__, "gluon_dkdv.py", offline, bench)
