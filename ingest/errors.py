"""Errors of the ingest package: a bad file or bad values, named with where and what to do."""

from __future__ import annotations

from features.errors import GemtrainError


class DataError(GemtrainError, ValueError):
    """Input data that cannot be turned into a batch (bad values, bad layout)."""


class BadFileError(DataError):
    """A Parquet file (or one of its row groups) that cannot be read or does not match the schema."""

    def __init__(self, path: str, reason: str, *, row_group: int | None = None, hint: str | None = None):
        self.path, self.reason, self.row_group = path, reason, row_group
        where = path + (f" (row group {row_group})" if row_group is not None else "")
        text = f"{where}: {reason}"
        text += f" ({hint})" if hint else " (fix or remove the file, or set on_bad_file: quarantine to skip it)"
        super().__init__(text)
