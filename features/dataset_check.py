"""Checks a Parquet dataset (any fsspec URL) against a `FeatureSchema` from the file footers.

Every file's footer is read (in parallel) and its schema compared with `schema.arrow_schema()`;
history lengths come from each sequence's list offsets, read through the single cheapest leaf
column of the sequence (the smallest compressed size), so the event data itself is never read.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from features.arrow import check_arrow_schema
from features.errors import GemtrainError
from features.schema import FeatureSchema

PAD_BATCH = 256  # the batch size padding waste is reported for


@dataclass
class FileCheck:
    url: str
    rows: int = 0
    row_groups: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)
    lengths: dict[str, np.ndarray] = field(default_factory=dict)  # sequence -> per-row lengths
    row_ids: list[np.ndarray] = field(default_factory=list)  # read by a deep check only

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class LengthStats:
    rows: int
    mean: float
    min: int
    p50: float
    p90: float
    p99: float
    max: int
    empty: int  # rows with an empty history
    over_max_length: int  # rows whose history the loader will truncate
    padding_waste: float  # of batches of PAD_BATCH rows padded to their longest history

    @staticmethod
    def of(lengths: np.ndarray, max_length: int) -> LengthStats:
        if lengths.size == 0:
            return LengthStats(0, 0.0, 0, 0.0, 0.0, 0.0, 0, 0, 0, 0.0)
        b = lengths.size // PAD_BATCH * PAD_BATCH
        boxes = lengths[:b].reshape(-1, PAD_BATCH) if b else lengths[None, :]
        box = int(boxes.max(1).sum()) * boxes.shape[1]
        p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
        return LengthStats(
            rows=int(lengths.size), mean=float(lengths.mean()), min=int(lengths.min()), p50=float(p50),
            p90=float(p90), p99=float(p99), max=int(lengths.max()), empty=int((lengths == 0).sum()),
            over_max_length=int((lengths > max_length).sum()),
            padding_waste=float(1 - boxes.sum() / box) if box else 0.0)


@dataclass
class DatasetCheck:
    files: list[FileCheck]
    lengths: dict[str, LengthStats]

    @property
    def ok(self) -> bool:
        return bool(self.files) and all(f.ok for f in self.files)

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def row_groups(self) -> int:
        return sum(f.row_groups for f in self.files)


def list_parquet_files(url: str, storage_options: dict | None = None) -> tuple[object, list[str]]:
    """(filesystem, sorted file paths) of a Parquet file or of every `*.parquet` under a folder."""
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        if fs.isfile(root):
            return fs, [root]
        if not fs.isdir(root):
            raise GemtrainError(f"{url}: no such file or folder")
        paths = [p for p in fs.find(root) if p.endswith(".parquet")
                 and not any(part.startswith(("_", ".")) for part in p[len(root):].split("/"))]
    except GemtrainError:
        raise
    except Exception as e:  # noqa: BLE001 - any storage failure (credentials, network) is the user's to fix
        raise GemtrainError(f"cannot list {url}: {type(e).__name__}: {e}") from None
    if not paths:
        raise GemtrainError(f"{url}: no .parquet files found")
    return fs, sorted(paths)


def check_file(fs, path: str, schema: FeatureSchema, *, read_lengths: bool = True,
               deep: bool = False) -> FileCheck:
    """One file: footer, schema check and (if the schema matches) its history lengths.

    `deep` also reads every row group with page checksums verified and checks the values
    (`check_values`): nulls, ids outside their tables, labels that are not 0/1.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = FileCheck(url=fs.unstrip_protocol(path))
    try:
        with fs.open(path, "rb") as fh:
            pf = pq.ParquetFile(fh, page_checksum_verification=deep)
            md = pf.metadata
            out.rows, out.row_groups = md.num_rows, md.num_row_groups
            out.bytes = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
            out.problems = [str(m) for m in check_arrow_schema(schema.arrow_schema(), pf.schema_arrow)]
            if out.problems:
                return out
            if deep:
                for rg in range(md.num_row_groups):
                    try:
                        table = pf.read_row_group(rg)
                    except (OSError, pa.ArrowException) as e:
                        out.problems.append(f"row group {rg}: cannot read: {e}")
                        continue
                    out.problems += [f"row group {rg}: {p}" for p in check_values(table, schema)]
                    if "row_id" in schema.metadata:
                        out.row_ids.append(table.column("row_id").to_numpy())
            if not read_lengths:
                return out
            for seq in schema.sequences:
                leaf = _cheapest_leaf(md, seq.name)
                parts = []
                for rg in range(md.num_row_groups):
                    col = pf.read_row_group(rg, columns=[leaf]).column(0)
                    parts += [np.diff(c.offsets.to_numpy()) for c in col.chunks]
                out.lengths[seq.name] = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    except (OSError, pa.ArrowException) as e:
        out.problems.append(f"cannot read: {e}")
    except Exception as e:  # noqa: BLE001 - a storage client's own errors: name the file, keep checking the rest
        out.problems.append(f"cannot read: {type(e).__name__}: {e}")
    return out


