"""A model factory checked before any job runs, without calling it (``workload: model``).

Two passes, both at plan time (workloads/models/model.py ``check``):

* :func:`source_problem` reads the factory's source (``ast``, nothing imported, so a refusal
  does not pay the factory's own imports: torch alone takes 1.4-2.5 s, more than the rest of
  planning): its keywords against the run's ``kwargs``, and what its ``return`` statements
  return where the source says it for sure: a tuple of the wrong length, an ``nn.Module``
  alone, a ``make_batch`` that cannot be called as ``make_batch(batch_size, device)``;
* :func:`signature_problem`, once the factory is imported, its real signature (a factory
  re-exported, decorated or built by ``functools.partial``, whose source says nothing).

The factory is not called here. In Snakemake's own process a call may initialize CUDA (a
``.cuda()`` in the factory: that process would then hold GPU memory for the whole pipeline and
every timing job would see it as another process on its GPU), download weights or take
minutes; a time limit cannot stop C code in-process, and a subprocess pays the torch import
again. What only a call finds (a return value the source does not spell out) stays the
run-time check (workloads/models/builder.py ``model_parts``): an ``error`` row naming it.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import inspect
from functools import cache
from pathlib import Path
from typing import Any

Problem = tuple[str, str]
EXPECTED = ("ModelParts(model, make_batch, loss) or the tuple (model, make_batch, loss) "
            "(docs/workloads.md)")


# --- the keywords ---------------------------------------------------------------------------


def kwargs_problem(name: str, accepted: list[str], required: list[str], any_keyword: bool,
                   kwargs: dict[str, Any]) -> Problem | None:
    """(key, problem) when ``kwargs`` do not fit a factory that takes the keywords
    ``accepted`` (``any_keyword``: it has ``**kwargs``) and needs ``required``."""
    for key in kwargs:
        if not any_keyword and key not in accepted:
            near = difflib.get_close_matches(key, accepted, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            return (f"kwargs.{key}", f"the factory {name}() takes no keyword {key!r}{hint} "
                    f"(it accepts {accepted})")
    missing = [p for p in required if p not in kwargs]
    if missing:
        return "kwargs", (f"the factory {name}() needs {missing} (no default): give "
                          f"{'them' if len(missing) > 1 else 'it'} in kwargs")
    return None


def signature_problem(fn: Any, kwargs: dict[str, Any]) -> Problem | None:
    """:func:`kwargs_problem` of an imported factory, from its signature."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: nothing to say
        return None
    by_keyword = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return kwargs_problem(
        getattr(fn, "__name__", "factory"), [p.name for p in by_keyword],
        [p.name for p in by_keyword if p.default is p.empty],
        any(p.kind is p.VAR_KEYWORD for p in params), kwargs)


# --- the source -------------------------------------------------------------------------------


def source_problem(spec: str, kwargs: dict[str, Any]) -> Problem | None:
    """(key, problem) that the factory's source shows for sure, None otherwise (also when the
    source cannot be found: importing it says why)."""
    target, _, attr = spec.rpartition(":")
    source = _source_file(target)
    module = _parse(str(source), _mtime_ns(source)) if source else None
    # the last top-level binding of the name is the one an import gives
    bound = [n for n in getattr(module, "body", []) if attr in _names_bound(n)]
    fn = bound[-1] if bound else None
    if not isinstance(fn, ast.FunctionDef) or fn.decorator_list:  # a decorator may change it
        return None
    return _args_problem(fn, kwargs) or _returns_problem(module, fn)


