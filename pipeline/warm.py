"""The warm parent (docs/timing.md, "How a process starts"): an interpreter that has imported
torch, Dynamo, Inductor, Triton and the workloads, without touching CUDA, and forks a fresh
workload process per request. One per timing slot and GPU, exiting with its owner (the
Snakemake process in NAME); a guard starts it (`spawn`: python -m pipeline.warm NAME SLOT
MODULES, comma-separated, none for PRELOAD) and reaches it over multiprocessing.connection.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from contextlib import suppress
from multiprocessing import connection, reduction
from pathlib import Path
from typing import Any

from workloads.contract import INSTALL_KEYS, LAUNCHER_ENV
from workloads.proctree import alive

# What a workload process imports beyond `import torch` (-X importtime on a GPT train step, an
# attention cell and a compiled run on torch 2.11); none touches CUDA. Optional ones last.
PRELOAD = tuple("""torch numpy torch._dynamo torch._inductor.compile_fx
    torch._dynamo.repro.after_dynamo torch._inductor.codegen.cpp torch._inductor.codegen.triton
    torch._inductor.runtime.triton_heuristics triton workloads.__main__
    torch._dynamo.backends.inductor torch._dynamo.backends.cudagraphs torch.export._trace
    torch.distributed.tensor.experimental torch._inductor.codegen.cuda_combined_scheduling
    torch._inductor.codegen.wrapper_fxir torch._inductor.codegen.memory_planning
    torch._inductor.compiler_bisector torch._inductor.hooks torch._subclasses.schema_check_mode
    torch.fx.experimental.validator torch._higher_order_ops.passes.inline_invoke_subgraph
    torch._functorch._aot_autograd.subclass_codegen triton.tools.tensor_descriptor
    triton.compiler.code_generator""".split())
REQUIRED = frozenset({"torch", "torch._dynamo", "workloads.__main__"})
# Read while those modules are imported: a job whose values differ gets a process.
IMPORT_TIME_ENV = re.compile(
    r"^(PYTHON|OMP_|KMP_|GOMP_|MKL_|OPENBLAS_|GOTO_|VECLIB_|NUMEXPR_|CUDA_|CUBLAS|CUDNN"
    r"|NCCL_|NVIDIA_|NVTX|PYTORCH|TORCH|TRITON|LD_|LC_|MALLOC_|XDG_|LANG$|LANGUAGE$|HOME$)")
# RLIMIT_AS would count the parent's preloaded address space: such runs get a process.
PROCESS_ONLY_OPTIONS = ("--memory_limit_mb", "--memory-limit-mb")
TORCH_FIXED_DEFAULT_SEED = 67280421310721  # c10's default_rng_seed_val
CONNECT_S = 15.0  # for a parent just started to listen
# GPU p's parent of repeat index r is slot `r + SLOTS_PER_GPU * p`: a parent's environment,
# CUDA_VISIBLE_DEVICES included, is that of its GPU.
SLOTS_PER_GPU = 100
# Set by rules/common.smk for an invocation's jobs: the parents' name and log folder; a
# shorter preload list (tests).
ENV_NAME, ENV_LOGS = "PROFBENCH_FORKSERVER", "PROFBENCH_FORKSERVER_LOGS"
ENV_PRELOAD = "PROFBENCH_FORKSERVER_PRELOAD"


class Unavailable(Exception):
    """No warm parent can run this command, and why: the guard starts a process."""


def new_name(owner: int) -> str:
    """A name for the parents of one invocation; they live as long as process `owner`."""
    return f"profbench-{owner}-{os.urandom(4).hex()}"


def address(name: str, slot: int) -> str:
    return f"\0{name}.s{slot}"  # abstract: no file to clean up


def workload_argv(cmd: list[str]) -> list[str]:
    """The arguments of a `<this interpreter> -m workloads ARGS` command; Unavailable else."""
    if cmd[1:3] != ["-m", "workloads"]:
        raise Unavailable("the command is not `python -m workloads ...`")
    found = shutil.which(cmd[0])
    if found is None or os.path.abspath(found) != sys.executable:
        raise Unavailable(f"{cmd[0]} is not the guard's interpreter ({sys.executable})")
    limited = [a for a in cmd[3:] if a.split("=", 1)[0] in PROCESS_ONLY_OPTIONS]
    if limited:
        raise Unavailable(f"{limited[0]} caps the address space of a process of its own")
    return cmd[3:]


class Child:
    """A forked workload process, waited for like a Popen (returncode < 0: its signal)."""

    def __init__(self, pid: int, conn: connection.Connection) -> None:
        self.pid, self.conn, self.returncode, self.lost = pid, conn, None, None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self.conn.poll(timeout):
                raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout or 0)
            try:
                self.returncode = os.waitstatus_to_exitcode(self.conn.recv()["status"])
            except (EOFError, OSError, KeyError, TypeError):  # the parent died: stop the child
                self.lost = "the warm parent went away while the run was in progress; stopped"
                with suppress(OSError):
                    os.killpg(self.pid, signal.SIGKILL)
                while alive(self.pid):
                    time.sleep(0.01)
                self.returncode = 1
            self.conn.close()
        return self.returncode


def _start(env: dict[str, str], slot: int) -> subprocess.Popen[bytes]:
    """`slot`'s parent for the parents named in `env`, logging beside the job logs."""
    cmd = [sys.executable, "-m", "pipeline.warm", env[ENV_NAME], str(slot),
           env.get(ENV_PRELOAD, "")]
    log = Path(env[ENV_LOGS]) / f"forkserver.s{slot}.log" if ENV_LOGS in env else Path(os.devnull)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:  # a session of its own: it outlives this job
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)


