"""The pipeline's configuration, resolved: schema checks, defaults, sweeps, ladders, selection,
comparisons and the plan record.

Everything here is plain Python (no Snakemake), so it is tested on its own and used by the
rules (`rules/common.smk` calls :func:`resolve` once and exposes the result to the rules):

    from pipeline.config import resolve
    plan = resolve(yaml.safe_load(open("config.yaml")))
    plan.runs            # name -> parameters, every run checked against its workload's schema
    plan.profiled        # the runs with an nsys capture
    plan.comparisons     # name -> {name, a, b}: the config's, then each ladder rung vs the last

A bad config raises :class:`ConfigError`, whose message names the offending key
(``Invalid config at 'sweeps[0].size': ...``).
"""

from __future__ import annotations

import copy
import difflib
import fnmatch
import itertools
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from workloads import models

REPO = Path(__file__).resolve().parent.parent
SCHEMAS = REPO / "schemas"

# Run keys for the pipeline itself, never passed to the workload: name -> (type, default).
PIPELINE_RUN_KEYS: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "profile": (bool, True),  # false: untraced timing only (no nsys capture), e.g. big sweeps
    # true / shapes: a second, opt-in capture with PyTorch's op ranges (record_shapes with
    # shapes) for the run's operator table; its ranges slow the step (docs/analysis.md)
    "ops": ((bool, str), False),
    # the memory capture (a third process, docs/analysis.md "Where the memory goes"): auto =
    # every captured single-process GPU run (`device: cuda`, or any device in a config with
    # `gpu: required`); true / false = always / never
    "memory": ((bool, str), "auto"),
    # `batch: max` (docs/workloads.md, "The largest batch that fits"): the search's bound and
    # first batch (near the answer, fewer processes)
    "max_batch_bound": (int, 4096),
    "max_batch_start": (int, 1),
}
# `batch: max`: the run's batch is the largest that fits, found by its own search job first
MAX = "max"
MAX_BATCH_KEYS = ("max_batch_bound", "max_batch_start")
# The values a pipeline key may take, where its type alone does not say.
PIPELINE_KEY_VALUES: dict[str, tuple[Any, ...]] = {"ops": (False, True, "shapes"),
                                                   "memory": ("auto", True, False)}
# What the workload's --op_ranges flag gets for each `ops` value (the op capture only).
OP_RANGES_FLAG = {True: "on", "shapes": "shapes"}


