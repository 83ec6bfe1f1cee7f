"""profbench analysis engine: Nsight Systems SQLite exports -> CSV tables and metrics.

Command line (``python -m analysis ...``):

* ``stats EXPORT.sqlite -o DIR [--report R ...] [--nsys-version 2025|2024]`` writes the
  seven ``nsys stats`` reports with the columns, rows and values of
  ``nsys stats --report R --format csv`` (Nsight Systems 2025.3.1 by default):
  ``cuda_gpu_kern_sum.csv``, ``nvtx_sum.csv``, ``nvtx_kern_sum.csv``,
  ``nvtx_gpu_proj_sum.csv``, ``cuda_api_sum.csv``, ``cuda_gpu_mem_time_sum.csv``,
  ``cuda_gpu_mem_size_sum.csv``.  Reports without data (e.g. CPU-only capture) are written
  with their header only.
* ``extras EXPORT.sqlite -o DIR`` writes
  ``kernel_categories.csv`` (GPU time per kernel category),
  ``nvtx_categories.csv`` (GPU time per NVTX range name and category),
  ``tensor_core.csv`` (per kernel name: category, tensor-core rule, time),
  ``kernel_occupancy.csv`` (per launch configuration: blocks per SM, est. SM efficiency,
  theoretical and est. achieved occupancy, limiter),
  ``gpu_utilization.csv`` (busy union, capture span, idle gaps per device),
  ``launch_overhead.csv`` (kernel start - launching API start, per API) and
  ``metrics.json`` (see :func:`analysis.metrics.extras.run_metrics`).
* ``all EXPORT.sqlite -o DIR``: ``stats`` + ``extras`` in one process (the DB is read once).
* ``compare A B -o DIR`` (each a .sqlite or a run folder with ``profile.sqlite``):
  ``compare_categories.csv``, ``compare_nvtx.csv``, ``compare_metrics.csv`` (A, B, B/A)
  and a printed table.
* ``aggregate --results DIR --runs RUN ... -o summary.csv`` and
  ``plots --summary summary.csv --results DIR -o PLOTDIR``: across runs (the pipeline).

Stages, one subpackage each; imports flow one way, outputs -> metrics -> reports ->
reading (map: docs/analysis.md):

* ``reading``: :class:`analysis.reading.Export` (an export's tables as numpy arrays);
* ``reports``: :func:`analysis.reports.nsys_stats.run_reports` (the seven nsys tables);
* ``metrics``: :func:`analysis.metrics.extras.compute_extras` / ``run_metrics``;
* ``outputs``: :func:`analysis.outputs.compare.compare`, ``aggregate``, ``plots``.

Errors: :class:`analysis.reading.ExportError` (a ``ValueError`` naming the file; the CLI
prints it and exits 2).  Definitions (statistics, rounding, NVTX projection, categories,
tensor-core rules, occupancy formula, sources): docs/analysis.md.  The per-run stages use
only sqlite3, numpy and the standard library (no pandas, no torch); pandas and matplotlib
are imported by ``aggregate`` and ``plots`` only.
"""
