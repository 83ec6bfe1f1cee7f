"""NVTX range helper shared by the workloads.

The range names are a contract with the analysis code and the nsys capture settings
(``profiled_region``), so every name used by the workloads goes through :func:`rng`.
"""

from functools import cache

import nvtx

# The one range that wraps all measured steps; the pipeline starts/stops nsys capture on it.
PROFILED_REGION = "profiled_region"


@cache
def rng(name: str) -> nvtx.annotate:
    """Return a reusable context manager that pushes/pops the NVTX range ``name``.

    Cached per name: building an ``nvtx.annotate`` registers its string and allocates its
    attributes, while entering one is just a push/pop, which is a no-op (a few hundred ns of
    Python) when no tool such as nsys is attached.
    """
    return nvtx.annotate(name)
