"""Every measured gain of a finding, in every published results folder, is attributed honestly.

For each folder under published/ with a summary.csv, the findings are made again (into a
temporary folder; published/ is only read) and every finding with a measured gain is held to
the rule: the gain lists every key in which the measuring run differs from the finding's run;
when those differences are more than one recommended change, the finding says "joint gain",
names every difference, and quotes the gain of a change alone where the run's ladder has a
rung that makes only that change. The run configurations are read from each folder's own
records here, not from the findings code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import REPO

from analysis.outputs.finding_base import MEASUREMENT_KEYS, Finding, finding_sentence
from analysis.outputs.findings import find_all, findings_table
from analysis.outputs.runs import empty_cell

PUBLISHED = REPO / "published"
# the results folders published before, kept as test fixtures: more ladders and rules to hold
EARLIER = REPO / "tests" / "fixtures" / "published"
FOLDERS = sorted(p.parent for root in (PUBLISHED, EARLIER) for p in root.rglob("summary.csv"))
# A quoted gain alone: "<rung> vs <rung before> (key=value, ...): 1.23× (95% CI 1.10-1.35)".
SINGLE = re.compile(r"(\S+) vs (\S+) \(([^)]*)\): ([\d.]+)× \(95% CI ([\d.]+)-([\d.]+)\)")


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_config(folder: Path, run: str, plan: dict[str, Any], row: pd.Series) -> dict[str, str]:
    """A run's keys as its workload recorded them (its first timing record that measured,
    else any, else the traced record), else as planned, else its summary row; as text."""
    paths = sorted((folder / run / "timing").glob("r*.json"), key=lambda p: int(p.stem[1:]))
    records = [r for r in (_json(p) for p in paths) if r]
    measured = [r for r in records if r.get("status", "ok") == "ok" and r.get("step_ms")]
    record = (measured or records or [_json(folder / run / "times.json") or {}])[0]
    if record.get("params"):
        params = {"workload": record.get("workload"), **record["params"]}
    elif run in plan.get("runs", {}):
        params = plan["runs"][run]["params"]
    else:
        params = {k: v for k, v in row.items() if not empty_cell(v)}
    return {k: str(v) for k, v in params.items() if k not in MEASUREMENT_KEYS}


def differences(a: dict[str, str], b: dict[str, str]) -> dict[str, str]:
    """key -> b's value, for every key the two configurations differ in."""
    return {k: b.get(k, "None") for k in set(a) | set(b) if a.get(k) != b.get(k)}


def parse_changes(text: Any, sep: str = "; ") -> dict[str, str]:
    if empty_cell(text) or not text:
        return {}
    return dict(part.split("=", 1) for part in str(text).split(sep))


def ladder_pairs(summary: pd.DataFrame, run: str) -> list[tuple[str, str]]:
    """(rung before, rung) for consecutive finished rungs of the run's ladder group."""
    if "ladder" not in summary:
        return []
    row = summary.set_index("run").loc[run]
    if not isinstance(row.get("ladder"), str):
        return []
    group = summary[(summary["ladder"] == row["ladder"])
                    & (summary["ladder_group"] == row["ladder_group"])
                    & (summary["status"] == "ok")].sort_values("rung_index")
    rungs = list(group["run"])
    return list(zip(rungs, rungs[1:], strict=False))


class Folder:
    """One published results folder, its findings made again, and its runs' configurations."""

    def __init__(self, folder: Path, out: Path) -> None:
        self.folder = folder
        self.summary = pd.read_csv(folder / "summary.csv")
        found = find_all(folder, self.summary)
        out.parent.mkdir(parents=True, exist_ok=True)
        findings_table(found).to_csv(out, index=False)
        self.findings = [Finding(**{k: (None if empty_cell(v) else v) for k, v in rec.items()})
                         for rec in pd.read_csv(out).to_dict("records")]
        plan = _json(folder / "plan.json") or {}
        self.configs = {str(r["run"]): run_config(folder, str(r["run"]), plan, r)
                        for _, r in self.summary.iterrows()}
        self.step_ms = self.summary.set_index("run").get("step_ms")

    def ratio(self, a: str, b: str) -> float:
        return float(self.step_ms[a] / self.step_ms[b])


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Folder]:
    out = tmp_path_factory.mktemp("published_findings")
    return {f: Folder(f, out / f.relative_to(REPO) / "findings.csv") for f in FOLDERS}


