"""The project's user-facing error for schemas: what was wrong, where, and what to do."""

from __future__ import annotations


class GemtrainError(Exception):
    """Base of every error gemtrain reports to a user (the CLI prints it without a traceback)."""


class SchemaError(GemtrainError, ValueError):
    """A feature schema (or a file checked against one) is wrong.

    The message reads `file:line: field: what is wrong. what is allowed / what to do`.
    """

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None, hint: str | None = None):
        self.file, self.line, self.field, self.hint = file, line, field, hint
        self.reason = message
        where = ""
        if file:
            where = file + (f":{line}" if line is not None else "") + ": "
        elif line is not None:
            where = f"line {line}: "
        what = f"{field}: " if field else ""
        text = f"{where}{what}{message}"
        if hint:
            text += f" ({hint})"
        super().__init__(text)
