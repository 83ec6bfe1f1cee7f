"""pipeline.bytecode: a job whose install keeps no bytecode gets a cache, with real child
interpreters writing and reading real bytecode, and through the real guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import bytecode

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


def source_only_package(root: Path, name: str) -> Path:
    """A package as `pip install --no-compile` leaves one: sources, no __pycache__."""
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 42\n")
    return package / "__init__.py"


def child_imports(name: str, path: Path, env: dict[str, str]) -> dict:
    """A fresh interpreter with `env` imports `name` from `path`: where its bytecode is."""
    code = (f"import sys, json; sys.path.insert(0, {str(path)!r}); import {name}; "
            f"print(json.dumps({{'prefix': sys.pycache_prefix, 'cached': {name}.__cached__}}))")
    done = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout)


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    name = f"pb_probe_{os.getpid()}"
    source = source_only_package(tmp_path / "site", name)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return name, source


def test_no_bytecode_and_none_written_gets_a_cache_that_the_next_process_reads(
        tmp_path: Path, probe: tuple[str, Path]) -> None:
    name, source = probe
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    # as the install is: every process compiles, nothing is kept
    child_imports(name, source.parent.parent, env)
    assert not (source.parent / "__pycache__").exists()

    note = bytecode.keep_bytecode(env, module=name, cache=tmp_path / "cache")
    assert note and "PYTHONDONTWRITEBYTECODE is set" in note
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "cache" / "pycache")
    assert "PYTHONDONTWRITEBYTECODE" not in env

    first = child_imports(name, source.parent.parent, env)
    cached = Path(first["cached"])
    assert first["prefix"] == env["PYTHONPYCACHEPREFIX"]
    assert cached.is_file() and cached.is_relative_to(tmp_path / "cache" / "pycache")
    assert not (source.parent / "__pycache__").exists(), "the install was written to"
    written = cached.stat().st_mtime_ns
    second = child_imports(name, source.parent.parent, env)
    assert second["cached"] == first["cached"]
    assert cached.stat().st_mtime_ns == written, "the second process compiled again"


def test_an_install_that_keeps_its_bytecode_is_left_alone(
        tmp_path: Path, probe: tuple[str, Path]) -> None:
    name, source = probe
    writable: dict[str, str] = {}
    assert bytecode.keep_bytecode(writable, module=name, cache=tmp_path) is None
    assert writable == {}, "Python writes the bytecode itself"
    child_imports(name, source.parent.parent, {**os.environ, "PYTHONDONTWRITEBYTECODE": ""})
    assert (source.parent / "__pycache__").is_dir()
    compiled = {"PYTHONDONTWRITEBYTECODE": "1"}
    assert bytecode.keep_bytecode(compiled, module=name, cache=tmp_path) is None
    assert compiled == {"PYTHONDONTWRITEBYTECODE": "1"}, "the install's bytecode is read"


def test_a_prefix_the_user_set_stands(tmp_path: Path, probe: tuple[str, Path]) -> None:
    name, _ = probe
    env = {"PYTHONPYCACHEPREFIX": "/somewhere", "PYTHONDONTWRITEBYTECODE": "1"}
    assert bytecode.keep_bytecode(env, module=name, cache=tmp_path) is None
    assert env == {"PYTHONPYCACHEPREFIX": "/somewhere", "PYTHONDONTWRITEBYTECODE": "1"}


def test_a_module_that_is_not_installed_changes_nothing(tmp_path: Path) -> None:
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    assert bytecode.keep_bytecode(env, module="no_such_module_here", cache=tmp_path) is None
    assert env == {"PYTHONDONTWRITEBYTECODE": "1"}


def test_the_guard_gives_its_job_the_cache(tmp_path: Path) -> None:
    """The guard's probe module (torch) as an install without bytecode: a source-only
    `torch` first on the path (the job below never imports it)."""
    source_only_package(tmp_path / "site", "torch")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PROFBENCH_CACHE": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO)])}
    env.pop("PYTHONPYCACHEPREFIX", None)
    out = tmp_path / "r.json"
    job = "import os, sys; print(sys.pycache_prefix, os.environ.get('PYTHONDONTWRITEBYTECODE'))"
    done = subprocess.run([PY, "-m", "pipeline.guard", "--out", str(out), "--", PY, "-c", job],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(tmp_path / "pycache"), "None"]
    assert "guard: torch has no bytecode and PYTHONDONTWRITEBYTECODE is set" in done.stderr
    assert json.loads(out.read_text())["status"] == "ok"


def test_an_invocations_jobs_get_the_cache_unless_they_run_in_the_image(tmp_path: Path) -> None:
    """The Snakemake process's environment (every job's): the same cache on the host, none
    for jobs in the image (its own bytecode would be looked for in the prefix instead)."""
    source_only_package(tmp_path / "site", "torch")
    code = ("import json, os, sys; from pipeline import bytecode; env = dict(os.environ); "
            "note = bytecode.keep_bytecode(env, in_container=sys.argv[1] == 'image'); "
            "print(json.dumps([note, env.get('PYTHONPYCACHEPREFIX'), "
            "env.get('PYTHONDONTWRITEBYTECODE')]))")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PROFBENCH_CACHE": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO)])}
    env.pop("PYTHONPYCACHEPREFIX", None)

    def decided(where: str) -> list:
        done = subprocess.run([PY, "-c", code, where], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=60, check=True)
        return json.loads(done.stdout)

    note, prefix, dont_write = decided("host")
    assert note and "torch has no bytecode" in note
    assert (prefix, dont_write) == (str(tmp_path / "pycache"), None)
    assert decided("image") == [None, None, "1"]