def check_gain(folder: Folder, f: Finding) -> str | None:
    """The rule for one finding with a measured gain; None when it holds, else what fails."""
    mine, theirs = folder.configs[f.run], folder.configs[f.gain_run]
    diff = differences(mine, theirs)
    if parse_changes(f.gain_changes) != diff:
        return f"gain_changes {f.gain_changes!r} but the runs differ in {diff}"
    if folder.step_ms is not None and f.gain != pytest.approx(folder.ratio(f.run, f.gain_run)):
        return f"gain {f.gain} is not the step-time ratio of the two runs"
    alternatives = [set(a.split(",")) for a in str(f.fix_keys).split(" | ")]
    alone = any(set(diff) <= a for a in alternatives)
    sentence = finding_sentence(f)
    if alone:
        if f.joint_keys or "joint" in sentence or f.single_gains:
            return "a gain of the fix alone is called joint"
        return None
    if not f.joint_keys or not set(parse_changes(f.joint_keys)) < set(diff):
        return f"joint_keys {f.joint_keys!r} do not name the differences beyond the fix"
    if "joint gain" not in sentence or any(f"{k}={v}" not in sentence for k, v in diff.items()):
        return f"the sentence does not say joint gain of every difference: {sentence}"
    return check_single_gains(folder, f, diff, alternatives)


def check_single_gains(folder: Folder, f: Finding, diff: dict[str, str],
                       alternatives: list[set[str]]) -> str | None:
    """Each quoted gain alone is a rung over the one before it in the run's ladder, changing
    only keys of one fix that the measuring run also changed; one is quoted when the ladder
    has a rung that makes one of those changes, to the measuring run's values."""
    pairs = ladder_pairs(folder.summary, f.run)
    quoted = SINGLE.findall(f.single_gains or "")
    if len(quoted) != len([p for p in (f.single_gains or "").split("; ") if p]):
        return f"single_gains {f.single_gains!r} not in the documented form"
    for rung, before, changes, gain, _, _ in quoted:
        pair_diff = differences(folder.configs[before], folder.configs[rung])
        if (before, rung) not in pairs or parse_changes(changes, ", ") != pair_diff:
            return f"{rung} vs {before} is not one rung over the one before, changing {changes}"
        if not set(pair_diff) <= set(diff) or not any(set(pair_diff) <= a for a in alternatives):
            return f"{rung} vs {before} changes more than one fix the gain run has"
        if float(gain) != pytest.approx(folder.ratio(before, rung), abs=0.006):
            return f"{rung} vs {before}: {gain} is not their step-time ratio"
    theirs = folder.configs[f.gain_run]
    available = [
        (before, rung) for before, rung in pairs
        if (d := differences(folder.configs[before], folder.configs[rung]))
        and set(d) <= set(diff) and any(set(d) <= a for a in alternatives)
        and all(theirs.get(k) == v for k, v in d.items())]
    if available and not quoted:
        return f"no gain alone quoted although the ladder has {available}"
    return None


@pytest.mark.parametrize("folder", FOLDERS, ids=[str(f.relative_to(REPO)) for f in FOLDERS])
def test_every_measured_gain_names_every_difference(made: dict[Path, Folder],
                                                    folder: Path) -> None:
    data = made[folder]
    failures = [(f.rule, f.run, problem) for f in data.findings if f.gain is not None
                and (problem := check_gain(data, f))]
    assert not failures, failures


