"""``python -m analysis`` entry point."""

import os

# numpy's OpenBLAS would start a thread pool at import (~60 ms on 2 cores); nothing in
# analysis/ uses BLAS.  Set before anything imports numpy.
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(var, "1")

from analysis.cli import main  # noqa: E402

raise SystemExit(main())
