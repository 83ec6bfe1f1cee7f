"""profbench's per-user cache folder (calibrations, the Debian nsys, apptainer, bytecode):
standard library only, so the guard, the start-up checks and the workloads share it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$PROFBENCH_CACHE, else $XDG_CACHE_HOME/profbench, else ~/.cache/profbench."""
    explicit = os.environ.get("PROFBENCH_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "profbench"
