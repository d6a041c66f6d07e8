"""Loader throughput on CPU: raw Parquet decode vs our loader vs a naive padded Dataset; one table.

    python benchmarks/loader.py [--rows 8192] [--data /tmp/gemtrain-bench/gem_medium] [--s3]

On `gem_medium` synthetic data (generated once into --data), one rank, all rows:

- (a) `pyarrow.parquet.ParquetFile.iter_batches` on the schema's columns: the decode ceiling, with
  the loader's own reader settings (`ingest.reader.LOCAL_READ_OPTIONS`: page checksums verified,
  no pre-buffering; record batches of --batch rows, the loader's decode chunk) at 1 thread and
  with Arrow's thread pool; and for reference without the checksum verification;
- (b) `ingest.Loader` to `JaggedBatch` (no shuffle, and with the shuffle buffer) at 1 and 2 threads,
  and inline (`num_threads=0`: reading, batching and conversion in the consuming thread);
- (c) the naive padded baseline of the issue: a torch `Dataset` whose `__getitem__` returns one row,
  batched by a `DataLoader` whose `collate_fn` pads every history field to `[B, L]`, L = the batch's
  longest history or the schema's max_length. Two ways to get a row: (c1) the row as Python objects
  (`Table.slice(i, 1).to_pylist()`, then tensors), on --naive-rows / 2 rows; (c2) a stronger variant
  that cuts the row's fields as numpy slices out of the table decoded up front (`pq.read_table`,
  Arrow's defaults), on --naive-rows rows. Rates are per row all the same;
- (b) again with the files on a local moto S3 server (--s3; a separate process), at 1 and 2 threads.

Runs are interleaved and repeated (--repeats); each row reports the median run (and the range of
rows/s), so a machine shared with other work penalises every configuration alike. Run it pinned
(`taskset -c 1`) for the one-core figure, and unpinned.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import torch

from features import load_schema
from ingest.loader import Loader, LoaderConfig
from ingest.reader import LOCAL_READ_OPTIONS

REPO = Path(__file__).resolve().parents[1]
A1 = "(a) iter_batches, same reader settings, 1 thread"
B1 = "(b) Loader -> JaggedBatch, 1 thread"
B2 = "(b) Loader -> JaggedBatch, 2 threads"
C1 = "(c1) Dataset of Python rows, pad to batch max"
C2 = "(c2) Dataset of Arrow row slices, pad to batch max"
S1 = "(b) Loader, 1 thread, S3 (moto)"
S2 = "(b) Loader, 2 threads, S3 (moto)"


def _files(data: Path) -> list[str]:
    return sorted(str(p) for p in data.glob("*.parquet"))


def raw_decode(files: list[str], columns: list[str], batch: int, threads: bool, verify: bool = True) -> tuple[int, int]:
    opts = {**LOCAL_READ_OPTIONS, "page_checksum_verification": verify}
    rows = events = 0
    for f in files:
        for rb in pq.ParquetFile(f, **opts).iter_batches(batch_size=batch, columns=columns, use_threads=threads):
            offs = rb.column("history").offsets
            rows += rb.num_rows
            events += offs[-1].as_py() - offs[0].as_py()
    return rows, events


def ours(schema, url: str, batch: int, threads: int, shuffle: bool, storage_options=None) -> tuple[int, int]:
    cfg = LoaderConfig(url=url, batch_size=batch, shuffle=shuffle, num_threads=threads, prefetch=2,
                       shuffle_buffer_rows=2048, storage_options=storage_options or {})
    rows = events = 0
    for b in Loader(schema, cfg):
        rows += b.batch_size
        events += int(b.seq_offsets["history"][-1])
    return rows, events


class RowDataset(torch.utils.data.Dataset):
    """The naive way: one row at a time out of a decoded table, every field a small tensor."""

    def __init__(self, schema, files: list[str], rows: int):
        import pyarrow as pa

        tables, n = [], 0
        for f in files:
            tables.append(pq.read_table(f, columns=schema.column_names()))
            n += tables[-1].num_rows
            if n >= rows:
                break
        self.table = pa.concat_tables(tables).slice(0, rows)
        self.schema = schema
        self.seq = schema.sequence("history")

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        events = self.table.column("history")[i].values  # this row's struct array
        item = {f.name: torch.from_numpy(events.field(f.name).to_numpy(zero_copy_only=False)[-self.seq.max_length:])
                for f in self.seq.fields}
        for f in self.schema.features:
            v = self.table.column(f.name)[i].as_py()
            item[f.name] = torch.as_tensor(v if v is not None else 0)
        for label in self.schema.labels:
            item[label.name] = torch.as_tensor(self.table.column(label.name)[i].as_py())
        return item


class PyRowDataset(RowDataset):
    """The most common naive way: each row converted to Python objects (`to_pylist`), then tensors."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.table.slice(i, 1).to_pylist()[0]
        events = (row["history"] or [])[-self.seq.max_length:]
        item = {f.name: torch.tensor([e[f.name] for e in events],
                                     dtype=torch.float32 if f.type == "float" else torch.int64)
                for f in self.seq.fields}
        for f in self.schema.features:
            item[f.name] = torch.as_tensor(row[f.name] if row[f.name] is not None else 0)
        for label in self.schema.labels:
            item[label.name] = torch.as_tensor(row[label.name])
        return item