class ConfigError(ValueError):
    """A config problem at one key: ``Invalid config at '<where>': <problem>``."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"Invalid config at '{where}': {problem}")
        self.where, self.problem = where, problem


# --- schemas ---------------------------------------------------------------------------------


@cache
def top_level_schema() -> dict[str, Any]:
    """The config schema with its one $ref (the container section) resolved inline."""
    schema = yaml.safe_load((SCHEMAS / "config.schema.yaml").read_text())
    container = yaml.safe_load((SCHEMAS / "container.schema.yaml").read_text())
    schema["properties"]["container"] = container["properties"]["container"]
    return schema


@cache
def run_schemas() -> dict[str, dict[str, Any]]:
    """One complete JSON schema per workload: its own keys (its Options dataclass,
    workloads/models/) plus the keys all runs share (schemas/run.schema.yaml)."""
    common = yaml.safe_load((SCHEMAS / "run.schema.yaml").read_text())["$defs"]["common"]
    schemas = {}
    for name, module in models.registry().items():
        own = models.options_schema(module.Options)
        schemas[name] = {
            "type": "object", "additionalProperties": False,
            "description": (module.__doc__ or "").strip().split("\n")[0],
            "required": ["workload", *own["required"]],
            "properties": {**common, **own["properties"], "workload": {"const": name}},
        }
    return schemas


def _location(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<top level>"


def _validator_filling_defaults() -> type:
    """A validator class that also fills in each missing property's `default` (as Snakemake's
    validate(set_default=True) does), before it descends into that property."""
    base = jsonschema.validators.validator_for(top_level_schema())
    check_properties = base.VALIDATORS["properties"]

    def properties(validator, props, instance, schema):  # noqa: ANN001, ANN202
        if isinstance(instance, dict):
            for name, sub in props.items():
                if isinstance(sub, dict) and "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from check_properties(validator, props, instance, schema)

    return jsonschema.validators.extend(base, {"properties": properties})


# Snakemake's `--config key=value` passes `true`/`false` as strings (only `True`/`False` become
# booleans): for a boolean setting that is what a user means.
COMMAND_LINE_BOOLEANS = {"true": True, "false": False}


def booleans_from_command_line(cfg: dict[str, Any], schema: dict[str, Any]) -> None:
    """Turn `true`/`false` strings (any case) of the schema's boolean keys into booleans, in
    place, at the top level and one level down (e.g. `nsys`)."""
    for name, sub in (schema.get("properties") or {}).items():
        value = cfg.get(name)
        if sub.get("type") == "boolean" and isinstance(value, str):
            cfg[name] = COMMAND_LINE_BOOLEANS.get(value.lower(), value)
        elif sub.get("type") == "object" and isinstance(value, dict):
            booleans_from_command_line(value, sub)


# The sections that define runs: each optional, at least one required (the schema's anyOf).
RUN_SECTIONS = ("runs", "sweeps", "ladders")


def validate_top_level(cfg: dict[str, Any]) -> dict[str, Any]:
    """Check the top-level keys (naming a bad one) and fill in the schema's defaults, in place.
    Returns ``cfg``."""
    schema = top_level_schema()
    booleans_from_command_line(cfg, schema)
    # Every other problem first (a misspelt 'rnus' is named as such), then the schema's anyOf
    # of runs/sweeps/ladders, whose own message ("... is not valid under any of the given
    # schemas") would dump the whole config.
    try:
        jsonschema.validate(copy.deepcopy(cfg),
                            {k: v for k, v in schema.items() if k != "anyOf"})
    except jsonschema.ValidationError as e:
        raise ConfigError(_location(e), e.message) from None
    if not any(key in cfg for key in RUN_SECTIONS):
        raise ConfigError("<top level>", "a config needs at least one of runs, sweeps, "
                          "ladders (each optional, none defined)")
    jsonschema.validate(copy.deepcopy(cfg), schema)  # the anyOf above, as the schema says
    _validator_filling_defaults()(schema).validate(cfg)
    return cfg


# --- runs ------------------------------------------------------------------------------------


def pipeline_settings(params: dict[str, Any]) -> dict[str, Any]:
    """The pipeline's own keys of a run, with defaults (the search's keys: max_batch)."""
    return {k: params.get(k, default) for k, (_, default) in PIPELINE_RUN_KEYS.items()
            if k not in MAX_BATCH_KEYS}


def is_max_batch(params: dict[str, Any]) -> bool:
    """Whether the run has `batch: max`."""
    return params.get("batch") == MAX


def max_batch(params: dict[str, Any]) -> dict[str, int] | None:
    """A `batch: max` run's search settings (bound, start); None for any other run."""
    if not is_max_batch(params):
        return None
    return {k.removeprefix("max_batch_"): params.get(k, PIPELINE_RUN_KEYS[k][1])
            for k in MAX_BATCH_KEYS}


def _type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def workload_params(params: dict[str, Any]) -> dict[str, Any]:
    """The run's parameters without the pipeline's own keys."""
    return {k: v for k, v in params.items() if k not in PIPELINE_RUN_KEYS}


def check_keys(where: str, params: dict[str, Any]) -> None:
    """Unknown workload or parameter names, before any value is looked at."""
    workload = params.get("workload")
    schemas = run_schemas()
    if workload not in schemas:
        raise ConfigError(
            f"{where}.workload", f"unknown workload {workload!r}; expected one of {sorted(schemas)}"
        )
    allowed = {**schemas[workload]["properties"], **PIPELINE_RUN_KEYS}
    for key in params:
        if key not in allowed:
            raise ConfigError(
                f"{where}.{key}",
                f"unknown parameter {key!r} for workload {workload!r}; "
                f"expected one of {sorted(allowed)}",
            )


