"""A fork server for the untraced workload processes (rules time_run and calibrate).

A timing job used to spend ~8 s starting for ~0.1 s of GPU work: `import torch` (~4 s on the
H100 host), then `torch._dynamo` and Inductor, imported lazily by the optimizer and
torch.compile (docs/timing.md has the breakdown). A fork server is a long-lived interpreter
that has imported those modules once, WITHOUT touching CUDA, and forks one fresh child per
job. The child is a new process that creates everything a measurement depends on itself: its
CUDA context (after the fork), caching allocator, cuBLAS/cuDNN handles and autotune caches,
Dynamo/Inductor in-memory caches and RNG seeds.

    python -m pipeline.forkserver serve --name NAME --slot N [--owner PID] [--idle-s S]
    python -m pipeline.forkserver stop NAME SLOT...

One server per timing slot (= repeat index; calibrate uses slot 0): the repeats of one run come
from different servers, i.e. from different exec'd interpreters, so they share no exec-time
state either (address-space layout, str hash seed), exactly as separate processes did. Runs
of one slot share a server.

The guard (pipeline/guard.py) is the client: for `--fork-slot N` and a `<python> -m
workloads ARGS` command it asks server N (starting it when none listens) for a child, passes
the job's stdin and its own output pipes (SCM_RIGHTS), its environment and working folder,
and gets the child's pid (to signal its process group) and its wait status. When no server
can serve (none named, it refuses, it cannot start), the guard runs the command as a process.

The server lives while its owner (the Snakemake process that named it) lives, for at most
`--idle-s` without a request, or until asked to stop (Snakemake's onsuccess/onerror).

Protocol: newline-delimited JSON over an abstract-namespace Unix stream socket (no file to
clean up; the peer's uid is checked with SO_PEERCRED, since such a socket has no permissions).
  server -> client on accept: {"hello": {pid, python, slot}}, or {"refuse": why}
  client -> server: {"op": "spawn", argv, env, cwd} with 3 fds (stdin, stdout, stderr), or
                    {"op": "stop"}
  child  -> client: {"pid": N}, once it leads its own session (its group may be signalled)
  server -> client: {"status": W}, the raw wait status once the child is reaped; or
                    {"refuse": why} instead of a child

Standard library only at import: the guard imports this module.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import json
import os
import re
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workloads.contract import INSTALL_KEYS, LAUNCHER_ENV
from workloads.proctree import alive

# Environment the pipeline sets (rules/common.smk) for the guards of one invocation.
ENV_NAME = "PROFBENCH_FORKSERVER"  # the servers' name; server N listens on NAME.sN
ENV_OWNER = "PROFBENCH_FORKSERVER_OWNER"  # the Snakemake process the servers live for
ENV_LOGS = "PROFBENCH_FORKSERVER_LOGS"  # folder of the servers' logs
# Optional: the modules to preload, comma-separated, instead of PRELOAD (to try a shorter
# list on a machine where a preload makes the server refuse; see its log).
ENV_PRELOAD = "PROFBENCH_FORKSERVER_PRELOAD"

# What a workload process imports beyond `import torch`, measured with -X importtime on a GPT
# train build (torch.optim imports torch._dynamo), an attention cell and a compiled run
# (Inductor; Triton on a GPU). None of these touches CUDA (checked after preloading).
PRELOAD = (
    "torch",
    "numpy",
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "torch._dynamo.repro.after_dynamo",
    "torch._inductor.codegen.cpp",
    "torch._inductor.codegen.triton",
    "torch._inductor.runtime.triton_heuristics",
    "triton",
    "workloads.__main__",
    # What a compiled timing process imports beyond the modules above (torch 2.11 on an H100):
    # Dynamo's backends, export's tracer, more of Inductor, and DTensor's experimental
    # package, whose context-parallel module registers two custom ops at import (0.3-0.4 s of
    # every compiled process). Last, so that one of them that cannot be preloaded costs
    # nothing of the list before it.
    "torch._dynamo.backends.inductor",
    "torch._dynamo.backends.cudagraphs",
    "torch.export._trace",
    "torch.distributed.tensor.experimental",
    "torch._inductor.codegen.cuda_combined_scheduling",
    "torch._inductor.codegen.wrapper_fxir",
    "torch._inductor.codegen.memory_planning",
    "torch._inductor.compiler_bisector",
    "torch._inductor.hooks",
    "torch._subclasses.schema_check_mode",
    "torch.fx.experimental.validator",
    "torch._higher_order_ops.passes.inline_invoke_subgraph",
    "torch._functorch._aot_autograd.subclass_codegen",
    "triton.tools.tensor_descriptor",
    "triton.compiler.code_generator",
)
# INSTALL_KEYS (workloads/contract.py): constants of the installation, so the server computes
# them after preloading (when their module was preloaded) and every child inherits them.
# Preloads that may be missing (no Triton on a CPU-only torch): the child imports what it needs.
OPTIONAL = frozenset(PRELOAD) - {"torch", "torch._dynamo", "workloads.__main__"}
# Environment read while those modules are imported (threads, allocator, library paths,
# torch/Inductor/Triton config, locale): a job whose values differ gets a process instead.
IMPORT_TIME_ENV = re.compile(
    r"^(PYTHON|OMP_|KMP_|GOMP_|MKL_|OPENBLAS_|GOTO_|VECLIB_|NUMEXPR_|CUDA_|CUBLAS|CUDNN"
    r"|NCCL_|NVIDIA_|NVTX|PYTORCH|TORCH|TRITON|LD_|LC_|MALLOC_|XDG_"
    r"|LANG$|LANGUAGE$|HOME$)"
)
# Workload options a forked child cannot honour like a fresh process (RLIMIT_AS would count
# the server's preloaded address space): such runs get a process.
PROCESS_ONLY_OPTIONS = ("--memory_limit_mb", "--memory-limit-mb")
# torch's historical fixed seed of the default CPU generator (c10 default_rng_seed_val).
TORCH_FIXED_DEFAULT_SEED = 67280421310721

IDLE_S = 900.0  # a server with nothing to do for this long exits (the next job starts one)
START_S = 15.0  # how long a guard waits for a server it started to listen
OWNER_POLL_S = 1.0
MAX_MESSAGE = 1 << 20


class Unavailable(Exception):
    """The fork server cannot run this command; the reason says why (the guard then starts a
    process)."""


# --- messages --------------------------------------------------------------------------------


def address(name: str, slot: int) -> bytes:
    """The abstract socket address of server `slot` of `name`."""
    return b"\0" + f"{name}.s{slot}".encode()


def new_name(owner: int) -> str:
    """A fresh server name for one Snakemake invocation."""
    return f"profbench-forkserver-{owner}-{os.urandom(4).hex()}"


def send(sock: socket.socket, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(message).encode() + b"\n"
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


class Reader:
    """Newline-delimited JSON messages from a blocking socket, each within a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, b""

    def read(self, deadline: float | None) -> dict[str, Any] | None:
        """The next message; None at end of stream; TimeoutError past `deadline`."""
        while b"\n" not in self.buffer:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise
            except OSError:  # reset by a peer that died
                chunk = b""
            finally:
                self.sock.settimeout(None)
            if not chunk:
                return None
            self.buffer += chunk
            if len(self.buffer) > MAX_MESSAGE:
                raise ValueError("fork server message too long")
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the other end, as the kernel sees it from this pid namespace."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