def test_the_rule_is_exercised(made: dict[Path, Folder]) -> None:
    """The published folders hold gains of every kind the rule covers: a fix alone, a joint
    gain, and a joint gain with the fix's own gain quoted from the ladder."""
    gains = [f for data in made.values() for f in data.findings if f.gain is not None]
    assert len(FOLDERS) >= 2
    assert any(not f.joint_keys for f in gains)
    assert any(f.joint_keys and not f.single_gains for f in gains)
    assert any(f.single_gains for f in gains)


def _standard_folder() -> Path:
    """The standard config's H100 results: the folder the example comes from."""
    candidates = [PUBLISHED / "h100" / "standard", EARLIER / "h100-standard-efb5638"]
    found = [c for c in candidates if (c / "summary.csv").is_file()]
    if not found:
        pytest.fail(f"none of {candidates} holds the standard config's results")
    return found[0]


def test_a_cast_finding_on_the_bf16_rung_is_a_joint_gain_with_every_difference(
        made: dict[Path, Folder]) -> None:
    """The bf16 rung's cast findings: the measuring rung also compiles, changes attention and
    the optimizer; all of it is named, and compile's own gain comes from the rung that adds
    only compile."""
    data = made[_standard_folder()]
    run = "gpt_train_small_2_bf16"
    casts = [f for f in data.findings if f.run == run and f.rule in ("autocast_casts",
                                                                      "dominant_op")]
    assert {f.rule for f in casts} == {"autocast_casts", "dominant_op"}
    for f in casts:
        diff = differences(data.configs[run], data.configs[f.gain_run])
        assert "compile" in diff and len(diff) > 1
        assert parse_changes(f.gain_changes) == diff
        sentence = finding_sentence(f)
        assert "joint gain" in sentence and f"compile={diff['compile']}" in sentence
        # compile alone: the one rung of the ladder whose only change is compile
        alone = [(b, r) for b, r in ladder_pairs(data.summary, run)
                 if set(differences(data.configs[b], data.configs[r])) == {"compile"}
                 and data.configs[b].get("compile") == "off"]
        assert len(alone) == 1
        before, rung = alone[0]
        assert f"{rung} vs {before} (compile=" in f.single_gains
        assert f.single_gains in sentence


def test_the_checkpoint_trade_is_the_twins_peak_and_step_time() -> None:
    """The published H200 memory run: each checkpoint_trade finding against its twin's cells,
    computed here from summary.csv and the timing records."""
    folder = PUBLISHED / "h200" / "memory"
    summary = pd.read_csv(folder / "summary.csv").set_index("run")
    findings = pd.read_csv(folder / "findings.csv")
    trades = findings[findings.rule == "checkpoint_trade"].set_index("run")
    assert set(trades.index) == {"gpt_checkpoint_2.7B_1_checkpoint_layers",
                                 "cs336_checkpoint_all_1_checkpoint_layers"}
    for run, f in trades.iterrows():
        twin = run.replace("_1_checkpoint_layers", "_0_bf16_eager")
        assert f.gain_run == twin
        before, after = summary.loc[twin, "peak_memory_gib"], summary.loc[run, "peak_memory_gib"]
        assert f.value == pytest.approx(1 - after / before)
        assert f"peak {before:.2f} → {after:.2f} GiB" in f.title
        # the speed-up of the twin: the ratio of the runs' untraced medians
        ratio = summary.loc[run, "step_ms"] / summary.loc[twin, "step_ms"]
        assert f.gain == pytest.approx(ratio, rel=0.02)
        assert f.gain_ci_low <= ratio <= f.gain_ci_high
        assert f"{ratio - 1:+.0%} step time" in f.title
    assert trades.loc["gpt_checkpoint_2.7B_1_checkpoint_layers", "fix"].startswith(
        "train without activation checkpointing")  # 8% saved: below the 20% it needs
