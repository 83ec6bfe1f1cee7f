"""`workload: model`: a user's model through profbench's step, its module ranges and module
table, its bad inputs, and the example models through the real pipeline on the CPU."""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, snakemake, stopped
from markdown_tables import table_under
from test_cpu_findings import ranked_by_cpu

from analysis.metrics.extras import RunInputs, compute_extras
from analysis.outputs.diff_load import Run
from analysis.outputs.diff_markdown import _part_md as part_md
from analysis.outputs.diff_verdicts import explain_run
from analysis.outputs.overview_ops import NO_MODULES, module_tables
from analysis.outputs.overview_tables import read_ladders
from analysis.reading.export import Export
from pipeline.config import ConfigError, resolve, run_schemas, workload_args
from workloads import flops
from workloads.gpt import GPT, config_for
from workloads.models.builder import count_step_flops
from workloads.module_ranges import ModuleRanges

FIXTURES = REPO / "tests" / "fixtures" / "h100" / "models"
MODELS_SMOKE = REPO / "tests" / "models_smoke.yaml"

# A user's model in a file of its own, outside the repository: a small CNN whose residual
# block feeds one input to two children and whose ReLUs work in place.
USER_MODEL = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Block(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.conv = nn.Conv2d(width, width, 3, padding=1)
            self.bn = nn.BatchNorm2d(width)
            self.relu = nn.ReLU(inplace=True)
            self.shortcut = nn.Conv2d(width, width, 1)

        def forward(self, x):
            return self.relu(self.bn(self.conv(x))) + self.shortcut(x)


    class Net(nn.Module):
        def __init__(self, width=8):
            super().__init__()
            self.stem = nn.Conv2d(3, width, 3, padding=1)
            self.blocks = nn.Sequential(Block(width), Block(width))
            self.head = nn.Linear(width, 10)

        def forward(self, x):
            return self.head(self.blocks(F.relu(self.stem(x))).mean((2, 3)))


    def make(width=8):
        def batch(n, device):
            g = torch.Generator().manual_seed(0)
            images = torch.randn(n, 3, 16, 16, generator=g)
            return images.to(device), torch.randint(0, 10, (n,), generator=g).to(device)

        return Net(width), batch, lambda out, labels: F.cross_entropy(out, labels)


    def make_broken():
        raise RuntimeError("the factory's own bug")


    def make_wrong():
        return Net()
""")


@pytest.fixture()
def user_model(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "my_cnn.py"
    path.parent.mkdir()
    path.write_text(USER_MODEL)
    return path


def _workload(args: list[str], out: Path, env: dict[str, str] | None = None
              ) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run([sys.executable, "-m", "workloads", "model", *args, "--out", str(out),
                           "--device", "cpu", "--warmup", "1", "--steps", "1"],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    return done, json.loads(out.read_text())


# --- the interface: options, schema, command line --------------------------------------------


def test_schema_and_flags_come_from_the_options_dataclass() -> None:
    schema = run_schemas()["model"]
    assert "factory" in schema["required"] and schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["kwargs"]["type"] == "object" and props["channels_last"]["type"] == "boolean"
    assert props["mode"]["enum"] == ["forward", "forward_backward", "train"]
    assert {"dtype", "compile", "cuda_graph", "warmup"} <= set(props)  # the shared keys
    done = subprocess.run([sys.executable, "-m", "workloads", "model", "--help"], cwd=REPO,
                          capture_output=True, text=True, check=True)
    for flag in ("--factory", "--kwargs", "--channels-last", "--module-depth", "--dtype"):
        assert flag in done.stdout
    args = workload_args({"workload": "model", "factory": "a.py:make", "kwargs": {"w": 2}})
    assert "--kwargs '{\"w\": 2}'" in args


def test_unknown_key_of_a_model_run_is_refused(user_model: Path) -> None:
    cfg = {"runs": {"mine": {"workload": "model", "factory": f"{user_model}:make",
                             "widht": 3}}}
    with pytest.raises(ConfigError, match=r"runs\.mine\.widht.*unknown parameter"):
        resolve(cfg)


# --- bad input ---------------------------------------------------------------------------------


def test_a_factory_that_cannot_be_imported_is_named_before_any_job(tmp_path: Path,
                                                                 user_model: Path) -> None:
    with pytest.raises(ConfigError, match=r"runs\.mine\.factory.*No module named 'nowhere'"):
        resolve({"runs": {"mine": {"workload": "model", "factory": "nowhere.at_all:make"}}})
    with pytest.raises(ConfigError, match=r"runs\.gone\.factory.*does not exist"):
        resolve({"runs": {"gone": {"workload": "model", "factory": "/no/such/file.py:make"}}})
    with pytest.raises(ConfigError, match=r"has no callable 'nothing'"):
        resolve({"runs": {"x": {"workload": "model", "factory": f"{user_model}:nothing"}}})
    # through Snakemake: stopped while it reads the config, no job started
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"results": "results", "runs": {
        "mine": {"workload": "model", "factory": "nowhere.at_all:make"}}}))
    done = snakemake(tmp_path, "--cores", "1", "--configfile", str(config), check=False)
    assert done.returncode != 0
    assert "runs.mine.factory" in done.stderr and "nowhere" in done.stderr
    assert not (tmp_path / "results").exists()


# Factories that the source shows are wrong, and one whose source does not say (a partial).
BAD_FACTORIES = textwrap.dedent("""
    import functools

    import torch
    from torch import nn


    class Encoder(nn.Module):
        def __init__(self, d_model=8):
            super().__init__()
            self.proj = nn.Linear(16, d_model)

        def forward(self, x):
            return self.proj(x)


    def make(d_model: int = 8, n_layers: int = 2):
        def make_batch(batch_size, device):
            return torch.randn(batch_size, 16).to(device), None

        return Encoder(d_model), make_batch, None


    def make_model_only(d_model: int = 8):
        model = Encoder(d_model)
        return model


    def make_one_argument_batch(d_model: int = 8):
        def make_batch(batch_size):
            return torch.randn(batch_size, 16), None

        return Encoder(d_model), make_batch, None


    make_partial = functools.partial(make, n_layers=1)


    def make_twice(d_modle: int = 8):  # replaced below: an import gives the last one
        return make(d_modle)


    def make_twice(d_model: int = 8):
        return make(d_model)
""")

# (factory, kwargs, the key named, what the message must say)
BAD_FACTORY_CASES = [
    ("make", {"d_modle": 4}, "kwargs.d_modle",
     "takes no keyword 'd_modle'; did you mean 'd_model'? (it accepts ['d_model', 'n_layers'])"),
    ("make_model_only", {}, "factory", "returns only the model (Encoder(d_model)); it must "
     "return ModelParts(model, make_batch, loss) or the tuple (model, make_batch, loss)"),
    ("make_one_argument_batch", {}, "factory", "make_batch(batch_size), cannot be called as "
     "make_batch(batch_size, device)"),
    ("make_twice", {"d_modle": 4}, "kwargs.d_modle", "(it accepts ['d_model'])"),
    # last: the only one that imports the file (and torch)
    ("make_partial", {"d_modle": 4}, "kwargs.d_modle", "did you mean 'd_model'?"),
]


def test_a_bad_factory_is_refused_from_its_source_before_any_import(tmp_path: Path) -> None:
    """Each bad factory is named with its key and what it must be; the three that its source
    shows are refused without importing the file (nor torch: 1.4-2.5 s of a start-up that
    otherwise takes about 1.2 s), the partial once its file is imported."""
    path = tmp_path / "encoders.py"
    path.write_text(BAD_FACTORIES)
    script = textwrap.dedent(f"""
        import json, sys
        from pipeline.config import ConfigError, resolve
        out = []
        for fn, kwargs in {[(c[0], c[1]) for c in BAD_FACTORY_CASES]!r}:
            run = {{"workload": "model", "factory": {str(path)!r} + ":" + fn, "kwargs": kwargs}}
            try:
                resolve({{"runs": {{"enc": run}}}})
                out.append([fn, None, "torch" in sys.modules])
            except ConfigError as err:
                out.append([fn, str(err), "torch" in sys.modules])
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, check=True, timeout=120)
    results = json.loads(done.stdout)
    for (fn, _, key, said), (_, message, torch_imported) in zip(BAD_FACTORY_CASES, results,
                                                                 strict=True):
        assert message is not None, f"{fn} was accepted"
        assert message.startswith(f"Invalid config at 'runs.enc.{key}'"), message
        assert said in message, message
        assert torch_imported == (fn == "make_partial"), (fn, torch_imported)


