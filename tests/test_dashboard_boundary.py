"""The runs folder is the dashboard's boundary (dashboard/boundary.py): a run with a path below it that
links outside (a trace, /etc/passwd as a trace, run.json, a metrics file, the traces folder, a folder three
levels down) is refused with one line on every page, and nothing outside is opened or listed.

The proof that nothing outside is read is an audit hook (PEP 578): Python raises an ``open`` event for
every file opened (builtins.open, io.open, os.open, gzip's and orjson's readers all go through them) and
an ``os.scandir`` / ``os.listdir`` event for every folder listed; the hook records any whose real path is
an outside file or below the outside folder, while every page of the app runs here, in this process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_support import (
    GPU_RUN,
    LINKED_RUNS,
    OUTSIDE_MARKER,
    PASSWD,
    build_linked_runs,
    fresh_caches,  # noqa: F401
    write_gpu_traces,
)

from analyzer.api import analyze
from dashboard.boundary import inside, links_out, run_refusal
from dashboard.cli import APP_PATH, RUNS_DIR_ENV
from dashboard.text import plain

TIMEOUT_S = 300
TRACE_FOLDERS = ("link-trace", "link-passwd")  # the others are reftrain run directories
RUN_PAGES = ("overview", "timeline", "operators", "modules", "communication", "stragglers", "telemetry", "compare")

# Audit hooks cannot be removed: one hook for the session, recording only while `_watch` names folders.
_watch: list[Path] = []
_seen: list[str] = []
_busy = [False]


def _hook(event: str, args: tuple) -> None:
    if not _watch or _busy[0] or event not in ("open", "os.scandir", "os.listdir"):
        return
    target = args[0] if args else None
    if not isinstance(target, (str, bytes, os.PathLike)):
        return  # a file descriptor, or scandir() of the current folder
    _busy[0] = True
    try:
        real = Path(os.path.realpath(os.fsdecode(target)))
        if any(real == w or real.is_relative_to(w) for w in _watch):
            _seen.append(f"{event} {real}")
    finally:
        _busy[0] = False


sys.addaudithook(_hook)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("boundary")
    runs, outside = root / "runs", root / "outside"
    runs.mkdir()
    write_gpu_traces(runs / GPU_RUN)
    build_linked_runs(runs, outside)
    return runs, outside


@pytest.fixture
def watching(folders):
    """Record every open or listing of the outside folder or /etc/passwd while the test runs."""
    _, outside = folders
    _seen.clear()
    _watch[:] = [outside.resolve(), PASSWD.resolve()]
    yield _seen
    _watch.clear()


def _text(at: AppTest) -> str:
    """Every piece of text the page shows (elements' values, labels, bodies and table cells)."""
    parts = []
    for kind in (
        "title",
        "header",
        "subheader",
        "markdown",
        "caption",
        "error",
        "warning",
        "info",
        "success",
        "exception",
        "code",
        "text",
        "metric",
    ):
        for el in at.get(kind):
            parts.append(str(getattr(el, "value", "")) + " " + str(getattr(el, "label", "") or ""))
    for df in at.dataframe:
        parts.append(df.value.to_csv())
    return "\n".join(parts)


def _open(runs: Path, monkeypatch, page: str, **params: str) -> AppTest:
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs))
    at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT_S)
    for key, value in params.items():
        at.query_params[key] = value
    if page != "runs":
        at.switch_page(f"views/{page}.py")
    at.run()
    return at


def test_the_analyzer_itself_follows_the_links(folders, watching):
    """The CLI and API keep following symlinks (a user's own command on their own files): the outside
    trace is read there, and the audit hook sees it (so its silence in the tests below means something)."""
    runs, outside = folders
    ra = analyze(runs / "link-trace", cache=False)
    assert sorted(r.rank for r in ra.ranks) == [0, 1]
    assert f"open {(outside / 'secret.pt.trace.json.gz').resolve()}" in watching


def test_links_out_names_every_path_leading_out_and_nothing_else(folders):
    runs, outside = folders
    for name, link in LINKED_RUNS.items():
        assert links_out(runs, runs / name) == [link], name
        refusal = run_refusal(runs, runs / name, name)
        assert refusal is not None and link in refusal and "\n" not in refusal
        # The target is never named (a page must not reveal what lies outside).
        assert str(outside) not in refusal and str(PASSWD) not in refusal
    assert links_out(runs, runs / GPU_RUN) == []
    assert run_refusal(runs, runs / GPU_RUN, GPU_RUN) is None
    # A link that stays inside is fine, a loop ends, a link out through an inside link is found.
    (runs / GPU_RUN / "again").symlink_to(runs / GPU_RUN)
    (runs / GPU_RUN / "sibling").symlink_to(runs / "link-trace")
    try:
        assert links_out(runs, runs / GPU_RUN) == ["sibling/rank1.pt.trace.json.gz"]
    finally:
        (runs / GPU_RUN / "again").unlink()
        (runs / GPU_RUN / "sibling").unlink()
    assert inside(runs, runs / "link-trace") and not inside(runs, runs / "link-trace" / "rank1.pt.trace.json.gz")


@pytest.mark.parametrize("name", sorted(LINKED_RUNS))
def test_every_page_of_a_linked_run_refuses_it_in_one_line_and_reads_nothing_outside(
    folders, watching, monkeypatch, name
):
    runs, outside = folders
    for page in RUN_PAGES:
        params = {"run": name}
        if page == "compare":
            params["base"] = GPU_RUN
        at = _open(runs, monkeypatch, page, **params)
        assert not at.exception, (page, [e.value for e in at.exception])
        text = _text(at)
        # Error bodies are Markdown with punctuation escaped (dashboard/text.py).
        refusals = [e.value for e in at.error if "outside the runs folder" in e.value]
        if page == "telemetry" and name in TRACE_FOLDERS:  # says a trace folder has no samples; reads nothing
            assert refusals == [] and any("no NVML samples" in i.value for i in at.info)
            continue
        assert len(refusals) == 1, (page, [e.value for e in at.error])
        assert plain(f"run {name} not read: {LINKED_RUNS[name]} links outside") in refusals[0], refusals[0]
        assert OUTSIDE_MARKER not in text and "root:x:" not in text and "Traceback" not in text, page
    assert watching == []


def test_runs_and_history_pages_read_nothing_outside(folders, watching, monkeypatch):
    runs, _ = folders
    at = _open(runs, monkeypatch, "runs")
    assert not at.exception
    table = at.dataframe[0].value.set_index("run")
    for name in LINKED_RUNS:
        assert table.loc[name, "status"] == "error"
        assert "outside the runs folder" in table.loc[name, "error"]
    assert table.loc[GPU_RUN, "status"] == "ok"  # the run that stays inside is analyzed as before
    at = _open(runs, monkeypatch, "history")
    assert not at.exception
    assert sum("outside the runs folder" in c.value for c in at.caption) == len(LINKED_RUNS)
    text = _text(at) + _text(_open(runs, monkeypatch, "overview", run=GPU_RUN))
    assert OUTSIDE_MARKER not in text and "root:x:" not in text
    assert watching == []
