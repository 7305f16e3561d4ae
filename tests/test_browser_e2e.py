"""The dashboard in a real browser: `dashboard` server + headless Chromium.

Starts the installed `dashboard` command on a free port over a runs folder
with good and bad runs, waits for /_stcore/health, and drives Debian's
chromium through Playwright (never Playwright's own browser download) to
the runs page and a run page. Fails on any browser console error.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    GOOD_RUN,
    MANY_RANKS_RUN,
    NO_MANIFEST_RUN,
    TRUNCATED_RUN,
    build_runs_dir,
    start_dashboard,
    stop_dashboard,
    write_many_rank_traces,
)

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="/usr/bin/chromium is absent (CI installs Debian's chromium in .ci/run; locally: apt-get install chromium)",
)

# Cold analysis of a run on a busy 2-core machine takes seconds; be generous.
RENDER_TIMEOUT_MS = 180_000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    runs = build_runs_dir(root / "runs")
    # Above dashboard.ui.FEW_RANKS, so its pages take their many-rank form (rank axes, top-k, pickers).
    write_many_rank_traces(runs / MANY_RANKS_RUN, world=24, straggler=7)
    proc, url = start_dashboard(runs, root / "dashboard.log")
    try:
        yield url, runs, root
    finally:
        stop_dashboard(proc)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


# Opening a page URL such as /overview directly, Streamlit's frontend first
# looks for the server under that path (/overview/_stcore/health and
# /host-config), gets 404, then finds it at the root. Those two probes are
# the only failed requests and console errors we excuse.
_BASE_PATH_PROBE = re.compile(r"^http://127\.0\.0\.1:\d+/[a-z]+/_stcore/(health|host-config)$")
_FAILED_LOAD = "Failed to load resource: the server responded with a status of 404"


@pytest.fixture
def page(browser):
    """A fresh page that records console errors, page errors and failed requests."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    console: list[str] = []
    failed: list[str] = []
    pg.on("console", lambda msg: console.append(msg.text) if msg.type == "error" else None)
    pg.on("pageerror", lambda exc: console.append(f"uncaught: {exc}"))
    pg.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    # A request the browser cancelled (net::ERR_ABORTED: the test navigated on
    # while Streamlit was still fetching a lazily loaded chunk) is no failure
    # of the app; a missing file is a 404 response and a dead server another
    # error, both still recorded.
    pg.on(
        "requestfailed",
        lambda r: failed.append(f"failed {r.url} ({r.failure})") if r.failure != "net::ERR_ABORTED" else None,
    )

    def problems() -> list[str]:
        excused = [f for f in failed if f.startswith("404 ") and _BASE_PATH_PROBE.match(f[4:])]
        bad = [f for f in failed if f not in excused]
        errors = list(console)
        for _ in excused:  # one "Failed to load resource" console line per excused 404
            match = next((e for e in errors if _FAILED_LOAD in e), None)
            if match is not None:
                errors.remove(match)
        return bad + errors

    pg.problems = problems
    yield pg
    context.close()


def _wait_idle(pg) -> None:
    """Wait until Streamlit has finished running the script for this page."""
    pg.wait_for_selector('[data-testid="stApp"]', timeout=RENDER_TIMEOUT_MS)
    pg.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
        " || !document.querySelector('[data-testid=\"stStatusWidget\"]').innerText.includes('Running')",
        timeout=RENDER_TIMEOUT_MS,
    )


