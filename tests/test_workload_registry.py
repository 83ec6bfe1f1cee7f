"""Every workload is a module of workloads/models/ (its Options dataclass, its build): the
command line and the run schema are generated from it, the pipeline's estimates come from it,
and the records of the shipped configs' runs keep the config hashes their published results
were made with."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import typing
from pathlib import Path

import pytest
import torch
from conftest import REPO

from pipeline import checks, config, resources
from pipeline.config import ConfigError
from workloads import models, optim, parallel, steps
from workloads.__main__ import build_parser, hashed_params, record_params
from workloads.attention import IMPLS
from workloads.gpt import SIZES
from workloads.provenance import config_hash

BUILT_IN = {"attention", "attention_core", "gpt", "sleep", "model"}
HASHES = json.loads((REPO / "tests" / "fixtures" / "run_config_hashes.json").read_text())


def test_the_folder_is_the_registry() -> None:
    assert set(models.registry()) == BUILT_IN
    assert set(config.run_schemas()) == BUILT_IN


# --- config hashes: the params of every shipped run are what they were ------------------------


def record_hashes(path: Path, device: str) -> dict[str, list[str]]:
    """run -> [config hash, hash of the whole params] of the record `python -m workloads` makes
    from each run's command line, as the pipeline passes it."""
    parser = build_parser()
    hashes = {}
    for name, params in config.load(path).all_runs.items():
        args = parser.parse_args(shlex.split(config.workload_args(params)))
        recorded = record_params(args, torch.device(device))
        hashes[name] = [config_hash(hashed_params(recorded)), config_hash(recorded)]
    return hashes


@pytest.mark.parametrize("name", sorted(HASHES))
def test_config_hashes_of_shipped_runs_are_unchanged(name: str) -> None:
    """tests/fixtures/run_config_hashes.json: the hashes each run's record had when the
    published results were made (the same as those records' provenance.config_hash); a run
    whose settings a config changed on purpose (config/distributed.yaml's straggler knob run,
    batch 4 to 128) carries its new hashes there."""
    expected = HASHES[name]
    hashes = record_hashes(REPO / name, expected["device"])
    if "runs" in expected:
        assert hashes == expected["runs"]
    else:  # a big config: one digest of all its runs' hashes
        assert (len(hashes), config_hash(hashes)) == (expected["count"], expected["digest"])


def test_a_record_hash_matches_a_published_one() -> None:
    """The fixture's hashes are those the published records carry."""
    record = json.loads((REPO / "published" / "h100" / "standard" /
                         "gpt_train_small_0_fp32_eager" / "timing" / "r0.json").read_text())
    given = {k: v for k, v in record["params"].items()
             if v is not None and k not in ("device", "out")}
    args = build_parser().parse_args(
        shlex.split(config.workload_args({"workload": record["workload"], **given})))
    assert config_hash(hashed_params(record_params(args, torch.device("cuda")))) == (
        record["provenance"]["config_hash"])


# --- the generated run schema accepts and refuses what the hand-written one did ---------------

ATTENTION = {"workload": "attention", "impl": "naive", "batch": 2, "seq": 8, "embed": 16}
CORE = {"workload": "attention_core", "impl": "sdpa", "batch": 1, "heads": 2, "seq": 16,
        "head_dim": 8}
GPT = {"workload": "gpt", "size": "tiny"}
SLEEP = {"workload": "sleep", "step_ms": 10}

ACCEPTED = [
    ATTENTION, {**ATTENTION, "heads": 2, "mode": "forward_backward", "dtype": "bf16"},
    CORE, {**CORE, "causal": True, "mode": "forward_backward", "sdpa_backend": "flash"},
    GPT, {**GPT, "context": 32, "vocab": 2, "mode": "train", "attention": "naive",
          "optimizer": "adamw_master", "compile": "default", "compile_blocks": "once"},
    {**GPT, "parallel": "fsdp", "gpus": 2, "bucket_cap_mb": 0.5, "reshard_after_forward": False,
     "mode": "train"},
    SLEEP, {**SLEEP, "step_ms": 0, "batch": 3, "warmup": 0, "steps": 1, "seed": 7},
]

