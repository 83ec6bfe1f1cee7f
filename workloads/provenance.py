"""Where a result came from: container image or host interpreter, plus the git commit."""

import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

# Written into the image at build time (see containers/).
CONTAINER_PROVENANCE = Path("/opt/profbench/provenance.json")

# Distributions whose versions matter for a profile; absent ones are recorded as None.
TRACKED_PACKAGES = ("torch", "nvtx", "numpy", "pandas", "snakemake", "triton")


def provenance(container_file: Path = CONTAINER_PROVENANCE) -> dict[str, Any]:
    """The container's build record if running in the image, else the host's versions."""
    if container_file.is_file():
        info = json.loads(container_file.read_text())
    else:
        info = {"environment": "host", "versions": host_versions()}
    info["git_commit"] = git_commit()
    return info


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