def _names_bound(node: ast.stmt) -> set[str]:
    """The names a top-level statement binds (a def, a class, an assignment, an import)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return set()


def _source_file(target: str) -> Path | None:
    if target.endswith(".py"):
        return Path(target).expanduser()
    try:
        spec = importlib.util.find_spec(target)  # imports the parent packages only
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


@cache
def _parse(path: str, mtime_ns: int) -> ast.Module | None:
    """The file's syntax tree, once per version of the file (a sweep's runs share it)."""
    try:
        return ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return None


def _args_problem(fn: ast.FunctionDef, kwargs: dict[str, Any]) -> Problem | None:
    args = fn.args
    named = [*args.args, *args.kwonlyargs]
    # defaults cover the last positional parameters; kw_defaults holds None for a required one
    positional_required = [a.arg for a in args.args[:max(len(args.args) - len(args.defaults), 0)]]
    keyword_required = [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                        if d is None]
    return kwargs_problem(fn.name, [a.arg for a in named],
                          positional_required + keyword_required, args.kwarg is not None, kwargs)


def _own_nodes(fn: ast.FunctionDef) -> list[ast.AST]:
    """The nodes of ``fn``'s body, not those of the functions and classes it defines."""
    found, todo = [], list(fn.body)
    while todo:
        node = todo.pop()
        found.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
                          | ast.ClassDef):
            todo.extend(ast.iter_child_nodes(node))
    return found


def _returns_problem(module: ast.Module, fn: ast.FunctionDef) -> Problem | None:
    own = _own_nodes(fn)
    assigned = {n.targets[0].id: n.value for n in own if isinstance(n, ast.Assign)
                and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
    functions = {n.name: n for n in [*module.body, *fn.body]
                 if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    classes = {n.name: n for n in module.body if isinstance(n, ast.ClassDef)}
    for ret in (n for n in own if isinstance(n, ast.Return) and n.value is not None):
        value = ret.value
        if isinstance(value, ast.Name) and value.id in assigned:
            value = assigned[value.id]
        problem = _returned_problem(fn.name, value, classes)
        if problem is None:
            batch = _batch_maker(value)
            if isinstance(batch, ast.Name) and batch.id in assigned:
                batch = assigned[batch.id]
            problem = _batch_maker_problem(fn.name, batch, functions)
        if problem:
            return "factory", f"line {ret.lineno}: {problem}"
    return None


def _returned_problem(name: str, value: ast.expr, classes: dict[str, ast.ClassDef]
                      ) -> str | None:
    if isinstance(value, ast.Tuple) and len(value.elts) != 3:
        return (f"{name}() returns a tuple of {len(value.elts)}; it must return {EXPECTED}")
    if isinstance(value, ast.Call) and _is_module_class(value.func, classes):
        return (f"{name}() returns only the model ({ast.unparse(value)}); it must return "
                f"{EXPECTED}")
    return None


def _is_module_class(func: ast.expr, classes: dict[str, ast.ClassDef], depth: int = 0) -> bool:
    """Whether ``func`` names an ``nn.Module`` class: ``nn.X``/``torch.nn.X``, or a class of
    the file whose base is one."""
    if isinstance(func, ast.Attribute):
        return ast.unparse(func.value) in ("nn", "torch.nn") or func.attr == "Module"
    if isinstance(func, ast.Name) and func.id in classes and depth < 5:
        return any(_is_module_class(b, classes, depth + 1) for b in classes[func.id].bases)
    return False


def _batch_maker(value: ast.expr) -> ast.expr | None:
    if isinstance(value, ast.Tuple):
        return value.elts[1]
    if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("ModelParts"):
        given = {k.arg: k.value for k in value.keywords}
        return value.args[1] if len(value.args) > 1 else given.get("make_batch")
    return None


def _batch_maker_problem(name: str, batch: ast.expr | None,
                         functions: dict[str, ast.FunctionDef]) -> str | None:
    if isinstance(batch, ast.Name) and batch.id in functions:
        args, what = functions[batch.id].args, batch.id
    elif isinstance(batch, ast.Lambda):
        args, what = batch.args, "lambda"
    else:
        return None
    positional = [*args.posonlyargs, *args.args]
    takes_two = args.vararg is not None or len(positional) >= 2
    required = len(positional) - len(args.defaults)
    keyword_required = any(d is None for d in args.kw_defaults)
    if takes_two and required <= 2 and not keyword_required:
        return None
    shown = ", ".join(a.arg for a in positional) or "no argument"
    return (f"the make_batch that {name}() returns, {what}({shown}), cannot be called as "
            "make_batch(batch_size, device)")
