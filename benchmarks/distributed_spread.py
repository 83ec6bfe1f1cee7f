"""Where the process-to-process spread of a distributed run's untraced step comes from, in one
command on the machine that showed it.

    python benchmarks/distributed_spread.py --size 2.7B --parallel ddp --gpus 2 --launches 4
    python benchmarks/distributed_spread.py --size 2.7B --parallel fsdp --gpus 2 --launches 4
    python benchmarks/distributed_spread.py --run gpt_2.7B_ddp2 --launches 3 \\
        --variants pipeline,expandable,nccl_priority,plain,plain_hook
    python benchmarks/distributed_spread.py --size 2.7B --parallel ddp --gpus 2 --dry-run

The run is the config's (``--config``, default config/distributed.yaml) GPT train run of that
size, parallel mode and GPU count with the default bucket size and resharding (or ``--run``).
Its timing command is the pipeline's own: the shell command of the run's untraced timing job
as Snakemake's dry run prints it (environment, guard, launcher, torchrun, the workload),
launched as it is. Each variant changes one thing (``--variants``; see VARIANTS below), and
the variants take turns: round i launches each once, in order, so that a drift of the machine
reaches each alike. ``--budget-s`` stops before a round that would not end in time.

Per launch it prints the median step (the pipeline's record: rank 0's median, as published;
the plain script: the median over ranks), every rank's median, the steps, the GPUs' SM clock,
power, temperature and throttle reasons while they were busy (nvidia-smi every 0.5 s), the
1-minute load average and the processes already on the GPUs before it started. Per variant:
the median of the launch medians, their spread ((max - min) / median) and the spread within a
launch. ``--out`` writes all of it as JSON, with the machine's CPU and GPU topology.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parent.parent
PLAIN = REPO / "benchmarks" / "plain_distributed.py"
sys.path[:0] = [str(REPO), str(SCRIPT.parent)]

from distributed_vs_plain import plain_options, torchrun, workload_options  # noqa: E402

from pipeline.launch import NCCL_ENV  # noqa: E402

EXEC_BOUND = "--exec-bound"  # this script, as the CPU-binding prefix of each rank's command

VARIANTS = {
    "pipeline": "the pipeline's timing command, as the pipeline runs it",
    "warmup20": "the same with --warmup 20 (NCCL's connections, the caching allocator, cuDNN's "
                "plans and DDP's bucket order settled before the first measured step)",
    "bind": "each rank bound to physical cores of its own near its GPU (the GPU's "
            "local_cpulist, its cores split between the ranks that share it)",
    "busy": "the pipeline's command with half the cores busy beside it (what an export or an "
            "analysis job on the same CPUs does to it)",
    "expandable": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the allocator's layout, "
                  "and cudaMalloc retries near a full GPU, out of the way)",
    "nccl_priority": "TORCH_NCCL_HIGH_PRIORITY=1 (NCCL's kernels on high-priority streams: "
                     "how communication and compute share the SMs)",
    "plain": "benchmarks/plain_distributed.py: the same step, warm-up and steps, no profbench "
             "code",
    "plain_hook": "the plain script with PyTorch's Python all-reduce hook (DDP): what a Python "
                  "comm hook costs beside DDP's built-in all-reduce",
}
DEFAULT_VARIANTS = "pipeline,warmup20,bind,busy,plain"
# NVML's clock-event (throttle) reasons, by bit; GPU idle is left out
THROTTLE = {0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
            0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "power_brake",
            0x100: "display_clocks"}
GPU_FIELDS = "index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu"
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


# --- the pipeline's timing command -------------------------------------------------------------


@dataclass
class TimingCommand:
    """A timing job's shell command: the variables it sets, its argv, the result it names."""

    env: dict[str, str]
    argv: list[str]
    out: str

    @classmethod
    def parse(cls, shell: str) -> TimingCommand:
        tokens = shlex.split(shell)
        if ">" in tokens:  # the job log: each launch here gets its own
            tokens = tokens[: tokens.index(">")]
        env = {}
        while tokens and re.fullmatch(r"[A-Za-z_]\w*=.*", tokens[0]):
            name, value = tokens.pop(0).split("=", 1)
            env[name] = value
        return cls(env, tokens, tokens[tokens.index("--out") + 1])

    def rank_start(self) -> int:
        """Where each rank's command begins: after the launcher's last ``--``."""
        return len(self.argv) - self.argv[::-1].index("--")

    def build(self, out: Path, rank_prefix: list[str] | None = None,
              rank_args: list[str] | None = None) -> list[str]:
        argv = [str(out) if token == self.out else token for token in self.argv]
        start = self.rank_start()
        return argv[:start] + (rank_prefix or []) + argv[start:] + (rank_args or [])


