"""The dashboard's History page in a real browser: ten runs, one of them
with an injected slow rank, and the change points marked where the gate finds them.

The runs are copies of the two example runs moved in time (tests/test_history.py's
_copy): nine of the good run and the slowed-rank run sixth, 50 % slower per step, far
beyond the gate's threshold, so the verdicts do not depend on this machine's load
(recorded runs are analyzed; nothing is timed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_support import start_dashboard, stop_dashboard
from test_browser_e2e import RENDER_TIMEOUT_MS, _wait_idle, browser, page, pytestmark  # noqa: F401 (fixtures)
from test_history import GOOD, SLOW, _copy

from analyzer.verbs.history import history

SLOWED = 6  # the sixth run of ten is the slow one


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e-history")
    runs = root / "runs"
    runs.mkdir()
    for i in range(1, 11):
        _copy(SLOW if i == SLOWED else GOOD, runs / f"r{i:02d}", f"2026-01-{i:02d}T00:00:00+00:00", f"sha{i:02d}")
    proc, url = start_dashboard(runs, root / "dashboard.log")
    try:
        yield url, runs, root
    finally:
        stop_dashboard(proc)


def test_history_of_ten_runs_marks_the_injected_slowdown(server, page):  # noqa: F811 (the imported fixture)
    url, runs, root = server
    h = history(runs, "time")
    marked = [(p.run, p.direction) for p in h.points if p.change_point]
    assert marked == [("r06", "slower"), ("r07", "faster")]  # into the slow run, and back out of it
    page.goto(f"{url}/history", wait_until="domcontentloaded")
    page.get_by_role("heading", name="History").wait_for(timeout=RENDER_TIMEOUT_MS)
    chart = page.locator('[data-testid="stVegaLiteChart"] svg.marks').first
    chart.wait_for(state="visible", timeout=RENDER_TIMEOUT_MS)
    _wait_idle(page)
    # One point per run on the line, and one triangle per change point on top of it.
    symbols = chart.locator("g.mark-symbol.role-mark")
    assert symbols.count() == 2, symbols.count()
    assert symbols.nth(0).locator("path").count() == 10
    assert symbols.nth(1).locator("path").count() == len(marked)
    # The x axis names every run, in order.
    labels = [t.strip() for t in chart.locator("g.role-axis-label text").all_text_contents()]
    assert [t for t in labels if t.startswith("r")] == [p.run for p in h.points]
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-testid=\"stDataFrame\"]')].some(el => el.innerHTML.includes('slower'))",
        timeout=RENDER_TIMEOUT_MS,
    )
    page.screenshot(path=str(root / "history.png"), full_page=True)
    assert page.problems() == []
