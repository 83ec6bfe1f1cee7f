"""pipeline/config.py on its own (no Snakemake): schema checks, defaults, sweeps, ladders,
selection, comparisons, the plan record; pipeline/resources.py and pipeline/gitstate.py.

tests/test_config.py checks that Snakemake surfaces these errors before any job runs."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG

from pipeline import config, gitstate, resources
from pipeline.config import ConfigError

SMOKE = yaml.safe_load(SMOKE_CONFIG.read_text())


def smoke(edit=None) -> dict:
    cfg = copy.deepcopy(SMOKE)
    if edit is not None:
        edit(cfg)
    return cfg


def error_of(cfg: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config.resolve(cfg)
    return info.value


# Each bad config: the key the message names, and what it says there.
BAD = {
    "typo in a run key": (lambda c: c["runs"]["gpt_tiny_train_bf16"].update(bathc=2),
                          "runs.gpt_tiny_train_bf16.bathc", "'bathc'"),
    "wrong type": (lambda c: c["runs"]["gpt_tiny_train_bf16"].update(steps="ten"),
                   "runs.gpt_tiny_train_bf16.steps", "'ten' is not of type 'integer'"),
    "unknown workload": (lambda c: c["runs"]["gpt_tiny_train_bf16"].update(workload="gtp"),
                         "runs.gpt_tiny_train_bf16.workload", "'gtp'"),
    "unknown size": (lambda c: c["runs"]["gpt_tiny_train_bf16"].update(size="huge"),
                     "runs.gpt_tiny_train_bf16.size", "'huge'"),
    "unknown top-level key": (lambda c: c.update(defualts=c.pop("defaults")),
                              "<top level>", "'defualts'"),
    "typo in a sweep": (lambda c: c["sweeps"][0].update(imp=c["sweeps"][0].pop("impl")),
                        "sweeps[0].imp", "'imp'"),
    "nsys section typo": (lambda c: c.update(nsys={"trcae": "cuda"}), "nsys", "'trcae'"),
    "unknown comparison run": (lambda c: c["comparisons"][0].update(b="attention_flash"),
                               "comparisons[0].b", "'attention_flash'"),
    "pipeline key of the wrong type": (lambda c: c["runs"]["gpt_tiny_train_bf16"].update(
        profile="yes"), "runs.gpt_tiny_train_bf16.profile", "not of type bool"),
    "sweep name that is not unique": (lambda c: c["sweeps"][0].update(name="same"),
                                      "sweeps[0].name", "not unique"),
    "sweep name with an unknown field": (lambda c: c["sweeps"][0].update(name="a_{nope}"),
                                         "sweeps[0].name", "cannot format"),
    "duplicate rung names": (lambda c: c["ladders"][0]["rungs"].append({"name": "bf16"}),
                             "ladders[0].rungs[5].name", "unique"),
    "typo in a rung": (lambda c: c["ladders"][0]["rungs"][1].update(dtyp="bf16"),
                       "ladders[0].rungs[1].dtyp", "'dtyp'"),
    "unknown compile_blocks": (lambda c: c["runs"]["gpt_tiny_train_bf16"].update(
        compile_blocks="twice"), "runs.gpt_tiny_train_bf16.compile_blocks", "'twice'"),
    "select that matches nothing": (lambda c: c.update(select=["nothing_*"]), "select",
                                    "no run matches"),
    "no runs": (lambda c: c.update(runs={}, sweeps=[], ladders=[], comparisons=[]), "runs",
                "no runs defined"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_config_names_the_key(case: str) -> None:
    edit, where, fragment = BAD[case]
    err = error_of(smoke(edit))
    assert err.where == where
    assert fragment in err.problem
    assert str(err).startswith(f"Invalid config at '{where}': ")


def test_command_line_booleans_become_booleans() -> None:
    cfg = {"calibrate": "false", "keep_captures": "True", "nsys": {"console_stats": "TRUE"},
           "results": "true", "timeout_min": 5}
    config.booleans_from_command_line(cfg, config.top_level_schema())
    assert cfg == {"calibrate": False, "keep_captures": True, "nsys": {"console_stats": True},
                   "results": "true", "timeout_min": 5}  # only the boolean settings
    odd = {"calibrate": "maybe"}
    config.booleans_from_command_line(odd, config.top_level_schema())
    assert odd == {"calibrate": "maybe"}, "left for the schema to name"


def test_defaults_are_filled_in_place() -> None:
    cfg = {"runs": {"a": {"workload": "attention", "impl": "naive", "batch": 1, "seq": 8,
                          "embed": 8}}}
    plan = config.resolve(cfg)
    assert cfg["results"] == "results" and cfg["timing"]["repeats"] == 3
    assert cfg["nsys"]["trace"] == "cuda,nvtx,osrt" and cfg["nsys"]["capture"] == "nvtx"
    assert plan.repeats == [0, 1, 2] and plan.timeout_s == 3600
    assert plan.profiled == plan.runs


def test_sweep_expands_lists_and_keeps_scalars() -> None:
    plan = config.resolve(smoke())
    gpt = {n: p for n, p in plan.runs.items() if n.startswith("gpt_tiny_") and "bf16" not in n}
    assert set(gpt) == {"gpt_tiny_forward_fp32", "gpt_tiny_train_fp32"}
    assert gpt["gpt_tiny_train_fp32"]["mode"] == "train"
    assert gpt["gpt_tiny_train_fp32"]["context"] == 32
    # defaults reach every run, but only the keys its workload takes
    assert plan.runs["attention_naive"]["warmup"] == 1
    assert "context" not in plan.runs["attention_naive"]


def test_ladder_rungs_add_their_keys_to_the_rung_before() -> None:
    plan = config.resolve(smoke())
    rungs = {n: p for n, p in plan.runs.items() if n.startswith("ladder_tiny_")}
    assert list(rungs) == ["ladder_tiny_0_fp32_eager", "ladder_tiny_1_bf16",
                           "ladder_tiny_2_fused_adamw", "ladder_tiny_3_sdpa",
                           "ladder_tiny_4_compile"]
    last = rungs["ladder_tiny_4_compile"]
    assert (last["dtype"], last["optimizer"], last["attention"], last["compile"]) == (
        "bf16", "adamw_fused", "sdpa", "default")
    assert rungs["ladder_tiny_1_bf16"].get("optimizer") is None
    assert plan.ladders["ladder_tiny_3_sdpa"] == {
        "ladder": "ladder", "ladder_group": "tiny", "rung_index": 3, "rung": "sdpa"}
    assert plan.ladder_tables == ["ladder_tiny"]


def test_a_rung_named_for_a_dtype_it_does_not_run_is_refused() -> None:
    # config/memory.yaml at c30de23: `bf16_fused` kept the first rung's fp32
    cfg = {"runs": {}, "defaults": {"dtype": "bf16"}, "ladders": [{
        "name": "gpt_memory", "base": {"workload": "gpt", "size": ["small"]},
        "rungs": [{"name": "fp32_eager", "dtype": "fp32"},
                  {"name": "bf16_fused", "optimizer": "adamw_fused"}]}]}
    with pytest.raises(config.ConfigError, match=r"rungs\[1\]\.name.*named for bf16 but runs "
                       r"dtype fp32.*set dtype: bf16"):
        config.expand_ladders(cfg)
    cfg["ladders"][0]["rungs"][1]["dtype"] = "bf16"
    assert config.expand_ladders(cfg)["gpt_memory_small_1_bf16_fused"][1]["dtype"] == "bf16"


def test_each_rung_is_compared_with_the_one_before() -> None:
    plan = config.resolve(smoke())
    ladder = [c for n, c in plan.comparisons.items() if n.endswith("_vs_prev")]
    assert [(c["a"], c["b"]) for c in ladder][:2] == [
        ("ladder_tiny_0_fp32_eager", "ladder_tiny_1_bf16"),
        ("ladder_tiny_1_bf16", "ladder_tiny_2_fused_adamw")]
    assert len(ladder) == 4
    assert plan.comparisons["attention"] == {"name": "attention", "a": "attention_naive",
                                             "b": "attention_sdpa"}
    assert set(plan.profiled_comparisons) == set(plan.comparisons)


def test_select_keeps_matching_runs_and_their_comparisons() -> None:
    plan = config.resolve(smoke(lambda c: c.update(select=["attention_*"])))
    assert set(plan.runs) == {"attention_naive", "attention_sdpa", "attention_core_cudnn",
                              "attention_core_math"}
    assert list(plan.comparisons) == ["attention"]
    assert len(plan.all_runs) > len(plan.runs)


def test_timed_only_runs_are_not_profiled() -> None:
    plan = config.resolve(smoke())
    assert "attention_core_math" in plan.runs and "attention_core_math" not in plan.profiled
    assert plan.record()["runs"]["attention_core_math"]["profile"] is False


def test_workload_args_leave_out_pipeline_keys() -> None:
    plan = config.resolve(smoke())
    args = plan.workload_args("attention_core_math")
    assert args.startswith("attention_core ")
    assert "--profile" not in args and "--seq 64" in args


def test_compile_blocks_reaches_the_command_line_only_where_a_run_says_it() -> None:
    plan = config.resolve(smoke(lambda c: c["runs"]["gpt_tiny_train_bf16"].update(
        compile="default", compile_blocks="once")))
    assert "--compile_blocks once" in plan.workload_args("gpt_tiny_train_bf16")
    assert all("--compile_blocks" not in plan.workload_args(run)
               for run in plan.runs if run != "gpt_tiny_train_bf16")


def test_plan_record_is_json() -> None:
    plan = config.resolve(smoke(), git={"commit": "abc", "dirty": False})
    record = json.loads(json.dumps(plan.record()))
    assert record["git"] == {"commit": "abc", "dirty": False}
    assert record["runs"]["ladder_tiny_1_bf16"]["rung"] == "bf16"
    assert record["timing"]["repeats"] == 1


@pytest.mark.parametrize("name", ["config.yaml", "config/standard.yaml", "config/full.yaml"])
def test_shipped_configs_resolve(name: str) -> None:
    plan = config.load(REPO / name)
    assert plan.runs and set(plan.profiled) <= set(plan.runs)
    for comp in plan.comparisons.values():
        assert comp["a"] in plan.runs and comp["b"] in plan.runs


def test_gpu_job_estimates_grow_with_size_mode_and_retries() -> None:
    small = {"workload": "gpt", "size": "small", "mode": "forward", "warmup": 5, "steps": 10}
    big_train = {**small, "size": "2.7B", "mode": "train"}
    assert resources.run_needs(small) == (8000, 10)
    assert resources.run_needs(big_train) == (32000, 120)
    assert resources.run_needs({**small, "compile": "default"})[1] == 20
    assert resources.job_mem_mb(small, attempt=2) == 16000
    # never above the guard's own limit plus start-up and export
    assert resources.job_runtime_min(big_train, attempt=3, timeout_min=30) == 40
    assert resources.run_needs(None) == resources.SMALL_JOB_NEEDS


def test_git_stamp_wins_only_over_a_missing_or_stale_git(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gitstate.COMMIT_VAR, raising=False)
    stamp = {"commit": "f" * 40, "dirty": True}
    (tmp_path / gitstate.STAMP).write_text(json.dumps(stamp))
    assert gitstate.git_state(tmp_path) == ("f" * 40, True)  # no .git here
    if shutil.which("git") is None:
        pytest.fail("git is needed for the rest of this test")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.email=a@b", "-c", "user.name=a",
                    "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    # a stamp whose commit this .git does not know wins (a stale .git copied along)
    assert gitstate.git_state(tmp_path) == ("f" * 40, True)
    # a stamp of a commit this .git knows is left behind: HEAD moved on
    (tmp_path / gitstate.STAMP).write_text(json.dumps({"commit": head, "dirty": True}))
    assert gitstate.git_state(tmp_path)[0] == head
    monkeypatch.setenv(gitstate.COMMIT_VAR, "e" * 40)
    monkeypatch.setenv(gitstate.DIRTY_VAR, "0")
    assert gitstate.git_state(tmp_path) == ("e" * 40, False)


def test_standard_config_runs_the_default_matrix_unchanged() -> None:
    default = config.load(REPO / "config.yaml")
    standard = config.load(REPO / "config/standard.yaml")
    for name, params in default.runs.items():
        assert standard.runs.get(name) == params, name
    assert set(default.comparisons) <= set(standard.comparisons)


@pytest.mark.parametrize("name", ["config/standard.yaml", "config/full.yaml"])
def test_bigger_configs_measure_a_run_as_the_default_does(name: str) -> None:
    """The same tracer, timing processes, limit and default warm-up and steps as config.yaml:
    a run's numbers do not depend on which matrix it was part of."""
    default = yaml.safe_load((REPO / "config.yaml").read_text())
    other = yaml.safe_load((REPO / name).read_text())
    assert other["nsys"]["trace"] == default["nsys"]["trace"]
    assert other["timing"] == default["timing"]
    assert other["timeout_min"] == default["timeout_min"]
    for key in ("warmup", "steps", "seed", "compile_blocks"):
        assert other["defaults"][key] == default["defaults"][key], key


