# Configuration: validation, defaults, sweep expansion, and the paths every stage shares.
# Included first by the Snakefile; everything below is evaluated before any job is planned,
# so a bad config stops the workflow with a message that names the offending key.

import fnmatch
import itertools
import json
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
from snakemake.utils import validate

REPO = Path(workflow.basedir)


def _config_error(where, problem):
    return WorkflowError(f"Invalid config at '{where}': {problem}")


def _schema_error_location(error):
    return ".".join(str(p) for p in error.absolute_path) or "<top level>"


def _top_level_schema():
    """The config schema with its one $ref (the container section) resolved inline."""
    schema = yaml.safe_load((REPO / "schemas/config.schema.yaml").read_text())
    container_schema = yaml.safe_load((REPO / "schemas/container.schema.yaml").read_text())
    schema["properties"]["container"] = container_schema["properties"]["container"]
    return schema


def _validate_top_level(cfg):
    """Check the top-level keys, naming a bad key, then let Snakemake fill in defaults."""
    try:
        jsonschema.validate(cfg, _top_level_schema())
    except jsonschema.ValidationError as e:
        raise _config_error(_schema_error_location(e), e.message) from None
    validate(cfg, str(REPO / "schemas/config.schema.yaml"), set_default=True)


def _run_schemas():
    """One complete JSON schema per workload: its own keys plus the keys all runs share."""
    raw = yaml.safe_load((REPO / "schemas/run.schema.yaml").read_text())
    common = raw["$defs"]["common"]
    schemas = {}
    for name, schema in raw["workloads"].items():
        schema = dict(schema)
        schema["properties"] = {**common, **schema["properties"]}
        schemas[name] = schema
    return schemas


RUN_SCHEMAS = _run_schemas()


# Run keys for the pipeline itself, never passed to the workload: name -> (type, default).
PIPELINE_RUN_KEYS = {
    "profile": (bool, True),  # false: untraced timing only (no nsys capture), e.g. big sweeps
}


def pipeline_settings(params):
    """The pipeline's own keys of a run, with defaults."""
    return {k: params.get(k, default) for k, (_, default) in PIPELINE_RUN_KEYS.items()}


def workload_params(params):
    """The run's parameters without the pipeline's own keys."""
    return {k: v for k, v in params.items() if k not in PIPELINE_RUN_KEYS}


def _check_run(where, params):
    for key, (kind, _) in PIPELINE_RUN_KEYS.items():
        if key in params and not isinstance(params[key], kind):
            raise _config_error(f"{where}.{key}", f"{params[key]!r} is not of type {kind.__name__}")
    params = workload_params(params)
    _check_keys(where, params)
    try:
        jsonschema.validate(params, RUN_SCHEMAS[params["workload"]])
    except jsonschema.ValidationError as e:
        key = ".".join(str(p) for p in e.absolute_path)
        raise _config_error(f"{where}.{key}" if key else where, e.message) from None


def _check_keys(where, params):
    """Unknown workload or parameter names, before any value is looked at."""
    workload = params.get("workload")
    if workload not in RUN_SCHEMAS:
        raise _config_error(
            f"{where}.workload",
            f"unknown workload {workload!r}; expected one of {sorted(RUN_SCHEMAS)}",
        )
    allowed = {**RUN_SCHEMAS[workload]["properties"], **PIPELINE_RUN_KEYS}
    for key in params:
        if key not in allowed:
            raise _config_error(
                f"{where}.{key}",
                f"unknown parameter {key!r} for workload {workload!r}; "
                f"expected one of {sorted(allowed)}",
            )


def _expand_sweep(index, sweep):
    """A sweep's cartesian product: list values vary, scalars stay; names from the template."""
    where = f"sweeps[{index}]"
    fixed = {k: v for k, v in sweep.items() if k != "name"}
    axes = {k: v for k, v in fixed.items() if isinstance(v, list)}
    # Check the sweep's keys first: a typo would otherwise surface as a bad name template.
    _check_keys(where, fixed)
    for values in itertools.product(*axes.values()):
        params = {**fixed, **dict(zip(axes, values))}
        try:
            name = sweep["name"].format(**params)
        except (KeyError, IndexError, ValueError) as e:
            raise _config_error(f"{where}.name", f"cannot format {sweep['name']!r}: {e!r}")
        yield name, params