def test_runs_page_lists_good_and_bad_runs(server, page):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    url, runs, root = server
    page.goto(url + "/", wait_until="domcontentloaded")
    page.get_by_role("heading", name="Runs").wait_for(timeout=RENDER_TIMEOUT_MS)
    grid = page.locator('[data-testid="stDataFrame"]').first
    grid.wait_for(state="visible", timeout=RENDER_TIMEOUT_MS)
    _wait_idle(page)
    # Glide data grid renders to canvas and keeps an accessible table in the DOM,
    # filled in a moment after the grid appears: wait for the rows, then assert.
    for name in (GOOD_RUN, TRUNCATED_RUN, NO_MANIFEST_RUN):
        try:
            page.wait_for_function(
                "name => [...document.querySelectorAll('[data-testid=\"stDataFrame\"]')]"
                ".some(el => el.innerHTML.includes(name))",
                arg=name,
                timeout=RENDER_TIMEOUT_MS,
            )
        except PlaywrightTimeout:
            pass  # the assertion below names what is missing
    html = grid.inner_html()
    for name in (GOOD_RUN, TRUNCATED_RUN, NO_MANIFEST_RUN):
        assert name in html, f"{name} missing from the runs table"
    page.get_by_text("run(s) have errors").wait_for(timeout=RENDER_TIMEOUT_MS)
    page.screenshot(path=str(root / "runs_page.png"), full_page=True)
    assert page.problems() == []


def test_run_page_shows_mfu_and_a_chart(server, page):
    url, runs, root = server
    page.goto(f"{url}/overview?run={quote(GOOD_RUN)}", wait_until="domcontentloaded")
    mfu = page.locator('[data-testid="stMetric"]', has_text="MFU").first
    mfu.wait_for(state="visible", timeout=RENDER_TIMEOUT_MS)
    value = mfu.locator('[data-testid="stMetricValue"]').inner_text()
    assert value.endswith("%") and float(value.rstrip("%")) > 0, value
    # The breakdown is the first chart after its heading (the goodput bar above it is a reftrain
    # run's first chart).
    chart = page.locator(
        "xpath=//*[normalize-space(text())='Step-time breakdown per rank']"
        "/following::*[@data-testid='stVegaLiteChart'][1]"
    ).locator("svg.marks")
    chart.wait_for(state="visible", timeout=RENDER_TIMEOUT_MS)
    assert chart.bounding_box()["height"] > 100
    # Vega drew the stacked breakdown: one rect mark per (rank, part), 2 ranks
    # and at least 3 parts on this run (the bars are SVG paths of the first chart).
    bars = chart.locator("g.mark-rect path")
    bars.first.wait_for(timeout=RENDER_TIMEOUT_MS)
    assert bars.count() >= 6 and bars.count() % 2 == 0, bars.count()
    _wait_idle(page)
    page.screenshot(path=str(root / "run_page.png"), full_page=True)
    assert (root / "run_page.png").stat().st_size > 10_000
    assert page.problems() == []


def test_run_page_draws_the_training_curve_with_profiled_steps(server, page):
    """The Overview's training-curve chart in Chromium: one point per step of
    the run and one rule per profiled step (analyzer.curves' values)."""
    from analyzer.metrics.curves import training_curves
    from analyzer.ingest.rundir import read_run_dir

    url, runs, root = server
    rd = read_run_dir(runs / GOOD_RUN)
    c = training_curves(rd.manifest, rd.metrics)
    page.goto(f"{url}/overview?run={quote(GOOD_RUN)}", wait_until="domcontentloaded")
    page.get_by_role("heading", name="Training curves").wait_for(timeout=RENDER_TIMEOUT_MS)
    # The only chart with rule marks of data (profiled steps; axes' ticks are
    # role-axis-* rules) is the training curve.
    chart = page.locator('[data-testid="stVegaLiteChart"] svg.marks', has=page.locator("g.mark-rule.role-mark")).first
    chart.wait_for(state="visible", timeout=RENDER_TIMEOUT_MS)
    _wait_idle(page)
    assert chart.locator("g.mark-symbol.role-mark path").count() == len(c.series("loss"))
    assert chart.locator("g.mark-rule.role-mark line").count() == len(c.profiled_steps) > 0
    assert chart.bounding_box()["height"] > 100
    page.screenshot(path=str(root / "training_curve.png"), full_page=True)
    assert page.problems() == []


