# Configuration and the settings every stage shares: thin glue over the importable modules
# (pipeline/config.py resolves the config; pipeline/tools.py finds nsys and apptainer;
# pipeline/gpus.py gives GPU jobs whole GPUs; pipeline/resources.py sizes GPU jobs;
# pipeline/gitstate.py stamps the commit). Included
# first by the Snakefile; everything below is evaluated before any job is planned, so a bad
# config stops the workflow with a message that names the offending key.

import json
import os
import shlex
import socket
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

REPO = Path(workflow.basedir)
sys.path.insert(0, str(REPO))
from analysis.reports import REPORTS as NSYS_REPORTS  # noqa: E402
from pipeline import bytecode as _bytecode  # noqa: E402
from pipeline import config as _config  # noqa: E402
from pipeline import outcome as _outcome  # noqa: E402
from pipeline import gitstate as _gitstate  # noqa: E402
from pipeline import gpus as _gpus  # noqa: E402
from pipeline import resources as _resources  # noqa: E402
from pipeline import tools as _tools  # noqa: E402
from pipeline import warm as _warm  # noqa: E402
from workloads.cachedir import cache_dir as _cache_dir  # noqa: E402


def _workflow_error(e):
    return WorkflowError(str(e))


# --- the plan: runs, ladders, comparisons (pipeline/config.py) ---------------------------------
GIT_COMMIT, GIT_DIRTY = _gitstate.git_state(REPO)
_gitstate.export_git_state(GIT_COMMIT, GIT_DIRTY)
try:
    PLAN = _config.resolve(config, git={"commit": GIT_COMMIT, "dirty": GIT_DIRTY})
except _config.ConfigError as e:
    raise _workflow_error(e) from None
RUNS = PLAN.runs
PROFILED = PLAN.profiled
OP_CAPTURED = PLAN.op_captured  # runs with `ops: true | shapes`: a second, opt-in capture
LADDERS = PLAN.ladders
COMPARISONS = PLAN.comparisons
PROFILED_COMPARISONS = PLAN.profiled_comparisons
LADDER_TABLES = PLAN.ladder_tables
RESULTS = PLAN.results
LOGS = f"{RESULTS}/logs"
REPEATS = PLAN.repeats
TIMEOUT_S = PLAN.timeout_s
CALIBRATION_INPUT = f"{RESULTS}/calibration.json" if config["calibrate"] else []
# run_stats' declared outputs: the 7 reports and the phase attribution (analysis/metrics/
# phases.py). The figures read these per-run extras too (kernel categories, idle gaps by cause,
# duration histogram); they are declared so that a missing one reruns run_stats.
STATS_CSVS = [*NSYS_REPORTS, "phase_gpu_time", "kernel_categories", "idle_time",
              "kernel_durations", "kernel_map", "compiled_ops"]


# Resume anywhere (docs/reliability.md): nsys captures are temp() outputs, so a results folder
# whose captures are missing (dropped, or not copied along to another machine) goes on without
# redoing the runs whose tables exist. keep_captures: true (the default) keeps them on disk:
# Snakemake's "notemp" setting, which also never recreates a missing temp file that nothing
# still needs (Snakemake 9.27.1, pinned in pyproject.toml).
def capture_output(path):
    return temp(path)


workflow.storage_settings.notemp = bool(config["keep_captures"])


# The report's first page: the overview rule's landing text (headline table, top findings,
# the settings that ran) once it exists, else the static description.
LANDING_PAGE = "report_landing.rst"


def landing_page():
    made = Path(RESULTS) / LANDING_PAGE
    return str(made.resolve()) if made.is_file() else "report/workflow.rst"


def results_folder(wildcards, input):
    """The results folder, as the folder of a rule's summary.csv or plan.json input."""
    return os.path.dirname(input.summary if "summary" in input.keys() else input.plan)


def plan_record():
    """What this invocation plans, for plan.json: runs, ladders, comparisons, settings."""
    return PLAN.record()


def workload_args(run):
    """The `python -m workloads` command line of one run (its params drive reruns)."""
    return PLAN.workload_args(run)


