"""NVTX range helper shared by the workloads.

The range names are a contract with the analysis code and the nsys capture settings
(``profiled_region``), so every name used by the workloads goes through :func:`rng`.
"""

import contextlib
from functools import cache

import nvtx
import torch

# The one range that wraps all measured steps; the pipeline starts/stops nsys capture on it.
PROFILED_REGION = "profiled_region"


def rng(name: str) -> contextlib.AbstractContextManager:
    """A context manager that pushes/pops the NVTX range ``name``.

    While torch.compile traces, this is a fresh ``nullcontext`` (which Dynamo understands), so
    the per-layer ranges inside a compiled model cause no graph breaks; the phase ranges
    around compiled calls stay real.
    """
    if torch.compiler.is_compiling():
        return contextlib.nullcontext()
    return _annotate(name)


@cache
def _annotate(name: str) -> nvtx.annotate:
    # Cached per name: building an nvtx.annotate registers its string and allocates its
    # attributes, while entering one is just a push/pop (a no-op with no tool attached).
    return nvtx.annotate(name)
