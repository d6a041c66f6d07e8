"""Fast scan of history lengths: reads ONE leaf column per sequence, and of it only the levels.

A sequence is one `list<struct<fields>>` column, so all its fields share one offsets array; the
length of every row's history is known from any one leaf. Per file the scan picks the leaf with the
smallest compressed size and, per row group, reads only that column chunk's bytes:
- fast path (`ingest.parquet_levels`): the chunk's repetition/definition levels are turned into
  row lengths run by run, without decoding a single value (O(rows), not O(events));
- fallback (layouts the fast path does not handle): pyarrow's nested column projection
  (`read_row_group(columns=["history.list.element.x"])`), which decodes that one leaf.
Nothing else in the file is read beyond its footer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.schema import FeatureSchema
from ingest.errors import BadFileError, DataError
from ingest.listing import list_files

__all__ = ["LengthScan", "list_parquet_files", "open_parquet", "scan_lengths"]


@dataclass
class LengthScan:
    """History lengths (as stored, before truncation to `max_length`) of every row, in file order."""

    lengths: dict[str, np.ndarray]  # sequence name -> int64 [rows]
    files: int = 0
    row_groups: int = 0
    rows: int = 0
    leaf: dict[str, str] = field(default_factory=dict)  # sequence -> leaf column path that was read
    compressed_bytes_read: int = 0  # compressed size of the column chunks read
    seconds: float = 0.0
    row_groups_by_levels: int = 0  # column chunks read by the level fast path (the rest: pyarrow)


def list_parquet_files(url: str | list[str], storage_options: dict | None = None):
    """`(filesystem, [paths])` of the Parquet files at a URL (`ingest.listing.list_files` decides which)."""
    refs = list_files(url, storage_options)
    return refs[0].fs, [r.path for r in refs]


def open_parquet(fs, path: str) -> pq.ParquetFile:
    """Opens a Parquet file; local files are memory-mapped, others read through fsspec."""
    from fsspec.implementations.local import LocalFileSystem

    try:
        if isinstance(fs, LocalFileSystem):
            return pq.ParquetFile(path, memory_map=True)
        return pq.ParquetFile(fs.open(path, "rb"))
    except (OSError, pa.ArrowException) as e:
        raise BadFileError(path, f"not a readable Parquet file: {e}", hint="check the path; remove or "
                           "rewrite the file") from None


def _leaf_for(pf: pq.ParquetFile, path: str, seq: str) -> tuple[int, str]:
    """The cheapest leaf column (index, dotted path) of a sequence column in this file."""
    md = pf.metadata
    candidates = [i for i in range(md.num_columns) if md.schema.column(i).path.split(".")[0] == seq]
    if not candidates:
        raise BadFileError(path, f"column '{seq}' is missing (expected the sequence '{seq}' as "
                           "list<struct<...>>)", hint="check the file against the schema with "
                           "`gemtrain data inspect`")
    top = pf.schema_arrow.field(seq).type
    if not (pa.types.is_list(top) or pa.types.is_large_list(top)):
        raise BadFileError(path, f"column '{seq}' has type {top}, expected a list<struct<...>>")

    def size(i: int) -> int:
        return sum(md.row_group(r).column(i).total_compressed_size for r in range(md.num_row_groups))

    best = min(candidates, key=size)
    return best, md.schema.column(best).path


def _row_group_lengths(pf: pq.ParquetFile, rg: int, leaf_path: str) -> np.ndarray:
    col = pf.read_row_group(rg, columns=[leaf_path], use_threads=False).column(0)
    if col.num_chunks == 1:
        chunk = col.chunk(0)
        if chunk.null_count == 0 and chunk.offset == 0:
            offsets = chunk.offsets.to_numpy()
            return np.diff(offsets).astype(np.int64, copy=False)
    lengths = pc.fill_null(pc.list_value_length(col), 0)  # a null history counts as empty
    return lengths.to_numpy().astype(np.int64, copy=False)


class _ChunkReader:
    """Reads byte ranges of one file: a memory map for local files, ranged reads otherwise."""

    def __init__(self, fs, path: str):
        from fsspec.implementations.local import LocalFileSystem

        self.fs, self.path, self._mm, self._fh = fs, path, None, None
        if isinstance(fs, LocalFileSystem):
            import mmap

            with open(path, "rb") as fh:
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)

    def read(self, start: int, length: int):
        if self._mm is not None:
            return memoryview(self._mm)[start:start + length]
        return memoryview(self.fs.cat_file(self.path, start=start, end=start + length))

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()


def _chunk_range(cc) -> tuple[int, int]:
    start = cc.data_page_offset
    if cc.has_dictionary_page and cc.dictionary_page_offset is not None:
        start = min(start, cc.dictionary_page_offset)
    return start, cc.total_compressed_size


def _levels_lengths(reader: _ChunkReader, pf: pq.ParquetFile, rg: int, layout) -> np.ndarray:
    from ingest.parquet_levels import chunk_list_lengths

    md = pf.metadata.row_group(rg)
    cc = md.column(layout.column_index)
    start, length = _chunk_range(cc)
    view = reader.read(start, length)
    try:
        return chunk_list_lengths(view, cc, layout, md.num_rows)
    finally:
        view.release()


def scan_lengths(schema: FeatureSchema, url: str | list[str], storage_options: dict | None = None) -> LengthScan:
    """Reads the history length of every row of every file at `url` (see the module docstring)."""
    if not schema.sequences:
        raise DataError(f"schema '{schema.name}' has no sequences: there are no history lengths to scan")
    t0 = time.perf_counter()
    fs, paths = list_parquet_files(url, storage_options)
    parts: dict[str, list[np.ndarray]] = {s.name: [] for s in schema.sequences}
    scan = LengthScan(lengths={})
    for path in paths:
        pf = open_parquet(fs, path)
        md = pf.metadata
        leaves = {s.name: _leaf_for(pf, path, s.name) for s in schema.sequences}
        layouts = {}
        for name, (idx, leaf) in leaves.items():
            scan.leaf[name] = leaf
            scan.compressed_bytes_read += sum(md.row_group(r).column(idx).total_compressed_size
                                              for r in range(md.num_row_groups))
            layouts[name] = _layout_or_none(pf, idx, name)
        reader = _ChunkReader(fs, path) if any(v is not None for v in layouts.values()) else None
        try:
            for rg in range(md.num_row_groups):
                for name, (_, leaf) in leaves.items():
                    parts[name].append(_lengths(pf, rg, leaf, layouts[name], reader, path, scan))
        finally:
            if reader is not None:
                reader.close()
        scan.files += 1
        scan.row_groups += md.num_row_groups
        scan.rows += md.num_rows
    scan.lengths = {name: (np.concatenate(p) if p else np.zeros(0, np.int64)) for name, p in parts.items()}
    scan.seconds = time.perf_counter() - t0
    return scan


def _layout_or_none(pf: pq.ParquetFile, idx: int, seq: str):
    from ingest.parquet_levels import Unsupported, layout_for

    try:
        return layout_for(pf, idx, seq)
    except (Unsupported, KeyError):
        return None


def _lengths(pf, rg: int, leaf: str, layout, reader, path: str, scan: LengthScan) -> np.ndarray:
    """One row group's lengths: by the levels when the layout allows, else through pyarrow."""
    from ingest.parquet_levels import Unsupported

    if layout is not None:
        try:
            out = _levels_lengths(reader, pf, rg, layout)
            scan.row_groups_by_levels += 1
            return out
        except (Unsupported, IndexError, ValueError, pa.ArrowException):
            pass  # not a layout the fast path reads: pyarrow reads (and checks) it below
    try:
        return _row_group_lengths(pf, rg, leaf)
    except (OSError, pa.ArrowException) as e:
        raise BadFileError(path, f"cannot read the history lengths: {e}", row_group=rg) from None
