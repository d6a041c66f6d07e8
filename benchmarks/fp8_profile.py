"""The ``--profile`` section of benchmarks/fp8_linear.py: where a tensorwise FP8 linear step spends its time.

A sweep of the tensorwise amax pass's tiles and program count; torch.profiler kernel tables (per step) of one
fwd+bwd step of bf16 ``nn.Linear`` and of the tensorwise layer (current and delayed scaling) on
65536x1024->4096, with each step's wall time, GPU busy time and idle gap; ablations of the tensorwise step,
each against bf16 in the same run; host time per call of the step's pieces on tiny operands, and a cProfile of
the tiny delayed step by Python function. Run through ``python benchmarks/fp8_linear.py --profile``.
"""

from __future__ import annotations

import sys
import time

import torch
import triton
from torch import nn

from benchmarks.fp8_linear import bench, fwd_bwd, layer_inputs
from kernels import mx, mx_triton_tensorwise
from kernels.fp8_linear import Fp8Config, Fp8Linear


def sweep_amax(dev: str) -> list[dict]:
    """Tiles x program count of the tensorwise amax pass on dY-sized 65536x4096 bf16 (read-only bytes / time);
    the best becomes the default for the rest of this run."""
    torch.manual_seed(0)
    x = torch.randn(65536, 4096, device=dev, dtype=torch.bfloat16)
    t_copy = bench(lambda: x.clone())
    copy_bw = 2 * x.numel() * 2 / t_copy / 1e9
    out = []
    for tiles in [(64, 256, 8), (32, 256, 4), (16, 512, 4), (64, 128, 4), (128, 128, 8), (32, 512, 8)]:
        col_tiles = triton.cdiv(x.shape[1], tiles[1])
        for programs in (528, 1024, 2112):
            row_step = max(1, min(triton.cdiv(x.shape[0], tiles[0]), programs // col_tiles))
            try:
                t = bench(lambda tiles=tiles, rs=row_step: mx_triton_tensorwise.tensorwise_amax(x, tiles, rs), rep=50)
                tc = bench(lambda tiles=tiles, rs=row_step: mx_triton_tensorwise.tensorwise_amax(x, tiles, rs, col_sums=True),
                           rep=50)
            except Exception as e:
                print(f"amax tiles {tiles} x {programs}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
                continue
            bw = x.numel() * 2 / t / 1e9
            out.append(dict(tiles=list(tiles), programs=programs, ms=t, ms_colsum=tc, tbps=bw,
                            pct_copy=100 * bw / copy_bw))
    best = min(out, key=lambda r: r["ms_colsum"])  # the backward uses the column-sum variant
    mx_triton_tensorwise.TENSORWISE_AMAX_TILES = tuple(best["tiles"])
    mx_triton_tensorwise.TENSORWISE_AMAX_PROGRAMS = best["programs"]
    return out


def _kernel_profile(f, steps: int) -> dict:
    """One warm step profiled ``steps`` times: kernel table per step, wall / GPU busy / idle per step, and the
    host's runtime calls that wait for the device."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        f()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(steps):
        f()
    e1.record()
    torch.cuda.synchronize()
    wall = e0.elapsed_time(e1) / steps
    h0 = time.perf_counter()
    for _ in range(steps):
        f()
    host = (time.perf_counter() - h0) * 1e3 / steps
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            f()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    spans, waits = [], {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            kernels.setdefault(e.name, []).append(e.time_range.elapsed_us())
            spans.append((e.time_range.start, e.time_range.end))
        elif any(w in e.name for w in ("Synchronize", "cudaMemcpy", "cudaMalloc", "cudaFree")):
            waits[e.name] = waits.get(e.name, 0) + 1
    spans.sort()
    busy, end = 0.0, -1.0
    for a, b in spans:  # union of the kernel intervals
        if b > end:
            busy += b - max(a, end)
            end = b
    rows = sorted(((name, sum(v) / steps / 1e3, len(v) / steps) for name, v in kernels.items()),
                  key=lambda r: -r[1])
    first = min(a for a, _ in spans) if spans else 0.0
    # where the host's time goes (the tensorwise step's host enqueue time is about its GPU time)
    host_ops = sorted((e for e in prof.key_averages() if e.self_cpu_time_total > 0),
                      key=lambda e: -e.self_cpu_time_total)[:10]
    return dict(wall_ms=wall, host_ms=host, busy_ms=busy / steps / 1e3, span_ms=(end - first) / steps / 1e3,
                kernel_ms=sum(r[1] for r in rows), launches=sum(r[2] for r in rows),
                top=[dict(kernel=nm, ms=ms, calls=c) for nm, ms, c in rows[:15]],
                host_waits={k: v / steps for k, v in waits.items()},
                host_top=[dict(op=e.key, self_cpu_ms=e.self_cpu_time_total / steps / 1e3, calls=e.count / steps)
                          for e in host_ops])


def profile_tensorwise(dev: str, m: int = 65536, k: int = 1024, n: int = 4096, steps: int = 10,
                       brief: bool = False) -> dict:
    """Kernel tables of bf16 nn.Linear and the tensorwise layer (and the fastest recipe for reference), then
    ablations of the tensorwise step timed against bf16 in the same run."""
    from kernels import fp8_linear

    x, dy, base = layer_inputs(dev, m, k, n)
    tw = Fp8Linear.from_linear(base, Fp8Config(recipe="tensorwise"))
    twd = Fp8Linear.from_linear(base, Fp8Config(recipe="tensorwise", scaling="delayed"))
    profs = {"bf16 nn.Linear": _kernel_profile(fwd_bwd(base, x, dy, base), steps),
             "tensorwise (dY e5m2)": _kernel_profile(fwd_bwd(tw, x, dy, base), steps),
             "tensorwise delayed (dY e5m2)": _kernel_profile(fwd_bwd(twd, x, dy, base), steps)}
    if brief:  # bf16 against tensorwise current and delayed only
        t_ref = bench(fwd_bwd(base, x, dy, base))
        abl = [dict(variant="bf16 nn.Linear fwd+bwd", ms=t_ref, ratio=1.0)]
        for label, mod in (("tensorwise fwd+bwd", tw), ("tensorwise delayed fwd+bwd", twd)):
            t = bench(fwd_bwd(mod, x, dy, base))
            abl.append(dict(variant=label, ms=t, ratio=t_ref / t))
        return dict(profiles=profs, ablations=abl, host=host_costs(dev))
    fp8_linear.FUSED_BIAS_GRAD.discard("tensorwise")
    try:
        profs["tensorwise, db as a separate sum"] = _kernel_profile(fwd_bwd(tw, x, dy, base), steps)
    finally:
        fp8_linear.FUSED_BIAS_GRAD.add("tensorwise")
    bw = Fp8Linear.from_linear(base, Fp8Config(recipe="blockwise", wgrad="bf16"))
    profs["blockwise wgrad=bf16"] = _kernel_profile(fwd_bwd(bw, x, dy, base), steps)

    abl = []
    t_ref = bench(fwd_bwd(base, x, dy, base))

    def add(label: str, t: float, ref: float = t_ref) -> None:
        abl.append(dict(variant=label, ms=t, ratio=ref / t))

    add("bf16 nn.Linear fwd+bwd", t_ref)
    add("tensorwise fwd+bwd", bench(fwd_bwd(tw, x, dy, base)))
    add("tensorwise delayed fwd+bwd", bench(fwd_bwd(twd, x, dy, base)))
    fp8_linear.FUSED_BIAS_GRAD.discard("tensorwise")
    try:
        add("tensorwise fwd+bwd, db as a separate sum (before)", bench(fwd_bwd(tw, x, dy, base)))
    finally:
        fp8_linear.FUSED_BIAS_GRAD.add("tensorwise")
    key = "tensorwise/torch.bfloat16"
    saved = fp8_linear._BIAS_FUSION.get(key)
    fp8_linear._BIAS_FUSION[key] = False
    try:
        add("tensorwise fwd+bwd, bias added after the GEMM (no epilogue)", bench(fwd_bwd(tw, x, dy, base)))
    finally:
        if saved is None:
            fp8_linear._BIAS_FUSION.pop(key, None)
        else:
            fp8_linear._BIAS_FUSION[key] = saved
    add("tensorwise wgrad=bf16 fwd+bwd", bench(fwd_bwd(Fp8Linear.from_linear(base, Fp8Config(
        recipe="tensorwise", wgrad="bf16")), x, dy, base)))
    t_fwd = bench(fwd_bwd(base, x, dy, base, backward=False))
    add("bf16 nn.Linear fwd only", t_fwd, t_fwd)
    add("tensorwise fwd only (both layouts of x kept)", bench(fwd_bwd(tw, x, dy, base, backward=False)), t_fwd)
    add("tensorwise delayed fwd only", bench(fwd_bwd(twd, x, dy, base, backward=False)), t_fwd)
    x2, dy2, base2 = layer_inputs(dev, m, k, n, bias=False)
    t_nb = bench(fwd_bwd(base2, x2, dy2, base2))
    add("bf16 nn.Linear fwd+bwd, no bias", t_nb, t_nb)
    add("tensorwise fwd+bwd, no bias", bench(fwd_bwd(Fp8Linear.from_linear(base2, Fp8Config(recipe="tensorwise")),
                                                     x2, dy2, base2)), t_nb)
    add("tensorwise delayed fwd+bwd, no bias", bench(fwd_bwd(Fp8Linear.from_linear(base2, Fp8Config(
        recipe="tensorwise", scaling="delayed")), x2, dy2, base2)), t_nb)
    return dict(profiles=profs, ablations=abl, host=host_costs(dev))


def host_costs(dev: str, calls: int = 300) -> list[dict]:
    """Host time per call of the pieces of a tensorwise step, on tiny operands (256 x 256 -> 256) so the GPU
    never holds the host back: wall time over ``calls`` back-to-back calls, then one sync."""
    from kernels.fp8_linear import _Plan

    torch.manual_seed(0)
    x = torch.randn(256, 256, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(256, 256, device=dev, dtype=torch.bfloat16)
    base = nn.Linear(256, 256, device=dev, dtype=torch.bfloat16)
    xd = x.detach()
    hist = mx.new_amax_history(16, dev)[0]
    mx.quantize_tensorwise(xd, 1, delayed=mx.DelayedScale(hist, 0, 16, False))
    d1 = mx.DelayedScale(hist, 1, 16, True)
    qa, qb = mx.quantize_tensorwise_both(xd)
    bias = base.bias.detach()
    plan = _Plan.make(Fp8Config(recipe="tensorwise"), xd, "host_costs")
    cases = [
        ("torch.empty (one allocation)", lambda: torch.empty(256, 256, device=dev)),
        ("torch.zeros(1) (allocation + fill launch)", lambda: torch.zeros(1, dtype=torch.int32, device=dev)),
        ("tensorwise amax pass (zero fill + Triton launch)", lambda: mx_triton_tensorwise.tensorwise_amax(xd)),
        ("tensorwise quantize, both layouts, current (zero fill, amax, cast)", lambda: mx.quantize_tensorwise_both(xd)),
        ("tensorwise quantize, both layouts, delayed (one cast launch)",
         lambda: mx.quantize_tensorwise_both(xd, delayed=d1)),
        ("torch._scaled_mm tensorwise, bias epilogue", lambda: plan.gemm(qa, qb, torch.bfloat16, bias=bias,
                                                                          fast_accum=True)),
        ("torch._scaled_mm tensorwise, no bias", lambda: plan.gemm(qa, qb, torch.bfloat16)),
        ("bf16 nn.Linear fwd+bwd", fwd_bwd(base, x, dy, base)),
        ("tensorwise Fp8Linear fwd+bwd", fwd_bwd(Fp8Linear.from_linear(base, Fp8Config(recipe="tensorwise")),
                                                  x, dy, base)),
        ("tensorwise delayed Fp8Linear fwd+bwd", fwd_bwd(Fp8Linear.from_linear(base, Fp8Config(
            recipe="tensorwise", scaling="delayed")), x, dy, base)),
    ]
    out = []
    for label, f in cases:
        for _ in range(20):
            f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        host = (time.perf_counter() - t0) * 1e6 / calls
        torch.cuda.synchronize()
        out.append(dict(op=label, host_us=host))
    import cProfile
    import pstats

    f = cases[-1][1]  # the delayed layer step: where its host time goes, by Python function
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        f()
    pr.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(pr).stats
    top = sorted(st.items(), key=lambda kv: -kv[1][2])[:18]
    for (fn, line, name), (_, ncalls, tottime, cumtime, _) in top:
        out.append(dict(op=f"cProfile self: {fn.split('/')[-1]}:{line}({name}) x{ncalls / 200:g}",
                        host_us=tottime * 1e6 / 200, cum_us=cumtime * 1e6 / 200))
    return out


def print_profile(res: dict, amax: list[dict]) -> None:
    if amax:
        _print_amax(amax)
    _print_profile(res)


def _print_amax(amax: list[dict]) -> None:
    print("\n## tensorwise amax pass on 65536x4096 bf16 (tiles x programs; read-only TB/s; best first)")
    print("| tiles (rows, cols, warps) | programs | ms | ms with column sums | TB/s | % of copy |\n|---|---|---|---|---|---|")
    for r in sorted(amax, key=lambda r: r["ms_colsum"])[:6]:
        print(f"| {r['tiles']} | {r['programs']} | {r['ms']:.3f} | {r['ms_colsum']:.3f} | {r['tbps']:.2f} | "
              f"{r['pct_copy']:.0f}% |")


def _print_profile(res: dict) -> None:
    print("\n## profile, one fwd+bwd step of 65536x1024->4096 (per step; wall = CUDA events over back-to-back steps)")
    print("| variant | wall ms | GPU busy ms | idle ms | kernel sum ms | launches | host enqueue ms | host waits |")
    print("|---|---|---|---|---|---|---|---|")
    for name, p in res["profiles"].items():
        waits = ", ".join(f"{k} {v:g}" for k, v in p["host_waits"].items()) or "none"
        print(f"| {name} | {p['wall_ms']:.3f} | {p['busy_ms']:.3f} | {p['wall_ms'] - p['busy_ms']:.3f} | "
              f"{p['kernel_ms']:.3f} | {p['launches']:g} | {p['host_ms']:.3f} | {waits} |")
    for name in ("bf16 nn.Linear", "tensorwise (dY e5m2)", "tensorwise delayed (dY e5m2)"):
        print(f"\n### top kernels by CUDA time: {name}\n| kernel | ms/step | calls/step |\n|---|---|---|")
        for r in res["profiles"][name]["top"]:
            print(f"| {r['kernel'][:90]} | {r['ms']:.3f} | {r['calls']:g} |")
    for name in ("bf16 nn.Linear", "tensorwise (dY e5m2)", "tensorwise delayed (dY e5m2)"):
        print(f"\n### top host (CPU) ops by self time under the profiler: {name}\n| op | ms/step | calls/step |\n"
              "|---|---|---|")
        for r in res["profiles"][name].get("host_top", []):
            print(f"| {r['op'][:90]} | {r['self_cpu_ms']:.3f} | {r['calls']:g} |")
    print("\n## host time per call, tiny operands (256x256 -> 256; the GPU never waits for the host to be ahead)")
    print("| op | host us/call (cProfile rows: self us/step, cumulative) |\n|---|---|")
    for r in res.get("host", []):
        cum = f" (cum {r['cum_us']:.1f})" if "cum_us" in r else ""
        print(f"| {r['op'][:110]} | {r['host_us']:.1f}{cum} |")
    print("\n## tensorwise ablations (do_bench medians; ratio = bf16 time of the same kind / variant)")
    print("| variant | ms | ratio |\n|---|---|---|")
    for r in res["ablations"]:
        print(f"| {r['variant']} | {r['ms']:.3f} | {r['ratio']:.2f}x |")
