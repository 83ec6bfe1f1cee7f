"""Shared test fixtures: the real tools the end-to-end tests drive (nsys, snakemake), and what
is expensive to make, made once per test run (also under pytest-xdist, where each worker is a
process of its own with its own session fixtures)."""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SMOKE_CONFIG = REPO / "tests" / "smoke.yaml"
# config.yaml's nsys tracer for the tests' own configs (tests/smoke.yaml says why: OS runtime
# tracing, the schema's default, feeds no table and costs every CPU capture 2-3 s)
LEAN_NSYS = {"trace": "cuda,nvtx"}


# `make test` runs pytest-xdist with `--dist loadfile`: each file goes whole to one worker (a
# file's module fixtures are made once), in collection order, the next file to the first
# worker with at most two tests left. The files that take longest come first. The smoke run
# (test_pipeline.py), which several files compare with, and the distributed runs start at
# once; the Slurm cluster and the container tests follow, so that their comparisons with the
# smoke run find it made instead of waiting for it. test_workloads.py's compiled run
# shares its graphs with test_compile_blocks.py's (Inductor's cache): files apart, so that one
# finds what the other compiled rather than compiling it at the same time.
FIRST_FILES = ("test_pipeline.py", "test_distributed.py", "test_slurm.py", "test_container.py",
               "test_resume_anywhere.py", "test_model_workload.py", "test_warm.py",
               "test_compile_blocks.py", "test_resume.py", "test_diff.py", "test_launch.py",
               "test_model_examples.py", "test_workloads.py", "test_config.py",
               "test_model_compile_once.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first, the rest in their usual order."""

    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return FIRST_FILES.index(name) if name in FIRST_FILES else len(FIRST_FILES)

    items.sort(key=rank)  # stable: the collection order within each rank


def shared_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This test run's temporary folder, the same for every xdist worker (each worker has its
    own base folder below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], object]) -> Path:
    """The folder `name`, made by `build(folder)` once per test run: the first worker to ask
    builds it under a file lock, the others wait for it and share it. A failed build is
    reported to every worker that asks, not attempted again."""
    root = shared_tmp(tmp_path_factory)
    folder, done, failed = root / name, root / f"{name}.done", root / f"{name}.failed"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if failed.exists():
            pytest.fail(f"{name}: built by another worker, and that failed:\n"
                        f"{failed.read_text()}", pytrace=False)
        if not done.exists():
            folder.mkdir()
            try:
                build(folder)
            except BaseException as err:
                failed.write_text(str(err)[-6000:])
                raise
            done.touch()
    return folder


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> None:
    """One CPU thread for the torch work the tests do in this process, as the pipeline's jobs
    have. `make test` runs a pytest-xdist worker per core: torch's default of a thread per
    core in each worker oversubscribes the cores, and OpenMP threads that spin while they wait
    take the other worker's core (a GPT small step under FlopCounterMode: 28 s instead of
    10 s beside another worker). Not through OMP_NUM_THREADS: the processes the tests start
    would inherit it (`nproc` obeys it: a test Slurm node would get one CPU)."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def inductor_cache_of_this_user() -> None:
    """Inductor's cache where a pipeline's jobs keep it outside the tests: torch's default,
    $TMPDIR/torchinductor_<user> of this process (the tests' own compiles use it too), not
    under the private TMPDIR each test pipeline gets for Nsight Systems (`private_tmpdir`). So
    a test pipeline compiles as a user's rerun does, and what any cold cache costs once (a
    tiny model's first compile takes about 20 s of CPU more than the next) is not paid again
    by every pipeline. A cache named by the environment is kept."""
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                          os.path.join(tempfile.gettempdir(), f"torchinductor_{user}"))


@pytest.fixture(scope="session")
def nsys(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Path of a working nsys: PATH's, else the project's cached Debian install (installed
    on first use by scripts/install-nsys.sh, exactly as the pipeline does)."""

    def install(folder: Path) -> None:
        done = subprocess.run(
            [str(REPO / "scripts" / "install-nsys.sh")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, f"scripts/install-nsys.sh failed:\n{done.stderr}"
        (folder / "path").write_text(done.stdout.strip().splitlines()[-1])

    # once per test run: two workers must not install into the same cache at once
    return (built_once(tmp_path_factory, "nsys", install) / "path").read_text()


def private_tmpdir(workdir: Path) -> str:
    """A TMPDIR of the pipeline run in `workdir` alone (next to it). Nsight Systems keeps its
    session state (session manager, agents) under $TMPDIR/nvidia, shared by every nsys of the
    same version on the machine, the image's included: captures of tests running side by
    side, or killed by a test, must not meet there."""
    tmp = workdir.with_name(f"{workdir.name}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    return str(tmp)


def guarded_capture(python: list[str], capture: list[str], result: Path, export: Path, *,
                    cwd: Path, env: dict[str, str] | None = None) -> dict:
    """Run an nsys capture as the pipeline's jobs do: under ``python -m pipeline.guard``,
    which starts a capture again when nsys loses its own agent while the session starts (a
    transient of nsys on a busy machine, not of the code under test). ``python`` is how the
    guard is started (this interpreter, or the image's). The guard's result, checked ok."""
    cmd = [*python, "-m", "pipeline.guard", "--out", str(result), "--expect", str(export),
           "--", *map(str, capture)]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and result.exists(), done.stdout[-4000:] + done.stderr[-4000:]
    outcome = json.loads(result.read_text())
    assert outcome["status"] == "ok", (outcome, done.stdout[-4000:], done.stderr[-4000:])
    return outcome


def copy_checkout(dest: Path, skip: tuple[str, ...] = ("tests/fixtures/", "published/")) -> Path:
    """This working tree's files (what a clone of this commit has, uncommitted changes
    included) copied to ``dest``, without the paths starting with ``skip``."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        if (REPO / name).is_file() and not name.startswith(skip):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


def snakemake(workdir: Path, *args: str, check: bool = True,
              env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the real Snakemake CLI on the repo's workflow with `workdir` as working directory
    (and a TMPDIR of its own, which Snakemake hands to its jobs)."""
    env = {**os.environ, "TMPDIR": private_tmpdir(workdir), **(env_extra or {})}
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


def stopped(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run the workflow for real; it must fail before any job. Returns its messages."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    done = snakemake(workdir, "--cores", "1", *args, check=False, env_extra=env)
    message = done.stdout + done.stderr
    assert done.returncode != 0, message[-3000:]
    made = [p.name for p in workdir.iterdir() if p.name != ".snakemake"]
    assert made == [], f"a job ran: {made}"
    assert "Finished job" not in message, "a job ran"
    return message


@pytest.fixture(scope="session")
def smoke_workdir(tmp_path_factory: pytest.TempPathFactory, nsys: str) -> Path:
    """A complete CPU smoke pipeline run (real nsys, real Snakemake), made once per test run
    and shared by every test that reads it, on every xdist worker. Read only: a test that
    runs jobs in it, deletes or adds files works on its own `smoke_copy`."""
    def run(workdir: Path) -> None:
        done = snakemake(workdir, "--cores", "2", "--configfile", str(SMOKE_CONFIG))
        smoke_console_file(workdir).write_text(done.stderr)

    return built_once(tmp_path_factory, "smoke", run)


def smoke_console_file(workdir: Path) -> Path:
    """What the smoke run's Snakemake printed (its stderr), kept beside its folder."""
    return workdir.with_name(f"{workdir.name}.console")


@pytest.fixture()
def smoke_copy(smoke_workdir: Path, tmp_path: Path) -> Path:
    """This test's own copy of the smoke run (files, timestamps and Snakemake's records), to
    rerun, edit or delete in."""
    copy = tmp_path / "smoke"
    shutil.copytree(smoke_workdir, copy, symlinks=True)
    return copy