def pythonpath() -> dict[str, str]:
    """The repository importable from any folder (Snakemake's jobs run in its workdir)."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                         os.environ.get("PYTHONPATH")]))}


def snakemake_timing_command(config: Path, run: str, work: Path) -> str:
    """The shell command of `run`'s first timing job, from Snakemake's dry run with `work` as
    its working directory (the command's relative paths are relative to it)."""
    results = work / "results"
    target = results / run / "timing" / "r0.json"
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
           "--directory", str(work), "--dry-run", "--printshellcmds", "--cores", "1",
           "--configfile", str(config), "--config", f"results={results}", "--", str(target)]
    work.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True,
                          env={**os.environ, **pythonpath()})
    for line in done.stdout.splitlines():
        if "-m pipeline.guard" in line and str(target) in line:
            return line.split("Shell command:", 1)[-1].strip()
    raise SystemExit(f"no timing command for {run} in Snakemake's dry run "
                     f"(exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def find_run(config: Path, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The config's run: by name, or the GPT train run of this size, mode and GPU count with
    the default bucket size and resharding."""
    from pipeline.config import load

    runs = load(config).runs
    if args.run:
        if args.run not in runs:
            raise SystemExit(f"{args.run} is not a run of {config}")
        return args.run, runs[args.run]
    for name, params in runs.items():
        if (params.get("workload") == "gpt" and params.get("mode") == "train"
                and str(params.get("size")) == args.size
                and params.get("parallel", "none") == args.parallel
                and int(params.get("gpus", 1)) == args.gpus
                and "bucket_cap_mb" not in params and "reshard_after_forward" not in params):
            return name, params
    raise SystemExit(f"{config} has no GPT train run of size {args.size}, parallel "
                     f"{args.parallel}, {args.gpus} GPUs")


# --- variants ----------------------------------------------------------------------------------


@dataclass
class Launch:
    variant: str
    argv: list[str]
    env: dict[str, str]
    kind: str  # "pipeline" (its record) or "plain" (the plain script's JSON)
    cwd: Path  # where it runs: the pipeline's commands in Snakemake's working directory
    busy: int = 0  # CPU burners beside it


def plain_argv(params: dict[str, Any], out: Path, device: str, extra: list[str]) -> list[str]:
    options = workload_options(params)
    flags = plain_options(options, warmup=options["warmup"], steps=options["steps"],
                          device=device)
    return torchrun(options["gpus"], options["parallel"],
                    [str(PLAIN), *flags, *extra, "--out", str(out)])


def make_launch(variant: str, timing: TimingCommand, params: dict[str, Any], out: Path,
                args: argparse.Namespace, workdir: Path) -> Launch:
    """The command of one launch of `variant`, its result at `out`."""
    env = {**timing.env, **pythonpath()}
    if variant in ("plain", "plain_hook"):
        extra = ["--comm-hook", "python"] if variant == "plain_hook" else []
        # as the pipeline's launcher: NVLink multicast off unless the host says otherwise
        plain_env = {k: v for k, v in NCCL_ENV.items() if k not in os.environ}
        plain_env["OMP_NUM_THREADS"] = "1"  # what torchrun gives each of several ranks
        return Launch(variant, plain_argv(params, out, args.device, extra), plain_env, "plain",
                      REPO)
    if variant == "warmup20":
        return Launch(variant, timing.build(out, rank_args=["--warmup", str(args.long_warmup)]),
                      env, "pipeline", workdir)
    if variant == "bind":
        prefix = [sys.executable, str(SCRIPT), EXEC_BOUND, "--"]
        return Launch(variant, timing.build(out, rank_prefix=prefix), env, "pipeline", workdir)
    if variant == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if variant == "nccl_priority":
        env["TORCH_NCCL_HIGH_PRIORITY"] = "1"
    busy = args.busy_procs if variant == "busy" else 0
    return Launch(variant, timing.build(out), env, "pipeline", workdir, busy)


# --- CPU binding of a rank (the `bind` variant) ------------------------------------------------


def parse_cpulist(text: str) -> set[int]:
    """``0-3,8,10-11`` -> {0, 1, 2, 3, 8, 10, 11}"""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if "-" in part:
            low, high = part.split("-")
            cpus.update(range(int(low), int(high) + 1))
        elif part:
            cpus.add(int(part))
    return cpus


def physical_cores(cpus: set[int]) -> list[list[int]]:
    """`cpus` grouped by physical core (SMT siblings together), in CPU order."""
    groups: dict[int, list[int]] = {}
    for cpu in sorted(cpus):
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        siblings = parse_cpulist(path.read_text()) & cpus if path.exists() else {cpu}
        groups.setdefault(min(siblings or {cpu}), []).append(cpu)
    return [groups[key] for key in sorted(groups)]


def gpu_bus_ids() -> list[str]:
    """PCI bus id of each GPU, in nvidia-smi's (PCI) order: CUDA's order for identical GPUs."""
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout
    # nvidia-smi: 8-digit PCI domain; sysfs: 4
    return [line.strip()[-12:].lower() for line in out.splitlines() if line.strip()]


def gpu_local_cpus(bus_id: str | None) -> set[int] | None:
    path = Path(f"/sys/bus/pci/devices/{bus_id}/local_cpulist")
    return parse_cpulist(path.read_text()) if bus_id and path.exists() else None


def rank_cpus(local_rank: int, local_world: int, allowed: set[int],
              local_cpus: list[set[int] | None]) -> set[int]:
    """The CPUs of one rank: the physical cores near its GPU (all allowed ones when unknown),
    split evenly between the ranks whose GPUs share them, so that no two ranks share a core."""
    near = [(c & allowed) if c and c & allowed else allowed for c in local_cpus]
    mine = near[local_rank]
    sharing = [r for r in range(local_world) if near[r] == mine]
    cores = physical_cores(mine)
    per_rank = len(cores) // len(sharing)
    if per_rank == 0:  # fewer cores than ranks: they share what there is
        return mine
    index = sharing.index(local_rank)
    return {cpu for core in cores[index * per_rank:(index + 1) * per_rank] for cpu in core}


def exec_bound(cmd: list[str]) -> None:
    """Bind this rank (torchrun's LOCAL_RANK) to its CPUs, then become `cmd`."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    order = ([int(v) for v in visible.split(",")] if visible and all(
        v.strip().isdigit() for v in visible.split(",")) else list(range(local_world)))
    buses = gpu_bus_ids()
    local = [gpu_local_cpus(buses[i]) if i < len(buses) else None
             for i in order[:local_world]]
    local += [None] * (local_world - len(local))
    cpus = rank_cpus(local_rank, local_world, os.sched_getaffinity(0), local)
    os.sched_setaffinity(0, cpus)
    print(f"bind: local rank {local_rank} on CPUs {sorted(cpus)}", file=sys.stderr, flush=True)
    os.execvp(cmd[0], cmd)