def check_run(where: str, params: dict[str, Any]) -> None:
    """One run's parameters (defaults applied) against its workload's schema."""
    for key, (kind, _) in PIPELINE_RUN_KEYS.items():
        if key in params and not isinstance(params[key], kind):
            raise ConfigError(f"{where}.{key}",
                              f"{params[key]!r} is not of type {_type_name(kind)}")
        if key in params and key in PIPELINE_KEY_VALUES and not any(
            params[key] is v or (isinstance(v, str) and params[key] == v)
            for v in PIPELINE_KEY_VALUES[key]
        ):
            raise ConfigError(f"{where}.{key}",
                              f"{params[key]!r} is not one of {list(PIPELINE_KEY_VALUES[key])}")
    if pipeline_settings(params)["ops"] and not pipeline_settings(params)["profile"]:
        raise ConfigError(f"{where}.ops", "the op capture needs the lean one (profile: true): "
                          "its overhead is measured against it")
    check_keys(where, workload_params(params))
    check_max_batch(where, params)
    # `batch: max`: the schema checks the rest of the run with the search's first batch
    params = {**workload_params(params), **({"batch": search["start"]}
                                            if (search := max_batch(params)) else {})}
    # what jsonschema.validate reports, without checking the schema again for every run
    e = jsonschema.exceptions.best_match(run_validator(params["workload"]).iter_errors(params))
    if e is not None:
        key = ".".join(str(p) for p in e.absolute_path)
        raise ConfigError(f"{where}.{key}" if key else where, e.message)
    problem = workload_problem(params["workload"], json.dumps(params, sort_keys=True))
    if problem is not None:
        raise ConfigError(f"{where}.{problem[0]}", problem[1])


def check_max_batch(where: str, params: dict[str, Any]) -> None:
    """`batch: max` only where a search can answer it: one process of a workload whose batch
    sets its memory, with a real out-of-memory (a GPU's, or a CPU's memory_limit_mb); the
    search's keys only with it."""
    search, given = max_batch(params), [k for k in MAX_BATCH_KEYS if k in params]
    if search is None:
        if given:
            raise ConfigError(f"{where}.{given[0]}", f"{given[0]} is for runs with batch: max "
                              f"(this run's batch is {params.get('batch', 'its default')!r})")
        if isinstance(params.get("batch"), str):
            raise ConfigError(f"{where}.batch", f"{params['batch']!r} is neither a batch size "
                              f"(an integer >= 1) nor {MAX!r}")
        return
    for key in given:
        if isinstance(params[key], bool) or not isinstance(params[key], int) or params[key] < 1:
            raise ConfigError(f"{where}.{key}", f"{params[key]!r} is not an integer >= 1")
    if search["start"] > search["bound"]:
        raise ConfigError(f"{where}.max_batch_start", f"{search['start']} is above "
                          f"max_batch_bound ({search['bound']})")
    workload = params["workload"]
    module = models.registry()[workload]
    if "batch" not in run_schemas()[workload]["properties"]:
        refusal = f"workload {workload!r} has no batch"
    elif not getattr(module, "BATCH_SETS_MEMORY", True):
        refusal = (f"workload {workload!r}'s batch sets no memory: the search would only "
                   "reach its bound")
    elif params.get("parallel", "none") != "none":
        refusal = "the search runs one process; give a distributed run its batch per rank"
    elif params.get("device") == "cpu" and params.get("memory_limit_mb") is None:
        refusal = ("on the CPU the search needs memory_limit_mb (the cap that makes an "
                   "out-of-memory real; without it the search takes the host's memory)")
    else:
        return
    raise ConfigError(f"{where}.batch", f"batch: {MAX} is refused here: {refusal}")


@cache
def run_validator(workload: str) -> Any:
    """The validator of a workload's run schema, the schema itself checked once (checking it
    for every run was most of the time a big config took to plan: 8 s of config/full.yaml's,
    paid by every Snakemake invocation and every cluster job)."""
    schema = run_schemas()[workload]
    kind = jsonschema.validators.validator_for(schema)
    kind.check_schema(schema)
    return kind(schema)


