"""A run recorded by the plain-loop example, on the dashboard's Overview in real Chromium.

The recorder writes the run directory reftrain writes, so the dashboard must
show such a run's MFU (from the FLOPs the recorder measured), its goodput and
its training curves with no change: the example is trained as a user would
(a subprocess, `--runs-dir`, `--steps`), the installed `dashboard` command
serves the folder, and Playwright drives Debian's chromium to the run's page.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_support import start_dashboard, stop_dashboard
from test_browser_e2e import RENDER_TIMEOUT_MS, _wait_idle, browser, page, pytestmark  # noqa: F401 (fixtures)
from test_examples import run_example

pytest.importorskip("torch")
STEPS = 12


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("example-dashboard")
    runs = root / "runs"
    runs.mkdir()
    run = run_example("plain_loop.py", runs, "--steps", str(STEPS))
    proc, url = start_dashboard(runs, root / "dashboard.log")
    try:
        yield url, run, root
    finally:
        stop_dashboard(proc)


def _metric_value(pg, label: str) -> str:
    metric = pg.locator('[data-testid="stMetric"]', has_text=label).first
    metric.wait_for(state="visible", timeout=RENDER_TIMEOUT_MS)
    return metric.locator('[data-testid="stMetricValue"]').inner_text()


@pytest.mark.slow
def test_overview_of_a_recorded_run_shows_mfu_goodput_and_curves(server, page):  # noqa: F811 (the imported fixture)
    url, run, root = server
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["flops"]["source"] == "measured"
    page.goto(f"{url}/overview?run={quote(run.name)}", wait_until="domcontentloaded")
    mfu = _metric_value(page, "MFU")
    assert mfu.endswith("%") and float(mfu.rstrip("%")) > 0, mfu
    page.get_by_role("heading", name="Goodput").wait_for(timeout=RENDER_TIMEOUT_MS)
    goodput = _metric_value(page, "Goodput")
    # One attempt, completed: the productive steps are most of the wall time, never all of it
    # (start-up, the first step's FLOP count and the profiler window are not productive).
    assert goodput.endswith("%") and 0 < float(goodput.rstrip("%")) < 100, goodput
    # The wall-time bar is a bar, and every part of its legend is drawn inside the chart (Streamlit's default
    # autosize fitted plot and legend into the 70 px height: a 1 px bar, the legend cut after two parts).
    from analyzer.api import analyze

    n_parts = 1 + len(analyze(run).goodput().lost_s)
    wall = page.locator(
        '[data-testid="stVegaLiteChart"]', has=page.locator("g.role-legend", has_text="productive")
    ).first
    wall.wait_for(state="visible", timeout=RENDER_TIMEOUT_MS)
    svg = wall.locator("svg.marks").first.bounding_box()
    bars = wall.locator("g.mark-rect.role-mark path")
    assert max(bars.nth(i).bounding_box()["height"] for i in range(bars.count())) >= 20
    labels = wall.locator("g.role-legend-label text")
    assert labels.count() == n_parts
    for i in range(n_parts):
        box = labels.nth(i).bounding_box()
        assert svg["y"] <= box["y"] and box["y"] + box["height"] <= svg["y"] + svg["height"] + 1, labels.nth(
            i
        ).inner_text()
    page.get_by_role("heading", name="Training curves").wait_for(timeout=RENDER_TIMEOUT_MS)
    # The training curve is the only chart with rule marks of data (its profiled steps).
    chart = page.locator('[data-testid="stVegaLiteChart"] svg.marks', has=page.locator("g.mark-rule.role-mark")).first
    chart.wait_for(state="visible", timeout=RENDER_TIMEOUT_MS)
    _wait_idle(page)
    # One loss point per step the recorder wrote on rank 0.
    logged = [json.loads(line) for line in (run / "metrics" / "rank0.jsonl").read_text().splitlines() if line.strip()]
    assert chart.locator("g.mark-symbol.role-mark path").count() == len(
        [r for r in logged if r.get("loss") is not None]
    )
    assert chart.bounding_box()["height"] > 100
    # Every trace the run wrote (traces/step{N}/rank{R}.pt.trace.json.gz) is offered, under its window,
    # and the download is the file itself, saved under a name that keeps its window.
    traces = sorted((run / "traces").glob("step*/rank*.json*"))
    assert traces, sorted(p.relative_to(run).as_posix() for p in run.rglob("*"))
    page.get_by_role("heading", name="Raw traces").scroll_into_view_if_needed(timeout=RENDER_TIMEOUT_MS)
    buttons = page.locator('[data-testid="stDownloadButton"]')
    assert buttons.count() == len(traces)
    for folder in {t.parent.name for t in traces}:
        assert page.get_by_text(f"step {folder.removeprefix('step')}", exact=True).count() == 1
    with page.expect_download(timeout=RENDER_TIMEOUT_MS) as download:
        buttons.first.locator("button").click()
    assert download.value.suggested_filename == f"{traces[0].parent.name}-{traces[0].name}"
    assert Path(download.value.path()).read_bytes() == traces[0].read_bytes()
    perfetto = page.get_by_role("link", name="Open the Perfetto UI")
    assert perfetto.get_attribute("href") == "https://ui.perfetto.dev"
    assert page.locator('[data-testid="stException"]').count() == 0
    page.screenshot(path=str(root / "example_overview.png"), full_page=True)
    assert page.problems() == []
