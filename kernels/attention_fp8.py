"""FP8 jagged attention: QK^T and PV in e4m3 with power-of-two block scales (forward), and optionally the
backward's score products.

Recipe (arithmetic of the Triton kernel ``kernels.attention_fp8_triton`` and of the reference here):

* Q, K, V: e4m3 with one fp32 power-of-two scale per (block of ``quant_block`` consecutive tokens of a
  jagged row, head); blocks start at each row's first token (the last block of a row may be short).
  The scale is ``2**ceil(log2(amax / 448))`` (``kernels.mx`` Hopper rule: nothing saturates, and
  dividing by a power of two is exact), its exponent clamped to [-63, 63]. For V the blocks run along the reduction dimension of PV.
* softmax: the probabilities P (in [0, 1], relative to the running row max of the online softmax) are
  computed as ``P * 256 = exp2(s - (m - 8))`` and stored as e4m3 before the PV product (a fixed scale, as
  FA3's FP8 path); the row sum adds the unquantized ``P * 256``, so the scale cancels in ``acc / l``. silu/gelu: P gets one power-of-two scale per (query, KV tile).
* Accumulation in fp32; the output has the input dtype. Semantics (masks, bias, activations): those of
  ``kernels.attention_spec``.

Backward (``fp8_backward=False``, ``precision="fp8"``): the gradients are those of the high-precision attention
evaluated at the unquantized q, k, v (straight-through), computed by the bf16 backward kernels from the FP8
forward's output and log-sum-exp. With ``fp8_backward=True`` (``precision="fp8_fwd_bwd"``) the same kernels
compute their two score products in e4m3: S = QK^T from the forward's codes of q and k, dP = dO V^T from
dO quantized in q's blocks and V's codes (row-major, written by the forward's quantize launch). P (softmax:
``exp(S - lse)`` with the forward's log-sum-exp) and dS stay fp32 in registers, and dV = P^T dO, dQ = dS K,
dK = dS^T Q are bf16 products with the unquantized dO, K and Q (``jagged_attention_fp8_bwd_ref`` is this
arithmetic in float64). The reference path (CPU) runs that function as its backward. On an H200 the FP8
backward is slower than the bf16 one (its dk/dv kernel streams Q and dO twice, bf16 and codes: benchmarks/RESULTS.md), so
straight-through is the default.

``jagged_attention_fp8_ref`` runs the same quantized arithmetic in PyTorch: quantize -> dequantize ->
``jagged_attention_ref`` (with ``quantize_p=False``), or, with ``quantize_p=True`` (default), a padded
replay of the kernel's online softmax over KV tiles of ``tile_n`` keys with P quantized per tile. With
``tile_n`` equal to the kernel's KV tile (32 under ``TRITON_INTERPRET=1``) the two differ only by fp32
summation order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.attention_ref import _bias, _chunk_rows, _pad_index, jagged_attention_ref, visible_mask
from kernels.attention_spec import IMPLS, AttentionError, RelativeBias, current_impl
from kernels.mx import _NAN_CODE, E4M3_MAX, _f32_from_bits, _scale_bits_ref

Tensor = torch.Tensor

QUANT_BLOCKS = (64, 128)
DEFAULT_QUANT_BLOCK = 128
# The Triton kernels take these two from here (``kernels.attention_fp8_triton``).
P_SCALE = 256.0  # softmax P in [0, 1] -> [0, 256]: keeps e4m3's 3 mantissa bits down to P = 2^-14
LOG2_P_SCALE = math.log2(P_SCALE)
# Input scale exponents are clamped to [-63, 63], so the ratio of two scales is a normal fp32 number.
SCALE_EXP_LIMIT = 63
LOG2E = 1.4426950408889634
PRECISIONS = ("bf16", "fp8", "fp8_fwd_bwd")  # jagged_attention's: fp8 forward; fp8 forward and backward


@dataclass
class Fp8Jagged:
    """A jagged ``[ΣL, H, D]`` tensor in e4m3: ``data`` e4m3 ``[ΣL, H, D]``, ``scale`` fp32 ``[NB, H]``
    (one power of two per row block and head) and ``block_offsets`` ``[B+1]`` int32 (first block of each
    row). ``NB`` may exceed the blocks used (on GPU it is an upper bound, so no device sync is needed)."""

    data: Tensor
    scale: Tensor
    block_offsets: Tensor


def _block_index(offsets: Tensor, total: int, block: int) -> tuple[Tensor, Tensor, int]:
    """(block id of each token [ΣL] int64, first block of each row [B+1] int32, number of blocks)."""
    offsets = offsets.long()
    lens = offsets[1:] - offsets[:-1]
    nblk = (lens + block - 1) // block
    blk_off = torch.cat([nblk.new_zeros(1), nblk.cumsum(0)])
    num_rows = lens.numel()
    rows = torch.repeat_interleave(torch.arange(num_rows, device=offsets.device), lens, output_size=total)
    tok = torch.arange(total, device=offsets.device)
    bid = blk_off[rows] + (tok - offsets[rows]) // block
    nb = int(blk_off[-1]) if offsets.device.type == "cpu" else (total + block - 1) // block + num_rows
    return bid, blk_off.to(torch.int32), max(nb, 1)


def _input_scale_bits(amax_bits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(inverse-scale bits, scale bits, non-finite) of 2^ceil(log2(amax / 448)), exponent clamped to
    [-63, 63] (so the kernel can change its accumulator between V scales exactly)."""
    e = amax_bits >> 23
    bad = e == 255
    t = e - 8 + ((amax_bits & 0x7FFFFF) > 0x600000).to(torch.int32)
    t = t.clamp(127 - SCALE_EXP_LIMIT, 127 + SCALE_EXP_LIMIT)
    return (254 - t) << 23, torch.where(bad, torch.full_like(t, 0x7FC00000), t << 23), bad


