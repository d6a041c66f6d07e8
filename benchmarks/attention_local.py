"""Block-local and window attention on the GPU (issue 5): timings beside flex_attention and our full
causal kernel, the one-pass block kernels against float64, and their configuration sweep. Run through
``benchmarks/attention.py local | blockcheck | blocksweep`` (its docstring lists the arguments).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import torch

from benchmarks.attention import (
    NUM_POS,
    NUM_TIME,
    _block_mask,
    _flex,
    _packed,
    _time_pair,
    cuda_time,
    offsets_of,
    rel_err,
)
from benchmarks.attention_profile import nvidia_smi
from kernels import RelativeBias, jagged_attention


def _local_masks(doc: torch.Tensor) -> dict[str, Callable]:
    return {"block": lambda b, h, i, j: (doc[i] == doc[j]) & (i >= j) & (i // 64 == j // 64),
            "window": lambda b, h, i, j: (doc[i] == doc[j]) & (i >= j) & (i - j <= 256)}


SMI_FIELDS = "clocks.sm,power.draw,temperature.gpu"
COPY_BYTES = 1 << 29  # the copy that sets the ceiling: 512 MB, far past any L2


def copy_ceiling_gbs(nbytes: int = COPY_BYTES) -> float:
    """This device's copy rate in GB/s (bytes read + written over a ``clone`` of ``nbytes``), measured in the
    run that uses it: the ceiling differs by card (an H200 copies ~4.2 TB/s, an H100 ~3.0)."""
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda" if torch.cuda.is_available() else "cpu")
    ms = cuda_time(lambda: x.clone(), reps=20)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def local(seq_lens: list[int] | None = None, calls: int = 1, rounds: int = 1) -> list[str]:
    """Issue 5: block-local (S=64) and window (W=256) vs full causal and flex, B*L constant.

    "block S=64" is the one-pass block kernel (``kernels.attention_block_op``: one offsets tensor for
    both sides); "generic block" / "generic window" are the same calls through the generic jagged kernels
    (a copy of the offsets as ``kv_offsets`` routes them there); "window W=256" runs the window kernels
    (``kernels.attention_window_op``). GB/s: q, k, v read once and o written once
    (4·ΣL·H·D·2 bytes) over the block forward's time. ``calls`` > 1 times that many back-to-back calls
    per measurement (every column), so host work per call hides behind the GPU's as in training.
    ``rounds`` > 1 times block, window and their flex baselines that many times in alternation (ours, then
    flex, each round) and reports each one's median: the card's clock and power state drift over a run by a few
    percent, and alternating exposes every column to the same drift. The generic and full causal columns are
    timed once, after the rounds at every L; the SM clock, power and temperature are printed before and after
    each L's rounds.
    """
    H, D, tokens = 8, 128, 1 << 17
    flex, create_block_mask = _flex()
    rows = [f"### Block-local / window, B*L={tokens}, H={H}, D={D}, bf16, causal, fwd+bwd ms, {calls} call(s) "
            f"per timing, medians of {rounds} alternating round(s) (block, window, flex)", "",
            "| L | B | block S=64 | generic block | flex block | window W=256 | generic window | flex window | "
            "full causal (ours) | block vs flex | block vs generic | window vs flex | window vs generic | full / block | "
            "block fwd ms | flex block fwd ms | window fwd ms | flex window fwd ms | block fwd GB/s | of copy ceiling |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(tokens, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    qf, kf, vf = _packed(q), _packed(k), _packed(v)
    dof = do.permute(1, 0, 2).unsqueeze(0).contiguous()
    lens_run = seq_lens or (2048, 4096, 8192, 16384, 32768)
    copy_gbs = copy_ceiling_gbs()
    print(f"copy ceiling (this device): {copy_gbs:.0f} GB/s", flush=True)
    calls_of = {}  # L -> our calls by column
    timed = {}  # L -> (ours, flex): fwd, fwd+bwd timings per column
    # Two passes: first the compared columns in alternation at every L, then the columns timed once (the full
    # causal one runs tens of seconds at the card's power limit, which would leave the rounds after it on a hot
    # card).
    for L in lens_run:
        offs = offsets_of(torch.full((tokens // L,), L, dtype=torch.int64))
        other = offs.clone()  # a second offsets tensor: the generic kernels
        doc = torch.arange(tokens, device="cuda") // L
        ours, theirs = {}, {}
        for key, kw, kv_offs in (("block", dict(block_size=64), offs), ("generic", dict(block_size=64), other),
                                 ("window", dict(window=256), offs), ("gwindow", dict(window=256), other),
                                 ("full", {}, offs)):
            ours[key] = (lambda kw=kw, offs=offs, kv=kv_offs, L=L: jagged_attention(q, k, v, offs, kv, causal=True,
                                                                                    max_kv_len=L, **kw))
        for key, mm in _local_masks(doc).items():
            bm = _block_mask(create_block_mask, mm, tokens, tokens)
            theirs[key] = lambda bm=bm: flex(qf, kf, vf, block_mask=bm)
        res, fx = {"block": [], "window": []}, {"block": [], "window": []}
        clocks = [nvidia_smi(SMI_FIELDS)]
        for _ in range(rounds):
            for key in ("block", "window"):
                res[key].append(_time_pair(ours[key], do, [q, k, v], calls))
                fx[key].append(_time_pair(theirs[key], dof, [qf, kf, vf], calls))
        clocks.append(nvidia_smi(SMI_FIELDS))
        print(f"L={L} rounds: " + "; ".join(f"{key} {[round(t[1], 3) for t in res[key]]} flex "
                                            f"{[round(t[1], 3) for t in fx[key]]}" for key in ("block", "window"))
              + f"; {SMI_FIELDS} before / after the rounds: {clocks[0]} / {clocks[1]}", flush=True)
        calls_of[L], timed[L] = ours, (res, fx)
    for L in lens_run:
        B, ours, (res, fx) = tokens // L, calls_of[L], timed[L]
        for key in ("generic", "gwindow", "full"):
            res[key] = [_time_pair(ours[key], do, [q, k, v], calls)]
        res = {key: _medians(t) for key, t in res.items()}
        fx = {key: _medians(t) for key, t in fx.items()}
        gbs = 4 * tokens * H * D * 2 / (res["block"][0] * 1e-3) / 1e9
        rows.append(f"| {L} | {B} | {res['block'][1]:.3f} | {res['generic'][1]:.3f} | {fx['block'][1]:.3f} | "
                    f"{res['window'][1]:.3f} | {res['gwindow'][1]:.3f} | {fx['window'][1]:.3f} | {res['full'][1]:.3f} | "
                    f"{fx['block'][1] / res['block'][1]:.2f}x | {res['generic'][1] / res['block'][1]:.2f}x | "
                    f"{fx['window'][1] / res['window'][1]:.2f}x | {res['gwindow'][1] / res['window'][1]:.2f}x | "
                    f"{res['full'][1] / res['block'][1]:.1f}x | {res['block'][0]:.3f} | {fx['block'][0]:.3f} | "
                    f"{res['window'][0]:.3f} | {fx['window'][0]:.3f} | {gbs:.0f} | {gbs / copy_gbs:.0%} |")
        print(rows[-1], flush=True)
    rows += ["", f"Copy ceiling: {copy_gbs:.0f} GB/s ({COPY_BYTES >> 20} MB clone on this device, same run)."]
    return rows


def _medians(timings: list[tuple[float, float]]) -> tuple[float, float]:
    """(forward, forward+backward) medians of one column's rounds."""
    return tuple(statistics.median(t[i] for t in timings) for i in range(2))


