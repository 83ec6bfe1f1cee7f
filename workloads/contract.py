"""What the pipeline's guard and fork server agree on with a workload process.

Standard library only: the guard (``python -m pipeline.guard``) imports it without torch.
"""

from __future__ import annotations

import json

# Exit codes of `python -m workloads` (2 stays argparse's usage error).
EXIT_CODES = {"ok": 0, "error": 1, "oom": 3, "unsupported": 4}

# Set to "fork" in a fork server's children; a record's `process.launcher` reads it.
LAUNCHER_ENV = "PROFBENCH_LAUNCHER"

# Functions Inductor calls once per process to key its caches (hashes of the installed torch
# and Triton sources): a fork server computes them after preloading, and a record says which
# it found computed.
INSTALL_KEYS = ("torch._inductor.codecache.torch_key", "torch._inductor.codecache.triton_key",
                "triton.runtime.cache.triton_key")

# Options added after results were published, at their defaults: left out of the config hash,
# and no change where an older record lacks them (`analysis diff`). compile_blocks "each" is
# how every compiled run before it compiled; uncompiled runs ignore it.
NEW_DEFAULTS = {(k, json.dumps(v)) for k, v in (
    ("op_ranges", "off"), ("cuda_graph", "off"), ("compile_blocks", "each"), ("comm", "on"),
    ("straggle_ms", 0.0), ("straggle_rank", 0), ("checkpoint", "none"), ("float8", "none"))}
