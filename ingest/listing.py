"""Listing: any fsspec URL (a file, a folder, a glob, or a list of them) -> sorted Parquet files."""

from __future__ import annotations

from dataclasses import dataclass

import fsspec

from ingest.errors import DataError

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")


@dataclass(frozen=True)
class FileRef:
    """One file: its filesystem and its path on it; `url` names it in messages and state."""

    fs: fsspec.AbstractFileSystem
    path: str

    @property
    def url(self) -> str:
        return self.fs.unstrip_protocol(self.path)


def _hidden(path: str) -> bool:
    # Spark/Hive marker files (_SUCCESS, _metadata) and dot files are not data.
    return path.rsplit("/", 1)[-1].startswith(("_", "."))


def list_files(url: str | list[str], storage_options: dict | None = None) -> list[FileRef]:
    """All Parquet files under `url`, sorted by URL, each once."""
    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise DataError("no data URL given (set data.url to a Parquet file, a folder, a glob or a list)")
    found: dict[str, FileRef] = {}
    for u in urls:
        try:
            fs, path = fsspec.core.url_to_fs(u, **(storage_options or {}))
            if any(ch in path for ch in "*?["):
                paths = [p for p in fs.glob(path) if not fs.isdir(p)]
            elif fs.isdir(path):
                paths = [p for p in fs.find(path) if p.endswith(PARQUET_SUFFIXES) and not _hidden(p)]
            elif fs.exists(path):
                paths = [path]
            else:
                raise DataError(f"{u}: no such file or folder (give a Parquet file, a folder of them or a glob)")
        except (OSError, ValueError, ImportError) as e:
            if isinstance(e, DataError):
                raise
            raise DataError(f"{u}: cannot list: {e} (check the URL and storage_options)") from None
        if not paths:
            raise DataError(f"{u}: no Parquet files found there (files must end in .parquet)")
        for p in paths:
            ref = FileRef(fs, p)
            found.setdefault(ref.url, ref)
    return [found[k] for k in sorted(found)]