# --- the client side (the guard) --------------------------------------------------------------


def workload_argv(cmd: list[str]) -> list[str]:
    """The workload's arguments of `cmd`, a `<this interpreter> -m workloads ARGS` command
    (the server imports the workloads with this interpreter); Unavailable otherwise."""
    if len(cmd) < 3 or cmd[1:3] != ["-m", "workloads"]:
        raise Unavailable("the command is not `python -m workloads ...`")
    found = shutil.which(cmd[0])
    if found is None or os.path.abspath(found) != sys.executable:
        raise Unavailable(f"{cmd[0]} is not the guard's interpreter ({sys.executable})")
    argv = cmd[3:]
    limited = [a for a in argv if a.split("=", 1)[0] in PROCESS_ONLY_OPTIONS]
    if limited:
        raise Unavailable(f"{limited[0]} caps the address space of a process of its own")
    return argv


@dataclass
class Child:
    """A workload process forked by the server, driven like a subprocess.Popen: `pid` leads
    its own session (signal its group with os.killpg), `wait` returns its exit code (negative:
    killed by that signal)."""

    pid: int
    sock: socket.socket
    reader: Reader
    returncode: int | None = None
    # Set when the server went away before reporting the exit status (the child was stopped).
    lost: str | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            message = self.reader.read(deadline)
        except TimeoutError:
            raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout) from None
        if message is None or "status" not in message:
            self._stop_orphan()
        else:
            self.returncode = os.waitstatus_to_exitcode(message["status"])
        self.sock.close()
        return self.returncode  # type: ignore[return-value]

    def _stop_orphan(self) -> None:
        """The server died: nobody can report the child's status; stop its group."""
        self.lost = "the fork server went away while the run was in progress; run stopped"
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while alive(self.pid):
            time.sleep(0.01)
        self.returncode = 1