def resolve_runs(cfg):
    """All runs by name, with defaults applied and every run checked against its schema."""
    runs = {}  # name -> (where in the config, parameters)
    for index, sweep in enumerate(cfg["sweeps"]):
        for name, params in _expand_sweep(index, sweep):
            if name in runs:
                raise _config_error(f"sweeps[{index}].name", f"run name {name!r} is not unique")
            runs[name] = (f"sweeps[{index}] (run {name})", params)
    for name, params in cfg["runs"].items():
        if name in runs:
            raise _config_error(f"runs.{name}", "name also produced by a sweep")
        runs[name] = (f"runs.{name}", dict(params or {}))
    for name, (where, params, _) in expand_ladders(cfg).items():
        if name in runs:
            raise _config_error(where, f"run name {name!r} is also defined elsewhere")
        runs[name] = (where, params)
    if not runs:
        raise _config_error("runs", "no runs defined (add entries under 'runs' or 'sweeps')")
    resolved = {}
    for name, (where, params) in runs.items():
        merged = {**cfg["defaults"], **params}
        # Defaults may hold keys that only some workloads take (e.g. 'context' for gpt).
        allowed = RUN_SCHEMAS.get(merged.get("workload"), {}).get("properties", {})
        merged = {
            k: v for k, v in merged.items()
            if k in params or k in allowed or k in PIPELINE_RUN_KEYS
        }
        _check_run(where, merged)
        resolved[name] = merged
    return resolved


def expand_ladders(cfg):
    """Ladder runs: name -> (where, params, (ladder, group, rung index, rung name)).

    Each list value in a ladder's `base` gives one ladder (e.g. one per model size); rung i
    runs `base` plus the keys of rungs 0..i, so each rung adds one optimization to the last.
    """
    out = {}
    for index, ladder in enumerate(cfg.get("ladders", [])):
        where = f"ladders[{index}]"
        base = dict(ladder["base"])
        _check_keys(f"{where}.base", base)
        axes = {k: v for k, v in base.items() if isinstance(v, list)}
        for values in itertools.product(*axes.values()):
            params = {**base, **dict(zip(axes, values))}
            group = "_".join(str(v) for v in values) or "all"
            seen = set()
            for i, rung in enumerate(ladder["rungs"]):
                rung_keys = {k: v for k, v in rung.items() if k != "name"}
                _check_keys(f"{where}.rungs[{i}]", {"workload": params["workload"], **rung_keys})
                if rung["name"] in seen:
                    raise _config_error(f"{where}.rungs[{i}].name", "rung names must be unique")
                seen.add(rung["name"])
                params = {**params, **rung_keys}
                name = f"{ladder['name']}_{group}_{i}_{rung['name']}"
                out[name] = (
                    f"{where}.rungs[{i}] (run {name})",
                    dict(params),
                    (ladder["name"], group, i, rung["name"]),
                )
    return out


def ladder_members(cfg):
    """run name -> {ladder, ladder_group, rung_index, rung} for every ladder run."""
    return {
        name: dict(zip(("ladder", "ladder_group", "rung_index", "rung"), info))
        for name, (_, _, info) in expand_ladders(cfg).items()
    }


def ladder_comparisons(cfg):
    """Each rung against the one before it: {name, a, b}."""
    comps, previous = [], {}
    for name, info in ladder_members(cfg).items():
        key = (info["ladder"], info["ladder_group"])
        if key in previous:
            comps.append({"name": f"{name}_vs_prev", "a": previous[key], "b": name})
        previous[key] = name
    return comps


def select_runs(runs, patterns):
    """The runs whose names match any of the glob patterns (all runs when none are given)."""
    if not patterns:
        return runs
    chosen = {n: p for n, p in runs.items() if any(fnmatch.fnmatchcase(n, g) for g in patterns)}
    if not chosen:
        raise _config_error("select", f"no run matches {patterns}; runs are {sorted(runs)}")
    return chosen


