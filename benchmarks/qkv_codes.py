"""The FP8 attention forward with its codes from the QKV projection (issue 8), against bf16, in one run.

    python benchmarks/qkv_codes.py                 # batch A (device README), 5 back-to-back calls per timing
    python benchmarks/qkv_codes.py A calls=1 block=64
    python benchmarks/qkv_codes.py A sweep         # and the projection kernel at each (BLOCK_K, warps, stages)

The model's attention layer runs ``x [ΣL, d] -> q, k, v`` (``nn.Linear(d, 3d)``, as three GEMMs on row blocks of
its weight: ``model.layers.split_projection``) and then the attention. Arms, on one bf16 ``x`` (d = H * D = 1024
on batch A) and one weight:

* bf16: the three cuBLAS GEMMs, then our bf16 forward.
* fp8 (quantize pass): the same GEMMs, then ``jagged_attention(precision="fp8")``, which quantizes q, k, v in a
  launch of its own.
* fp8 (codes from the projection): ``kernels.qkv_codes`` (one Triton GEMM whose epilogue also writes the codes),
  then the FP8 kernel on them.

Each arm's projection and attention are timed alone and together (CUDA events, median). Correctness first: the
projection kernel's codes equal ``quantize_qkv`` of its own q, k, v bit for bit, its q, k, v match
``F.linear``, and the attention output on its codes equals the quantize-pass arm's on the same q, k, v.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.qkv_codes as qkv_module  # noqa: E402
from benchmarks.attention import BATCHES, cuda_time, lengths, offsets_of, rel_err  # noqa: E402
from kernels import jagged_attention  # noqa: E402
from kernels.attention_fp8 import jagged_attention_fp8  # noqa: E402
from kernels.attention_fp8_op import fp8_fwd_quantized, quantize_qkv  # noqa: E402
from kernels.attention_op import _len_key  # noqa: E402
from kernels.qkv_codes import qkv_codes  # noqa: E402

SWEEP = [(64, 8, 3), (64, 8, 4), (64, 4, 3), (128, 8, 2), (128, 8, 3), (32, 4, 4), (64, 4, 4)]


def _inputs(name: str, seed: int = 0):
    B, max_len, H, D = BATCHES[name]
    lens = lengths(B, max_len)
    T, d = int(lens.sum()), H * D
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, d, device="cuda", dtype=torch.bfloat16, generator=g)
    w = (torch.randn(3 * d, d, device="cuda", generator=g) / math.sqrt(d)).to(torch.bfloat16)
    b = (torch.randn(3 * d, device="cuda", generator=g) * 0.1).to(torch.bfloat16)
    return B, max_len, H, D, T, offsets_of(lens), x, w, b


def _codes_equal(r, offs, block: int) -> bool:
    """The projection's codes equal ``quantize_qkv`` of its own q, k, v (used blocks and columns)."""
    qq, kq, vq, vt = quantize_qkv(r.q, r.k, r.v, offs, offs, block, True)
    nb, cols = int(qq.block_offsets[-1]), int(vt.offsets[-1])
    u8 = lambda t: t.view(torch.uint8)
    return (torch.equal(u8(qq.data), u8(r.q_codes.data)) and torch.equal(u8(kq.data), u8(r.k_codes.data))
            and torch.equal(u8(vt.data)[:, :cols], u8(r.v_transposed.data)[:, :cols])
            and all(torch.equal(a.scale[:nb], b.scale[:nb]) for a, b in ((qq, r.q_codes), (kq, r.k_codes),
                                                                          (vq, r.v_codes))))


