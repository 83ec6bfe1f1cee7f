"""The verdict of ``analysis diff`` for one run: ``slower``, ``faster``, ``within noise`` or
``inconclusive``.

A run is timed by a few processes (2-3 by default) of a few steps each. Its 95% CI (the
hierarchical bootstrap of :mod:`analysis.metrics.timing`) covers step-to-step noise well but
process-to-process noise badly: with three processes a resample hardly reaches past the
slowest or fastest process, so the interval is about as wide as the processes' own spread,
however little three processes say about the next three. Two pipeline runs on the same GPU and
software then differ by more than their CIs allow, and a diff of 90 runs finds a handful of
"regressions" in noise alone.

The rule (``verdict``) therefore asks for two things, in the spirit of asv (its ``compare``
needs non-overlapping 99% intervals when there are too few samples for a rank test; its
regression detection needs a step to clear the noise estimate):

1. **the CIs separate**: slower needs NEW's CI low above OLD's CI high (faster: the reverse);
2. **the change clears the noise floor**: the factor ``new / old`` (slower) or ``old / new``
   (faster), minus 1, exceeds the run's ``noise_floor``: the largest of

   * the threshold (``--threshold``, the smallest change worth reporting);
   * each side's CI half-width relative to its estimate (step noise);
   * each side's *process noise*: the half-width of a 99% Student-t interval over its
     per-process median step times, ``t(0.995, n-1) * sd / sqrt(n)``, relative to the
     estimate. Student's t charges the few processes what they are worth (n = 2: t = 63.7,
     n = 3: 9.9, n = 10: 3.2); a side with one process has no process noise to measure (its
     floor is the other terms, and the diff says a traced side is indicative only).

That floor cannot see a real change on three processes: with t = 9.9, a side whose
processes spread by 6% has a floor near 18%, which a +17% step (every new process slower
than every old one) does not clear. So a second way to a verdict looks at the processes
themselves:

3. **the processes separate by more than the threshold and their own spread**
   (``gap_rule``): every process of NEW is slower than every process of OLD (``process_gap``:
   the fastest NEW process's median over the slowest OLD one's, minus 1) by more than the
   threshold, either side's relative CI half-width and either side's *process spread* (its
   slowest process's median over its fastest one's, minus 1), with at least two processes a
   side; faster the reverse. The spread term is what keeps a change of the host out: a side
   whose own processes differ by 26% (a host-bound step following the host CPU's speed, a
   CPU run sharing its cores) cannot vouch that a 24% gap to the other side is the code's.

When neither rule calls the pair changed, the answer depends on what the pair could have
seen. **within noise**: its noise floor is the threshold, so a change larger than the
threshold would have cleared it. **inconclusive**: the floor is above the threshold (the
processes spread, or the steps scatter, too much for three processes to show a change of the
threshold's size); :func:`processes_needed` estimates the timing processes a side would need
(``timing: {repeats: N}``) to bring the floor down to the threshold, and
:mod:`analysis.outputs.diff_rerun` writes the config fragment that reruns those runs so.

Measured on the two published runs of the standard config on one H100 (90 A/A pairs of
three processes each) and on repeated CPU pipeline runs with known delays: docs/diff.md
("Its error rates, measured"), benchmarks/diff_error_rates.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

SLOWER, FASTER, WITHIN_NOISE, INCONCLUSIVE = (
    "slower", "faster", "within noise", "inconclusive")
VERDICTS = (SLOWER, FASTER, WITHIN_NOISE, INCONCLUSIVE)
# processes_needed looks no further: past this many, the steps themselves are too noisy.
MAX_PROCESSES = 100
NOISE_CONFIDENCE = 0.99
# Student's t, two-sided 99% (the 0.995 quantile), by degrees of freedom.
T_995 = (63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169, 3.106, 3.055,
         3.012, 2.977, 2.947, 2.921, 2.898, 2.878, 2.861, 2.845, 2.831, 2.819, 2.807, 2.797,
         2.787, 2.779, 2.771, 2.763, 2.756, 2.750)


@dataclass(frozen=True)
class Side:
    """One side's step time of a run, in ms: the estimate, its 95% CI and the median step
    time of each of its processes."""

    median_ms: float
    ci_low_ms: float
    ci_high_ms: float
    process_medians_ms: tuple[float, ...]

    @property
    def ci_half_width_rel(self) -> float:
        return (self.ci_high_ms - self.ci_low_ms) / 2 / self.median_ms

    @property
    def process_noise_rel(self) -> float:
        return process_noise(self.process_medians_ms, self.median_ms)


def t_quantile_995(df: int) -> float:
    """Student's t 0.995 quantile: the table to 30 degrees of freedom, then the Cornish-Fisher
    expansion around the normal quantile (within 0.001 of the exact value beyond 30)."""
    if df < 1:
        raise ValueError(f"t quantile: {df} degrees of freedom")
    if df <= len(T_995):
        return T_995[df - 1]
    z = statistics.NormalDist().inv_cdf(0.995)
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def process_noise(process_medians_ms: Sequence[float], estimate_ms: float) -> float:
    """Half-width of a 99% Student-t interval over the per-process medians, relative to
    ``estimate_ms``; 0 with fewer than two processes (nothing to measure it from)."""
    n = len(process_medians_ms)
    if n < 2 or not estimate_ms > 0:
        return 0.0
    sd = statistics.stdev(process_medians_ms)
    return t_quantile_995(n - 1) * sd / math.sqrt(n) / estimate_ms


def noise_floor(old: Side, new: Side, threshold: float) -> float:
    """The smallest relative change (a factor minus 1) this run can show: the largest of the
    threshold, either side's relative CI half-width and either side's process noise."""
    return max(threshold, old.ci_half_width_rel, new.ci_half_width_rel,
               old.process_noise_rel, new.process_noise_rel)


# Processes a side needs for rule 3: one process against one is a single pair, no evidence.
MIN_SEPARATED_PROCESSES = 2


def process_gap(old: Side, new: Side) -> float:
    """How far apart the two sides' processes are: ``min(new) / max(old) - 1`` when every
    NEW process is slower than every OLD one (> 0), ``-(min(old) / max(new) - 1)`` when every
    OLD process is slower (< 0), else 0 (they interleave, or a side has fewer than
    ``MIN_SEPARATED_PROCESSES``)."""
    a, b = old.process_medians_ms, new.process_medians_ms
    if min(len(a), len(b)) < MIN_SEPARATED_PROCESSES:
        return 0.0
    if min(b) > max(a):
        return min(b) / max(a) - 1
    if min(a) > max(b):
        return -(min(a) / max(b) - 1)
    return 0.0


def floor_rule(old: Side, new: Side, threshold: float) -> int:
    """Rules 1 and 2: +1 (slower) when NEW's CI lies above OLD's and ``new / old - 1``
    exceeds :func:`noise_floor`, -1 (faster) the reverse, else 0."""
    floor = noise_floor(old, new, threshold)
    if new.ci_low_ms > old.ci_high_ms and new.median_ms / old.median_ms - 1 > floor:
        return 1
    if old.ci_low_ms > new.ci_high_ms and old.median_ms / new.median_ms - 1 > floor:
        return -1
    return 0


def process_spread(side: Side) -> float:
    """The side's slowest process median over its fastest, minus 1 (0 with one process)."""
    medians = side.process_medians_ms
    return max(medians) / min(medians) - 1 if medians and min(medians) > 0 else 0.0