def padded_collate(items: list[dict[str, torch.Tensor]], jagged: tuple[str, ...],
                   pad_to: int | None, history: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Stacks rows; each variable-length field becomes `[B, L]`, L = the batch max, or `pad_to` for
    the history fields (other lists, e.g. interests, always pad to the batch max)."""
    out = {}
    for k in items[0]:
        ts = [it[k] for it in items]
        if k in jagged:
            width = (pad_to if k in history else None) or max(int(t.numel()) for t in ts)
            box = torch.zeros((len(ts), width), dtype=ts[0].dtype)
            for i, t in enumerate(ts):
                box[i, : t.numel()] = t
            out[k] = box
        else:
            out[k] = torch.stack(ts)
    out["lengths"] = torch.tensor([len(it["ts"]) for it in items])
    return out


def naive(schema, files: list[str], batch: int, rows: int, pad_to_schema_max: bool,
          python_rows: bool = False) -> tuple[int, int]:
    import functools

    ds = (PyRowDataset if python_rows else RowDataset)(schema, files, rows)
    seq = schema.sequence("history")
    jagged = tuple(f.name for f in seq.fields) + tuple(f.name for f in schema.features if f.type == "id_list")
    collate = functools.partial(padded_collate, jagged=jagged, history=tuple(f.name for f in seq.fields),
                                pad_to=seq.max_length if pad_to_schema_max else None)
    n = events = 0
    for b in torch.utils.data.DataLoader(ds, batch_size=batch, collate_fn=collate, num_workers=0):
        n += int(b["lengths"].numel())
        events += int(b["lengths"].sum())
    return n, events


def _s3_copy(files: list[str]):
    """Starts a moto S3 server in a process of its own (so its request handling shares neither the
    GIL nor the CPU accounting of the loader) and uploads the files; returns (url, storage_options, stop)."""
    import socket
    import subprocess
    import sys

    import s3fs

    for k, v in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(k, v)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", "from moto.server import main; main()", "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    so = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
    for _ in range(200):  # up to 20 s for the server to listen
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.1)
    fs = s3fs.S3FileSystem(**so)
    fs.mkdir("bench-data")
    for f in files:
        fs.put(f, f"bench-data/gem_medium/{Path(f).name}")

    def stop() -> None:
        server.terminate()
        server.wait(timeout=10)

    return "s3://bench-data/gem_medium", so, stop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="/tmp/gemtrain-bench/gem_medium")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--row-group-rows", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--naive-rows", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--s3", action="store_true", help="also time the loader against a local moto S3 server")
    args = ap.parse_args()

    schema = load_schema(REPO / "schemas" / "gem_medium.yaml")
    data = Path(args.data)
    if len(_files(data)) != args.files:
        from ingest.synth import write_synthetic

        data.mkdir(parents=True, exist_ok=True)
        write_synthetic(schema, str(data), args.rows, seed=0, files=args.files, row_group_rows=args.row_group_rows)
    files = _files(data)
    size_mb = sum(os.path.getsize(f) for f in files) / 1e6
    cols = schema.column_names()
    b = args.batch

    half = args.naive_rows // 2
    runs: dict[str, Callable[[], tuple[int, int]]] = {
        A1: lambda: raw_decode(files, cols, b, False),
        "(a) iter_batches, same settings, Arrow pool": lambda: raw_decode(files, cols, b, True),
        "(a) iter_batches, 1 thread, no checksum check": lambda: raw_decode(files, cols, b, False, verify=False),
        "(b) Loader -> JaggedBatch, inline (0 threads)": lambda: ours(schema, str(data), b, 0, False),
        B1: lambda: ours(schema, str(data), b, 1, False),
        B2: lambda: ours(schema, str(data), b, 2, False),
        "(b) Loader, 1 thread, shuffle": lambda: ours(schema, str(data), b, 1, True),
        "(b) Loader, 2 threads, shuffle": lambda: ours(schema, str(data), b, 2, True),
        C1: lambda: naive(schema, files, b, half, False, python_rows=True),
        "(c1) Dataset of Python rows, pad to max_length": lambda: naive(schema, files, b, half, True,
                                                                        python_rows=True),
        C2: lambda: naive(schema, files, b, args.naive_rows, False),
        "(c2) Dataset of Arrow row slices, pad max_length": lambda: naive(schema, files, b, args.naive_rows, True),
    }
    stop = None
    if args.s3:
        url, so, stop = _s3_copy(files)
        runs[S1] = lambda: ours(schema, url, b, 1, False, so)
        runs[S2] = lambda: ours(schema, url, b, 2, False, so)

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)  # all threads of this process
        return r.ru_utime + r.ru_stime

    times: dict[str, list[float]] = {k: [] for k in runs}
    cpus: dict[str, list[float]] = {k: [] for k in runs}
    counts: dict[str, tuple[int, int]] = {}
    raw_decode(files, cols, b, False)  # warm the page cache
    for _ in range(args.repeats):
        for name, fn in runs.items():
            t0, c0 = time.perf_counter(), cpu()
            counts[name] = fn()
            times[name].append(time.perf_counter() - t0)
            cpus[name].append((cpu() - c0) / max(counts[name][0], 1) * 1000)
    if stop is not None:
        stop()

    def rate(name: str) -> float:
        return counts[name][0] / statistics.median(times[name])

    def cpu_ms(name: str) -> float:
        return statistics.median(cpus[name])

    a1, c1, c2 = rate(A1), rate(C1), rate(C2)
    cores = len(os.sched_getaffinity(0))
    print(f"gem_medium: {counts[A1][0]} rows, {len(files)} files, {size_mb:.0f} MB zstd, row groups of "
          f"{args.row_group_rows}, batch {b}; {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs "
          f"({cores} usable), median of {args.repeats}, load average {os.getloadavg()[0]:.1f}")
    print(f"| {'configuration':48s} | {'rows':>5s} | {'rows/s':>6s} | {'range':>11s} | {'Mev/s':>6s} | {'vs (a)':>6s} | "
          f"{'vs (c1)':>7s} | {'vs (c2)':>7s} | {'CPU ms/row':>10s} | {'CPU vs (a)':>10s} |")
    print(f"|{'-' * 50}|{'-' * 7}|{'-' * 8}|{'-' * 13}|{'-' * 8}|{'-' * 8}|{'-' * 9}|{'-' * 9}|{'-' * 12}|{'-' * 12}|")
    for name in runs:
        rows, events = counts[name]
        r = rate(name)
        lo, hi = rows / max(times[name]), rows / min(times[name])
        print(f"| {name:48s} | {rows:5d} | {r:6.0f} | {lo:5.0f}-{hi:<5.0f} | {events / rows * r / 1e6:6.2f} | "
              f"{r / a1:6.2f} | {r / c1:7.1f} | {r / c2:7.1f} | {cpu_ms(name):10.3f} | {cpu_ms(A1) / cpu_ms(name):10.2f} |")
    b1 = rate(B1)
    print(f"targets: (b)/(a) at 1 thread = {b1 / a1:.2f} wall, {cpu_ms(A1) / cpu_ms(B1):.2f} CPU (>= 0.9); "
          f"2 threads / 1 thread = {rate(B2) / b1:.2f}; (b)/(c1) = {b1 / c1:.1f}, (b)/(c2) = {b1 / c2:.1f} (>= 5)")
    if args.s3:
        print(f"S3 (moto) / local: 1 thread {rate(S1) / b1:.2f}, 2 threads {rate(S2) / rate(B2):.2f}")


if __name__ == "__main__":
    main()