def spawn(slot: int, argv: list[str], stdio: tuple[int, int, int], deadline: float,
          env: dict[str, str] | None = None) -> Child:
    """A child of server `slot` of this invocation (ENV_NAME) running `python -m workloads
    ARGV` with these stdin/stdout/stderr fds, `env` (default: this process's environment)
    and this process's working folder.
    Starts the server if none listens; waits until `deadline` (time.monotonic) for it to be
    ready. Raises Unavailable when it cannot."""
    name = os.environ.get(ENV_NAME)
    if not name:
        raise Unavailable(f"no fork server named ({ENV_NAME} is not set)")
    sock = _connect_or_start(name, slot, deadline)
    try:
        reader = Reader(sock)
        try:
            hello = reader.read(deadline)
        except TimeoutError:
            raise Unavailable(f"fork server {slot} was not ready in time") from None
        _check_hello(sock, hello)
        send(sock, {"op": "spawn", "argv": argv, "env": dict(os.environ if env is None else env),
                    "cwd": os.getcwd()},
             fds=stdio)
        try:
            reply = reader.read(deadline)
        except TimeoutError:
            raise Unavailable(f"fork server {slot} did not fork in time") from None
        if reply is None or "refuse" in reply:
            why = "it closed the connection" if reply is None else reply["refuse"]
            raise Unavailable(f"fork server {slot} refused: {why}")
        if "pid" not in reply:
            raise Unavailable(f"the forked child ended before starting: {reply}")
        return Child(int(reply["pid"]), sock, reader)
    except BaseException:
        sock.close()  # the server stops a child it already forked
        raise


def _check_hello(sock: socket.socket, hello: dict[str, Any] | None) -> None:
    if hello is None:
        raise Unavailable("fork server closed the connection before it was ready")
    if "refuse" in hello:
        raise Unavailable(f"fork server refuses: {hello['refuse']}")
    info = hello["hello"]
    pid, uid, _ = peer_credentials(sock)
    if uid != os.getuid():
        raise Unavailable(f"fork server runs as uid {uid}, not {os.getuid()}")
    if pid != info["pid"]:  # another pid namespace: its pids are not ours to signal
        raise Unavailable("fork server runs in another pid namespace")
    if info["python"] != sys.executable:
        raise Unavailable(f"fork server runs {info['python']}, not {sys.executable}")


def _connect(addr: bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(addr)
    except BaseException:
        sock.close()
        raise
    return sock


def _connect_or_start(name: str, slot: int, deadline: float) -> socket.socket:
    addr = address(name, slot)
    try:
        return _connect(addr)
    except ConnectionRefusedError:
        pass
    return _connect_when_listening(name, slot, _start_server(name, slot), deadline)


def _connect_when_listening(name: str, slot: int, server: subprocess.Popen[bytes],
                            deadline: float) -> socket.socket:
    """A connection to the server just started for `slot`, once it listens."""
    addr = address(name, slot)
    limit = min(deadline, time.monotonic() + START_S)
    while True:
        try:
            return _connect(addr)
        except ConnectionRefusedError:
            # It may have lost the race to another guard's server: connect once more first.
            if server.poll() is not None and _refused(addr):
                raise Unavailable(f"fork server {slot} exited with {server.returncode} "
                                  f"before listening (see its log)") from None
            if time.monotonic() > limit:
                raise Unavailable(f"fork server {slot} did not listen within {START_S:g} s"
                                  ) from None
            time.sleep(0.02)


def start_servers(slots: list[int], deadline: float) -> list[int]:
    """Start the servers of `slots` that do not run yet, all at once, and wait until each
    has preloaded: their preloads (seconds of CPU each) run side by side, before the job's
    first process, never beside a measurement. Returns the slots started. Best effort: a
    server that fails here is started again, or refused with its reason, by `spawn`."""
    name = os.environ.get(ENV_NAME)
    if not name:
        return []
    started = {slot: _start_server(name, slot) for slot in dict.fromkeys(slots)
               if _refused(address(name, slot))}
    for slot, server in started.items():
        try:
            with _connect_when_listening(name, slot, server, deadline) as sock:
                Reader(sock).read(deadline)  # its hello comes once it has preloaded
        except (Unavailable, OSError, TimeoutError):
            continue
    return list(started)


def _refused(addr: bytes) -> bool:
    try:
        _connect(addr).close()
    except ConnectionRefusedError:
        return True
    return False


def _start_server(name: str, slot: int) -> subprocess.Popen[bytes]:
    """The server of `slot`, started in this job's environment (host or image, env, cwd), in
    a session of its own: it outlives this job and serves the next ones."""
    cmd = [sys.executable, "-m", "pipeline.forkserver", "serve", "--name", name,
           "--slot", str(slot)]
    owner = os.environ.get(ENV_OWNER)
    if owner:
        cmd += ["--owner", owner]
    logs = os.environ.get(ENV_LOGS)
    log_path = Path(logs) / f"forkserver.s{slot}.log" if logs else Path(os.devnull)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, close_fds=True)


