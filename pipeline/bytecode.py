"""Bytecode for the jobs' imports, cached where the interpreter's install cannot keep it.

Where torch's install ships no bytecode and none can be written (PYTHONDONTWRITEBYTECODE set,
or a read-only install), every process compiles torch, Dynamo and Inductor again (12-13 s per
process on an H100 host). The job then runs with ``PYTHONPYCACHEPREFIX=<cache>/pycache`` and
without PYTHONDONTWRITEBYTECODE: the first job writes, the later ones read. A prefix the user
set is left alone; the warm parents start in a guard's environment, so they agree.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import MutableMapping
from pathlib import Path

from workloads.cachedir import cache_dir

PREFIX, DONT_WRITE = "PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE"


def keep_bytecode(environ: MutableMapping[str, str], module: str = "torch",
                  cache: Path | None = None, in_container: bool = False) -> str | None:
    """Give `environ` a bytecode cache when an interpreter started with it would compile
    `module` (the bulk of a job's imports) from source; what was done, for the log, or None.
    Not for jobs `in_container`: the image's packages were compiled when it was built, and a
    prefix would make its interpreters look for their bytecode there instead."""
    if in_container:
        return None
    try:
        spec = None if environ.get(PREFIX) else importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not (spec.origin or "").endswith(".py"):
        return None
    source = Path(spec.origin)  # type: ignore[arg-type]
    cached = Path(importlib.util.cache_from_source(str(source)))
    folder = cached.parent if cached.parent.exists() else source.parent
    if cached.exists() or (not environ.get(DONT_WRITE) and os.access(folder, os.W_OK)):
        return None
    why = f"{DONT_WRITE} is set" if environ.get(DONT_WRITE) else f"{source.parent} is not writable"
    environ[PREFIX] = str((cache or cache_dir()) / "pycache")
    environ.pop(DONT_WRITE, None)
    return (f"{module} has no bytecode and {why}: every process would compile its imports; "
            f"caching bytecode in {environ[PREFIX]} ({PREFIX})")
