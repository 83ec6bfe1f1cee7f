"""Step-time statistics (analysis/metrics/timing.py) against independent computations."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest

from analysis.metrics import timing
from analysis.metrics.timing import speedup, summarize


def order_statistic_median_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free CI of a median from order statistics (binomial ranks)."""
    n = len(values)
    ordered = sorted(values)
    # smallest j with P(Binomial(n, 1/2) < j) >= alpha/2, computed exactly
    alpha = 1 - confidence
    cdf, j = 0.0, 0
    while True:
        p = math.comb(n, j) / 2**n
        if cdf + p > alpha / 2:
            break
        cdf += p
        j += 1
    return ordered[j - 1] if j > 0 else ordered[0], ordered[n - j]


def python_hierarchical_bootstrap(groups: list[list[float]], resamples: int, seed: int):
    """The same estimator written independently with the random module."""
    rnd = random.Random(seed)
    reps = []
    for _ in range(resamples):
        drawn = [rnd.choice(groups) for _ in groups]
        medians = [statistics.median(rnd.choices(g, k=len(g))) for g in drawn]
        reps.append(statistics.median(medians))
    reps.sort()
    return reps[int(0.025 * resamples)], reps[int(0.975 * resamples) - 1]


def test_estimate_is_median_of_process_medians() -> None:
    groups = [[10.0, 11.0, 30.0], [12.0, 12.5, 13.0], [9.0, 9.5, 100.0]]
    s = summarize(groups)
    assert s.median_ms == statistics.median([11.0, 12.5, 9.5])
    every = sorted(x for g in groups for x in g)
    assert s.min_ms == every[0] and s.max_ms == every[-1]
    assert s.q1_ms == pytest.approx(float(np.percentile(every, 25)))
    assert s.iqr_ms == pytest.approx(float(np.percentile(every, 75) - np.percentile(every, 25)))
    assert (s.processes, s.steps) == (3, 9)


def test_single_process_ci_matches_order_statistics() -> None:
    gen = np.random.default_rng(7)
    values = list(gen.normal(50.0, 1.0, 200))
    s = summarize([values])
    low, high = order_statistic_median_ci(values)
    width = high - low
    assert s.ci_low_ms == pytest.approx(low, abs=0.35 * width)
    assert s.ci_high_ms == pytest.approx(high, abs=0.35 * width)
    assert s.ci_low_ms < statistics.median(values) < s.ci_high_ms


def test_hierarchical_ci_matches_an_independent_bootstrap() -> None:
    gen = np.random.default_rng(3)
    groups = [list(gen.normal(mu, 0.5, 20)) for mu in (20.0, 20.6, 19.7, 20.2, 20.9)]
    s = summarize(groups)
    low, high = python_hierarchical_bootstrap(groups, 4000, seed=11)
    width = high - low
    assert s.ci_low_ms == pytest.approx(low, abs=0.15 * width)
    assert s.ci_high_ms == pytest.approx(high, abs=0.15 * width)
    # Process-to-process spread dominates: the CI is much wider than one process's.
    one = summarize(groups[:1])
    assert (s.ci_high_ms - s.ci_low_ms) > 2 * (one.ci_high_ms - one.ci_low_ms)


def test_processes_of_unequal_length_match_an_independent_bootstrap() -> None:
    # A process cut short is resampled from its own few steps only: its resampled median
    # swings between 10 and 30 ms, which widens the interval (drawing as many steps as the
    # longest process has would pin it at 20).
    gen = np.random.default_rng(4)
    groups = [list(gen.normal(20.0, 0.1, 40)), [10.0, 20.0, 30.0]]
    s = summarize(groups)
    low, high = python_hierarchical_bootstrap(groups, 4000, seed=12)
    width = high - low
    assert width > 5.0
    assert s.ci_low_ms == pytest.approx(low, abs=0.15 * width)
    assert s.ci_high_ms == pytest.approx(high, abs=0.15 * width)


def test_replicates_drawn_in_blocks_match_an_independent_bootstrap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Many processes or steps: the replicates are drawn a block at a time (bounded memory).
    monkeypatch.setattr(timing, "BOOTSTRAP_BLOCK_VALUES", 500)
    gen = np.random.default_rng(6)
    groups = [list(gen.normal(mu, 0.5, 20)) for mu in (20.0, 20.6, 19.7, 20.2, 20.9)]
    assert timing.bootstrap_medians(groups).shape == (timing.BOOTSTRAP_RESAMPLES,)
    s = summarize(groups)
    low, high = python_hierarchical_bootstrap(groups, 4000, seed=13)
    width = high - low
    assert s.ci_low_ms == pytest.approx(low, abs=0.15 * width)
    assert s.ci_high_ms == pytest.approx(high, abs=0.15 * width)


def test_unstable_flag_follows_the_threshold() -> None:
    gen = np.random.default_rng(1)
    steady = [list(100 + gen.normal(0, 0.05, 10)) for _ in range(3)]
    noisy = [list(100 * m + gen.normal(0, 5, 10)) for m in (0.9, 1.0, 1.12)]
    assert not summarize(steady).unstable
    s = summarize(noisy)
    assert s.unstable and s.ci_half_width_rel > 0.03
    assert not summarize(noisy, unstable_threshold=s.ci_half_width_rel + 0.01).unstable
    assert s.ci_half_width_rel == pytest.approx((s.ci_high_ms - s.ci_low_ms) / 2 / s.median_ms)


def test_same_inputs_give_the_same_interval() -> None:
    groups = [[5.0, 5.1, 5.3, 4.9], [5.2, 5.0, 5.4]]
    assert summarize(groups) == summarize(groups)


def test_speedup_significance() -> None:
    gen = np.random.default_rng(5)
    slow = [list(gen.normal(40, 0.4, 10)) for _ in range(3)]
    fast = [list(gen.normal(20, 0.2, 10)) for _ in range(3)]
    twin = [list(gen.normal(40, 0.4, 10)) for _ in range(3)]
    s = speedup(slow, fast)
    assert s.verdict == "faster" and s.significant
    assert s.ci_low < s.ratio < s.ci_high and s.ratio == pytest.approx(2.0, rel=0.03)
    assert speedup(fast, slow).verdict == "slower"
    same = speedup(slow, twin)
    assert same.verdict == "same" and not same.significant and same.ci_low < 1 < same.ci_high


def test_empty_timing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no step times"):
        summarize([[], []])
