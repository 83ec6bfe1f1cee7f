"""Start-up checks (pipeline/checks.py): each problem stops a real Snakemake run with a
one-line message saying what to do, before any job runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import SMOKE_CONFIG, stopped

from pipeline import checks
from pipeline.config import load as load_config

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "h100"
OLD_NSYS = "NVIDIA Nsight Systems version 2023.4.1.97-234133557503v0"


def config(tmp_path: Path, **changes) -> Path:
    """The smoke config with top-level keys and defaults changed."""
    cfg = yaml.safe_load(SMOKE_CONFIG.read_text())
    cfg["defaults"].update(changes.pop("defaults", {}))
    cfg.update(changes)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def bare_path(tmp_path: Path) -> str:
    """This PATH without the tools the pipeline could use or install things with."""
    hidden = {"nsys", "apt-get", "apt", "dpkg", "apptainer", "singularity", "nvidia-smi"}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for folder in os.environ["PATH"].split(os.pathsep):
        for tool in Path(folder).glob("*") if Path(folder).is_dir() else []:
            link = bin_dir / tool.name
            if tool.name not in hidden and os.access(tool, os.X_OK) and not link.exists():
                link.symlink_to(tool)
    return str(bin_dir)


def fake_tool(tmp_path: Path, name: str, output: str, code: int = 0) -> Path:
    """A stand-in for a system tool that this machine does not have (nvidia-smi, an old nsys)."""
    path = tmp_path / "fake" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{output}'\nexit {code}\n")
    path.chmod(0o755)
    return path


def checks_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.checks", *args], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, **(env or {})},
                          check=False)


# --- GPU -------------------------------------------------------------------------------------


def test_cuda_runs_without_gpu_stop_and_point_to_smoke(tmp_path: Path) -> None:
    # CUDA_VISIBLE_DEVICES=-1 hides a GPU as CUDA does, so this also holds on a GPU machine.
    message = stopped(tmp_path, "--configfile",
                      str(config(tmp_path, defaults={"device": "cuda"})),
                      env={"CUDA_VISIBLE_DEVICES": "-1"})
    # every run of the smoke matrix: 11 captured and 2 timed only (their untraced timing
    # processes need the GPU as much as a capture does)
    assert "start-up check failed: 13 run(s) need CUDA (e.g. attention_core_cudnn)" in message
    assert "no NVIDIA GPU is visible" in message and "`make smoke`" in message


def test_make_run_says_no_gpu_at_once() -> None:
    """`make run`'s first step: no venv, no image, one line pointing to make smoke."""
    done = subprocess.run(["make", "--no-print-directory", "-n", "run"], cwd=REPO,
                          capture_output=True, text=True, check=True)
    first = done.stdout.splitlines()[0]
    assert first.startswith("python3 -m pipeline.checks --gpu --apptainer"), done.stdout
    checks_done = checks_cli("--gpu", env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert checks_done.returncode == 1
    assert checks_done.stderr.startswith("profbench: this command profiles on an NVIDIA GPU "
                                         "but no NVIDIA GPU is visible")
    assert "`make smoke`" in checks_done.stderr


def test_make_run_without_the_image_says_no_gpu_at_once() -> None:
    """`make run CONTAINER=none` runs in this host's environment: on a machine without a GPU
    it stops at its first step, before the host script (the environment is not touched)."""
    done = subprocess.run(["make", "--no-print-directory", "run", "CONTAINER=none"], cwd=REPO,
                          capture_output=True, text=True,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "-1"})
    assert done.returncode != 0
    assert ("profbench: make run CONTAINER=none profiles the GPU matrix (config.yaml) in this "
            "Python environment but no NVIDIA GPU is visible") in done.stderr, done.stderr
    assert "run-on-host.sh" not in done.stdout.split("pipeline.checks", 1)[0]


