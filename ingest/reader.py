"""Reading Parquet: footers once (in parallel), row groups with retries, checksums and pre-buffering.

Transient storage errors (connection drops, timeouts, 5xx answers surfacing as OSError or botocore
errors) are retried with exponential backoff. Errors that say the bytes themselves are bad
(checksum, corrupt metadata, Arrow invalid data) are not retried: they become `BadFileError`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from features.arrow import check_arrow_schema
from ingest.errors import BadFileError
from ingest.id_stats import ids_in_range
from ingest.listing import FileRef

T = TypeVar("T")

_PERMANENT_MARKERS = ("checksum", "corrupt", "invalid", "must be", "magic bytes", "not a parquet",
                      "couldn't deserialize", "unexpected end", "out of bounds")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0


def _transient(e: BaseException) -> bool:
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    if isinstance(e, pa.ArrowInvalid):
        return False
    msg = str(e).lower()
    if any(m in msg for m in _PERMANENT_MARKERS):
        return False
    if isinstance(e, (OSError, TimeoutError, ConnectionError)):
        return True
    mod = type(e).__module__ or ""
    return mod.startswith(("botocore", "aiobotocore", "aiohttp", "urllib3"))


def with_retries(fn: Callable[[], T], policy: RetryPolicy, on_retry: Callable[[BaseException], None] | None = None) -> T:
    """Calls `fn`, retrying transient storage errors with exponential backoff and jitter."""
    for attempt in range(policy.attempts):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - classified below, re-raised when not transient
            if not _transient(e) or attempt == policy.attempts - 1:
                raise
            if on_retry is not None:
                on_retry(e)
            delay = min(policy.max_delay_s, policy.base_delay_s * 2**attempt)
            time.sleep(delay * (0.5 + random.random()))
    raise AssertionError("unreachable")


# `pq.ParquetFile` options of the local read path (the loader benchmark's decode ceiling uses the
# same): page checksums verified where the file has them, no pre-buffering (local reads are cheap).
LOCAL_READ_OPTIONS = {"pre_buffer": False, "page_checksum_verification": True}


def _open(ref: FileRef, metadata: pq.FileMetaData | None = None) -> pq.ParquetFile:
    """Local files through Arrow's native reader (no Python in the read path, GIL released);
    others through fsspec without its read-ahead cache, with pre-buffering, which coalesces the
    column chunk ranges of a row group into few large reads. The footer is never read again."""
    if isinstance(ref.fs, LocalFileSystem):
        return pq.ParquetFile(ref.path, metadata=metadata, **LOCAL_READ_OPTIONS)
    try:
        source = ref.fs.open(ref.path, "rb", cache_type="none")
    except TypeError:  # a filesystem whose files take no cache options
        source = ref.fs.open(ref.path, "rb")
    return pq.ParquetFile(source, metadata=metadata, pre_buffer=True, page_checksum_verification=True)


@dataclass
class Footer:
    """One file's footer, or why it could not be used."""

    ref: FileRef
    metadata: pq.FileMetaData | None
    row_group_rows: tuple[int, ...] = ()
    error: str | None = None
    rows: int | None = None  # rows in the file when known (a bad file's lost rows)
    ids_in_range: frozenset[str] = frozenset()  # id keys its statistics prove in range (`ingest.id_stats`)


def read_footer(ref: FileRef, expected: pa.Schema, policy: RetryPolicy, require_checksums: bool = False,
                id_leaves: dict | None = None) -> Footer:
    """The footer of `ref`, its row-group sizes, and the check of its schema against `expected`.

    With `id_leaves` (`ingest.id_stats.id_leaves`), also the id keys whose range the file's
    column statistics prove.

    With `require_checksums`, a file written without page checksums is bad too: a flipped bit in it
    could not be detected and would reach training as wrong values."""
    crc: list[bool | None] = [None]

    def load() -> pq.FileMetaData:
        with ref.fs.open(ref.path, "rb") as fh:
            md = pq.ParquetFile(fh).metadata
            if require_checksums:
                from ingest.parquet_levels import first_page_has_crc

                crc[0] = first_page_has_crc(fh, md)
            return md

    try:
        md = with_retries(load, policy)
    except Exception as e:  # noqa: BLE001 - any failure makes the file bad; the reason is kept
        return Footer(ref, None, error=f"cannot read the Parquet footer: {type(e).__name__}: {e}")
    rows = tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))
    try:
        found = md.schema.to_arrow_schema()
    except Exception as e:  # noqa: BLE001
        return Footer(ref, None, rows, error=f"cannot map the Parquet schema to Arrow: {e}", rows=md.num_rows)
    problems = check_arrow_schema(expected, found)
    if problems:
        return Footer(ref, None, rows, rows=md.num_rows,
                      error="schema mismatch: " + "; ".join(str(p) for p in problems[:5])
                      + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""))
    if require_checksums and crc[0] is False:
        return Footer(ref, None, rows, rows=md.num_rows,
                      error="written without page checksums, so corruption in it cannot be detected "
                            "(rewrite it with page checksums, e.g. pyarrow write_page_checksum=True, "
                            "or set the loader's require_page_checksums: false)")
    proven = ids_in_range(md, id_leaves) if id_leaves else frozenset()
    return Footer(ref, md, rows, rows=md.num_rows, ids_in_range=proven)


def read_footers(refs: list[FileRef], expected: pa.Schema, policy: RetryPolicy, threads: int = 16,
                 require_checksums: bool = False, id_leaves: dict | None = None) -> list[Footer]:
    """Footers of all files, fetched in parallel, in the order of `refs`."""
    def one(r: FileRef) -> Footer:
        return read_footer(r, expected, policy, require_checksums, id_leaves)

    if len(refs) <= 1:
        return [one(r) for r in refs]
    with ThreadPoolExecutor(max_workers=min(threads, len(refs))) as ex:
        return list(ex.map(one, refs))


def read_row_group(ref: FileRef, metadata: pq.FileMetaData, row_group: int, columns: list[str],
                   policy: RetryPolicy, on_retry: Callable[[BaseException], None] | None = None,
                   chunk_rows: int = 1024) -> pa.Table:
    """One row group (projected to `columns`), as chunks of at most `chunk_rows` rows.

    Decoding in chunks keeps the decode buffers small enough for the allocator to reuse them
    (one big buffer per row group costs fresh pages, i.e. page faults, every time).
    Raises BadFileError when the row group cannot be read.
    """
    def load() -> pa.Table:
        pf = _open(ref, metadata)
        try:
            batches = list(pf.iter_batches(batch_size=chunk_rows, row_groups=[row_group], columns=columns,
                                           use_threads=False))
            if not batches:
                return pf.schema_arrow.empty_table().select(columns)
            return pa.Table.from_batches(batches)
        finally:
            pf.close(force=True)

    try:
        return with_retries(load, policy, on_retry)
    except Exception as e:  # noqa: BLE001 - reported with the file and row group
        raise BadFileError(ref.url, f"cannot read: {type(e).__name__}: {e}", row_group=row_group) from e
