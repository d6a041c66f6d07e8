"""FP8 linear layers and quantizers on one GPU: check, then time, then print one table.

    PYTHONPATH=. python benchmarks/fp8_linear.py [--quick | --mlp-only] [--sweep] [--profile] [--only tensorwise]
        [--rounds 7] [--json OUT.json]

1. Checks (fresh random data): Triton quantizers bit-identical to the PyTorch reference on the GPU
   (special values and fp32 subnormals included); each native recipe's output and gradients against
   the emulated reference of the same recipe and against a float64 linear (``benchmarks/fp8_checks.py``).
2. Forward+backward time of each recipe against bf16 ``nn.Linear`` on gem_medium MLP shapes
   (tokens x 1024 -> 4096 -> 1024, tokens = 65536) and interaction shapes; ratio = bf16 / recipe.
   ``--rounds N`` times bf16 and every variant in turn, N times over, so the clock's fall under sustained
   load (power-limited cards) reaches every variant alike; the table gives the medians and the range of
   the per-round ratios, to read a ratio near a target against its own spread.
3. Quantizer bandwidth (bytes read + written / time) against a device-to-device copy measured in
   the same run.
4. GEMMs alone (operands quantized beforehand) on the mlp-up shape: output, input-gradient and
   weight-gradient GEMM of each recipe against bf16, to split a recipe's time into GEMMs and quantization.
5. ``--profile`` (first, before the rest; code in ``benchmarks/fp8_profile.py``): a sweep of the tensorwise amax pass's tiles and program count;
   a torch.profiler kernel table (top 15 by CUDA time, per step) of one fwd+bwd step of bf16 ``nn.Linear``
   and of the tensorwise layer on 65536x1024->4096, with each step's wall time, GPU busy time and idle
   gap; and ablations of the tensorwise step (forward only, no bias, bias outside the GEMM epilogue, bias
   gradient as a separate sum), each against bf16 in the same run; the same kernel table and host ops for the
   tensorwise layer with delayed scaling; host time per call of the step's pieces on tiny operands, and a
   cProfile of the tiny delayed step by Python function.

``--only PREFIXES`` (comma-separated) keeps the variants whose label starts with one of them (bf16
``nn.Linear`` is always timed), skips the GEMMs-alone table and the profile's ablations, and, when every prefix
is a tensorwise one, keeps only the tensorwise quantizer checks and rows. Every timed step
ends with ``fp8_step()`` (the optimizer step a training loop would run), so delayed-scaling layers run with
history after the first warm-up step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: `benchmarks` importable
from benchmarks.fp8_checks import check_linears, check_quantizers  # noqa: E402
from kernels import mx, mx_triton, mx_triton_tensorwise
from kernels.fp8_linear import Fp8Config, Fp8Linear, fp8_step

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
    ("tensorwise delayed (dY e5m2)", dict(recipe="tensorwise", scaling="delayed")),
    ("tensorwise delayed wgrad=bf16", dict(recipe="tensorwise", scaling="delayed", wgrad="bf16")),
    ("tensorwise delayed, fast accum dgrad", dict(recipe="tensorwise", scaling="delayed", fast_accum="dgrad")),
    ("tensorwise delayed, fast accum all", dict(recipe="tensorwise", scaling="delayed", fast_accum="all")),
    ("mxfp8 (hopper: emulate)", dict(recipe="mxfp8", mx_on_hopper="emulate")),
    ("mxfp8 (hopper: as blockwise)", dict(recipe="mxfp8", mx_on_hopper="blockwise")),
]
# Between the interaction shapes (FP8 loses, host-bound) and the MLP shapes (FP8 wins): where the crossover lies.
CROSSOVER_SHAPES = [("layer", m, k, n) for m, k, n in (
    (16384, 1024, 1024), (65536, 1024, 1024), (16384, 1024, 4096), (32768, 1024, 4096), (16384, 4096, 4096),
    (65536, 2048, 2048))]
CROSSOVER_VARIANTS = [v for v in VARIANTS if v[0] in ("tensorwise (dY e5m2)", "tensorwise delayed (dY e5m2)")] + [
    ("tensorwise delayed, min_gemm=1e11", dict(recipe="tensorwise", scaling="delayed", min_gemm=1e11))]

LINEAR_SHAPES = [  # (name, tokens, in, out)
    ("mlp up", 65536, 1024, 4096),
    ("mlp down", 65536, 4096, 1024),
    ("interaction", 4096, 512, 512),
    ("interaction", 16384, 512, 512),
    ("interaction", 4096, 1024, 1024),
]


MLP_TARGET = 1.4  # the best recipe's forward+backward against bf16 nn.Linear on both large MLP shapes


def mlp_target_line(rows: list[dict], target: float = MLP_TARGET) -> str:
    """The target read off the layer table: the variant whose lower ratio over the large MLP shapes is highest,
    that ratio and each shape's, and whether it reaches ``target`` (bf16 and failed variants left out)."""
    mlp = [r for r in rows if r["shape"].startswith("mlp") and "error" not in r and r["variant"] != "bf16 nn.Linear"]
    shapes = list(dict.fromkeys(r["shape"] for r in rows if r["shape"].startswith("mlp")))
    per_variant: dict[str, dict[str, float]] = {}
    for r in mlp:
        per_variant.setdefault(r["variant"], {})[r["shape"]] = r["ratio"]
    complete = {v: d for v, d in per_variant.items() if len(d) == len(shapes)}
    if not shapes or not complete:
        return f"MLP target (best recipe >= {target:g}x bf16 on the large shapes): no variant timed on every MLP shape"
    best = max(complete, key=lambda v: min(complete[v].values()))
    low = min(complete[best].values())
    each = ", ".join(f"{sh} {complete[best][sh]:.2f}x" for sh in shapes)
    return (f"MLP target (best recipe >= {target:g}x bf16 on the large shapes): {best}, {low:.2f}x ({each}): "
            f"{'met' if low >= target else 'not met'}")


