"""The FP8 GELU MLP (``kernels.fp8_mlp``: the GELU computed by the casts) against the three-module chain and bf16.

    PYTHONPATH=. python benchmarks/fp8_mlp.py [TOKENS] [d=1024] [rounds=3]
    PYTHONPATH=. python benchmarks/fp8_mlp.py casts [TOKENS]   # the casts alone, per tile, beside torch's GELU

``model.layers.MLP`` d -> 4d -> d (the issue's MLP shape: 65536 x 1024 -> 4096 -> 1024), bf16 inputs and weights,
forward+backward, every step ending with ``fp8_step()`` (a training loop's optimizer step, so delayed scaling runs
with history). Arms: bf16 (``nn.Linear``, ``nn.GELU``, ``nn.Linear``); FP8 tensorwise delayed scaling (dY e5m2,
FP8 weight gradients) as the chain of two ``Fp8Linear`` around ``nn.GELU`` (``fp8_mlp.FUSE`` off); and the fused
MLP. First the fused MLP's output and gradients against the chain's over three steps, then the arms timed in
alternating rounds (``triton.testing.do_bench`` medians; the table holds the medians over rounds).
"""

from __future__ import annotations

import statistics
import sys

import torch
import triton

from kernels import fp8_mlp
from kernels.fp8_linear import Fp8Config, Fp8Linear, fp8_step
from model.layers import MLP

CFG = Fp8Config(recipe="tensorwise", scaling="delayed", wgrad="recipe")


def build(d: int, fp8: bool) -> MLP:
    torch.manual_seed(0)
    m = MLP(d, 4 * d).cuda().to(torch.bfloat16)
    if fp8:
        m.fc1, m.fc2 = Fp8Linear.from_linear(m.fc1, CFG), Fp8Linear.from_linear(m.fc2, CFG)
    return m


def grads(m: MLP, x: torch.Tensor, dy: torch.Tensor, fuse: bool) -> list[torch.Tensor]:
    fp8_mlp.FUSE = fuse
    x = x.clone().requires_grad_()
    for p in m.parameters():
        p.grad = None
    y = m(x)
    y.backward(dy)
    return [y.detach(), x.grad] + [p.grad for p in m.parameters()]


def check(tokens: int, d: int) -> list[str]:
    chain, fused, ref = build(d, True), build(d, True), build(d, False)
    g = torch.Generator(device="cuda").manual_seed(1)
    names = ["y", "dx", "dW1", "db1", "dW2", "db2"]
    rows = ["| step | " + " | ".join(f"{n}: fused vs chain (max abs diff)" for n in names)
            + " | y: fused vs bf16 (rel. L2) |", "|---" * (len(names) + 2) + "|"]
    for step in range(3):
        x = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16, generator=g)
        dy = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16, generator=g)
        a, b, r = grads(chain, x, dy, False), grads(fused, x, dy, True), grads(ref, x, dy, False)
        diffs = [f"{(u.float() - v.float()).abs().max().item():.1e}" for u, v in zip(a, b)]
        rel = ((b[0].double() - r[0].double()).norm() / r[0].double().norm()).item()
        rows.append(f"| {step} | " + " | ".join(diffs) + f" | {rel:.1e} |")
        fp8_step()
    return rows


