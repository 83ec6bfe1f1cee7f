"""Shared test fixtures: the real tools the end-to-end tests drive (nsys, snakemake)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SMOKE_CONFIG = REPO / "tests" / "smoke.yaml"


@pytest.fixture(scope="session")
def nsys() -> str:
    """Path of a working nsys: PATH's, else the project's cached Debian install (installed
    on first use by scripts/install-nsys.sh, exactly as the pipeline does)."""
    done = subprocess.run(
        [str(REPO / "scripts" / "install-nsys.sh")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"scripts/install-nsys.sh failed:\n{done.stderr}"
    return done.stdout.strip().splitlines()[-1]


def snakemake(workdir: Path, *args: str, check: bool = True,
              env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the real Snakemake CLI on the repo's workflow with `workdir` as working directory."""
    env = {**os.environ, **(env_extra or {})}
    # Jobs run `python -m workloads/analysis` from the workdir: make the repo importable there
    # even when the project is not pip-installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        *args,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if check and done.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-6000:]}"
        )
    return done


@pytest.fixture(scope="session")
def smoke_workdir(tmp_path_factory: pytest.TempPathFactory, nsys: str) -> Path:
    """A complete CPU smoke pipeline run (real nsys, real Snakemake), shared by the tests."""
    workdir = tmp_path_factory.mktemp("smoke")
    snakemake(workdir, "--cores", "2", "--configfile", str(SMOKE_CONFIG))
    return workdir
