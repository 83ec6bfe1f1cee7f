"""Load a table in the background while the caller reads the others.

Two ways, chosen by :meth:`analysis.reading.export.Export.prefetch_runtime`:

* :class:`InThread`: the page decoder runs in a thread; numpy releases the GIL in its
  array loops, so it overlaps with the main thread's work.
* :class:`InChild`: SQL reading holds the GIL between rows, so a thread would not help;
  a forked child on the second core reads its share and pickles the arrays back through
  a pipe.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from analysis.reading.errors import ExportError

Columns = dict[str, np.ndarray]


class InThread:
    """``job()`` running in a daemon thread."""

    def __init__(self, job: Callable[[], Columns | None]) -> None:
        self._result: dict[str, Columns | None] = {}
        self._worker = threading.Thread(
            target=lambda: self._result.update(data=job()), daemon=True
        )
        self._worker.start()

    def result(self) -> Columns | None:
        """The job's columns (None: the decoder declined, read by SQL instead)."""
        self._worker.join()
        return self._result.get("data")


class InChild:
    """``job()`` running in a forked child process (``os.fork`` must exist)."""

    def __init__(self, path: Path, job: Callable[[], Columns]) -> None:
        self.path = path
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never returns
            os.close(rfd)
            _run_child(wfd, job)
        os.close(wfd)
        self._pid, self._rfd = pid, rfd

    def result(self) -> Columns:
        """Wait for the child and return its columns; its failure as ExportError."""
        try:
            with os.fdopen(self._rfd, "rb") as fh:
                payload = pickle.load(fh)
        except (EOFError, pickle.UnpicklingError) as exc:
            raise ExportError(self.path, f"background read failed ({exc})") from exc
        finally:
            os.waitpid(self._pid, 0)
        if isinstance(payload, ExportError):
            raise payload
        if isinstance(payload, Exception):
            raise ExportError(self.path, f"background read failed ({payload})")
        return payload  # type: ignore[no-any-return]


def _run_child(wfd: int, job: Callable[[], Columns]) -> None:
    code = 0
    try:
        with os.fdopen(wfd, "wb") as fh:
            try:
                payload: object = job()
            except Exception as exc:  # report any failure to the parent
                payload = exc
                code = 1
            pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        os._exit(code)
