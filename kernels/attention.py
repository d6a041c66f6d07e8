"""``jagged_attention``: one generalized, padding-free attention entry point (semantics: ``attention_spec``).

Dispatch: Triton kernels for CUDA tensors, the PyTorch reference for CPU tensors; ``impl=`` or the
``attention_impl`` context manager overrides it (the tests run the Triton kernels on CPU under
``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import math

import torch

from kernels.attention_ref import jagged_attention_ref
from kernels.attention_spec import ACTIVATIONS, IMPLS, AttentionError, RelativeBias, current_impl


def _check(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
    activation: str, bias: RelativeBias | None, block_size: int | None, window: int | None,
    num_targets: torch.Tensor | None, pointwise_norm: str | int,
) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise AttentionError(f"jagged_attention: q, k, v must be [ΣL, H, D]; got {tuple(q.shape)}, "
                             f"{tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape or q.shape[1:] != k.shape[1:]:
        raise AttentionError(f"jagged_attention: k and v must match and share H, D with q; got q "
                             f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise AttentionError(f"jagged_attention: q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}); cast them")
    for name, off in (("q_offsets", q_offsets), ("kv_offsets", kv_offsets)):
        if off.dim() != 1 or off.dtype not in (torch.int32, torch.int64) or off.shape[0] < 1:
            raise AttentionError(f"jagged_attention: {name} must be a 1-d int32/int64 [B+1] tensor, got "
                                 f"{off.dtype} {tuple(off.shape)}")
    if q_offsets.shape != kv_offsets.shape:
        raise AttentionError(f"jagged_attention: q_offsets {tuple(q_offsets.shape)} and kv_offsets "
                             f"{tuple(kv_offsets.shape)} must both be [B+1]")
    if q_offsets.device.type == "cpu" and not torch.compiler.is_compiling():  # only where it costs no sync
        for name, off, total in (("q_offsets", q_offsets, q.shape[0]), ("kv_offsets", kv_offsets, k.shape[0])):
            if int(off[0]) != 0 or int(off[-1]) != total or bool((off[1:] < off[:-1]).any()):
                raise AttentionError(f"jagged_attention: {name} must start at 0, be non-decreasing and end at "
                                     f"{total} (the number of tokens); got {off.tolist()[:8]}...")
    if activation not in ACTIVATIONS:
        raise AttentionError(f"jagged_attention: activation={activation!r}, expected one of {ACTIVATIONS}")
    if block_size is not None and block_size < 1:
        raise AttentionError(f"jagged_attention: block_size={block_size} must be a positive int or None")
    if window is not None and window < 0:
        raise AttentionError(f"jagged_attention: window={window} must be a non-negative int or None")
    if not (pointwise_norm == "row" or (isinstance(pointwise_norm, int) and pointwise_norm > 0)):
        raise AttentionError(f"jagged_attention: pointwise_norm={pointwise_norm!r}, expected 'row' or an int > 0")
    if num_targets is not None and (num_targets.dim() != 1 or num_targets.shape[0] != q_offsets.shape[0] - 1):
        raise AttentionError(f"jagged_attention: num_targets must be [B={q_offsets.shape[0] - 1}] ints, got "
                             f"{tuple(num_targets.shape)}")
    if bias is not None:
        bias.validate(q.shape[1], q.shape[0], k.shape[0])


def jagged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    activation: str = "softmax",
    causal: bool = False,
    scale: float | None = None,
    bias: RelativeBias | None = None,
    block_size: int | None = None,
    window: int | None = None,
    max_q_len: int | None = None,
    max_kv_len: int | None = None,
    num_targets: torch.Tensor | None = None,
    pointwise_norm: str | int = "row",
    impl: str | None = None,
    precision: str = "bf16",
) -> torch.Tensor:
    """Attention over jagged rows: ``q [ΣLq, H, D]``, ``k, v [ΣLkv, H, D]``, offsets ``[B+1]`` -> ``[ΣLq, H, D]``.

    ``scale`` defaults to ``1/sqrt(D)``. ``max_q_len`` / ``max_kv_len`` are optional upper bounds of the
    row lengths (they pick the kernel configuration without a device sync). ``impl``: ``"auto"`` (Triton
    on CUDA, reference on CPU), ``"triton"`` or ``"ref"``; None uses the ``attention_impl`` context.
    ``precision``: ``"bf16"`` (inputs' dtype), ``"fp8"`` (the forward's QK^T and PV in e4m3 with block scales,
    a straight-through bf16 backward) or ``"fp8_fwd_bwd"`` (the backward's score products QK^T and dO V^T in
    e4m3 too): ``kernels.attention_fp8``.
    """
    if precision != "bf16":
        from kernels.attention_fp8 import check_precision, jagged_attention_fp8

        check_precision(precision, "jagged_attention")
        return jagged_attention_fp8(
            q, k, v, q_offsets, kv_offsets, activation=activation, causal=causal, scale=scale, bias=bias,
            block_size=block_size, window=window, max_q_len=max_q_len, max_kv_len=max_kv_len,
            num_targets=num_targets, pointwise_norm=pointwise_norm, impl=impl,
            fp8_backward=precision == "fp8_fwd_bwd",
        )
    _check(q, k, v, q_offsets, kv_offsets, activation, bias, block_size, window, num_targets, pointwise_norm)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    chosen = current_impl() if impl is None else impl
    if chosen not in IMPLS:
        raise AttentionError(f"jagged_attention: impl={chosen!r}, expected one of {IMPLS}")
    if chosen == "auto":
        chosen = "triton" if q.is_cuda else "ref"
    if chosen == "ref":
        return jagged_attention_ref(
            q, k, v, q_offsets, kv_offsets, activation=activation, causal=causal, scale=scale, bias=bias,
            block_size=block_size, window=window, num_targets=num_targets, pointwise_norm=pointwise_norm,
        )
    from kernels.attention_op import jagged_attention_triton  # imports triton only when used

    return jagged_attention_triton(
        q, k, v, q_offsets, kv_offsets, activation=activation, causal=causal, scale=scale, bias=bias,
        block_size=block_size, window=window, num_targets=num_targets, pointwise_norm=pointwise_norm,
        max_q_len=max_q_len, max_kv_len=max_kv_len,
    )