def op_capture_args(run):
    """The op capture's command line: the run's, with PyTorch's op ranges (--op_ranges)."""
    return PLAN.op_capture_args(run)


def torch_trace_env(wildcards, output):
    """TORCH_TRACE for the capture of a compiled run: Inductor's generated code and kernel
    provenance, which the analysis maps compiled kernels to the model with."""
    return f"TORCH_TRACE={output.trace}" if PLAN.compiled(wildcards.run) else ""


# --- the container image (built by rules/container.smk) ---------------------------------------
PROFBENCH_CACHE = _cache_dir()
CONTAINER = config["container"]
CONTAINER_VARIANT = CONTAINER["variant"]
# The image the jobs use, in the workdir (a hard link to the hash-keyed cached build).
CONTAINER_SIF = CONTAINER.get("image") or f"resources/profbench-{CONTAINER_VARIANT}.sif"
USE_CONTAINER = DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
# Snakemake orders jobs on inputs, not on `container:`: jobs in the image also take it as input.
IMAGE_INPUT = CONTAINER_SIF if USE_CONTAINER else []
# Every job that can run in the image names it; Snakemake uses it only with --use-singularity.
RULE_CONTAINER = CONTAINER_SIF


def bind_checkout_into_jobs():
    """Snakemake binds only the workdir (as the container's home). With --directory outside
    the checkout, jobs still import the checkout's packages (PYTHONPATH): bind it too."""
    repo, cwd = REPO.resolve(), Path.cwd().resolve()
    if repo != cwd and repo not in cwd.parents:
        settings = workflow.deployment_settings
        settings.apptainer_args = f"{settings.apptainer_args} --bind {repo}"


def container_build_args():
    return _tools.container_build_args(CONTAINER)


if USE_CONTAINER:
    try:
        _tools.ensure_apptainer(PROFBENCH_CACHE)
    except _tools.ToolError as e:
        raise _workflow_error(e) from None
    bind_checkout_into_jobs()
    if not CONTAINER["build"] and not Path(CONTAINER_SIF).exists():
        raise _workflow_error(_config.ConfigError(
            "container.image", f"container.build is false but {CONTAINER_SIF} does not exist"))


# --- tools: nsys and the Python that runs the workloads --------------------------------------
try:
    NSYS, NSYS_NEEDS_INSTALL = _tools.find_nsys(config["nsys"]["path"], USE_CONTAINER,
                                                PROFBENCH_CACHE)
except _config.ConfigError as e:
    raise _workflow_error(e) from None
NSYS_INSTALLED_MARKER = _tools.cached_nsys(PROFBENCH_CACHE)[1]
# Profile jobs wait for the install job only when nsys has to be installed.
NSYS_INPUT = [str(NSYS_INSTALLED_MARKER)] if NSYS_NEEDS_INSTALL else []
# The host interpreter itself (not a shim: nsys would trace the shim's shells too).
PYTHON = "python3" if USE_CONTAINER else sys.executable


# --- GPUs and resources (pipeline/gpus.py, pipeline/resources.py) ---------------------------
# Snakemake's `gpu` resource counts whole GPUs. Every GPU job declares the GPUs it uses: one
# (calibrate, time_run, profile, profile_ops) or its ranks (a distributed run's jobs, the
# all-reduce sweep); analysis jobs declare none. Where the jobs run on this machine, the
# invocation has as many as the host (CUDA_VISIBLE_DEVICES' entries, else NVML's GPUs; one
# slot, the CPU, without any) unless `--resources gpu=N` sets it, and each job's guard takes
# that many whole GPUs of its own under a lock per GPU and runs its command with
# CUDA_VISIBLE_DEVICES set to them. So one-GPU jobs run side by side on different GPUs, and no
# job ever shares a GPU with another, a timing job above all; a killed job's GPUs are free at
# once (the kernel drops its locks). A capture also takes its GPU's device lock before its
# first CUDA call (workloads/devicelock.py: it waits until the GPU's memory is back). On a
# remote executor (Slurm) the same `gpu` becomes `sbatch --gpus=N` and Slurm assigns the
# devices: no locks there (docs/cluster.md).