def test_host_environment_names_the_packages_it_lacks(tmp_path: Path) -> None:
    """The host mode's check, with an interpreter that has only the standard library (a venv
    without packages): every missing import named, and what to do."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    done = subprocess.run([str(bare / "bin" / "python"), "-m", "pipeline.checks", "--host-env"],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 1
    assert f"this Python ({bare / 'bin' / 'python'}) lacks " in done.stderr
    for module in checks.HOST_MODULES:
        assert module in done.stderr
    assert "CONTAINER=none" in done.stderr and "WHEEL_KIT" in done.stderr
    # this test's own environment has them all
    assert checks_cli("--host-env").returncode == 0


def test_gpu_listed_by_nvidia_smi_passes(tmp_path: Path) -> None:
    smi = fake_tool(tmp_path, "nvidia-smi", "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)")
    path = f"{smi.parent}{os.pathsep}{os.environ['PATH']}"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run([sys.executable, "-m", "pipeline.checks", "--gpu"], cwd=REPO,
                          capture_output=True, text=True, env={**env, "PATH": path})
    assert done.returncode == 0, done.stderr
    hidden = checks_cli("--gpu", env={"PATH": path, "CUDA_VISIBLE_DEVICES": ""})
    assert hidden.returncode == 1
    failing = fake_tool(tmp_path, "nvidia-smi", "NVIDIA-SMI has failed", code=9)
    assert checks_cli("--gpu", env={"PATH": f"{failing.parent}{os.pathsep}{path}"}
                      ).returncode == 1


def test_device_auto_needs_cuda_only_in_the_cuda_image() -> None:
    runs = {"a": {"device": "auto"}, "b": {"device": "cpu"}, "c": {"device": "cuda"}}
    assert checks.runs_needing_cuda(runs, cuda_image=True) == ["a", "c"]
    assert checks.runs_needing_cuda(runs, cuda_image=False) == ["c"]


# --- nsys ------------------------------------------------------------------------------------


def test_no_nsys_and_no_way_to_install_it(tmp_path: Path) -> None:
    env = {"PATH": bare_path(tmp_path), "PROFBENCH_CACHE": str(tmp_path / "cache")}
    message = stopped(tmp_path, "--configfile", str(config(tmp_path)), env=env)
    assert ("start-up check failed: no nsys found and it cannot be installed here: no apt-get "
            "on PATH") in message
    assert "Install Nsight Systems >= 2024.2" in message


def test_old_nsys_is_refused(tmp_path: Path) -> None:
    old = fake_tool(tmp_path, "nsys", OLD_NSYS)
    message = stopped(tmp_path, "--configfile",
                      str(config(tmp_path, nsys={"path": str(old)})))
    assert f"{old} is Nsight Systems 2023.4, older than the supported 2024.2" in message


def test_supported_nsys_passes(nsys: str) -> None:
    done = checks_cli("--nsys", nsys)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("text", "version"), [
    ("NVIDIA Nsight Systems version 2024.2.3.38-242334140272v0", (2024, 2)),
    ("NVIDIA Nsight Systems version 2025.3.1.90-253135822126v0", (2025, 3)),
    (OLD_NSYS, (2023, 4)),
])
def test_nsys_version_parsing(text: str, version: tuple[int, int]) -> None:
    assert checks.parse_nsys_version(text) == version


def test_unreadable_nsys_version_is_named() -> None:
    with pytest.raises(checks.CheckError, match="cannot read the Nsight Systems version"):
        checks.parse_nsys_version("nsys: command not found")


# --- apptainer -------------------------------------------------------------------------------


def test_use_singularity_without_apptainer(tmp_path: Path) -> None:
    env = {"PATH": bare_path(tmp_path), "PROFBENCH_CACHE": str(tmp_path / "cache")}
    message = stopped(tmp_path, "--use-singularity", "--configfile", str(config(tmp_path)),
                      env=env)
    assert "--use-singularity needs apptainer" in message
    done = checks_cli("--apptainer", env=env)
    assert done.returncode == 1
    assert done.stderr.startswith("profbench: --use-singularity needs apptainer (>= 1.1) and "
                                  "there is none on PATH; ")


# --- disk and results folder ------------------------------------------------------------------


def test_not_enough_disk(tmp_path: Path) -> None:
    message = stopped(tmp_path, "--configfile", str(config(tmp_path)),
                      env={"PROFBENCH_MIN_FREE_MB": str(10**12)})
    assert "start-up check failed: not enough disk for 11 capture(s) in results/smoke" in message


@pytest.mark.parametrize(("export", "params"), [
    ("gpt_small_train_fp32_ctx512", {"workload": "gpt", "size": "small", "mode": "train",
                                     "dtype": "fp32", "steps": 10}),
    ("gpt_small_train_bf16_ctx512", {"workload": "gpt", "size": "small", "mode": "train",
                                     "dtype": "bf16", "steps": 10}),
    ("attention_naive_b32_s100_e256", {"workload": "attention", "mode": "forward",
                                       "steps": 10}),
])
def test_size_model_covers_real_captures(export: str, params: dict) -> None:
    """The estimate covers a real H100 export twice over (the .sqlite and the .nsys-rep)."""
    real = (FIXTURES / f"{export}.sqlite").stat().st_size
    assert checks.estimate_run_bytes(params) >= 2 * real


def test_default_matrix_estimate() -> None:
    """The standard GPU matrix's captures (25 runs) need well under a GiB: the check only bites
    on a nearly full disk."""
    plan = load_config(REPO / "config" / "standard.yaml")
    sizes = [checks.estimate_run_bytes(p) for p in plan.profiled.values()]
    assert len(sizes) == 25
    assert 100 << 20 < sum(sizes) < 1 << 30  # about 314 MiB


def test_results_under_a_file_is_not_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    message = stopped(tmp_path, "--configfile",
                      str(config(tmp_path, results=str(blocker / "results"))))
    assert f"results folder {blocker}/results is not writable (Not a directory)" in message


def test_read_only_results_folder(tmp_path: Path) -> None:
    results = tmp_path / "ro"
    results.mkdir()
    if os.geteuid() == 0:  # root writes through permission bits; not through the i flag
        subprocess.run(["chattr", "+i", str(results)], check=True)
    else:
        results.chmod(0o555)
    try:
        message = stopped(tmp_path, "--configfile", str(config(tmp_path, results=str(results))))
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(results)], check=True)
        results.chmod(0o755)
    assert f"results folder {results} is not writable" in message
    assert list(results.iterdir()) == []
