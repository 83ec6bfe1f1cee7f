"""Run outcomes: every run ends with one status, a message and an exit code."""

import torch

# Substrings of allocator failures that torch raises as plain RuntimeErrors (CPU allocator,
# errors re-raised by torch.compile).
_OOM_TEXT = (
    "can't allocate memory",
    "cannot allocate memory",
    "not enough memory",
    "out of memory",
)


class Unsupported(Exception):
    """This combination of settings cannot run here (e.g. flash attention in fp32)."""


def classify(err: BaseException) -> tuple[str, str]:
    """(status, message) of a failed run."""
    if isinstance(err, Unsupported):
        return "unsupported", str(err)
    text = str(err)
    if isinstance(err, torch.OutOfMemoryError | MemoryError) or any(
        t in text.lower() for t in _OOM_TEXT
    ):
        return "oom", text.strip() or type(err).__name__
    return "error", f"{type(err).__name__}: {text}".strip()
