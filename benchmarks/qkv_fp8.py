"""The FP8 attention forward with its codes from an FP8 QKV projection (``kernels.qkv_fp8``), against bf16.

    python benchmarks/qkv_fp8.py                 # batch A (device README), 20 back-to-back calls per timing
    python benchmarks/qkv_fp8.py A calls=5
    python benchmarks/qkv_fp8.py A profile       # and the FP8 route's forward+backward kernels (torch.profiler)

The model's attention layer runs ``x [ΣL, d] -> q, k, v`` and then the attention. Arms, on one bf16 ``x``
(d = H * D) and one weight and bias, causal softmax:

* bf16: three cuBLAS GEMMs (as ``model.layers.split_projection``), then our bf16 forward.
* fp8, quantize pass: the same GEMMs, then ``jagged_attention(precision="fp8")`` (q, k, v quantized per 128-token
  block in a launch of its own).
* fp8 from the projection: ``qkv_codes`` (x cast tensorwise with its current scale, three ``torch._scaled_mm``
  GEMMs writing e4m3 codes, V transposed) then ``kernels.qkv_fp8.attention`` (the FP8 kernel, V's bias in its
  epilogue). The scales of q, k and v are powers of two from their amaxes (here the same batch's, as delayed
  scaling would carry them from earlier steps); the weights' casts happen once per optimizer step and are
  timed apart.

Correctness first: every arm's output against float64 attention on the float64 projection, the codes' NaN count
(none expected), and whether e4m3 output saturates at 448 (a GEMM with its scale 64x too small). The FP8 kernel is
also timed alone on these codes and on ``quantize_qkv``'s codes of the bf16 q, k, v.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attention import BATCHES, FP8_REL_BOUND, cuda_time, lengths, offsets_of, rel_err  # noqa: E402
from kernels import jagged_attention, mx, qkv_fp8  # noqa: E402
from kernels.attention_fp8 import jagged_attention_fp8  # noqa: E402
from kernels.attention_fp8_op import fp8_fwd_quantized, quantize_qkv  # noqa: E402
from kernels.attention_op import _len_key  # noqa: E402
from kernels.attention_ref import jagged_attention_ref  # noqa: E402
from kernels.qkv_fp8 import attention, pow2_scale, projected_attention, qkv_codes, quantize_qkv_weight  # noqa: E402

F8 = torch.float8_e4m3fn


def main(argv: list[str]) -> None:
    if any(a in ("-h", "--help") for a in argv):
        sys.exit(__doc__)
    if not torch.cuda.is_available():
        sys.exit("qkv_fp8.py times the kernels on the GPU: run it on a CUDA machine")
    calls = next((int(a[6:]) for a in argv if a.startswith("calls=")), 20)
    name = next((a for a in argv if a in BATCHES), "A")
    B, max_len, H, D = BATCHES[name]
    lens = lengths(B, max_len)
    T, d, qb = int(lens.sum()), H * D, 128
    offs = offsets_of(lens)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, d, device="cuda", dtype=torch.bfloat16, generator=g)
    w = (torch.randn(3 * d, d, device="cuda", generator=g) / math.sqrt(d)).to(torch.bfloat16)
    b = (torch.randn(3 * d, device="cuda", generator=g) * 0.1).to(torch.bfloat16)
    ws, bs = w.chunk(3), b.chunk(3)
    attn_kw = dict(causal=True, max_q_len=max_len, max_kv_len=max_len)
    print(f"### QKV projection + attention forward, batch {name}: B={B}, max_len={max_len}, H={H}, D={D}, ΣL={T}, "
          f"x [ΣL, {d}] bf16, causal softmax, {calls} back-to-back calls per timing\n")

    def proj():
        return [F.linear(x, wi, bi).view(T, H, D) for wi, bi in zip(ws, bs)]

    with torch.no_grad():
        q, k, v = proj()
        bv = bs[2].view(H, D)
        scales = torch.stack([pow2_scale(t.abs().max()) for t in (q, k, v - bv)])
        weights = quantize_qkv_weight(w)
        codes = lambda: qkv_codes(x, weights, b, offs, H, scales)
        on_codes = lambda c: attention(c, offs, max_len)
        c = codes()
        nan_codes = sum(int(torch.isnan(t.float()).sum()) for t in (c.q.data, c.k.data, c.v_transposed.data))
        one = torch.ones((), device="cuda")
        wide = torch._scaled_mm(c.q.data.view(T, d)[:256], weights[1].data.t(), one * 64, one, out_dtype=F8)
        sat_ok = bool(torch.isfinite(wide.float()).all()) and float(wide.float().abs().max()) == 448.0
        exact = jagged_attention_ref(*[(x.double() @ wi.double().t() + bi.double()).view(T, H, D)
                                       for wi, bi in zip(ws, bs)], offs, offs, causal=True)
        outs = (jagged_attention(q, k, v, offs, offs, **attn_kw),
                jagged_attention_fp8(q, k, v, offs, offs, quant_block=qb, **attn_kw), on_codes(c))
        errs = [rel_err(o, exact) for o in outs]
        del exact, outs
        print(f"NaN codes: {nan_codes}; e4m3 output saturates at 448: {'yes' if sat_ok else 'NO'}; scales q, k, v: "
              f"{', '.join(f'{float(t):g}' for t in scales)}\n")

        t = lambda fn: cuda_time(fn, calls=calls)
        bf_attn = lambda: jagged_attention(q, k, v, offs, offs, **attn_kw)
        f8_attn = lambda: jagged_attention_fp8(q, k, v, offs, offs, quant_block=qb, **attn_kw)
        rows = {
            "bf16": (t(proj), t(bf_attn), t(lambda: jagged_attention(*proj(), offs, offs, **attn_kw)), errs[0]),
            "fp8, quantize pass": (t(proj), t(f8_attn), t(lambda: jagged_attention_fp8(
                *proj(), offs, offs, quant_block=qb, **attn_kw)), errs[1]),
            "fp8 from the projection": (t(codes), t(lambda: on_codes(c)), t(lambda: on_codes(codes())), errs[2]),
        }
        weight_casts = t(lambda: quantize_qkv_weight(w))
        c_pass = quantize_qkv(q, k, v, offs, offs, qb, True)
        len_key = _len_key(offs, q, k, max_len, max_len)
        kernel_pass = t(lambda: fp8_fwd_quantized(q, k, *c_pass, offs, offs, None, None, None, None, None, "softmax",
                                                  True, D**-0.5, 0, -1, 0, len_key, max_len, qb))
        x_cast = t(lambda: mx.quantize_tensorwise(x))
    flops_proj = 2 * T * d * 3 * d
    base = rows["bf16"]
    print("| arm | projection ms | attention ms | both ms | projection TFLOP/s | bf16 / this (attention) | "
          "bf16 / this (both) | err vs f64 | ok |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arm, (tp, ta, tb, e) in rows.items():
        print(f"| {arm} | {tp:.3f} | {ta:.3f} | {tb:.3f} | {flops_proj / tp / 1e9:.0f} | {base[1] / ta:.2f}x | "
              f"{base[2] / tb:.2f}x | {e:.1e} | {'yes' if e <= FP8_REL_BOUND else 'NO'} |")
    print(f"\nweights' casts (three tensorwise casts, once per optimizer step): {weight_casts:.3f} ms")
    print(f"FP8 kernel alone on quantize_qkv's codes of the bf16 q, k, v: {kernel_pass:.3f} ms "
          f"(bf16 / this {base[1] / kernel_pass:.2f}x); x's tensorwise cast (in the projection): {x_cast:.3f} ms")
    _train_rows(x, w, b, offs, H, D, max_len, attn_kw, calls, profile="profile" in argv)


def _train_rows(x, w, b, offs, H: int, D: int, max_len: int, attn_kw: dict, calls: int,
                profile: bool = False) -> None:
    """Forward+backward of projection and attention: bf16 (three GEMMs, our bf16 kernels) against
    ``projected_attention`` (FP8 forward, bf16 backward), gradients of x, W and b against float64."""
    T = x.shape[0]
    dout = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=torch.Generator(
        device="cuda").manual_seed(1))

    def bf16(xx, ww, bb):
        q, k, v = (F.linear(xx, wi, bi).view(T, H, D) for wi, bi in zip(ww.chunk(3), bb.chunk(3)))
        return jagged_attention(q, k, v, offs, offs, **attn_kw)

    def ours(xx, ww, bb):
        return projected_attention(xx, ww, bb, offs, H, causal=True, max_len=max_len)

    def ours_cast(xx, ww, bb):  # the weight's casts in every call, as one call per optimizer step pays them
        qkv_fp8._WEIGHT_CODES.clear()
        return ours(xx, ww, bb)

    def exact(xx, ww, bb):
        q, k, v = (xx @ ww.t() + bb).view(T, 3, H, D).unbind(1)
        return jagged_attention_ref(q, k, v, offs, offs, causal=True)

    def grads(fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (x, w, b)]
        fn(*leaves).backward(dout.to(dtype))
        return [t.grad for t in leaves]

    ref = grads(exact, torch.float64)
    errs = {name: [rel_err(g, r) for g, r in zip(grads(fn, torch.bfloat16), ref)] for name, fn in
            (("bf16", bf16), ("fp8 from the projection", ours))}
    del ref
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]

    def step(fn):
        fn(*leaves).backward(dout)

    times = {name: cuda_time(lambda fn=fn: step(fn), calls=calls) for name, fn in
             (("bf16", bf16), ("fp8 from the projection", ours), ("fp8, weights cast in each call", ours_cast))}
    errs["fp8, weights cast in each call"] = errs["fp8 from the projection"]
    if profile:  # where the FP8 route's forward+backward spends its GPU time
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step(ours)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))
    print("\n| projection + attention, forward+backward | ms | bf16 / this | err dx | err dW | err db |")
    print("|---|---|---|---|---|---|")
    for name, ms in times.items():
        e = errs[name]
        print(f"| {name} | {ms:.3f} | {times['bf16'] / ms:.2f}x | {e[0]:.1e} | {e[1]:.1e} | {e[2]:.1e} |")


if __name__ == "__main__":
    main(sys.argv[1:])
