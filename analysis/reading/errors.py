"""Errors raised by the analysis package."""

from __future__ import annotations


class ExportError(ValueError):
    """An nsys SQLite export that cannot be read (missing, corrupt, truncated, not nsys).

    The message always names the offending file; the CLI prints it without a traceback
    and exits with status 2.
    """

    def __init__(self, path: object, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")