def main(argv: list[str]) -> None:
    if any(a in ("-h", "--help") for a in argv):
        sys.exit(__doc__)
    if not torch.cuda.is_available():
        sys.exit("qkv_codes.py times the kernels on the GPU: run it on a CUDA machine")
    calls = next((int(a[6:]) for a in argv if a.startswith("calls=")), 5)
    block = next((int(a[6:]) for a in argv if a.startswith("block=")), 128)
    name = next((a for a in argv if a in BATCHES), "A")
    B, max_len, H, D, T, offs, x, w, b = _inputs(name)
    ws, bs = w.chunk(3), b.chunk(3)
    attn_kw = dict(causal=True, max_q_len=max_len, max_kv_len=max_len)
    len_key = _len_key(offs, x.view(T, H, D), x.view(T, H, D), max_len, max_len)
    print(f"### QKV projection + attention forward, batch {name}: B={B}, max_len={max_len}, H={H}, D={D}, ΣL={T}, "
          f"x [ΣL, {H * D}] bf16, causal softmax, {block}-token scale blocks, {calls} back-to-back calls per timing\n")

    def proj():
        return [F.linear(x, wi, bi).view(T, H, D) for wi, bi in zip(ws, bs)]

    def codes():
        return qkv_codes(x, w, b, offs, H, block)

    def on_codes(r):
        return fp8_fwd_quantized(r.q, r.k, r.q_codes, r.k_codes, r.v_codes, r.v_transposed, offs, offs, None, None,
                                 None, None, None, "softmax", True, 1.0 / math.sqrt(D), 0, -1, 0, len_key, max_len,
                                 block)[0]

    with torch.no_grad():
        r = codes()
        q, k, v = proj()
        ok_codes = _codes_equal(r, offs, block)
        err_proj = max(rel_err(a, b_) for a, b_ in ((r.q, q), (r.k, k), (r.v, v)))
        same_out = torch.equal(on_codes(r), jagged_attention_fp8(r.q, r.k, r.v, offs, offs, quant_block=block,
                                                                 **attn_kw))
        print(f"codes equal to quantize_qkv of the kernel's q, k, v: {'yes' if ok_codes else 'NO'}; "
              f"q, k, v vs F.linear: {err_proj:.1e} relative L2; attention on the codes equal to the quantize-pass "
              f"arm on the same q, k, v: {'yes' if same_out else 'NO'}\n")

        t = lambda fn: cuda_time(fn, calls=calls)
        bf_attn = lambda: jagged_attention(q, k, v, offs, offs, **attn_kw)
        f8_attn = lambda: jagged_attention_fp8(q, k, v, offs, offs, quant_block=block, **attn_kw)
        rows = {
            "bf16": (t(proj), t(bf_attn), t(lambda: jagged_attention(*proj(), offs, offs, **attn_kw))),
            "fp8, quantize pass": (t(proj), t(f8_attn),
                                   t(lambda: jagged_attention_fp8(*proj(), offs, offs, quant_block=block, **attn_kw))),
            "fp8, codes from the projection": (t(codes), t(lambda: on_codes(r)), t(lambda: on_codes(codes()))),
        }
        one_gemm = t(lambda: F.linear(x, w, b))
    flops_proj = 2 * T * (H * D) * 3 * H * D
    base = rows["bf16"][2]
    print("| arm | projection ms | attention ms | both ms | projection TFLOP/s | bf16 / this (both) |")
    print("|---|---|---|---|---|---|")
    for arm, (tp, ta, tb) in rows.items():
        print(f"| {arm} | {tp:.3f} | {ta:.3f} | {tb:.3f} | {flops_proj / tp / 1e9:.0f} | {base / tb:.2f}x |")
    print(f"\nOne cuBLAS GEMM [ΣL, {H * D}] x [{H * D}, {3 * H * D}] (one wide output, not three tensors): "
          f"{one_gemm:.3f} ms, {flops_proj / one_gemm / 1e9:.0f} TFLOP/s")
    print(f"attention alone, bf16 / fp8 on the codes: {rows['bf16'][1] / rows['fp8, codes from the projection'][1]:.2f}x;"
          f" projection, three GEMMs / qkv_codes: {rows['bf16'][0] / rows['fp8, codes from the projection'][0]:.2f}x")
    if "sweep" in argv:
        print("\n| projection kernel (BLOCK_K, warps, stages) | ms | TFLOP/s |")
        print("|---|---|---|")
        shipped = qkv_module.CONFIG
        for cfg in SWEEP:
            qkv_module.CONFIG = cfg
            try:
                with torch.no_grad():
                    ms = t(codes)
                print(f"| {cfg} | {ms:.3f} | {flops_proj / ms / 1e9:.0f} |", flush=True)
            except Exception as e:  # a configuration that does not fit must not end the sweep
                print(f"| {cfg} | ERROR {type(e).__name__}: {str(e)[:120]} | |", flush=True)
        qkv_module.CONFIG = shipped


if __name__ == "__main__":
    main(sys.argv[1:])
