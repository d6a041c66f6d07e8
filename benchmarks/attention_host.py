"""Host time and tile choices of the jagged attention ops on the GPU (short batches are bound by host time).

    python benchmarks/attention_host.py pieces B       # host ms per call of each piece: work list, delta pass,
                                                       # each op through the dispatcher and as its body, autograd
    python benchmarks/attention_host.py launch B       # one forward-kernel launch: autotuner vs bare JIT function
    python benchmarks/attention_host.py tiles B        # D=64 tiles of the generic kernels: GPU ms per kernel
    python benchmarks/attention_host.py tiles A64      # ... on batch A's lengths at H=8, D=64
    python benchmarks/attention_host.py fwdconfigs     # forward configurations on batch A, non-causal and causal
    python benchmarks/attention_host.py dqconfigs      # dq-pass configurations on batch A (causal, GPU ms)
    python benchmarks/attention_host.py fusedfull A    # full attention through the window op's fused backward
    python benchmarks/attention_host.py context B [unbound]  # descriptor launches on autograd's thread
    python benchmarks/attention_host.py launchcheck B  # the direct launch path (kernels.triton_launch) against
                                                       # fn[grid]: specializations, and attention bit for bit
    python benchmarks/attention_host.py launchab B     # host us per call, direct launches on and off, alternating
    python benchmarks/attention_host.py hostprofile B  # cProfile of forward+backward calls: host us per call
                                                       # by function (self-attention and cross attention)

Host time is the wall time of back-to-back calls before the final synchronize (the GPU keeps up, so it is the
host's). GPU times are torch.profiler device times per call. Run with GEMTRAIN_ATTN_AUTOTUNE=0.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: `benchmarks` importable
from benchmarks.attention import BATCHES, cuda_time, lengths, offsets_of  # noqa: E402
from benchmarks.attention_configs import pinned  # noqa: E402
from benchmarks.attention_launch import per_call_us  # noqa: E402
from kernels import attention_op as aop  # noqa: E402
from kernels import attention_window_op as wop  # noqa: E402
from kernels import jagged_attention  # noqa: E402
from kernels.attention_triton_common import descriptor  # noqa: E402
from kernels.attention_triton_fwd import jagged_attn_fwd_kernel  # noqa: E402

SHAPES = {**BATCHES, "A64": (64, 4096, 8, 64)}


def device_ms(fn: Callable[[], object], n: int = 10) -> tuple[float, dict[str, float]]:
    """GPU ms per call (all kernels) and per kernel name."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    parts = {e.key[:32]: e.self_device_time_total / n / 1e3 for e in p.key_averages() if e.self_device_time_total > 0}
    return sum(parts.values()), parts


def _batch(name: str, grad: bool = False):
    B, max_len, H, D = SHAPES[name]
    lens = lengths(B, max_len)
    offs = offsets_of(lens)
    T = int(lens.sum())
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    if grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    return offs, T, max_len, q, k, v, do