def stop(name: str, slots: list[int]) -> None:
    """Ask the servers of `name` to exit once their running children have ended."""
    for slot in slots:
        try:
            sock = _connect(address(name, slot))
        except OSError:
            continue  # none runs
        with sock:
            try:
                send(sock, {"op": "stop"})
            except OSError:
                pass


# --- the server -------------------------------------------------------------------------------


def preload_list() -> tuple[str, ...]:
    override = os.environ.get(ENV_PRELOAD)
    return tuple(m.strip() for m in override.split(",") if m.strip()) if override else PRELOAD


CUDA_CHECK = "torch.cuda.is_available (a child's answer)"  # its entry in the preload times


@contextlib.contextmanager
def cuda_check_answered_by_a_child() -> Iterator[Callable[[str], dict[str, float]]]:
    """While preloading: once torch is imported, ``torch.cuda.is_available()`` answered by a
    forked child that asks it the real way. Yields the hook to call after each import (it
    returns what to log).

    Inductor asks it at import (torch 2.11: ``runtime/benchmarking.py``, at module level).
    Asked in the server it starts NVML's thread (``PYTORCH_NVML_BASED_CUDA_CHECK=1``, the
    jobs' setting) or the CUDA driver's, and a server with a second thread cannot fork: every
    compiled job then imported Inductor and Triton itself (3-4 s on the H100). The child's
    answer is the one a job would get (same machine; a job whose import-time environment
    differs gets a process), and the real function is back before any job runs; only a
    module that kept a reference to the function itself keeps that answer."""
    replaced: list[Any] = []  # [torch.cuda, the real function] once replaced

    def after_import(module: str) -> dict[str, float]:
        if module != "torch" or replaced:
            return {}
        import torch

        start = time.perf_counter()
        real = torch.cuda.is_available
        answer = ask_in_a_child(real)
        if answer is not None:
            torch.cuda.is_available = lambda: answer
            replaced.extend((torch.cuda, real))
        return {CUDA_CHECK: round(time.perf_counter() - start, 3)}

    try:
        yield after_import
    finally:
        if replaced:
            replaced[0].is_available = replaced[1]


