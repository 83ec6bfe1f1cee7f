"""The operator table: which PyTorch op costs what on the GPU and on the CPU, per step.

Input: the op capture of a run (``results/<run>/ops.sqlite``), whose measured steps ran with
PyTorch's op ranges (``--op_ranges on|shapes``, ``workloads/op_ranges.py``): one NVTX push/pop
range per op, named ``<op>[, seq = N], op_id = M[, sizes = [...]][, input_op_ids = [...]]``.

Rules (the ones torch.profiler's ``key_averages()`` uses, so the two agree; see
docs/analysis.md "Operator table" for the H100 comparison):

* **op name**: the range name without emit_nvtx's ``seq`` / ``op_id`` / ``sizes`` /
  ``input_op_ids`` suffixes (``aten::mm``); ``sizes`` is the ``Input Shapes`` of
  ``ops_by_shape.csv``.
* **self GPU time** (torch.profiler's "self CUDA time"): a GPU op (kernel, memcpy, memset)
  belongs to the INNERMOST op range open on the thread of its launch call when that call
  starts. Backward ops run on autograd's thread and launch their kernels there, so the
  launching thread is the right one; a GPU op launched inside no op range goes to the row
  ``(outside op ranges)``. **total GPU time**: the GPU ops of the op or of any op nested in it
  (each counted once per op name).
* **calls**: op ranges, except a range directly inside a range of the same op with the same
  autograd ``seq`` (or none): the op re-entering the dispatcher is one call, as
  torch.profiler counts it.
* **self CPU time**: the range's duration minus its direct child op ranges'; **total CPU
  time**: its duration (a range nested in a range of the same op is not counted again).
* **the steps**: only what lies in a ``profiled_step`` range counts: an op range by its
  start, a GPU op by its launch, on ANY thread of the process
  (``analysis/metrics/phases.py``'s cross-thread rule: autograd's thread has no step range).
  ``GPU Share of Step`` divides by the GPU time of every GPU op launched in the steps.

Compiled code runs few ops (Inductor launches its kernels itself): its kernels come from the
kernel map of the compiled-attribution work, as :class:`CompiledOpTime` rows
(:func:`compiled_op_rows`, :func:`merge_op_rows`), under their source ATen ops.
"""

from __future__ import annotations

import csv
import os
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from analysis.metrics.phases import _inside, _union
from analysis.reading.columns import EventArrays
from analysis.reading.export import NULL, Export
from analysis.reports.nvtx import PID_MASK, match_runtime

STEP_RANGE = "profiled_step"
OUTSIDE = "(outside op ranges)"
# emit_nvtx's range name (torch/csrc/profiler/standalone/nvtx_observer.cpp, getNvtxStr)
OP_NAME = re.compile(
    r"^(?P<op>.+?)(?:, seq = (?P<seq>-?\d+))?, op_id = \d+"
    r"(?:, sizes = (?P<sizes>\[.*?\]))?(?:, input_op_ids = .*)?$"
)
COLUMNS = [
    "Op", "Calls", "Calls/Step", "GPU Self (ns)", "GPU ms/step", "GPU Share of Step", "Kernels",
    "Kernels/Call", "GPU Total (ns)", "CPU Self (ns)", "CPU Self ms/step", "CPU Total (ns)",
    "CPU Total ms/step", "CPU Share of Step",
]  # fmt: skip
SHAPE_COLUMNS = [
    "Op", "Input Shapes", "Calls", "GPU Self (ns)", "GPU ms/step", "GPU Share of Step",
    "Kernels", "Kernels/Call", "CPU Self (ns)", "CPU Total (ns)",
]  # fmt: skip


@dataclass(frozen=True)
class OpName:
    """An op range's name, parsed."""

    op: str
    seq: int | None  # autograd sequence number (forward ops, backward nodes)
    sizes: str | None  # input shapes (record_shapes)


def parse_op_name(name: str | None) -> OpName | None:
    """The parts of an op range's name; None for any other range."""
    if not name:
        return None
    match = OP_NAME.match(name[1:] if name.startswith(":") else name)
    if match is None:
        return None
    seq = match.group("seq")
    return OpName(match.group("op"), None if seq is None else int(seq), match.group("sizes"))


