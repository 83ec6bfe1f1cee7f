"""Each summary row names the commit its own records ran at: a results folder resumed on
other machines (tests/fixtures/published/h100-resumed-two-commits: two commits) holds runs made at
different commits; only a run without any record takes the plan's."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from analysis.outputs.aggregate import summary_table

PUBLISHED = Path(__file__).resolve().parent / "fixtures" / "published" / "h100-resumed-two-commits"
RUNS = ["gpt_train_small_0_fp32_eager", "gpt_train_2.7B_7_step_graph",
        "fa_cudnn_b1_h16_s16384_d128_causalTrue_forward"]


def commits_in(folder: Path) -> set[str]:
    """The commits named in a run's JSON files, read as text (independent of the code)."""
    found = set()
    for path in [*folder.glob("timing/r*.json"), folder / "times.json"]:
        if path.is_file():
            found |= set(re.findall(r'"git_commit": "([0-9a-f]{40})"', path.read_text()))
    return found


def test_rows_carry_their_own_commits(tmp_path: Path) -> None:
    plan = json.loads((PUBLISHED / "plan.json").read_text())
    recordless = "gpt_small_train_fp32_b256_ctx1024"  # its records are not copied
    plan["runs"] = {run: plan["runs"][run] for run in [*RUNS, recordless]}
    for run in RUNS:
        shutil.copytree(PUBLISHED / run, tmp_path / run)
    plan["git"] = {"commit": "f" * 40, "dirty": False}  # the plan's: only for recordless runs
    table = summary_table(tmp_path, plan).set_index("run")
    expected = {run: " ".join(sorted(commits_in(tmp_path / run))) for run in RUNS}
    assert len({len(c.split()) for c in expected.values()}) > 1  # one and two commits
    for run, commits in expected.items():
        assert table.loc[run, "provenance_git_commit"] == commits
        assert not table.loc[run, "provenance_git_dirty"]
    assert table.loc[recordless, "provenance_git_commit"] == "f" * 40
