"""Where a line of model code sits: the ``with rng("<name>")`` blocks that enclose it.

The workloads name their NVTX ranges with ``with rng("attention_sublayer"):`` etc.
(workloads/nvtx_ranges.py).  Under torch.compile those ranges are no-ops, but Inductor's
stack traces still point at the source lines inside them.  This module parses the source
files with :mod:`ast` and maps a stack trace (outermost frame first) to the range names
that enclose its frames, outermost first: e.g. ``{layer}`` > ``attention_sublayer`` >
``rope encoding``.  A range whose name is not a string constant (the per-layer
``rng(name)`` of workloads/gpt.py) gives :data:`INDEXED`: its index is not in the trace.

A trace names files by the absolute path of the machine that compiled; they are found here
under the repository root by their longest existing path suffix (``workloads/gpt.py``),
else at that path.  A frame whose line no longer holds the traced code (the file changed
since) is looked up by its code text; a frame that cannot be placed adds nothing.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

RANGE_FUNCTIONS = ("rng",)  # context managers that push an NVTX range (workloads/nvtx_ranges)
INDEXED = "{layer}"  # a range whose name is computed at run time (one per layer)
REPO = Path(__file__).resolve().parents[2]
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ([^\n]+)\n(?:[ \t]+([^\n]*)\n?)?')


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    code: str


@dataclass(frozen=True)
class Region:
    """A ``with rng(name)`` block: its name and where it starts (its order in the file)."""

    name: str
    file: str
    line: int


@dataclass(frozen=True)
class _Range:
    name: str
    first: int  # first line of the with statement
    last: int  # last line of its body


@dataclass(frozen=True)
class SourceFile:
    lines: tuple[str, ...]
    ranges: tuple[_Range, ...]

    def ranges_around(self, line: int) -> list[_Range]:
        """The ranges enclosing ``line``, outermost first."""
        inside = [r for r in self.ranges if r.first <= line <= r.last]
        inside.sort(key=lambda r: (r.first, -r.last))
        return inside

    def locate(self, line: int, code: str) -> int | None:
        """``line`` if it holds ``code``; else the line with that code nearest to it."""
        want = code.strip()
        if not want:
            return line if 1 <= line <= len(self.lines) else None
        if 1 <= line <= len(self.lines) and self.lines[line - 1].strip() == want:
            return line
        hits = [i + 1 for i, text in enumerate(self.lines) if text.strip() == want]
        return min(hits, key=lambda i: abs(i - line)) if hits else None


def parse_frames(trace: str) -> list[Frame]:
    """The frames of one Python stack trace text, outermost first."""
    return [Frame(m.group(1), int(m.group(2)), m.group(3).strip(), (m.group(4) or "").strip())
            for m in _FRAME.finditer(trace)]


def trace_regions(trace: str, root: Path = REPO) -> tuple[Region, ...]:
    """The ranges enclosing the frames of ``trace``, outermost first (a range that
    encloses two frames, e.g. a generator expression inside it, counts once)."""
    regions: list[Region] = []
    for frame in parse_frames(trace):
        path = resolve(frame.file, root)
        source = source_file(path)
        if source is None:
            continue
        line = source.locate(frame.line, frame.code)
        if line is None:
            continue
        for r in source.ranges_around(line):
            region = Region(r.name, str(path), r.first)
            if region not in regions:
                regions.append(region)
    return tuple(regions)


def model_layers(size: str, root: Path = REPO,
                 model: str = "workloads/gpt.py") -> int | None:
    """``n_layers`` of a GPT size, read from ``SIZES`` in the model's source (the analysis
    does not import torch, which importing workloads.gpt would)."""
    try:
        tree = ast.parse((root / model).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1
            else None)
        if not (isinstance(target, ast.Name) and target.id == "SIZES"):
            continue
        if not isinstance(node.value, ast.Dict):
            return None
        for key, value in zip(node.value.keys, node.value.values, strict=True):
            if isinstance(key, ast.Constant) and key.value == size:
                return _int_field(value, "n_layers")
    return None


def _int_field(value: ast.expr, name: str) -> int | None:
    """``name`` of ``dict(name=N, ...)`` or ``{"name": N, ...}``."""
    pairs: list[tuple[object, ast.expr]] = []
    if isinstance(value, ast.Call):
        pairs = [(k.arg, k.value) for k in value.keywords]
    elif isinstance(value, ast.Dict):
        pairs = [(k.value if isinstance(k, ast.Constant) else None, v)
                 for k, v in zip(value.keys, value.values, strict=True)]
    for key, v in pairs:
        if key == name and isinstance(v, ast.Constant) and isinstance(v.value, int):
            return v.value
    return None


def resolve(traced_path: str, root: Path = REPO) -> Path | None:
    """The local file of a traced path: under ``root`` by path suffix, else the path."""
    parts = Path(traced_path).parts
    for k in range(len(parts) - 1, 0, -1):
        candidate = root.joinpath(*parts[-k:])
        if candidate.is_file():
            return candidate
    path = Path(traced_path)
    return path if path.is_file() else None


@cache
def source_file(path: Path | None) -> SourceFile | None:
    """A parsed source file with its ``with rng(...)`` ranges (None if unreadable)."""
    if path is None or path.suffix != ".py":
        return None
    try:
        text = path.read_text()
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return None
    ranges = [
        _Range(name, node.lineno, node.end_lineno or node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.With | ast.AsyncWith)
        for item in node.items
        if (name := _range_name(item.context_expr)) is not None
    ]
    return SourceFile(tuple(text.splitlines()), tuple(ranges))


def _range_name(expr: ast.expr) -> str | None:
    """The NVTX name of ``rng("<name>")`` (INDEXED if computed), else None."""
    if not isinstance(expr, ast.Call) or not expr.args:
        return None
    func = expr.func
    called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if called not in RANGE_FUNCTIONS:
        return None
    arg = expr.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return INDEXED


__all__ = ["INDEXED", "Frame", "Region", "SourceFile", "model_layers", "parse_frames", "resolve",
           "source_file", "trace_regions"]
