"""The QKV projection with the FP8 attention's operands written by its epilogue.

``jagged_attention(precision="fp8")`` quantizes q, k and v in a launch of its own before its kernel: a read of
the three bf16 tensors that costs about what the FP8 products save (benchmarks/RESULTS.md, "FP8 attention on the
bf16 kernel's design"). Here the projection ``x @ W^T + b`` that produces q, k and v writes, besides them, the
codes the FP8 kernel reads: one GEMM program per (scale block of a jagged row, output head), so each program's
``[QUANT_BLOCK tokens, D]`` tile is exactly one scale block (``kernels.attention_fp8``'s layout: blocks start at
each row's first token). Its epilogue rounds the tile to the output dtype, stores it, and quantizes the rounded
values with ``attention_fp8_triton.store_codes``: the codes are bit-identical to quantizing the projection's
output afterwards (``quantize_qkv``). The last block of a row multiplies rows of the next one (masked on store):
on batch A's lengths that is ~5% more MMA work at 128-token blocks.

``qkv_codes`` returns q, k, v ``[ΣL, H, D]`` and their codes (``QkvCodes``); ``qkv_codes_ref`` is the
PyTorch reference (``F.linear`` and ``kernels.attention_fp8.quantize_jagged``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.attention_fp8 import DEFAULT_QUANT_BLOCK, Fp8Jagged, quantize_jagged
from kernels.attention_fp8_op import QuantPlan, TransposedCodes, _outputs, _results, quant_plan
from kernels.attention_fp8_triton import store_codes
from kernels.attention_spec import AttentionError
from kernels.attention_triton_common import INTERPRET, on_hopper

Tensor = torch.Tensor


class QkvCodes(NamedTuple):
    """q, k, v ``[ΣL, H, D]`` in the input dtype, their e4m3 codes (``Fp8Jagged``; v's ``data`` is empty) and
    v's transposed codes, all over one layout (self-attention) with ``block``-token scale blocks."""

    q: Tensor
    k: Tensor
    v: Tensor
    q_codes: Fp8Jagged
    k_codes: Fp8Jagged
    v_codes: Fp8Jagged
    v_transposed: TransposedCodes
    block: int


# (BLOCK_K, warps, stages): measured on an H200 with benchmarks/qkv_codes.py.
CONFIG = (64, 8, 3)


@triton.jit
def qkv_codes_kernel(
    X, XD, W, WD, BIAS, Q, K, V, QC, KC, VT, SQ, SK, SV, OFF, BLKOFF, WORK, COLS, stride_t, d_in,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, QUANT_BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, USE_TMA: tl.constexpr, PREC: tl.constexpr,
):
    """A program per (work item = scale block of a row, output head of q/k/v): the ``[QUANT_BLOCK, HEAD_DIM]``
    tile of ``x @ W^T + b``, stored in ``X``'s dtype and as codes. Heads vary fastest, so the programs that read
    one ``x`` tile run together (it stays in L2)."""
    pid = tl.program_id(0)
    item = pid // (3 * H)
    n = pid % (3 * H)  # output head: q heads, then k, then v
    row = tl.load(WORK + 2 * item)
    if row >= 0:
        c = tl.load(WORK + 2 * item + 1)
        start = tl.load(OFF + row).to(tl.int64)
        end = tl.load(OFF + row + 1).to(tl.int64)
        t0 = start + c * QUANT_BLOCK
        offs_t = t0 + tl.arange(0, QUANT_BLOCK)
        offs_d = tl.arange(0, HEAD_DIM)
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros([QUANT_BLOCK, HEAD_DIM], dtype=tl.float32)
        for k0 in range(0, d_in, BLOCK_K):
            if USE_TMA:  # rows past the jagged row hold the next row's tokens (zeros past the tensor): not stored
                x = XD.load([t0.to(tl.int32), k0])
                w = WD.load([n * HEAD_DIM, k0])
            else:
                k_ok = (k0 + offs_k) < d_in
                x = tl.load(X + offs_t[:, None] * d_in + (k0 + offs_k)[None, :],
                            mask=(offs_t < end)[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(W + (n * HEAD_DIM + offs_d).to(tl.int64)[:, None] * d_in + (k0 + offs_k)[None, :],
                            mask=k_ok[None, :], other=0.0)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PREC)
        if HAS_BIAS:
            acc += tl.load(BIAS + n * HEAD_DIM + offs_d).to(tl.float32)[None, :]
        y = acc.to(Q.dtype.element_ty)
        which = n // H
        h = n % H
        ptrs = offs_t[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :]
        ok = (offs_t < end)[:, None]
        yf = tl.where(ok, y.to(tl.float32), 0.0)  # the codes are those of the stored (rounded) values
        if which == 0:
            tl.store(Q + ptrs, y, mask=ok)
            store_codes(yf, QC, QC, SQ, BLKOFF, COLS, stride_t, row, c, offs_t, end, h, offs_d, H, HEAD_DIM,
                        QUANT_BLOCK, False, True)
        elif which == 1:
            tl.store(K + ptrs, y, mask=ok)
            store_codes(yf, KC, KC, SK, BLKOFF, COLS, stride_t, row, c, offs_t, end, h, offs_d, H, HEAD_DIM,
                        QUANT_BLOCK, False, True)
        else:
            tl.store(V + ptrs, y, mask=ok)
            store_codes(yf, VT, VT, SV, BLKOFF, COLS, stride_t, row, c, offs_t, end, h, offs_d, H, HEAD_DIM,
                        QUANT_BLOCK, True, False)


def _check(x: Tensor, weight: Tensor, bias: Tensor | None, heads: int, block: int) -> int:
    """The head dim, after checking shapes (a clear error names the argument)."""
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1] or weight.shape[0] % (3 * heads):
        raise AttentionError(f"qkv_codes: x {tuple(x.shape)} and weight {tuple(weight.shape)} must be [ΣL, d_in] "
                             f"and [3 * heads * head_dim, d_in] with heads={heads}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise AttentionError(f"qkv_codes: bias {tuple(bias.shape)}, expected ({weight.shape[0]},)")
    d = weight.shape[0] // (3 * heads)
    if d < 16 or d & (d - 1):
        raise AttentionError(f"qkv_codes: head_dim={d} must be a power of two >= 16 (one GEMM tile per head)")
    if block not in (64, 128):
        raise AttentionError(f"qkv_codes: block={block}, expected 64 or 128")
    return d


def qkv_codes(x: Tensor, weight: Tensor, bias: Tensor | None, offsets: Tensor, heads: int,
              block: int = DEFAULT_QUANT_BLOCK, plan: QuantPlan | None = None) -> QkvCodes:
    """``x [ΣL, d_in] @ weight [3*H*D, d_in]^T + bias`` as q, k, v ``[ΣL, H, D]`` (q's heads first, as
    ``nn.Linear(d, 3 * d)``'s rows), with their e4m3 codes in ``block``-token scale blocks of the jagged rows of
    ``offsets``: one Triton launch. ``plan``: ``quant_plan(offsets, block, len(x))`` if already built."""
    d = _check(x, weight, bias, heads, block)
    total = x.shape[0]
    plan = plan if plan is not None else quant_plan(offsets, block, total)
    q, k, v = (torch.empty(total, heads, d, dtype=x.dtype, device=x.device) for _ in range(3))
    qd, qs, _ = _outputs(q, offsets, block, False, True)
    kd, ks, _ = _outputs(k, offsets, block, False, True)
    vd, vs, vt = _outputs(v, offsets, block, True, False)
    x, weight = x.contiguous(), weight.contiguous()
    if plan.n_items > 0:
        block_k, warps, stages = CONFIG if not INTERPRET else (32, 4, 1)
        block_k = min(block_k, max(16, triton.next_power_of_2(x.shape[1])))
        tma = on_hopper(x) and x.shape[1] % 8 == 0 and x.data_ptr() % 16 == 0 and weight.data_ptr() % 16 == 0
        xd = TensorDescriptor(x, list(x.shape), [x.shape[1], 1], [block, block_k]) if tma else x
        wd = TensorDescriptor(weight, list(weight.shape), [weight.shape[1], 1], [d, block_k]) if tma else weight
        qkv_codes_kernel[(plan.n_items * 3 * heads,)](
            x, xd, weight, wd, bias if bias is not None else weight, q, k, v, qd, kd, vt, qs, ks, vs, offsets,
            plan.block_offsets, plan.work, plan.columns, vt.stride(0), x.shape[1], H=heads, HEAD_DIM=d,
            QUANT_BLOCK=block, BLOCK_K=block_k, HAS_BIAS=bias is not None, USE_TMA=tma,
            PREC="ieee" if x.dtype == torch.float32 else "tf32", num_warps=warps, num_stages=stages,
        )
    qq, kq = _results(qd, qs, plan)[0], _results(kd, ks, plan)[0]
    vq, v_t = _results(vd, vs, plan, vt)
    return QkvCodes(q, k, v, qq, kq, vq, v_t, block)


def qkv_codes_ref(x: Tensor, weight: Tensor, bias: Tensor | None, offsets: Tensor, heads: int,
                  block: int = DEFAULT_QUANT_BLOCK) -> tuple[Tensor, Tensor, Tensor, Fp8Jagged, Fp8Jagged, Fp8Jagged]:
    """PyTorch reference: (q, k, v, their ``quantize_jagged`` codes); v's codes row-major."""
    d = _check(x, weight, bias, heads, block)
    q, k, v = (t.reshape(-1, heads, d) for t in F.linear(x, weight, bias).chunk(3, dim=-1))
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return (q, k, v, *(quantize_jagged(t, offsets, block) for t in (q, k, v)))