def gap_rule(old: Side, new: Side, threshold: float) -> int:
    """Rule 3: +1 (slower) when every NEW process is slower than every OLD one by more than
    the threshold, the step noise (either side's relative CI half-width) and either side's
    :func:`process_spread`, -1 (faster) the reverse, else 0."""
    gap = process_gap(old, new)
    if abs(gap) > max(threshold, old.ci_half_width_rel, new.ci_half_width_rel,
                      process_spread(old), process_spread(new)):
        return 1 if gap > 0 else -1
    return 0


def judgeable(old: Side, new: Side, threshold: float) -> bool:
    """Whether the pair can show a change of the threshold's size: its noise floor is the
    threshold (no side's step or process noise is larger)."""
    return noise_floor(old, new, threshold) <= threshold


def side_processes_needed(side: Side, threshold: float) -> int | None:
    """The timing processes this side needs for its noise terms to fall to ``threshold``:
    its process noise, ``t(0.995, N-1) * sd / sqrt(N)`` with the sd its processes show now,
    and its CI half-width, taken to narrow as ``1 / sqrt(N)``. Its own count when already
    there; None past :data:`MAX_PROCESSES`."""
    n = len(side.process_medians_ms)
    if not side.median_ms > 0:
        return None
    sd_rel = statistics.stdev(side.process_medians_ms) / side.median_ms if n > 1 else 0.0
    for count in range(max(n, 1), MAX_PROCESSES + 1):
        process = t_quantile_995(count - 1) * sd_rel / math.sqrt(count) if count > 1 else 0.0
        if max(process, side.ci_half_width_rel * math.sqrt(max(n, 1) / count)) <= threshold:
            return count
    return None


def processes_needed(old: Side, new: Side, threshold: float) -> int | None:
    """Timing processes per side (``timing: {repeats: N}``) for the pair to be
    :func:`judgeable`, the larger of the two sides' needs; None past
    :data:`MAX_PROCESSES`."""
    needs = [side_processes_needed(s, threshold) for s in (old, new)]
    return None if None in needs else max(n for n in needs if n is not None)


def verdict(old: Side, new: Side, threshold: float) -> str:
    """``slower`` when :func:`floor_rule` or :func:`gap_rule` says so, ``faster`` likewise
    (they never disagree: each needs the two sides apart); else ``within noise`` when the
    pair is :func:`judgeable`, ``inconclusive`` when it is not. ``threshold`` is a fraction
    (0.05 for 5%). Pure: the same numbers always give the same verdict."""
    direction = floor_rule(old, new, threshold) or gap_rule(old, new, threshold)
    if direction:
        return SLOWER if direction > 0 else FASTER
    return WITHIN_NOISE if judgeable(old, new, threshold) else INCONCLUSIVE