def _connect(env: dict[str, str], slot: int, deadline: float) -> connection.Connection:
    """A connection to `slot`'s parent, started if none listens."""
    limit, started = min(deadline, time.monotonic() + CONNECT_S), None
    while True:
        try:
            return connection.Client(address(env[ENV_NAME], slot), family="AF_UNIX")
        except ConnectionRefusedError:
            started = started or _start(env, slot)
            if started.poll() is not None or time.monotonic() > limit:
                raise Unavailable(f"fork server {slot} did not listen (see its log)") from None
            time.sleep(0.02)


def spawn(env: dict[str, str], slot: int, argv: list[str], deadline: float
          ) -> tuple[Child, Any, Any]:
    """`python -m workloads ARGV` in `env`, forked by `slot`'s parent of those `env` names: the
    child, its stdout, stderr. (Should the guard die meanwhile, its connection ends: the
    parent kills the child.)"""
    conn = _connect(env, slot, deadline)
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    try:  # sent at once: a parent still preloading reads it when ready
        conn.send({"argv": argv, "env": env, "cwd": os.getcwd()})
        for fd in (out_w, err_w):
            reduction.send_handle(conn, fd, 0)  # (the pid is for Windows)
        reply = conn.recv() if conn.poll(max(0.0, deadline - time.monotonic())) else {
            "failed": "was not ready in time"}
    except (EOFError, OSError):
        reply = {"failed": "closed the connection before forking"}
    finally:
        os.close(out_w)
        os.close(err_w)
    if "pid" not in reply:
        conn.close()
        os.close(out_r)
        os.close(err_r)
        why = reply.get("failed") or f"refused: {reply['refuse']}"
        raise Unavailable(f"fork server {slot} {why}")
    return Child(reply["pid"], conn), os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb")


def asked_in_a_child(question: Any) -> bool | None:
    """`question()` asked in a forked child (what it starts dies with it); None if it failed."""
    pid = os.fork()
    if pid == 0:
        code = 1
        with suppress(BaseException):
            code = 0 if question() else 2
        os._exit(code)
    return {0: True, 2: False}.get(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))


def preload(modules: tuple[str, ...]) -> dict[str, float | str]:
    """Import `modules`: seconds each, or why not. Inductor asks torch.cuda.is_available() at
    import, which would start NVML's (or the driver's) thread here: while preloading, a forked
    child answers it. (A failed required import ends the parent's service: no restore.)"""
    times: dict[str, float | str] = {}
    real = None
    for module in modules:
        start = time.perf_counter()
        try:
            importlib.import_module(module)
        except Exception as e:
            if module in REQUIRED:
                raise
            times[module] = f"not preloaded: {type(e).__name__}: {e}"
            continue
        times[module] = round(time.perf_counter() - start, 3)
        if module == "torch":
            cuda = sys.modules["torch"].cuda
            real, answer = cuda.is_available, asked_in_a_child(cuda.is_available)
            if answer is not None:
                cuda.is_available = lambda answer=answer: answer
    if real is not None:
        sys.modules["torch"].cuda.is_available = real
    for key in INSTALL_KEYS:  # constants of the install: computed once, inherited by children
        module, attr = key.rsplit(".", 1)
        with suppress(Exception):
            getattr(sys.modules[module], attr)()
            times[key] = "computed"
    return times


def unforkable() -> str | None:
    """Why a fork of this interpreter would not be a clean new process, or None."""
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
        return "CUDA was initialized while preloading"
    tasks = os.listdir("/proc/self/task")
    if len(tasks) != 1:
        names = ", ".join(t.name for t in threading.enumerate())
        return f"{len(tasks)} threads after preloading (a fork copies one); Python's: {names}"
    return None