def bench(fn, rep: int = 100) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def time_linears(dev: str, shapes, variants=VARIANTS, rounds: int = 1) -> list[dict]:
    """Forward+backward of bf16 ``nn.Linear`` and each variant per shape. ``rounds`` > 1 times them in turn,
    round after round, so clock and power drift under sustained load falls on every variant alike: ``ms`` is
    the median over rounds and ``ratios`` the per-round ratios to the baseline of the same round."""
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
                fp8_step()  # the optimizer step of a training loop: delayed scaling moves to the next step
            return f

        flops = 3 * 2 * m * k * n
        shape = f"{name} {m}x{k}->{n}"
        steps: list[tuple[str, object]] = [("bf16 nn.Linear", step(base))]
        failed: dict[str, str] = {}
        if m * k * n <= 2**34 and variants is VARIANTS:  # small layers: launch overhead dominates; CUDA graphs remove it
            for label, mod in (("bf16 nn.Linear", base),
                               ("blockwise", Fp8Linear.from_linear(base, Fp8Config(recipe="blockwise")))):
                try:
                    steps.append((f"{label} (CUDA graph)",
                                  step(torch.cuda.make_graphed_callables(mod, (x,), num_warmup_iters=3))))
                except Exception as e:
                    failed[f"{label} (CUDA graph)"] = f"{type(e).__name__}: {e}"[:200]
        for label, kw in variants:
            try:
                steps.append((label, step(Fp8Linear.from_linear(base, Fp8Config(**kw)))))
            except Exception as e:
                failed[label] = f"{type(e).__name__}: {e}"[:200]
        times: dict[str, list[float]] = {label: [] for label, _ in steps}
        for _ in range(rounds):
            for label, timed in steps:
                if label in failed:
                    continue
                try:
                    times[label].append(bench(timed))
                except Exception as e:
                    failed[label] = f"{type(e).__name__}: {e}"[:200]
        ref = times["bf16 nn.Linear"]
        t_ref = statistics.median(ref)
        for label in [*times, *(failed.keys() - times.keys())]:  # variants that could not be built come last
            ts = times.get(label)
            if label in failed or not ts:
                results.append(dict(shape=shape, variant=label, ms=float("nan"), ratio=float("nan"),
                                    tflops=float("nan"), error=failed.get(label, "not timed")))
                continue
            t = statistics.median(ts)
            results.append(dict(shape=shape, variant=label, ms=t, ratio=t_ref / t, tflops=flops / t / 1e9,
                                rounds=ts, ratios=[a / b for a, b in zip(ref, ts)]))
        torch.cuda.empty_cache()
    return results