def test_a_bad_factory_stops_snakemake_before_any_job(tmp_path: Path) -> None:
    path = tmp_path / "encoders.py"
    path.write_text(BAD_FACTORIES)
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"results": "results", "runs": {"enc": {
        "workload": "model", "factory": f"{path}:make", "kwargs": {"d_modle": 4}}}}))
    message = stopped(tmp_path, "--configfile", str(config))
    assert "Invalid config at 'runs.enc.kwargs.d_modle'" in message, message[-3000:]


def test_a_factory_that_raises_is_a_failure_record_with_its_traceback(tmp_path: Path,
                                                                    user_model: Path) -> None:
    done, record = _workload(["--factory", f"{user_model}:make_broken"], tmp_path / "r.json")
    assert done.returncode == 1 and record["status"] == "error"
    assert "the factory's own bug" in record["message"]
    assert "make_broken" in done.stderr and "Traceback" in done.stderr


def test_a_factory_returning_the_wrong_thing_says_what_it_must_return(
        tmp_path: Path, user_model: Path) -> None:
    done, record = _workload(["--factory", f"{user_model}:make_wrong"], tmp_path / "r.json")
    assert record["status"] == "error" and done.returncode != 0
    assert "must return ModelParts(model, make_batch, loss)" in record["message"]
    assert "it returned Net" in record["message"]


