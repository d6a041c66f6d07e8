"""Jagged attention on the GPU: correctness against float64, then timings beside the baselines.

    python benchmarks/attention.py check              # kernel vs float64, every option, bf16/fp16/fp32
    python benchmarks/attention.py check 0 1 'match=silu,bfloat16|D=256'   # cases whose name has every
                                                  # comma-separated part of one '|'-separated alternative
    python benchmarks/attention.py bench A B          # batches A and B (device README), issue-4 rows
    python benchmarks/attention.py bench A rows=biasparts   # what each bias table costs (ours only)
    python benchmarks/attention.py bench B calls=5    # ... timing 5 back-to-back calls per measurement
    python benchmarks/attention.py local              # block-local / window section (issue 5)
    python benchmarks/attention.py local 4096 calls=5 # ... timing 5 back-to-back calls per measurement
    python benchmarks/attention.py local calls=20 rounds=5  # ... block, window and flex in 5 alternating rounds
    python benchmarks/attention.py blockcheck         # the one-pass block kernels vs float64 (issue 5)
    python benchmarks/attention.py blocksweep 4096    # their groups / warps / stages, timed alone
    python benchmarks/attention.py windowcheck        # the window kernels vs float64 (issue 5)
    python benchmarks/attention.py windowtune 4096 256  # each window kernel's configuration, timed alone
    python benchmarks/attention.py fp8 A calls=5      # FP8 forward vs our bf16 forward (issue 8; also --fp8)

Baselines run in the same process: ``flex_attention`` (compiled) on the packed batch with a document
mask (and the same bias as ``score_mod``), and padded ``scaled_dot_product_attention`` (flash backend).
Times are medians of CUDA-event timings after warm-up; useful TFLOP/s count real tokens only
(``kernels.jagged_attention_flops``). Each section prints one markdown table.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from kernels import RelativeBias, jagged_attention, jagged_attention_flops

BATCHES = {"A": (64, 4096, 8, 128), "B": (256, 1024, 4, 64)}
NUM_POS, NUM_TIME = 129, 32


def lengths(batch: int, max_len: int, seed: int = 0) -> torch.Tensor:
    """Lognormal lengths exp(N(log(max_len/4), 1)) clipped to [16, max_len] (device README)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.exp(torch.randn(batch, generator=g, dtype=torch.float64) + math.log(max_len / 4))
    return x.clamp(16, max_len).to(torch.int64)


def offsets_of(lens: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).cuda()


def cuda_time(fn: Callable[[], object], reps: int = 10, warmup: int = 2, warm_ms: float = 150.0,
              calls: int = 1) -> float:
    """Median milliseconds of ``fn`` over ``reps`` CUDA-event timings (wall clock without a GPU).

    Warm-up: ``warmup`` runs and at least ``warm_ms`` of wall time, so the GPU's clock is back up after
    a pause (a compile) before timing starts. ``calls`` > 1 runs that many calls between the events: the
    host launches the next call while the GPU runs this one (as in training), so host work per call
    does not add to the time unless it exceeds the GPU's.
    """
    gpu = torch.cuda.is_available()
    t_end = time.perf_counter() + warm_ms / 1e3
    for _ in range(warmup):
        fn()
    while time.perf_counter() < t_end:
        fn()
        if gpu:
            torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if gpu:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if gpu:
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / calls)
        else:
            times.append(1e3 * (time.perf_counter() - t0) / calls)
    return statistics.median(times)