def check_values(table, schema: FeatureSchema) -> list[str]:
    """Value problems of one table that the type check cannot see."""
    import pyarrow as pa
    import pyarrow.compute as pc

    problems = []
    for name in table.column_names:
        if table.column(name).null_count:
            problems.append(f"{name}: {table.column(name).null_count} null values")

    def id_range(values, where: str, table_name: str) -> None:
        n = schema.table(table_name).num_embeddings
        if len(values) == 0:
            return
        bad = pc.sum(pc.or_(pc.less(values, 0), pc.greater_equal(values, n))).as_py() or 0
        if bad:
            problems.append(f"{where}: {bad} ids outside the table '{table_name}' [0, {n}) "
                            "(mark the feature `hash: true` if its ids are raw)")

    for seq in schema.sequences:
        events = pc.list_flatten(table.column(seq.name))
        for f in seq.id_fields:
            if not f.hash:
                id_range(pc.struct_field(events, f.name), seq.key(f.name), f.table)
    for f in schema.features:
        if f.type in ("id", "id_list") and not f.hash:
            col = table.column(f.name)
            id_range(pc.list_flatten(col) if f.type == "id_list" else col, f.name, f.table)
    for label in schema.labels:
        col = table.column(label.name)
        bad = len(col) - (pc.sum(pc.is_in(col, value_set=pa.array([0.0, 1.0], pa.float32()))).as_py() or 0)
        if bad:
            problems.append(f"{label.name}: {bad} labels are not 0 or 1")
    return problems


def _cheapest_leaf(md, column: str) -> str:
    sizes: dict[str, int] = {}
    for rg in range(md.num_row_groups):
        g = md.row_group(rg)
        for i in range(g.num_columns):
            c = g.column(i)
            if c.path_in_schema.split(".")[0] == column:
                sizes[c.path_in_schema] = sizes.get(c.path_in_schema, 0) + c.total_compressed_size
    if not sizes:  # no row groups: any leaf will do
        return md.schema.to_arrow_schema().field(column).name
    return min(sizes, key=sizes.get)


def check_dataset(url: str, schema: FeatureSchema, *, storage_options: dict | None = None,
                  threads: int = 16, read_lengths: bool = True, deep: bool = False) -> DatasetCheck:
    """Checks every Parquet file under `url` against `schema`; never raises for a bad file.

    `deep` reads all the data (see `check_file`) and also checks that row ids are unique.
    """
    fs, paths = list_parquet_files(url, storage_options)
    with ThreadPoolExecutor(max(1, min(threads, len(paths)))) as pool:
        files = list(pool.map(lambda p: check_file(fs, p, schema, read_lengths=read_lengths, deep=deep),
                              paths))
    if deep and "row_id" in schema.metadata:
        _check_row_ids(files)
    lengths = {}
    for seq in schema.sequences:
        parts = [f.lengths[seq.name] for f in files if seq.name in f.lengths]
        if parts:
            lengths[seq.name] = LengthStats.of(np.concatenate(parts), seq.max_length)
    return DatasetCheck(files, lengths)


def _check_row_ids(files: list[FileCheck]) -> None:
    """Names every file holding a row id that appears more than once in the dataset."""
    parts = [(i, ids) for i, f in enumerate(files) for ids in f.row_ids]
    if not parts:
        return
    ids = np.concatenate([p[1] for p in parts])
    owner = np.concatenate([np.full(len(p[1]), p[0]) for p in parts])
    order = np.argsort(ids, kind="stable")
    dup = np.zeros(len(ids), bool)
    same = ids[order][1:] == ids[order][:-1]
    dup[order[1:][same]] = True
    dup[order[:-1][same]] = True
    for i in np.unique(owner[dup]):
        n = int((dup & (owner == i)).sum())
        files[i].problems.append(f"{n} row ids also appear elsewhere in the dataset (row_id must be unique)")
    for f in files:
        f.row_ids = []
