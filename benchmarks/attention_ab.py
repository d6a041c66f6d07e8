"""A/B of attention kernels in one process: this tree's against older copies of kernel modules, alternating.

    python benchmarks/attention_ab.py DIR [calls=5] [rounds=4] [cases=A,window] [pass=bwd|fwd] [base:NAME=VALUE ...]

``DIR`` holds older versions of files of ``kernels/`` (for example ``git show OLD:kernels/attention_triton_bwd.py
> DIR/attention_triton_bwd.py``); each is loaded as a module of its own beside the current package (its imports
of other ``kernels`` modules resolve to this tree's), and every Triton kernel it defines under a name the op
modules use replaces that kernel in the "base" arm. Each case times the backward alone (``torch.autograd.grad``
on one forward's graph, ``calls`` back-to-back calls per CUDA-event timing) in ``rounds`` alternating rounds
of base and new, after checking that both arms give the same gradients (relative L2 difference); ``pass=fwd``
times the forward alone instead (no autograd graph) and compares the outputs. The arms take
turns going first (base-new, then new-base, ...): with identical kernels in both arms, the second arm of each
round measured up to 3% slower on an H200 (batch A non-causal), an order effect this cancels over even rounds.
``cases`` keeps the cases whose names contain one of its parts. ``DIR`` may be ``-`` (no kernel swapped).
``base:NAME=VALUE`` sets the op modules' setting ``NAME`` (for example ``base:FOLD_STATS=False``) to the
Python literal ``VALUE`` in the base arm only.
"""

from __future__ import annotations

import ast
import importlib.util
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: `benchmarks` importable
from benchmarks.attention import BATCHES, cuda_time, lengths, offsets_of  # noqa: E402
from kernels import attention_op, attention_window_op, jagged_attention, triton_launch  # noqa: E402

OP_MODULES = (attention_op, attention_window_op)


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"kernels_base_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _is_kernel(obj) -> bool:
    return isinstance(obj, triton.runtime.KernelInterface)


def base_swaps(base_dir: Path) -> list[tuple[ModuleType, str, object, object]]:
    """(op module, name, new kernel, base kernel) for each kernel of ``base_dir``'s modules the op modules use."""
    swaps = []
    for path in sorted(base_dir.glob("*.py")):
        base = _load(path)
        for module in OP_MODULES:
            for name, new in vars(module).items():
                old = getattr(base, name, None)
                if _is_kernel(new) and _is_kernel(old) and old is not new:
                    swaps.append((module, name, new, old))
    return swaps


class Arms:
    """Switches the op modules between the new kernels and the base ones. A base kernel is launched with the
    keyword arguments of its own signature only (a new kernel may take more)."""

    def __init__(self, swaps: list[tuple[ModuleType, str, object, object]], settings: dict[str, object]):
        self.swaps = swaps
        # (module, name, new value, base value) of each op-module setting the base arm changes
        self.settings = []
        for name, value in settings.items():
            owners = [m for m in OP_MODULES if hasattr(m, name)]
            if not owners:
                sys.exit(f"base:{name}: no such setting in {', '.join(m.__name__ for m in OP_MODULES)}")
            self.settings += [(m, name, getattr(m, name), value) for m in owners]
        self.base_fns = {id(old) for *_, old in swaps}
        real_run = triton_launch.run

        def run(fn, grid, *args, **kwargs):
            if id(fn) in self.base_fns:
                kwargs = {k: v for k, v in kwargs.items() if k in fn.arg_names or k.startswith("num_")}
            return real_run(fn, grid, *args, **kwargs)

        self.launch = SimpleNamespace(run=run)

    def use(self, arm: str) -> None:
        for module, name, new, old in self.swaps + self.settings:
            setattr(module, name, old if arm == "base" else new)
        attention_window_op.triton_launch = self.launch if arm == "base" else triton_launch


