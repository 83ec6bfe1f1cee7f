"""The Snakemake report opens on the answer: its first page (the landing text the overview rule
writes) shows the headline table and the top findings, in a real browser at report width (no
table wider than its column, the findings within the first 2000 px), and quotes the settings
of the config that ran."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import SMOKE_CONFIG, snakemake
from page_layout import WIDTH, measure
from test_pipeline import (  # noqa: F401  (outbound_requests is a fixture)
    PNG_MAGIC,
    browser_flags,
    chromium,
    outbound_requests,
    page_requests,
    results,
)

pytestmark = pytest.mark.slow

SMOKE = yaml.safe_load(SMOKE_CONFIG.read_text())


@pytest.fixture(scope="module")
def report(smoke_workdir: Path) -> Path:
    path = smoke_workdir / "report-landing.html"
    snakemake(smoke_workdir, "--report", str(path), "--configfile", str(SMOKE_CONFIG))
    return path


def visible_text(dom: str) -> str:
    text = re.sub(r"<script.*?</script>|<style.*?</style>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text))


def test_first_page_shows_headline_and_findings(
    report: Path, smoke_workdir: Path, tmp_path: Path, outbound_requests  # noqa: F811
) -> None:
    seen, proxy = outbound_requests
    flags = browser_flags(tmp_path / "profile", proxy)
    dom = subprocess.run([chromium(), *flags, "--dump-dom", report.as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    text = visible_text(dom)
    out = results(smoke_workdir)
    head = pd.read_csv(out / "ladders" / "ladder_tiny.csv")
    best = head.loc[head["step_ms"].idxmin()]
    assert "Best configuration per model" in text
    assert str(best["rung"]) in text
    findings = pd.read_csv(out / "findings.csv")
    assert len(findings) >= 3
    shown = [f for f in findings["title"] if f.split(":")[0] in text]
    assert len(shown) >= 3, (findings["title"].tolist(), text[:3000])
    # the settings it quotes are the config's (the smoke config keeps the schema's trace)
    trace = SMOKE.get("nsys", {}).get("trace", "cuda,nvtx,osrt")
    assert f"--trace={trace}" in text
    assert f"median of {SMOKE['timing']['repeats']} untraced" in text
    # at report width: no table wider than the page's column, the findings on the first screens
    layout = measure(report, chromium(), flags, ["Top findings"], tmp_path)
    assert layout["wide"] == [] and layout["width"] <= WIDTH, layout
    assert layout["starts"]["Top findings"] is not None
    assert layout["starts"]["Top findings"] <= 2000, layout["starts"]
    shot = tmp_path / "landing.png"
    subprocess.run([chromium(), *flags, "--window-size=1400,1000", f"--screenshot={shot}",
                    report.as_uri()], capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == PNG_MAGIC
    (out / "report_landing.png").write_bytes(shot.read_bytes())
    assert page_requests(seen) == [], seen