# --- what the machine does meanwhile -----------------------------------------------------------


class GpuSampler:
    """nvidia-smi's GPU clocks, power, temperature and throttle reasons every 0.5 s."""

    def __init__(self, path: Path) -> None:
        self.path, self.proc, self.fields = path, None, None

    def __enter__(self) -> GpuSampler:
        self.fields = _gpu_query_fields()
        if self.fields:
            with open(self.path, "w") as sink:
                self.proc = subprocess.Popen(
                    ["nvidia-smi", f"--query-gpu={self.fields}", "--format=csv,noheader,nounits",
                     "-lms", "500"], stdout=sink, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()

    def summary(self) -> dict[str, Any] | None:
        """Per GPU, over the samples while it was busy (utilization >= 50%): median SM clock
        and power, the highest temperature, the throttle reasons seen."""
        if self.proc is None or not self.path.exists():
            return None
        busy: dict[str, list[list[str]]] = {}
        for line in self.path.read_text().splitlines():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) == 7 and _float(cells[5]) is not None and _float(cells[5]) >= 50:
                busy.setdefault(cells[0], []).append(cells)
        return {gpu: _gpu_summary(rows) for gpu, rows in sorted(busy.items())}


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _gpu_summary(rows: list[list[str]]) -> dict[str, Any]:
    def median(i: int) -> float | None:
        values = [v for v in (_float(r[i]) for r in rows) if v is not None]
        return statistics.median(values) if values else None

    reasons = set()
    for row in rows:
        mask = int(row[6], 16) if row[6].startswith("0x") else 0
        reasons.update(name for bit, name in THROTTLE.items() if mask & bit)
    temps = [v for v in (_float(r[4]) for r in rows) if v is not None]
    return {"samples": len(rows), "sm_mhz": median(1), "mem_mhz": median(2),
            "power_w": median(3), "max_temp_c": max(temps) if temps else None,
            "throttle": sorted(reasons)}