def _cross_queries(offs: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cross attention's side of a batch: 16 query tokens per row (offsets, queries with grad, their dO)."""
    B = offs.numel() - 1
    qc = torch.randn(16 * B, q.shape[1], q.shape[2], device="cuda", dtype=q.dtype, requires_grad=True)
    return offsets_of(torch.full((B,), 16, dtype=torch.int64)), qc, torch.randn_like(qc)


def _generic_args(q, k, offs, T, max_len, causal: bool = True):
    len_key = aop._len_key(offs, q, k, None, max_len)
    tile = aop._plan(q, k, len_key, 0, 0)["tile_q"]
    work = aop.work_list(offs, offs, tile, T)[0]
    return (offs, offs, None, None, None, None, None, "softmax", causal, 1 / math.sqrt(q.shape[2]), 0, -1, 0,
            len_key, 0, work), tile, work


def pieces(name: str = "B") -> list[str]:
    offs, T, max_len, q, k, v, do = _batch(name)
    gargs, tile, work = _generic_args(q, k, offs, T, max_len)
    out, lse = torch.ops.gemtrain.jagged_attn_fwd(q, k, v, *gargs)
    wwork = wop.window_work(offs, T, wop.TILE)
    wargs = (offs, None, None, None, None, None, "softmax", True, 1 / math.sqrt(q.shape[2]), max_len, 0, wwork)
    body = aop._BODIES
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def fb(window=None):
        for p in (qg, kg, vg):
            p.grad = None
        jagged_attention(qg, kg, vg, offs, offs, causal=True, max_kv_len=max_len, window=window).backward(do)

    def fwd_only():
        with torch.no_grad():
            jagged_attention(q, k, v, offs, offs, causal=True, max_kv_len=max_len)

    class Identity(torch.autograd.Function):  # the autograd engine's own cost per forward+backward
        forward = staticmethod(lambda ctx, x: x.view_as(x))
        backward = staticmethod(lambda ctx, g: g)

    def identity_fb():
        qg.grad = None
        Identity.apply(qg).backward(do)

    def fwd_grad():
        jagged_attention(qg, kg, vg, offs, offs, causal=True, max_kv_len=max_len)

    rows = {
        "autograd floor: identity Function forward+backward": identity_fb,
        "jagged_attention forward recorded for autograd (no backward)": fwd_grad,
        "work list (one launch)": lambda: aop.work_list(offs, offs, tile, T),
        "softmax delta pass": lambda: aop.softmax_delta(out, do, offs, work, tile),
        "generic forward op, through the dispatcher": lambda: torch.ops.gemtrain.jagged_attn_fwd(q, k, v, *gargs),
        "generic forward op body": lambda: body["jagged_attn_fwd"](q, k, v, *gargs),
        "generic backward op, through the dispatcher": lambda: torch.ops.gemtrain.jagged_attn_bwd(
            do, q, k, v, out, lse, *gargs),
        "generic backward op body": lambda: body["jagged_attn_bwd"](do, q, k, v, out, lse, *gargs),
        "window forward op (W = max_len), through the dispatcher": lambda: torch.ops.gemtrain.window_attn_fwd(
            q, k, v, *wargs),
        "window backward op, through the dispatcher": lambda: torch.ops.gemtrain.window_attn_bwd(
            do, q, k, v, out, lse, *wargs),
        "jagged_attention forward (no grad)": fwd_only,
        "jagged_attention forward+backward": fb,
        "jagged_attention forward+backward, window = max_len": lambda: fb(max_len),
    }
    lines = [f"### Host ms per call, batch {name}", "", "| piece | host ms |", "|---|---|"]
    for label, fn in rows.items():
        lines.append(f"| {label} | {per_call_us(fn, 40) / 1e3:.3f} |")
        print(lines[-1], flush=True)
    return lines


def launch(name: str = "B") -> list[str]:
    """One forward-kernel launch over the first 4 rows (tiny GPU work): through the autotuner as the op launched
    it before ``common.launch``, and the bare JIT function with the configuration the autotuner chose."""
    offs, T, max_len, q, k, v, _ = _batch(name)
    offs = offs[:5].contiguous()
    T = int(offs[-1])
    q, k, v = q[:T].contiguous(), k[:T].contiguous(), v[:T].contiguous()
    len_key = aop._len_key(offs, q, k, None, max_len)
    plan = aop._plan(q, k, len_key, 0, 0, v)
    work = aop.work_list(offs, offs, plan["tile_q"], T)[0]
    out, lse = torch.empty_like(q), torch.empty(q.shape[:2], device="cuda")
    meta = dict(BLOCK_M=plan["tile_q"], **aop._meta(q, "softmax", True, 0, -1, 0, None, None, None, plan))
    grid = (work.shape[0] * q.shape[1],)
    kd, vd = descriptor(k, plan["tma"]), descriptor(v, plan["tma"])
    args = (q, k, v, kd, vd, out, lse, offs, offs, offs, work, lse, lse, offs, offs, 1 / math.sqrt(q.shape[2]),
            1.0, 0, len_key)
    autotuned = lambda: jagged_attn_fwd_kernel[grid](*args, **meta)
    autotuned()
    cfg = jagged_attn_fwd_kernel.best_config
    extra = dict(cfg.all_kwargs(), POS_PAD=1, TIME_PAD=1)
    if plan["tma"]:
        for d in (kd, vd):
            d.block_shape = [extra["BLOCK_N"], meta["BLOCK_D"]]
    jit = jagged_attn_fwd_kernel.fn.fn
    bare = lambda: jit[grid](*args, **meta, **extra)
    compiled = jit.run(*args, grid=grid, warmup=False, **meta, **extra)
    named = {**dict(zip(jit.arg_names, args)), **meta, **extra}
    ordered = [named[n] for n in jit.arg_names]
    runner = compiled[(*grid, 1, 1)[:3]]
    direct = lambda: runner(*ordered)
    lines = [f"### One forward-kernel launch, batch {name} shapes (descriptors {plan['tma']})", "",
             "| launch | host us |", "|---|---|"]
    for label, fn in (("through the autotuner and heuristics", autotuned), ("bare JIT function", bare),
                      ("compiled kernel, arguments in order", direct)):
        lines.append(f"| {label} | {per_call_us(fn):.1f} |")
        print(lines[-1], flush=True)
    return lines


TILE_CHOICES = {
    "128-row tiles (before)": {"fwd": (128, 64, 8, 3), "dkdv": (128, 32, 4, 2), "dq": (128, 64, 4, 2)},
    "64-row tiles, 64-wide inner": {"fwd": (64, 64, 4, 3), "dkdv": (64, 64, 4, 2), "dq": (64, 64, 4, 2)},
    "64-row tiles, 32-wide inner": {"fwd": (64, 32, 4, 3), "dkdv": (64, 32, 4, 2), "dq": (64, 32, 4, 2)},
}


def tiles(name: str = "B") -> list[str]:
    offs, T, max_len, q, k, v, do = _batch(name, grad=True)
    lines = [f"### Generic kernels at D={q.shape[2]}, batch {name}: GPU ms per call (profiler)", "",
             "| mask | tiles (outer, inner, warps, stages) | fwd | fwd+bwd | dk/dv | dq |", "|---|---|---|---|---|---|"]
    for causal in (True, False):
        def fb(causal=causal):
            for p in (q, k, v):
                p.grad = None
            jagged_attention(q, k, v, offs, offs, causal=causal, max_kv_len=max_len).backward(do)

        def f(causal=causal):
            with torch.no_grad():
                jagged_attention(q, k, v, offs, offs, causal=causal, max_kv_len=max_len)

        for label, choice in TILE_CHOICES.items():
            with pinned(choice, "1"):
                tf, _ = device_ms(f)
                tfb, parts = device_ms(fb)
            get = lambda key, parts=parts: next((ms for kname, ms in parts.items() if key in kname), float("nan"))
            lines.append(f"| {'causal' if causal else 'full'} | {label} | {tf:.3f} | {tfb:.3f} | "
                         f"{get('dkdv'):.3f} | {get('bwd_dq'):.3f} |")
            print(lines[-1], flush=True)
    return lines


FWD_CONFIGS = [(64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2),
               (64, 128, 4, 3), (128, 64, 4, 3), (64, 64, 4, 4)]


def fwdconfigs() -> list[str]:
    offs, T, max_len, q, k, v, _ = _batch("A")
    lines = ["### Forward configurations, batch A (ms, 5 back-to-back calls per timing)", "",
             "| mask | (outer, inner, warps, stages) | fwd ms |", "|---|---|---|"]
    for causal in (False, True):
        for cfg in FWD_CONFIGS:
            with pinned({"fwd": cfg}, "1"), torch.no_grad():
                t = cuda_time(lambda c=causal: jagged_attention(q, k, v, offs, offs, causal=c, max_kv_len=max_len),
                              reps=20, calls=5)
            lines.append(f"| {'causal' if causal else 'full'} | {cfg} | {t:.3f} |")
            print(lines[-1], flush=True)
    return lines


DQ_CONFIGS = [(64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 8, 2), (128, 64, 8, 3)]


def dqconfigs() -> list[str]:
    """The backward's dq pass at several (outer, inner, warps, stages) on batch A, causal: GPU ms per kernel
    (profiler) and gradients against the shipped configuration's."""
    offs, T, max_len, q, k, v, do = _batch("A", grad=True)
    lines = ["### dq-pass configurations, batch A causal (GPU ms per call, profiler)", "",
             "| dq (outer, inner, warps, stages) | fwd+bwd | dq | dk/dv | dq max diff vs shipped |",
             "|---|---|---|---|---|"]

    def fb():
        for p in (q, k, v):
            p.grad = None
        jagged_attention(q, k, v, offs, offs, causal=True, max_kv_len=max_len).backward(do)

    shipped = None
    for cfg in DQ_CONFIGS:
        with pinned({"dq": cfg}, "auto"):
            fb()
            dq = q.grad.clone()
            total, parts = device_ms(fb)
        shipped = dq if shipped is None else shipped
        get = lambda key, parts=parts: next((ms for kname, ms in parts.items() if key in kname), float("nan"))
        lines.append(f"| {cfg} | {total:.3f} | {get('bwd_dq'):.3f} | {get('dkdv'):.3f} | "
                     f"{(dq.float() - shipped.float()).abs().max().item():.1e} |")
        print(lines[-1], flush=True)
    return lines


def fusedfull(name: str = "A") -> list[str]:
    """Full self-attention as a window of the longest row through the window op, whose fused backward stores
    each pair's score gradients and computes dq from them (5 tile matmuls per pair instead of 7), against the
    generic backward (its slot limit lifted for the run)."""
    offs, T, max_len, q, k, v, do = _batch(name)
    lines = [f"### Full attention through the fused (stored dS) backward, batch {name}", "",
             "| mask | dS scratch GB | bwd ms generic | bwd ms fused | generic kernels (ms) | fused kernels (ms) |",
             "|---|---|---|---|---|---|"]
    saved = wop.MAX_FUSED_SLOTS
    wop.MAX_FUSED_SLOTS = 1 << 20
    try:
        for causal in (True, False):
            gargs, _, _ = _generic_args(q, k, offs, T, max_len, causal)
            out, lse = torch.ops.gemtrain.jagged_attn_fwd(q, k, v, *gargs)
            wwork = wop.window_work(offs, T, wop.TILE)
            wargs = (offs, None, None, None, None, None, "softmax", causal, 1 / math.sqrt(q.shape[2]), max_len, 0,
                     wwork)
            gen = lambda out=out, lse=lse, a=gargs: torch.ops.gemtrain.jagged_attn_bwd(do, q, k, v, out, lse, *a)
            fused = lambda out=out, lse=lse, a=wargs: torch.ops.gemtrain.window_attn_bwd(do, q, k, v, out, lse, *a)
            for a, b in zip(fused()[:3], gen()[:3]):
                torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
            slots, _ = wop.fused_slots(max_len, causal, wop.TILE)
            gb = q.shape[1] * slots * wwork.shape[0] * wop.TILE ** 2 * q.element_size() / 1e9
            fmt = lambda parts: ", ".join(f"{key}: {ms:.3f}" for key, ms in parts.items())
            lines.append(f"| {'causal' if causal else 'full'} | {gb:.2f} | {cuda_time(gen, reps=20, calls=3):.3f} | "
                         f"{cuda_time(fused, reps=20, calls=3):.3f} | {fmt(device_ms(gen)[1])} | "
                         f"{fmt(device_ms(fused)[1])} |")
            print(lines[-1], flush=True)
            torch.cuda.empty_cache()
    finally:
        wop.MAX_FUSED_SLOTS = saved
    return lines


def context(name: str = "B", bind: str = "bind") -> list[str]:
    """Descriptor launches on autograd's device thread (run in a fresh process): the backward's kernels
    compiled by raw op calls on the main thread, then the first ``backward()``, descriptors forced on.
    ``unbound`` skips ``bind_context`` (the launch then fails with "invalid device context")."""
    from kernels import attention_triton_common as common

    common.TMA = "1"
    if bind == "unbound":
        common.bind_context = lambda device: None
    offs, T, max_len, q, k, v, do = _batch(name, grad=True)
    gargs, _, _ = _generic_args(q, k, offs, T, max_len)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out, lse = torch.ops.gemtrain.jagged_attn_fwd(qd, kd, vd, *gargs)
    torch.ops.gemtrain.jagged_attn_bwd(do, qd, kd, vd, out, lse, *gargs)
    torch.cuda.synchronize()
    try:
        jagged_attention(q, k, v, offs, offs, causal=True, max_kv_len=max_len).backward(do)
        torch.cuda.synchronize()
        result = "ok"
    except RuntimeError as e:
        result = f"failed: {str(e).splitlines()[0]}"
    return [f"| batch {name}, {bind} | first autograd backward with descriptors: {result} |"]


def hostprofile(name: str = "B", calls: str = "200") -> list[str]:
    """Where a forward+backward's host time goes: cProfile over back-to-back ``jagged_attention`` calls
    (causal self-attention, and cross attention of 16 queries per row), us per call by function."""
    import cProfile
    import pstats

    offs, T, max_len, q, k, v, do = _batch(name, grad=True)
    qo, qc, doc = _cross_queries(offs, q)
    cases = {
        "causal self-attention": lambda: jagged_attention(q, k, v, offs, offs, causal=True,
                                                          max_kv_len=max_len).backward(do),
        "cross attention (Lq=16)": lambda: jagged_attention(qc, k, v, qo, offs, max_q_len=16,
                                                            max_kv_len=max_len).backward(doc),
    }
    n = int(calls)
    lines = []
    for label, fn in cases.items():
        wall = per_call_us(fn, n)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        stats = pstats.Stats(prof)
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:40]  # by own time
        lines += [f"### Host time of one forward+backward, batch {name}, {label}: {wall:.0f} us per call "
                  f"(without the profiler)", "", "| function | calls per call | own us per call | with callees us |",
                  "|---|---|---|---|"]
        for (file, line, func), (_, ncalls, own, cum, _) in rows:
            where = f"{Path(file).parent.name}/{Path(file).name}:{line} {func}" if line else func
            lines.append(f"| {where} | {ncalls / n:.1f} | {own / n * 1e6:.1f} | {cum / n * 1e6:.1f} |")
        print("\n".join(lines[-len(rows) - 4:]), flush=True)
    return lines


