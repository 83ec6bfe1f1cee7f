"""Every example in the README runs as written, as far as a machine without a GPU can run it.

Each fenced block of README.md follows a marker that says how it is checked:
- `config`: the YAML is a config the workflow accepts and plans (a real Snakemake dry run);
- `dry-run`: each `snakemake` command is planned by a real Snakemake dry run (`-n`), targets
  and `--config` as written;
- `quickstart`, `host`: `make run` (and its CONTAINER=none form) stop at once on this machine
  with the no-GPU message, `make test` is what it says;
- `cpu`: `make smoke` is the two commands below it, and they run here (the first is the shared
  smoke run of the test suite, the second runs on a copy of it);
- `none (why)`: not a command (a listing), or run by the test named in the reason.
A block without a marker fails, so a new example cannot slip past this test.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO, snakemake

README = REPO / "README.md"
BLOCK = re.compile(r"(?:<!-- example: (?P<kind>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```",
                   re.S)
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": "-1"}


def readme_blocks() -> list[tuple[str, str]]:
    """(marker, body) of each fenced block, in order."""
    return [(m["kind"] or "", m["body"]) for m in BLOCK.finditer(README.read_text())]


def blocks_of(kind: str) -> list[str]:
    return [body for marker, body in readme_blocks() if marker.split(" ")[0] == kind]


def commands(body: str) -> list[list[str]]:
    """The block's command lines, split as a shell would (comments dropped)."""
    return [shlex.split(line, comments=True) for line in body.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def dry_run(workdir: Path, args: list[str]) -> str:
    """A README snakemake command as a real dry run: `.venv/bin/snakemake` and `snakemake` are
    this interpreter's Snakemake on the repository's workflow, run in `workdir`."""
    done = snakemake(workdir, *args, "-n", check=False)
    message = done.stdout + done.stderr
    assert done.returncode == 0, f"snakemake {' '.join(args)}:\n{message[-3000:]}"
    return message


def test_every_block_says_how_it_is_checked() -> None:
    markers = [marker for marker, _ in readme_blocks()]
    assert markers and all(markers), f"a README block without an example marker: {markers}"
    known = {"config", "dry-run", "quickstart", "host", "cpu", "none"}
    assert {m.split(" ")[0] for m in markers} <= known, markers
    assert all(re.fullmatch(r"none \(.+\)", m) for m in markers if m.startswith("none"))


@pytest.mark.parametrize("body", blocks_of("config"))
def test_config_examples_are_accepted_and_planned(body: str, tmp_path: Path) -> None:
    config = tmp_path / "example.yaml"
    config.write_text(body)
    runs = yaml.safe_load(body)
    message = dry_run(tmp_path, ["--cores", "1", "--configfile", str(config)])
    # every named run is planned (a sweep's runs by their name pattern's fixed part)
    for name in runs.get("runs", {}):
        assert f"{runs['results']}/{name}/" in message, name


@pytest.mark.parametrize("body", blocks_of("dry-run"))
def test_dry_run_examples_plan(body: str, tmp_path: Path) -> None:
    ran = 0
    for words in commands(body):
        if words[0] in (".venv/bin/snakemake", "snakemake"):
            message = dry_run(tmp_path, words[1:])
            assert "Job stats" in message or "Nothing to be done" in message, message[-2000:]
            ran += 1
        else:
            assert words[:2] == ["pip", "install"], words  # set-up only
    assert ran


def _make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO,
                          capture_output=True, text=True, env=env)


@pytest.mark.parametrize("kind", ["quickstart", "host"])
def test_make_run_examples_stop_at_once_without_a_gpu(kind: str) -> None:
    (body,) = blocks_of(kind)
    for words in commands(body):
        assert words[0] == "make", words
        if words[1] == "test":
            planned = _make("-n", *words[1:])
            assert planned.returncode == 0 and "pytest" in planned.stdout
            continue
        done = _make(*words[1:], env=NO_GPU)
        assert done.returncode != 0
        assert "no NVIDIA GPU is visible" in done.stderr, done.stderr
        assert "snakemake" not in done.stdout and "run-on-host" not in done.stdout, done.stdout


def test_cpu_example_runs(smoke_copy: Path) -> None:
    (body,) = blocks_of("cpu")
    lines = commands(body)
    assert lines[0] == ["make", "smoke"]
    make_smoke = [shlex.split(line) for line in _make("-n", "smoke").stdout.splitlines()]
    assert make_smoke[-2:] == lines[1:], "make smoke is not the two commands the README shows"
    run, report = lines[1:]
    # the first command is the suite's shared smoke run (conftest.smoke_workdir), made with
    # these arguments; the report runs here, on a copy of it
    assert run[1:] == ["--cores", "2", "--configfile", "tests/smoke.yaml"]
    report_args = [str(REPO / a) if a == "tests/smoke.yaml" else a for a in report[1:]]
    snakemake(smoke_copy, *report_args)
    assert (smoke_copy / "results" / "smoke" / "report.html").stat().st_size > 100_000


def test_the_readme_tells_no_machine_story() -> None:
    text = README.read_text()
    # how a machine was obtained means nothing to a user (issue's own grep, kept out of this
    # file's text by a character class)
    assert not re.search(r"[l]ent (h100|gpu|machine|host)|[d]evice (tool|call|time)|"
                         r"[f]resh machines", text, re.I)
    assert len(text.splitlines()) <= 200
    assert not re.search(r"\b[0-9a-f]{7,40}\b", re.sub(r"`[^`]*`|\([^)]*\)", "", text)), \
        "a commit hash in the README's prose"
