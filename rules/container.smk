# The profbench container: which image the jobs run in, and the rule that builds it.
# Included by the Snakefile BEFORE the other rules, which use:
#   input:     image=IMAGE_INPUT        (Snakemake orders jobs on inputs, not on `container:`)
#   container: CONTAINER_IMAGE
# Config (schemas/container.schema.yaml): container.variant / torch / torch_index / image /
# build. See docs/containers.md.

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

_REPO = Path(workflow.basedir)
_CONTAINER_CFG = config.get("container") or {}
# Checked here too (common.smk validates the whole config later): this file runs first.
try:
    jsonschema.validate(
        {"container": _CONTAINER_CFG},
        yaml.safe_load((_REPO / "schemas" / "container.schema.yaml").read_text()),
    )
except jsonschema.ValidationError as _e:
    _where = ".".join(str(p) for p in _e.absolute_path)
    raise WorkflowError(f"Invalid config at '{_where}': {_e.message}") from None
CONTAINER_VARIANT = _CONTAINER_CFG.get("variant", "cuda")
# The image the jobs use, in the workdir (a hard link to the hash-keyed cached build).
CONTAINER_SIF = _CONTAINER_CFG.get("image") or f"resources/profbench-{CONTAINER_VARIANT}.sif"
# build: false = use an existing image at container.image (e.g. one built elsewhere).
CONTAINER_BUILD = _CONTAINER_CFG.get("build", True)

_deployment = getattr(workflow, "deployment_settings", None)
USE_CONTAINER = bool(
    _deployment is not None and DeploymentMethod.APPTAINER in _deployment.deployment_method
)
IMAGE_INPUT = CONTAINER_SIF if USE_CONTAINER else []
CONTAINER_IMAGE = CONTAINER_SIF if USE_CONTAINER else None

_PROFBENCH_CACHE = Path(
    os.environ.get("PROFBENCH_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "profbench"
)


def _ensure_apptainer():
    """Put apptainer on PATH for Snakemake and the jobs (Snakemake checks it even in a dry
    run). A system apptainer/singularity wins; else the project's relocatable install in
    the cache, installed on first use on Debian machines (root, ~20 s)."""
    if shutil.which("apptainer") or shutil.which("singularity"):
        return
    app = _PROFBENCH_CACHE / "apptainer" / "app" / "usr" / "bin" / "apptainer"
    if not (app.exists() and (_PROFBENCH_CACHE / "apptainer" / ".complete").exists()):
        if not (os.geteuid() == 0 and shutil.which("apt-get")):
            raise WorkflowError(
                "--use-singularity needs apptainer (>= 1.1) on PATH: install it "
                "(https://apptainer.org) or, on Debian as root, run scripts/setup-apptainer.sh"
            )
        print("container.smk: apptainer not found; running scripts/setup-apptainer.sh",
              file=sys.stderr)
        done = subprocess.run([str(_REPO / "scripts" / "setup-apptainer.sh")],
                              stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise WorkflowError("scripts/setup-apptainer.sh failed (see its messages above)")
        app = Path(done.stdout.strip().splitlines()[-1])
    os.environ["PATH"] = f"{app.parent}{os.pathsep}{os.environ.get('PATH', '')}"


if USE_CONTAINER:
    _ensure_apptainer()
    # Snakemake binds only the workdir (as the container's home). With --directory outside
    # the checkout, jobs still name files in it (scripts, PYTHONPATH=<repo> to import the
    # working tree's packages): bind the checkout too.
    _cwd = Path.cwd().resolve()
    if _REPO.resolve() != _cwd and _REPO.resolve() not in _cwd.parents:
        workflow.deployment_settings.apptainer_args = (
            f"{workflow.deployment_settings.apptainer_args} --bind {shlex.quote(str(_REPO))}"
        ).strip()
    if not CONTAINER_BUILD and not Path(CONTAINER_SIF).exists():
        raise WorkflowError(
            f"container.build is false but container.image {CONTAINER_SIF} does not exist"
        )


def _build_args():
    args = ["--variant", CONTAINER_VARIANT]
    if _CONTAINER_CFG.get("torch"):
        args += ["--torch", str(_CONTAINER_CFG["torch"])]
    if _CONTAINER_CFG.get("torch_index"):
        args += ["--torch-index", str(_CONTAINER_CFG["torch_index"])]
    return " ".join(f"'{a}'" for a in args)


if CONTAINER_BUILD:

    # Builds only when the definition's hash or the build arguments have no cached image
    # ($PROFBENCH_CACHE/images/profbench-<variant>-<key>.sif); otherwise it only links.
    # Runs on the host (no container:), also without --use-singularity:
    #   snakemake --cores 1 resources/profbench-cuda.sif
    rule build_container:
        input:
            definition=str(_REPO / "containers" / "profbench.def"),
            nsys_installer=str(_REPO / "scripts" / "install-nsys.sh"),
        output:
            CONTAINER_SIF,
        params:
            script=str(_REPO / "scripts" / "build-container.sh"),
            args=_build_args(),
        log:
            f"logs/build_container-{CONTAINER_VARIANT}.log",
        localrule: True
        shell:
            "{params.script} {params.args} --link {output:q} > {log:q} 2>&1"