def _gpu_query_fields() -> str | None:
    """The query fields this nvidia-smi takes (the throttle reasons were renamed)."""
    if not shutil.which("nvidia-smi"):
        return None
    for reasons in REASON_FIELDS:
        fields = f"{GPU_FIELDS},{reasons}"
        done = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                              capture_output=True, text=True)
        if done.returncode == 0:
            return fields
    return None


def gpu_processes() -> list[str]:
    """Compute processes on the GPUs now (pid, name, memory)."""
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def load_average() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def cpu_burners(count: int) -> Iterator[None]:
    """`count` busy processes beside the launch."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def machine() -> dict[str, Any]:
    """CPU and GPU topology: what binding and placement have to work with."""
    info: dict[str, Any] = {"cpus_allowed": len(os.sched_getaffinity(0)),
                            "load_average": load_average()}
    if shutil.which("lscpu"):
        lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
        keep = ("Model name", "Thread(s) per core", "Core(s) per socket", "Socket(s)", "NUMA")
        info["lscpu"] = [line.strip() for line in lines if line.strip().startswith(keep)]
    buses = gpu_bus_ids()
    info["gpu_local_cpus"] = {bus: sorted(gpu_local_cpus(bus) or []) for bus in buses}
    if shutil.which("nvidia-smi"):
        info["nvidia_smi_topo"] = subprocess.run(["nvidia-smi", "topo", "-m"],
                                                 capture_output=True, text=True).stdout
    return info


# --- launching, reading, summarizing -----------------------------------------------------------


def read_launch(kind: str, out: Path) -> dict[str, Any]:
    """A launch's median step, rank medians, steps and warm-up, from what it wrote."""
    try:
        record = json.loads(out.read_text())
    except (OSError, ValueError):
        return {"status": "error", "message": "no result written"}
    if kind == "plain":
        return {"status": "ok", "median_ms": record["step_ms"],
                "rank_median_ms": record["rank_median_ms"],
                "steps_ms": record["rank_step_ms"][0], "warmup_ms": record["warmup_ms"],
                "alloc_retries": [m.get("alloc_retries") for m in record.get("rank_memory", [])]}
    if record.get("status") != "ok":
        return {"status": record.get("status", "error"),
                "message": str(record.get("message"))[-500:]}
    ranks = record.get("rank_step_ms") or [record["step_ms"]]
    return {"status": "ok", "median_ms": record["median_ms"],
            "rank_median_ms": [statistics.median(r) for r in ranks],
            "steps_ms": record["step_ms"], "warmup_ms": record.get("warmup_times_ms", [])}


