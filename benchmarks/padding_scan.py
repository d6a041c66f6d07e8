"""Speed of the padding report's length scan on the gem_medium layout, on one core.

Writes synthetic gem_medium Parquet (ingest.synth.write_synthetic), then scans the history lengths
three ways in one run and prints one table (best of --repeat, page cache warm):
- baseline: read the whole `history` column (every field of every event) and take the list lengths;
- one leaf: pyarrow's nested projection of the cheapest leaf (the scan's fallback path);
- ours: `ingest.padding_scan.scan_lengths`: that leaf's repetition/definition levels only.
One core: pyarrow's CPU and I/O pools are set to 1 thread (run it under `taskset -c 0` too).
Usage: python benchmarks/padding_scan.py [--rows N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from features import load_schema  # noqa: E402
from ingest.padding_scan import list_parquet_files, scan_lengths  # noqa: E402
from ingest.synth import write_synthetic  # noqa: E402


def baseline(url: str) -> np.ndarray:
    fs, paths = list_parquet_files(url)
    out = []
    for p in paths:
        pf = pq.ParquetFile(p, memory_map=True)
        for rg in range(pf.metadata.num_row_groups):
            col = pf.read_row_group(rg, columns=["history"], use_threads=False).column(0)
            out.append(pc.fill_null(pc.list_value_length(col), 0).to_numpy())
    return np.concatenate(out)


def one_leaf(url: str, leaf: str) -> np.ndarray:
    fs, paths = list_parquet_files(url)
    out = []
    for p in paths:
        pf = pq.ParquetFile(p, memory_map=True)
        for rg in range(pf.metadata.num_row_groups):
            col = pf.read_row_group(rg, columns=[leaf], use_threads=False).column(0)
            out.append(pc.fill_null(pc.list_value_length(col), 0).to_numpy())
    return np.concatenate(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="threads for writing the data (not for the scan)")
    args = ap.parse_args()
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    schema = load_schema(Path(__file__).resolve().parents[1] / "schemas" / "gem_medium.yaml")
    tmp = tempfile.TemporaryDirectory() if args.dir is None else None
    url = args.dir or tmp.name
    if not list(Path(url).glob("*.parquet")):
        t0 = time.perf_counter()
        write_synthetic(schema, url, args.rows, seed=0, files=4, threads=args.threads)
        print(f"wrote {args.rows:,} gem_medium rows in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    size = sum(f.stat().st_size for f in Path(url).glob("*.parquet"))
    scan = scan_lengths(schema, url)  # warm the page cache
    lengths = scan.lengths["history"]
    rows = []
    assert scan.row_groups_by_levels == scan.row_groups, "the level fast path did not read every chunk"
    leaf = scan.leaf["history"]
    for name, fn in (("baseline: read whole history column", lambda: baseline(url)),
                     ("pyarrow: one leaf column (fallback)", lambda: one_leaf(url, leaf)),
                     ("ours: scan_lengths (levels only)", lambda: scan_lengths(schema, url).lengths["history"])):
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            got = fn()
            best = min(best, time.perf_counter() - t0)
        assert np.array_equal(got, lengths), name
        rows.append((name, best, len(got) / best * 60 / 1e6))
    print(f"gem_medium: {len(lengths):,} rows, {scan.row_groups} row groups, mean history {lengths.mean():.0f} events "
          f"(max {lengths.max()}), {size / 2**20:.0f} MiB on disk; one core (pid {os.getpid()}); "
          f"leaf read: {scan.leaf['history']}")
    print(f"{'method':<40} {'seconds':>8} {'Mrows/min':>10} {'speedup':>8}")
    for name, sec, rate in rows:
        print(f"{name:<40} {sec:>8.3f} {rate:>10.1f} {rows[0][1] / sec:>7.1f}x")


if __name__ == "__main__":
    main()
