"""Start-up checks: the problems a machine has, named before any job runs.

Each ``check_*`` function returns None or raises :class:`CheckError`, whose one-line message
says what is wrong and what to do. The Snakemake workflow calls them when it is about to run
jobs (rules/common.smk, ``onstart``); ``make run`` calls the command line first, so a machine
without a GPU is told at once, before any setup or image build:

    python3 -m pipeline.checks [--gpu] [--apptainer] [--host-env] [--nsys PATH] [--results DIR]

Standard library and the workloads' option modules only (workloads/models/, no torch import),
and fast: at most one short network probe.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from workloads import models
from workloads.cachedir import cache_dir

MIN_NSYS = (2024, 2)
# Where Debian's archive is fetched from (scripts/install-nsys.sh, scripts/setup-apptainer.sh).
DEBIAN_ARCHIVE = ("deb.debian.org", 80)
PROBE_TIMEOUT_S = 5.0

# --- the capture size model (check_disk) ------------------------------------------------------
# Per run: profile.sqlite + profile.nsys-rep + stats CSVs + logs. Sources:
# - a capture without GPU kernels (CPU runs; tests/fixtures/cpu/*.sqlite) is ~0.6 MB of
#   SQLite; its .nsys-rep is smaller: BASE_BYTES rounds the lot up to 4 MiB;
# - a GPU capture grows with its kernels: tests/fixtures/h100/gpt_small_train_fp32_ctx512.sqlite
#   is 2.78 MB for 15,630 kernels (with their ~2 CUDA API calls each), ~180 bytes a kernel;
#   doubled for the .nsys-rep and rounded up: BYTES_PER_KERNEL;
# - kernels per measured step: each workload's own upper estimate (`kernels_per_step` of its
#   module in workloads/models/, from H100 captures: the GPT's and the attention workloads'
#   captures were 1-12 MB, their estimates 4-45 MB), else DEFAULT_KERNELS_PER_STEP.
BASE_BYTES = 4 << 20
BYTES_PER_KERNEL = 400
# The op capture (`ops: true | shapes`) holds PyTorch's op ranges too: on the H100 GPT small
# bf16 eager step (probe-out/cap2) its export was 3.6x the lean one (13.9 vs 3.8 MB), 6.1x
# with shapes (23.6 MB); rounded up, on top of the lean capture.
OPS_CAPTURE_FACTOR = {True: 4, "shapes": 7}
# A workload that does not estimate its kernels (a model from a factory: not known before it
# runs): a ResNet-50 or GPT-2 train step launches about this many in eager mode (a generous
# bound for the disk check).
DEFAULT_KERNELS_PER_STEP = {"forward": 1000, "forward_backward": 3000, "train": 4000}
# Room besides the captures (report, plots, summaries); PROFBENCH_MIN_FREE_MB overrides it.
DEFAULT_MIN_FREE_MB = 256


class CheckError(Exception):
    """A problem of the machine or the config; the message says what to do."""


# --- nsys ------------------------------------------------------------------------------------


def _archive_address() -> tuple[str, int]:
    """apt's HTTP proxy if it has one (the archive is reached through it), else the archive."""
    proxy = ""
    if shutil.which("apt-config"):
        out = subprocess.run(["apt-config", "shell", "p", "Acquire::http::Proxy"],
                             capture_output=True, text=True, check=False).stdout
        proxy = out.strip().removeprefix("p=").strip("'")
    proxy = proxy or os.environ.get("http_proxy") or os.environ.get("HTTP_PROXY") or ""
    match = re.match(r"^(?:\w+://)?(?:[^@/]*@)?([^:/]+)(?::(\d+))?", proxy)
    if proxy and match:
        return match.group(1), int(match.group(2) or 80)
    return DEBIAN_ARCHIVE


def debian_install_problem() -> str | None:
    """Why the project's Debian installers (nsys, apptainer) cannot run here, or None."""
    for tool in ("apt-get", "dpkg"):
        if not shutil.which(tool):
            return f"no {tool} on PATH (they install on Debian/Ubuntu only)"
    host, port = _archive_address()
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as e:
        return f"Debian's archive is not reachable ({host}:{port}: {e.strerror or e})"
    return None


def parse_nsys_version(text: str) -> tuple[int, int]:
    """(year, minor) of `nsys --version` output, e.g. "... version 2024.2.3.38-..." -> (2024, 2)."""
    match = re.search(r"\b(20\d\d)\.(\d+)", text)
    if not match:
        raise CheckError(f"cannot read the Nsight Systems version from {text.strip()!r}")
    return int(match.group(1)), int(match.group(2))