def launchcheck(name: str = "B") -> list[str]:
    """``triton_launch.run`` on the GPU: a copy kernel launched with integers and pointers of every
    specialization Triton distinguishes (1, multiples of 16, others; 16-byte aligned and not), each checked
    against torch after the direct path took over; then forward+backward of the attention rows of batch
    ``name`` three times (the first launches compile, the later ones launch directly): bit-identical."""
    import triton
    import triton.language as tl

    from kernels import triton_launch

    @triton.jit
    def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + i, tl.load(src + i, mask=i < n) + 1.0, mask=i < n)

    lines = [f"### Direct launches (kernels.triton_launch) on the GPU, batch {name}", "", "| check | result |",
             "|---|---|"]
    base = torch.randn(4096 + 8, device="cuda")
    bad = []
    for n in (1, 16, 17, 1024, 1000, 4095):
        for offset in (0, 1, 4):  # 4 floats = 16 bytes: aligned; 1 float: not
            for _ in range(3):  # the second and third launch take the direct path
                src = base[offset:offset + n]
                dst = torch.zeros(n + offset, device="cuda")[offset:]
                triton_launch.run(copy_kernel, (triton.cdiv(n, 256),), src, dst, n, BLOCK=256)
                if not torch.equal(dst, src + 1.0):
                    bad.append((n, offset))
    kernels = sum(1 for key in triton_launch._COMPILED if key[0] is copy_kernel)
    lines.append(f"| copy kernel, n in (1, 16, 17, 1024, 1000, 4095) x pointer offsets (0, 1, 4 floats), 3 launches "
                 f"each | {'ok' if not bad else f'WRONG at {bad}'} ({kernels} compiled specializations) |")
    offs, T, max_len, q, k, v, do = _batch(name, grad=True)
    qo, qc, doc = _cross_queries(offs, q)
    cases = {
        "causal": (lambda: jagged_attention(q, k, v, offs, offs, causal=True, max_kv_len=max_len), do, (q, k, v)),
        "non-causal": (lambda: jagged_attention(q, k, v, offs, offs, max_kv_len=max_len), do, (q, k, v)),
        "cross (Lq=16)": (lambda: jagged_attention(qc, k, v, qo, offs, max_q_len=16, max_kv_len=max_len), doc,
                          (qc, k, v)),
        "window W=256": (lambda: jagged_attention(q, k, v, offs, offs, causal=True, window=256), do, (q, k, v)),
        "block-local S=64": (lambda: jagged_attention(q, k, v, offs, offs, causal=True, block_size=64), do, (q, k, v)),
    }
    for label, (fn, grad, inputs) in cases.items():
        results = []
        for _ in range(3):
            for t in inputs:
                t.grad = None
            out = fn()
            out.backward(grad)
            results.append([out.detach().clone()] + [t.grad.clone() for t in inputs])
        same = all(torch.equal(a, b) for later in results[1:] for a, b in zip(results[0], later))
        lines.append(f"| {label}: output and gradients of 3 calls | {'bit-identical' if same else 'DIFFER'} |")
    print("\n".join(lines), flush=True)
    return lines


