"""Every GPU operation of a capture with its launch: the rows the per-op metrics share.

One array per column, ops in the order kernels, memcpys, memsets (the order of
``Context.ops_projection``).  The launch is the CUDA API call with the same correlationId
in the same process: its start, its thread and whether it launched a CUDA graph (then all
the graph's ops share that call).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.reading.columns import EventArrays
from analysis.reading.export import Export
from analysis.reports.nsys_stats import Context
from analysis.reports.nvtx import PID_MASK

KERNEL, MEMCPY, MEMSET = 0, 1, 2
MEMCPY_NAME, MEMSET_NAME = "[CUDA memcpy]", "[CUDA memset]"


@dataclass
class GpuOps(EventArrays):
    start: np.ndarray
    end: np.ndarray
    corr: np.ndarray
    pid: np.ndarray  # process bits of globalPid
    kind: np.ndarray  # KERNEL / MEMCPY / MEMSET
    name_code: np.ndarray  # index into ``names``
    names: list[str]
    launch: np.ndarray  # start of the launching API call, -1 when none was found
    tid: np.ndarray  # globalTid of the launching call, -1 when none
    graph_launch: np.ndarray  # bool: launched by cudaGraphLaunch (a CUDA graph replay)

    @property
    def dur(self) -> np.ndarray:
        return (self.end - self.start).astype(np.int64)

    def name(self, i: int) -> str:
        return self.names[int(self.name_code[i])]


def gpu_ops(ex: Export, ctx: Context | None = None) -> GpuOps:
    """The capture's kernels, memcpys and memsets with their launch calls."""
    ctx = ctx or Context(ex)
    k, mc, ms = ex.kernels(), ex.memcpy(), ex.memset()
    codes, knames = ctx.kernel_names()
    names = [n or "" for n in knames]
    memcpy_code, memset_code = len(names), len(names) + 1
    names += [MEMCPY_NAME, MEMSET_NAME]
    nk, nc, ns = k["start"].size, mc["start"].size, ms["start"].size
    api = ctx.ops_projection().api_index
    rt = ex.runtime()
    found = api >= 0
    launch = np.full(api.size, -1, np.int64)
    tid = np.full(api.size, -1, np.int64)
    graph = np.zeros(api.size, bool)
    if found.any():
        launch[found] = rt["start"][api[found]]
        tid[found] = rt["globalTid"][api[found]]
        graph_ids = _graph_launch_name_ids(ex)
        graph[found] = np.isin(rt["nameId"][api[found]], graph_ids)
    return GpuOps(
        start=np.concatenate([k["start"], mc["start"], ms["start"]]).astype(np.int64),
        end=np.concatenate([k["end"], mc["end"], ms["end"]]).astype(np.int64),
        corr=np.concatenate([k["correlationId"], mc["correlationId"], ms["correlationId"]]),
        pid=np.concatenate([k["globalPid"], mc["globalPid"], ms["globalPid"]]) & PID_MASK,
        kind=np.concatenate([np.full(nk, KERNEL), np.full(nc, MEMCPY), np.full(ns, MEMSET)]),
        name_code=np.concatenate([codes if nk else np.empty(0, np.int64),
                                  np.full(nc, memcpy_code), np.full(ns, memset_code)]),
        names=names,
        launch=launch,
        tid=tid,
        graph_launch=graph,
    )


def _graph_launch_name_ids(ex: Export) -> np.ndarray:
    """StringIds of the CUDA API names that replay a graph (cudaGraphLaunch[_v10000], ...)."""
    ids = [i for i, s in ex.strings.items() if s and "GraphLaunch" in s]
    return np.array(ids, np.int64)