def _check_comparisons(cfg, runs):
    for i, comp in enumerate(cfg["comparisons"]):
        for side in ("a", "b"):
            if comp[side] not in runs:
                raise _config_error(f"comparisons[{i}].{side}", f"unknown run {comp[side]!r}")


_validate_top_level(config)
ALL_RUNS = resolve_runs(config)
_check_comparisons(config, ALL_RUNS)
RUNS = select_runs(ALL_RUNS, config["select"])
# Runs with an nsys capture (the others are timed only).
PROFILED = {n: p for n, p in RUNS.items() if pipeline_settings(p)["profile"]}
LADDERS = {n: info for n, info in ladder_members(config).items() if n in RUNS}
# Comparisons whose two runs are both selected: the config's, then each ladder rung vs the last.
COMPARISONS = {
    c["name"]: c
    for c in [*config["comparisons"], *ladder_comparisons(config)]
    if c["a"] in RUNS and c["b"] in RUNS
}
RESULTS = config["results"].rstrip("/")
LOGS = f"{RESULTS}/logs"
REPEATS = list(range(config["timing"]["repeats"]))
TIMEOUT_S = int(config["timeout_min"] * 60)



# Optional: set by a caller whose copy of the tree has no .git (a GPU host, a cluster node).
GIT_COMMIT_VAR, GIT_DIRTY_VAR = "PROFBENCH_GIT_COMMIT", "PROFBENCH_GIT_DIRTY"


def results_folder(wildcards, input):
    """The results folder, as the folder of a rule's summary.csv or plan.json input."""
    return os.path.dirname(input.summary if "summary" in input.keys() else input.plan)


def git_state():
    """(commit, dirty) of the checkout, decided at plan time and handed to every job.

    PROFBENCH_GIT_COMMIT / PROFBENCH_GIT_DIRTY, when set, are taken as they are. A copy of the
    tree (e.g. shipped to a GPU machine) carries `.profbench-git.json` from
    scripts/stamp-git.sh: it wins over git when git has no `.git` here, or one that does not
    know the stamped commit (a stale `.git` copied alongside newer files); a stamp left in a
    checkout whose HEAD moved on is ignored.
    """
    if os.environ.get(GIT_COMMIT_VAR):
        return os.environ[GIT_COMMIT_VAR], os.environ.get(GIT_DIRTY_VAR) == "1"

    def git(*args):
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    stamp = REPO / ".profbench-git.json"
    info = json.loads(stamp.read_text()) if stamp.is_file() else {}
    stamped = info.get("commit")
    if stamped and stamped != commit and (
        commit is None or git("cat-file", "-e", f"{stamped}^{{commit}}") is None
    ):
        return stamped, bool(info.get("dirty"))
    if commit:
        return commit, bool(git("status", "--porcelain", "--untracked-files=no"))
    return None, None


GIT_COMMIT, GIT_DIRTY = git_state()
# Every job inherits these (workloads/provenance.py reads them): rows carry the commit even
# where the job runs without a checkout.
if GIT_COMMIT:
    os.environ[GIT_COMMIT_VAR] = GIT_COMMIT
    os.environ[GIT_DIRTY_VAR] = "1" if GIT_DIRTY else "0"


def plan_record():
    """What this invocation plans, for plan.json: runs, ladders, comparisons, settings."""
    return {
        "runs": {
            name: {
                "params": workload_params(params),
                **pipeline_settings(params),
                **LADDERS.get(name, {}),
            }
            for name, params in RUNS.items()
        },
        "comparisons": list(COMPARISONS.values()),
        "timing": dict(config["timing"]),
        "timeout_min": config["timeout_min"],
        "git": {"commit": GIT_COMMIT, "dirty": GIT_DIRTY},
    }


# The 7 reports the analysis engine reproduces exactly (docs/analysis.md).
sys.path.insert(0, str(REPO))
from analysis.reports import REPORTS as NSYS_REPORTS  # noqa: E402

