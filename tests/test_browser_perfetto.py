""" "Open in Perfetto UI" on the dashboard's Overview, in real Chromium.

No network here, and a test must not depend on Perfetto's site: every request to
https://ui.perfetto.dev is answered by a stub page that speaks the UI's side of Perfetto's
documented protocol (docs/dashboard.md, dashboard/perfetto.py): it starts listening only
after a delay, as the real UI does once its code has loaded (messages posted before are lost:
the channel is not buffered), answers 'PING' with 'PONG' to the window that sent it, and
records every ``{perfetto: {buffer, title, fileName}}`` it receives. The test asserts that the
bytes arriving are the trace file's, byte for byte, for the runs the dashboard lists: a run
in the layout reftrain writes now (``traces/step{N}/``), one in the older flat layout, and a
folder of foreign traces.
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_support import GOOD_RUN, GPU_RUN, build_runs_dir, start_dashboard, stop_dashboard
from test_browser_e2e import RENDER_TIMEOUT_MS, _wait_idle, browser, page, pytestmark  # noqa: F401 (fixtures)

STEP_LAYOUT_RUN = "step-layout"
LISTEN_AFTER_MS = 400  # the stub's stand-in for the UI's load time: PINGs before it go unanswered

STUB = (
    """<!doctype html><title>Perfetto UI (test stub)</title><script>
window.pings = 0;
window.answered = 0;
window.received = [];
function toBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}
setTimeout(() => window.addEventListener("message", (event) => {
  if (event.data === "PING") {
    window.pings++;
    if (event.source === window.opener) { window.answered++; event.source.postMessage("PONG", "*"); }
    return;
  }
  const trace = event.data && event.data.perfetto;
  window.received.push({
    origin: event.origin,
    fromOpener: event.source === window.opener,
    isArrayBuffer: trace ? trace.buffer instanceof ArrayBuffer : false,
    title: trace ? trace.title : null,
    fileName: trace ? trace.fileName : null,
    base64: trace && trace.buffer instanceof ArrayBuffer ? toBase64(trace.buffer) : null,
    pingsBefore: window.pings,
  });
}), %d);
</script>"""
    % LISTEN_AFTER_MS
)


def _to_step_layout(run: Path) -> None:
    """Move a run's flat traces/rank{R}.step{N}.json.gz to traces/step{N}/rank{R}.pt.trace.json.gz, as reftrain writes now."""
    manifest = json.loads((run / "run.json").read_text())
    moved = []
    for rel in manifest["files"]["traces"]:
        rank, step = Path(rel).name.split(".")[:2]
        new = Path("traces") / step / f"{rank}.pt.trace.json.gz"
        (run / new).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(run / rel, run / new)
        moved.append(new.as_posix())
    manifest["files"]["traces"] = moved
    (run / "run.json").write_text(json.dumps(manifest, indent=2))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("perfetto")
    runs = build_runs_dir(root / "runs")
    shutil.copytree(runs / GOOD_RUN, runs / STEP_LAYOUT_RUN)
    _to_step_layout(runs / STEP_LAYOUT_RUN)
    proc, url = start_dashboard(runs, root / "dashboard.log")
    try:
        yield url, runs, root
    finally:
        stop_dashboard(proc)


def _route_perfetto(pg) -> None:
    pg.context.route(
        "https://ui.perfetto.dev/**", lambda route: route.fulfill(status=200, content_type="text/html", body=STUB)
    )


def _open(pg, url: str, run: str):
    pg.goto(f"{url}/overview?run={quote(run)}", wait_until="domcontentloaded")
    pg.get_by_role("heading", name="Raw traces").scroll_into_view_if_needed(timeout=RENDER_TIMEOUT_MS)
    _wait_idle(pg)
    # Role locators pierce the component's shadow root; its script is loaded after the page's run.
    buttons = pg.get_by_role("button", name="Open in Perfetto UI")
    buttons.first.wait_for(timeout=RENDER_TIMEOUT_MS)
    return buttons


def _received(popup) -> list[dict]:
    popup.wait_for_function("() => window.received.length > 0", timeout=RENDER_TIMEOUT_MS)
    popup.wait_for_timeout(300)  # a second, duplicate post would arrive in this time
    return popup.evaluate("() => window.received")


def _check_delivery(pg, button, trace: Path, file_name: str, url: str) -> None:
    with pg.expect_popup(timeout=RENDER_TIMEOUT_MS) as opened:
        button.click()
    popup = opened.value
    assert popup.url == "https://ui.perfetto.dev/"
    (got,) = _received(popup)
    data = base64.b64decode(got["base64"])
    # The file as written, gzip included (Perfetto decodes gzip itself): not a view of a larger buffer, not
    # another rank's file.
    assert len(data) == trace.stat().st_size and data == trace.read_bytes()
    assert "traceEvents" in json.loads(gzip.decompress(data))
    assert got["isArrayBuffer"] and got["fromOpener"]
    assert got["origin"] == url
    assert got["fileName"] == file_name and got["title"].endswith(file_name)
    # The trace was posted only after the UI answered, which it does only once listening.
    assert got["pingsBefore"] >= 1 and popup.evaluate("() => window.answered") >= 1
    pg.get_by_text("Opening in the Perfetto UI").wait_for(state="detached", timeout=10_000)  # done, said nothing
    popup.close()


@pytest.mark.slow
def test_every_trace_opens_in_perfetto_byte_for_byte(server, page):  # noqa: F811 (the imported fixture)
    url, runs, root = server
    _route_perfetto(page)

    # The layout reftrain writes now: every window's files share names, so the name keeps the window.
    traces = sorted((runs / STEP_LAYOUT_RUN / "traces").glob("step*/rank*.json.gz"))
    assert len(traces) == 2
    buttons = _open(page, url, STEP_LAYOUT_RUN)
    assert buttons.count() == len(traces) == page.locator('[data-testid="stDownloadButton"]').count()
    for button, trace in zip((buttons.nth(1), buttons.nth(0)), reversed(traces)):  # rank 1 first: no mix-up
        _check_delivery(page, button, trace, f"{trace.parent.name}-{trace.name}", url)
    # A second click on the same button opens and fills a second window.
    _check_delivery(page, buttons.nth(0), traces[0], f"{traces[0].parent.name}-{traces[0].name}", url)

    # The older flat layout of a reftrain run, and a folder of foreign traces.
    for run, pattern in ((GOOD_RUN, "traces/rank*.json.gz"), (GPU_RUN, "rank*.json.gz")):
        traces = sorted((runs / run).glob(pattern))
        buttons = _open(page, url, run)
        assert buttons.count() == len(traces) == 2
        _check_delivery(page, buttons.nth(1), traces[1], traces[1].name, url)

    assert page.locator('[data-testid="stException"]').count() == 0
    page.screenshot(path=str(root / "perfetto_overview.png"), full_page=True)
    assert page.problems() == []