def test_refused_run_name_reads_nothing(server, page):
    url, runs, root = server
    page.goto(f"{url}/overview?run={quote('../../etc')}", wait_until="domcontentloaded")
    page.get_by_text("refused").first.wait_for(timeout=RENDER_TIMEOUT_MS)
    _wait_idle(page)
    assert page.locator('[data-testid="stMetric"]').count() == 0
    assert page.problems() == []


def test_selecting_a_run_in_the_table_opens_its_page_inside_the_app(server, page):
    """A row picked in the runs table switches to that run's overview in the
    same session (no new page load), with ?run= set for the sidebar."""
    url, runs, root = server
    page.goto(url + "/", wait_until="domcontentloaded")
    grid = page.locator('[data-testid="stDataFrame"]').first
    grid.wait_for(state="visible", timeout=RENDER_TIMEOUT_MS)
    _wait_idle(page)
    page.wait_for_function(
        "name => document.querySelector('[data-testid=\"stDataFrame\"]').innerHTML.includes(name)",
        arg=GOOD_RUN,
        timeout=RENDER_TIMEOUT_MS,
    )
    # The grid draws on a canvas; its accessible table gives the row order.
    names = grid.locator("table tbody tr").evaluate_all(
        "rows => rows.map(r => [...r.querySelectorAll('td')].map(td => td.textContent))"
    )
    row = next(i for i, cells in enumerate(names) if GOOD_RUN in cells)
    page.evaluate("() => { window.__same_document = true; }")  # gone if the page reloads
    box = grid.bounding_box()
    header_px = row_px = 35  # Streamlit's default row height, header included
    page.mouse.click(box["x"] + 14, box["y"] + header_px + row_px * row + row_px / 2)
    mfu = page.locator('[data-testid="stMetric"]', has_text="MFU").first
    mfu.wait_for(state="visible", timeout=RENDER_TIMEOUT_MS)
    _wait_idle(page)
    assert f"run={quote(GOOD_RUN)}" in page.url and "/overview" in page.url
    assert page.get_by_role("heading", name="Raw traces").count() == 1
    # Client-side navigation: the URL changed without a document load.
    assert page.evaluate("() => window.__same_document === true")
    # Back on the Runs page the table starts without a selection (it does
    # not bounce to the run again).
    page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name="Runs").click()
    page.get_by_role("heading", name="Runs").wait_for(timeout=RENDER_TIMEOUT_MS)
    _wait_idle(page)
    page.wait_for_timeout(1500)
    _wait_idle(page)
    assert page.get_by_role("heading", name="Runs").count() == 1
    assert page.locator('[data-testid="stMetric"]').count() == 0
    assert page.problems() == []


def test_stragglers_page_of_many_ranks_draws_its_heatmap_and_top_k(server, page):
    """24 ranks: the heatmap's rank axis, the slowest ranks' table and the rank picker, no console error."""
    url, runs, root = server
    page.goto(f"{url}/stragglers?run={quote(MANY_RANKS_RUN)}", wait_until="domcontentloaded")
    page.get_by_role("heading", name="The 16 slowest ranks").wait_for(timeout=RENDER_TIMEOUT_MS)
    heat = page.locator('[data-testid="stPlotlyChart"]').first
    heat.locator(".main-svg").first.wait_for(timeout=RENDER_TIMEOUT_MS)
    # Plotly draws a heatmap as one image in its plot layer, whatever the number of ranks.
    heat.locator("g.heatmaplayer image").first.wait_for(state="attached", timeout=RENDER_TIMEOUT_MS)
    assert heat.bounding_box()["height"] < 1000
    page.get_by_text("persistent straggler(s): rank 7,", exact=False).first.wait_for(timeout=RENDER_TIMEOUT_MS)
    _wait_idle(page)
    page.screenshot(path=str(root / "stragglers_many.png"), full_page=True)
    assert page.problems() == []
