"""FP8 linear layers and quantizers on one GPU: check, then time, then print one table.

    PYTHONPATH=. python benchmarks/fp8_linear.py [--quick | --mlp-only] [--sweep] [--json OUT.json]

1. Checks (fresh random data): Triton quantizers bit-identical to the PyTorch reference on the GPU
   (special values and fp32 subnormals included); each native recipe's output and gradients against
   the emulated reference of the same recipe and against a float64 linear.
2. Forward+backward time of each recipe against bf16 ``nn.Linear`` on gem_medium MLP shapes
   (tokens x 1024 -> 4096 -> 1024, tokens = 65536) and interaction shapes; ratio = bf16 / recipe.
3. Quantizer bandwidth (bytes read + written / time) against a device-to-device copy measured in
   the same run.
4. GEMMs alone (operands quantized beforehand) on the mlp-up shape: output, input-gradient and
   weight-gradient GEMM of each recipe against bf16, to split a recipe's time into GEMMs and quantization.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
from torch import nn

from kernels import mx, mx_triton
from kernels.fp8_linear import Fp8Config, Fp8Linear

VARIANTS = [  # (label, config kwargs)
    ("bf16 (ours)", dict(recipe="bf16")),
    ("rowwise", dict(recipe="rowwise")),
    ("blockwise", dict(recipe="blockwise")),
    ("blockwise, wgrad x 128x128", dict(recipe="blockwise", blockwise_wgrad="128x128")),
    ("blockwise wgrad=bf16", dict(recipe="blockwise", wgrad="bf16")),
    ("rowwise wgrad=bf16", dict(recipe="rowwise", wgrad="bf16")),
    ("tensorwise (dY e5m2)", dict(recipe="tensorwise")),
    ("tensorwise (dY e4m3)", dict(recipe="tensorwise", grad_format="e4m3")),
    ("tensorwise wgrad=bf16", dict(recipe="tensorwise", wgrad="bf16")),
    ("mxfp8 (hopper: emulate)", dict(recipe="mxfp8", mx_on_hopper="emulate")),
    ("mxfp8 (hopper: as blockwise)", dict(recipe="mxfp8", mx_on_hopper="blockwise")),
]
LINEAR_SHAPES = [  # (name, tokens, in, out)
    ("mlp up", 65536, 1024, 4096),
    ("mlp down", 65536, 4096, 1024),
    ("interaction", 4096, 512, 512),
    ("interaction", 16384, 512, 512),
    ("interaction", 4096, 1024, 1024),
]


def bench(fn, rep: int = 100) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    def u(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().view(torch.uint8) if t.element_size() == 1 else t.contiguous().view(torch.int32)
    return a.shape == b.shape and torch.equal(u(a).cpu(), u(b).cpu())


def check_quantizers(dev: str) -> list[tuple[str, str]]:
    rows = []
    g = torch.Generator(device="cpu").manual_seed(1)
    for dt in (torch.float32, torch.bfloat16):
        x = (torch.randn(1000, 1000, generator=g) * torch.logspace(-6, 6, 1000)).to(dt)
        x[3, 5] = float("nan")
        x[10, 40] = float("inf")
        x[20, :64] = 0
        if dt == torch.float32:
            x[30, 64:192] = torch.rand(128, generator=g) * 1e-39  # fp32 subnormals
        xc = x.to(dev)
        for axis in (0, 1):
            ref, tri = mx.mx_quantize_ref(x, axis), mx.mx_quantize(xc, axis, backend="triton")
            ok = bits_equal(ref.data, tri.data) and bits_equal(ref.scale, tri.scale)
            d_ref = mx.mx_dequantize_ref(ref, torch.bfloat16)
            d_tri = mx.mx_dequantize(tri, torch.bfloat16, backend="triton")
            okd = torch.equal(d_ref.float().nan_to_num(7.0), d_tri.float().cpu().nan_to_num(7.0))
            r1, t1 = mx.quantize_1x128_ref(x, axis), mx.quantize_1x128(xc, axis, backend="triton")
            ok1 = bits_equal(r1.data, t1.data) and bits_equal(r1.scale, t1.scale)
            rows.append((f"mx quantize axis={axis} {dt}", str(ok)))
            rows.append((f"mx dequantize->bf16 axis={axis} {dt}", str(okd)))
            rows.append((f"1x128 quantize axis={axis} {dt}", str(ok1)))
        (a, b), (c, d) = mx.mx_quantize_both(xc, backend="triton"), mx.quantize_1x128_both(xc, backend="triton")
        rows.append((f"mx both {dt}", str(bits_equal(a.data, mx.mx_quantize_ref(x, 1).data)
                                         and bits_equal(b.data, mx.mx_quantize_ref(x, 0).data))))
        rows.append((f"1x128 both {dt}", str(bits_equal(c.data, mx.quantize_1x128_ref(x, 1).data)
                                            and bits_equal(d.data, mx.quantize_1x128_ref(x, 0).data))))
        w_ref, wt_ref = mx.quantize_128x128_ref(x)
        w_tri, wt_tri = mx.quantize_128x128(xc, backend="triton")
        rows.append((f"128x128 {dt}", str(bits_equal(w_ref.data, w_tri.data) and bits_equal(wt_ref.data, wt_tri.data)
                                         and bits_equal(w_ref.scale, w_tri.scale))))
        rq, rc = mx.quantize_rowwise(x, 0), mx.quantize_rowwise(xc, 0)
        rows.append((f"rowwise cuda==cpu {dt}", str(bits_equal(rq.data, rc.data))))
        xf = x.nan_to_num(0.0, 0.0, 0.0)  # one non-finite element makes the whole tensor NaN: check finite data
        for fmt in ("e4m3", "e5m2"):
            for src, tag in ((x, "with NaN/Inf"), (xf, "finite")):
                a, b = mx.quantize_tensorwise_both(src.to(dev), fmt, backend="triton")
                ra, rb = mx.quantize_tensorwise_ref(src, 1, fmt), mx.quantize_tensorwise_ref(src, 0, fmt)
                ok = (bits_equal(a.data, ra.data) and bits_equal(b.data, rb.data)
                      and bits_equal(a.scale.reshape(1), ra.scale.reshape(1)))
                rows.append((f"tensorwise {fmt} both layouts {tag} {dt}", str(ok)))
    return rows


def check_linears(dev: str) -> list[tuple[str, str]]:
    return check_linears_dtype(dev, torch.float32) + check_linears_dtype(dev, torch.bfloat16)


def check_linears_dtype(dev: str, dtype: torch.dtype) -> list[tuple[str, str]]:
    rows = []
    torch.manual_seed(2)
    m, k, n = 1000, 1024, 512  # tokens not a multiple of 128: exercises the padded wgrad
    x = torch.randn(m, k, device=dev, dtype=dtype)
    dy = torch.randn(m, n, device=dev, dtype=dtype)
    base = nn.Linear(k, n, device=dev, dtype=dtype)
    xd = x.double().requires_grad_()
    wd = base.weight.detach().double().requires_grad_()
    yd = xd @ wd.t() + base.bias.double()
    yd.backward(dy.double())
    for label, kw in VARIANTS:
        try:
            out = {}
            for emulate in (False, True):
                lin = Fp8Linear.from_linear(base, Fp8Config(emulate=emulate, **kw))
                xi = x.clone().requires_grad_()
                base.weight.grad = base.bias.grad = None
                y = lin(xi)
                y.backward(dy)
                out[emulate] = (y.detach(), xi.grad, base.weight.grad.clone(), base.bias.grad.clone())
            nat, emu = out[False], out[True]
            tag = str(dtype).replace("torch.", "")
            rows.append((f"{label} {tag}: native vs emulated (y, dx, dW, db)",
                         " ".join(f"{rel(a, b):.1e}" for a, b in zip(nat, emu))))
            rows.append((f"{label} {tag}: native vs float64 (y, dx, dW, db)",
                         " ".join(f"{rel(a, b):.1e}" for a, b in zip(nat, (yd, xd.grad, wd.grad, dy.double().sum(0))))))
        except Exception as e:  # report and continue: one broken recipe must not hide the others
            rows.append((f"{label} {dtype}", f"ERROR {type(e).__name__}: {str(e)[:300]}"))
    return rows


def time_linears(dev: str, shapes) -> list[dict]:
    results = []
    for name, m, k, n in shapes:
        torch.manual_seed(0)
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        base = nn.Linear(k, n, device=dev, dtype=torch.bfloat16)

        def step(mod, x=x, dy=dy, base=base):
            def f():
                x.grad = None
                base.weight.grad = None
                base.bias.grad = None
                mod(x).backward(dy)
            return f

        flops = 3 * 2 * m * k * n
        t_ref = bench(step(base))
        results.append(dict(shape=f"{name} {m}x{k}->{n}", variant="bf16 nn.Linear", ms=t_ref, ratio=1.0,
                            tflops=flops / t_ref / 1e9))
        if m * k * n <= 2**34:  # small layers: launch overhead dominates; CUDA graphs remove it
            for label, mod in (("bf16 nn.Linear", base),
                               ("blockwise", Fp8Linear.from_linear(base, Fp8Config(recipe="blockwise")))):
                try:
                    g = torch.cuda.make_graphed_callables(mod, (x,), num_warmup_iters=3)
                    t = bench(step(g))
                    results.append(dict(shape=f"{name} {m}x{k}->{n}", variant=f"{label} (CUDA graph)", ms=t,
                                        ratio=t_ref / t, tflops=flops / t / 1e9))
                except Exception as e:
                    results.append(dict(shape=f"{name} {m}x{k}->{n}", variant=f"{label} (CUDA graph)",
                                        ms=float("nan"), ratio=float("nan"), tflops=float("nan"),
                                        error=f"{type(e).__name__}: {e}"[:200]))
        for label, kw in VARIANTS:
            try:
                t = bench(step(Fp8Linear.from_linear(base, Fp8Config(**kw))))
                results.append(dict(shape=f"{name} {m}x{k}->{n}", variant=label, ms=t, ratio=t_ref / t,
                                    tflops=flops / t / 1e9))
            except Exception as e:
                results.append(dict(shape=f"{name} {m}x{k}->{n}", variant=label, ms=float("nan"),
                                    ratio=float("nan"), tflops=float("nan"), error=f"{type(e).__name__}: {e}"[:200]))
        torch.cuda.empty_cache()
    return results


def time_quantizers(dev: str, sweep: bool) -> tuple[float, list[dict]]:
    torch.manual_seed(0)
    r, c = 65536, 4096
    x = torch.randn(r, c, device=dev, dtype=torch.bfloat16)
    nbytes_in = x.numel() * 2
    t_copy = bench(lambda: x.clone())
    copy_bw = 2 * nbytes_in / t_copy / 1e9  # TB/s (bytes / ms / 1e9): read + write
    out = []
    cases = [  # (label, block, e8m0, row, col)
        ("mx rows (1x32)", 32, True, True, False),
        ("mx cols (x^T layout)", 32, True, False, True),
        ("mx both layouts", 32, True, True, True),
        ("1x128 rows", 128, False, True, False),
        ("1x128 cols (x^T layout)", 128, False, False, True),
        ("1x128 both layouts", 128, False, True, True),
    ]
    sweep_tiles = {
        (32, "row"): [(16, 256, 4), (8, 512, 4), (32, 256, 8)],
        (32, "col"): [(32, 128, 4), (32, 256, 4), (32, 256, 8), (32, 64, 4)],
        (32, "both"): [(32, 128, 4), (32, 256, 8), (32, 64, 4), (32, 256, 4)],
        (128, "row"): [(8, 512, 4), (16, 512, 8), (8, 1024, 8)],
        (128, "col"): [(128, 64, 8), (128, 32, 4), (128, 64, 4), (128, 128, 8)],
        (128, "both"): [(128, 128, 8), (128, 64, 8), (128, 64, 4), (128, 128, 16)],
    }
    for label, blk, e8, row, col in cases:
        mode = "both" if (row and col) else ("row" if row else "col")
        outs = (row + col) * (x.numel() + x.numel() // blk * (1 if e8 else 4))
        best = None
        for tiles in (sweep_tiles[(blk, mode)] if sweep else [mx_triton.TILES[(blk, mode)]]):
            try:
                t = bench(lambda tiles=tiles, a=(blk, e8, row, col): mx_triton.quantize(x, *a, tiles=tiles), rep=100)
            except Exception as e:
                print(f"tile {tiles} for {label} failed: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
                continue
            if best is None or t < best[0]:
                best = (t, tiles)
        t, tiles = best
        mx_triton.TILES[(blk, mode)] = tuple(tiles)
        bw = (nbytes_in + outs) / t / 1e9
        out.append(dict(kernel=label, ms=t, tbps=bw, pct_copy=100 * bw / copy_bw, tiles=list(tiles)))
    for label, row, col in (("rowwise rows (2 passes)", True, False), ("rowwise both layouts (2 passes)", True, True)):
        t = bench(lambda row=row, col=col: mx_triton.quantize_rowwise(x, row, col), rep=100)
        bw = (nbytes_in * 2 + (row + col) * x.numel()) / t / 1e9  # x is read twice
        out.append(dict(kernel=label, ms=t, tbps=bw, pct_copy=100 * bw / copy_bw, tiles=[64, 128, 4]))
    tw_tiles = [(64, 128, 4), (128, 128, 8), (128, 64, 4), (32, 256, 4), (64, 256, 8)]
    best = None
    for tiles in tw_tiles:  # always swept (new kernel); the dual-layout cast pass decides the tile
        try:
            t = bench(lambda tiles=tiles: mx_triton.quantize_tensorwise(x, True, True, "e4m3", tiles=tiles), rep=100)
        except Exception as e:
            print(f"tile {tiles} for tensorwise failed: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
            continue
        if best is None or t < best[0]:
            best = (t, tiles)
    mx_triton.TENSORWISE_TILES = tuple(best[1])
    t_amax = bench(lambda: mx_triton.tensorwise_amax(x), rep=100)
    for label, row, col in (("tensorwise rows (amax pass + cast pass)", True, False),
                            ("tensorwise both layouts (amax pass + one cast pass)", True, True)):
        t = bench(lambda row=row, col=col: mx_triton.quantize_tensorwise(x, row, col, "e4m3"), rep=100)
        bw = (nbytes_in * 2 + (row + col) * x.numel()) / t / 1e9  # x is read twice
        out.append(dict(kernel=label, ms=t, tbps=bw, pct_copy=100 * bw / copy_bw, tiles=list(best[1])))
    bw = nbytes_in / t_amax / 1e9
    out.append(dict(kernel="tensorwise amax pass alone (read only)", ms=t_amax, tbps=bw, pct_copy=100 * bw / copy_bw,
                    tiles=list(mx_triton.TENSORWISE_AMAX_TILES)))
    q = mx.mx_quantize(x, 1, backend="triton")
    t = bench(lambda: mx.mx_dequantize(q, torch.bfloat16, backend="triton"), rep=100)
    bw = (x.numel() * (1 + 2) + q.scale.numel()) / t / 1e9
    out.append(dict(kernel="mx dequantize -> bf16", ms=t, tbps=bw, pct_copy=100 * bw / copy_bw, tiles=[16, 256, 4]))
    w = torch.randn(4096, 1024, device=dev, dtype=torch.bfloat16)
    t = bench(lambda: mx.quantize_128x128(w, backend="triton"), rep=100)
    bw = (w.numel() * (2 + 2)) / t / 1e9
    out.append(dict(kernel="128x128 weight 4096x1024 (+ transposed copy)", ms=t, tbps=bw,
                    pct_copy=100 * bw / copy_bw, tiles=[128, 128, 8]))
    return copy_bw, out


def _recipe_gemm_times(plan, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> dict[str, float]:
    xa, xt = plan.act_both(x, saved_input=True)
    wa, wt = plan.weight(w)
    dya, dyt = plan.act_both(dy, grad=True)
    bf = torch.bfloat16
    return dict(fwd=bench(lambda: plan.gemm(xa, wa, bf, fast_accum=True)), dgrad=bench(lambda: plan.gemm(dya, wt, bf)),
                wgrad=bench(lambda: plan.gemm(dyt, xt, bf)))


def time_gemms(dev: str, m: int = 65536, k: int = 1024, n: int = 4096) -> list[dict]:
    """The three GEMMs of each recipe on pre-quantized operands (no quantization in the timed region)."""
    from kernels.fp8_linear import _Plan

    torch.manual_seed(0)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
    out = []
    ref = {"fwd": bench(lambda: x @ w.t()), "dgrad": bench(lambda: dy @ w), "wgrad": bench(lambda: dy.t() @ x)}
    out.append(dict(recipe="bf16 torch.mm", **ref))
    for label, kw in (("tensorwise", dict(recipe="tensorwise")), ("rowwise", dict(recipe="rowwise")),
                      ("blockwise", dict(recipe="blockwise"))):
        try:
            out.append(dict(recipe=label, **_recipe_gemm_times(_Plan.make(Fp8Config(**kw), x, "time_gemms"),
                                                               x, w, dy)))
        except Exception as e:
            out.append(dict(recipe=label, fwd=float("nan"), dgrad=float("nan"), wgrad=float("nan"),
                            error=f"{type(e).__name__}: {e}"[:200]))
    flops = 2 * m * k * n
    for r in out:
        r["tflops"] = {g: flops / r[g] / 1e9 for g in ("fwd", "dgrad", "wgrad")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="interaction shapes only")
    ap.add_argument("--mlp-only", action="store_true", help="the two large MLP shapes only")
    ap.add_argument("--sweep", action="store_true", help="try several tile shapes per quantizer")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = "cuda"
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    checks = check_quantizers(dev) + check_linears(dev)
    copy_bw, quant = time_quantizers(dev, args.sweep)  # first: the linears then use the best tiles
    shapes = LINEAR_SHAPES[2:] if args.quick else (LINEAR_SHAPES[:2] if args.mlp_only else LINEAR_SHAPES)
    gemms = time_gemms(dev)
    lin = time_linears(dev, shapes)
    print("tiles used:", mx_triton.TILES, "tensorwise:", mx_triton.TENSORWISE_TILES)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(checks=checks, linears=lin, copy_tbps=copy_bw, quantizers=quant, gemms=gemms), f, indent=1)

    print("\n## checks")
    for k, v in checks:
        print(f"| {k} | {v} |")
    print("\n## forward+backward, bf16 inputs/weights (ratio = bf16 nn.Linear time / variant time)")
    print("| shape | variant | ms | TFLOP/s | ratio |")
    print("|---|---|---|---|---|")
    for r in lin:
        extra = f" {r['error']}" if "error" in r else ""
        print(f"| {r['shape']} | {r['variant']} | {r['ms']:.3f} | {r['tflops']:.0f} | {r['ratio']:.2f}x{extra} |")
    by_variant: dict[str, list[float]] = {}
    for r in lin:
        if r["shape"].startswith("mlp"):
            by_variant.setdefault(r["variant"], []).append(r["ms"])
    if by_variant:
        ref = sum(by_variant["bf16 nn.Linear"])
        print("\n| MLP 1024->4096->1024 (both linears) | ms | ratio |\n|---|---|---|")
        for v, ts in by_variant.items():
            print(f"| {v} | {sum(ts):.3f} | {ref / sum(ts):.2f}x |")
    print("\n## GEMMs alone, mlp up 65536x1024->4096 (operands quantized beforehand): ms (TFLOP/s)")
    print("| recipe | output | input gradient | weight gradient | sum | sum vs bf16 |\n|---|---|---|---|---|---|")
    ref_sum = gemms[0]["fwd"] + gemms[0]["dgrad"] + gemms[0]["wgrad"]
    for r in gemms:
        tot = r["fwd"] + r["dgrad"] + r["wgrad"]
        cells = " | ".join(f"{r[g]:.3f} ({r['tflops'][g]:.0f})" for g in ("fwd", "dgrad", "wgrad"))
        print(f"| {r['recipe']} | {cells} | {tot:.3f} | {ref_sum / tot:.2f}x |{' ' + r['error'] if 'error' in r else ''}")
    print(f"\n## quantizers on 65536x4096 bf16 (copy: {copy_bw:.2f} TB/s read+write)")
    print("| kernel | ms | TB/s | % of copy | tiles (rows, cols, warps) |\n|---|---|---|---|---|")
    for r in quant:
        print(f"| {r['kernel']} | {r['ms']:.3f} | {r['tbps']:.2f} | {r['pct_copy']:.0f}% | {r['tiles']} |")


if __name__ == "__main__":
    main()
