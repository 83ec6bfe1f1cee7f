"""Step-time statistics of the untraced timing runs: point estimate, spread, confidence.

A run is timed by ``repeats`` separate processes, each measuring ``steps`` synchronized steps
(CUDA events on a GPU). Steps of one process share its state (allocator, clocks, compiled
graphs), so they are not independent samples of the workload; processes are. The estimate and
its interval respect that two-level structure:

* **estimate**: the median of the per-process medians;
* **95% CI**: a hierarchical percentile bootstrap (resample processes with replacement, then
  steps within each drawn process; the statistic is again the median of medians), 2,000
  resamples with a fixed seed, so the same data always gives the same interval;
* **unstable**: the CI's half-width exceeds ``unstable_threshold`` (default 3%) of the estimate.

With one process the interval only covers step-to-step noise, not process-to-process
variation (allocator layout, clocks, autotuning choices): the docs say so and the default GPU
config runs 3 processes.

A speed-up ``baseline / candidate`` gets its interval from the same resampling applied to
both sides independently; it is *significant* when the interval excludes 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
BOOTSTRAP_BLOCK_VALUES = 4_000_000  # resampled step times held at once (~32 MB per array)
DEFAULT_UNSTABLE_THRESHOLD = 0.03
CI_METHOD = "hierarchical percentile bootstrap (processes, then steps), median of medians"

Samples = Sequence[Sequence[float]]


@dataclass(frozen=True)
class TimingSummary:
    """Untraced step time of one run, in ms."""

    median_ms: float
    ci_low_ms: float
    ci_high_ms: float
    ci_half_width_rel: float
    q1_ms: float
    q3_ms: float
    iqr_ms: float
    min_ms: float
    max_ms: float
    processes: int
    steps: int
    unstable: bool

    def as_dict(self) -> dict[str, float | int | bool]:
        return asdict(self)


@dataclass(frozen=True)
class SpeedUp:
    """``baseline / candidate`` step-time ratio (> 1: the candidate is faster)."""

    ratio: float
    ci_low: float
    ci_high: float
    significant: bool
    verdict: str  # faster | slower | same

    def as_dict(self) -> dict[str, float | bool | str]:
        return asdict(self)


def median_of_medians(per_process: Samples) -> float:
    """The estimate: median over processes of each process's median step time."""
    return float(np.median([np.median(p) for p in _check(per_process)]))


def bootstrap_medians(
    per_process: Samples, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> np.ndarray:
    """``resamples`` bootstrap replicates of the median of medians (hierarchical).

    Replicates are drawn as arrays, a block at a time (not 2,000 Python loops; blocks keep
    the memory bounded for runs with many processes or steps): per replicate, processes
    drawn with replacement, then each drawn process's steps drawn with replacement from it."""
    groups = [np.asarray(p, dtype=np.float64) for p in _check(per_process)]
    rng = np.random.default_rng(seed)
    sizes = np.array([g.size for g in groups])
    padded = np.full((len(groups), int(sizes.max())), np.nan)  # processes of unequal length
    for i, g in enumerate(groups):
        padded[i, : g.size] = g
    block = max(1, BOOTSTRAP_BLOCK_VALUES // padded.size)
    return np.concatenate([_replicate_block(padded, sizes, rng, min(block, resamples - done))
                           for done in range(0, resamples, block)])


def _replicate_block(padded: np.ndarray, sizes: np.ndarray, rng: np.random.Generator,
                     count: int) -> np.ndarray:
    n_proc, longest = padded.shape
    drawn = rng.integers(0, n_proc, (count, n_proc))  # which process, per slot
    drawn_sizes = sizes[drawn][..., None]  # (count, n_proc, 1)
    # step indices scaled by the drawn process's own size: never past its last step
    steps = (rng.random((count, n_proc, longest)) * drawn_sizes).astype(np.intp)
    values = padded[drawn[..., None], steps]
    if (sizes == longest).all():
        medians = np.median(values, axis=2)
    else:  # a drawn process keeps only as many steps as it has
        values[np.arange(longest) >= drawn_sizes] = np.nan
        medians = np.nanmedian(values, axis=2)
    return np.median(medians, axis=1)


def summarize(
    per_process: Samples,
    unstable_threshold: float = DEFAULT_UNSTABLE_THRESHOLD,
    confidence: float = CONFIDENCE,
) -> TimingSummary:
    """Estimate, 95% CI, IQR and range of a run's per-process step times (ms)."""
    groups = _check(per_process)
    estimate = median_of_medians(groups)
    low, high = _interval(bootstrap_medians(groups), confidence)
    every_step = np.concatenate([np.asarray(p, dtype=np.float64) for p in groups])
    q1, q3 = np.percentile(every_step, [25, 75])
    half_rel = (high - low) / 2 / estimate if estimate > 0 else float("inf")
    return TimingSummary(
        median_ms=estimate,
        ci_low_ms=low,
        ci_high_ms=high,
        ci_half_width_rel=half_rel,
        q1_ms=float(q1),
        q3_ms=float(q3),
        iqr_ms=float(q3 - q1),
        min_ms=float(every_step.min()),
        max_ms=float(every_step.max()),
        processes=len(groups),
        steps=int(every_step.size),
        unstable=bool(half_rel > unstable_threshold),
    )


def speedup(baseline: Samples, candidate: Samples, confidence: float = CONFIDENCE) -> SpeedUp:
    """How many times faster the candidate's step is than the baseline's, with its CI."""
    ratio = median_of_medians(baseline) / median_of_medians(candidate)
    # Independent resampling of the two sides (different seeds: the runs are independent).
    reps = bootstrap_medians(baseline, seed=BOOTSTRAP_SEED) / bootstrap_medians(
        candidate, seed=BOOTSTRAP_SEED + 1
    )
    low, high = _interval(reps, confidence)
    significant = low > 1.0 or high < 1.0
    verdict = "same" if not significant else ("faster" if ratio > 1.0 else "slower")
    return SpeedUp(ratio=ratio, ci_low=low, ci_high=high, significant=significant,
                   verdict=verdict)


def _interval(replicates: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(low), float(high)


def _check(per_process: Samples) -> list[Sequence[float]]:
    groups = [p for p in per_process if len(p) > 0]
    if not groups:
        raise ValueError("no step times: every timing process is empty")
    return groups
