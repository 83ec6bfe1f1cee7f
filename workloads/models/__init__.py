"""Workloads as modules: a module in this folder that defines ``Options`` and ``build`` is the
workload of its name (``workload: <module>`` in a config, ``python -m workloads <module>``).
Every workload is one: ``attention``, ``attention_core``, ``gpt``, ``sleep`` and ``model``.

* ``Options``: a dataclass of the workload's own settings. Its fields become the command
  line's flags and the run schema's properties (:func:`options_schema`, :func:`add_options`):
  ``int``, ``float``, ``bool``, ``str``, ``dict`` or a ``Literal`` of strings, each with a
  default unless required. ``field(metadata=...)`` adds ``help`` (the flag's help and the
  schema's description), ``minimum`` / ``exclusiveMinimum`` (checked by both), ``required``
  (a config must give it although the command line has a default) and ``fixed`` (no flag and
  no run key: a constant the record and the summary line show, e.g. sleep's one mode).
* ``build(options, run) -> workloads.steps.Workload``: the model, its fixed batch, its step
  and its FLOPs. ``run`` (:class:`RunSettings`) carries what every workload shares: dtype,
  device, seed and the speed settings (compile, CUDA graphs, optimizer, SDPA backend).
* ``needs(options) -> (host MB, minutes)``: optional, what a job of it reserves on a cluster
  (pipeline/resources.py; default 8000 MB, 10 minutes).
* ``kernels_per_step(options, dtype) -> int``: optional, an upper estimate of the kernels one
  step launches, for the disk check of its captures (pipeline/checks.py).
* ``check(options) -> (key, problem) | None``: optional, a problem found before any job
  starts, and the run key it is at.
* ``summary(options) -> str``: optional, how the summary line names a run (default: the
  workload's name).
* ``BATCH_SETS_MEMORY``: optional, False where the ``batch`` option changes nothing the step
  holds (sleep): ``batch: max`` is refused for such a workload (default True).

A workload module imports torch inside ``build``, not at its top: the pipeline reads every
``Options`` when it parses a config, and a torch import there would cost every Snakemake start.
Modules without them (the example models' factories) are not workloads and are not
imported here.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import json
import pkgutil
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

PACKAGE = __name__


@dataclass
class RunSettings:
    """What every workload's build gets besides its own options."""

    dtype: str
    device: Any  # torch.device
    seed: int
    speed: Any  # workloads.steps.Speed
    wrap: Callable[[Any], Any] | None = None  # DDP/FSDP wrapper (workloads/parallel.py)


@cache
def registry() -> dict[str, types.ModuleType]:
    """Workload name -> module, for every module of this folder that defines Options and
    build."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        # read before importing: the example models import torch (and more) at their top
        if _defines_workload(Path(__path__[0]) / f"{info.name}.py"):
            found[info.name] = importlib.import_module(f"{PACKAGE}.{info.name}")
    return found


def _defines_workload(path: Path) -> bool:
    if not path.is_file():
        return False
    names = {node.name for node in ast.parse(path.read_text()).body
             if isinstance(node, ast.ClassDef | ast.FunctionDef)}
    return {"Options", "build"} <= names


def options_of(workload: str, values: dict[str, Any]) -> Any:
    """The workload's Options from a mapping (e.g. argparse's namespace), unknown keys
    ignored."""
    cls = registry()[workload].Options
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def _json_type(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(hint))}
    if origin in (typing.Union, types.UnionType):  # X | None: X's schema
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _json_type(args[0])
    base = origin or hint
    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                       (dict, "object"), (list, "array")):
        if base is kind:
            return {"type": name}
    raise TypeError(f"unsupported option type {hint!r}")


# The bounds a field's metadata may set, by their JSON-schema names.
BOUNDS = ("minimum", "exclusiveMinimum")


def options_schema(cls: type) -> dict[str, Any]:
    """A JSON schema of the workload's options (its own keys; the run schema adds the
    shared ones)."""
    hints = typing.get_type_hints(cls)
    properties, required = {}, []
    for f in dataclasses.fields(cls):
        if f.metadata.get("fixed"):
            continue
        prop = _json_type(hints[f.name])
        for bound in BOUNDS:
            if f.metadata.get(bound) is not None:
                prop[bound] = f.metadata[bound]
        if f.metadata.get("help"):
            prop["description"] = f.metadata["help"]
        properties[f.name] = prop
        if f.metadata.get("required") or _has_no_default(f):
            required.append(f.name)
    return {"properties": properties, "required": required}


def _has_no_default(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def add_options(parser: argparse.ArgumentParser, cls: type,
                flag: Callable[..., None], parse_bool: Callable[[str], bool]) -> None:
    """One command-line flag per option (``flag`` adds both spellings of a name)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("fixed"):  # no flag: the record still has its value
            parser.set_defaults(**{f.name: f.default})
            continue
        schema = _json_type(hints[f.name])
        kwargs: dict[str, Any] = {"help": f.metadata.get("help")}
        if f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default"] = f.default_factory()
        else:
            kwargs["required"] = True
        if "enum" in schema:
            kwargs["choices"] = schema["enum"]
        else:
            convert = {"boolean": parse_bool, "integer": int, "number": float,
                       "string": str, "object": _json_object,
                       "array": json.loads}[schema["type"]]
            kwargs["type"] = _bounded(convert, f.metadata)
        flag(parser, f.name, **kwargs)


def _bounded(convert: Callable[[str], Any], metadata: Any) -> Callable[[str], Any]:
    """``convert``, refusing a value below the field's bound as the run schema does."""
    low, exclusive = metadata.get("minimum"), metadata.get("exclusiveMinimum")
    if low is None and exclusive is None:
        return convert

    def parse(text: str) -> Any:
        value = convert(text)
        # `not >=`: NaN is below every bound
        if low is not None and not value >= low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        if exclusive is not None and not value > exclusive:
            raise argparse.ArgumentTypeError(f"must be > {exclusive}, got {value}")
        return value

    parse.__name__ = convert.__name__  # argparse names it in "invalid int value: 'x'"
    return parse


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value
