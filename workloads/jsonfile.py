"""Writing a JSON record whole (aside, then renamed into place), and reading one.

A reader (the guard watching for a repeat's record, a pipeline beside this one reading the
calibration cache) then sees the old file, no file or the complete new one, never half of
one. Standard library only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_whole(path: Path, data: Any) -> None:
    """`data` as indented JSON at `path`, written to a hidden file beside it and renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(partial, path)


def read_whole(path: Path) -> dict[str, Any] | None:
    """The JSON object at `path`, or None (no file, not JSON, not an object)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
