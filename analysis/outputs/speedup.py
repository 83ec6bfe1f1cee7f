"""Baseline vs candidate untraced step time: speed-up with its 95% CI and significance.

    python -m analysis speedup RUN_A_DIR RUN_B_DIR -o speedup.csv
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.metrics.timing import speedup, summarize
from analysis.outputs.runs import OK, read_timing

COLUMNS = [
    "baseline", "candidate", "baseline_ms", "baseline_ci_low_ms", "baseline_ci_high_ms",
    "candidate_ms", "candidate_ci_low_ms", "candidate_ci_high_ms", "speedup",
    "speedup_ci_low", "speedup_ci_high", "significant", "verdict", "status",
]  # fmt: skip


def speedup_row(a_dir: Path, b_dir: Path) -> dict[str, Any]:
    """One row: both sides' medians and CIs, the ratio a/b with its CI, the verdict."""
    a, b = read_timing(a_dir), read_timing(b_dir)
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(baseline=a_dir.name, candidate=b_dir.name)
    if a.status != OK or b.status != OK:
        failed = [(d.name, t) for d, t in ((a_dir, a), (b_dir, b)) if t.status != OK]
        row["status"] = "; ".join(f"{name}: {t.status}" for name, t in failed)
        return row
    sa, sb = summarize(a.per_process_ms), summarize(b.per_process_ms)
    s = speedup(a.per_process_ms, b.per_process_ms)
    row.update(
        baseline_ms=sa.median_ms, baseline_ci_low_ms=sa.ci_low_ms,
        baseline_ci_high_ms=sa.ci_high_ms,
        candidate_ms=sb.median_ms, candidate_ci_low_ms=sb.ci_low_ms,
        candidate_ci_high_ms=sb.ci_high_ms, speedup=s.ratio, speedup_ci_low=s.ci_low,
        speedup_ci_high=s.ci_high, significant=s.significant, verdict=s.verdict, status=OK,
    )  # fmt: skip
    return row


def write_speedup(a_dir: Path, b_dir: Path, output: Path) -> dict[str, Any]:
    import pandas as pd

    row = speedup_row(a_dir, b_dir)
    output.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([row], columns=COLUMNS).to_csv(output, index=False)
    return row
