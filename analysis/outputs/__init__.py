"""Stage 4, outputs across runs: A-vs-B comparison (``compare.py``), the summary table
(``aggregate.py``) and the report's figures (``plots.py``)."""
