"""Element encoding of the FP8 cast kernels: the exact integer encoder (``kernels.mx_triton._encode_e4m3_int`` /
``_encode_e5m2_int``, what the kernels run under the interpreter) against the GPU's conversion instruction
(``.to(tl.float8e4nv)``, round to nearest even, what they run on the GPU), on one streaming pass over a bf16
tensor (scale, clamp, encode, store one byte per element).

    PYTHONPATH=. python benchmarks/fp8_encode.py [--rows 65536] [--cols 4096]

Three variants of the same kernel: ``floor`` (no encoding: the byte is a plain integer truncation, the memory
cost alone), ``integer`` (the interpreter's encoder) and ``hardware`` (the GPU's). First both encoders' codes are
compared bit for bit with torch's own conversion (round to nearest even) on values that reach every e4m3 /
e5m2 case: normals, subnormals, ties, the clamp bounds, zeros. Under ``TRITON_INTERPRET=1`` the
interpreter's fp8 conversion rounds subnormal ties wrongly, so only the integer rows hold there. Then each
variant is timed (CUDA-event median) with its GB/s and the ratio
integer / hardware. Whether the cast passes are bound by the encoder's arithmetic or by memory is what the
floor and hardware rows tell.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels.mx_triton import _encode_e4m3_int, _encode_e5m2_int  # noqa: E402

MODES = {"floor": 0, "integer": 1, "hardware": 2}
FORMATS = {"e4m3": (False, 448.0), "e5m2": (True, 57344.0)}


@triton.jit
def _encode_kernel(x_ptr, q_ptr, n, inv, MODE: tl.constexpr, E5M2: tl.constexpr, FMAX: tl.constexpr,
                   BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    y = tl.minimum(tl.maximum(x * inv, -FMAX), FMAX)
    if MODE == 0:
        code = y.to(tl.int32).to(tl.uint8)
    elif MODE == 1:
        if E5M2:
            code = _encode_e5m2_int(y).to(tl.uint8)
        else:
            code = _encode_e4m3_int(y).to(tl.uint8)
    else:
        if E5M2:
            code = y.to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
        else:
            code = y.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    tl.store(q_ptr + offs, code, mask=ok)


def encode(x: torch.Tensor, mode: str, fmt: str, inv: float = 1.0, block: int = 2048) -> torch.Tensor:
    e5m2, fmax = FORMATS[fmt]
    q = torch.empty(x.numel(), dtype=torch.uint8, device=x.device)
    grid = (triton.cdiv(x.numel(), block),)
    _encode_kernel[grid](x.reshape(-1), q, x.numel(), inv, MODE=MODES[mode], E5M2=e5m2, FMAX=fmax, BLOCK=block)
    return q


def probe_values(fmt: str, device: str) -> torch.Tensor:
    """fp32 values that reach every case of the encoder: every code's value and the midpoints between
    neighbouring codes (ties), each nudged one ulp down and up, both signs, the clamp bounds and zeros."""
    dt = torch.float8_e5m2 if fmt == "e5m2" else torch.float8_e4m3fn
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dt).float()
    grid = codes[torch.isfinite(codes) & (codes >= 0)].unique().sort().values
    mids = (grid[:-1] + grid[1:]) / 2
    base = torch.cat([grid, mids])
    ulp_dn = torch.nextafter(base, torch.tensor(-1.0))
    ulp_up = torch.nextafter(base, torch.tensor(float("inf")))
    vals = torch.cat([base, ulp_dn, ulp_up, torch.tensor([0.0, -0.0, 1e-30, FORMATS[fmt][1] * 2])])
    return torch.cat([vals, -vals]).to(device)


def cuda_ms(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--cols", type=int, default=4096)
    args = ap.parse_args(argv)
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    print("| format | values | count | integer == torch | hardware == torch |\n|---|---|---|---|---|")
    for fmt in FORMATS:
        dt = torch.float8_e5m2 if fmt == "e5m2" else torch.float8_e4m3fn
        fmax = FORMATS[fmt][1]
        r = torch.randn(1 << 16, device=device) * torch.exp2(torch.randint(-24, 16, (1 << 16,), device=device).float())
        for name, v in (("every code, tie and clamp bound (+-1 ulp)", probe_values(fmt, device)),
                        ("random, exponents 2^-24..2^15", r)):
            ref = v.clamp(-fmax, fmax).to(dt).view(torch.uint8)  # torch's conversion: round to nearest even
            same = [torch.equal(encode(v, m, fmt), ref) for m in ("integer", "hardware")]
            print(f"| {fmt} | {name} | {v.numel()} | {same[0]} | {same[1]} |")
    if not gpu:
        return 0
    x = torch.randn(args.rows, args.cols, device="cuda", dtype=torch.bfloat16)
    copy_ms = cuda_ms(lambda: x.clone())
    nbytes = x.numel() * 3  # bf16 read + one byte written
    print(f"\n{args.rows}x{args.cols} bf16 -> one byte per element; copy of x: {copy_ms:.3f} ms "
          f"({2 * x.numel() * 2 / copy_ms / 1e9:.0f} GB/s)\n")
    print("| format | variant | ms | GB/s | integer / this |\n|---|---|---|---|---|")
    for fmt in FORMATS:
        ms = {m: cuda_ms(lambda m=m, f=fmt: encode(x, m, f, inv=0.5)) for m in MODES}
        for m, t in ms.items():
            print(f"| {fmt} | {m} | {t:.3f} | {nbytes / t / 1e6:.0f} | {ms['integer'] / t:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
