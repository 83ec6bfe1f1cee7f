"""How often ``analysis diff``'s verdict is wrong, and how often it sees a known change.

    python benchmarks/diff_error_rates.py [OLD NEW]

OLD and NEW are two results folders of the same config on the same GPU and software (by
default the two published runs of the standard config on one H100: tests/fixtures/published/
h100-standard-efb5638 and published/h100/standard). Every run that finished on both sides is
an A/A pair: any verdict but ``within noise`` is false. A known change is the same pair with
every step of NEW made slower by a factor (5%, 10%, 15%, 20%): the processes keep their real
noise, and the change is known exactly; ``slower`` is a detection. Printed per rule: the
current verdict (analysis.outputs.diff_noise.verdict) and its two parts alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

from analysis.outputs.diff_load import find_runs, summary_runs_only
from analysis.outputs.diff_noise import (
    SLOWER,
    WITHIN_NOISE,
    Side,
    floor_rule,
    gap_rule,
    verdict,
)
from analysis.outputs.diff_verdicts import DEFAULT_THRESHOLD_PCT, side_stats
from analysis.outputs.runs import OK

REPO = Path(__file__).resolve().parent.parent
DEFAULT = (REPO / "tests/fixtures/published/h100-standard-efb5638",
           REPO / "published/h100/standard")
CHANGES = (1.05, 1.10, 1.15, 1.20)
THRESHOLD = DEFAULT_THRESHOLD_PCT / 100


def pairs(old: Path, new: Path) -> dict[str, tuple[list[list[float]], list[list[float]]]]:
    """Run name -> (old, new) per-process step times, for every run ok on both sides."""
    a, b = (summary_runs_only(p, find_runs(p)) for p in (old, new))
    out = {}
    for name in sorted(set(a) & set(b)):
        (ta, _), (tb, _) = a[name].timing(), b[name].timing()
        if ta.status == OK and tb.status == OK:
            out[name] = (ta.per_process_ms, tb.per_process_ms)
    return out


def rules(old: Side, new: Side) -> dict[str, bool]:
    """Whether the verdict and each of its rules call the pair changed (either way)."""
    return {"verdict": verdict(old, new, THRESHOLD) != WITHIN_NOISE,
            "CIs apart beyond the noise floor": floor_rule(old, new, THRESHOLD) != 0,
            "processes apart": gap_rule(old, new, THRESHOLD) != 0}


def main(argv: list[str]) -> int:
    old, new = (Path(p) for p in argv) if len(argv) == 2 else DEFAULT
    found = pairs(old, new)
    print(f"{len(found)} A/A pairs ({old.name} vs {new.name}), threshold {THRESHOLD:.0%}")
    false = {}
    for name, (a, b) in found.items():
        for rule, hit in rules(side_stats(a)[0], side_stats(b)[0]).items():
            false.setdefault(rule, []).extend([name] if hit else [])
    for rule, names in false.items():
        print(f"  A/A, {rule}: {len(names)} false ({len(names) / len(found):.1%}): "
              f"{', '.join(names)}")
    for factor in CHANGES:
        hits, quiet, quiet_hits = 0, 0, 0
        for a, b in found.values():
            slowed = [[ms * factor for ms in process] for process in b]
            old_side, new_side = side_stats(a)[0], side_stats(slowed)[0]
            hit = verdict(old_side, new_side, THRESHOLD) == SLOWER
            hits += hit
            # a run whose processes spread by less than half the change on each side
            if max(spread(old_side), spread(new_side)) < (factor - 1) / 2:
                quiet, quiet_hits = quiet + 1, quiet_hits + hit
        print(f"  NEW {factor - 1:.0%} slower: read slower in {hits} of {len(found)} "
              f"({hits / len(found):.0%}); of the runs whose processes spread by less than "
              f"half that: {quiet_hits} of {quiet}")
    return 0


def spread(side: Side) -> float:
    """The slowest process's median over the fastest's, minus 1."""
    return max(side.process_medians_ms) / min(side.process_medians_ms) - 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
