"""Attention and other kernels: Triton implementations, each with a PyTorch reference."""

from kernels.attention import jagged_attention
from kernels.attention_flops import jagged_attention_flops
from kernels.attention_fp8 import jagged_attention_fp8 as jagged_attention_fp8  # FP8 QK^T and PV
from kernels.attention_ref import jagged_attention_ref
from kernels.attention_spec import AttentionError, RelativeBias, attention_impl
from kernels.fp8_linear import Fp8Config as Fp8Config  # FP8 linear layers
from kernels.fp8_linear import Fp8Linear as Fp8Linear

__all__ = [
    "AttentionError",
    "RelativeBias",
    "attention_impl",
    "jagged_attention",
    "jagged_attention_flops",
    "jagged_attention_ref",
]