def profiled_kernels(fn: Callable[[], object], calls: int = 5, warmup: int = 1) -> list:
    """The CUDA kernel events (torch.profiler) of ``calls`` back-to-back calls of ``fn``, in GPU order, after
    ``warmup`` calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                  key=lambda e: e.time_range.start)


def gpu_ms(fn: Callable[[], object], calls: int = 5) -> float:
    """Milliseconds of GPU kernel time per call of ``fn`` (torch.profiler; 0 without a GPU): what the call
    costs the GPU when the host keeps up."""
    if not torch.cuda.is_available():
        return 0.0
    return sum(e.time_range.elapsed_us() for e in profiled_kernels(fn, calls)) / 1e3 / calls


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-30))


# ----------------------------------------------------------------------------------------------- check
def check(shard: int = 0, shards: int = 1, match: str | None = None) -> list[str]:
    rows = ["| case | dtype | out err (ours / ref-lowp) | worst grad err (ours / ref-lowp) | ok |", "|---|---|---|---|---|"]
    torch.manual_seed(0)
    cases = []
    for act in ("softmax", "silu", "gelu"):
        for causal in (False, True):
            cases.append(dict(act=act, causal=causal, bias=True, nt=causal, cross=False, bs=None, w=None, d=64))
        cases.append(dict(act=act, causal=True, bias=True, nt=False, cross=True, bs=None, w=None, d=128))
        cases.append(dict(act=act, causal=True, bias=True, nt=False, cross=False, bs=64, w=None, d=128))
        cases.append(dict(act=act, causal=False, bias=False, nt=False, cross=False, bs=None, w=100, d=32))
    cases.append(dict(act="softmax", causal=True, bias=False, nt=False, cross=False, bs=None, w=None, d=256))
    all_ok = True
    jobs = [(c, dtype) for c in cases for dtype in (torch.bfloat16, torch.float16, torch.float32)
            # fp16/fp32 pointwise paths are covered by the CPU interpreter tests
            if dtype == torch.bfloat16 or c["act"] == "softmax"]
    for c, dtype in jobs[shard::shards]:
        if match is not None and not any(all(m in _case_name(c, dtype) for m in alt.split(","))
                                         for alt in match.split("|")):
            continue
        ok, line = _check_case(c, dtype)
        all_ok &= ok
        rows.append(line)
        print(line, flush=True)
    rows.append(f"\nALL OK: {all_ok}")
    return rows


def _case_name(c: dict, dtype: torch.dtype | None = None) -> str:
    name = (f"{c['act']} causal={c['causal']} bias={c['bias']} targets={c['nt']} cross={c['cross']} "
            f"block={c['bs']} window={c['w']} D={c['d']}")
    return name if dtype is None else f"{name} {str(dtype)[6:]}"


def _check_case(c: dict, dtype: torch.dtype) -> tuple[bool, str]:
    H, D = 2, c["d"]
    lk = torch.tensor([0, 1, 77, 300, 129, 64])
    lq = torch.tensor([0, 1, 16, 16, 5, 16]) if c["cross"] else lk.clone()
    if not c["cross"]:
        lq[2] = 0  # a row with keys but no queries
    qo, ko = offsets_of(lq), offsets_of(lk)
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(int(lq.sum()), H, D, device="cuda", generator=g, dtype=torch.float64)
    k = torch.randn(int(lk.sum()), H, D, device="cuda", generator=g, dtype=torch.float64)
    v = torch.randn(int(lk.sum()), H, D, device="cuda", generator=g, dtype=torch.float64)
    do = torch.randn_like(q)
    pos = torch.randn(NUM_POS, H, device="cuda", generator=g, dtype=torch.float64) * 0.5
    tim = torch.randn(NUM_TIME, H, device="cuda", generator=g, dtype=torch.float64) * 0.5
    ts_k = torch.randint(0, 10**7, (int(lk.sum()),), device="cuda", generator=g)
    ts_q = torch.randint(0, 10**7, (int(lq.sum()),), device="cuda", generator=g)
    nt = torch.tensor([0, 0, 0, 5, 2, 16], device="cuda") if c["nt"] else None

    def run(dt: torch.dtype, impl: str) -> list[torch.Tensor]:
        leaves = [t.to(dt).detach().requires_grad_() for t in (q, k, v)]
        tables = [t.to(torch.float64 if dt == torch.float64 else torch.float32).detach().requires_grad_()
                  for t in (pos, tim)]
        bias = RelativeBias(tables[0], tables[1], ts_q, ts_k) if c["bias"] else None
        out = jagged_attention(*leaves, qo, ko, activation=c["act"], causal=c["causal"], bias=bias,
                               block_size=c["bs"], window=c["w"], num_targets=nt, impl=impl)
        out.backward(do.to(dt))
        grads = [t.grad for t in leaves] + ([t.grad for t in tables] if c["bias"] else [])
        return [out] + grads

    ref = run(torch.float64, "ref")
    lowp = run(dtype, "ref")
    ours = run(dtype, "triton")
    torch.cuda.synchronize()
    floor = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 5e-3}[dtype]
    errs = [(rel_err(o, r), rel_err(lp, r)) for o, lp, r in zip(ours, lowp, ref)]
    ok = all(math.isfinite(e) and e <= 2 * e_lp + floor for e, e_lp in errs)
    worst = max(errs[1:], key=lambda t: t[0] - 2 * t[1])
    return ok, (f"| {_case_name(c)} | {str(dtype)[6:]} | {errs[0][0]:.1e} / {errs[0][1]:.1e} | "
                f"{worst[0]:.1e} / {worst[1]:.1e} | {'yes' if ok else 'NO'} |")


# ----------------------------------------------------------------------------------------------- bench
def _flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    return torch.compile(flex_attention, dynamic=False), create_block_mask


def _block_mask(create_block_mask, mask_mod, q_len: int, kv_len: int):
    try:
        return create_block_mask(mask_mod, None, None, q_len, kv_len, device="cuda", _compile=True)
    except TypeError:
        return create_block_mask(mask_mod, None, None, q_len, kv_len, device="cuda")


# Back-to-back calls per timing for the bench section (``bench ... calls=N``; every row and baseline alike).
BENCH_CALLS = 1


def _time_pair(fwd: Callable[[], torch.Tensor], grad: torch.Tensor, params: list[torch.Tensor],
               calls: int | None = None) -> tuple[float, float]:
    """(forward ms, forward+backward ms); ``calls`` back-to-back calls per timing (``cuda_time``; default
    ``BENCH_CALLS``), reported per call."""
    calls = calls or BENCH_CALLS
    def fb() -> None:
        for p in params:
            p.grad = None
        fwd().backward(grad)

    with torch.no_grad():
        t_f = cuda_time(fwd, calls=calls)
    return t_f, cuda_time(fb, calls=calls)


def _packed(t: torch.Tensor) -> torch.Tensor:  # [T, H, D] -> [1, H, T, D]
    return t.detach().permute(1, 0, 2).unsqueeze(0).contiguous().requires_grad_()


def _padded(t: torch.Tensor, offs: torch.Tensor, lens: torch.Tensor, max_len: int) -> torch.Tensor:
    B = lens.numel()
    out = t.new_zeros(B, max_len, *t.shape[1:])
    idx = torch.arange(max_len, device=t.device)[None, :]
    valid = idx < lens.cuda()[:, None]
    out[valid] = t.detach()
    return out.transpose(1, 2).contiguous().requires_grad_()


def bench(name: str, only: set[str] | None = None) -> list[str]:
    B, max_len, H, D = BATCHES[name]
    flex, create_block_mask = _flex()
    lens = lengths(B, max_len)
    offs = offsets_of(lens)
    T = int(lens.sum())
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda n: torch.randn(n, H, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    q, k, v = mk(T), mk(T), mk(T)
    do = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    doc = torch.repeat_interleave(torch.arange(B, device="cuda"), lens.cuda())
    pos_in_row = torch.arange(T, device="cuda") - offs[:-1][doc]
    ts = (torch.randint(0, 3600, (T,), device="cuda", generator=g).cumsum(0))
    pos_w = (torch.randn(NUM_POS, H, device="cuda", generator=g) * 0.1).requires_grad_()
    time_w = (torch.randn(NUM_TIME, H, device="cuda", generator=g) * 0.1).requires_grad_()
    qf, kf, vf = _packed(q), _packed(k), _packed(v)
    dof = do.permute(1, 0, 2).unsqueeze(0).contiguous()
    qp, kp, vp = (_padded(t, offs, lens, max_len) for t in (q, k, v))
    dop = _padded(do, offs, lens, max_len).detach()
    pad_ratio = B * max_len / T
    rows = [f"### Batch {name}: B={B}, max_len={max_len}, H={H}, D={D}, bf16, ΣL={T} "
            f"(padded box {pad_ratio:.2f}x real tokens), {BENCH_CALLS} back-to-back call(s) per timing", "",
            "| row | impl | fwd ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s | ours vs this (fwd / fwd+bwd) |",
            "|---|---|---|---|---|---|---|"]

    def emit(row: str, results: list[tuple[str, float | None, float | None]], flops: int) -> None:
        ours_f, ours_fb = results[0][1], results[0][2]
        for impl, tf, tfb in results:
            tflops_f = f"{flops / tf / 1e9:.0f}" if tf else "-"
            tflops_fb = f"{3.5 * flops / tfb / 1e9:.0f}" if tfb else "-"
            ratio = (f"{tf / ours_f:.2f}x / {tfb / ours_fb:.2f}x" if tf and tfb and impl != "ours" else "")
            rows.append(f"| {row} | {impl} | {tf or float('nan'):.3f} | {tfb or float('nan'):.3f} | "
                        f"{tflops_f} | {tflops_fb} | {ratio} |")
        print("\n".join(rows[-len(results):]), flush=True)

    def safe(fn: Callable[[], tuple[float, float]]) -> tuple[float | None, float | None]:
        try:
            return fn()
        except Exception as e:  # a baseline that cannot run this case is reported, not fatal
            print(f"  baseline failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            return None, None

    want = lambda row: only is None or row in only
    for causal in (True, False):
        if not want("softmax"):
            break
        flops = jagged_attention_flops(offs, offs, H, D, causal=causal)
        ours = _time_pair(lambda c=causal: jagged_attention(q, k, v, offs, offs, causal=c, max_kv_len=max_len),
                          do, [q, k, v])
        mask = (lambda b, h, i, j: (doc[i] == doc[j]) & (i >= j)) if causal else (lambda b, h, i, j: doc[i] == doc[j])
        bm = _block_mask(create_block_mask, mask, T, T)
        fx = safe(lambda bm=bm: _time_pair(lambda: flex(qf, kf, vf, block_mask=bm), dof, [qf, kf, vf]))

        def sdpa(c=causal):
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(qp, kp, vp, is_causal=c)
        sd = safe(lambda: _time_pair(sdpa, dop, [qp, kp, vp]))
        emit(f"{'causal' if causal else 'non-causal'} softmax", [("ours", *ours), ("flex", *fx), ("padded SDPA", *sd)],
             flops)
        if causal:
            soft_causal = ours

    if want("bias"):
        _bias_row(emit, safe, flex, create_block_mask, q, k, v, qf, kf, vf, do, dof, offs, doc, pos_in_row, ts,
                  pos_w, time_w, max_len, H, D, T)
    if only is not None and "biasparts" in only:
        _bias_parts_row(emit, q, k, v, do, offs, ts, pos_w, time_w, max_len, H, D)
    if want("cross"):
        _cross_row(emit, safe, flex, create_block_mask, k, v, kf, vf, kp, vp, offs, doc, max_len, B, H, D, T, g, mk)
    if want("silu") and want("softmax"):  # compared with the causal softmax row
        # Causal silu: no baseline can do it; compared with our own causal softmax.
        flops = jagged_attention_flops(offs, offs, H, D, causal=True)
        ours = _time_pair(lambda: jagged_attention(q, k, v, offs, offs, activation="silu", causal=True,
                                                   max_kv_len=max_len), do, [q, k, v])
        emit("causal silu (vs our softmax)", [("ours", *ours), ("ours softmax", *soft_causal)], flops)
    return rows


def _bias_row(emit, safe, flex, create_block_mask, q, k, v, qf, kf, vf, do, dof, offs, doc, pos_in_row, ts,
              pos_w, time_w, max_len, H, D, T) -> None:
    """Relative position + time bias (learnable tables), causal, vs flex with the same score_mod."""
    flops = jagged_attention_flops(offs, offs, H, D, causal=True)
    bias = RelativeBias(pos_w, time_w, ts, ts)
    ours = _time_pair(lambda: jagged_attention(q, k, v, offs, offs, causal=True, bias=bias, max_kv_len=max_len),
                      do, [q, k, v, pos_w, time_w])
    half = (NUM_POS - 1) // 2

    def score_mod(score, b, h, i, j):
        pb = (pos_in_row[i] - pos_in_row[j]).clamp(-half, NUM_POS - 1 - half) + half
        dt = (ts[i] - ts[j]).abs() + 1
        tb = torch.floor(torch.log2(dt.to(torch.float32))).clamp(0, NUM_TIME - 1).to(torch.int64)
        return score + pos_w[pb, h] + time_w[tb, h]

    bm = _block_mask(create_block_mask, lambda b, h, i, j: (doc[i] == doc[j]) & (i >= j), T, T)

    def flex_bias(opts=None):
        return _time_pair(lambda: flex(qf, kf, vf, score_mod=score_mod, block_mask=bm, kernel_options=opts),
                          dof, [qf, kf, vf, pos_w, time_w])
    fx = safe(flex_bias)
    if fx[0] is None:
        fx = safe(lambda: flex_bias({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_M1": 32, "BLOCK_N1": 64,
                                     "BLOCK_M2": 64, "BLOCK_N2": 32, "num_stages": 1}))
    emit("causal softmax + pos/time bias", [("ours", *ours), ("flex score_mod", *fx)], flops)


def _bias_parts_row(emit, q, k, v, do, offs, ts, pos_w, time_w, max_len, H, D) -> None:
    """Where the bias costs: ours with no bias, each table alone and both, each against ours without bias.
    (Frozen tables would time the same kernels: the backward op computes the table gradients regardless.)"""
    flops = jagged_attention_flops(offs, offs, H, D, causal=True)
    variants = {"no bias": None, "position table": RelativeBias(pos_w, None, ts, ts),
                "time table": RelativeBias(None, time_w, ts, ts), "both tables": RelativeBias(pos_w, time_w, ts, ts)}
    times = {}
    for name, bias in variants.items():
        leaves = [q, k, v] + ([t for t in (pos_w, time_w) if t.requires_grad] if bias is not None else [])
        times[name] = _time_pair(lambda b=bias: jagged_attention(q, k, v, offs, offs, causal=True, bias=b,
                                                                 max_kv_len=max_len), do, leaves)
    for name, t in times.items():
        if name != "no bias":
            emit(f"causal softmax, {name}", [("ours", *t), ("ours, no bias", *times["no bias"])], flops)


def _cross_row(emit, safe, flex, create_block_mask, k, v, kf, vf, kp, vp, offs, doc, max_len, B, H, D, T, g,
               mk) -> None:
    """Cross attention: 16 candidate tokens per row over the whole history."""
    lq = torch.full((B,), 16, dtype=torch.int64)
    qo = offsets_of(lq)
    qc = mk(16 * B)
    doc_c = torch.repeat_interleave(torch.arange(B, device="cuda"), 16)
    flops = jagged_attention_flops(qo, offs, H, D)
    doc_ = torch.randn(16 * B, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    ours = _time_pair(lambda: jagged_attention(qc, k, v, qo, offs, max_q_len=16, max_kv_len=max_len), doc_, [qc, k, v])
    bm_c = _block_mask(create_block_mask, lambda b, h, i, j: doc_c[i] == doc[j], 16 * B, T)
    qcf = _packed(qc)
    fx = safe(lambda: _time_pair(lambda: flex(qcf, kf, vf, block_mask=bm_c), _packed(doc_).detach(),
                                 [qcf, kf, vf]))
    qcp = qc.detach().view(B, 16, H, D).transpose(1, 2).contiguous().requires_grad_()
    dcp = doc_.view(B, 16, H, D).transpose(1, 2).contiguous()

    def sdpa_c():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qcp, kp, vp)
    sd = safe(lambda: _time_pair(sdpa_c, dcp, [qcp, kp, vp]))
    emit("cross attention (Lq=16)", [("ours", *ours), ("flex", *fx), ("padded SDPA", *sd)], flops)


FP8_REL_BOUND = 0.08  # relative L2 error of the FP8 output against float64 (tests/kernels/test_attention_fp8.py)


def fp8(name: str = "A") -> list[str]:
    """Issue 8: FP8 forward (``precision="fp8"``) vs our bf16 forward on one batch (target >= 1.3x on A).

    Columns: the bf16 kernel; the whole FP8 call (three quantize passes + kernel); the FP8 kernel alone on
    pre-quantized inputs; the quantize passes alone. Correctness first, on the same inputs: relative L2 error
    of the FP8 and the bf16 outputs against a float64 reference (``jagged_attention_ref`` in float64), and
    of the FP8 kernel against its emulation (``jagged_attention_fp8_ref``: same quantized operands, fp32).
    ``ok``: the FP8 error is within ``FP8_REL_BOUND``.
    """
    from kernels.attention_fp8 import DEFAULT_QUANT_BLOCK

    x = fp8_inputs(name)
    B, max_len, H, D, T = x.B, x.max_len, x.H, x.D, x.T
    offs, q, k, v, qc, qo_c, ts, pos_w, time_w = x.offs, x.q, x.k, x.v, x.qc, x.qo_c, x.ts, x.pos_w, x.time_w
    rows = [f"### FP8 attention forward, batch {name}: B={B}, max_len={max_len}, H={H}, D={D}, ΣL={T}, "
            "inputs bf16", "",
            "| case | bf16 fwd ms | fp8 fwd ms (with quantize) | fp8 kernel ms | quantize ms | quantize GPU ms | "
            "bf16 / fp8 | bf16 / fp8 kernel | fp8 TFLOP/s | err fp8 vs f64 | err bf16 vs f64 | fp8 vs emulation | ok |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    cases = [
        ("causal softmax", dict(causal=True), {}),
        ("causal softmax, V row-major", dict(causal=True), dict(v_transposed=False)),
        ("causal softmax, 64-token scale blocks", dict(causal=True), dict(quant_block=64)),
        ("non-causal softmax", dict(causal=False), {}),
        ("causal softmax + pos/time bias", dict(causal=True, bias=RelativeBias(pos_w, time_w, ts, ts)), {}),
        ("causal silu", dict(causal=True, activation="silu"), {}),
        ("cross attention (Lq=16)", dict(cross=True), {}),
    ]
    for label, kw, opt in cases:
        kw = dict(kw)
        cross = kw.pop("cross", False)
        qx, qo = (qc, qo_c) if cross else (q, offs)
        kw.update(max_q_len=16 if cross else max_len, max_kv_len=max_len)
        flops = jagged_attention_flops(qo, offs, H, D, causal=kw.get("causal", False))
        try:
            t_bf, t_f8, t_k, t_q, t_qg, e8, eb, ee = _fp8_case(qx, k, v, qo, offs, kw,
                                                        opt.get("quant_block", DEFAULT_QUANT_BLOCK),
                                                        opt.get("v_transposed", True), emulation=True)
        except Exception as e:  # report and go on: one broken case must not hide the others
            rows.append(f"| {label} | ERROR {type(e).__name__}: {str(e)[:200]} |")
            print(rows[-1], flush=True)
            torch.cuda.empty_cache()
            continue
        rows.append(f"| {label} | {t_bf:.3f} | {t_f8:.3f} | {t_k:.3f} | {t_q:.3f} | {t_qg:.3f} | {t_bf / t_f8:.2f}x | "
                    f"{t_bf / t_k:.2f}x | {flops / t_k / 1e9:.0f} | {e8:.1e} | {eb:.1e} | {ee:.1e} | "
                    f"{'yes' if e8 <= FP8_REL_BOUND else 'NO'} |")
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    return rows


def fp8_inputs(name: str) -> SimpleNamespace:
    """The FP8 sections' bf16 inputs on batch ``name``: q, k, v [T, H, D] over ``offs``; 16 queries per row for
    cross attention (``qc`` over ``qo_c``); timestamps and bias tables; ``mk(n)`` draws more from the same
    generator."""
    B, max_len, H, D = BATCHES[name]
    lens = lengths(B, max_len)
    T = int(lens.sum())
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda n: torch.randn(n, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v = mk(T), mk(T), mk(T)
    qc = mk(16 * B)
    ts = torch.randint(0, 3600, (T,), device="cuda", generator=g).cumsum(0)
    return SimpleNamespace(
        B=B, max_len=max_len, H=H, D=D, T=T, offs=offsets_of(lens), q=q, k=k, v=v, qc=qc,
        qo_c=offsets_of(torch.full((B,), 16, dtype=torch.int64)), ts=ts,
        pos_w=torch.randn(NUM_POS, H, device="cuda", generator=g) * 0.1,
        time_w=torch.randn(NUM_TIME, H, device="cuda", generator=g) * 0.1, mk=mk)


@torch.no_grad()
def _fp8_case(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo: torch.Tensor, offs: torch.Tensor, kw: dict,
              qb: int, v_t: bool, emulation: bool = False) -> tuple[float, ...]:
    """(bf16 ms, fp8 ms, fp8 kernel-only ms, quantize ms, quantize GPU ms, fp8 error, bf16 error) of one case,
    errors against a float64 reference; with ``emulation`` an eighth item: the FP8 output against its fp32
    emulation. "quantize GPU ms": the quantize launch's kernel time alone (profiler), without host time."""
    from kernels.attention_fp8 import jagged_attention_fp8, jagged_attention_fp8_ref
    from kernels.attention_fp8_op import fp8_fwd_quantized, quantize_qkv
    from kernels.attention_op import _len_key
    from kernels.attention_ref import jagged_attention_ref

    def quant():  # as the op does it: one launch for q, k and v
        return quantize_qkv(q, k, v, qo, offs, qb, v_t)

    qq, kq, vq, vt = quant()
    bias, act = kw.get("bias"), kw.get("activation", "softmax")
    tables = (bias.pos_weight, bias.time_weight, bias.q_timestamps, bias.kv_timestamps) if bias else (None,) * 4
    len_key = _len_key(qo, q, k, kw["max_q_len"], kw["max_kv_len"])

    def kern():
        return fp8_fwd_quantized(q, k, qq, kq, vq, vt, qo, offs, None, *tables, act, kw.get("causal", False),
                                 1.0 / math.sqrt(q.shape[-1]), 0, -1, 0, len_key, kw["max_q_len"], qb)

    bf = lambda: jagged_attention(q, k, v, qo, offs, **kw)
    f8 = lambda: jagged_attention_fp8(q, k, v, qo, offs, quant_block=qb, v_transposed=v_t, **kw)
    out8 = f8()
    if not torch.equal(kern()[0], out8):
        print("  warning: kernel-only and full FP8 calls disagree", flush=True)
    ref_kw = {key: val for key, val in kw.items() if key not in ("max_q_len", "max_kv_len")}
    if bias is not None:
        ref_kw["bias"] = RelativeBias(bias.pos_weight.double(), bias.time_weight.double(), bias.q_timestamps,
                                      bias.kv_timestamps)
    exact = jagged_attention_ref(q.double(), k.double(), v.double(), qo, offs, **ref_kw)
    errs = [rel_err(out8, exact), rel_err(bf(), exact)]
    del exact
    if emulation:  # same quantized operands in fp32, P quantized per KV tile of the kernel's last configuration
        from kernels.attention_fp8_triton import jagged_attn_fp8_fwd_kernel

        tile_n = jagged_attn_fp8_fwd_kernel.best_config.kwargs["BLOCK_N"]
        emu = jagged_attention_fp8_ref(q, k, v, qo, offs, quant_block=qb, tile_n=tile_n, **ref_kw)
        errs.append(rel_err(out8, emu.double()))
        del emu
    times = [cuda_time(fn, calls=BENCH_CALLS) for fn in (bf, f8, kern, quant)]
    return (*times, gpu_ms(quant), *errs)