# run_stats' declared outputs: the 7 reports and the phase attribution (analysis/metrics/phases.py).
# The figures read these per-run extras too (kernel categories, idle gaps by cause, duration
# histogram); they are declared so that a missing one reruns run_stats.
STATS_CSVS = [*NSYS_REPORTS, "phase_gpu_time", "kernel_categories", "idle_time",
              "kernel_durations"]
CALIBRATION_INPUT = f"{RESULTS}/calibration.json" if config["calibrate"] else []
# One table per ladder and group (e.g. gpt_train_small), from rules/analyze.smk:ladders.
LADDER_TABLES = sorted({f"{i['ladder']}_{i['ladder_group']}" for i in LADDERS.values()})
# Comparisons of two captured runs get the kernel/NVTX comparison too; all get the speed-up.
PROFILED_COMPARISONS = [
    n for n, c in COMPARISONS.items() if c["a"] in PROFILED and c["b"] in PROFILED
]


def workload_args(run):
    """The `python -m workloads` command line of one run (its params drive reruns)."""
    params = workload_params(RUNS[run])
    args = [params.pop("workload")]
    for key, value in sorted(params.items()):
        args += [f"--{key}", str(value)]
    return shlex.join(args)


# --- the container image (built by rules/container.smk) ---------------------------------------

