"""Bytecode for the jobs' imports, cached where the interpreter's install cannot keep it.

Where torch's install ships no bytecode and none can be written (PYTHONDONTWRITEBYTECODE set,
or a read-only install), every process compiles torch, Dynamo and Inductor again (12-13 s per
process on an H100 host). The guard then runs the job with ``PYTHONPYCACHEPREFIX=<cache>/pycache``
and without PYTHONDONTWRITEBYTECODE: the first job writes, the later ones read. A prefix the
user set is left alone; the warm parents start in a guard's environment, so they agree.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import MutableMapping
from pathlib import Path

from workloads.cachedir import cache_dir

# The module whose bytecode stands for the job's imports: the bulk of them, in one install.
PROBE_MODULE = "torch"
PREFIX, DONT_WRITE = "PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE"


def bytecode_is_kept(source: Path, environ: MutableMapping[str, str]) -> bool:
    """Whether an interpreter started with `environ` reads `source`'s bytecode from a cache
    (present) or can write it there for the next one."""
    cached = Path(importlib.util.cache_from_source(str(source)))
    if cached.exists():
        return True
    if environ.get(DONT_WRITE):
        return False
    folder = cached.parent if cached.parent.exists() else source.parent
    return os.access(folder, os.W_OK)


def probe_source(module: str = PROBE_MODULE) -> Path | None:
    """The source file of `module` (found, not imported), or None."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec else None
    return Path(origin) if origin and origin.endswith(".py") else None


def keep_bytecode(environ: MutableMapping[str, str], module: str = PROBE_MODULE,
                  cache: Path | None = None) -> str | None:
    """Give the job's environment a bytecode cache when its imports would otherwise be
    compiled from source in every process; what was done (for the job log), or None."""
    if environ.get(PREFIX):
        return None
    source = probe_source(module)
    if source is None or bytecode_is_kept(source, environ):
        return None
    prefix = (cache or cache_dir()) / "pycache"
    why = (f"{DONT_WRITE} is set" if environ.get(DONT_WRITE)
           else f"{source.parent} is not writable")
    environ[PREFIX] = str(prefix)
    environ.pop(DONT_WRITE, None)
    return (f"{module} has no bytecode and {why}: every process would compile its imports; "
            f"caching bytecode in {prefix} ({PREFIX})")


def keep_jobs_bytecode(environ: MutableMapping[str, str], in_container: bool) -> str | None:
    """`keep_bytecode` for the environment every job of an invocation inherits, unless the
    jobs run in the image: its packages were compiled when it was built, and a prefix would
    make its interpreters look for their bytecode there instead."""
    return None if in_container else keep_bytecode(environ)