SECTIONS = ("check", "bench", "fp8", "--fp8", "local", "blockcheck", "blocksweep", "windowcheck", "windowtune")


def main(argv: list[str]) -> None:
    global BENCH_CALLS
    what = argv[1] if len(argv) > 1 else "bench"
    if what not in SECTIONS:  # --help, or a typo: the usage
        sys.exit(__doc__)
    if not torch.cuda.is_available():
        sys.exit("benchmarks/attention.py times the kernels on the GPU: run it on a CUDA machine")
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"# {time.strftime('%Y-%m-%d')} {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    out: list[str] = []
    if what == "check":  # check [SHARD SHARDS] [match=A,B|C]
        match = next((a[6:] for a in argv[2:] if a.startswith("match=")), None)
        out = check(*(int(a) for a in argv[2:4] if not a.startswith("match=")), match=match)
    elif what == "bench":  # bench [A] [B] [rows=softmax,bias,biasparts,cross,silu] [calls=N]
        only = next((set(a[5:].split(",")) for a in argv[2:] if a.startswith("rows=")), None)
        BENCH_CALLS = next((int(a[6:]) for a in argv[2:] if a.startswith("calls=")), 1)
        for name in [a for a in argv[2:] if not a.startswith(("rows=", "calls="))] or ["A", "B"]:
            # flex_attention recompiles per batch shape; after batch A's rows dynamo's recompile limit left
            # batch B's flex rows on the eager fallback, which ran out of memory (RESULTS.md): start clean.
            torch._dynamo.reset()
            out += bench(name, only) + [""]
    elif what in ("fp8", "--fp8"):  # fp8 [A|B] [calls=N]: FP8 forward vs our bf16 forward (issue 8)
        BENCH_CALLS = next((int(a[6:]) for a in argv[2:] if a.startswith("calls=")), 1)
        out = fp8(next((a for a in argv[2:] if not a.startswith("calls=")), "A"))
    elif what in ("local", "blockcheck", "blocksweep", "windowcheck", "windowtune"):  # block / window (issue 5)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: `benchmarks` importable
        from benchmarks import attention_local

        out = attention_local.main(what, argv[2:])
    if what != "check":
        print("\n".join(out), flush=True)


if __name__ == "__main__":
    main(sys.argv)