def _self_run(qkvdo: tuple, offs: torch.Tensor, tables: tuple | None, ts: torch.Tensor, dt: torch.dtype,
              impl: str, kw: dict, op: str) -> tuple[list[torch.Tensor], bool]:
    """Output and gradients of one self-attention call in ``dt``; whether it ran ``gemtrain::{op}_attn_fwd``."""
    from torch.utils.flop_counter import FlopCounterMode

    import kernels.attention_block_op  # noqa: F401  (their FLOP formulas must exist before the counter starts)
    import kernels.attention_window_op  # noqa: F401

    leaves = [t.to(dt).detach().requires_grad_() for t in qkvdo[:3]]
    tdt = torch.float64 if dt == torch.float64 else torch.float32
    w = [t.to(tdt).detach().requires_grad_() for t in tables] if tables is not None else []
    bias = RelativeBias(w[0], w[1], ts, ts) if w else None
    with FlopCounterMode(display=False) as fc:
        out = jagged_attention(*leaves, offs, offs, bias=bias, impl=impl, **kw)
        out.backward(qkvdo[3].to(dt))
    took = any(f"{op}_attn_fwd" in str(name) for name in fc.get_flop_counts().get("Global", {}))
    return [out] + [t.grad for t in leaves] + [t.grad for t in w], took