def launchab(name: str = "B", rounds: str = "8") -> list[str]:
    """Host time per call with the direct launch path (``kernels.triton_launch``) on and off, alternating in one
    process (the host's load moves single timings by 20-30%): medians over ``rounds`` rounds of 50 calls."""
    import statistics

    from kernels import triton_launch

    offs, T, max_len, q, k, v, do = _batch(name, grad=True)
    qo, qc, doc = _cross_queries(offs, q)

    def fb(inputs, grad, **kw):
        for t in inputs:
            t.grad = None
        jagged_attention(inputs[0], k, v, kw.pop("qo", offs), offs, max_kv_len=max_len, **kw).backward(grad)

    cases = {
        "causal forward (no grad)": lambda: jagged_attention(q.detach(), k.detach(), v.detach(), offs, offs,
                                                             causal=True, max_kv_len=max_len),
        "causal forward+backward": lambda: fb((q, k, v), do, causal=True),
        "cross (Lq=16) forward+backward": lambda: fb((qc, k, v), doc, qo=qo, max_q_len=16),
        "window W=256 forward+backward": lambda: fb((q, k, v), do, causal=True, window=256),
    }
    lines = [f"### Host us per call, direct launches off / on, batch {name} ({rounds} alternating rounds of 50 calls)",
             "", "| call | off (fn[grid]) | on (compiled kernel) | saved |", "|---|---|---|---|"]
    saved = triton_launch.ENABLED
    try:
        for label, fn in cases.items():
            times = {False: [], True: []}
            for _ in range(int(rounds)):
                for enabled in (False, True):
                    triton_launch.ENABLED = enabled
                    times[enabled].append(per_call_us(fn, 50))
            off, on = statistics.median(times[False]), statistics.median(times[True])
            lines.append(f"| {label} | {off:.0f} | {on:.0f} | {off - on:.0f} us ({1 - on / off:.0%}) |")
            print(lines[-1], flush=True)
    finally:
        triton_launch.ENABLED = saved
    return lines


SECTIONS = {"launchab": launchab, "launchcheck": launchcheck, "hostprofile": hostprofile, "pieces": pieces, "launch": launch, "tiles": tiles, "fwdconfigs": fwdconfigs, "dqconfigs": dqconfigs, "fusedfull": fusedfull,
            "context": context}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in SECTIONS:
        sys.exit(__doc__)
    if not torch.cuda.is_available():
        sys.exit("attention_host.py measures GPU host and kernel time: run it on a CUDA machine")
    print("\n".join(SECTIONS[sys.argv[1]](*sys.argv[2:])))