def time_delayed_casts(x: torch.Tensor, copy_bw: float) -> list[dict]:
    """The delayed-scaling cast pass alone (history present: no amax pass) on x over a sweep of tiles and
    program counts (each program loops over its share of the row tiles); the best becomes the default
    (``TENSORWISE_DELAYED_TILES``, ``TENSORWISE_CAST_PROGRAMS``) for the rest of the run."""
    hist = mx.new_amax_history(16, x.device)[0]
    mx.quantize_tensorwise(x, 1, "e4m3", delayed=mx.DelayedScale(hist, 0, 16, False))  # step 0 fills the ring
    n = x.numel()
    out, best = [], None
    for tiles in [(64, 128, 4), (128, 64, 4), (32, 128, 4), (64, 128, 8), (128, 128, 8)]:
        col_tiles = -(-x.shape[1] // tiles[1])
        row_tiles = -(-x.shape[0] // tiles[0])
        for programs in (1056, 2112, 4224, 8448):
            rs = max(1, min(row_tiles, programs // col_tiles))
            try:
                t = bench(lambda tiles=tiles, rs=rs: mx_triton_tensorwise.quantize_tensorwise(
                    x, True, True, "e4m3", tiles=tiles, history=hist, step=1, window=16, use_history=True,
                    row_step=rs), rep=50)
            except Exception as e:
                print(f"tile {tiles} for the delayed cast failed: {type(e).__name__}: {str(e)[:120]}",
                      file=sys.stderr)
                break
            bw = (x.element_size() * n + 2 * n) / t / 1e9
            out.append(dict(kernel=f"tensorwise delayed both layouts, one pass, tiles {list(tiles)} x {programs} "
                            "programs", ms=t, tbps=bw, pct_copy=100 * bw / copy_bw, tiles=list(tiles)))
            if best is None or t < best[0]:
                best = (t, tiles, programs)
    mx_triton_tensorwise.TENSORWISE_DELAYED_TILES = tuple(best[1])
    mx_triton_tensorwise.TENSORWISE_CAST_PROGRAMS = best[2]
    out.sort(key=lambda r: r["ms"])
    out = out[:4]
    for label, row, col, cs in (("rows, one pass", True, False, False),
                                ("both layouts + column sums (dY in the backward)", True, True, True)):
        t = bench(lambda row=row, col=col, cs=cs: mx_triton_tensorwise.quantize_tensorwise(
            x, row, col, "e5m2", col_sums=cs, history=hist, step=1, window=16, use_history=True), rep=100)
        bw = (x.element_size() * n + (row + col) * n) / t / 1e9
        tiles, programs = ((mx_triton_tensorwise.TENSORWISE_COLSUM_TILES, mx_triton_tensorwise.TENSORWISE_COLSUM_PROGRAMS)
                           if cs else (best[1], best[2]))
        out.append(dict(kernel=f"tensorwise delayed {label} ({programs} programs)", ms=t, tbps=bw,
                        pct_copy=100 * bw / copy_bw, tiles=list(tiles)))
    return out


def time_quantizers(dev: str, sweep: bool, only_tensorwise: bool = False) -> tuple[float, list[dict]]:
    torch.manual_seed(0)
    r, c = 65536, 4096
    x = torch.randn(r, c, device=dev, dtype=torch.bfloat16)
    nbytes_in = x.numel() * 2
    t_copy = bench(lambda: x.clone())
    copy_bw = 2 * nbytes_in / t_copy / 1e9  # TB/s (bytes / ms / 1e9): read + write
    out = time_delayed_casts(x, copy_bw)
    cases = [  # (label, block, e8m0, row, col, column sums)
        ("mx rows (1x32)", 32, True, True, False, False),
        ("mx cols (x^T layout)", 32, True, False, True, False),
        ("mx both layouts", 32, True, True, True, False),
        ("mx both layouts + column sums (dY)", 32, True, True, True, True),
        ("1x128 rows", 128, False, True, False, False),
        ("1x128 cols (x^T layout)", 128, False, False, True, False),
        ("1x128 both layouts", 128, False, True, True, False),
        ("1x128 both layouts + column sums (dY)", 128, False, True, True, True),
    ]
    sweep_tiles = {
        (32, "row"): [(16, 512, 4, 0, 4), (8, 512, 4, 0, 8), (16, 256, 4), (8, 512, 4), (32, 256, 8)],
        (32, "col"): [(32, 128, 1, 0, 4, 1), (32, 128, 2, 0, 4, 1), (32, 128, 1, 0, 8), (32, 128, 2, 128, 8),
                      (32, 128, 4), (32, 256, 4), (32, 64, 4)],
        (32, "both"): [(32, 128, 2, 160, 8), (32, 128, 2), (32, 128, 4), (32, 256, 8), (32, 64, 4), (32, 256, 4)],
        (128, "row"): [(8, 512, 4), (16, 512, 8), (8, 1024, 8)],
        (128, "col"): [(128, 64, 8), (128, 32, 4), (128, 64, 4), (128, 128, 8)],
        (128, "both"): [(128, 128, 4), (128, 128, 8), (128, 128, 16), (128, 128, 8, 128), (128, 128, 8, 112),
                        mx_triton.Interleaved(8), mx_triton.Interleaved(4)],
        (32, "both+sums"): [(32, 128, 1, 0, 8), (32, 128, 2, 160, 8), (32, 128, 2, 0, 8), (32, 128, 2), (32, 128, 1),
                            (32, 128, 4)],
        (128, "both+sums"): [mx_triton.Interleaved(4), mx_triton.Interleaved(8), (128, 128, 4), (128, 128, 8, 128),
                             (128, 128, 4, 0, 2, 1), (128, 128, 8), (128, 128, 8, 112)],
    }
    for label, blk, e8, row, col, sums in ([] if only_tensorwise else cases):
        mode = ("both" if (row and col) else ("row" if row else "col")) + ("+sums" if sums else "")
        outs = (row + col) * (x.numel() + x.numel() // blk * (1 if e8 else 4))  # the sums' few bytes not counted
        best = None
        for tiles in (sweep_tiles[(blk, mode)] if sweep else [mx_triton.TILES[(blk, mode)]]):
            try:
                t = bench(lambda tiles=tiles, a=(blk, e8, row, col), sums=sums: mx_triton.quantize(
                    x, *a, tiles=tiles, col_sums=sums), rep=100)
            except Exception as e:
                print(f"tile {tiles} for {label} failed: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
                continue
            if best is None or t < best[0]:
                best = (t, tiles)
        t, tiles = best
        mx_triton.TILES[(blk, mode)] = tiles
        bw = (nbytes_in + outs) / t / 1e9
        out.append(dict(kernel=label, ms=t, tbps=bw, pct_copy=100 * bw / copy_bw,
                        tiles=repr(tiles) if isinstance(tiles, mx_triton.Interleaved) else list(tiles)))
    for label, row, col in (() if only_tensorwise else
                            (("rowwise rows (2 passes)", True, False), ("rowwise both layouts (2 passes)", True, True))):
        t = bench(lambda row=row, col=col: mx_triton.quantize_rowwise(x, row, col), rep=100)
        bw = (nbytes_in * 2 + (row + col) * x.numel()) / t / 1e9  # x is read twice
        out.append(dict(kernel=label, ms=t, tbps=bw, pct_copy=100 * bw / copy_bw, tiles=[64, 128, 4]))
    best = (None, mx_triton_tensorwise.TENSORWISE_TILES)
    t_amax = bench(lambda: mx_triton_tensorwise.tensorwise_amax(x), rep=100)
    for label, row, col in (("tensorwise rows (amax pass + cast pass)", True, False),
                            ("tensorwise both layouts (amax pass + one cast pass)", True, True)):
        t = bench(lambda row=row, col=col: mx_triton_tensorwise.quantize_tensorwise(x, row, col, "e4m3"), rep=100)
        bw = (nbytes_in * 2 + (row + col) * x.numel()) / t / 1e9  # x is read twice
        out.append(dict(kernel=label, ms=t, tbps=bw, pct_copy=100 * bw / copy_bw, tiles=list(best[1])))
    bw = nbytes_in / t_amax / 1e9
    out.append(dict(kernel="tensorwise amax pass alone (read only)", ms=t_amax, tbps=bw, pct_copy=100 * bw / copy_bw,
                    tiles=list(mx_triton_tensorwise.TENSORWISE_AMAX_TILES)))
    if only_tensorwise:
        return copy_bw, out
    q = mx.mx_quantize(x, 1, backend="triton")
    t = bench(lambda: mx.mx_dequantize(q, torch.bfloat16, backend="triton"), rep=100)
    bw = (x.numel() * (1 + 2) + q.scale.numel()) / t / 1e9
    out.append(dict(kernel="mx dequantize -> bf16", ms=t, tbps=bw, pct_copy=100 * bw / copy_bw,
                    tiles=list(mx_triton.DEQUANT_TILES)))
    w = torch.randn(4096, 1024, device=dev, dtype=torch.bfloat16)
    t = bench(lambda: mx.quantize_128x128(w, backend="triton"), rep=100)
    bw = (w.numel() * (2 + 2)) / t / 1e9
    out.append(dict(kernel="128x128 weight 4096x1024 (+ transposed copy)", ms=t, tbps=bw,
                    pct_copy=100 * bw / copy_bw, tiles=[128, 128, 8]))
    # an 8 MB cast is one wave of programs: its ceiling is a copy of the same tensor, not the 512 MB copy's rate
    t_wcopy = bench(lambda: w.clone(), rep=100)
    bw_w = 2 * w.numel() * 2 / t_wcopy / 1e9
    out.append(dict(kernel="copy of that weight (its size's ceiling; % = the cast's share of it)", ms=t_wcopy,
                    tbps=bw_w, pct_copy=100 * t_wcopy / t, tiles=[]))
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


def layer_inputs(dev: str, m: int, k: int, n: int, bias: bool = True):
    torch.manual_seed(0)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    return x, dy, nn.Linear(k, n, bias=bias, device=dev, dtype=torch.bfloat16)


def fwd_bwd(mod: nn.Module, x: torch.Tensor, dy: torch.Tensor, base: nn.Linear, backward: bool = True):
    def f():
        x.grad = None
        base.weight.grad = None
        if base.bias is not None:
            base.bias.grad = None
        y = mod(x)
        if backward:
            y.backward(dy)
        fp8_step()  # the optimizer step of a training loop: delayed scaling moves to the next step
    return f


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="interaction shapes only")
    ap.add_argument("--mlp-only", action="store_true", help="the two large MLP shapes only")
    ap.add_argument("--sweep", action="store_true", help="try several tile shapes per quantizer")
    ap.add_argument("--profile", action="store_true",
                    help="first: amax sweep, kernel tables and ablations of the tensorwise layer")
    ap.add_argument("--only", default=None, help="comma-separated variant label prefixes, e.g. tensorwise")
    ap.add_argument("--json", default=None)
    ap.add_argument("--rounds", type=int, default=1,
                    help="time bf16 and the variants in turn this many times (medians; per-round ratio range)")
    ap.add_argument("--crossover", action="store_true",
                    help="only the tensorwise layer against bf16 nn.Linear on sizes between the interaction and MLP shapes")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/fp8_linear.py times FP8 GEMMs and casts on the GPU: run it on a CUDA machine")
    if args.crossover:
        print("| shape | variant | ms | TFLOP/s | ratio | tokens x in x out |\n|---|---|---|---|---|---|")
        for r in time_linears("cuda", CROSSOVER_SHAPES, CROSSOVER_VARIANTS):
            m, k, n = (int(t) for t in r["shape"].split()[1].replace("->", "x").split("x"))
            print(f"| {r['shape']} | {r['variant']} | {r['ms']:.3f} | {r['tflops']:.0f} | {r['ratio']:.2f}x | "
                  f"{m * k * n:.1e} |{' ' + r['error'] if 'error' in r else ''}", flush=True)
        return
    prefixes = tuple(p.strip() for p in args.only.split(",")) if args.only else None
    variants = [v for v in VARIANTS if v[0].startswith(prefixes)] if prefixes else VARIANTS
    only_tw = prefixes is not None and all(p.startswith("tensorwise") for p in prefixes)
    dev = "cuda"
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    prof = None
    copy_bw, quant = time_quantizers(dev, args.sweep, only_tw)  # first: the rest uses the best tiles it finds
    if args.profile:
        from benchmarks.fp8_profile import print_profile, profile_tensorwise, sweep_amax

        try:
            amax = sweep_amax(dev) if args.sweep else []
            prof = profile_tensorwise(dev, brief=prefixes is not None)
            print_profile(prof, amax)
            if args.json:
                with open(args.json + ".profile.json", "w") as f:
                    json.dump(dict(amax=amax, **prof), f, indent=1)
        except Exception as e:  # report and go on: the recipe table below must still run
            import traceback

            traceback.print_exc()
            print(f"\n## profile FAILED: {type(e).__name__}: {str(e)[:300]}")
        sys.stdout.flush()
    checks = check_quantizers(dev, only_tw) + check_linears(dev, variants)
    shapes = LINEAR_SHAPES[2:] if args.quick else (LINEAR_SHAPES[:2] if args.mlp_only else LINEAR_SHAPES)
    gemms = [] if prefixes else time_gemms(dev)  # --only: the layer table alone
    lin = time_linears(dev, shapes, variants, args.rounds)
    print("tiles used:", mx_triton.TILES, "tensorwise:", mx_triton_tensorwise.TENSORWISE_TILES, "amax:",
          mx_triton_tensorwise.TENSORWISE_AMAX_TILES, mx_triton_tensorwise.TENSORWISE_AMAX_PROGRAMS, "delayed cast:",
          mx_triton_tensorwise.TENSORWISE_DELAYED_TILES, mx_triton_tensorwise.TENSORWISE_CAST_PROGRAMS)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(checks=checks, linears=lin, copy_tbps=copy_bw, quantizers=quant, gemms=gemms), f, indent=1)

    print("\n## checks")
    for k, v in checks:
        print(f"| {k} | {v} |")
    print("\n## forward+backward, bf16 inputs/weights (ratio = bf16 nn.Linear time / variant time)")
    print(f"| shape | variant | ms | TFLOP/s | ratio | per-round ratios ({args.rounds} rounds) |")
    print("|---|---|---|---|---|---|")
    for r in lin:
        extra = f" {r['error']}" if "error" in r else ""
        spread = (f"{min(r['ratios']):.2f}-{max(r['ratios']):.2f}x" if r.get("ratios") else "")
        print(f"| {r['shape']} | {r['variant']} | {r['ms']:.3f} | {r['tflops']:.0f} | {r['ratio']:.2f}x{extra} | "
              f"{spread} |")
    by_variant: dict[str, list[float]] = {}
    for r in lin:
        if r["shape"].startswith("mlp"):
            by_variant.setdefault(r["variant"], []).append(r["ms"])
    if by_variant:
        ref = sum(by_variant["bf16 nn.Linear"])
        print("\n| MLP 1024->4096->1024 (both linears) | ms | ratio |\n|---|---|---|")
        for v, ts in by_variant.items():
            print(f"| {v} | {sum(ts):.3f} | {ref / sum(ts):.2f}x |")
        print("\n" + mlp_target_line(lin))
    print("\n## GEMMs alone, mlp up 65536x1024->4096 (operands quantized beforehand): ms (TFLOP/s)")
    print("| recipe | output | input gradient | weight gradient | sum | sum vs bf16 |\n|---|---|---|---|---|---|")
    ref_sum = gemms[0]["fwd"] + gemms[0]["dgrad"] + gemms[0]["wgrad"] if gemms else 1.0
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
