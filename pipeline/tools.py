"""The tools a run uses: which nsys profiles, apptainer for
`--use-singularity`, and the image build's arguments."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from pipeline.config import REPO, ConfigError

# Where scripts/install-nsys.sh puts Debian's Nsight Systems (keep in sync with the script).
NSYS_SUBDIR = "nsys-2024.2.3"


class ToolError(RuntimeError):
    """A tool the run needs is missing and cannot be installed here."""


def cached_nsys(cache: Path) -> tuple[Path, Path]:
    """(the cached Debian nsys binary, the marker its install leaves when complete)."""
    prefix = cache / NSYS_SUBDIR
    return prefix / "usr/lib/nsight-systems/bin/nsys", prefix / ".complete"


def find_nsys(configured: str, use_container: bool, cache: Path) -> tuple[str, bool]:
    """(path, needs_install): the configured nsys, else PATH's, else the cached Debian build."""
    if use_container:
        return "nsys", False  # the image has it on PATH
    if configured != "auto":
        if not (shutil.which(configured) or Path(configured).is_file()):
            raise ConfigError("nsys.path", f"{configured!r} is not an executable file")
        return configured, False
    on_path = shutil.which("nsys")
    if on_path:
        return on_path, False
    binary, marker = cached_nsys(cache)
    return str(binary), not marker.exists()


def ensure_apptainer(cache: Path) -> None:
    """Put apptainer on PATH for Snakemake and the jobs (Snakemake checks it even in a dry
    run). A system apptainer/singularity wins; else the project's relocatable install in the
    cache, installed on first use on Debian machines (root, ~20 s)."""
    if shutil.which("apptainer") or shutil.which("singularity"):
        return
    app = cache / "apptainer" / "app" / "usr" / "bin" / "apptainer"
    if not (app.exists() and (cache / "apptainer" / ".complete").exists()):
        if not (os.geteuid() == 0 and shutil.which("apt-get")):
            raise ToolError(
                "--use-singularity needs apptainer (>= 1.1) on PATH: install it "
                "(https://apptainer.org) or, on Debian as root, run scripts/setup-apptainer.sh"
            )
        print("apptainer not found; running scripts/setup-apptainer.sh", file=sys.stderr)
        done = subprocess.run([str(REPO / "scripts" / "setup-apptainer.sh")],
                              stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise ToolError("scripts/setup-apptainer.sh failed (see its messages above)")
        app = Path(done.stdout.strip().splitlines()[-1])
    os.environ.update(PATH=f"{app.parent}{os.pathsep}{os.environ.get('PATH', '')}")


def container_build_args(container: dict[str, Any]) -> str:
    """scripts/build-container.sh arguments from the `container` config section."""
    args = ["--variant", container["variant"]]
    if container.get("torch"):
        args += ["--torch", str(container["torch"])]
    if container.get("torch_index"):
        args += ["--torch-index", str(container["torch_index"])]
    return shlex.join(args)
