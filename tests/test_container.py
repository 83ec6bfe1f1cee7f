"""The profbench Apptainer image, end to end.

Builds the CPU variant of containers/profbench.def (cached by definition hash and build
arguments in $PROFBENCH_CACHE/images, so an unchanged definition is built once), checks its
provenance and a real Nsight Systems capture inside it, then runs part of the CPU smoke
pipeline with `--use-singularity` (a captured pair with its comparison, a failing run, a
timed-only one) and compares it with the host run of the same config.

Slow (a cold build takes a few minutes) but never skipped: CI must prove the container works.
Needs root on a Debian machine or a working `apptainer` (scripts/setup-apptainer.sh installs
one where there is none).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from conftest import SMOKE_CONFIG, guarded_capture, snakemake

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
DEFINITION = REPO / "containers" / "profbench.def"
BUILD_SCRIPT = REPO / "scripts" / "build-container.sh"


def _run(cmd, *, cwd=REPO, timeout=1800, env=None):
    """Run cmd; on failure, fail the test with its output (the useful part of a CI log)."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **(env or {}),
    }
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, cmd))} exited {done.returncode} in {cwd}\n"
            f"--- stdout\n{done.stdout[-6000:]}\n--- stderr\n{done.stderr[-6000:]}"
        )
    return done