def runs_on_this_machine() -> bool:
    """Whether the jobs run where Snakemake runs (not submitted to a remote executor)."""
    if workflow.remote_exec:  # the job step on a cluster node
        return False
    try:
        workflow.cores
    except WorkflowError:  # no --cores: submitting to a remote executor
        return False
    return True


HOST_GPUS = _gpus.slots() if runs_on_this_machine() else []
if HOST_GPUS and "gpu" not in workflow.global_resources:
    workflow.register_resource("gpu", len(HOST_GPUS))


def gpus_at_once() -> int:
    """How many GPUs this invocation's jobs hold at once: the host's, or fewer with
    `--resources gpu=N`."""
    cap = workflow.global_resources["gpu"].value if "gpu" in workflow.global_resources else None
    return max(1, min(len(HOST_GPUS), cap if isinstance(cap, int) else len(HOST_GPUS)))


# The guard's GPU arguments (guard_command): where the locks are (in Snakemake's
# folder of the working directory, which every job, also one in the image, sees and writes;
# not in the results, which hold results only) and the GPUs to take them from.
GPU_LOCKS = _gpus.lock_folder(Path("."), socket.gethostname())
GUARD_GPU_ARGS = (
    f" --gpu-locks {shlex.quote(str(GPU_LOCKS))} --host-gpus {shlex.quote(','.join(HOST_GPUS))}"
    if HOST_GPUS else ""
)


def job_gpus(wildcards) -> int:
    """The GPUs a job takes: a distributed run's (or an all-reduce sweep's) ranks, else 1."""
    if "ranks" in wildcards.keys():
        return int(wildcards.ranks)
    return PLAN.distributed.get(wildcards.get("run"), 1)