def exit_code_in_a_child(work: Callable[[], int], timeout_s: float) -> int | None:
    """Run ``work`` in a forked child, which exits with what it returns (1 if it raises);
    its exit code, or None when it did not end in time (then it is killed). Whatever the
    child starts (threads, a CUDA context) dies with it."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = work()
        except BaseException:  # noqa: BLE001 - reported through the exit code and the log
            with _suppress():
                traceback.print_exc()
        os._exit(code)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def ask_in_a_child(question: Callable[[], bool], timeout_s: float = 60.0) -> bool | None:
    """``question()`` asked in a forked child; None when the child could not answer (it
    failed, or not in time)."""
    code = exit_code_in_a_child(lambda: 0 if question() else 2, timeout_s)
    return {0: True, 2: False}.get(code) if code is not None else None


def preload() -> dict[str, float | str]:
    """Import the preload list, up to the first module whose import leaves a second thread
    (e.g. a library that initializes the CUDA driver, which starts its own thread: a fork
    would copy the server without it). That module is found first in a forked child, so this
    process never imports it; jobs import it and what follows it themselves. Seconds per
    module, or why one was not preloaded."""
    modules = preload_list()
    bad, why = known_threading_module(modules)
    times: dict[str, float | str] = {}
    clean = modules if bad is None else modules[:bad]
    with cuda_check_answered_by_a_child() as after_import:
        for module in clean:
            start = time.perf_counter()
            try:
                importlib.import_module(module)
            except Exception as e:  # noqa: BLE001 - optional modules may be absent or broken
                if module not in OPTIONAL:
                    raise
                times[module] = f"not preloaded: {type(e).__name__}: {e}"
                continue
            times[module] = round(time.perf_counter() - start, 3)
            times.update(after_import(module))
    for i in range(len(clean), len(modules)):
        times[modules[i]] = (f"not preloaded: importing {modules[bad]} leaves a thread ({why})"
                             if i == bad else f"not preloaded: after {modules[bad]}")
    times.update(compute_install_keys())
    return times


def compute_install_keys() -> dict[str, float | str]:
    """Call each of :data:`INSTALL_KEYS` whose module is imported (their values stay cached
    in this process, for its children); seconds per key, or why it was not computed."""
    times: dict[str, float | str] = {}
    for key in INSTALL_KEYS:
        module, name = key.rsplit(".", 1)
        compute = getattr(sys.modules.get(module), name, None)
        if not callable(compute):
            times[key] = f"not computed: {module} not preloaded or has no {name}"
            continue
        start = time.perf_counter()
        try:
            compute()
        except Exception as e:  # noqa: BLE001 - a job then computes it itself
            times[key] = f"not computed: {type(e).__name__}: {e}"
            continue
        times[key] = round(time.perf_counter() - start, 3)
    return times


# Where the servers of one invocation share what the first one found (their log folder).
PRELOAD_VERDICT = "forkserver-preload.json"


def known_threading_module(modules: tuple[str, ...]) -> tuple[int | None, str | None]:
    """:func:`first_threading_module`, found once per log folder: the first server of an
    invocation probes (one more import of the list, in a child), the others read its
    verdict, for the same interpreter, list and import-time environment."""
    folder = os.environ.get(ENV_LOGS)
    key = {"python": sys.executable, "modules": list(modules),
           "env": {k: v for k, v in sorted(os.environ.items()) if IMPORT_TIME_ENV.match(k)}}
    path = Path(folder) / PRELOAD_VERDICT if folder else None
    if path is not None:
        try:
            known = json.loads(path.read_text())
            if known.get("key") == key:
                return known.get("bad"), known.get("why")
        except (OSError, ValueError):
            pass
    bad, why = first_threading_module(modules)
    if path is not None:
        with contextlib.suppress(OSError):
            tmp = path.with_name(f"{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps({"key": key, "bad": bad, "why": why}))
            tmp.replace(path)
    return bad, why


def first_threading_module(modules: tuple[str, ...], timeout_s: float = 300.0
                           ) -> tuple[int | None, str | None]:
    """(index of the first module whose import leaves this process with more than one
    thread, what the threads are), found by importing them in order in a forked child (this
    process, which has imported none of them, stays clean); (None, None) when none does."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: import, check, report, never return
        os.close(read_end)
        report: dict[str, Any] = {"bad": None, "why": None}
        try:
            with cuda_check_answered_by_a_child() as after_import:  # as the server will
                for i, module in enumerate(modules):
                    try:
                        importlib.import_module(module)
                    except Exception:  # noqa: BLE001 - the real preload reports it
                        pass
                    after_import(module)
                    problem = threads_problem()
                    if problem:
                        report = {"bad": i, "why": problem}
                        break
            os.write(write_end, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + timeout_s
    with os.fdopen(read_end, "rb") as reader:
        while time.monotonic() < deadline:
            data = reader.read()
            if not data:
                break
            chunks.append(data)
    os.waitpid(pid, 0)
    try:
        report = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        report = {}
    return report.get("bad"), report.get("why")


def fork_safety_problem() -> str | None:
    """Why forking this interpreter would not give a clean child, or None: CUDA initialized
    (a child cannot use a driver initialized before the fork), threads (only the forking
    thread survives a fork). When the preloads loaded the CUDA driver or NVML library, a
    forked probe must be able to use them."""
    import torch

    if torch.cuda.is_initialized():
        return "CUDA was initialized while preloading"
    problem = threads_problem()
    if problem:
        return problem
    maps = Path("/proc/self/maps").read_text()
    loaded = [lib for lib in ("libcuda.so", "libnvidia-ml.so") if lib in maps]
    if loaded:
        problem = probe_forked_gpu()
        if problem:
            return f"preloading loaded {', '.join(loaded)} and a forked child {problem}"
    return None


def probe_forked_gpu(timeout_s: float = 120.0) -> str | None:
    """Fork a child that creates a CUDA context and reads NVML, as a workload will: None if
    it can, else what failed."""

    def use_the_gpu() -> int:
        import torch

        has_gpu = Path("/dev/nvidiactl").exists()
        if has_gpu or torch.cuda.is_available():
            assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
            assert torch.ones(1, device="cuda").add(1).item() == 2
        nvml = sys.modules.get("pynvml")
        if nvml is not None and has_gpu:
            nvml.nvmlInit()
            nvml.nvmlDeviceGetCount()
            nvml.nvmlShutdown()
        return 0

    code = exit_code_in_a_child(use_the_gpu, timeout_s)
    if code is None:
        return f"hung using the GPU (probe killed after {timeout_s:g} s)"
    return None if code == 0 else f"could not use the GPU (probe exit {code})"


def threads_problem() -> str | None:
    tasks = sorted(os.listdir("/proc/self/task"))
    if len(tasks) != 1:
        names = []
        for tid in tasks:
            try:
                names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())
            except OSError:
                names.append("?")
        python = [t.name for t in threading.enumerate()]
        return (f"{len(tasks)} threads in the server (a fork copies only one): "
                f"{', '.join(names)}; Python threads: {', '.join(python)}")
    return None


