"""Where a result came from: container image or host interpreter, git state, host and time.

The GPU machine's copy of the repository has no ``.git``: the pipeline then passes the
commit and dirtiness it saw at plan time in ``PROFBENCH_GIT_COMMIT`` / ``PROFBENCH_GIT_DIRTY``.
"""

import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

# Written into the image at build time (see containers/).
CONTAINER_PROVENANCE = Path("/opt/profbench/provenance.json")

# Distributions whose versions matter for a profile; absent ones are recorded as None.
TRACKED_PACKAGES = ("torch", "nvtx", "numpy", "pandas", "snakemake", "triton")


def provenance(
    container_file: Path = CONTAINER_PROVENANCE, params: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The container's build record if running in the image, else the host's versions; plus
    git commit/dirtiness, hostname, UTC date and the hash of the run's ``params``."""
    if container_file.is_file():
        info = json.loads(container_file.read_text())
    else:
        info = {"environment": "host", "versions": host_versions()}
    info["git_commit"], info["git_dirty"] = git_state()
    info["hostname"] = socket.gethostname()
    info["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    info["config_hash"] = None if params is None else config_hash(params)
    return info


def config_hash(params: dict[str, Any]) -> str:
    """First 12 hex digits of the sha256 of the canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def git_state(cwd: Path | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) from PROFBENCH_GIT_COMMIT / PROFBENCH_GIT_DIRTY when set, else git."""
    commit = os.environ.get("PROFBENCH_GIT_COMMIT") or git_commit(cwd)
    dirty_env = os.environ.get("PROFBENCH_GIT_DIRTY")
    if dirty_env is not None and dirty_env != "":
        return commit, dirty_env.strip().lower() in ("1", "true", "yes")
    return commit, git_dirty(cwd)


def git_dirty(cwd: Path | None = None) -> bool | None:
    """Whether the checkout has uncommitted changes (untracked files count), or None."""
    try:
        result = subprocess.run(
            ["git", "status", "--porcelain"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(result.stdout.strip()) if result.returncode == 0 else None


def host_versions() -> dict[str, str | None]:
    """Versions of Python, the tracked packages and torch's CUDA/cuDNN, from this interpreter."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in TRACKED_PACKAGES:
        versions[package] = _distribution_version(package)
    versions.update(_torch_backend_versions())
    return versions


def git_commit(cwd: Path | None = None) -> str | None:
    """HEAD of the git checkout containing ``cwd``, or None (no git, no repo, no commits)."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_backend_versions() -> dict[str, str | None]:
    try:
        import torch
    except ImportError:
        return {"torch_cuda": None, "cudnn": None}
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"torch_cuda": torch.version.cuda, "cudnn": None if cudnn is None else str(cudnn)}
