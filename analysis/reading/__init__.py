"""Stage 1, reading: an nsys SQLite export -> numpy arrays, one table at a time.

Entry point: :class:`Export` (``export.py``).  Its collaborators: ``database.py`` (the
read-only connection, schema, StringIds), ``columns.py`` (integer columns from the
file's pages via ``sqlitefile.py``, else by SQL), ``prefetch.py`` (the CUDA API table
loaded in the background), ``nvtxnames.py`` (NVTX range names as each nsys version
prints them) and ``codes.py`` (dense integer codes for grouping).
"""

from analysis.reading.errors import ExportError
from analysis.reading.export import Export, NvtxEvents

__all__ = ["Export", "ExportError", "NvtxEvents"]