def timings(tokens: int, d: int, rounds: int) -> list[str]:
    x = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16)
    arms = {"bf16 MLP": (build(d, False), False), "FP8 chain (Fp8Linear, nn.GELU, Fp8Linear)": (build(d, True), False),
            "FP8 fused GELU casts": (build(d, True), True)}

    def step(m: MLP, fuse: bool):
        def f():
            fp8_mlp.FUSE = fuse
            x.grad = None
            for p in m.parameters():
                p.grad = None
            m(x).backward(dy)
            fp8_step()
        return f

    times: dict[str, list[float]] = {a: [] for a in arms}
    for _ in range(rounds):
        for a, (m, fuse) in arms.items():
            times[a].append(float(triton.testing.do_bench(step(m, fuse), warmup=25, rep=200, return_mode="median")))
    print("rounds (ms): " + "; ".join(f"{a} {[round(t, 3) for t in ts]}" for a, ts in times.items()), flush=True)
    med = {a: statistics.median(ts) for a, ts in times.items()}
    base, chain = med["bf16 MLP"], med["FP8 chain (Fp8Linear, nn.GELU, Fp8Linear)"]
    flops = 3 * 2 * 2 * tokens * d * 4 * d
    rows = [f"### MLP {tokens}x{d} -> {4 * d} -> {d} (GELU), bf16, forward+backward, medians of {rounds} rounds", "",
            "| arm | ms | TFLOP/s (GEMMs) | vs bf16 MLP | vs FP8 chain |", "|---|---|---|---|---|"]
    for a, t in med.items():
        rows.append(f"| {a} | {t:.3f} | {flops / t / 1e9:.0f} | {base / t:.2f}x | {chain / t:.2f}x |")
    return rows


def casts(tokens: int, hidden: int = 4096) -> list[str]:
    """The [tokens, hidden] casts of the MLP alone (delayed scaling with history, both layouts): plain, with the
    GELU, with the GELU's backward (+ column sums), at several tiles; torch's GELU and its backward, and a copy."""
    from kernels import mx
    from kernels import mx_triton_tensorwise as tw

    u = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    dh = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    hist = mx.new_amax_history(4, "cuda")[0]
    hist[0] = (0 << 31) | int(torch.tensor(8.0).view(torch.int32))  # step 0 recorded: step 1 has history

    def bench(fn) -> float:
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))

    copy = bench(lambda: u.clone())
    rows = [f"### casts of {tokens}x{hidden} bf16, both layouts, delayed scaling with history; copy {copy:.3f} ms", "",
            "| cast | tiles (rows, cols, warps) | ms | vs copy |", "|---|---|---|---|"]
    rows.append(f"| torch F.gelu (bf16 out) | | {bench(lambda: torch.nn.functional.gelu(u)):.3f} | |")
    rows.append(f"| torch gelu_backward (bf16 out) | | {bench(lambda: torch.ops.aten.gelu_backward(dh, u)):.3f} | |")
    for label, fmt, act, sums in (("plain e4m3", "e4m3", 0, False), ("gelu e4m3", "e4m3", 1, False),
                                  ("plain e5m2 + sums", "e5m2", 0, True), ("gelu_backward e5m2 + sums", "e5m2", 2, True)):
        x = dh if act == 2 else u
        for tiles in ((32, 128, 4), (64, 64, 4), (32, 128, 8), (16, 128, 8), (32, 64, 8), (64, 64, 8)):
            def f(x=x, fmt=fmt, act=act, sums=sums, tiles=tiles):
                return tw.quantize_tensorwise(x, True, True, fmt, tiles=tiles, col_sums=sums, history=hist, step=1,
                                              window=4, use_history=True, act=act, act_input=u if act == 2 else None)
            t = bench(f)
            rows.append(f"| {label} | {tiles} | {t:.3f} | {copy / t * (6 if act == 2 else 4) / 4:.0%} |")
            print(rows[-1], flush=True)
    return rows


def main(argv: list[str]) -> None:
    if argv and argv[0] == "casts":
        pos = [int(a) for a in argv[1:] if a.isdigit()]
        print("\n".join(casts(pos[0] if pos else 65536)), flush=True)
        return
    kw = dict(a.split("=", 1) for a in argv if "=" in a)
    pos = [int(a) for a in argv if a.isdigit()]
    tokens, d, rounds = (pos[0] if pos else 65536), int(kw.get("d", 1024)), int(kw.get("rounds", 3))
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    print("\n".join(check(4096, d)), flush=True)
    print("\n".join(timings(tokens, d, rounds)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
