"""Overview tables on real results: the published H100 summaries (made by the pipeline)."""

from __future__ import annotations

import pandas as pd
from conftest import REPO

from analysis.outputs.overview import modes_table

PUBLISHED = REPO / "published" / "h100-2026-11-22b"


def test_modes_table_pairs_a_ladders_first_and_last_rung() -> None:
    summary = pd.read_csv(PUBLISHED / "default" / "summary.csv")
    table = modes_table(summary)
    train = table[table["mode"] == "train"]
    assert list(train["run"]) == ["gpt_train_small_0_fp32_eager", "gpt_train_small_3_cuda_graphs"]
    first = summary.set_index("run").loc["gpt_train_small_0_fp32_eager"]
    assert train.iloc[0]["ms/step [95% CI]"].startswith(f"{first['step_ms']:.2f} [")
    # captured: the phase GPU time the capture measured, as in summary.csv
    assert f"opt {first['phase_gpu_ms_optimizer_step']:.2f}" in train.iloc[0][
        "GPU ms per phase (capture)"]


def test_modes_table_finds_the_same_configuration_in_other_modes() -> None:
    """A forward run with the first rung's keys joins its row; one with other keys does not."""
    summary = pd.read_csv(PUBLISHED / "default" / "summary.csv")
    rung0 = summary[summary["run"] == "gpt_train_small_0_fp32_eager"].iloc[0]
    same = rung0.copy()
    same[["run", "mode", "ladder", "ladder_group", "rung_index", "rung"]] = [
        "fwd_same", "forward", None, None, None, None]
    other = same.copy()
    other[["run", "dtype"]] = ["fwd_bf16", "bf16"]
    table = modes_table(pd.concat([summary, pd.DataFrame([same, other])], ignore_index=True))
    rows = table[(table["configuration"] == "fp32_eager")]
    assert list(rows["mode"]) == ["forward", "train"]
    assert list(rows["run"]) == ["fwd_same", "gpt_train_small_0_fp32_eager"]