PROFBENCH_CACHE = Path(
    os.environ.get("PROFBENCH_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "profbench"
)
CONTAINER = config["container"]
CONTAINER_VARIANT = CONTAINER["variant"]
# The image the jobs use, in the workdir (a hard link to the hash-keyed cached build).
CONTAINER_SIF = CONTAINER.get("image") or f"resources/profbench-{CONTAINER_VARIANT}.sif"
USE_CONTAINER = DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
# Snakemake orders jobs on inputs, not on `container:`: jobs in the image also take it as input.
IMAGE_INPUT = CONTAINER_SIF if USE_CONTAINER else []
# Every job that can run in the image names it; Snakemake uses it only with --use-singularity.
RULE_CONTAINER = CONTAINER_SIF


def ensure_apptainer():
    """Put apptainer on PATH for Snakemake and the jobs (Snakemake checks it even in a dry
    run). A system apptainer/singularity wins; else the project's relocatable install in
    the cache, installed on first use on Debian machines (root, ~20 s)."""
    if shutil.which("apptainer") or shutil.which("singularity"):
        return
    app = PROFBENCH_CACHE / "apptainer" / "app" / "usr" / "bin" / "apptainer"
    if not (app.exists() and (PROFBENCH_CACHE / "apptainer" / ".complete").exists()):
        if not (os.geteuid() == 0 and shutil.which("apt-get")):
            raise WorkflowError(
                "--use-singularity needs apptainer (>= 1.1) on PATH: install it "
                "(https://apptainer.org) or, on Debian as root, run scripts/setup-apptainer.sh"
            )
        print("apptainer not found; running scripts/setup-apptainer.sh", file=sys.stderr)
        done = subprocess.run([str(REPO / "scripts" / "setup-apptainer.sh")],
                              stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise WorkflowError("scripts/setup-apptainer.sh failed (see its messages above)")
        app = Path(done.stdout.strip().splitlines()[-1])
    os.environ.update(PATH=f"{app.parent}{os.pathsep}{os.environ.get('PATH', '')}")


def bind_checkout_into_jobs():
    """Snakemake binds only the workdir (as the container's home). With --directory outside
    the checkout, jobs still import the checkout's packages (PYTHONPATH): bind it too."""
    repo, cwd = REPO.resolve(), Path.cwd().resolve()
    if repo != cwd and repo not in cwd.parents:
        settings = workflow.deployment_settings
        settings.apptainer_args = f"{settings.apptainer_args} --bind {shlex.quote(str(repo))}"


def container_build_args():
    """scripts/build-container.sh arguments from the `container` config section."""
    args = ["--variant", CONTAINER_VARIANT]
    if CONTAINER.get("torch"):
        args += ["--torch", str(CONTAINER["torch"])]
    if CONTAINER.get("torch_index"):
        args += ["--torch-index", str(CONTAINER["torch_index"])]
    return shlex.join(args)


if USE_CONTAINER:
    ensure_apptainer()
    bind_checkout_into_jobs()
    if not CONTAINER["build"] and not Path(CONTAINER_SIF).exists():
        raise _config_error(
            "container.image", f"container.build is false but {CONTAINER_SIF} does not exist"
        )


# --- tools: nsys and the Python that runs the workloads --------------------------------------

# Where scripts/install-nsys.sh puts Debian's Nsight Systems (keep in sync with the script).
NSYS_PREFIX = PROFBENCH_CACHE / "nsys-2024.2.3"
CACHED_NSYS = NSYS_PREFIX / "usr/lib/nsight-systems/bin/nsys"
NSYS_INSTALLED_MARKER = NSYS_PREFIX / ".complete"


def _find_nsys():
    """(path, needs_install): the configured nsys, else PATH's, else the cached Debian build."""
    if USE_CONTAINER:
        return "nsys", False  # the image has it on PATH
    configured = config["nsys"]["path"]
    if configured != "auto":
        if not (shutil.which(configured) or Path(configured).is_file()):
            raise _config_error("nsys.path", f"{configured!r} is not an executable file")
        return configured, False
    on_path = shutil.which("nsys")
    if on_path:
        return on_path, False
    return str(CACHED_NSYS), not NSYS_INSTALLED_MARKER.exists()


NSYS, NSYS_NEEDS_INSTALL = _find_nsys()
# Profile jobs wait for the install job only when nsys has to be installed.
NSYS_INPUT = [str(NSYS_INSTALLED_MARKER)] if NSYS_NEEDS_INSTALL else []
# The host interpreter itself (not a shim: nsys would trace the shim's shells too).
PYTHON = "python3" if USE_CONTAINER else sys.executable


# --- resources (issue 10) ---------------------------------------------------------------------
# GPU jobs (calibrate, time_run, profile) declare `gpu=1`; analysis jobs declare none. The
# default workflow profile sets `resources: gpu=1`, so `--cores N` overlaps analysis with the
# GPU jobs but never runs two of them on one GPU; the Slurm executor turns `gpu=1` into
# `sbatch --gpus=1` (docs/cluster.md). `mem_mb` (host RAM) and `runtime` (minutes) tell a
# cluster what to reserve: generous estimates from the run's size and mode, doubled on a retry
# and never above the guard's own limit (timeout_min, plus start-up and the nsys export), so
# the guard, not Slurm, ends a run that hangs. A site overrides them with --set-resources;
# each GPU job's `benchmark:` file ({LOGS}/benchmark/*.jsonl) records its seconds and max_rss.

# GPT size -> (host MB, minutes for the default 5 warm-up + 10 measured steps, forward).
GPT_SIZE_NEEDS = {
    "tiny": (4000, 5),
    "small": (8000, 10),
    "medium": (12000, 15),
    "large": (16000, 20),
    "xl": (24000, 30),
    "2.7B": (32000, 40),
}
# attention, attention_core and calibrate: a few kernels, dominated by start-up.
SMALL_JOB_NEEDS = (8000, 10)
MODE_TIME_FACTOR = {"forward": 1.0, "forward_backward": 2.0, "train": 3.0}
DEFAULT_STEPS = 15  # warm-up + measured steps the size table assumes
COMPILE_MIN = 10  # torch.compile's warm-up compilation
JOB_OVERHEAD_MIN = 10  # process start-up and nsys' SQLite export


def _run_needs(run):
    """(host MB, minutes) a GPU job of `run` needs; None for jobs without a run (calibrate)."""
    if run is None:
        return SMALL_JOB_NEEDS
    params = RUNS[run]
    mem_mb, minutes = SMALL_JOB_NEEDS
    if params["workload"] == "gpt":
        mem_mb, minutes = GPT_SIZE_NEEDS[params["size"]]
    minutes *= MODE_TIME_FACTOR.get(params.get("mode", "forward"), 1.0)
    minutes *= max(1.0, (params.get("warmup", 0) + params.get("steps", 0)) / DEFAULT_STEPS)
    if params.get("compile", "off") != "off":
        minutes += COMPILE_MIN
    return mem_mb, minutes


def timing_threads() -> int:
    """Every core of this invocation (--cores): an untraced timing job then runs alone, with
    no analysis job or capture export beside it taking the CPU that runs the workload (on a
    CPU device) or launches its kernels (a launch-bound GPU step). On a 2-core CPU machine,
    one busy process beside a 2-thread attention step took its slowest steps from 0.5 to
    4-32 ms. Remote executors (Slurm) give each job its own allocation: one thread there,
    both where the job is submitted and in its job step (which has `--cores all` of a node
    whose CPUs the allocation does not hold)."""
    if workflow.remote_exec:  # the job step on a cluster node
        return 1
    try:
        return workflow.cores
    except WorkflowError:  # no --cores: submitting to a remote executor
        return 1


# The workload runs with one CPU thread in its capture and in its timing twin (which holds
# every core, see timing_threads): the same CPU-side work in both, whatever --cores is. Part
# of the guard's command line (rules/profile.smk: GUARD), so every GPU job has it.
ONE_THREAD_ENV = " ".join(f"{name}=1" for name in (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"))


def gpu_job_mem_mb(wildcards, attempt) -> int:
    """Host memory (MB) of a GPU job, doubled on each retry."""
    return int(_run_needs(wildcards.get("run"))[0] * attempt)


def gpu_job_runtime(wildcards, attempt) -> int:
    """Wall time (minutes) of a GPU job, doubled on each retry, at most the guard's limit."""
    minutes = (_run_needs(wildcards.get("run"))[1] + JOB_OVERHEAD_MIN) * attempt
    return int(min(minutes, config["timeout_min"] + JOB_OVERHEAD_MIN))



# --- start-up checks (pipeline/checks.py) ------------------------------------------------------
# Each problem stops the workflow with one line saying what to do, before any job runs:
# - now, while the workflow is read (also for a dry run): the results folder must be writable,
#   since planning itself fails in an unusable one (e.g. a file where a folder should be);
# - when Snakemake is about to run jobs (onstart: not for a dry run, --dag, --lint, --report,
#   nor when nothing is to be done): disk space and nsys (host runs) for the runs whose
#   profile job will run, a GPU for the runs whose profile or timing jobs will run and ask
#   for CUDA, apptainer (--use-singularity).
#   A dry run does not check the machine: planning the GPU matrix on a laptop is fine.
from pipeline import checks as _checks  # noqa: E402


def _check_error(e):
    return WorkflowError(f"start-up check failed: {e}")


def _runs_to_do(rules):
    """The selected runs with a job of one of these rules to run now."""
    jobs = workflow.dag.needrun_jobs()
    names = {j.wildcards.get("run") for j in jobs if j.rule.name in rules}
    return {name: RUNS[name] for name in sorted(names) if name in RUNS}


def startup_checks():
    todo = _runs_to_do({"profile"})
    _checks.check_disk(Path(RESULTS), todo)
    if todo and not USE_CONTAINER:
        _checks.check_nsys(NSYS, NSYS_NEEDS_INSTALL)
    cuda_image = USE_CONTAINER and CONTAINER_VARIANT == "cuda"
    # untraced timing runs need the GPU as much as the captures do
    on_gpu = _runs_to_do({"profile", "time_run"})
    _checks.check_gpu(_checks.runs_needing_cuda(on_gpu, cuda_image))
    if USE_CONTAINER:
        _checks.check_apptainer(PROFBENCH_CACHE)


if workflow.is_main_process:  # not again in each job's own Snakemake process
    try:
        _checks.check_results_writable(Path(RESULTS))
    except _checks.CheckError as e:
        raise _check_error(e) from None


onstart:
    try:
        startup_checks()
    except _checks.CheckError as e:
        raise _check_error(e) from None