# --- the step: module ranges, FLOPs ----------------------------------------------------------


def _user_net(user_model: Path) -> tuple[torch.nn.Module, tuple, object]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("my_cnn_test", user_model)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return module.make()


def test_module_ranges_change_no_gradient_and_close_every_range(user_model: Path) -> None:
    """The hooks and views leave the gradients bit for bit, in-place ReLUs included; every
    backward range is closed by autograd except those of modules whose inputs need no
    gradient (the stem), which close_open ends."""
    model, make_batch, loss = _user_net(user_model)
    images, labels = make_batch(4, torch.device("cpu"))
    loss(model(images), labels).backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    ranges = ModuleRanges(model, depth=3)
    assert "blocks.0.shortcut" in ranges.paths and "" not in ranges.paths
    loss(model(images), labels).backward()
    left_open = {call.name for call in ranges.open_calls}
    assert left_open <= {"module:stem"}, left_open
    ranges.close_open()
    assert not ranges.open_calls
    for name, param in model.named_parameters():
        assert torch.equal(param.grad, plain[name]), name
    ranges.remove()
    assert not model._forward_hooks and not model.stem._forward_pre_hooks


def test_flop_counter_agrees_with_the_gpt_analytic_count() -> None:
    """FlopCounterMode on one eager step of the built-in GPT (naive attention: every matmul
    counted, as the analytic count does) within 2% of workloads/flops.py."""
    cfg = config_for("small", context_length=128, attention="naive")
    torch.manual_seed(0)
    model = GPT(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (1, 128))

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    counted = count_step_flops(model, tokens, tokens, loss, "forward_backward", "fp32",
                               torch.device("cpu"))
    analytic = flops.gpt_forward_flops(cfg, 1, 128)
    assert counted["forward"] == pytest.approx(analytic, rel=0.02)
    assert counted["step"] == pytest.approx(flops.step_flops(analytic, "forward_backward"),
                                            rel=0.02)


# --- the module table on real H100 captures ----------------------------------------------------


def _module_table(name: str) -> tuple[list[dict[str, str]], dict]:
    folder = FIXTURES / name
    trace = folder / "torch_trace"
    run = RunInputs.load(folder / "times.json", trace if trace.is_dir() else None)
    with Export(folder / "profile.sqlite") as ex:
        extras = compute_extras(ex, run=run)
    table = extras.tables["module_table.csv"]
    return [dict(zip(table.header, row, strict=True)) for row in table.rows], extras.metrics


@pytest.mark.parametrize("name", ["model_eager", "model_compiled", "model_regional",
                                  "gpt2_compiled", "gpt2_full_compiled"])