# -- the op ranges and the GPU ops, as arrays -------------------------------------------------
@dataclass
class OpRanges(EventArrays):
    """The closed op ranges of the capture, sorted by (thread, start, -end)."""

    start: np.ndarray  # int64 ns
    end: np.ndarray
    tid: np.ndarray  # globalTid
    op: np.ndarray  # index into ``ops``
    shape: np.ndarray  # index into ``shapes`` (-1: none recorded)
    seq: np.ndarray  # autograd sequence number (-1: none)
    parent: np.ndarray  # enclosing op range on the same thread, -1 at top level
    ops: list[str]
    shapes: list[str]


@dataclass
class GpuOps:
    """Every kernel, memcpy and memset, with the start and thread of its launch call."""

    launch: np.ndarray  # int64 ns; -1 without a launch row
    tid: np.ndarray  # globalTid of the launching thread; -1 without a launch row
    gpu_ns: np.ndarray  # device duration


def op_ranges(ex: Export) -> OpRanges:
    """The op ranges of an export (empty when it has none)."""
    nv = ex.nvtx()
    empty = np.empty(0, np.int64)
    if nv is None:
        return OpRanges(empty, empty, empty, empty, empty, empty, empty, [], [])
    ops: list[str] = []
    shapes: list[str] = []
    op_index: dict[str, int] = {}
    shape_index: dict[str, int] = {}
    code_op = np.full(len(nv.names), -1, np.int64)
    code_shape = np.full(len(nv.names), -1, np.int64)
    code_seq = np.full(len(nv.names), -1, np.int64)
    for code, name in enumerate(nv.names):
        parsed = parse_op_name(name)
        if parsed is None:
            continue
        code_op[code] = op_index.setdefault(parsed.op, len(ops))
        if code_op[code] == len(ops):
            ops.append(parsed.op)
        if parsed.sizes is not None:
            code_shape[code] = shape_index.setdefault(parsed.sizes, len(shapes))
            if code_shape[code] == len(shapes):
                shapes.append(parsed.sizes)
        if parsed.seq is not None:
            code_seq[code] = parsed.seq
    op_code = code_op[nv.name_code]
    # push/pop ranges end on their own thread: endGlobalTid is NULL
    keep = (op_code >= 0) & (nv.end != NULL) & (nv.end >= nv.start) & (nv.end_global_tid == NULL)
    start, end, tid = nv.start[keep], nv.end[keep], nv.global_tid[keep]
    order = np.lexsort((-end, start, tid))
    start, end, tid = start[order], end[order], tid[order]
    return OpRanges(
        start=start, end=end, tid=tid, op=op_code[keep][order],
        shape=code_shape[nv.name_code][keep][order], seq=code_seq[nv.name_code][keep][order],
        parent=_parents(start, end, tid),
        ops=ops, shapes=shapes,
    )  # fmt: skip