def _cases() -> dict[str, Callable[[], tuple]]:
    def batch_a(causal: bool, activation: str = "softmax"):
        B, max_len, H, D = BATCHES["A"]
        offs = offsets_of(lengths(B, max_len))
        n = int(offs[-1])
        return n, H, D, offs, dict(causal=causal, activation=activation, max_kv_len=max_len)

    def window(L: int):
        n, H, D = 1 << 17, 8, 128
        offs = offsets_of(torch.full((n // L,), L, dtype=torch.int64))
        return n, H, D, offs, dict(causal=True, window=256, max_kv_len=L)

    return {"A causal softmax": lambda: batch_a(True), "A non-causal softmax": lambda: batch_a(False),
            "A causal silu": lambda: batch_a(True, "silu"), "window W=256, L=4096": lambda: window(4096)}


def _time_forward(name: str, arms: Arms, qkv: tuple, offs, kw: dict, rounds: int, calls: int) -> str:
    """One table row: the forward alone in both arms, alternating, after comparing their outputs."""
    q, k, v = (t.detach() for t in qkv)
    outs, times = {}, {"base": [], "new": []}
    with torch.no_grad():
        for arm in ("base", "new"):
            arms.use(arm)
            outs[arm] = jagged_attention(q, k, v, offs, offs, **kw).float()
        diff = float((outs["base"] - outs["new"]).norm() / outs["new"].norm())
        for r in range(rounds):
            for arm in ("base", "new") if r % 2 == 0 else ("new", "base"):
                arms.use(arm)
                times[arm].append(cuda_time(lambda: jagged_attention(q, k, v, offs, offs, **kw), calls=calls))
    b, m = statistics.median(times["base"]), statistics.median(times["new"])
    return (f"| {name} | {b:.3f} ({' / '.join(f'{t:.3f}' for t in times['base'])}) | "
            f"{m:.3f} ({' / '.join(f'{t:.3f}' for t in times['new'])}) | {b / m:.2f}x | {diff:.1e} |")


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        sys.exit(__doc__)
    if not torch.cuda.is_available():
        sys.exit("attention_ab.py times kernels on a GPU: no CUDA device here")
    opts = dict(a.split("=", 1) for a in argv[1:])
    calls, rounds = int(opts.get("calls", 5)), int(opts.get("rounds", 4))
    settings = {k[len("base:"):]: ast.literal_eval(v) for k, v in opts.items() if k.startswith("base:")}
    arms = Arms([] if argv[0] == "-" else base_swaps(Path(argv[0])), settings)
    print("base kernels:", ", ".join(f"{m.__name__}.{n}" for m, n, *_ in arms.swaps) or "none", flush=True)
    print("base settings:", ", ".join(f"{m.__name__}.{n}={v!r}" for m, n, _, v in arms.settings) or "none",
          flush=True)
    fwd = opts.get("pass", "bwd") == "fwd"
    what = "fwd" if fwd else "bwd"
    rows = [f"| case | base {what} ms (rounds) | new {what} ms (rounds) | base / new | "
            f"{'out' if fwd else 'grad'} rel diff |", "|---|---|---|---|---|"]
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, make in _cases().items():
        if not any(part in name for part in opts.get("cases", name).split(",")):
            continue
        n, H, D, offs, kw = make()
        q, k, v, do = (torch.randn(n, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        if fwd:
            rows.append(_time_forward(name, arms, (q, k, v), offs, kw, rounds, calls))
            print(rows[-1], flush=True)
            continue
        graphs, grads = {}, {}
        for arm in ("base", "new"):
            arms.use(arm)
            out = jagged_attention(q, k, v, offs, offs, **kw)
            graphs[arm] = out
            grads[arm] = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
        diff = max(float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(grads["base"], grads["new"]))
        times = {"base": [], "new": []}
        for r in range(rounds):
            for arm in ("base", "new") if r % 2 == 0 else ("new", "base"):
                arms.use(arm)
                out = graphs[arm]
                leaves = (q, k, v)
                times[arm].append(cuda_time(lambda out=out, leaves=leaves, do=do: torch.autograd.grad(
                    out, leaves, do, retain_graph=True), calls=calls))
        b, m = statistics.median(times["base"]), statistics.median(times["new"])
        rows.append(f"| {name} | {b:.3f} ({' / '.join(f'{t:.3f}' for t in times['base'])}) | "
                    f"{m:.3f} ({' / '.join(f'{t:.3f}' for t in times['new'])}) | {b / m:.2f}x | {diff:.1e} |")
        print(rows[-1], flush=True)
        del graphs, grads
    arms.use("new")
    print("\n".join(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
