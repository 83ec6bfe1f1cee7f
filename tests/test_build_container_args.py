"""scripts/build-container.sh decides APT_CHECK_VALID_UNTIL the same way every time.

It used to grep `apt-config dump` under `set -o pipefail`: grep -q exits at the match, the
rest of apt-config's output then hits a closed pipe (SIGPIPE, status 141) and the pipeline
counts as failed, so on a host with Check-Valid-Until "false" the build argument was "false"
or "true" depending on timing (about one call in ten on this machine)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "scripts" / "build-container.sh"


def decided(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BUILD), "--print-apt-check-valid-until", *args],
                          capture_output=True, text=True, check=False)


def host_setting() -> str:
    """The host's apt setting, asked directly (one key, no pipe)."""
    if not shutil.which("apt-config"):
        return "true"
    out = subprocess.run(["apt-config", "shell", "v", "Acquire::Check-Valid-Until/b"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return "false" if out == "v='false'" else "true"


def test_value_follows_the_host_every_time() -> None:
    values = {decided().stdout.strip() for _ in range(100)}
    assert values == {host_setting()}


@pytest.mark.parametrize("value", ["true", "false"])
def test_explicit_value_wins(value: str) -> None:
    done = decided("--apt-check-valid-until", value)
    assert done.returncode == 0 and done.stdout.strip() == value


def test_bad_value_is_named() -> None:
    done = decided("--apt-check-valid-until", "maybe")
    assert done.returncode == 2
    assert "--apt-check-valid-until must be true or false, not 'maybe'" in done.stderr