def check_nsys_version(nsys: str) -> None:
    """nsys runs and is at least MIN_NSYS."""
    try:
        done = subprocess.run([nsys, "--version"], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CheckError(f"cannot run {nsys} --version ({e}): set nsys.path to a working "
                         "nsys, or nsys.path: auto to install Debian's 2024.2.3") from None
    version = parse_nsys_version(done.stdout + done.stderr)
    if version < MIN_NSYS:
        minimum = ".".join(map(str, MIN_NSYS))
        raise CheckError(
            f"{nsys} is Nsight Systems {version[0]}.{version[1]}, older than the supported "
            f"{minimum}: install a newer one (https://developer.nvidia.com/nsight-systems) or "
            "use nsys.path: auto without an old nsys on PATH (installs Debian's 2024.2.3)"
        )


def check_nsys(nsys: str, needs_install: bool) -> None:
    """An nsys to profile with: the one found (new enough), or one the pipeline can install."""
    if needs_install:
        problem = debian_install_problem()
        if problem:
            raise CheckError(
                f"no nsys found and it cannot be installed here: {problem}. Install Nsight "
                "Systems >= 2024.2 and put nsys on PATH (or set nsys.path), or run with "
                "--use-singularity (the image has nsys)"
            )
        return
    check_nsys_version(nsys)


# --- GPU -------------------------------------------------------------------------------------


def gpu_visible() -> bool:
    """An NVIDIA GPU that CUDA would use: listed by `nvidia-smi -L` (or, without nvidia-smi,
    a /dev/nvidiaN device) and not hidden by CUDA_VISIBLE_DEVICES."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    if shutil.which("nvidia-smi"):
        try:
            done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                  timeout=30, check=False)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0 and re.search(r"^GPU \d+", done.stdout, re.M) is not None
    return any(re.fullmatch(r"/dev/nvidia\d+", d) for d in glob.glob("/dev/nvidia*"))


def runs_needing_cuda(runs: Mapping[str, Mapping[str, Any]], cuda_image: bool,
                      gpu_required: bool = False) -> list[str]:
    """Runs that ask for CUDA: device cuda, or device auto in the CUDA image (make run) or in
    a GPU config (`gpu: required`, e.g. config.yaml)."""
    auto_is_cuda = cuda_image or gpu_required
    return [name for name, params in runs.items()
            if params.get("device") == "cuda" or (auto_is_cuda and params.get("device") == "auto")]


def gpu_config_why(needing: list[str]) -> str:
    """check_gpu's `why` for a GPU config (`gpu: required`) whose runs would start here."""
    return (f"this is a GPU config (gpu: required: {len(needing)} run(s) of device auto or "
            f"cuda, e.g. {needing[0]}; `make run` profiles it in the CUDA image)")


def check_gpu(needing: Iterable[str], why: str = "") -> None:
    """A GPU is visible when any run needs CUDA (`needing`: their names)."""
    needing = list(needing)
    if not needing or gpu_visible():
        return
    who = why or (f"{len(needing)} run(s) need CUDA (e.g. {needing[0]})")
    raise CheckError(
        f"{who} but no NVIDIA GPU is visible (nvidia-smi -L lists none, no /dev/nvidia0): on "
        "a machine without a GPU run `make smoke` (the CPU matrix, tests/smoke.yaml), or "
        "set device: cpu"
    )


# --- the host's own Python environment (CONTAINER=none) -------------------------------------

# What the jobs import, by import name (pyproject.toml's dependencies; torch from the host).
HOST_MODULES = ("torch", "snakemake", "nvtx", "pynvml", "pandas", "numpy", "matplotlib", "yaml",
                "jsonschema")


def missing_host_modules(modules: Iterable[str] = HOST_MODULES) -> list[str]:
    """Modules this interpreter cannot import (found by their spec: nothing is imported)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def check_host_env() -> None:
    """Without the image, the jobs run in this interpreter's environment: it has the packages
    they import."""
    missing = missing_host_modules()
    if missing:
        raise CheckError(
            f"this Python ({sys.executable}) lacks {', '.join(missing)}, which the pipeline's "
            "jobs import when they run without the image (CONTAINER=none): install them here "
            "(`pip install -e .` in this environment keeps its torch), or give a wheel folder "
            "for a host without network (WHEEL_KIT=..., docs/containers.md)"
        )


# --- Apptainer -------------------------------------------------------------------------------


def check_apptainer(cache: Path) -> None:
    """--use-singularity: apptainer on PATH, the project's cached install, or root on a Debian
    machine that can install it (what pipeline/tools.py ensure_apptainer does)."""
    if shutil.which("apptainer") or shutil.which("singularity"):
        return
    if (cache / "apptainer" / ".complete").exists():
        return
    if os.geteuid() != 0:
        problem = "installing it needs root"
    else:
        problem = debian_install_problem()
    if problem:
        raise CheckError(
            f"--use-singularity needs apptainer (>= 1.1) and there is none on PATH; "
            f"{problem}: install it (https://apptainer.org), or run without "
            "--use-singularity (e.g. `make smoke`)"
        )


# --- disk and results folder ------------------------------------------------------------------


def estimate_run_bytes(params: Mapping[str, Any]) -> int:
    """Upper estimate of one run's capture and its outputs (the model above)."""
    lean = kernels_per_step(params) * int(params.get("steps", 10)) * BYTES_PER_KERNEL
    run = BASE_BYTES + lean * (1 + OPS_CAPTURE_FACTOR.get(params.get("ops", False), 0))
    # a distributed run: one capture per rank (rank 0's is also the run's own: a hard link)
    return run * (params.get("gpus", 1) if params.get("parallel", "none") != "none" else 1)


def kernels_per_step(params: Mapping[str, Any]) -> int:
    """Kernels one step of the run launches, as its workload estimates them."""
    module = models.registry().get(params.get("workload"))
    if module is None or not hasattr(module, "kernels_per_step"):
        return DEFAULT_KERNELS_PER_STEP.get(params.get("mode", "forward"), 3000)
    options = models.options_of(params["workload"], dict(params))
    return module.kernels_per_step(options, params.get("dtype", "fp32"))


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _min_free_bytes() -> int:
    raw = os.environ.get("PROFBENCH_MIN_FREE_MB", str(DEFAULT_MIN_FREE_MB))
    try:
        return int(float(raw) * (1 << 20))
    except ValueError:
        raise CheckError(f"PROFBENCH_MIN_FREE_MB must be a number of MB, not {raw!r}") from None


def check_disk(results: Path, runs: Mapping[str, Mapping[str, Any]]) -> None:
    """Free space where `results` lives for the captures of `runs` plus PROFBENCH_MIN_FREE_MB."""
    if not runs:
        return
    need = sum(estimate_run_bytes(p) for p in runs.values()) + _min_free_bytes()
    where = _existing_ancestor(results)
    free = shutil.disk_usage(where).free
    if free < need:
        raise CheckError(
            f"not enough disk for {len(runs)} capture(s) in {results}: about "
            f"{need / 2**20:,.0f} MiB needed (captures + PROFBENCH_MIN_FREE_MB), "
            f"{free / 2**20:,.0f} MiB free on {where}'s filesystem: free some space, or set "
            "`results:` to a larger disk"
        )


def check_results_writable(results: Path) -> None:
    """`results` is (or can be made) a folder we can write in; leaves nothing behind."""
    created: list[Path] = []
    try:
        for folder in reversed([results, *results.parents]):
            if not folder.exists():
                folder.mkdir()
                created.append(folder)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=results)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CheckError(
            f"results folder {results} is not writable ({e.strerror or e}): fix its "
            "permissions or set `results:` in the config to a folder you can write"
        ) from None
    finally:
        for folder in reversed(created):
            folder.rmdir()


# --- command line ----------------------------------------------------------------------------


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m pipeline.checks",
                                     description="Check this machine before a pipeline run.")
    parser.add_argument("--gpu", action="store_true", help="an NVIDIA GPU must be visible")
    parser.add_argument("--apptainer", action="store_true",
                        help="apptainer must be available or installable (--use-singularity)")
    parser.add_argument("--host-env", action="store_true",
                        help="this Python has the packages the jobs import (no image)")
    parser.add_argument("--nsys", metavar="PATH", help="this nsys must run and be new enough")
    parser.add_argument("--results", metavar="DIR", type=Path, help="must be writable")
    parser.add_argument("--why", default="this command profiles on an NVIDIA GPU",
                        help="why a GPU is needed (for the message)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.gpu:
            check_gpu(["--gpu"], args.why)
        if args.apptainer:
            check_apptainer(cache_dir())
        if args.host_env:
            check_host_env()
        if args.nsys:
            check_nsys_version(args.nsys)
        if args.results:
            check_results_writable(args.results)
    except CheckError as e:
        print(f"profbench: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
