"""The runs folder is the dashboard's boundary, in a real browser (headless Debian Chromium): runs with
symlinks pointing outside (a trace, /etc/passwd as a trace, run.json, a metrics file, the traces folder,
a folder three levels down) show one line saying so on their pages, never a traceback, and nothing of
the outside files (each holds a marker) appears anywhere on any page. That nothing outside is even
opened is proven in-process by tests/test_dashboard_boundary.py (an audit hook over every open)."""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import quote

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_support import (
    GPU_RUN,
    LINKED_RUNS,
    OUTSIDE_MARKER,
    build_linked_runs,
    start_dashboard,
    stop_dashboard,
    write_gpu_traces,
)
from test_browser_e2e import RENDER_TIMEOUT_MS, _wait_idle, browser, page, pytestmark  # noqa: F401 (fixtures)

# Text no page may show: the outside files' marker, /etc/passwd's first field, a Python traceback.
FORBIDDEN = (OUTSIDE_MARKER, "root:x:0:0", "Traceback", "RunLookupError")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e-boundary")
    runs = root / "runs"
    runs.mkdir()
    write_gpu_traces(runs / GPU_RUN)
    build_linked_runs(runs, root / "outside")
    proc, url = start_dashboard(runs, root / "dashboard.log")
    try:
        yield url, runs, root
    finally:
        stop_dashboard(proc)


def _body(pg) -> str:
    return pg.locator("body").inner_text() + pg.content()


def _assert_nothing_outside(pg, where: str) -> None:
    body = _body(pg)
    for text in FORBIDDEN:
        assert text not in body, f"{where}: {text!r} on the page"


@pytest.mark.parametrize("name", sorted(LINKED_RUNS))
def test_a_linked_run_is_refused_in_one_line(server, page, name):  # noqa: F811 (the imported fixture)
    url, runs, root = server
    for view in ("overview", "timeline"):
        page.goto(f"{url}/{view}?run={quote(name, safe='')}", wait_until="domcontentloaded")
        alert = page.locator('[data-testid="stAlertContentError"]').filter(has_text="outside the runs folder")
        alert.first.wait_for(timeout=RENDER_TIMEOUT_MS)
        _wait_idle(page)
        assert alert.count() == 1, (view, alert.all_inner_texts())
        line = alert.first.inner_text()
        assert "\n" not in line.strip() and LINKED_RUNS[name] in line, line
        assert page.locator('[data-testid="stException"]').count() == 0
        _assert_nothing_outside(page, f"{view} of {name}")
        page.wait_for_load_state("networkidle")
    # Nothing else below the refusal: no downloads section, no charts.
    assert page.get_by_text("Raw traces").count() == 0
    assert page.problems() == []


def test_runs_page_shows_refusals_and_the_inside_run(server, page):  # noqa: F811 (the imported fixture)
    url, runs, root = server
    page.goto(url + "/", wait_until="domcontentloaded")
    page.get_by_role("heading", name="Runs").wait_for(timeout=RENDER_TIMEOUT_MS)
    page.locator('[data-testid="stDataFrame"]').first.wait_for(state="visible", timeout=RENDER_TIMEOUT_MS)
    _wait_idle(page)
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-testid=\"stDataFrame\"]')]"
        ".some(el => el.innerText.includes('outside the runs folder') || el.innerHTML.includes('outside the runs folder'))",
        timeout=RENDER_TIMEOUT_MS,
    )
    _assert_nothing_outside(page, "runs page")
    # The run that stays inside still opens, its downloads section included.
    page.goto(f"{url}/overview?run={GPU_RUN}", wait_until="domcontentloaded")
    buttons = page.locator('[data-testid="stDownloadButton"]')
    buttons.nth(1).wait_for(timeout=RENDER_TIMEOUT_MS)  # one per rank
    _wait_idle(page)
    assert buttons.count() == 2
    _assert_nothing_outside(page, f"overview of {GPU_RUN}")
    page.goto(f"{url}/history", wait_until="domcontentloaded")
    page.get_by_role("heading", name="History").wait_for(timeout=RENDER_TIMEOUT_MS)
    _wait_idle(page)
    _assert_nothing_outside(page, "history")
    assert page.problems() == []