def _parents(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Enclosing range of each range (sorted by thread, start, -end; nested per thread)."""
    parent = np.full(start.size, -1, np.int64)
    stack: list[int] = []
    current = None
    starts, ends, tids = start.tolist(), end.tolist(), tid.tolist()
    for i in range(len(starts)):
        if tids[i] != current:
            stack, current = [], tids[i]
        while stack and ends[stack[-1]] <= starts[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def gpu_ops(ex: Export) -> GpuOps:
    """Kernels, memcpys and memsets joined to the CUDA API call that launched them."""
    k, mc, ms = ex.kernels(), ex.memcpy(), ex.memset()
    corr = np.concatenate([k["correlationId"], mc["correlationId"], ms["correlationId"]])
    gpid = np.concatenate([k["globalPid"], mc["globalPid"], ms["globalPid"]])
    dur = np.concatenate([k["end"] - k["start"], mc["end"] - mc["start"],
                          ms["end"] - ms["start"]]).astype(np.int64)
    if corr.size == 0:
        e = np.empty(0, np.int64)
        return GpuOps(e, e, e)
    rt = ex.runtime()
    api = match_runtime(rt["correlationId"], rt["globalTid"], corr, gpid)
    found = api >= 0
    launch = np.full(corr.size, -1, np.int64)
    tid = np.full(corr.size, -1, np.int64)
    launch[found] = rt["start"][api[found]]
    tid[found] = rt["globalTid"][api[found]]
    return GpuOps(launch=launch, tid=tid, gpu_ns=dur)


def innermost(ranges: OpRanges, thread: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the innermost op range open on ``thread`` at time ``t`` (-1: none)."""
    owner = np.full(t.size, -1, np.int64)
    for tid in np.unique(thread[thread >= 0]).tolist():
        lo, hi = np.searchsorted(ranges.tid, tid, "left"), np.searchsorted(ranges.tid, tid, "right")
        if lo == hi:
            continue
        q = np.flatnonzero(thread == tid)
        # the last range starting at or before t, then up its parents until one is still open
        cur = np.searchsorted(ranges.start[lo:hi], t[q], "right") - 1 + lo
        cur[cur < lo] = -1
        while True:
            closed = (cur >= 0) & (ranges.end[np.maximum(cur, 0)] < t[q])
            if not closed.any():
                break
            cur[closed] = ranges.parent[cur[closed]]
        owner[q] = cur
    return owner


def in_steps(steps: tuple[np.ndarray, np.ndarray, np.ndarray], t: np.ndarray,
             tid: np.ndarray) -> np.ndarray:
    """Mask of times inside a step range of the same process (any thread): phases.py's
    cross-thread rule, with its own helpers."""
    s_start, s_end, s_pid = steps
    mask = np.zeros(t.size, bool)
    pid = tid & PID_MASK
    for p in np.unique(s_pid).tolist():
        s, e = _union(s_start[s_pid == p], s_end[s_pid == p])
        mine = np.flatnonzero((pid == p) & (t >= 0))
        mask[mine] = _inside(t[mine], s, e)
    return mask


def step_ranges(ex: Export) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, process) of the closed ``profiled_step`` ranges."""
    nv = ex.nvtx()
    if nv is None:
        e = np.empty(0, np.int64)
        return e, e, e
    codes = [i for i, n in enumerate(nv.names) if (n or "").lstrip(":") == STEP_RANGE]
    sel = np.isin(nv.name_code, codes) & (nv.end != NULL) & (nv.end >= nv.start)
    return nv.start[sel], nv.end[sel], nv.global_tid[sel] & PID_MASK


# -- the table --------------------------------------------------------------------------------
@dataclass
class OpTable:
    """Per op (and per op and input shapes): the rows of ops.csv / ops_by_shape.csv."""

    rows: list[dict[str, object]]
    shape_rows: list[dict[str, object]]
    steps: int
    step_gpu_ns: int
    step_cpu_ns: int
    outside_gpu_ns: int


def op_table(ex: Export) -> OpTable:
    """The operator table of an op capture (see the module docstring for the rules)."""
    ranges = op_ranges(ex)
    gpu = gpu_ops(ex)
    steps = step_ranges(ex)
    n_steps = int(steps[0].size)
    step_cpu_ns = int((steps[1] - steps[0]).sum())
    r_in = in_steps(steps, ranges.start, ranges.tid)
    g_in = in_steps(steps, gpu.launch, gpu.tid)
    owner = innermost(ranges, gpu.tid, gpu.launch)
    step_gpu_ns = int(gpu.gpu_ns[g_in].sum())
    n_ops = len(ranges.ops)

    def per_op(index: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(ranges.op[index], weights=weights, minlength=n_ops)

    mine = g_in & (owner >= 0)
    gpu_self = per_op(owner[mine], gpu.gpu_ns[mine])
    kernels = per_op(owner[mine])
    gpu_total = _gpu_total(ranges, owner[mine], gpu.gpu_ns[mine])
    dur = ranges.end - ranges.start
    child_ns = np.bincount(ranges.parent[ranges.parent >= 0],
                           weights=dur[ranges.parent >= 0], minlength=ranges.size)
    idx = np.flatnonzero(r_in)
    counted = idx[~_redispatch(ranges)[idx]]
    calls = per_op(counted)
    cpu_self = per_op(idx, (dur - child_ns)[idx])
    outermost = idx[~_has_same_op_ancestor(ranges)[idx]]
    cpu_total = per_op(outermost, dur[outermost])
    per_step = max(n_steps, 1)
    rows = []
    for i, op in enumerate(ranges.ops):
        if calls[i] == 0 and kernels[i] == 0:
            continue
        rows.append(_row(op, int(calls[i]), int(gpu_self[i]), int(kernels[i]), int(gpu_total[i]),
                         int(cpu_self[i]), int(cpu_total[i]), per_step, step_gpu_ns,
                         step_cpu_ns))
    outside = g_in & (owner < 0)
    outside_ns = int(gpu.gpu_ns[outside].sum())
    if outside.any():
        rows.append(_row(OUTSIDE, 0, outside_ns, int(outside.sum()), outside_ns, None, None,
                         per_step, step_gpu_ns, step_cpu_ns))
    rows.sort(key=_order)
    shape_rows = _shape_rows(ranges, owner[mine], gpu.gpu_ns[mine], idx, counted,
                             dur - child_ns, dur, per_step, step_gpu_ns)
    return OpTable(rows=rows, shape_rows=shape_rows, steps=n_steps, step_gpu_ns=step_gpu_ns,
                   step_cpu_ns=step_cpu_ns, outside_gpu_ns=outside_ns)


def _row(op: str, calls: int, gpu_self: int, kernels: int, gpu_total: int,
         cpu_self: int | None, cpu_total: int | None, per_step: int, step_gpu_ns: int,
         step_cpu_ns: int) -> dict[str, object]:
    return {
        "Op": op,
        "Calls": calls,
        "Calls/Step": calls / per_step,
        "GPU Self (ns)": gpu_self,
        "GPU ms/step": gpu_self / per_step / 1e6,
        "GPU Share of Step": gpu_self / step_gpu_ns if step_gpu_ns else None,
        "Kernels": kernels,
        "Kernels/Call": kernels / calls if calls else None,
        "GPU Total (ns)": gpu_total,
        "CPU Self (ns)": cpu_self,
        "CPU Self ms/step": None if cpu_self is None else cpu_self / per_step / 1e6,
        "CPU Total (ns)": cpu_total,
        "CPU Total ms/step": None if cpu_total is None else cpu_total / per_step / 1e6,
        "CPU Share of Step": (cpu_self / step_cpu_ns
                              if cpu_self is not None and step_cpu_ns else None),
    }


def _order(row: dict[str, object]) -> tuple:
    return (-int(row["GPU Self (ns)"]), -int(row["CPU Self (ns)"] or 0), str(row["Op"]))


def _ancestors(ranges: OpRanges) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """(range index, ancestor index) pairs, one generation at a time."""
    idx = np.arange(ranges.size)
    cur = ranges.parent.copy()
    while True:
        live = cur >= 0
        if not live.any():
            return
        idx, cur = idx[live], cur[live]
        yield idx, cur
        cur = ranges.parent[cur]


def _redispatch(ranges: OpRanges) -> np.ndarray:
    """Ranges directly inside a range of the same op and the same autograd sequence number
    (or none): the op re-entering the dispatcher (an overload redispatch), one call.

    On the H100 export this makes every op's call count equal torch.profiler's: aten::mul
    and aten::div (no seq) and aten::pow, rsqrt, softmax (same seq) collapse; aten::linear
    inside aten::linear under autocast (a new seq: autocast calls the op again) does not."""
    parent = np.maximum(ranges.parent, 0)
    same_op = (ranges.parent >= 0) & (ranges.op[parent] == ranges.op)
    new_seq = (ranges.seq >= 0) & (ranges.seq[parent] >= 0) & (ranges.seq != ranges.seq[parent])
    return same_op & ~new_seq


def _has_same_op_ancestor(ranges: OpRanges) -> np.ndarray:
    same = np.zeros(ranges.size, bool)
    for idx, anc in _ancestors(ranges):
        same[idx[ranges.op[anc] == ranges.op[idx]]] = True
    return same


def _gpu_total(ranges: OpRanges, owner: np.ndarray, gpu_ns: np.ndarray) -> np.ndarray:
    """Per op: GPU time of the GPU ops launched in it or in an op nested in it, each GPU op
    counted once per op name."""
    n_ops = len(ranges.ops)
    if owner.size == 0:
        return np.zeros(n_ops)
    ops_of = [ranges.op[owner]]
    gpu_of = [np.arange(owner.size)]
    cur = ranges.parent[owner]
    ident = np.arange(owner.size)
    while (cur >= 0).any():
        live = cur >= 0
        ident, cur = ident[live], cur[live]
        ops_of.append(ranges.op[cur])
        gpu_of.append(ident)
        cur = ranges.parent[cur]
    op_all, gpu_all = np.concatenate(ops_of), np.concatenate(gpu_of)
    pairs = np.unique(gpu_all * n_ops + op_all)
    return np.bincount(pairs % n_ops, weights=gpu_ns[pairs // n_ops], minlength=n_ops)


def _shape_rows(ranges: OpRanges, owner: np.ndarray, gpu_ns: np.ndarray, idx: np.ndarray,
                counted: np.ndarray, cpu_self: np.ndarray, dur: np.ndarray, per_step: int,
                step_gpu_ns: int) -> list[dict[str, object]]:
    """Per (op, input shapes), where the capture recorded shapes (CPU total: every range of
    the shape, as torch.profiler's group_by_input_shape)."""
    if not ranges.shapes:
        return []
    n_shapes = len(ranges.shapes) + 1  # + "none recorded"
    key = ranges.op * n_shapes + (ranges.shape + 1)
    size = len(ranges.ops) * n_shapes
    gpu = np.bincount(key[owner], weights=gpu_ns, minlength=size)
    kernels = np.bincount(key[owner], minlength=size)
    calls = np.bincount(key[counted], minlength=size)
    c_self = np.bincount(key[idx], weights=cpu_self[idx], minlength=size)
    c_total = np.bincount(key[idx], weights=dur[idx], minlength=size)
    rows = []
    for k in np.flatnonzero((calls > 0) | (kernels > 0)).tolist():
        op, shape = divmod(k, n_shapes)
        n = int(calls[k])
        rows.append({
            "Op": ranges.ops[op],
            "Input Shapes": ranges.shapes[shape - 1] if shape else "",
            "Calls": n,
            "GPU Self (ns)": int(gpu[k]),
            "GPU ms/step": gpu[k] / per_step / 1e6,
            "GPU Share of Step": gpu[k] / step_gpu_ns if step_gpu_ns else None,
            "Kernels": int(kernels[k]),
            "Kernels/Call": kernels[k] / n if n else None,
            "CPU Self (ns)": int(c_self[k]),
            "CPU Total (ns)": int(c_total[k]),
        })
    rows.sort(key=_order)
    return rows


# -- compiled code: rows from the kernel map --------------------------------------------------
@dataclass(frozen=True)
class CompiledOpTime:
    """Compiled kernels under one source-op label, over the measured steps.

    What the compiled-attribution work hands over per call site (or per label): ``op`` is
    ``aten::mm`` for an extern kernel, :func:`fused_label` of the Original ATen ops for an
    Inductor (Triton) kernel; ``gpu_ns`` the GPU time of its kernels in the measured steps;
    ``calls`` its launches there; ``kernels`` the GPU ops (kernels) they ran.
    """

    op: str
    gpu_ns: int
    calls: int
    kernels: int


def fused_label(aten_ops: Sequence[str]) -> str:
    """``aten::mm`` for one source op, ``fused(aten::add, aten::mul)`` for several (sorted,
    each once), so one fused kernel pattern is one row."""
    unique = sorted(set(aten_ops))
    if len(unique) == 1:
        return unique[0]
    return f"fused({', '.join(unique)})"


def compiled_op_rows(times: Iterable[CompiledOpTime], steps: int,
                     step_gpu_ns: int) -> list[dict[str, object]]:
    """ops.csv rows (same columns; CPU columns empty) for compiled kernels, one per label."""
    by_op: dict[str, list[int]] = {}
    for t in times:
        acc = by_op.setdefault(t.op, [0, 0, 0])
        acc[0] += t.gpu_ns
        acc[1] += t.calls
        acc[2] += t.kernels
    per_step = max(steps, 1)
    rows = [_row(op, calls, gpu, kernels, gpu, None, None, per_step, step_gpu_ns, 0)
            for op, (gpu, calls, kernels) in by_op.items()]
    rows.sort(key=_order)
    return rows


def merge_op_rows(*tables: list[dict[str, object]], steps: int,
                  step_gpu_ns: int) -> list[dict[str, object]]:
    """Rows of several sources (eager op ranges, compiled kernels) summed per op."""
    acc: dict[str, dict[str, int | None]] = {}
    fields = ("Calls", "GPU Self (ns)", "Kernels", "GPU Total (ns)", "CPU Self (ns)",
              "CPU Total (ns)")
    for table in tables:
        for row in table:
            into = acc.setdefault(str(row["Op"]), dict.fromkeys(fields))
            for f in fields:
                if row.get(f) is not None:
                    into[f] = (into[f] or 0) + int(row[f])  # type: ignore[arg-type]
    per_step = max(steps, 1)
    step_cpu_ns = 0  # a share of step CPU time needs the eager capture's steps: left empty
    rows = [_row(op, v["Calls"] or 0, v["GPU Self (ns)"] or 0, v["Kernels"] or 0,
                 v["GPU Total (ns)"] or 0, v["CPU Self (ns)"], v["CPU Total (ns)"], per_step,
                 step_gpu_ns, step_cpu_ns) for op, v in acc.items()]
    rows.sort(key=_order)
    return rows


# -- outputs ----------------------------------------------------------------------------------
def op_capture_overhead(ops_step_ms: Sequence[float],
                        lean_step_ms: Sequence[float]) -> dict[str, float | None]:
    """What the op ranges cost: the op capture's median traced step against the lean
    capture's (both traced, same run)."""
    ops = statistics.median(ops_step_ms) if ops_step_ms else None
    lean = statistics.median(lean_step_ms) if lean_step_ms else None
    return {
        "ops_step_ms_traced": ops,
        "ops_lean_step_ms_traced": lean,
        "ops_overhead": ops / lean - 1 if ops is not None and lean else None,
    }


def table_metrics(table: OpTable) -> dict[str, object]:
    """Flat numbers of the table for the run's metrics (summary.csv)."""
    ranked = [r for r in table.rows if r["Op"] != OUTSIDE]
    top = ranked[0] if ranked and int(ranked[0]["GPU Self (ns)"]) > 0 else None
    return {
        "ops_steps": table.steps,
        "ops_count": len(ranked),
        "ops_step_gpu_ms": table.step_gpu_ns / max(table.steps, 1) / 1e6,
        "ops_gpu_coverage": (1 - table.outside_gpu_ns / table.step_gpu_ns
                             if table.step_gpu_ns else None),
        "ops_top_op": top["Op"] if top else None,
        "ops_top_share": top["GPU Share of Step"] if top else None,
    }


def write_csv(rows: list[dict[str, object]], columns: list[str],
              path: str | os.PathLike[str]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _cell(row.get(c)) for c in columns})


def write_op_tables(ex: Export, out_dir: str | os.PathLike[str]) -> dict[str, object]:
    """``ops.csv`` and ``ops_by_shape.csv`` (header only without shapes) in ``out_dir``;
    returns :func:`table_metrics`."""
    table = op_table(ex)
    write_csv(table.rows, COLUMNS, os.path.join(out_dir, "ops.csv"))
    write_csv(table.shape_rows, SHAPE_COLUMNS, os.path.join(out_dir, "ops_by_shape.csv"))
    return table_metrics(table)


def _cell(v: object) -> object:
    if isinstance(v, float | np.floating):
        return f"{float(v):.6g}"
    return "" if v is None else v