def _definition_sha256() -> str:
    return hashlib.sha256(DEFINITION.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def apptainer() -> str:
    """The system's apptainer, else the project's cached relocatable install."""
    found = shutil.which("apptainer") or shutil.which("singularity")
    if found:
        return found
    return _run([REPO / "scripts" / "setup-apptainer.sh"], timeout=600).stdout.splitlines()[-1]


@pytest.fixture(scope="session")
def cpu_image(apptainer) -> Path:
    """The CPU image, built once per definition hash (the default CPU torch: see
    scripts/build-container.sh --help; PROFBENCH_TEST_TORCH overrides it)."""
    args = [BUILD_SCRIPT, "--variant", "cpu"]
    if os.environ.get("PROFBENCH_TEST_TORCH"):
        args += ["--torch", os.environ["PROFBENCH_TEST_TORCH"]]
    start = time.monotonic()
    done = _run(
        args,
        env={
            "PATH": f"{Path(apptainer).parent}{os.pathsep}"
            f"{Path(sys.executable).parent}{os.pathsep}"
            f"{os.environ.get('PATH', '')}"
        },
    )
    image = Path(done.stdout.splitlines()[-1])
    print(
        f"cpu image {image}: {time.monotonic() - start:.0f} s "
        f"({'cached' if 'cached' in done.stderr else 'built'}), "
        f"{image.stat().st_size / 2**20:.0f} MiB"
    )
    return image


def _exec(apptainer, image, *cmd, cwd=REPO, timeout=600, env=None):
    return _run([apptainer, "exec", "--bind", str(cwd), image, *cmd], cwd=cwd, timeout=timeout,
                env=env)


def test_image_provenance(apptainer, cpu_image):
    prov = json.loads(_exec(apptainer, cpu_image, "cat", "/opt/profbench/provenance.json").stdout)
    assert prov["environment"] == "container"
    assert prov["image"] == "profbench"
    assert prov["variant"] == "cpu"
    assert prov["definition_sha256"] == _definition_sha256()
    assert datetime.fromisoformat(prov["build_date"].replace("Z", "+00:00")).tzinfo is not None
    versions = prov["versions"]
    assert versions["torch"].startswith("2.13.0")
    assert versions["torch_cuda"] is None
    assert versions["nvtx"] == "0.2.10"  # newer nvtx is not recorded by this nsys
    assert versions["nsys"].startswith("2024.2.3")
    for key in ("python", "pandas", "numpy", "matplotlib", "pyyaml"):
        assert versions[key], key
    assert versions["snakemake"] is None  # snakemake runs on the host


def test_image_has_runtime_and_project_packages(apptainer, cpu_image, tmp_path):
    # From a directory without the working tree: the image's own copies are imported.
    code = (
        "import torch, nvtx, pandas, numpy, matplotlib, yaml, jsonschema, workloads, "
        "analysis, sys; print(sys.executable, workloads.__file__)"
    )
    out = _exec(apptainer, cpu_image, "python3", "-c", code, cwd=tmp_path).stdout
    assert out.startswith("/usr/bin/python3 ")
    assert "/usr/local/lib/python3.11/dist-packages/workloads/" in out


def test_cached_image_is_not_rebuilt(apptainer, cpu_image):
    start = time.monotonic()
    done = _run(
        [BUILD_SCRIPT, "--variant", "cpu"]
        + (
            ["--torch", os.environ["PROFBENCH_TEST_TORCH"]]
            if os.environ.get("PROFBENCH_TEST_TORCH")
            else []
        )
    )
    assert Path(done.stdout.splitlines()[-1]) == cpu_image
    assert "cached" in done.stderr
    assert time.monotonic() - start < 60
    # The key is the definition's hash (and build arguments): it names the image.
    assert re.fullmatch(r"profbench-cpu-[0-9a-f]{12}\.sif", cpu_image.name)


def _nvtx_ranges(sqlite_path: Path) -> Counter:
    """NVTX range names and instance counts recorded in an nsys SQLite export."""
    with sqlite3.connect(sqlite_path) as db:
        rows = db.execute(
            "SELECT COALESCE(e.text, s.value) FROM NVTX_EVENTS e "
            "LEFT JOIN StringIds s ON e.textId = s.id "
            "WHERE e.end IS NOT NULL AND e.eventType IN (59, 60)"  # push/pop, start/end
        ).fetchall()
    return Counter(name for (name,) in rows)


def test_nsys_capture_inside_image(apptainer, cpu_image, tmp_path):
    code = (
        "import nvtx, torch\n"
        "for _ in range(3):\n"
        "    with nvtx.annotate('probe_range'):\n"
        "        torch.ones(64, 64) @ torch.ones(64, 64)\n"
    )
    # As the pipeline's jobs run in the image: under its guard (the image's own copy).
    guarded_capture(
        [apptainer, "exec", "--bind", str(tmp_path), cpu_image, "python3"],
        ["nsys", "profile", "--trace=nvtx,osrt", "--sample=none", "--cpuctxsw=none",
         "--export=sqlite", "-o", tmp_path / "probe", "python3", "-c", code],
        tmp_path / "probe.json",
        tmp_path / "probe.sqlite",
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # nsys' session state of this capture alone
    )
    assert _nvtx_ranges(tmp_path / "probe.sqlite")["probe_range"] == 3
    stats = _exec(
        apptainer,
        cpu_image,
        "nsys",
        "stats",
        "--report",
        "nvtx_sum",
        "--format",
        "csv",
        tmp_path / "probe.sqlite",
        cwd=tmp_path,
    ).stdout
    assert "probe_range" in stats


# --- the smoke pipeline, in the image and on the host ---------------------------------------
# The host run is conftest's `smoke_workdir` (shared with test_pipeline.py); the container run
# uses the same Snakemake invocation (`--snakefile <repo>/Snakefile --directory <tmp>`, the
# working tree on PYTHONPATH) plus --use-singularity. rules/container.smk finds the cached
# apptainer and binds the checkout into the jobs.


def _results_dir() -> str:
    return yaml.safe_load(SMOKE_CONFIG.read_text())["results"]


# The runs the image runs: a captured pair with their comparison, a run that fails (OOM) and a
# timed-only one. The host's smoke run (every run) has run the rest on the same code; the image
# adds what differs there (the environment), the same for every run.
CONTAINER_RUNS = ["attention_naive", "attention_sdpa", "gpt_small_oom", "attention_core_math"]


@pytest.fixture(scope="module")
def container_smoke(cpu_image, apptainer, tmp_path_factory):
    """(workdir, snakemake's stderr) of the CPU smoke pipeline run with --use-singularity,
    for CONTAINER_RUNS."""
    workdir = tmp_path_factory.mktemp("container-smoke")
    start = time.monotonic()
    done = snakemake(
        workdir, "--cores", "2", "--configfile", str(SMOKE_CONFIG), "--use-singularity",
        "--config", f"select=[{','.join(CONTAINER_RUNS)}]",
    )
    print(f"container smoke run: {time.monotonic() - start:.0f} s")
    # The pipeline's image is the cached build (hard link or copy), not a new build.
    linked = workdir / "resources" / "profbench-cpu.sif"
    assert linked.stat().st_size == cpu_image.stat().st_size
    return workdir, done.stderr


# torch's TORCH_TRACE logs of compiled runs are named by tempfile: the same log, another name
TORCH_TRACE_LOG = re.compile(r"dedicated_log_torch_trace_\w+\.log$")


def _files(root: Path) -> set[str]:
    return {TORCH_TRACE_LOG.sub("dedicated_log_torch_trace_*.log", str(p.relative_to(root)))
            for p in root.rglob("*") if p.is_file()}


def _run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("*/times.json"))


def host_smoke(request: pytest.FixtureRequest) -> Path:
    """conftest's smoke_workdir, asked for once the container run is there: a session fixture
    in the signature would be made first, and this worker would wait for (or make) the host
    run before starting the container's."""
    return request.getfixturevalue("smoke_workdir")


