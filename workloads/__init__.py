"""profbench workloads: PyTorch attention and GPT benchmarks annotated with NVTX ranges.

Run ``python -m workloads --help``; the capture contract with nsys is in docs/workloads.md.
"""