def env_problem(server_env: dict[str, str], job_env: dict[str, str]) -> str | None:
    """The import-time variables in which the job's environment differs from the server's."""
    keys = {k for k in (*server_env, *job_env) if IMPORT_TIME_ENV.match(k)}
    differ = sorted(k for k in keys if server_env.get(k) != job_env.get(k))
    if differ:
        return f"the job's environment differs from the server's in {', '.join(differ)}"
    return None


@dataclass
class Connection:
    sock: socket.socket
    data: bytes = b""
    fds: list[int] = field(default_factory=list)
    child: int | None = None  # the pid forked for it
    pidfd: int | None = None  # readable once the child has exited (None: polled instead)
    listening: bool = True  # registered with the selector
    status: int = 0


class Server:
    """One slot's server: preloads, then forks a child per request (single-threaded)."""

    def __init__(self, name: str, slot: int, owner: int | None, idle_s: float) -> None:
        self.slot, self.owner, self.idle_s = slot, owner, idle_s
        self.listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bound before preloading: guards connect at once and wait in the backlog.
        self.listener.bind(address(name, slot))
        self.listener.listen(128)
        self.env = dict(os.environ)
        self.selector = selectors.DefaultSelector()
        self.connections: dict[int, Connection] = {}
        self.refusal: str | None = None
        self.stopping = False
        self.last_active = time.monotonic()
        self.cwd = os.getcwd()
        self.torch_rng_state: Any = None
        self.torch_seed: int | None = None

    # -- lifecycle --

    def prepare(self) -> None:
        start = time.perf_counter()
        try:
            times = preload()
            self._note_torch_rng()
            self.refusal = fork_safety_problem()
        except Exception as e:  # noqa: BLE001 - a broken preload refuses; guards use processes
            self.refusal = f"preload failed: {type(e).__name__}: {e}"
            traceback.print_exc()
            times = {}
        log(f"slot {self.slot}: preloaded in {time.perf_counter() - start:.2f} s: "
            f"{json.dumps(times)}")
        if self.refusal:
            log(f"slot {self.slot}: refusing every request: {self.refusal}")

    def _note_torch_rng(self) -> None:
        import torch

        self.torch_rng_state = torch.default_generator.get_state()
        self.torch_seed = torch.initial_seed()

    def serve(self) -> None:
        assert self.listener is not None
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        while not self._done():
            polled = [c for c in self.connections.values() if c.child and c.pidfd is None]
            for key, _ in self.selector.select(timeout=0.02 if polled else OWNER_POLL_S):
                if key.data == "accept":
                    self._accept()
                elif key.data[0] == "conn":
                    self._readable(key.data[1])
                else:
                    self._child_exited(key.data[1])
            for conn in polled:  # no pidfd on this kernel: ask each running child
                if conn.child is not None:
                    pid, conn.status = os.waitpid(conn.child, os.WNOHANG)
                    if pid:
                        self._child_exited(conn, reaped=True)

    def _done(self) -> bool:
        if self.owner is not None and not alive(self.owner):
            log(f"slot {self.slot}: owner {self.owner} is gone; exiting")
            return True
        if self.connections:
            self.last_active = time.monotonic()
            return False
        if self.stopping:
            log(f"slot {self.slot}: stopped")
            return True
        if time.monotonic() - self.last_active > self.idle_s:
            log(f"slot {self.slot}: idle for {self.idle_s:g} s; exiting")
            return True
        return False

    def close(self) -> None:
        """Stop what still runs (an abnormal exit: its guards lose it anyway)."""
        for conn in list(self.connections.values()):
            if conn.child is not None:
                _kill_group(conn.child)
                with _suppress():
                    os.waitpid(conn.child, 0)
            self._drop(conn)
        if self.listener is not None:
            self.listener.close()

    # -- events --

    def _accept(self) -> None:
        assert self.listener is not None
        sock, _ = self.listener.accept()
        _, uid, _ = peer_credentials(sock)
        if uid != os.getuid():  # an abstract socket has no permissions: check who it is
            sock.close()
            return
        conn = Connection(sock)
        self.connections[sock.fileno()] = conn
        self.selector.register(sock, selectors.EVENT_READ, ("conn", conn))
        message = ({"refuse": self.refusal} if self.refusal else
                   {"hello": {"pid": os.getpid(), "python": sys.executable, "slot": self.slot}})
        with _suppress():
            send(sock, message)

    def _readable(self, conn: Connection) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(conn.sock, 65536, 3)
        except OSError:
            data, fds = b"", []
        conn.fds += fds
        if conn.child is not None:  # running: only the end of its guard is news
            if not data:
                log(f"slot {self.slot}: guard of child {conn.child} went away; killing it")
                _kill_group(conn.child)
                self.selector.unregister(conn.sock)
                conn.listening = False
            return
        if not data:
            self._drop(conn)
            return
        conn.data += data
        if b"\n" not in conn.data:
            return
        try:
            self._request(conn, json.loads(conn.data.split(b"\n", 1)[0]))
        except (ValueError, KeyError, TypeError, OSError) as e:  # a bad request, no fork
            log(f"slot {self.slot}: request failed: {type(e).__name__}: {e}")
            with _suppress():
                send(conn.sock, {"refuse": f"request failed: {type(e).__name__}: {e}"})
            if conn.child is None:
                self._drop(conn)

    def _request(self, conn: Connection, request: dict[str, Any]) -> None:
        if not isinstance(request, dict):
            raise TypeError("a request is a JSON object")
        if request.get("op") == "stop":
            self.stopping = True
            self._stop_listening()
            self._drop(conn)
            return
        problem = (self.refusal or env_problem(self.env, request["env"]) or threads_problem()
                   or (None if len(conn.fds) == 3 else "expected 3 file descriptors")
                   # `python -m` imports from the working folder: the server's must be the job's
                   or (None if request["cwd"] == self.cwd else
                       f"the job runs in {request['cwd']}, the server in {self.cwd}"))
        if problem:
            with _suppress():
                send(conn.sock, {"refuse": problem})
            self._drop(conn)
            return
        self._fork(conn, request)

    def _fork(self, conn: Connection, request: dict[str, Any]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._child(conn, request)  # never returns
        for fd in conn.fds:
            os.close(fd)
        conn.fds, conn.child = [], pid
        try:
            conn.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # Linux < 5.3: serve() polls the child instead
            conn.pidfd = None
        else:
            self.selector.register(conn.pidfd, selectors.EVENT_READ, ("exit", conn))
        log(f"slot {self.slot}: child {pid}: {' '.join(request['argv'])[:300]}")

    def _child_exited(self, conn: Connection, reaped: bool = False) -> None:
        assert conn.child is not None
        status = conn.status if reaped else os.waitpid(conn.child, 0)[1]
        log(f"slot {self.slot}: child {conn.child} ended: exit "
            f"{os.waitstatus_to_exitcode(status)}")
        with _suppress():
            send(conn.sock, {"status": status})
        conn.child = None
        self._drop(conn)

    def _drop(self, conn: Connection) -> None:
        for fd in conn.fds:
            with _suppress():
                os.close(fd)
        conn.fds = []
        if conn.listening:
            self.selector.unregister(conn.sock)
            conn.listening = False
        if conn.pidfd is not None:
            self.selector.unregister(conn.pidfd)
            os.close(conn.pidfd)
            conn.pidfd = None
        self.connections.pop(conn.sock.fileno(), None)
        conn.sock.close()

    def _stop_listening(self) -> None:
        if self.listener is not None:
            self.selector.unregister(self.listener)
            self.listener.close()
            self.listener = None

    # -- in the child --

    def _child(self, conn: Connection, request: dict[str, Any]) -> None:
        """Become the job's workload process; exits, never returns."""
        code, interrupted = 1, False
        try:
            os.setsid()
            self._close_server_fds(keep=conn)
            _attach_stdio(conn.fds)
            _restore_signals()
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            os.environ[LAUNCHER_ENV] = "fork"
            self._reseed()
            send(conn.sock, {"pid": os.getpid()})
            conn.sock.close()
            code, interrupted = run_workload(request["argv"])
        except BaseException:  # noqa: BLE001 - the child must end here, whatever happened
            with _suppress():
                traceback.print_exc()
        exit_like_python(code, interrupted)

    def _close_server_fds(self, keep: Connection) -> None:
        self.selector.close()
        if self.listener is not None:
            self.listener.close()
        for conn in self.connections.values():
            if conn is not keep:
                conn.sock.close()
                for fd in [*conn.fds, *([conn.pidfd] if conn.pidfd is not None else [])]:
                    os.close(fd)

    def _reseed(self) -> None:
        """The RNGs a fresh interpreter seeds from the OS get fresh seeds (a fork copies the
        server's): Python's `random` (also reseeded by CPython at fork), numpy's global
        generator, and torch's default CPU generator when this torch seeds it from the OS (a
        torch that starts it from a fixed seed gets the server's untouched starting state)."""
        import random

        random.seed()
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        import torch

        if self.torch_seed == TORCH_FIXED_DEFAULT_SEED:
            torch.default_generator.set_state(self.torch_rng_state)
        else:
            torch.default_generator.seed()


def _attach_stdio(fds: list[int]) -> None:
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)


