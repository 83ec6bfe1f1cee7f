"""Stage 4, outputs across runs: the summary table (``aggregate.py``, from the run records
read by ``runs.py``), speed-ups with CIs (``speedup.py``), optimization ladders
(``ladders.py``), A-vs-B comparison (``compare.py``), two results folders diffed
(``diff.py``), findings (``findings.py``), the report's figures (``figures.py``, one visual
vocabulary in ``style.py``) and the front page (``overview.py``)."""