def serve(name: str, slot: int, modules: tuple[str, ...]) -> None:
    """Preload, then serve one request at a time while the owner lives."""
    owner = int(name.split("-")[1])
    owner_gone = os.pidfd_open(owner)  # readable once the owner has exited
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address(name, slot))  # before preloading: guards wait in the backlog
    listener.listen(64)
    start = time.perf_counter()
    try:
        times, refusal = preload(modules), unforkable()
    except Exception as e:  # a broken preload refuses: the guards start processes
        traceback.print_exc()
        times, refusal = {}, f"preload failed: {type(e).__name__}: {e}"
    log(f"slot {slot}: preloaded in {time.perf_counter() - start:.2f} s: {json.dumps(times)}")
    if refusal:
        log(f"slot {slot}: refusing every request: {refusal}")
    env, cwd = dict(os.environ), os.getcwd()
    while owner_gone not in connection.wait([listener, owner_gone]):
        sock, _ = listener.accept()
        peer = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", peer)[1] != os.getuid():  # an abstract socket has no modes
            sock.close()
            continue
        with suppress(EOFError, OSError, KeyError, TypeError), \
                connection.Connection(sock.detach()) as conn:
            request = conn.recv()
            fds = [reduction.recv_handle(conn) for _ in range(2)]
            if (why := refusal or _mismatch(env, cwd, request)) or conn.poll(0):
                for fd in fds:  # (readable: its guard stopped waiting, the connection ended)
                    os.close(fd)
                conn.send({"refuse": why})
                continue
            conn.send({"status": _fork_and_reap(conn, listener, fds, request, slot)})
    log(f"slot {slot}: owner {owner} is gone; exiting")


def _mismatch(env: dict[str, str], cwd: str, request: dict[str, Any]) -> str | None:
    """Why a fork would not start as the job would: its import-time environment or folder."""
    differ = sorted(k for k in {*env, *request["env"]} if IMPORT_TIME_ENV.match(k)
                    and env.get(k) != request["env"].get(k))
    if differ:
        return f"the job's environment differs from the server's in {', '.join(differ)}"
    where = request["cwd"]
    return None if where == cwd else f"the job runs in {where}, the server in {cwd}"


def _fork_and_reap(conn: connection.Connection, listener: socket.socket, fds: list[int],
                   request: dict[str, Any], slot: int) -> int:
    """The child's wait status; its group is killed if the guard's connection ends first."""
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        listener.close()
        _become_the_workload(conn, fds, request)  # never returns
    for fd in fds:
        os.close(fd)
    log(f"slot {slot}: child {pid}: {' '.join(request['argv'])[:300]}")
    pidfd = os.pidfd_open(pid)
    try:
        if conn in connection.wait([conn, pidfd]) and not connection.wait([pidfd], 0):
            log(f"slot {slot}: the guard of child {pid} went away; killing it")
            with suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        status = os.waitpid(pid, 0)[1]
    finally:
        os.close(pidfd)
    log(f"slot {slot}: child {pid} ended: exit {os.waitstatus_to_exitcode(status)}")
    return status


def _become_the_workload(conn: connection.Connection, fds: list[int],
                         request: dict[str, Any]) -> None:
    """A fresh process for the job (docs/timing.md); it ends as an interpreter does."""
    code = 1
    try:
        os.setsid()
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for target, fd in enumerate(fds, start=1):
            os.dup2(fd, target)
            os.close(fd)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"], **{LAUNCHER_ENV: "fork"})
        _reseed()
        conn.send({"pid": os.getpid()})  # its group exists now: the guard may signal it
        conn.close()
        main = importlib.import_module("workloads.__main__")
        sys.argv = [main.__file__, *request["argv"]]
        code = int(main.main(request["argv"]) or 0)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (e.code is not None)
    except BaseException as e:
        traceback.print_exc()
        code = 130 if isinstance(e, KeyboardInterrupt) else 1
    with suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # as an interpreter's exit does
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code & 0xFF)


def _reseed() -> None:
    """The generators a fresh interpreter seeds from the OS get fresh seeds; torch's starts
    where a fresh process's would (from the OS, or this torch's fixed seed)."""
    import torch

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if torch.initial_seed() != TORCH_FIXED_DEFAULT_SEED:
        torch.default_generator.seed()


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} forkserver[{os.getpid()}] {message}", flush=True)


def main(argv: list[str]) -> int:
    name, slot, modules = argv  # as _start gives them
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve(name, int(slot), tuple(filter(None, modules.split(","))) or PRELOAD)
    except OSError as e:  # another guard's parent won the race for this slot
        log(f"slot {slot}: not serving: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