def timing_threads():
    """The cores of an untraced timing job: its GPUs' share of this invocation's (--cores
    divided among the GPUs held at once). With one GPU that is every core: the timing job
    runs alone, with no analysis job or capture export beside it taking the CPU that runs the
    workload (on a CPU device) or launches its kernels (a launch-bound GPU step). On a 2-core
    CPU machine, one busy process beside a 2-thread attention step took its slowest steps
    from 0.5 to 4-32 ms. With several GPUs, one timing job per GPU runs side by side, each
    with its share. Remote executors (Slurm) give each job its own allocation: one thread
    there, both where the job is submitted and in its job step (which has `--cores all` of a
    node whose CPUs the allocation does not hold)."""
    if not runs_on_this_machine():
        return 1
    share = max(1, workflow.cores // gpus_at_once())

    def threads(wildcards) -> int:
        return min(workflow.cores, share * job_gpus(wildcards))

    return threads


# The workload's environment, part of the guard's command line (guard_command), so
# every GPU job has it:
# - one CPU thread in its capture and in its timing twin (which holds its GPU's share of the
#   cores, see timing_threads): the same CPU-side work in both, whatever --cores is;
# - no pre-started Inductor compile-worker pool (TORCH_WARM_POOL=0): torch starts one when the
#   Inductor backend is first used (torch 2.11 already when Inductor is imported), also when
#   every graph then comes from the cache, and the job waits for it at exit (13-15 s per
#   compiled job in the published records); a cold compile still gets its parallel workers,
#   started when it needs them;
# - torch.cuda.is_available() answered through NVML (PYTORCH_NVML_BASED_CUDA_CHECK=1, PyTorch's
#   switch for forking processes): Inductor and Triton ask it while they are imported, and the
#   CUDA runtime's answer initializes the driver (cuInit, which starts a driver thread), after
#   which a warm parent must not fork. Same answer, no driver in the parent.
# The warm parents preload in this environment too (docs/timing.md).
WORKLOAD_ENV = " ".join([*(f"{name}=1" for name in (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")), "TORCH_WARM_POOL=0",
    "PYTORCH_NVML_BASED_CUDA_CHECK=1"])


def guard_command(wildcards) -> str:
    """Every GPU job's guard: in WORKLOAD_ENV, on the whole GPUs it takes for the job where
    jobs run on this machine (GUARD_GPU_ARGS; job_gpus: one, or a distributed run's ranks)."""
    gpu_args = f"{GUARD_GPU_ARGS} --gpus {job_gpus(wildcards)}" if GUARD_GPU_ARGS else ""
    return f"{WORKLOAD_ENV} {PYTHON} -m pipeline.guard --timeout-s {TIMEOUT_S}{gpu_args}"


def gpu_job_mem_mb(wildcards, attempt) -> int:
    """Host memory (MB) of a GPU job, doubled on each retry."""
    return _resources.job_mem_mb(RUNS.get(wildcards.get("run")), attempt)


def gpu_job_runtime(wildcards, attempt) -> int:
    """Wall time (minutes) of a GPU job, doubled on each retry, at most the guard's limit."""
    return _resources.job_runtime_min(RUNS.get(wildcards.get("run")), attempt,
                                      config["timeout_min"])


def timing_job_runtime(wildcards, attempt) -> int:
    """Wall time (minutes) of a run's timing job: its processes run one after another."""
    return len(REPEATS) * gpu_job_runtime(wildcards, attempt)


# --- start-up checks (pipeline/checks.py) ------------------------------------------------------
# Each problem stops the workflow with one line saying what to do, before any job runs:
# - now, while the workflow is read (also for a dry run): the results folder must be writable,
#   since planning itself fails in an unusable one (e.g. a file where a folder should be);
# - when Snakemake is about to run jobs (onstart: not for a dry run, --dag, --lint, --report,
#   nor when nothing is to be done): disk space and nsys (host runs) for the runs whose
#   profile job will run, a GPU for the runs whose profile or timing jobs will run and ask
#   for CUDA (device cuda; device auto too in the CUDA image or in a GPU config, `gpu:
#   required`, as config.yaml is), apptainer (--use-singularity).
#   A dry run does not check the machine: planning the GPU matrix on a laptop is fine.
from pipeline import checks as _checks  # noqa: E402


def _check_error(e):
    return WorkflowError(f"start-up check failed: {e}")


# The rules that capture and that time runs (rules/distributed.smk adds its per-rank-count ones).
CAPTURE_RULES = {"profile", "profile_ops"}
TIMING_RULES = {"time_run"}


def _runs_to_do(rules):
    """The selected runs with a job of one of these rules to run now."""
    jobs = workflow.dag.needrun_jobs()
    names = {j.wildcards.get("run") for j in jobs if j.rule.name in rules}
    return {name: RUNS[name] for name in sorted(names) if name in RUNS}


def startup_checks():
    # The GPU first: a GPU config on a machine without one is told that, not what else the
    # machine lacks for it (nsys, disk).
    cuda_image = USE_CONTAINER and CONTAINER_VARIANT == "cuda"
    # `gpu: required` (config.yaml and config/*.yaml): device auto means cuda too, where the
    # jobs run here (a Slurm job's node has the GPU, not the machine that submits it)
    gpu_config = config["gpu"] == "required" and runs_on_this_machine()
    # untraced timing runs need the GPU as much as the captures do
    on_gpu = _runs_to_do(CAPTURE_RULES | TIMING_RULES)
    needing = _checks.runs_needing_cuda(on_gpu, cuda_image, gpu_config)
    why = _checks.gpu_config_why(needing) if gpu_config and needing else ""
    _checks.check_gpu(needing, why)
    todo = _runs_to_do(CAPTURE_RULES)
    _checks.check_disk(Path(RESULTS), todo)
    if todo and not USE_CONTAINER:
        _checks.check_nsys(NSYS, NSYS_NEEDS_INSTALL)
    if USE_CONTAINER:
        _checks.check_apptainer(PROFBENCH_CACHE)


if workflow.is_main_process:  # not again in each job's own Snakemake process
    try:
        _checks.check_results_writable(Path(RESULTS))
    except _checks.CheckError as e:
        raise _check_error(e) from None


# --- the warm parents (pipeline/warm.py, docs/timing.md) --------------------------------------
# With `launcher: fork`, onstart names this invocation's warm parents (their name carries this
# Snakemake process's pid: they exit with it) and their log folder in the environment every
# job inherits, not on the jobs' command lines: Snakemake reruns a job whose command or params
# changed, and the name is new in every invocation. The first timing or calibration job of
# each slot (repeat index) and GPU starts its parent in its own environment (host or image).
# Jobs on a remote executor (Slurm) start processes.
LAUNCHER = config["launcher"] if workflow.local_exec and workflow.is_main_process else "process"


def name_warm_parents():
    if LAUNCHER == "fork":
        os.environ[_warm.ENV_NAME] = _warm.new_name(os.getpid())
        os.environ[_warm.ENV_LOGS] = str(Path(LOGS).resolve())


def say_gpus():
    """Which GPUs the jobs take, and a cap above the host's, in Snakemake's output."""
    if not HOST_GPUS:
        return
    cap = workflow.global_resources["gpu"].value
    which = ("one slot, the CPU (no GPU found)" if HOST_GPUS == [_gpus.CPU]
             else f"{len(HOST_GPUS)} GPU(s): {', '.join(HOST_GPUS)}")
    print(f"profbench: GPU jobs take whole GPUs of {which}; at most {cap} at once",
          file=sys.stderr)
    if isinstance(cap, int) and cap > len(HOST_GPUS):
        print(f"profbench: --resources gpu={cap} is more than this host has: the jobs beyond "
              f"{len(HOST_GPUS)} wait for a free GPU", file=sys.stderr)


onstart:
    try:
        startup_checks()
    except _checks.CheckError as e:
        raise _check_error(e) from None
    name_warm_parents()
    say_gpus()
    # Every job's imports from bytecode where the install keeps none (pipeline/bytecode.py;
    # the guard does the same for each GPU job, this covers the statistics and report jobs).
    bytecode_note = _bytecode.keep_bytecode(os.environ, in_container=USE_CONTAINER)
    if bytecode_note:
        print(f"profbench: {bytecode_note}", file=sys.stderr)


onsuccess:
    # the runs that did not end ok, said out loud; `fail_on: error` makes them an exit 1
    block, stop = _outcome.end_of_run(Path(RESULTS), config["fail_on"])
    if block:
        print(block, file=sys.stderr)
    if stop:
        raise WorkflowError(stop)


# -- run_stats' captures (rules/analyze.smk) ---------------------------------------------------
def run_exports(wildcards):
    """The run's captures: every rank's for a distributed run (rules/distributed.smk; rank 0's
    is also profile.sqlite), else its one capture. Its trace shows them all on one clock."""
    ranks = PLAN.distributed.get(wildcards.run)
    run = f"{RESULTS}/{wildcards.run}"
    if ranks:
        return [f"{run}/profile.rank{r}.sqlite" for r in range(ranks)]
    return [f"{run}/profile.sqlite"]


# `batch: max` (docs/workloads.md, "The largest batch that fits"): the run's search, one guarded
# job of one GPU before its other jobs, each batch tried in its own process
# (workloads/maxbatch.py); its result is the run's maxbatch.json, which the run's timing
# processes, capture and memory capture read their batch from (--batch_from, pipeline/config.py:
# Plan.workload_args). A search without a batch leaves its status there: each of those
# processes then writes it as the run's failed record.
from workloads import maxbatch as _maxbatch  # noqa: E402

MAX_BATCH = PLAN.max_batch


def max_batch_input(wildcards):
    """A `batch: max` run's search result, which its jobs wait for; nothing for other runs."""
    return PLAN.max_batch_result(wildcards.run) if wildcards.run in MAX_BATCH else []


def max_batch_timeout_s(wildcards) -> int:
    """The search job's limit: the run's (timeout_min) for each process it may run."""
    return TIMEOUT_S * _maxbatch.most_processes(MAX_BATCH[wildcards.run]["bound"])


def max_batch_job_runtime(wildcards, attempt) -> int:
    """Wall time (minutes) of a search job: a GPU job's for each process it may run."""
    processes = _maxbatch.most_processes(MAX_BATCH[wildcards.run]["bound"])
    return processes * gpu_job_runtime(wildcards, attempt)
