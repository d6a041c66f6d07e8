"""FP8 attention forward+backward on the GPU (issue 8): the FP8 backward against the bf16 one, in one run.

    python benchmarks/attention_fp8_bwd.py            # batch A (device README), 5 back-to-back calls per timing
    python benchmarks/attention_fp8_bwd.py B calls=1
    python benchmarks/attention_fp8_bwd.py A rows=causal,silu   # only the cases whose label contains a word given
    python benchmarks/attention_fp8_bwd.py A profile            # and each arm's backward kernels, GPU us per call

Three arms per case, on the same bf16 inputs: our bf16 kernels; the FP8 forward with the straight-through
bf16 backward (``fp8_backward=False``); the FP8 forward with the FP8 backward (its score products S = QK^T and
dP = dO V^T on e4m3 codes). Times: forward+backward, and the backward alone (``torch.autograd.grad`` on a
kept graph, dO's quantization included). Correctness first, on the batch's first ``ERR_ROWS`` rows (the
float64 reference of the whole batch's gradients does not fit): the worst relative L2 error of dq, dk, dv
against float64 gradients of unquantized attention, and of the FP8 backward against its float64 emulation
(``kernels.attention_fp8.jagged_attention_fp8_bwd_ref``).
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attention import cuda_time, fp8_inputs, rel_err  # noqa: E402
from kernels import RelativeBias, jagged_attention  # noqa: E402
from kernels.attention_fp8 import jagged_attention_fp8, jagged_attention_fp8_bwd_ref  # noqa: E402

ERR_ROWS = 12


def _arms(kw: dict) -> dict:
    """name -> call(q, k, v, q_offsets, kv_offsets, **kw) of each arm."""
    return {
        "bf16": lambda *a: jagged_attention(*a, **kw),
        "fp8 fwd, bf16 bwd": lambda *a: jagged_attention_fp8(*a, fp8_backward=False, **kw),
        "fp8 fwd+bwd": lambda *a: jagged_attention_fp8(*a, fp8_backward=True, **kw),
    }


def _grads(fn, q, k, v, qo, ko, do) -> list[torch.Tensor]:
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    return list(torch.autograd.grad(fn(*leaves, qo, ko), leaves, do))


def _errors(kw: dict, q, k, v, qo, ko, do) -> dict:
    """Worst gradient error of each arm against float64, and the FP8 backward's against its emulation."""
    exact_kw = {key: val for key, val in kw.items() if key not in ("max_q_len", "max_kv_len", "impl")}
    bias = exact_kw.get("bias")
    if bias is not None:
        exact_kw["bias"] = RelativeBias(bias.pos_weight.double(), bias.time_weight.double(), bias.q_timestamps,
                                        bias.kv_timestamps)
    exact = _grads(lambda *a: jagged_attention(*a, impl="ref", **exact_kw), q.double(), k.double(), v.double(),
                   qo, ko, do.double())
    grads = {name: _grads(fn, q, k, v, qo, ko, do) for name, fn in _arms(kw).items()}
    errs = {name: max(rel_err(g, e) for g, e in zip(got, exact)) for name, got in grads.items()}
    with torch.no_grad():
        out = jagged_attention_fp8(q, k, v, qo, ko, **kw)
    emu = jagged_attention_fp8_bwd_ref(do, q, k, v, out, qo, ko, **{key: val for key, val in exact_kw.items()
                                                                    if key != "bias"}, bias=bias)
    errs["emulation"] = max(rel_err(g, e) for g, e in zip(grads["fp8 fwd+bwd"], emu[:3]))
    return errs


