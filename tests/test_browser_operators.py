"""The Operators and Modules pages in a real browser: the
`dashboard` server over the synthetic two-rank H100 trace with shapes, modules
and a backward pass (tests/test_dashboard_operators.py), headless Chromium.

Checks that Vega drew the roofline's points, roofs and ridge point, and the
forward and backward icicles' bars, as many as the analyzer's tables have
rows, with no console error. The Timeline page's critical path, on the same
server: what the analyzer computed for rank 0 (the bound breakdown of each
step as a stacked bar of six categories, the step's top op on the path), and
the overlaid trace it offers downloads, loads back in our own loader, and
marks as many events as the analyzer's overlay.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_support import start_dashboard, stop_dashboard
from test_browser_e2e import RENDER_TIMEOUT_MS, _wait_idle, browser, page, pytestmark  # noqa: F401 (fixtures)
from test_dashboard_operators import SHAPED_RUN, write_shaped_gpu_traces

from analyzer.api import analyze
from analyzer.ingest.load import load_traces
from analyzer.verbs.critical_trace import MARK_ARG, critical_path_trace, rank_trace_file


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e-operators")
    runs = root / "runs"
    write_shaped_gpu_traces(runs / SHAPED_RUN)
    proc, url = start_dashboard(runs, root / "dashboard.log")
    try:
        yield url, runs, root
    finally:
        stop_dashboard(proc)


def test_operators_page_draws_the_roofline(server, page):  # noqa: F811 (the imported fixture)
    url, runs, root = server
    rf = analyze(runs / SHAPED_RUN).roofline()
    page.goto(f"{url}/operators?run={SHAPED_RUN}", wait_until="domcontentloaded")
    page.get_by_role("heading", name="Roofline").wait_for(timeout=RENDER_TIMEOUT_MS)
    chart = page.locator('[data-testid="stVegaLiteChart"] svg.marks').first
    chart.wait_for(state="visible", timeout=RENDER_TIMEOUT_MS)
    _wait_idle(page)
    symbols = chart.locator("g.mark-symbol.role-mark")
    assert symbols.count() == 2, symbols.count()  # the ops' points, then the ridge points
    assert symbols.nth(0).locator("path").count() == len(rf.points) == 3
    assert symbols.nth(1).locator("path").count() == len(rf.roofs) == 1
    # Two roofs (memory, bf16 compute), each one line.
    assert chart.locator("g.mark-line.role-mark path").count() == 2
    label = chart.locator("g.mark-text.role-mark").text_content()
    assert f"ridge bf16: {rf.roofs['ridge_flop_per_byte'].item():.0f} FLOP/B" in label, label
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-testid=\"stDataFrame\"]')].some(el => el.innerHTML.includes('aten::addmm'))",
        timeout=RENDER_TIMEOUT_MS,
    )
    page.screenshot(path=str(root / "operators.png"), full_page=True)
    assert page.problems() == []


def test_modules_page_draws_both_icicles(server, page):  # noqa: F811 (the imported fixture)
    url, runs, root = server
    mods = analyze(runs / SHAPED_RUN).attribution.summed("modules")
    page.goto(f"{url}/modules?run={SHAPED_RUN}", wait_until="domcontentloaded")
    page.get_by_role("heading", name="Modules").wait_for(timeout=RENDER_TIMEOUT_MS)
    charts = page.locator('[data-testid="stVegaLiteChart"] svg.marks')
    charts.nth(1).wait_for(state="visible", timeout=RENDER_TIMEOUT_MS)
    _wait_idle(page)
    assert charts.count() == 2
    for i, backward in enumerate((False, True)):
        drawn = mods.loc[(mods["backward"] == backward) & (mods["device_ms"] > 0) & (mods["depth"] <= 3)]
        bars = charts.nth(i).locator("g.mark-rect.role-mark path")
        assert bars.count() == len(drawn) > 0, (backward, bars.count(), len(drawn))
    page.screenshot(path=str(root / "modules.png"), full_page=True)
    assert page.problems() == []


def test_timeline_page_shows_the_critical_path_and_its_overlay(server, page):  # noqa: F811 (the imported fixture)
    url, runs, root = server
    ra = analyze(runs / SHAPED_RUN, critical_path=True)
    mine = ra.critical_path.for_rank(0)
    assert [p.step for p in mine] == [3, 4]
    top_op = str(mine[0].ops["name"].iloc[0])
    overlay = critical_path_trace(rank_trace_file(ra, 0))
    page.goto(f"{url}/timeline?run={SHAPED_RUN}", wait_until="domcontentloaded")
    page.get_by_role("heading", name="Critical path").wait_for(timeout=RENDER_TIMEOUT_MS)
    _wait_idle(page)
    # The bound chart: one stacked bar series per HTA category, one bar per profiled step.
    chart = page.locator(".js-plotly-plot").filter(has_text="What bounds the critical path")
    chart.wait_for(state="visible", timeout=RENDER_TIMEOUT_MS)
    assert chart.locator("g.trace.bars").count() == 6
    drawn = chart.locator("g.trace.bars g.point path")
    nonzero = sum(1 for p in mine for v in p.breakdown_pct.values() if v > 0)
    assert drawn.count() >= nonzero > 0, (drawn.count(), nonzero)
    page.wait_for_function(
        "name => [...document.querySelectorAll('[data-testid=\"stDataFrame\"]')].some(el => el.innerHTML.includes(name))",
        arg=top_op,
        timeout=RENDER_TIMEOUT_MS,
    )
    page.get_by_text("Make rank 0's trace with the critical path marked").click()
    button = page.get_by_role(
        "button", name=f"Download rank 0's critical-path trace ({overlay.n_marked:,} events marked"
    )
    button.wait_for(timeout=RENDER_TIMEOUT_MS)
    with page.expect_download(timeout=RENDER_TIMEOUT_MS) as info:
        button.click()
    saved = root / "overlay.json.gz"
    info.value.save_as(saved)
    doc = json.loads(gzip.decompress(saved.read_bytes()))
    marked = sum(1 for e in doc["traceEvents"] if e["ph"] == "X" and e["args"].get(MARK_ARG) == 1)
    assert marked == overlay.n_marked > 0
    back = load_traces([saved], cache=False, progress=False)
    assert list(back.ranks) == [0] and back.ranks[0].steps["step"].tolist() == [3, 4]
    page.screenshot(path=str(root / "timeline-critical-path.png"), full_page=True)
    assert page.problems() == []