def quantize_jagged(x: Tensor, offsets: Tensor, block: int = DEFAULT_QUANT_BLOCK) -> Fp8Jagged:
    """e4m3 with a power-of-two scale per (row block of ``block`` tokens, head); blocks holding NaN/Inf
    get a NaN scale and NaN codes (they decode to NaN)."""
    if block not in QUANT_BLOCKS:
        raise AttentionError(f"quantize_jagged: block={block}, expected one of {QUANT_BLOCKS}")
    total, heads, _ = x.shape
    bid, blk_off, nb = _block_index(offsets, total, block)
    xf = x.float()
    amax_tok = xf.abs().amax(-1)  # [ΣL, H]
    amax = torch.zeros(nb, heads, dtype=torch.float32, device=x.device)
    amax.scatter_reduce_(0, bid[:, None].expand(total, heads), amax_tok, reduce="amax", include_self=True)
    inv, sbits, bad = _input_scale_bits(amax.view(torch.int32) & 0x7FFFFFFF)
    inv_tok = _f32_from_bits(inv)[bid]  # [ΣL, H]
    data = (xf * inv_tok[:, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    data = data.masked_fill(bad[bid][:, :, None], _NAN_CODE).view(torch.float8_e4m3fn)
    return Fp8Jagged(data, _f32_from_bits(sbits), blk_off)


def dequantize_jagged(t: Fp8Jagged, offsets: Tensor, block: int = DEFAULT_QUANT_BLOCK,
                      dtype: torch.dtype = torch.float32) -> Tensor:
    """Decode :class:`Fp8Jagged` to ``dtype`` ``[ΣL, H, D]``."""
    bid, _, _ = _block_index(offsets, t.data.shape[0], block)
    return (t.data.float() * t.scale[bid][:, :, None]).to(dtype)


def _fake_quant(x: Tensor, offsets: Tensor, block: int) -> Tensor:
    """quantize -> dequantize in fp32, with a straight-through gradient."""
    xq = dequantize_jagged(quantize_jagged(x.detach(), offsets, block), offsets, block)
    return x.float() + (xq - x.float()).detach()


def _quant_p(p: Tensor, softmax: bool) -> Tensor:
    """The kernel's P quantization (softmax: ``p`` already multiplied by ``P_SCALE``; per-row power of two
    otherwise), STE."""
    pd = p.detach()
    if softmax:
        pq = pd.to(torch.float8_e4m3fn).float()
    else:
        amax_bits = pd.view(torch.int32).bitwise_and(0x7FFFFFFF).amax(-1, keepdim=True)
        inv, sbits, _ = _scale_bits_ref(amax_bits, e8m0=False)
        y = (pd * _f32_from_bits(inv)).clamp(-E4M3_MAX, E4M3_MAX)
        pq = y.to(torch.float8_e4m3fn).float() * _f32_from_bits(sbits)
    return p + (pq - pd)


def jagged_attention_fp8_ref(
    q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
    activation: str = "softmax", causal: bool = False, scale: float | None = None,
    bias: RelativeBias | None = None, block_size: int | None = None, window: int | None = None,
    num_targets: Tensor | None = None, pointwise_norm: str | int = "row",
    quant_block: int = DEFAULT_QUANT_BLOCK, quantize_p: bool = True, tile_n: int = 64,
) -> Tensor:
    """PyTorch reference of FP8 jagged attention (see the module docstring); output in ``q.dtype``."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    qd, kd, vd = (_fake_quant(t, off, quant_block) for t, off in ((q, q_offsets), (k, kv_offsets),
                                                                   (v, kv_offsets)))
    if not quantize_p:
        out = jagged_attention_ref(qd, kd, vd, q_offsets, kv_offsets, activation=activation, causal=causal,
                                   scale=scale, bias=bias, block_size=block_size, window=window,
                                   num_targets=num_targets, pointwise_norm=pointwise_norm)
        return out.to(q.dtype)
    return _tiled_ref(qd, kd, vd, q_offsets, kv_offsets, activation, causal, scale, bias, block_size, window,
                      num_targets, pointwise_norm, tile_n).to(q.dtype)


def _tiled_ref(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, activation: str,
               causal: bool, scale: float, bias: RelativeBias | None, block_size: int | None,
               window: int | None, num_targets: Tensor | None, pointwise_norm: str | int,
               tile_n: int) -> Tensor:
    """fp32 replay of the kernel: online softmax over KV tiles of ``tile_n`` keys, P quantized per tile."""
    _, heads, _ = q.shape
    softmax = activation == "softmax"
    c = LOG2E if softmax else 1.0
    qk_scale = float(torch.tensor(scale, dtype=torch.float32) * torch.tensor(c, dtype=torch.float32))
    q_off = [int(x) for x in q_offsets.tolist()]
    kv_off = [int(x) for x in kv_offsets.tolist()]
    nt = [0] * (len(q_off) - 1) if num_targets is None else [int(x) for x in num_targets.tolist()]
    dev = q.device
    pieces: list[Tensor] = []
    for rows in _chunk_rows(q_off, kv_off, heads):
        lq = [q_off[b + 1] - q_off[b] for b in rows]
        lk = [kv_off[b + 1] - kv_off[b] for b in rows]
        mq, mk = max(lq), max(lk)
        if mq == 0:
            continue
        if mk == 0:
            pieces.append(q[q_off[rows.start]:q_off[rows.stop]] * 0)
            continue
        qi, qvalid, ki, _, lk_t, q_pos, k_pos, mask = _chunk_layout(q_off, kv_off, nt, rows, causal, block_size,
                                                                    window, dev)
        qp, kp, vp = q[qi], k[ki], v[ki]
        s = torch.einsum("nihd,njhd->nhij", qp, kp) * qk_scale
        if bias is not None and not bias.is_empty:
            s = s + _bias(bias, q_pos, k_pos, qi, ki).float() * c
        n, _, _, _ = s.shape
        acc = torch.zeros(n, heads, mq, q.shape[-1], dtype=torch.float32, device=dev)
        if softmax:
            s = s.masked_fill(~mask, float("-inf"))
            m = torch.full((n, heads, mq), float("-inf"), device=dev)
            l_sum = torch.zeros(n, heads, mq, device=dev)
        for c0 in range(0, mk, tile_n):
            sc, vt = s[..., c0:c0 + tile_n], vp[:, c0:c0 + tile_n]
            if softmax:
                m_new = torch.maximum(m, sc.detach().amax(-1))
                m_safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
                p = torch.exp2(sc - (m_safe - LOG2_P_SCALE)[..., None])  # P * P_SCALE, as the kernel
                alpha = torch.exp2(m - m_safe)
                l_sum = l_sum * alpha + p.sum(-1)
                acc = acc * alpha[..., None] + torch.einsum("nhij,njhd->nhid", _quant_p(p, True), vt)
                m = m_new
            else:
                p = torch.where(mask[..., c0:c0 + tile_n], _act(sc, activation), torch.zeros_like(sc))
                acc = acc + torch.einsum("nhij,njhd->nhid", _quant_p(p, False), vt)
        if softmax:
            out = acc / torch.where(l_sum > 0, l_sum, torch.ones_like(l_sum))[..., None]
        elif pointwise_norm == "row":
            out = acc / lk_t.clamp_min(1).float()[:, None]
        else:
            out = acc / float(pointwise_norm)
        pieces.append(out.permute(0, 2, 1, 3)[qvalid])
    if not pieces:
        return q * 0
    return torch.cat(pieces, dim=0)


def _chunk_layout(q_off: list[int], kv_off: list[int], nt: list[int], rows: range, causal: bool,
                  block_size: int | None, window: int | None, dev: torch.device) -> tuple:
    """Padded layout of a chunk of rows: (query index [n, Lq], valid queries, key index [n, Lkv], valid keys,
    key lengths [n, 1, 1], query and key positions, visibility [n, 1, Lq, Lkv])."""
    lq = [q_off[b + 1] - q_off[b] for b in rows]
    lk = [kv_off[b + 1] - kv_off[b] for b in rows]
    mq, mk = max(lq), max(lk)
    qi, qvalid = _pad_index(q_off, rows, mq, dev)
    ki, kvalid = _pad_index(kv_off, rows, mk, dev)
    lq_t = torch.tensor(lq, device=dev)[:, None, None]
    lk_t = torch.tensor(lk, device=dev)[:, None, None]
    hist_end = lk_t - torch.tensor([nt[b] for b in rows], device=dev)[:, None, None]
    q_pos = lk_t - lq_t + torch.arange(mq, device=dev)[None, :, None]
    k_pos = torch.arange(mk, device=dev)[None, None, :]
    mask = visible_mask(q_pos, k_pos, lk_t, causal=causal, hist_end=hist_end, block_size=block_size, window=window)
    return qi, qvalid, ki, kvalid, lk_t, q_pos, k_pos, (mask & qvalid[:, :, None])[:, None]


def jagged_attention_fp8_bwd_ref(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
    activation: str = "softmax", causal: bool = False, scale: float | None = None,
    bias: RelativeBias | None = None, block_size: int | None = None, window: int | None = None,
    num_targets: Tensor | None = None, pointwise_norm: str | int = "row", quant_block: int = DEFAULT_QUANT_BLOCK,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """The FP8 backward's arithmetic in float64 (the reference of ``jagged_attn_fp8_bwd``): S from the codes of
    q and k, dP from those of dO and v (dO in q's blocks), softmax's delta from dO and ``out`` (the FP8
    forward's output); dV = P^T dO, dQ = dS K, dK = dS^T Q from the unquantized dO, q, k.
    Returns (dq, dk, dv, position-table gradient, time-table gradient)."""
    with torch.enable_grad():  # the activation's derivative and the tables' gradients come from autograd
        return _fp8_bwd_ref(do, q, k, v, out, q_offsets, kv_offsets, activation, causal, scale, bias, block_size,
                            window, num_targets, pointwise_norm, quant_block)


def _fp8_bwd_ref(do, q, k, v, out, q_offsets, kv_offsets, activation, causal, scale, bias, block_size, window,
                 num_targets, pointwise_norm, quant_block):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    deq = lambda x, off: dequantize_jagged(quantize_jagged(x, off, quant_block), off, quant_block, torch.float64)
    qd, kd, vd, dod = deq(q, q_offsets), deq(k, kv_offsets), deq(v, kv_offsets), deq(do, q_offsets)
    q64, k64, do64 = q.double(), k.double(), do.double()
    delta_tok = (do64 * out.double()).sum(-1)  # [ΣLq, H]
    has_bias = bias is not None and not bias.is_empty
    tables = {}
    if has_bias:
        tables = {name: getattr(bias, name).detach().double().requires_grad_()
                  for name in ("pos_weight", "time_weight") if getattr(bias, name) is not None}
        bias = RelativeBias(tables.get("pos_weight"), tables.get("time_weight"), bias.q_timestamps,
                            bias.kv_timestamps)
    dq, dk, dv = torch.zeros_like(q64), torch.zeros_like(k64), torch.zeros_like(k64)
    q_off = [int(x) for x in q_offsets.tolist()]
    kv_off = [int(x) for x in kv_offsets.tolist()]
    nt = [0] * (len(q_off) - 1) if num_targets is None else [int(x) for x in num_targets.tolist()]
    for rows in _chunk_rows(q_off, kv_off, q.shape[1]):
        if max(q_off[b + 1] - q_off[b] for b in rows) == 0 or max(kv_off[b + 1] - kv_off[b] for b in rows) == 0:
            continue
        qi, qvalid, ki, kvalid, lk_t, q_pos, k_pos, mask = _chunk_layout(q_off, kv_off, nt, rows, causal,
                                                                         block_size, window, q.device)
        s = torch.einsum("nihd,njhd->nhij", qd[qi], kd[ki]) * scale
        if has_bias:
            s = s + _bias(bias, q_pos, k_pos, qi, ki)
        dp = torch.einsum("nihd,njhd->nhij", dod[qi], vd[ki])
        sd = s.detach()
        if activation == "softmax":
            sm = sd.masked_fill(~mask, float("-inf"))
            lse = torch.logsumexp(sm, -1, keepdim=True)
            p = torch.where(mask, torch.exp(sm - torch.where(lse.isfinite(), lse, torch.zeros_like(lse))), 0.0)
            ds = p * (dp - delta_tok[qi].permute(0, 2, 1)[..., None])
        else:
            n = lk_t.clamp_min(1).double()[:, None] if pointwise_norm == "row" else float(pointwise_norm)
            leaf = sd.requires_grad_()
            a = _act(leaf, activation)
            (da,) = torch.autograd.grad(a, leaf, torch.ones_like(a))
            p = torch.where(mask, a.detach() / n, 0.0)
            ds = torch.where(mask, dp * da / n, 0.0)
        if has_bias:
            s.backward(ds)  # through the gathered bias alone: the table gradients
        valid_q, valid_k = qvalid[:, :, None, None], kvalid[:, :, None, None]
        dv.index_add_(0, ki[kvalid], torch.einsum("nhij,nihd->njhd", p, do64[qi] * valid_q)[kvalid])
        dk.index_add_(0, ki[kvalid], scale * torch.einsum("nhij,nihd->njhd", ds, q64[qi] * valid_q)[kvalid])
        dq.index_add_(0, qi[qvalid], scale * torch.einsum("nhij,njhd->nihd", ds, k64[ki] * valid_k)[qvalid])
    grad = lambda name: None if name not in tables else (
        tables[name].grad if tables[name].grad is not None else torch.zeros_like(tables[name]))
    return dq, dk, dv, grad("pos_weight"), grad("time_weight")


def _act(s: Tensor, activation: str) -> Tensor:
    return F.silu(s) if activation == "silu" else F.gelu(s, approximate="tanh")


class _Fp8BackwardRef(torch.autograd.Function):
    """The reference path with ``fp8_backward``: the emulated forward, and ``jagged_attention_fp8_bwd_ref``
    (the FP8 backward kernels' arithmetic) as its backward."""

    @staticmethod
    def forward(ctx, q, k, v, pos_weight, time_weight, q_offsets, kv_offsets, bias, opts):
        with torch.no_grad():
            out = jagged_attention_fp8_ref(q, k, v, q_offsets, kv_offsets, bias=bias, **opts)
        ctx.save_for_backward(q, k, v, out, q_offsets, kv_offsets)
        ctx.bias, ctx.opts = bias, opts
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, q_offsets, kv_offsets = ctx.saved_tensors
        dq, dk, dv, dpos, dtime = jagged_attention_fp8_bwd_ref(dout, q, k, v, out, q_offsets, kv_offsets,
                                                               bias=ctx.bias, **ctx.opts)
        cast = lambda g, like: None if g is None or like is None else g.to(like.dtype)
        pos_w, time_w = (None, None) if ctx.bias is None else (ctx.bias.pos_weight, ctx.bias.time_weight)
        return (cast(dq, q), cast(dk, k), cast(dv, v), cast(dpos, pos_w), cast(dtime, time_w), None, None, None,
                None)


def check_precision(precision: str, where: str) -> None:
    if precision not in PRECISIONS:
        raise AttentionError(f"{where}: precision={precision!r}, expected one of {PRECISIONS}")


def jagged_attention_fp8(
    q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
    activation: str = "softmax", causal: bool = False, scale: float | None = None,
    bias: RelativeBias | None = None, block_size: int | None = None, window: int | None = None,
    max_q_len: int | None = None, max_kv_len: int | None = None, num_targets: Tensor | None = None,
    pointwise_norm: str | int = "row", impl: str | None = None, quant_block: int = DEFAULT_QUANT_BLOCK,
    v_transposed: bool = True, fp8_backward: bool = False,
) -> Tensor:
    """``kernels.jagged_attention`` with QK^T and PV in FP8 (same arguments; ``quant_block`` 64 or 128).

    ``impl``: ``"auto"`` (Triton on CUDA, the emulating reference on CPU), ``"triton"`` or ``"ref"``.
    ``v_transposed``: the Triton kernel reads V from a ``[H * D, tokens]`` e4m3 copy (same numbers).
    ``fp8_backward``: the backward's score products in e4m3 too (module docstring); else straight-through bf16.
    """
    from kernels.attention import _check

    _check(q, k, v, q_offsets, kv_offsets, activation, bias, block_size, window, num_targets, pointwise_norm)
    if quant_block not in QUANT_BLOCKS:
        raise AttentionError(f"jagged_attention_fp8: quant_block={quant_block}, expected one of {QUANT_BLOCKS}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    chosen = current_impl() if impl is None else impl
    if chosen not in IMPLS:
        raise AttentionError(f"jagged_attention_fp8: impl={chosen!r}, expected one of {IMPLS}")
    if chosen == "auto":
        chosen = "triton" if q.is_cuda else "ref"
    if chosen == "ref":
        opts = dict(activation=activation, causal=causal, scale=scale, block_size=block_size, window=window,
                    num_targets=num_targets, pointwise_norm=pointwise_norm, quant_block=quant_block)
        if fp8_backward and torch.is_grad_enabled():
            bias = bias if bias is not None and not bias.is_empty else None
            tables = (None, None) if bias is None else (bias.pos_weight, bias.time_weight)
            return _Fp8BackwardRef.apply(q, k, v, *tables, q_offsets, kv_offsets, bias, opts)
        return jagged_attention_fp8_ref(q, k, v, q_offsets, kv_offsets, bias=bias, **opts)
    from kernels.attention_fp8_op import jagged_attention_fp8_triton

    return jagged_attention_fp8_triton(
        q, k, v, q_offsets, kv_offsets, activation=activation, causal=causal, scale=scale, bias=bias,
        block_size=block_size, window=window, num_targets=num_targets, pointwise_norm=pointwise_norm,
        max_q_len=max_q_len, max_kv_len=max_kv_len, quant_block=quant_block,
        v_transposed=v_transposed, fp8_backward=fp8_backward,
    )


__all__ = ["Fp8Jagged", "dequantize_jagged", "jagged_attention_fp8", "jagged_attention_fp8_bwd_ref",
           "jagged_attention_fp8_ref", "quantize_jagged"]
