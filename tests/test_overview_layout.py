"""The overview at report width, laid out by headless Chromium: regenerated from the published
H100 standard results (and, in the slow suite, from the CPU smoke pipeline), it fits 1400 px
without a table wider than its column, shows the findings within the first 2000 px and is at
most 3,967 px tall."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO
from page_layout import WIDTH, measure
from test_pipeline import (  # noqa: F401  (outbound_requests is a fixture)
    browser_flags,
    chromium,
    outbound_requests,
    page_requests,
    results,
)

from analysis.outputs.overview import key_figures, write_overview
from analysis.outputs.overview_page import Grid, Heading, to_html

STANDARD = REPO / "published" / "h100" / "standard"
FINDINGS_BY = 2000  # px from the top: the first screen or two
MAX_HEIGHT = 3_967  # px: the whole overview, figures included, in about four screens
ORDER = ["Optimization ladder", "Best configuration per model", "Top findings", "Experiments",
         "Flagged runs", "Key figures"]


def _overview(results_dir: Path, out: Path) -> Path:
    html = out / "overview.html"
    write_overview(results_dir, out / "SUMMARY.md", html, key_figures(results_dir))
    return html


def _check_fits(layout: dict) -> None:
    assert layout["wide"] == [], f"tables wider than their column: {layout['wide']}"
    assert layout["cut"] == [], f"clipped cells: {layout['cut']}"
    assert layout["width"] <= WIDTH, layout["width"]
    assert layout["starts"]["Top findings"] is not None
    assert layout["starts"]["Top findings"] <= FINDINGS_BY, layout["starts"]
    assert layout["height"] <= MAX_HEIGHT, layout["height"]


def test_standard_overview_fits_the_first_screens(
    tmp_path: Path, outbound_requests: tuple[list[str], str]  # noqa: F811
) -> None:
    seen, proxy = outbound_requests
    page = _overview(STANDARD, tmp_path)
    layout = measure(page, chromium(), browser_flags(tmp_path / "profile", proxy), ORDER,
                     tmp_path)
    _check_fits(layout)
    tops = [layout["starts"][h] for h in ORDER]
    assert None not in tops and tops == sorted(tops), layout["starts"]
    assert page_requests(seen) == [], seen


def test_the_measure_sees_a_table_wider_than_the_page(
    tmp_path: Path, outbound_requests: tuple[list[str], str]  # noqa: F811
) -> None:
    """The layout check itself: a row of numbers no browser can wrap overflows."""
    seen, proxy = outbound_requests
    page = tmp_path / "wide.html"
    wide = Grid(["run"] + [f"value {i}" for i in range(40)],
                [["a"] + [f"{1000 + i}.25 [{i}.0, {i}.5]" for i in range(40)]])
    page.write_text(to_html([Heading("Top findings"), wide], tmp_path))
    layout = measure(page, chromium(), browser_flags(tmp_path / "profile", proxy), ["Top"],
                     tmp_path)
    assert layout["wide"] and layout["width"] > WIDTH


@pytest.mark.slow
def test_cpu_smoke_overview_fits_and_names_the_cpu(
    smoke_workdir: Path, tmp_path: Path, outbound_requests: tuple[list[str], str]  # noqa: F811
) -> None:
    seen, proxy = outbound_requests
    out = results(smoke_workdir)
    page = _overview(out, tmp_path)
    layout = measure(page, chromium(), browser_flags(tmp_path / "profile", proxy), ORDER,
                     tmp_path)
    _check_fits(layout)
    cpu = pd.read_csv(out / "summary.csv")["device_name"].dropna().iloc[0]
    header = (tmp_path / "SUMMARY.md").read_text().splitlines()[2]
    assert header.startswith(f"CPU: {cpu} · torch "), header
    assert "driver" not in header and "CUDA" not in header and "?" not in header
    assert page_requests(seen) == [], seen