# (run, the key the refusal names)
REFUSED = [
    ({**ATTENTION, "mode": "train"}, "mode"),
    ({**ATTENTION, "seq": 0}, "seq"),
    ({**ATTENTION, "impl": "flash"}, "impl"),
    ({k: v for k, v in ATTENTION.items() if k != "embed"}, "'embed' is a required property"),
    ({k: v for k, v in ATTENTION.items() if k != "impl"}, "'impl' is a required property"),
    ({k: v for k, v in ATTENTION.items() if k != "batch"}, "'batch' is a required property"),
    ({**ATTENTION, "head_dim": 8}, "head_dim"),
    ({**CORE, "causal": "yes"}, "causal"),
    ({**CORE, "head_dim": 0}, "head_dim"),
    ({k: v for k, v in CORE.items() if k != "heads"}, "'heads' is a required property"),
    ({k: v for k, v in CORE.items() if k != "head_dim"}, "'head_dim' is a required property"),
    ({**CORE, "size": "tiny"}, "size"),
    ({"workload": "gpt"}, "'size' is a required property"),
    ({**GPT, "size": "huge"}, "size"),
    ({**GPT, "vocab": 1}, "vocab"),
    ({**GPT, "context": 0}, "context"),
    ({**GPT, "bucket_cap_mb": 0}, "bucket_cap_mb"),
    ({**GPT, "gpus": 0}, "gpus"),
    ({**GPT, "parallel": "zero"}, "parallel"),
    ({**GPT, "compile_blocks": "twice"}, "compile_blocks"),
    ({**GPT, "reshard_after_forward": "no"}, "reshard_after_forward"),
    ({**GPT, "optimizer": "sgd"}, "optimizer"),
    ({**GPT, "impl": "naive"}, "impl"),
    ({**GPT, "batch": 0}, "batch"),
    ({**GPT, "steps": "ten"}, "steps"),
    ({**GPT, "dtype": "int8"}, "dtype"),
    ({"workload": "sleep"}, "'step_ms' is a required property"),
    ({**SLEEP, "step_ms": -1}, "step_ms"),
    ({**SLEEP, "mode": "step"}, "mode"),
    ({**SLEEP, "size": "tiny"}, "size"),
    ({**SLEEP, "batch": 0}, "batch"),
]


def resolve_one(run: dict) -> dict:
    return config.resolve({"results": "results", "runs": {"r": dict(run)}}).runs["r"]


@pytest.mark.parametrize("run", ACCEPTED, ids=lambda r: "-".join(map(str, r.values())))
def test_generated_schema_accepts(run: dict) -> None:
    assert resolve_one(run)["workload"] == run["workload"]