@cache
def workload_problem(workload: str, params_json: str) -> tuple[str, str] | None:
    """(key, problem) the workload finds in a run's options before any job starts (e.g. a
    factory that does not import); None when it finds none. Cached: a sweep's runs share a
    factory, imported once."""
    module = models.registry()[workload]
    if not hasattr(module, "check"):
        return None
    return module.check(models.options_of(workload, json.loads(params_json)))


def expand_sweep(index: int, sweep: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """A sweep's cartesian product: list values vary, scalars stay; names from the template."""
    where = f"sweeps[{index}]"
    fixed = {k: v for k, v in sweep.items() if k != "name"}
    axes = {k: v for k, v in fixed.items() if isinstance(v, list)}
    # Check the sweep's keys first: a typo would otherwise surface as a bad name template.
    check_keys(where, fixed)
    for values in itertools.product(*axes.values()):
        params = {**fixed, **dict(zip(axes, values, strict=True))}
        try:
            name = sweep["name"].format(**params)
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(f"{where}.name", f"cannot format {sweep['name']!r}: {e!r}") from None
        yield name, params


@dataclass(frozen=True)
class Rung:
    """Where a ladder run sits: its ladder, group (one per value of the base's list keys),
    rung index and rung name."""

    ladder: str
    group: str
    index: int
    name: str

    def record(self) -> dict[str, Any]:
        return {"ladder": self.ladder, "ladder_group": self.group, "rung_index": self.index,
                "rung": self.name}


RUNG_DTYPES = ("fp32", "tf32", "bf16", "fp16")


def check_rung_dtype(where: str, name: str, dtype: str | None) -> None:
    """A rung named for a dtype runs that dtype: rungs add their keys to the rung before, so a
    ``bf16_fused`` rung after ``{dtype: fp32}`` would run fp32 under a bf16 name."""
    named = [word for word in name.split("_") if word in RUNG_DTYPES]
    if named and dtype is not None and dtype not in named:
        raise ConfigError(where, f"the rung is named for {named[0]} but runs dtype {dtype} "
                                 f"(a rung adds its keys to the rung before): set dtype: "
                                 f"{named[0]} on it, or rename it")


def expand_ladders(cfg: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any], Rung]]:
    """Ladder runs: name -> (where in the config, parameters, rung).

    Each list value in a ladder's `base` gives one ladder (e.g. one per model size); rung i
    runs `base` plus the keys of rungs 0..i, so each rung adds one optimization to the last.
    """
    out = {}
    for index, ladder in enumerate(cfg.get("ladders", [])):
        where = f"ladders[{index}]"
        base = dict(ladder["base"])
        check_keys(f"{where}.base", base)
        axes = {k: v for k, v in base.items() if isinstance(v, list)}
        for values in itertools.product(*axes.values()):
            params = {**base, **dict(zip(axes, values, strict=True))}
            group = "_".join(str(v) for v in values) or "all"
            seen = set()
            for i, rung in enumerate(ladder["rungs"]):
                rung_keys = {k: v for k, v in rung.items() if k != "name"}
                check_keys(f"{where}.rungs[{i}]", {"workload": params["workload"], **rung_keys})
                if rung["name"] in seen:
                    raise ConfigError(f"{where}.rungs[{i}].name", "rung names must be unique")
                seen.add(rung["name"])
                params = {**params, **rung_keys}
                check_rung_dtype(f"{where}.rungs[{i}].name", rung["name"],
                                 params.get("dtype", cfg.get("defaults", {}).get("dtype")))
                name = f"{ladder['name']}_{group}_{i}_{rung['name']}"
                out[name] = (f"{where}.rungs[{i}] (run {name})", dict(params),
                             Rung(ladder["name"], group, i, rung["name"]))
    return out


