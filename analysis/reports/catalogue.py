"""The 7 `nsys stats` reports profbench reproduces: their names and CSV columns.

Free of imports: the pipeline's Snakefile reads it (``from analysis.reports import
REPORTS``) without loading numpy.
"""

from __future__ import annotations

DUR_STATS = ["Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)", "StdDev (ns)"]

HEADERS: dict[str, list[str]] = {
    "cuda_gpu_kern_sum": ["Time (%)", "Total Time (ns)", "Instances", *DUR_STATS, "Name"],
    "nvtx_sum": ["Time (%)", "Total Time (ns)", "Instances", *DUR_STATS, "Style", "Range"],
    "nvtx_kern_sum": [
        "NVTX Range", "Style", "PID", "TID", "NVTX Inst", "Kern Inst", "Total Time (ns)",
        *DUR_STATS, "Kernel Name",
    ],
    "nvtx_gpu_proj_sum": [
        "Range", "Style", "Total Proj Time (ns)", "Total Range Time (ns)", "Range Instances",
        "Proj Avg (ns)", "Proj Med (ns)", "Proj Min (ns)", "Proj Max (ns)",
        "Proj StdDev (ns)", "Total GPU Ops", "Avg GPU Ops", "Avg Range Lvl", "Avg Num Child",
    ],
    "cuda_api_sum": ["Time (%)", "Total Time (ns)", "Num Calls", *DUR_STATS, "Name"],
    "cuda_gpu_mem_time_sum": ["Time (%)", "Total Time (ns)", "Count", *DUR_STATS, "Operation"],
    "cuda_gpu_mem_size_sum": [
        "Total (MB)", "Count", "Avg (MB)", "Med (MB)", "Min (MB)", "Max (MB)", "StdDev (MB)",
        "Operation",
    ],
}  # fmt: skip

REPORTS: tuple[str, ...] = tuple(HEADERS)
