"""Stage 2, reports: the seven ``nsys stats`` summaries with nsys' exact values.

``catalogue.py`` names them and their columns (imported by the pipeline, so this package
imports nothing heavy here); ``nsys_stats.py`` computes them from an
:class:`~analysis.reading.Export` (the NVTX projection in ``nvtx.py``, group-by
statistics in ``groupstats.py``) and ``fmt.py`` prints cells and CSVs as nsys does.
"""

from analysis.reports.catalogue import DUR_STATS, HEADERS, REPORTS

__all__ = ["DUR_STATS", "HEADERS", "REPORTS"]