def test_module_table_covers_forward_and_backward(name: str) -> None:
    """Eager (module ranges), compiled (Inductor provenance), regionally compiled (both) and a
    HuggingFace GPT-2 (tiny and full size): at least 90% of the forward and backward GPU time
    lands in some module, in both directions. (The in-place ResNet capture, made with earlier
    hooks, fails the table's self-check: tests/test_module_checks.py.)"""
    rows, metrics = _module_table(name)
    assert metrics["module_coverage"] >= 0.9
    layers = [r for r in rows if r["Layer"] and r["Layer"] == r["Module"]]
    assert len(layers) >= 2
    for row in layers:
        assert float(row["Forward GPU ms/step"]) > 0 and float(row["Backward GPU ms/step"]) > 0
    assert any(r["Sublayer"] for r in rows)


def test_diff_compares_an_eager_and_a_compiled_rung_by_module_path(tmp_path: Path) -> None:
    """`analysis diff` of the eager and the compiled H100 capture of one model: the compiled
    rung has no module ranges, its module table comes from Inductor's provenance; the diff
    compares the two tables by module path, every layer on both sides, none "not
    comparable", while the eager side's module:... NVTX ranges are."""
    runs = {}
    for side, name in (("old", "model_eager"), ("new", "model_compiled")):
        rows, _ = _module_table(name)
        folder = tmp_path / side / "model"
        (folder / "stats").mkdir(parents=True)
        shutil.copy(FIXTURES / name / "times.json", folder / "times.json")
        with open(folder / "stats" / "module_table.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        runs[side] = Run("model", [folder])
    explained = explain_run(runs["old"], runs["new"], -1.0)
    assert explained.module_basis == "gpu"
    modules = explained.modules.set_index("key")
    layers = [m for m in modules.index if m.startswith("layers.") and m.count(".") == 1]
    assert len(layers) >= 2
    for layer in layers:
        assert modules.loc[layer, "comparable"] == ""
        assert modules.loc[layer, "old_ms_per_step"] > 0
        assert modules.loc[layer, "new_ms_per_step"] > 0
    # a module whose kernels Inductor fused into others' has no row of its own there
    assert modules.loc["positional_encoder", "comparable"] == (
        "not comparable (no such module in new: no kernel of its compiled code traced back "
        "to it)")
    assert pd.isna(modules.loc["positional_encoder", "delta_ms_per_step"])
    table = "\n".join(part_md("Top modules", explained.modules, 50, "module"))
    assert "| layers.0 | 0.339 | 0.118 | -0.22 | 22% |" in table and "-100%" not in table


def test_module_table_matches_an_independent_count() -> None:
    """On the eager capture, each module's forward and backward GPU ms/step equal plain SQL
    over the export: kernels, memcpys and memsets whose launch call starts inside one of the
    module's ranges (any thread of the process), split by the phase range open then."""
    rows, _ = _module_table("model_eager")
    db = sqlite3.connect(FIXTURES / "model_eager" / "profile.sqlite")
    strings = dict(db.execute("SELECT id, value FROM StringIds"))

    def ranges(name: str) -> list[tuple[int, int]]:
        return [(s, e) for s, e, text, tid in db.execute(
            "SELECT start, end, text, textId FROM NVTX_EVENTS WHERE end >= start "
            "AND eventType IN (59, 60)")
            if (text if text is not None else strings.get(tid, "")).lstrip(":") == name]

    launches = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                  "CUPTI_ACTIVITY_KIND_MEMSET"):
        launches += db.execute(
            f"SELECT r.start, k.end - k.start FROM {table} k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON r.correlationId = k.correlationId").fetchall()
    launch = np.array([t for t, _ in launches])
    dur = np.array([d for _, d in launches])

    def inside(spans: list[tuple[int, int]]) -> np.ndarray:
        mask = np.zeros(launch.size, bool)
        for s, e in spans:
            mask |= (launch >= s) & (launch <= e)
        return mask

    steps = len(ranges("profiled_step"))
    step, fwd, bwd = (inside(ranges(n)) for n in ("profiled_step", "forward_pass",
                                                  "backward_pass"))
    for row in rows:
        mine = inside(ranges(f"module:{row['Module']}")) & step
        assert float(row["Forward GPU ms/step"]) == pytest.approx(
            dur[mine & fwd].sum() / steps / 1e6, rel=1e-3, abs=1e-6), row["Module"]
        assert float(row["Backward GPU ms/step"]) == pytest.approx(
            dur[mine & bwd & ~fwd].sum() / steps / 1e6, rel=1e-3, abs=1e-6), row["Module"]