@pytest.mark.parametrize("name", ["config.yaml", "config/standard.yaml", "config/full.yaml"])
def test_shipped_configs_compile_regionally_only_what_is_not_captured(name: str) -> None:
    """A regional compile's kernels get no layer or sublayer in the kernel map (the compiled
    frame is the block), and with reduce-overhead its per-block CUDA graphs cost steps
    (docs/workloads.md): the configs use it only in timed-only runs without reduce-overhead,
    and every ladder compiles all its rungs one way."""
    plan = config.load(REPO / name)
    regional = {n: p for n, p in plan.runs.items()
                if p.get("compile", "off") != "off" and p.get("compile_blocks") == "regional"}
    for run, params in regional.items():
        assert run not in plan.profiled, run
        assert params["compile"] != "reduce-overhead", run
    if name == "config/full.yaml":  # its best-settings sweep: 40 runs (5 sizes, 2 modes, 4 ctx)
        assert len(regional) == 40 and all("_best_ctx" in run for run in regional)
    for ladder in yaml.safe_load((REPO / name).read_text()).get("ladders", []):
        assert all("compile_blocks" not in rung for rung in ladder["rungs"])
        assert "compile_blocks" not in ladder["base"]


@pytest.mark.parametrize("name", ["config.yaml", "config/standard.yaml", "config/full.yaml"])
def test_shipped_ladders_change_one_key_per_rung(name: str) -> None:
    """A rung's gain is credited to its change only when that change is the only difference
    (the attention implementation and its SDPA backend are one change)."""
    cfg = yaml.safe_load((REPO / name).read_text())
    for ladder in cfg.get("ladders", []):
        for rung in ladder["rungs"][1:]:
            # the pipeline's own keys (what is captured) change nothing the rung measures
            changes = set(rung) - {"name"} - set(config.PIPELINE_RUN_KEYS)
            if "attention" in changes:
                changes -= {"sdpa_backend"}
            assert len(changes) == 1, (name, rung)
