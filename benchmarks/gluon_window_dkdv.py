"""A persistent, warp-specialized dk/dv + dS kernel in Gluon for sliding-window attention, against the Triton one.

    python benchmarks/gluon_window_dkdv.py            # on the GPU: W=256 causal, L=4096, B=32, H=8, D=128, bf16
    python benchmarks/gluon_window_dkdv.py --offline  # compile for sm_90a on a machine without a GPU

The fused window backward's first kernel (``attention_triton_window_bwd.window_attn_bwd_dkdv_ds_kernel``: softmax,
no bias tables, causal window, D = 128) runs one short program per (64-key tile, head): about five query tiles
each, so its K/V loads and dK/dV stores are a large share of every program. Here a fixed grid of programs walks
the same work items, and one producer warp streams every item's K, V and then its Q, dO tiles (optionally their
log-sum-exp and delta too, from head-major copies) through rings of shared-memory stages without waiting for the
item before it to finish. The consumer warpgroup runs each pair's four products on wgmma ([keys, queries] tiles,
as the Triton kernel), writes the pair's dS^T tile into the same scratch (through shared memory and a
tensor-memory store) and stores dK, dV at the end of the item while the next item's tiles are already arriving.
The ``"dual"`` configuration puts two such consumers, each with its own producer and buffers, in one program per
SM. The GPU run checks dK, dV and, through the Triton dq-from-dS kernel, dQ against the Triton backward, then times
the dk/dv kernels by profiler kernel time. On an H200 the best configurations ran 0.94-0.99x the Triton kernel
(benchmarks/RESULTS.md, "A persistent warp-specialized window dk/dv kernel in Gluon"); the timing-only ablations
(``ABLATIONS``) show where the rest goes.
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
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TILE = 64
# (programs per SM, Q/dO stages, K/V stages, maxnreg, log-sum-exp and delta staged by TMA, dS buffers,
#  producer registers)
CONFIGS = [(2, 2, 1, 128, False, 2, 24), (2, 2, 1, 128, True, 1, 24), (1, 3, 1, 168, True, 2, 24),
           ("dual", 2, 1, 168, True, 2, 24)]
# timing only (8th entry): 1 leaves out the dS stores, 2 the per-pair log-sum-exp and delta loads
ABLATIONS = [(2, 2, 1, 128, False, 2, 24, 1), (2, 2, 1, 128, False, 2, 24, 2), ("dual", 2, 1, 168, True, 2, 24, 2)]


@gluon.jit
def _item(WORK, OFF, pid, H: gl.constexpr, TILE: gl.constexpr):
    """(row, head, row start, row length, first key) of work-list entry ``pid`` (``item * H + head``)."""
    item = pid // H
    row = gl.load(WORK + 2 * item)
    first = gl.load(WORK + 2 * item + 1) * TILE
    start = gl.load(OFF + gl.maximum(row, 0)).to(gl.int64)
    L = (gl.load(OFF + gl.maximum(row, 0) + 1) - start).to(gl.int32)
    L = gl.where(row >= 0, L, 0)
    return item, pid % H, start, L, first


@gluon.jit
def _query_tiles(L, n0, window, TILE: gl.constexpr):
    """Query tiles that see a key of the tile at ``n0`` (causal window): from the key tile to W past its end."""
    hi = gl.minimum(gl.minimum(n0 + TILE, L) - 1 + window + 1, L)
    return gl.maximum(gl.cdiv(hi - n0, TILE), 0)


@gluon.jit
def _producer(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_bufs, do_bufs, k_bufs, v_bufs, lse_bufs,
              delta_bufs, ready, empty, kv_ready, kv_empty, WORK, OFF, first, step, n_work, T, window, H: gl.constexpr,
              HEAD_DIM: gl.constexpr, TILE: gl.constexpr, NUM_BUF: gl.constexpr, KV_BUF: gl.constexpr,
              STATS_TMA: gl.constexpr):
    """One warp: for every item of this program, K and V into the next K/V stage, then the Q and dO tiles of its
    query tiles (and with ``STATS_TMA`` their log-sum-exp and delta, head-major vectors) into the next stages."""
    it = 0
    kv_it = 0
    for pid in range(first, n_work, step):
        item, h, start, L, n0 = _item(WORK, OFF, pid, H, TILE)
        n_tiles = _query_tiles(L, n0, window, TILE)
        if n_tiles > 0:
            col = h * HEAD_DIM
            kb = kv_it % KV_BUF
            mbarrier.wait(kv_empty.index(kb), ((kv_it // KV_BUF) & 1) ^ 1)
            mbarrier.expect(kv_ready.index(kb), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [(start + n0).to(gl.int32), col], kv_ready.index(kb),
                                            k_bufs.index(kb))
            tma.async_copy_global_to_shared(v_desc, [(start + n0).to(gl.int32), col], kv_ready.index(kb),
                                            v_bufs.index(kb))
            kv_it += 1
            for t in range(n_tiles):
                s = it % NUM_BUF
                mbarrier.wait(empty.index(s), ((it // NUM_BUF) & 1) ^ 1)
                mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes
                                + STATS_TMA * (lse_desc.block_type.nbytes + delta_desc.block_type.nbytes))
                r = (start + n0 + t * TILE).to(gl.int32)
                tma.async_copy_global_to_shared(q_desc, [r, col], ready.index(s), q_bufs.index(s))
                tma.async_copy_global_to_shared(do_desc, [r, col], ready.index(s), do_bufs.index(s))
                if STATS_TMA:
                    tma.async_copy_global_to_shared(lse_desc, [h * T + r], ready.index(s), lse_bufs.index(s))
                    tma.async_copy_global_to_shared(delta_desc, [h * T + r], ready.index(s), delta_bufs.index(s))
                it += 1


@gluon.jit
def _consumer(q_bufs, do_bufs, k_bufs, v_bufs, lse_bufs, delta_bufs, ready, empty, kv_ready, kv_empty, ds_bufs, ds_desc,
              LSE, DELTA, DK, DV, WORK, OFF, first, step, n_work, n_items, window, qk_scale, scale,
              H: gl.constexpr,
              HEAD_DIM: gl.constexpr, TILE: gl.constexpr, NUM_BUF: gl.constexpr, KV_BUF: gl.constexpr,
              SLOTS: gl.constexpr, STATS_TMA: gl.constexpr, DS_BUF: gl.constexpr, ABLATE: gl.constexpr,
              num_warps: gl.constexpr):
    """The default partition: per pair S^T = K Q^T, dP^T = V dO^T, the window mask, P^T and dS^T; dS^T into the
    scratch (shared memory, then a tensor-memory store); dV += P^T dO, dK += dS^T Q. dK, dV stored per item."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, TILE, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    zero_s = gl.zeros((TILE, TILE), dtype=gl.float32, layout=s_layout)
    zero_acc = gl.zeros((TILE, HEAD_DIM), dtype=gl.float32, layout=acc_layout)
    key_ids = gl.arange(0, TILE, layout=gl.SliceLayout(1, s_layout))
    query_ids = gl.arange(0, TILE, layout=gl.SliceLayout(0, s_layout))
    rows = gl.arange(0, TILE, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    it = 0
    kv_it = 0
    ds_it = 0
    for pid in range(first, n_work, step):
        item_j, h, start, L, n0 = _item(WORK, OFF, pid, H, TILE)
        n_tiles = _query_tiles(L, n0, window, TILE)
        if n_tiles > 0:
            kb = kv_it % KV_BUF
            k_smem = k_bufs.index(kb)
            v_smem = v_bufs.index(kb)
            mbarrier.wait(kv_ready.index(kb), (kv_it // KV_BUF) & 1)
            offs_k = n0 + key_ids
            dk = zero_acc
            dv = zero_acc
            for t in range(n_tiles):
                s = it % NUM_BUF
                mbarrier.wait(ready.index(s), (it // NUM_BUF) & 1)
                q = q_bufs.index(s)
                do = do_bufs.index(s)
                st = warpgroup_mma(k_smem, q.permute((1, 0)), zero_s, use_acc=False, is_async=True)
                dpt = warpgroup_mma(v_smem, do.permute((1, 0)), zero_s, use_acc=False, is_async=True)
                m0 = n0 + t * TILE
                offs_q = m0 + query_ids
                q_ok = offs_q < L
                if ABLATE == 2:  # timing only: no per-pair vector loads
                    lse = gl.where(q_ok, 0.0, float("inf"))
                    delta = gl.where(q_ok, 0.0, 0.0)
                elif STATS_TMA:  # staged with the tile (past the row: the next row's values, masked here)
                    lse = gl.where(q_ok, lse_bufs.index(s).load(gl.SliceLayout(0, s_layout)), float("inf"))
                    delta = delta_bufs.index(s).load(gl.SliceLayout(0, s_layout))
                else:
                    lse = gl.load(LSE + (start + offs_q) * H + h, mask=q_ok, other=float("inf"))
                    delta = gl.load(DELTA + (start + offs_q) * H + h, mask=q_ok, other=0.0)
                st, dpt = warpgroup_mma_wait(num_outstanding=0, deps=(st, dpt))
                seen = (offs_k[:, None] <= offs_q[None, :]) & (offs_q[None, :] - offs_k[:, None] <= window)
                pt = gl.where(seen, gl.exp2(st * qk_scale - lse[None, :]), 0.0)
                dst = (pt * (dpt - delta[None, :])).to(gl.bfloat16)
                # the pair's dS^T tile: slot (query tile - key tile), the query tile's work item
                if ABLATE != 1:  # (1: timing only, no dS store)
                    db = ds_it % DS_BUF
                    tma.store_wait(DS_BUF - 1)  # the store that last read this buffer is done
                    ds_bufs.index(db).store(dst)
                    fence_async_shared()
                    row0 = ((h * SLOTS + t).to(gl.int64) * n_items + item_j - t) * TILE
                    tma.async_copy_shared_to_global(ds_desc, [row0.to(gl.int32), 0], ds_bufs.index(db))
                    ds_it += 1
                dv = warpgroup_mma(gl.convert_layout(pt.to(gl.bfloat16), a_layout), do, dv, is_async=True)
                dk = warpgroup_mma(gl.convert_layout(dst, a_layout), q, dk, is_async=True)
                dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
                mbarrier.arrive(empty.index(s), count=1)
                it += 1
            mbarrier.arrive(kv_empty.index(kb), count=1)
            kv_it += 1
            base = (start + n0) * (H * HEAD_DIM) + h * HEAD_DIM
            ok = (rows < L - n0)[:, None] & (cols < HEAD_DIM)[None, :]
            tile_offs = rows[:, None] * (H * HEAD_DIM) + cols[None, :]  # here, not live across the loop
            gl.store(DK + base + tile_offs, (dk * scale).to(gl.bfloat16), mask=ok)
            gl.store(DV + base + tile_offs, dv.to(gl.bfloat16), mask=ok)
    tma.store_wait(0)


@gluon.jit
def _stage_buffers(q_desc, do_desc, k_desc, v_desc, ds_desc, lse_desc, delta_desc, NUM_BUF: gl.constexpr,
                   KV_BUF: gl.constexpr, DS_BUF: gl.constexpr):
    """One consumer's shared memory: Q/dO (with their statistics) and K/V rings, dS buffers, and the rings'
    barriers (initialized)."""
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [NUM_BUF] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [NUM_BUF] + do_desc.block_type.shape, do_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [KV_BUF] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [KV_BUF] + v_desc.block_type.shape, v_desc.layout)
    ds_bufs = gl.allocate_shared_memory(ds_desc.dtype, [DS_BUF] + ds_desc.block_type.shape, ds_desc.layout)
    lse_bufs = gl.allocate_shared_memory(lse_desc.dtype, [NUM_BUF] + lse_desc.block_type.shape, lse_desc.layout)
    delta_bufs = gl.allocate_shared_memory(delta_desc.dtype, [NUM_BUF] + delta_desc.block_type.shape,
                                           delta_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [KV_BUF, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [KV_BUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(KV_BUF):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=1)
    return q_bufs, do_bufs, k_bufs, v_bufs, ds_bufs, lse_bufs, delta_bufs, ready, empty, kv_ready, kv_empty


@gluon.jit
def gluon_window_dkdv_kernel(q_desc, do_desc, k_desc, v_desc, ds_desc, lse_desc, delta_desc, LSE, DELTA, DK, DV, OFF,
                             WORK, n_work, n_items, T, window, qk_scale, scale, H: gl.constexpr,
                             HEAD_DIM: gl.constexpr, TILE: gl.constexpr, NUM_BUF: gl.constexpr, KV_BUF: gl.constexpr,
                             SLOTS: gl.constexpr, STATS_TMA: gl.constexpr, DS_BUF: gl.constexpr,
                             PRODUCER_REGS: gl.constexpr, ABLATE: gl.constexpr, num_warps: gl.constexpr):
    """A fixed grid: program ``p`` takes work entries ``p, p + grid, ...`` (``item * H + head``)."""
    q_bufs, do_bufs, k_bufs, v_bufs, ds_bufs, lse_bufs, delta_bufs, ready, empty, kv_ready, kv_empty = _stage_buffers(
        q_desc, do_desc, k_desc, v_desc, ds_desc, lse_desc, delta_desc, NUM_BUF, KV_BUF, DS_BUF)
    gl.warp_specialize([
        (_consumer, (q_bufs, do_bufs, k_bufs, v_bufs, lse_bufs, delta_bufs, ready, empty, kv_ready, kv_empty, ds_bufs,
                     ds_desc, LSE, DELTA, DK, DV, WORK, OFF, gl.program_id(0), gl.num_programs(0), n_work,
                     n_items, window, qk_scale, scale, H, HEAD_DIM, TILE, NUM_BUF, KV_BUF, SLOTS, STATS_TMA, DS_BUF,
                     ABLATE, num_warps)),
        (_producer, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_bufs, do_bufs, k_bufs, v_bufs,
                     lse_bufs, delta_bufs, ready, empty, kv_ready, kv_empty, WORK, OFF, gl.program_id(0),
                     gl.num_programs(0), n_work, T, window, H, HEAD_DIM, TILE, NUM_BUF, KV_BUF, STATS_TMA)),
    ], [1], [PRODUCER_REGS])


@gluon.jit
def gluon_window_dkdv_dual_kernel(q_desc, do_desc, k_desc, v_desc, ds_desc, lse_desc, delta_desc, LSE, DELTA, DK,
                                  DV, OFF, WORK, n_work, n_items, T, window, qk_scale, scale, H: gl.constexpr,
                                  HEAD_DIM: gl.constexpr, TILE: gl.constexpr, NUM_BUF: gl.constexpr,
                                  KV_BUF: gl.constexpr, SLOTS: gl.constexpr, STATS_TMA: gl.constexpr,
                                  DS_BUF: gl.constexpr, PRODUCER_REGS: gl.constexpr, ABLATE: gl.constexpr,
                                  num_warps: gl.constexpr):
    """Two consumer warpgroups in one program (one per SM), each with its own producer warp and buffers, taking
    alternate work entries of the program: two programs' worth of work per SM in one program's shared memory
    budget (232,448 B instead of twice 115,712)."""
    a_q, a_do, a_k, a_v, a_ds, a_lse, a_delta, a_ready, a_empty, a_kvr, a_kve = _stage_buffers(
        q_desc, do_desc, k_desc, v_desc, ds_desc, lse_desc, delta_desc, NUM_BUF, KV_BUF, DS_BUF)
    b_q, b_do, b_k, b_v, b_ds, b_lse, b_delta, b_ready, b_empty, b_kvr, b_kve = _stage_buffers(
        q_desc, do_desc, k_desc, v_desc, ds_desc, lse_desc, delta_desc, NUM_BUF, KV_BUF, DS_BUF)
    p = gl.program_id(0)
    g = gl.num_programs(0)
    gl.warp_specialize([
        (_consumer, (a_q, a_do, a_k, a_v, a_lse, a_delta, a_ready, a_empty, a_kvr, a_kve, a_ds, ds_desc, LSE, DELTA,
                     DK, DV, WORK, OFF, p, 2 * g, n_work, n_items, window, qk_scale, scale, H, HEAD_DIM, TILE,
                     NUM_BUF, KV_BUF, SLOTS, STATS_TMA, DS_BUF, ABLATE, 4)),
        (_consumer, (b_q, b_do, b_k, b_v, b_lse, b_delta, b_ready, b_empty, b_kvr, b_kve, b_ds, ds_desc, LSE, DELTA,
                     DK, DV, WORK, OFF, p + g, 2 * g, n_work, n_items, window, qk_scale, scale, H, HEAD_DIM, TILE,
                     NUM_BUF, KV_BUF, SLOTS, STATS_TMA, DS_BUF, ABLATE, 4)),
        (_producer, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, a_q, a_do, a_k, a_v, a_lse, a_delta,
                     a_ready, a_empty, a_kvr, a_kve, WORK, OFF, p, 2 * g, n_work, T, window, H, HEAD_DIM, TILE,
                     NUM_BUF, KV_BUF, STATS_TMA)),
        (_producer, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, b_q, b_do, b_k, b_v, b_lse, b_delta,
                     b_ready, b_empty, b_kvr, b_kve, WORK, OFF, p + g, 2 * g, n_work, T, window, H, HEAD_DIM, TILE,
                     NUM_BUF, KV_BUF, STATS_TMA)),
    ], [4, 1, 1], [232, PRODUCER_REGS, PRODUCER_REGS])


def gluon_window_dkdv(q, k, v, do, lse, delta, offsets, work, scale: float, window: int, config: tuple,
                      sms: int = 132, compile_only: bool = False):
    """(dK, dV, dS^T scratch) of causal softmax window attention, the scratch laid out as the Triton fused
    backward's (``SLOTS = ceil(W / 64) + 1``, first slot 0, [key, query] tiles); ``lse`` base 2, ``delta =
    rowsum(dO . o)``, ``work``: ``attention_window_op.window_work`` at 64-token tiles."""
    per_sm, stages, kv_stages, maxnreg, stats_tma, ds_buf, producer_regs, ablate = (*config, 0)[:8]
    dual = per_sm == "dual"  # two consumers in one program per SM
    T, H, D = q.shape
    slots = -(-window // TILE) + 1
    n_items = work.shape[0]
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    ds = torch.empty(H * slots * n_items * TILE, TILE, dtype=q.dtype, device=q.device)
    tile_layout = gl.NVMMASharedLayout.get_default_for([TILE, D], gl.bfloat16)

    def desc(t):
        return TensorDescriptor(t.view(T, H * D), [T, H * D], [H * D, 1], [TILE, D], tile_layout)

    ds_desc = TensorDescriptor(ds, list(ds.shape), [TILE, 1], [TILE, TILE],
                               gl.NVMMASharedLayout.get_default_for([TILE, TILE], gl.bfloat16))
    # head-major log-sum-exp and delta ([H, T] flattened): a query tile's values of one head are contiguous
    vec_layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
    lse_t, delta_t = lse.t().contiguous().view(-1), delta.t().contiguous().view(-1)
    lse_desc = TensorDescriptor(lse_t, [H * T], [1], [TILE], vec_layout)
    delta_desc = TensorDescriptor(delta_t, [H * T], [1], [TILE], vec_layout)
    n_work = n_items * H
    grid = (min(sms * (1 if dual else per_sm), n_work),)
    kernel = gluon_window_dkdv_dual_kernel if dual else gluon_window_dkdv_kernel
    args = (desc(q), desc(do), desc(k), desc(v), ds_desc, lse_desc, delta_desc, lse, delta, dk, dv, offsets,
            work, n_work, n_items, T, window, scale * 1.4426950408889634, scale)
    meta = dict(H=H, HEAD_DIM=D, TILE=TILE, NUM_BUF=stages, KV_BUF=kv_stages, SLOTS=slots, STATS_TMA=stats_tma,
                DS_BUF=ds_buf, PRODUCER_REGS=producer_regs, ABLATE=ablate, num_warps=4, maxnreg=maxnreg)
    if compile_only:
        return kernel.warmup(*args, grid=grid, **meta)
    kernel[grid](*args, **meta)
    return dk, dv, ds


def offline() -> list[str]:
    """Each configuration compiled for sm_90a without a GPU."""
    from benchmarks.gluon_dkdv import offline_problem
    from benchmarks.gluon_ws_gemm import ws_cells

    x, stats, offsets, work = offline_problem(1024, 16)
    rows = ["| config (programs per SM, Q/dO stages, K/V stages, maxnreg, stats by TMA, dS buffers, producer "
            "registers) | registers | spill stores/loads | wgmma | setmaxnreg of the partitions | shared memory B |",
            "|---|---|---|---|---|---|"]
    for config in CONFIGS:
        c = gluon_window_dkdv(x, x, x, x, stats, stats, offsets, work, 0.088, 256, config, compile_only=True)
        rows.append(f"| {config} | {ws_cells(c.asm['ptx'])} | {c.metadata.shared} |")
    return rows


def bench() -> list[str]:
    from triton.tools.tensor_descriptor import TensorDescriptor as TritonDescriptor

    from benchmarks.attention import rel_err
    from benchmarks.gluon_dkdv import _kernel_us
    from kernels import attention_window_op as wop
    from kernels.attention_triton_window_bwd import window_attn_bwd_dq_ds_kernel

    B, L, H, D, W = 32, 4096, 8, 128, 256
    T = B * L
    offs = torch.arange(0, T + 1, L, device="cuda", dtype=torch.int32)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    scale = D ** -0.5
    work = wop.window_work(offs, T, TILE)
    out, lse = torch.ops.gemtrain.window_attn_fwd(q, k, v, offs, None, None, None, None, None, "softmax", True,
                                                  scale, W, 0, work)
    delta = (do.float() * out.float()).sum(-1)

    def triton_bwd():
        return torch.ops.gemtrain.window_attn_bwd(do, q, k, v, out, lse, offs, None, None, None, None, None,
                                                  "softmax", True, scale, W, 0, work)

    ref = triton_bwd()
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    base = _kernel_us(triton_bwd, "window_attn_bwd_dkdv_ds_kernel")
    rows = [f"Window W={W}, causal softmax, B={B}, L={L}, H={H}, D={D}, bf16; GPU us per dk/dv + dS kernel "
            "(profiler medians of 5)", "",
            "| kernel | dQ err vs Triton | dK err | dV err | GPU us | Triton / this |", "|---|---|---|---|---|---|",
            f"| Triton `window_attn_bwd_dkdv_ds_kernel` | | | | {base:.0f} | |"]
    print("\n".join(rows), flush=True)
    slots = -(-W // TILE) + 1
    for config in CONFIGS + ABLATIONS:
        run = lambda c=config: gluon_window_dkdv(q, k, v, do, lse, delta, offs, work, scale, W, c, sms)
        dk, dv, ds = run()
        dq = torch.empty_like(q)
        ds_desc = TritonDescriptor(ds, list(ds.shape), [TILE, 1], [TILE, TILE])
        window_attn_bwd_dq_ds_kernel[(work.shape[0] * H,)](
            k, wop._desc(k, TILE, True), ds, ds_desc, dq, offs, work, scale, W, work.shape[0], H=H, HEAD_DIM=D,
            BLOCK_D=D, CAUSAL=True, PREC="tf32", USE_TMA=True, BLOCK_M=TILE, STAGES=3, SLOTS=slots, SLOT0=0,
            DS_TMA=True, KEY_ROWS=True, num_warps=8)
        us = _kernel_us(run, "gluon_window_dkdv_")
        rows.append(f"| Gluon {config} | {rel_err(dq, ref[0]):.1e} | {rel_err(dk, ref[1]):.1e} | "
                    f"{rel_err(dv, ref[2]):.1e} | {us:.0f} | {base / us:.2f}x |")
        print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    from benchmarks.gluon_ws_gemm import main

    main(sys.argv[1:], __doc__, "gluon_window_dkdv.py", offline, bench)
