"""The commit a results folder was made from, decided once at plan time.

A copy of the tree without `.git` (shipped to a GPU host or a cluster node) carries
`.profbench-git.json` from scripts/stamp-git.sh; PROFBENCH_GIT_COMMIT / PROFBENCH_GIT_DIRTY,
when set, are taken as they are. Every job inherits them (workloads/provenance.py reads them),
so rows carry the commit even where the job runs without a checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

COMMIT_VAR, DIRTY_VAR = "PROFBENCH_GIT_COMMIT", "PROFBENCH_GIT_DIRTY"
STAMP = ".profbench-git.json"


def git_state(repo: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout at ``repo``.

    The environment variables win. The stamp wins over git when git has no `.git` here, or
    one that does not know the stamped commit (a stale `.git` copied alongside newer files);
    a stamp left in a checkout whose HEAD moved on is ignored.
    """
    if os.environ.get(COMMIT_VAR):
        return os.environ[COMMIT_VAR], os.environ.get(DIRTY_VAR) == "1"

    def git(*args: str) -> str | None:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    stamp = repo / STAMP
    info = json.loads(stamp.read_text()) if stamp.is_file() else {}
    stamped = info.get("commit")
    if stamped and stamped != commit and (
        commit is None or git("cat-file", "-e", f"{stamped}^{{commit}}") is None
    ):
        return stamped, bool(info.get("dirty"))
    if commit:
        return commit, bool(git("status", "--porcelain", "--untracked-files=no"))
    return None, None


def export_git_state(commit: str | None, dirty: bool | None) -> None:
    """Hand the state to every job through the environment."""
    if commit:
        os.environ[COMMIT_VAR] = commit
        os.environ[DIRTY_VAR] = "1" if dirty else "0"