@pytest.mark.parametrize(("run", "key"), REFUSED, ids=[f"{r['workload']}-{k}" for r, k in REFUSED])
def test_generated_schema_refuses_naming_the_key(run: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_one(run)
    assert key in str(err.value)


@pytest.mark.parametrize("name", sorted(
    {p.relative_to(REPO).as_posix() for p in (REPO / "config").glob("*.yaml")} - set(HASHES)))
def test_every_other_shipped_config_still_resolves(name: str) -> None:
    """The configs the hash test does not resolve."""
    assert config.load(REPO / name).all_runs


# --- the options are the implementation's --------------------------------------------------


def choices(workload: str, name: str) -> tuple[str, ...]:
    hints = typing.get_type_hints(models.registry()[workload].Options)
    return typing.get_args(hints[name])


def test_option_choices_are_those_the_workloads_implement() -> None:
    """The Options read without torch spell out the choices the torch code defines."""
    assert choices("attention", "impl") == choices("attention_core", "impl") == IMPLS
    assert choices("gpt", "attention") == IMPLS
    assert choices("attention", "mode") == choices("attention_core", "mode") == (
        steps.ATTENTION_MODES)
    assert choices("gpt", "mode") == choices("model", "mode") == steps.GPT_MODES
    assert choices("gpt", "size") == tuple(SIZES)
    assert choices("gpt", "optimizer") == choices("model", "optimizer") == optim.OPTIMIZERS
    assert choices("gpt", "parallel") == parallel.PARALLEL_MODES
    assert choices("gpt", "compile_blocks") == choices("model", "compile_blocks")
    gpt = models.registry()["gpt"]
    assert gpt.LAYERS == {size: dims["n_layers"] for size, dims in SIZES.items()}


def test_command_line_defaults_and_bounds_come_from_the_options() -> None:
    parser = build_parser()
    gpt = vars(parser.parse_args(["gpt"]))
    assert {k: gpt[k] for k in ("size", "context", "batch", "vocab", "mode", "attention",
                                "bucket_cap_mb", "reshard_after_forward")} == {
        "size": "small", "context": 512, "batch": 4, "vocab": 10_000, "mode": "forward",
        "attention": "sdpa", "bucket_cap_mb": 25.0, "reshard_after_forward": True}
    assert vars(parser.parse_args(["sleep"]))["mode"] == "step"  # fixed: no flag
    with pytest.raises(SystemExit):
        parser.parse_args(["sleep", "--mode", "step"])
    with pytest.raises(SystemExit):
        parser.parse_args(["attention", "--seq", "0"])


# --- the pipeline's estimates come from the workload's module -------------------------------


def test_job_needs_and_capture_sizes_come_from_the_workloads() -> None:
    gpt = {"workload": "gpt", "size": "xl", "mode": "train", "warmup": 5, "steps": 10}
    assert resources.run_needs(gpt) == (24000, 90)
    assert resources.run_needs({**ATTENTION, "warmup": 5, "steps": 10}) == (
        resources.SMALL_JOB_NEEDS)
    assert resources.run_needs({"workload": "model", "factory": "x.py:make"})[0] == 16000
    # GPT: layers x kernels per layer, bf16 autocast's casts on top
    fp32 = checks.estimate_run_bytes({**gpt, "dtype": "fp32"})
    bf16 = checks.estimate_run_bytes({**gpt, "dtype": "bf16"})
    assert fp32 == checks.BASE_BYTES + 48 * 165 * 10 * checks.BYTES_PER_KERNEL
    assert bf16 == checks.BASE_BYTES + int(48 * 165 * 1.25) * 10 * checks.BYTES_PER_KERNEL
    assert checks.estimate_run_bytes({**CORE, "mode": "forward_backward", "steps": 10}) == (
        checks.BASE_BYTES + 30 * 10 * checks.BYTES_PER_KERNEL)
    assert checks.estimate_run_bytes({**SLEEP, "steps": 10}) == checks.BASE_BYTES


# --- what a field's metadata makes of the flag and the schema key ----------------------------


@dataclasses.dataclass
class Sample:
    width: int = dataclasses.field(default=8, metadata={"help": "hidden width", "minimum": 1,
                                                        "required": True})
    rate: float = dataclasses.field(default=0.5, metadata={"exclusiveMinimum": 0})
    flag: bool = False
    kind: typing.Literal["a", "b"] = "a"
    name: str = dataclasses.field(default="")
    phase: typing.Literal["step"] = dataclasses.field(default="step", metadata={"fixed": True})


def sample_parser() -> argparse.ArgumentParser:
    from workloads.__main__ import _boolean, _flag

    parser = argparse.ArgumentParser(exit_on_error=False)
    models.add_options(parser, Sample, _flag, _boolean)
    return parser


def test_metadata_makes_the_schema_key() -> None:
    schema = models.options_schema(Sample)
    assert schema["required"] == ["width"]
    assert schema["properties"] == {
        "width": {"type": "integer", "minimum": 1, "description": "hidden width"},
        "rate": {"type": "number", "exclusiveMinimum": 0},
        "flag": {"type": "boolean"},
        "kind": {"enum": ["a", "b"]},
        "name": {"type": "string"},
    }  # the fixed field is no run key


def test_metadata_makes_the_flag() -> None:
    parser = sample_parser()
    assert vars(parser.parse_args([])) == {"width": 8, "rate": 0.5, "flag": False, "kind": "a",
                                           "name": "", "phase": "step"}
    assert vars(parser.parse_args(["--width", "3", "--rate", "2", "--flag", "TRUE"])) == {
        "width": 3, "rate": 2.0, "flag": True, "kind": "a", "name": "", "phase": "step"}
    for bad in (["--width", "0"], ["--rate", "0"], ["--rate", "nan"], ["--kind", "c"],
                ["--phase", "other"], ["--width", "x"]):
        with pytest.raises((argparse.ArgumentError, SystemExit)):
            parser.parse_args(bad)