def check_defaults(defaults: dict[str, Any]) -> None:
    """`defaults` may hold keys that only some workloads take (e.g. 'context' for gpt; each run
    gets those its workload takes), but not a key that no workload of the registry (nor the
    pipeline) takes: that is a typo, refused as a run's would be."""
    known = set(PIPELINE_RUN_KEYS)
    for schema in run_schemas().values():
        known.update(schema["properties"])
    for key in defaults:
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f"; did you mean {' or '.join(map(repr, near))}?" if near else ""
            raise ConfigError(f"defaults.{key}",
                              f"unknown parameter {key!r}: no workload takes it{hint} "
                              f"(known: {sorted(known)})")


def resolve_runs(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """All runs by name (sweeps, named runs, ladders), with defaults applied and every run
    checked against its schema."""
    check_defaults(cfg["defaults"])
    runs: dict[str, tuple[str, dict[str, Any]]] = {}  # name -> (where, parameters)
    for index, sweep in enumerate(cfg["sweeps"]):
        for name, params in expand_sweep(index, sweep):
            if name in runs:
                raise ConfigError(f"sweeps[{index}].name", f"run name {name!r} is not unique")
            runs[name] = (f"sweeps[{index}] (run {name})", params)
    for name, params in cfg["runs"].items():
        if name in runs:
            raise ConfigError(f"runs.{name}", "name also produced by a sweep")
        runs[name] = (f"runs.{name}", dict(params or {}))
    for name, (where, params, _) in expand_ladders(cfg).items():
        if name in runs:
            raise ConfigError(where, f"run name {name!r} is also defined elsewhere")
        runs[name] = (where, params)
    if not runs:
        raise ConfigError("runs", "no runs defined (add entries under 'runs', 'sweeps' or "
                          "'ladders')")
    resolved = {}
    for name, (where, params) in runs.items():
        merged = {**cfg["defaults"], **params}
        # Defaults may hold keys that only some workloads take (e.g. 'context' for gpt).
        allowed = run_schemas().get(merged.get("workload"), {}).get("properties", {})
        merged = {
            k: v for k, v in merged.items()
            if k in params or k in allowed or k in PIPELINE_RUN_KEYS
        }
        if not is_max_batch(merged):  # defaults' search keys are for the batch: max runs
            merged = {k: v for k, v in merged.items() if k in params or k not in MAX_BATCH_KEYS}
        check_run(where, merged)
        resolved[name] = merged
    return resolved


def ladder_members(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """run name -> {ladder, ladder_group, rung_index, rung} for every ladder run."""
    return {name: rung.record() for name, (_, _, rung) in expand_ladders(cfg).items()}


def ladder_comparisons(cfg: dict[str, Any]) -> list[dict[str, str]]:
    """Each rung against the one before it: {name, a, b}."""
    comps, previous = [], {}
    for name, info in ladder_members(cfg).items():
        key = (info["ladder"], info["ladder_group"])
        if key in previous:
            comps.append({"name": f"{name}_vs_prev", "a": previous[key], "b": name})
        previous[key] = name
    return comps


def select_runs(runs: dict[str, Any], patterns: list[str]) -> dict[str, Any]:
    """The runs whose names match any of the glob patterns (all runs when none are given)."""
    if not patterns:
        return runs
    chosen = {n: p for n, p in runs.items() if any(fnmatch.fnmatchcase(n, g) for g in patterns)}
    if not chosen:
        raise ConfigError("select", f"no run matches {patterns}; runs are {sorted(runs)}")
    return chosen


def ranks(params: dict[str, Any]) -> int:
    """Processes (GPUs) a run takes: its `gpus` when `parallel` is ddp or fsdp, else 1."""
    return int(params.get("gpus", 1)) if params.get("parallel", "none") != "none" else 1


def check_parallel(runs: dict[str, dict[str, Any]]) -> None:
    """`gpus` > 1 only with a parallel mode (one process cannot use several GPUs here)."""
    for name, params in runs.items():
        if params.get("gpus", 1) > 1 and params.get("parallel", "none") == "none":
            raise ConfigError(f"runs.{name}.gpus",
                              "gpus > 1 needs parallel: ddp or fsdp (docs/distributed.md)")
        if params.get("memory") is True and params.get("parallel", "none") != "none":
            raise ConfigError(f"runs.{name}.memory", "the memory capture is of one process")
        if params.get("ops") and params.get("parallel", "none") != "none":
            raise ConfigError(f"runs.{name}.ops", "the op capture is of one process; a "
                              "distributed run's CPU captures have op ranges already")


def check_comparisons(cfg: dict[str, Any], runs: dict[str, Any]) -> None:
    for i, comp in enumerate(cfg["comparisons"]):
        for side in ("a", "b"):
            if comp[side] not in runs:
                raise ConfigError(f"comparisons[{i}].{side}", f"unknown run {comp[side]!r}")


def workload_args(params: dict[str, Any]) -> str:
    """The `python -m workloads` command line of one run (its params drive reruns)."""
    params = workload_params(params)
    if is_max_batch(params):  # the batch comes from the search (Plan.workload_args)
        params.pop("batch")
    args = [params.pop("workload")]
    for key, value in sorted(params.items()):
        args += [f"--{key}", json.dumps(value) if isinstance(value, dict | list) else str(value)]
    return shlex.join(args)


# --- the resolved plan -----------------------------------------------------------------------


@dataclass
class Plan:
    """What one configuration runs: the selected runs and everything derived from them."""

    config: dict[str, Any]
    all_runs: dict[str, dict[str, Any]]
    runs: dict[str, dict[str, Any]]
    profiled: dict[str, dict[str, Any]]
    ladders: dict[str, dict[str, Any]]
    comparisons: dict[str, dict[str, str]]
    git: dict[str, Any] = field(default_factory=dict)

    @property
    def results(self) -> str:
        return self.config["results"].rstrip("/")

    @property
    def repeats(self) -> list[int]:
        return list(range(self.config["timing"]["repeats"]))

    @property
    def timeout_s(self) -> int:
        return int(self.config["timeout_min"] * 60)

    @property
    def ladder_tables(self) -> list[str]:
        """One table per ladder and group, e.g. gpt_train_small."""
        return sorted({f"{i['ladder']}_{i['ladder_group']}" for i in self.ladders.values()})

    @property
    def op_captured(self) -> dict[str, dict[str, Any]]:
        """The profiled runs that also get the op capture (`ops: true | shapes`)."""
        return {n: p for n, p in self.profiled.items() if pipeline_settings(p)["ops"]}

    @property
    def memory_captured(self) -> dict[str, dict[str, Any]]:
        """The profiled runs that also get the memory capture (`memory: auto | true`): with
        `auto`, the single-process GPU runs: `device: cuda`, or `auto` in a GPU config
        (`gpu: required`). From the config alone, so every invocation (a run, its report, a
        cluster's submission) plans the same jobs."""
        gpu_config = self.config.get("gpu") == "required"

        def wanted(p: dict[str, Any]) -> bool:
            memory = pipeline_settings(p)["memory"]
            if memory == "auto":
                device = p.get("device", "auto")
                return ranks(p) == 1 and (device == "cuda" or (device == "auto" and gpu_config))
            return memory is True
        return {n: p for n, p in self.profiled.items() if wanted(p)}

    def op_capture_args(self, run: str) -> str:
        """The op capture's `python -m workloads` command line: the run's, plus its op
        ranges."""
        flag = OP_RANGES_FLAG[pipeline_settings(self.runs[run])["ops"]]
        return f"{self.workload_args(run)} --op_ranges {flag}"

    @property
    def distributed(self) -> dict[str, int]:
        """Runs launched by torchrun (parallel ddp | fsdp) -> their ranks."""
        return {n: ranks(p) for n, p in self.runs.items() if p.get("parallel", "none") != "none"}

    def launch_args(self, run: str) -> str:
        """pipeline/launch.py's arguments for a distributed run: its ranks, its device."""
        return f"--ranks {ranks(self.runs[run])} --device {self.runs[run].get('device', 'auto')}"

    def runs_with_ranks(self, n: int) -> str:
        """A wildcard constraint matching exactly the distributed runs of ``n`` ranks."""
        return "|".join(re.escape(r) for r, k in self.distributed.items() if k == n)

    @property
    def profiled_comparisons(self) -> list[str]:
        """Comparisons of two captured runs (they also get the kernel/NVTX comparison)."""
        return [n for n, c in self.comparisons.items()
                if c["a"] in self.profiled and c["b"] in self.profiled]

    def workload_args(self, run: str) -> str:
        """The run's command line; a `batch: max` run's processes read the batch its search
        found (--batch_from)."""
        args = workload_args(self.runs[run])
        if run not in self.max_batch:
            return args
        return f"{args} --batch_from {self.max_batch_result(run)}"

    @cached_property  # asked by every job's command line
    def max_batch(self) -> dict[str, dict[str, int]]:
        """The runs with `batch: max` -> their search's bound and start."""
        return {n: s for n, p in self.runs.items() if (s := max_batch(p)) is not None}

    def max_batch_result(self, run: str) -> str:
        """Where a `batch: max` run's search writes its result (rule max_batch)."""
        return f"{self.results}/{run}/maxbatch.json"

    def max_batch_args(self, run: str) -> str:
        """`python -m workloads.maxbatch`'s command line for the run (its result's --out
        aside): the bound, the start, the run's workload command line without a batch."""
        search = self.max_batch[run]
        return (f"--bound {search['bound']} --start {search['start']} --timeout-s "
                f"{self.timeout_s} -- {workload_args(self.runs[run])}")

    def compiled(self, run: str) -> bool:
        """Whether the run uses torch.compile (its capture then records a TORCH_TRACE)."""
        return str(self.runs[run].get("compile", "off")) != "off"

    def record(self) -> dict[str, Any]:
        """plan.json: runs, ladders, comparisons and the settings the outputs depend on.
        `unselected`: the config's runs that `select` leaves out, in the same form; the summary
        still has a row for each of them whose timing records exist (an earlier invocation's),
        so a selection never shrinks it."""
        members = ladder_members(self.config)

        def entry(name: str, params: dict[str, Any]) -> dict[str, Any]:
            search = max_batch(params)
            return {"params": workload_params(params), **pipeline_settings(params),
                    **({"max_batch": search} if search else {}), **members.get(name, {})}

        return {
            "runs": {name: entry(name, params) for name, params in self.runs.items()},
            "unselected": {name: entry(name, params) for name, params in self.all_runs.items()
                           if name not in self.runs},
            "comparisons": list(self.comparisons.values()),
            "timing": dict(self.config["timing"]),
            "timeout_min": self.config["timeout_min"],
            "nsys": {k: self.config["nsys"][k] for k in ("trace", "capture", "extra_args")},
            "keep_captures": self.config["keep_captures"],
            "git": dict(self.git),
        }


def resolve(cfg: dict[str, Any], git: dict[str, Any] | None = None) -> Plan:
    """Check ``cfg`` (filling in defaults, in place) and resolve what it runs."""
    validate_top_level(cfg)
    all_runs = resolve_runs(cfg)
    check_parallel(all_runs)
    check_comparisons(cfg, all_runs)
    runs = select_runs(all_runs, cfg["select"])
    comparisons = {
        c["name"]: c
        for c in [*cfg["comparisons"], *ladder_comparisons(cfg)]
        if c["a"] in runs and c["b"] in runs
    }
    return Plan(
        config=cfg,
        all_runs=all_runs,
        runs=runs,
        profiled={n: p for n, p in runs.items() if pipeline_settings(p)["profile"]},
        ladders={n: info for n, info in ladder_members(cfg).items() if n in runs},
        comparisons=comparisons,
        git=dict(git or {}),
    )


def load(path: str | Path, git: dict[str, Any] | None = None) -> Plan:
    """:func:`resolve` of a YAML config file."""
    return resolve(yaml.safe_load(Path(path).read_text()) or {}, git)