# --- the pipeline, end to end on the CPU -------------------------------------------------------


def test_user_model_and_example_models_run_through_the_pipeline(tmp_path: Path,
                                                               user_model: Path) -> None:
    """A model file outside the repository, named by path, gets untraced times with CIs, its
    ladder, module table, operator table and findings, with no edit to profbench; so do the
    three example models at CPU sizes (tests/models_smoke.yaml)."""
    config = yaml.safe_load(MODELS_SMOKE.read_text())
    config["ladders"] = [{
        "name": "my_cnn",
        "base": {"workload": "model", "factory": f"{user_model}:make", "batch": 2},
        "rungs": [{"name": "fp32_eager", "ops": True},
                  {"name": "channels_last", "channels_last": True, "ops": False},
                  # compiled on the CPU: a module table without rows, which says why
                  {"name": "compile", "compile": "default"}],
    }]
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(config))
    workdir = tmp_path / "work"
    workdir.mkdir()
    snakemake(workdir, "--cores", "2", "--configfile", str(path))
    results = workdir / config["results"]
    summary = list(csv.DictReader(open(results / "summary.csv")))
    assert {r["status"] for r in summary} == {"ok"}, [(r["run"], r["message"]) for r in summary]
    for row in summary:
        assert float(row["step_ci_low_ms"]) <= float(row["step_ms"]) <= float(
            row["step_ci_high_ms"])
    ladder = list(csv.DictReader(open(results / "ladders" / "my_cnn_all.csv")))
    assert [r["rung"] for r in ladder] == ["fp32_eager", "channels_last", "compile"]
    modules = list(csv.DictReader(open(results / "my_cnn_all_0_fp32_eager" / "stats" /
                                       "module_table.csv")))
    by_path = {r["Module"]: r for r in modules}
    assert {"stem", "blocks.0", "blocks.0.shortcut", "head"} <= set(by_path)
    assert float(by_path["blocks.0"]["Backward CPU ms/step"]) > 0
    assert (results / "my_cnn_all_0_fp32_eager" / "stats" / "ops.csv").stat().st_size > 0
    assert (results / "findings.csv").exists()
    record = json.loads((results / "resnet_tiny" / "times.json").read_text())
    assert record["structure"]["layers"] == "layer?.*" and record["flops_per_step"] > 0
    resnet = {r["Module"]: r for r in csv.DictReader(open(
        results / "resnet_tiny" / "stats" / "module_table.csv"))}
    assert resnet["layer1.0"]["Layer"] == "layer1.0"
    assert resnet["layer1.0.conv1"]["Sublayer"] == "conv1"
    # on the CPU, SUMMARY.md ranks the model's ops and modules by CPU time, and says so
    text = (results / "SUMMARY.md").read_text()
    ranked_by_cpu(*table_under(text, "### Top ops: my_cnn_all"))
    # the ladder's fastest rung's modules, whichever rung that is on this CPU
    heading = next(line for line in text.splitlines()
                   if line.startswith("### Where the step goes by module: my_cnn_all_"))
    caption, header, _ = table_under(text, heading)
    assert header[0] == "module"
    assert caption.startswith("CPU ms per step") or caption == NO_MODULES, caption
    # each rung as the fastest: the eager one by CPU time, the compiled one says why it has
    # no rows
    rungs = read_ladders(results)["my_cnn_all"]
    for rung, caption in (("fp32_eager", "CPU ms per step"), ("compile", NO_MODULES)):
        (shown,) = module_tables(results, {"my_cnn_all": rungs[rungs["rung"] == rung]})
        assert shown.grid.caption.startswith(caption), (rung, shown.grid.caption)
        assert bool(shown.grid.rows) == (rung == "fp32_eager")
    (eager,) = module_tables(results, {"my_cnn_all": rungs[rungs["rung"] == "fp32_eager"]})
    assert float(dict((r[0], r[1]) for r in eager.grid.rows)["blocks"]) > 0
