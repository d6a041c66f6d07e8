"""Both-layouts block casts on the GPU: tile shapes of the one-read kernel, and two launches, in one run.

    PYTHONPATH=. python benchmarks/quant_both.py            # 65536x4096 bf16, 1x128 (fp32 scales) and MX (E8M0)

``kernels.mx_triton.quantize(x, block, ..., row=True, col=True)`` writes x's codes in both layouts (rows blocked
along the columns, and the transposed layout blocked along the rows) from one read of x; "two launches" is the rows
cast and the columns cast apart (two reads, each with its shipped tiles), as ``kernels.mx.quantize_1x128_both``
does. Each configuration is checked bit for bit against the PyTorch reference (``kernels.mx``'s
``mx_quantize_ref`` / ``quantize_1x128_ref`` of both layouts, on x with a NaN, an Inf and a -Inf block planted),
then timed (median of ``triton.testing.do_bench``); bandwidth counts x read once plus the bytes written (not the
column sums of the dY cast's rows), against a device copy of x in the same run. A tile is (rows, cols, warps[,
register cap (0: none)[, tiles per program[, along rows]]]), as in ``kernels.mx_triton.TILES``, or
``Interleaved(warps)``: the cast of ``kernels.mx_triton_interleaved`` (rows read in fours, transposed codes packed
into words in registers).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import mx, mx_triton  # noqa: E402

SHAPE = (65536, 4096)
# one-read tiles tried after the shipped ones: rows = the block transposes the codes (one column block per tile),
# more rows transpose the fp32 tile (longer runs of each column's transposed codes)
TILES = {
    128: [(128, 128, 4), (128, 128, 8), (128, 128, 8, 112), (128, 128, 8, 128, 2), (128, 128, 8, 128, 8),
          (128, 128, 8, 96), (128, 128, 8, 80), (128, 128, 4, 128), (128, 128, 8, 128, 4, 1), (128, 256, 8),
          (128, 256, 8, 168), (128, 256, 16, 96)],
    32: [(32, 128, 2), (32, 128, 2, 0, 8), (32, 128, 2, 144, 8), (32, 128, 2, 192, 8), (32, 128, 2, 160, 4),
         (32, 128, 2, 160, 16), (32, 256, 4), (32, 256, 2, 0, 8), (64, 128, 4)],
}
# rows read in fours (kernels.mx_triton_interleaved), tried for both layouts and with column sums
for _block, _warps in ((128, (4, 8)), (32, (1, 2, 4))):
    TILES[_block] += [mx_triton.Interleaved(w) for w in _warps]
SUMS_TILES = {128: [mx_triton.Interleaved(4), mx_triton.Interleaved(8), (128, 128, 4), (128, 128, 8)],
              32: [(32, 128, 1), mx_triton.Interleaved(1), mx_triton.Interleaved(2)]}


def _bench(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _reference(block: int, x: torch.Tensor) -> list[torch.Tensor]:
    """Codes and scales of both layouts from the PyTorch reference, as ``_bits`` of (q, s, qt, st)."""
    ref = mx.mx_quantize_ref if block == 32 else mx.quantize_1x128_ref
    rows, cols = ref(x, 1), ref(x, 0)
    return [_bits(t) for t in (rows.data, rows.scale, cols.data, cols.scale)]


def _calls(block: int, x: torch.Tensor) -> list[tuple[str, object]]:
    e8m0 = block == 32
    shipped = mx_triton.TILES[(block, "both")]
    calls = [(f"one read {t}{' (shipped)' if t == shipped else ''}",
              lambda t=t: mx_triton.quantize(x, block, e8m0, True, True, tiles=t))
             for t in [shipped] + [t for t in TILES[block] if t != shipped]]
    calls.append(("two launches", lambda: (mx_triton.quantize(x, block, e8m0, True, False)[0],
                                           mx_triton.quantize(x, block, e8m0, False, True)[1])))
    sums = mx_triton.TILES[(block, "both+sums")]
    calls.append((f"+ column sums {sums} (shipped)", lambda: mx_triton.quantize(x, block, e8m0, True, True,
                                                                                 col_sums=True)[:2]))
    for t in SUMS_TILES[block]:
        if t == sums:
            continue
        for f32 in (False, True) if isinstance(t, tuple) else (False,):
            # the dY cast: column sums from the same read, a one-read tile kept 16-bit or widened on load
            calls.append((f"+ column sums {t}" + (f", {'fp32' if f32 else '16-bit'} tile" if isinstance(t, tuple) else ""),
                          lambda t=t, f32=f32: _with_sums(x, block, e8m0, t, f32)))
    return calls


def _with_sums(x: torch.Tensor, block: int, e8m0: bool, tiles, f32: bool):
    saved, mx_triton.WIDEN_WITH_SUMS = mx_triton.WIDEN_WITH_SUMS, f32
    try:
        return mx_triton.quantize(x, block, e8m0, True, True, tiles=tiles, col_sums=True)[:2]
    finally:
        mx_triton.WIDEN_WITH_SUMS = saved


def main(argv: list[str]) -> None:
    if argv:  # no options: -h / --help and anything else print the usage
        sys.exit(__doc__)
    if not torch.cuda.is_available():
        sys.exit("quant_both.py times kernels on the GPU: run it on a CUDA machine")
    torch.manual_seed(0)
    x = torch.randn(*SHAPE, device="cuda", dtype=torch.bfloat16)
    # non-finite blocks take the NaN code and scale: one of each kind, in both layouts' blocks
    x[5, 300], x[1000, 7], x[4000, 4095] = float("nan"), float("inf"), float("-inf")
    copy_ms = _bench(lambda: x.clone())
    copy_tbps = 2 * x.numel() * 2 / copy_ms / 1e9
    print(f"### both-layouts casts, {SHAPE[0]}x{SHAPE[1]} bf16; copy {copy_ms:.3f} ms, {copy_tbps:.2f} TB/s "
          "(read + write)\n")
    print("| block | configuration | ms | TB/s | % of copy | shipped one-read / this | reference's codes |")
    print("|---|---|---|---|---|---|---|")
    for block in TILES:
        written = 2 * (x.numel() + x.numel() // block * (1 if block == 32 else 4))
        nbytes = x.numel() * 2 + written
        base_ms = None
        ref = _reference(block, x)
        for label, call in _calls(block, x):
            try:
                (q, s, _), (qt, st, _) = call()
                got = [_bits(t) for t in (q, s, qt, st)]
                ms = _bench(call)
            except Exception as e:  # one configuration that does not compile must not hide the others
                print(f"| {block} | {label} | ERROR {type(e).__name__}: {str(e)[:200]} |", flush=True)
                continue
            base_ms = base_ms or ms
            same = all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, ref))
            tbps = nbytes / ms / 1e9
            print(f"| {block} | {label} | {ms:.3f} | {tbps:.2f} | {100 * tbps / copy_tbps:.0f}% | "
                  f"{base_ms / ms:.2f}x | {same} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
