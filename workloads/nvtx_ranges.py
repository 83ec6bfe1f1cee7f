"""NVTX range helper shared by the workloads.

The range names are a contract with the analysis code and the nsys capture settings
(``profiled_region``), so every name used by the workloads goes through :func:`rng`.
"""

import contextlib
from collections.abc import Callable, Iterator
from functools import cache

import nvtx
import torch

# The one range that wraps all measured steps; the pipeline starts/stops nsys capture on it.
PROFILED_REGION = "profiled_region"

# Called with a range's name when it ends, while set (workloads/graphs.py counts the CUDA
# graph's nodes at the end of each phase while capturing a whole step).
_exit_observer: Callable[[str], None] | None = None


def set_exit_observer(observer: Callable[[str], None] | None) -> None:
    """Call ``observer(name)`` at the end of every range from now on (None: stop)."""
    global _exit_observer
    _exit_observer = observer


def rng(name: str) -> contextlib.AbstractContextManager:
    """A context manager that pushes/pops the NVTX range ``name``.

    While torch.compile traces, this is a fresh ``nullcontext`` (which Dynamo understands), so
    the per-layer ranges inside a compiled model cause no graph breaks; the phase ranges
    around compiled calls stay real.
    """
    if torch.compiler.is_compiling():
        return contextlib.nullcontext()
    if _exit_observer is not None:
        return _observed(name, _exit_observer)
    return _annotate(name)


@contextlib.contextmanager
def _observed(name: str, observer: Callable[[str], None]) -> Iterator[None]:
    with _annotate(name):
        yield
    observer(name)


@cache
def _annotate(name: str) -> nvtx.annotate:
    # Cached per name: building an nvtx.annotate registers its string and allocates its
    # attributes, while entering one is just a push/pop (a no-op with no tool attached).
    return nvtx.annotate(name)
