"""Stage 3, metrics beyond ``nsys stats``, per run.

``extras.py`` computes the extra tables and ``metrics.json`` (the ``extras`` command),
from kernel categories and tensor-core rules (``categories.py``) and the CUDA occupancy
calculator (``occupancy.py``), on top of the reports' shared joins
(:class:`analysis.reports.nsys_stats.Context`).

``phases.py`` attributes each step's GPU time to its phase (forward, backward, optimizer)
across threads; ``timing.py`` turns untraced repeats into a median with a bootstrap CI.
"""
