"""Every example of docs/workloads.md and docs/diff.md runs as written after `make setup`, as
far as a machine without a GPU can run it (the README's are tested the same way,
tests/test_readme_examples.py).

Each fenced block follows a marker that says how it is checked:
- `factory PATH`, `config PATH`: a file the blocks after it use, written to PATH in a fresh
  working folder;
- `dry-run`: each `.venv/bin/snakemake` command, planned there by a real Snakemake dry run;
- `report`: the report command, the README's report command for this config and results
  folder (that one runs for real, tests/test_readme_examples.py: a report needs a finished
  run, and the example's is a ladder of six rungs at 224x224 images);
- `diff`: each `.venv/bin/python -m analysis diff` command, run for real on two results
  folders (the two published runs of the standard config) as `results/old` and
  `results/new`;
- `config key`: a config fragment, accepted in the smoke config;
- `none (why)`: not a command (a synopsis, a sketch), or checked by the test named.
A block without a marker fails, so a new example cannot slip past this test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG
from test_readme_examples import BLOCK, blocks_of, commands, dry_run

from pipeline.config import resolve

DOCS = [REPO / "docs" / "workloads.md", REPO / "docs" / "diff.md"]
KNOWN = {"factory", "config", "dry-run", "report", "diff", "none"}
STANDARD_OLD = REPO / "tests" / "fixtures" / "published" / "h100-standard-efb5638"
STANDARD_NEW = REPO / "published" / "h100" / "standard"


def doc_blocks(doc: Path) -> list[tuple[str, str]]:
    """(marker, body) of each fenced block, in order."""
    return [(m["kind"] or "", m["body"]) for m in BLOCK.finditer(doc.read_text())]


def all_blocks(kind: str) -> list[tuple[str, str]]:
    return [(marker, body) for doc in DOCS for marker, body in doc_blocks(doc)
            if marker.split(" ")[0] == kind]


def venv_commands(body: str, program: list[str]) -> list[list[str]]:
    """The block's commands, each starting with ``program`` (the venv's path to it)."""
    lines = commands(body)
    for words in lines:
        assert words[:len(program)] == program, words
    return [words[len(program):] for words in lines]


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_block_says_how_it_is_checked(doc: Path) -> None:
    markers = [marker for marker, _ in doc_blocks(doc)]
    assert markers and all(markers), f"a block of {doc.name} without an example marker"
    assert {m.split(" ")[0] for m in markers} <= KNOWN, markers
    assert all(re.fullmatch(r"none \(.+\)", m) for m in markers if m.startswith("none"))


def test_own_model_example_is_planned_as_written(tmp_path: Path) -> None:
    """The factory file and my.yaml of docs/workloads.md, where they say they are, and the
    command that runs them: a real dry run plans every rung of the ladder, named as the
    docs say ladder runs are named."""
    for kind in ("factory", "config"):
        for marker, body in all_blocks(kind):
            if marker == "config key":
                continue
            path = tmp_path / marker.split(" ", 1)[1]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
    config = yaml.safe_load((tmp_path / "my.yaml").read_text())
    ladder = config["ladders"][0]
    (body,) = [b for _, b in all_blocks("dry-run")]
    for args in venv_commands(body, [".venv/bin/snakemake"]):
        # the config as written, in the working folder (Snakemake reads it before entering it)
        message = dry_run(tmp_path, [str(tmp_path / a) if (tmp_path / a).is_file() else a
                                     for a in args])
        for i, rung in enumerate(ladder["rungs"]):
            assert f"{config['results']}/{ladder['name']}_all_{i}_{rung['name']}/" in message
    assert f"`{ladder['name']}_all_0_{ladder['rungs'][0]['name']}`" in DOCS[0].read_text()


def test_report_example_is_the_readmes_report_command() -> None:
    (_, body), = all_blocks("report")
    (args,) = venv_commands(body, [".venv/bin/snakemake"])
    readme = commands(blocks_of("cpu")[0])[-1]
    mine = yaml.safe_load(next(b for m, b in all_blocks("config") if m == "config my.yaml"))
    smoke = yaml.safe_load(SMOKE_CONFIG.read_text())
    expected = [a.replace("tests/smoke.yaml", "my.yaml").replace(smoke["results"],
                                                                  mine["results"])
                for a in readme[1:]]
    assert args == expected, (args, expected)


def test_diff_examples_run(tmp_path: Path) -> None:
    (_, body), = all_blocks("diff")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "old").symlink_to(STANDARD_OLD)
    (tmp_path / "results" / "new").symlink_to(STANDARD_NEW)
    for args in venv_commands(body, [".venv/bin/python", "-m", "analysis", "diff"]):
        done = subprocess.run([sys.executable, "-m", "analysis", "diff", *args],
                              cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        # 1 is the gate's answer (--fail-on-slower: a run slower by more than PCT), 2 an error
        gate = "--fail-on-slower" in args and done.returncode == 1
        assert done.returncode == 0 or gate, done.stderr[-3000:]
        assert not gate or done.stderr.startswith("slower by more than 10%: ")
        assert (tmp_path / "results" / "diff" / "summary.md").is_file()
        assert "runs matched" in done.stdout


def test_config_key_examples_are_accepted() -> None:
    for marker, body in all_blocks("config"):
        fragment = yaml.safe_load(body)
        if marker != "config key":
            continue  # a whole config: planned above
        config = {**yaml.safe_load(SMOKE_CONFIG.read_text()), **fragment}
        resolve(config)
        if "baseline" in fragment:
            assert (REPO / fragment["baseline"] / "summary.csv").is_file()