def run_launch(launch: Launch, out: Path, log: Path, timeout_s: float) -> dict[str, Any]:
    """Launch once, alone but for its variant's burners; what it measured and what the
    machine did meanwhile."""
    out.unlink(missing_ok=True)  # an earlier launch's, in a reused --work
    before = {"gpu_processes": gpu_processes(), "load_average": load_average()}
    env = {**os.environ, **launch.env}
    start = time.monotonic()
    with cpu_burners(launch.busy), GpuSampler(log.with_suffix(".gpu.csv")) as sampler, \
            open(log, "w") as sink:
        proc = subprocess.Popen(launch.argv, cwd=launch.cwd, env=env, stdout=sink,
                                stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # SIGTERM: the guard and torchrun pass it on to every rank (a SIGKILL would
            # leave the ranks on the GPUs)
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    result = read_launch(launch.kind, out)
    result.update(before, seconds=round(time.monotonic() - start, 1), gpus=sampler.summary(),
                  log=str(log))
    return result


def describe(variant: str, index: int, result: dict[str, Any]) -> str:
    if result["status"] != "ok":
        return f"{variant:<13} #{index}: {result['status']}: {result.get('message', '')}"
    ranks = "/".join(f"{v:.1f}" for v in result["rank_median_ms"])
    steps = " ".join(f"{v:.0f}" for v in result["steps_ms"])
    gpus = "; ".join(f"GPU {g} {_num(s['sm_mhz'])} MHz {_num(s['power_w'])} W "
                     f"{_num(s['max_temp_c'])} C"
                     + (f" {','.join(s['throttle'])}" if s["throttle"] else "")
                     for g, s in (result.get("gpus") or {}).items())
    others = f", {len(result['gpu_processes'])} process(es) on the GPUs before" \
        if result["gpu_processes"] else ""
    retries = f", allocator retries {result['alloc_retries']}" \
        if any(result.get("alloc_retries") or []) else ""
    return (f"{variant:<13} #{index}: median {result['median_ms']:.1f} ms (ranks {ranks}) "
            f"steps [{steps}], {result['seconds']} s, load {result['load_average']}{others}"
            f"{retries}" + (f"; {gpus}" if gpus else ""))


def _num(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in results if r["status"] == "ok"]
    medians = [r["median_ms"] for r in ok]
    if not medians:
        return {"launches": len(results), "ok": 0}
    within = [(max(r["steps_ms"]) - min(r["steps_ms"])) / statistics.median(r["steps_ms"])
              for r in ok]
    middle = statistics.median(medians)
    return {"launches": len(results), "ok": len(ok), "median_ms": middle,
            "launch_medians_ms": medians, "min_ms": min(medians), "max_ms": max(medians),
            # one launch has no spread between launches
            "spread": (max(medians) - min(medians)) / middle if len(medians) > 1 else None,
            "within_launch_spread": statistics.median(within)}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def format_summary(summaries: dict[str, dict[str, Any]]) -> str:
    base = summaries.get("pipeline", {}).get("median_ms")
    head = (f"{'variant':<14} {'ok':>5} {'median ms':>10} {'min - max ms':>17} {'spread':>7} "
            f"{'within':>7} {'vs pipeline':>12}")
    lines = [head, "-" * len(head)]
    for name, s in summaries.items():
        if not s.get("ok"):
            lines.append(f"{name:<14} {s['ok']:>2}/{s['launches']:<2} (no launch succeeded)")
            continue
        ratio = f"{s['median_ms'] / base:.3f}" if base else "-"
        lines.append(f"{name:<14} {s['ok']:>2}/{s['launches']:<2} {s['median_ms']:>10.1f} "
                     f"{s['min_ms']:>8.1f} - {s['max_ms']:<6.1f} {_pct(s['spread']):>7} "
                     f"{_pct(s['within_launch_spread']):>7} {ratio:>12}")
    lines.append("spread: (max - min) / median of the launches' medians; within: the same over "
                 "one launch's steps (median over launches)")
    return "\n".join(lines)


def reading(summaries: dict[str, dict[str, Any]], steady: float) -> list[str]:
    """What the variants say about the pipeline's spread, in a few lines."""
    pipe = summaries.get("pipeline", {})
    if not pipe.get("ok"):
        return ["the pipeline's command did not run: see its log"]
    spread = pipe["spread"]
    if spread is None:
        return ["one launch per variant: no spread between launches to read"]
    said = [f"the pipeline's launches spread {spread:.1%}"
            + (" (steady here)" if spread <= steady else "")]
    for name, s in summaries.items():
        if name == "pipeline" or not s.get("ok") or s["spread"] is None:
            continue
        change = s["median_ms"] / pipe["median_ms"] - 1
        line = f"{name}: spread {s['spread']:.1%}, median {change:+.1%} against the pipeline"
        if spread > steady and s["spread"] <= max(steady, spread / 2):
            line += f" -> removes most of the spread: {VARIANTS[name]}"
        said.append(line)
    return said


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=REPO / "config" / "distributed.yaml")
    p.add_argument("--run", help="the run's name (default: found by size, parallel, gpus)")
    p.add_argument("--size", default="2.7B")
    p.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--launches", type=int, default=4, help="launches of each variant")
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--long-warmup", type=int, default=20, help="warm-up steps of warmup20")
    p.add_argument("--busy-procs", type=int, default=max(1, len(os.sched_getaffinity(0)) // 2),
                   help="busy processes beside the `busy` variant (default: half the cores)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="the plain script's device")
    p.add_argument("--budget-s", type=float, default=470,
                   help="start no round that would end after this many seconds")
    p.add_argument("--timeout-s", type=float, default=300, help="per launch")
    p.add_argument("--steady", type=float, default=0.03,
                   help="a spread at most this is steady (the pipeline's unstable threshold)")
    p.add_argument("--work", type=Path, help="records and logs (default: a new temp folder)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, launch nothing")
    p.add_argument("--out", type=Path, help="write everything as JSON")
    args = p.parse_args(argv)
    args.variant_list = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variant_list if v not in VARIANTS]
    if unknown or not args.variant_list:
        p.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    if args.launches < 1:
        p.error("--launches must be >= 1")
    return args


def launch_rounds(args: argparse.Namespace, launches: dict[str, Any], work: Path,
                  started: float) -> dict[str, list[dict[str, Any]]]:
    """The variants' launches, round by round, within the time budget."""
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variant_list}
    longest = 0.0
    for i in range(args.launches):
        elapsed = time.monotonic() - started
        if i and elapsed + longest > args.budget_s:
            print(f"stopping after {i} round(s): another would end past --budget-s "
                  f"{args.budget_s:.0f}", flush=True)
            break
        round_start = time.monotonic()
        for variant in args.variant_list:
            out = work / "records" / f"{variant}.{i}.json"
            log = work / "logs" / f"{variant}.{i}.log"
            result = run_launch(launches[variant](out), out, log, args.timeout_s)
            results[variant].append(result)
            print(f"[{time.monotonic() - started:5.0f} s] round {i + 1}/{args.launches} "
                  f"{describe(variant, i, result)}", flush=True)
        longest = max(longest, time.monotonic() - round_start)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [EXEC_BOUND]:  # the `bind` variant's prefix of each rank's command
        exec_bound(argv[2:] if argv[1:2] == ["--"] else argv[1:])
    args = parse(argv)
    started = time.monotonic()
    work = (args.work or Path(tempfile.mkdtemp(prefix="distributed-spread-"))).resolve()
    for sub in ("records", "logs"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    run, params = find_run(args.config, args)
    workdir = work / "snakemake"
    shell = snakemake_timing_command(args.config.resolve(), run, workdir)
    timing = TimingCommand.parse(shell)
    print(f"run {run} of {args.config}; its timing command:\n  {shell}", flush=True)

    def launcher(variant: str) -> Any:
        return lambda out: make_launch(variant, timing, params, out, args, workdir)

    launches = {v: launcher(v) for v in args.variant_list}
    commands = {}
    for variant in args.variant_list:
        example = launches[variant](work / "records" / f"{variant}.0.json")
        extra_env = {k: v for k, v in example.env.items()
                     if timing.env.get(k) != v and k != "PYTHONPATH"}
        commands[variant] = {"env": example.env, "argv": example.argv, "busy": example.busy}
        print(f"{variant}: {VARIANTS[variant]}\n  "
              + " ".join(f"{k}={v}" for k, v in extra_env.items())
              + (" " if extra_env else "") + shlex.join(example.argv)
              + (f"  (+{example.busy} busy processes)" if example.busy else ""), flush=True)
    result: dict[str, Any] = {"run": run, "params": params, "timing_command": shell,
                              "commands": commands, "work": str(work)}
    if not args.dry_run:
        result["machine"] = machine()
        brief = {k: v for k, v in result["machine"].items() if k != "nvidia_smi_topo"}
        print(f"machine: {json.dumps(brief)}\n{result['machine'].get('nvidia_smi_topo', '')}",
              flush=True)
        launched = launch_rounds(args, launches, work, started)
        summaries = {v: summarize(r) for v, r in launched.items() if r}
        print(format_summary(summaries), flush=True)
        for line in reading(summaries, args.steady):
            print(line, flush=True)
        result.update(launches=launched, summary=summaries)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
