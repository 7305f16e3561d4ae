"""The HTML report in a real browser: it fits a 1,280 px window, and its
stragglers and suggestions are tables, not preformatted text.

`analyzer report --html` of the example run with a slowed rank (a flagged straggler and
suggestions) and of shared traces with long C++ kernel names (one of them widened the Top
kernels table to 1,408 px before its name cells could wrap), opened from disk in Debian's
chromium through Playwright; the page's scroll width is measured. Nothing here is timed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_support import CHROMIUM, CHROMIUM_ARGS

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "traces"
ANALYZER = Path(sys.executable).with_name("analyzer")
WINDOW = 1280

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="/usr/bin/chromium is absent (CI installs Debian's chromium in .ci/run; locally: apt-get install chromium)",
)

INPUTS = {
    "slow-rank run": REPO / "traces" / "example-ddp-w2-slow-rank1",
    "h100 qwen": SHARED / "tracelens-samples" / "h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "torch.compile": SHARED / "tracelens-samples" / "torch_compile_triton" / "trace.json.gz",
    "hta df_index_resolver": SHARED / "hta-samples" / "df_index_resolver",
}


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.mark.parametrize("name", list(INPUTS))
def test_the_html_report_fits_a_1280_px_window(browser, tmp_path: Path, name: str) -> None:
    src = INPUTS[name]
    if not src.exists():
        pytest.skip(f"{src} is absent (the shared traces sit beside the checkout in ../shared)")
    page_file = tmp_path / "report.html"
    done = subprocess.run(
        [str(ANALYZER), "report", str(src), "--no-cache", "--html", str(page_file)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    context = browser.new_context(viewport={"width": WINDOW, "height": 900})
    try:
        pg = context.new_page()
        errors: list[str] = []
        pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        pg.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
        pg.goto(page_file.as_uri(), wait_until="load")
        width = pg.evaluate("() => document.documentElement.scrollWidth")
        too_wide = pg.evaluate(f"""() => Array.from(document.querySelectorAll('body *'))
            .filter(e => e.getBoundingClientRect().right > {WINDOW})
            .slice(0, 3).map(e => e.tagName + ' ' + e.innerText.slice(0, 80))""")
        assert width <= WINDOW and not too_wide, f"{name}: page {width} px wide; {too_wide}"
        # Stragglers and suggestions are tables (or a sentence when there is nothing), never <pre>.
        sections = pg.evaluate("""() => Object.fromEntries(Array.from(document.querySelectorAll('h2'))
            .filter(h => ['Stragglers', 'Suggestions'].includes(h.innerText))
            .map(h => { let n = h.nextElementSibling, kinds = [];
                        while (n && n.tagName !== 'H2') { kinds.push(n.tagName); n = n.nextElementSibling; }
                        return [h.innerText, kinds]; }))""")
        assert set(sections) == {"Stragglers", "Suggestions"}
        assert all("PRE" not in kinds for kinds in sections.values()), sections
        if name == "slow-rank run":  # a flagged straggler and its suggestion: both as tables
            assert "TABLE" in sections["Stragglers"] and "TABLE" in sections["Suggestions"], sections
        assert errors == [], errors
    finally:
        context.close()