def _time_arm(fn, q, k, v, qo, ko, do, calls: int) -> tuple[float, float]:
    """(forward+backward ms, backward ms) of one arm."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    step = lambda: torch.autograd.grad(fn(*leaves, qo, ko), leaves, do)
    out = fn(*leaves, qo, ko)
    back = lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)
    return cuda_time(step, calls=calls), cuda_time(back, calls=calls)


def _profile(kw: dict, q, k, v, qo, ko, do, calls: int) -> str:
    """Each arm's backward: GPU time per call of every kernel it launches (the profiler's device time)."""
    from torch.profiler import ProfilerActivity, profile

    lines = []
    for name, fn in _arms(kw).items():
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves, qo, ko)
        torch.autograd.grad(out, leaves, do, retain_graph=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                torch.autograd.grad(out, leaves, do, retain_graph=True)
            torch.cuda.synchronize()
        kernels = sorted(((e.self_device_time_total / calls, e.key) for e in prof.key_averages()
                          if e.self_device_time_total > 0), reverse=True)
        total = sum(us for us, _ in kernels)
        lines.append(f"  {name} backward: {total:.0f} us GPU per call: "
                     + ", ".join(f"{key[:48]} {us:.0f}" for us, key in kernels[:6]))
    return "\n".join(lines)


def _times(kw: dict, q, k, v, qo, ko, do, calls: int) -> dict:
    return {name: _time_arm(fn, q, k, v, qo, ko, do, calls) for name, fn in _arms(kw).items()}


def main(argv: list[str]) -> None:
    if any(a in ("-h", "--help") for a in argv):
        sys.exit(__doc__)
    if not torch.cuda.is_available():
        sys.exit("attention_fp8_bwd.py times the kernels on the GPU: run it on a CUDA machine")
    calls = next((int(a[6:]) for a in argv if a.startswith("calls=")), 5)
    rows = next((a[5:].split(",") for a in argv if a.startswith("rows=")), None)
    profiled = "profile" in argv
    name = next((a for a in argv if not a.startswith(("calls=", "rows=")) and a != "profile"), "A")
    x = fp8_inputs(name)
    B, max_len, H, D, T = x.B, x.max_len, x.H, x.D, x.T
    offs, q, k, v, qc, qo_c, ts = x.offs, x.q, x.k, x.v, x.qc, x.qo_c, x.ts
    do, doc = x.mk(T), x.mk(16 * B)
    bias = RelativeBias(x.pos_w, x.time_w, ts, ts)
    cut, cut_c = int(offs[ERR_ROWS]), 16 * ERR_ROWS
    print(f"### FP8 attention forward+backward, batch {name}: B={B}, max_len={max_len}, H={H}, D={D}, ΣL={T}, "
          f"bf16 inputs, {calls} back-to-back calls per timing; errors on the first {ERR_ROWS} rows\n")
    print("| case | bf16 fwd+bwd ms | fp8 fwd, bf16 bwd | fp8 fwd+bwd | bf16 bwd ms | bf16 bwd (fp8 fwd) | fp8 bwd | "
          "bf16 / fp8 fwd+bwd | bf16 bwd / fp8 bwd | grad err bf16 / fp8 fwd / fp8 fwd+bwd (vs f64) | "
          "fp8 bwd vs emulation |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    cases = [("causal softmax", dict(causal=True)), ("non-causal softmax", dict(causal=False)),
             ("causal softmax + pos/time bias", dict(causal=True, bias=bias)),
             ("causal silu", dict(causal=True, activation="silu")), ("cross attention (Lq=16)", dict(cross=True))]
    for label, kw in cases:
        if rows and not any(word in label for word in rows):
            continue
        kw = dict(kw)
        cross = kw.pop("cross", False)
        qx, dox, qo = (qc, doc, qo_c) if cross else (q, do, offs)
        kw.update(max_q_len=16 if cross else max_len, max_kv_len=max_len)
        sub_q = cut_c if cross else cut
        sub_bias = kw.get("bias")
        sub_kw = dict(kw, bias=RelativeBias(bias.pos_weight, bias.time_weight, ts[:cut], ts[:cut])) if sub_bias else kw
        try:
            errs = _errors(sub_kw, qx[:sub_q], k[:cut], v[:cut], qo[:ERR_ROWS + 1], offs[:ERR_ROWS + 1], dox[:sub_q])
            t = _times(kw, qx, k, v, qo, offs, dox, calls)
        except Exception as e:  # report and go on: one broken case must not hide the others
            where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)[::-1][:6])
            print(f"| {label} | ERROR {type(e).__name__}: {str(e)[:300]} at {where} |", flush=True)
            torch.cuda.empty_cache()
            continue
        bf, f8f, f8 = t["bf16"], t["fp8 fwd, bf16 bwd"], t["fp8 fwd+bwd"]
        print(f"| {label} | {bf[0]:.3f} | {f8f[0]:.3f} | {f8[0]:.3f} | {bf[1]:.3f} | {f8f[1]:.3f} | {f8[1]:.3f} | "
              f"{bf[0] / f8[0]:.2f}x | {bf[1] / f8[1]:.2f}x | {errs['bf16']:.1e} / {errs['fp8 fwd, bf16 bwd']:.1e} / "
              f"{errs['fp8 fwd+bwd']:.1e} | {errs['emulation']:.1e} |", flush=True)
        if profiled:
            print(_profile(kw, qx, k, v, qo, offs, dox, calls), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