def _restore_signals() -> None:
    """The dispositions a fresh interpreter starts with."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1,
                   signal.SIGUSR2, signal.SIGALRM):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def run_workload(argv: list[str]) -> tuple[int, bool]:
    """`python -m workloads ARGV` in this interpreter: (exit code, interrupted by SIGINT).
    The server preloaded the workloads unless a module before them could not be preloaded:
    then the child imports them (and what they need) now, as a fresh process would."""
    main_module = importlib.import_module("workloads.__main__")
    sys.argv = [main_module.__file__, *argv]
    try:
        return int(main_module.main(argv) or 0), False
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0, False
        print(e.code, file=sys.stderr)
        return 1, False
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130, True
    except BaseException:  # noqa: BLE001 - as the interpreter would: traceback, exit 1
        traceback.print_exc()
        return 1, False


def exit_like_python(code: int, interrupted: bool) -> None:
    """End as an interpreter does (join threads, atexit handlers, flush), without running
    the server's code on the way out."""
    with _suppress():
        shutdown_threads = getattr(threading, "_shutdown", None)
        if shutdown_threads is not None:
            shutdown_threads()
    with _suppress():
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with _suppress():
            stream.flush()
    if interrupted:  # as CPython does for an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _suppress:
    """Ignore an OSError (a peer that went away)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, OSError)


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} forkserver[{os.getpid()}] {message}", flush=True)


# --- command line -----------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    try:
        server = Server(args.name, args.slot, args.owner, args.idle_s)
    except OSError as e:  # another guard's server won the race for this slot
        log(f"slot {args.slot}: not serving: {e}")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(0))
    try:
        server.prepare()
        server.serve()
    except SystemExit:
        log(f"slot {args.slot}: terminated")
    finally:
        server.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.forkserver",
                                     description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="preload and serve one slot")
    serve.add_argument("--name", required=True)
    serve.add_argument("--slot", type=int, required=True)
    serve.add_argument("--owner", type=int, help="exit when this process is gone")
    serve.add_argument("--idle-s", type=float, default=IDLE_S)
    stop_cmd = sub.add_parser("stop", help="ask servers to exit")
    stop_cmd.add_argument("name")
    stop_cmd.add_argument("slots", type=int, nargs="+")
    args = parser.parse_args(argv)
    if args.command == "stop":
        stop(args.name, args.slots)
        return 0
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())