def test_pipeline_jobs_ran_in_the_image(container_smoke, request):
    workdir, log = container_smoke
    smoke_workdir = host_smoke(request)
    assert "build_container" in log
    runs = _run_dirs(workdir / _results_dir())
    assert runs, f"no <run>/times.json under {workdir / _results_dir()}"
    for run in runs:
        prov = json.loads((run / "times.json").read_text())["provenance"]
        assert prov["environment"] == "container", run.name
        assert prov["variant"] == "cpu"
        assert prov["definition_sha256"] == _definition_sha256()
    for run in _run_dirs(smoke_workdir / _results_dir()):
        prov = json.loads((run / "times.json").read_text())["provenance"]
        assert prov["environment"] == "host", run.name


def _selected(files: set[str]) -> set[str]:
    """The files of CONTAINER_RUNS' folders (the results folder's own files aside)."""
    return {f for f in files if f.split("/", 1)[0] in CONTAINER_RUNS}


def test_pipeline_outputs_match_host_run(container_smoke, request):
    ctr = container_smoke[0] / _results_dir()
    host = host_smoke(request) / _results_dir()
    # every file the runs made, as on the host
    assert _selected(_files(ctr)) == _selected(_files(host))
    assert [p.name for p in _run_dirs(ctr)] == [p.name for p in _run_dirs(host)
                                                if p.name in CONTAINER_RUNS]
    # the results folder's own outputs (summary, report stage, the comparison of the pair)
    # are there as on the host; the image's build log only where the image was built
    shared = {f for f in _files(ctr) if not _selected({f}) and not f.startswith("logs/")}
    assert shared and shared <= _files(host), shared - _files(host)
    assert {"summary.csv", "SUMMARY.md", "findings.csv",
            "compare/attention/speedup.csv"} <= shared
    assert "logs/build_container-cpu.log" in _files(ctr)
    for run in _run_dirs(ctr):
        run = host / run.name
        if (run / "profile.sqlite").stat().st_size == 0:  # a failed run's emptied capture
            assert (ctr / run.name / "profile.sqlite").stat().st_size == 0, run.name
            continue
        assert _nvtx_ranges(ctr / run.name / "profile.sqlite") == _nvtx_ranges(
            run / "profile.sqlite"
        ), run.name
    # Same CSV columns; provenance columns say where a row was made, so they differ by design.
    # A table over the results folder has the columns of the runs it holds: the image's, of
    # fewer runs, has a subset of the host's.
    for rel in sorted(f for f in _selected(_files(host)) | shared if f.endswith(".csv")):
        with open(host / rel, newline="") as a, open(ctr / rel, newline="") as b:
            columns = [
                [c for c in (next(csv.reader(f), None) or []) if not c.startswith("provenance_")]
                for f in (a, b)
            ]
        if rel in shared:
            assert set(columns[1]) <= set(columns[0]), rel
        else:
            assert columns[0] == columns[1], rel


def test_summary_provenance_columns(container_smoke, request):
    smoke_workdir = host_smoke(request)
    with open(container_smoke[0] / _results_dir() / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows
    assert {r["provenance_environment"] for r in rows} == {"container"}
    sha_cols = [c for c in rows[0] if c.startswith("provenance_") and "definition_sha256" in c]
    assert sha_cols, list(rows[0])
    assert {r[sha_cols[0]] for r in rows} == {_definition_sha256()}
    with open(smoke_workdir / _results_dir() / "summary.csv", newline="") as f:
        host_rows = list(csv.DictReader(f))
    assert {r["provenance_environment"] for r in host_rows} == {"host"}
    assert sorted(r["run"] for r in rows) == sorted(CONTAINER_RUNS)
    assert set(CONTAINER_RUNS) < {r["run"] for r in host_rows}


# --- acceptance: the dry run orders build_container first -----------------------------------


def test_dry_run_builds_container_before_profiling(apptainer, tmp_path):
    """`snakemake -n --cores 1 --use-singularity` (default config) plans build_container
    before every profiling job, and every profiling job has the image as an input."""
    plan = snakemake(tmp_path, "-n", "--cores", "1", "--use-singularity")
    order = re.findall(r"^(?:local)?rule (\w+):", plan.stdout, flags=re.M)
    assert "build_container" in order and "profile" in order, plan.stdout[-3000:]
    assert order.index("build_container") < order.index("profile")
    dag = snakemake(tmp_path, "--dag", "--cores", "1", "--use-singularity")
    labels = dict(re.findall(r'^\s*(\d+)\[label = "(\w+)', dag.stdout, flags=re.M))
    edges = re.findall(r"^\s*(\d+) -> (\d+)", dag.stdout, flags=re.M)
    build = {n for n, rule in labels.items() if rule == "build_container"}
    profiles = {n for n, rule in labels.items() if rule == "profile"}
    assert len(build) == 1 and profiles
    fed = {dst for src, dst in edges if src in build}
    assert profiles <= fed, "profile jobs without the image as input"