FLOORS = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 5e-3}


def check_self_attention(op: str, cases: list[tuple], lens: list[int], targets: list[int], seed: int,
                         device: str = "cuda") -> list[str]:
    """Our kernels against float64 for the ``op`` ("block" or "window") self-attention cases ``(size, D, act,
    causal, bias, targets, dtypes)``, ``size`` being the block size or window, on rows of ``lens`` (H=4);
    the accuracy rule of ``check``, and whether each call took the op. One markdown row per case and dtype."""
    size_name, size_kw = {"block": ("S", "block_size"), "window": ("W", "window")}[op]
    rows = [f"| {size_name} | D | act | causal | bias | targets | dtype | out err (ours / ref-lowp) | "
            f"worst grad err (ours / ref-lowp) | {op} op | ok |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    lens_t = torch.tensor(lens)
    offs = torch.cat([torch.zeros(1, dtype=torch.int64), lens_t.cumsum(0)]).to(device)
    T, H = int(lens_t.sum()), 4
    g = torch.Generator(device=device).manual_seed(seed)
    all_ok = True
    for size, D, act, causal, has_bias, has_targets, dtypes in cases:
        q, k, v, do = (torch.randn(T, H, D, device=device, generator=g, dtype=torch.float64) for _ in range(4))
        pos = torch.randn(NUM_POS, H, device=device, generator=g, dtype=torch.float64) * 0.5
        tim = torch.randn(NUM_TIME, H, device=device, generator=g, dtype=torch.float64) * 0.5
        ts = torch.randint(0, 10**5, (T,), device=device, generator=g).sort().values
        nt = torch.tensor(targets, device=device) if has_targets else None
        tables = (pos, tim) if has_bias else None
        kw = {"activation": act, "causal": causal, size_kw: size, "num_targets": nt}
        head = f"| {size} | {D} | {act} | {causal} | {has_bias} | {has_targets} |"
        ref, _ = _self_run((q, k, v, do), offs, tables, ts, torch.float64, "ref", kw, op)
        for dtype in dtypes:
            lowp, _ = _self_run((q, k, v, do), offs, tables, ts, dtype, "ref", kw, op)
            try:
                ours, took = _self_run((q, k, v, do), offs, tables, ts, dtype, "triton", kw, op)
            except Exception as e:  # report the case and go on with the others
                all_ok = False
                rows.append(f"{head} {str(dtype)[6:]} | failed: {type(e).__name__}: {str(e)[:80]} | | | NO |")
                print(rows[-1], flush=True)
                continue
            if device == "cuda":
                torch.cuda.synchronize()
            errs = [(rel_err(o, r), rel_err(lp, r)) for o, lp, r in zip(ours, lowp, ref)]
            ok = took and all(math.isfinite(e) and e <= 2 * e_lp + FLOORS[dtype] for e, e_lp in errs)
            all_ok &= ok
            worst = max(errs[1:], key=lambda t: t[0] - 2 * t[1])
            rows.append(f"{head} {str(dtype)[6:]} | {errs[0][0]:.1e} / {errs[0][1]:.1e} | "
                        f"{worst[0]:.1e} / {worst[1]:.1e} | {took} | {'yes' if ok else 'NO'} |")
            print(rows[-1], flush=True)
    rows.append(f"\n{op.upper()} ALL OK: {all_ok}")
    return rows


def blockcheck() -> list[str]:
    """The one-pass block kernels against float64 on the GPU (self-attention: one offsets tensor), bf16
    and fp32, with the accuracy rule of ``check``; also checks that the calls took the block ops."""
    both = (torch.bfloat16, torch.float32)
    cases = [(64, 128, "softmax", True, False, False, both), (64, 128, "softmax", True, True, True, both),
             (32, 64, "softmax", False, True, False, both), (16, 32, "softmax", True, True, False, both),
             (64, 128, "silu", True, True, False, both), (64, 64, "gelu", False, False, True, both),
             (48, 128, "softmax", True, True, False, both)]
    return check_self_attention("block", cases, [0, 1, 63, 64, 65, 300, 129, 1000, 17],
                                [0, 0, 3, 5, 2, 16, 0, 7, 1], seed=2)


def blocksweep(L: int = 4096, S: int = 64) -> list[str]:
    """Blocks per program (group), warps and pipeline stages of the block kernels, forward and backward
    timed alone (causal softmax, no bias), with and without tensor descriptors."""
    from kernels import attention_block_op as bop
    from kernels import attention_triton_common as common

    H, D, tokens = 8, 128, 1 << 17
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(tokens, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    offs = offsets_of(torch.full((tokens // L,), L, dtype=torch.int64))
    scale = 1 / math.sqrt(D)
    base = {"fwd": 4 * tokens * H * D * 2 + tokens * H * 4, "bwd": 8 * tokens * H * D * 2 + tokens * H * 4}
    rows = [f"### Block kernels alone, L={L}, S={S}, B*L={tokens}, H={H}, D={D}, bf16 causal softmax", "",
            "| pass | descriptors | group | warps | stages | ms | GB/s | of copy ceiling |",
            "|---|---|---|---|---|---|---|---|"]
    copy_gbs = copy_ceiling_gbs()
    rows[0] += f"; copy ceiling {copy_gbs:.0f} GB/s (this device)"
    saved, saved_tma = (dict(bop.FWD_CONFIG), dict(bop.BWD_CONFIG)), common.TMA
    # (descriptors, group, warps, stages): every group and config with descriptors, one without.
    combos = [("auto", gr, w, st) for gr in (2, 4, 8) for w, st in ((4, 1), (4, 2), (4, 3), (8, 2))]
    combos += [("0", 4, 4, 2)]
    try:
        for tma, group, warps, stages in combos:
            common.TMA = tma
            work = bop.block_work(offs, tokens, S, group)
            args = (offs, None, None, None, None, None, "softmax", True, scale, S, 0, group, work)
            out, lse = torch.ops.gemtrain.block_attn_fwd(q, k, v, *args)
            for name, table, fn in (
                    ("fwd", bop.FWD_CONFIG, lambda a=args: torch.ops.gemtrain.block_attn_fwd(q, k, v, *a)),
                    ("bwd", bop.BWD_CONFIG, lambda a=args, o=out, m=lse: torch.ops.gemtrain.block_attn_bwd(
                        do, q, k, v, o, m, *a))):
                table[bop.config_key(q, S)] = (warps, stages)
                try:
                    ms = cuda_time(fn, reps=20)
                except Exception as e:  # a configuration that does not compile or fit
                    rows.append(f"| {name} | {tma} | {group} | {warps} | {stages} | failed: {type(e).__name__} | | |")
                    continue
                gbs = base[name] / (ms * 1e-3) / 1e9
                rows.append(f"| {name} | {tma} | {group} | {warps} | {stages} | {ms:.3f} | {gbs:.0f} | "
                            f"{gbs / copy_gbs:.0%} |")
                print(rows[-1], flush=True)
    finally:
        bop.FWD_CONFIG.update(saved[0])
        bop.BWD_CONFIG.update(saved[1])
        common.TMA = saved_tma
    return rows


def windowcheck() -> list[str]:
    """The window kernels against float64 on the GPU (self-attention: one offsets tensor), bf16 or fp16
    (fp32 keeps the generic kernels), with the accuracy rule of ``check``; also checks that the calls took
    the window ops."""
    bf, fp = (torch.bfloat16,), (torch.float16,)
    cases = [(256, 128, "softmax", True, False, False, bf), (256, 128, "softmax", True, True, True, bf),
             (100, 64, "softmax", False, True, False, bf), (256, 128, "silu", True, True, False, bf),
             (48, 128, "gelu", False, False, True, fp), (5, 128, "softmax", True, True, False, fp)]
    return check_self_attention("window", cases, [0, 1, 63, 64, 65, 300, 129, 1000, 17, 257, 700],
                                [0, 0, 3, 5, 2, 16, 0, 7, 1, 4, 0], seed=3)


def windowtune(L: int = 4096, W: int = 256) -> list[str]:
    """Each window kernel's configuration (inner tile, warps, stages, last flag) timed at L (causal softmax,
    no bias): the forward op alone, then the backward op: the two-kernel backward at its configuration, then
    the fused backward (``attention_triton_window_bwd``) with its dk/dv + dS kernel's configuration varied
    (last flag: delta computed in its loop rather than by a pass first), then its dq kernel's (the other at
    its best so far). Leaves ``attention_window_op.CONFIG`` at the fastest of each and ``BACKWARD`` at the
    faster backward (the run's ``local`` rows use them). Every configuration launches with the kernel's
    ``attention_window_op.KERNEL_OPTIONS``. Useful TFLOP/s count visible pairs."""
    from kernels import attention_window_op as wop
    from kernels.attention_flops import visible_pairs

    H, D, tokens = 8, 128, 1 << 17
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(tokens, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    offs = offsets_of(torch.full((tokens // L,), L, dtype=torch.int64))
    fwd_flops = 4 * visible_pairs(offs, offs, causal=True, window=W) * H * D
    work = wop.window_work(offs, tokens, wop.TILE)
    args = (offs, None, None, None, None, None, "softmax", True, 1 / math.sqrt(D), W, 0, work)
    rows = [f"### Window kernels, L={L}, W={W}, B*L={tokens}, H={H}, D={D}, bf16 causal softmax, tile {wop.TILE}",
            "", "| backward | kernel varied | inner tile | warps | stages | flag | op | op ms | useful TFLOP/s |",
            "|---|---|---|---|---|---|---|---|---|"]
    cands = {"fwd": [(32, 4, 2, False), (32, 4, 3, False), (32, 4, 3, True), (32, 4, 4, True), (64, 4, 3, True),
                     (64, 4, 2, False)],
             "two": [wop.CONFIG["dq"]],
             "fused": [(64, 4, 2, False), (64, 4, 3, False)],
             "dsq": [(64, 8, 3, True), (64, 8, 2, True), (64, 4, 3, True), (64, 8, 4, True)]}
    out, lse = torch.ops.gemtrain.window_attn_fwd(q, k, v, *args)
    ops = {"fwd": lambda: torch.ops.gemtrain.window_attn_fwd(q, k, v, *args),
           "bwd": lambda: torch.ops.gemtrain.window_attn_bwd(do, q, k, v, out, lse, *args)}
    best_path = {}
    for name, configs in cands.items():
        op, flops = ("fwd", fwd_flops) if name == "fwd" else ("bwd", 2.5 * fwd_flops)
        path = {"fwd": "-", "two": "two", "fused": "fused", "dsq": "fused"}[name]
        key = "dq" if name == "two" else name
        if path != "-":
            wop.BACKWARD = path
        best = (float("inf"), wop.CONFIG[key])
        for cfg in configs:
            wop.CONFIG[key] = cfg
            try:
                ms = cuda_time(ops[op], reps=20)
            except Exception as e:  # a configuration that does not compile or fit
                rows.append(f"| {path} | {key} | {' | '.join(map(str, cfg))} | {op} | failed: {type(e).__name__} | |")
                print(rows[-1], flush=True)
                continue
            best = min(best, (ms, cfg))
            rows.append(f"| {path} | {key} | {' | '.join(map(str, cfg))} | {op} | {ms:.3f} | "
                        f"{flops / (ms * 1e-3) / 1e12:.0f} |")
            print(rows[-1], flush=True)
        wop.CONFIG[key] = best[1]
        best_path[path] = best[0]
    wop.BACKWARD = "fused" if best_path["fused"] < best_path["two"] else "two"
    rows.append(f"\nchosen: {wop.CONFIG}, backward {wop.BACKWARD}")
    return rows


def windowprofile(L: int = 4096, W: int = 256) -> list[str]:
    """Device time of each kernel of the window backward op at L (causal softmax, no bias, the configuration
    in ``attention_window_op.CONFIG``), per backward: the two-kernel one and the fused one (dS scratch through
    tensor descriptors, then through pointers). Mean over 20 calls (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    from kernels import attention_window_op as wop

    H, D, tokens = 8, 128, 1 << 17
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(tokens, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    offs = offsets_of(torch.full((tokens // L,), L, dtype=torch.int64))
    work = wop.window_work(offs, tokens, wop.TILE)
    args = (offs, None, None, None, None, None, "softmax", True, 1 / math.sqrt(D), W, 0, work)
    out, lse = torch.ops.gemtrain.window_attn_fwd(q, k, v, *args)
    rows = [f"### Window backward kernels, L={L}, W={W}, B*L={tokens}, H={H}, D={D}, bf16 causal softmax", "",
            "| backward | dS descriptors | kernel | ms per call |", "|---|---|---|---|"]
    saved = (wop.BACKWARD, wop.CONFIG["dsq"])
    try:
        for path, flag in (("two", None), ("fused", True), ("fused", False)):
            wop.BACKWARD = path
            if flag is not None:
                wop.CONFIG["dsq"] = saved[1][:3] + (flag,)
            for _ in range(3):
                torch.ops.gemtrain.window_attn_bwd(do, q, k, v, out, lse, *args)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    torch.ops.gemtrain.window_attn_bwd(do, q, k, v, out, lse, *args)
                torch.cuda.synchronize()
            total = 0.0
            for e in prof.key_averages():
                ms = e.self_device_time_total / 20 / 1e3
                if ms > 0.001:
                    total += ms
                    rows.append(f"| {path} | {flag} | {e.key[:60]} | {ms:.3f} |")
            rows.append(f"| {path} | {flag} | all | {total:.3f} |")
            print("\n".join(rows[-4:]), flush=True)
    finally:
        wop.BACKWARD, wop.CONFIG["dsq"] = saved
    return rows


# ----------------------------------------------------------------------------------------------- fp8


def main(what: str, args: list[str]) -> list[str]:
    """``local [L ...] [calls=N] [rounds=N] [tune]``, ``blockcheck``, ``blocksweep [L]``, ``windowcheck``, ``windowtune [L] [W]``,
    ``windowprofile [L] [W]``."""
    if what == "local":  # local [L ...] [calls=N] [rounds=N] [tune]: "tune" runs windowtune first, keeps its choice
        calls = next((int(a[6:]) for a in args if a.startswith("calls=")), 1)
        rounds = next((int(a[7:]) for a in args if a.startswith("rounds=")), 1)
        tuned = windowtune() if "tune" in args else []
        return tuned + local([int(a) for a in args if a.isdigit()] or None, calls, rounds)
    if what == "blockcheck":
        return blockcheck()
    if what == "windowcheck":
        return windowcheck()
    if what == "windowtune":
        return windowtune(*(int(a) for a in args[:2]))
    if what == "windowprofile":
        return windowprofile(*(int(a) for a in args[:2]))
    return blocksweep(*(int(a) for a in args[:1]))


if __name__ == "__main__":  # python benchmarks/attention_local.py windowcheck | windowtune [L] [W] | local ... tune (repo root on the path)
    import sys

    torch.backends.cuda.matmul.allow_tf32 = False
    print("\n".join(main(sys.argv[1], sys.argv[2:])), flush=True)
