"""analyzer history: order, gate verdicts between consecutive runs, change points.

Real example runs: the slowed-rank run is 50 % slower per step than the good
one (978 vs 1492 ms), far beyond the gate's threshold, so the verdicts are
not load-sensitive: the recorded runs are analyzed, nothing is timed here.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from analyzer.verbs.history import history

REPO = Path(__file__).resolve().parent.parent
GOOD, SLOW = "example-ddp-w2", "example-ddp-w2-slow-rank1"


def _copy(src: str, dst: Path, start: str, sha: str) -> None:
    """A copy of an example run moved in time to ``start``: start, end and every step record shifted alike,
    so the copy's goodput is the original's."""
    shutil.copytree(REPO / "traces" / src, dst, ignore=shutil.ignore_patterns(".analyzer-cache"))
    m = json.loads((dst / "run.json").read_text())
    shift = datetime.fromisoformat(start) - datetime.fromisoformat(m["start_time"])
    m["end_time"] = (datetime.fromisoformat(m["end_time"]) + shift).isoformat()
    m["start_time"], m["git"] = start, {"sha": sha, "dirty": False}
    (dst / "run.json").write_text(json.dumps(m))
    shift_ns = (shift.days * 86_400 + shift.seconds) * 10**9 + shift.microseconds * 1000
    for rel in m["files"]["metrics"]:
        records = [json.loads(line) for line in (dst / rel).read_text().splitlines()]
        (dst / rel).write_text("".join(json.dumps(r | {"time_ns": r["time_ns"] + shift_ns}) + "\n" for r in records))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("history")
    # Named so that name order differs from time order.
    _copy(GOOD, root / "c-first", "2026-01-01T00:00:00+00:00", "aaa")
    _copy(SLOW, root / "a-second", "2026-01-02T00:00:00+00:00", "bbb")
    _copy(GOOD, root / "b-third", "2026-01-03T00:00:00+00:00", "ccc")
    _copy(GOOD, root / "d-fourth", "2026-01-04T00:00:00+00:00", "ccc")
    (root / "not-a-run").mkdir()
    return root


def test_time_order_verdicts_and_change_points(runs):
    h = history(runs, "time")
    assert [p.run for p in h.points] == ["c-first", "a-second", "b-third", "d-fourth"]
    first, second, third, fourth = h.points
    assert first.verdict is None and not first.change_point
    assert second.verdict == "regression" and second.change_point and second.direction == "slower"
    assert third.change_point and third.direction == "faster" and third.verdict != "regression"
    assert fourth.verdict == "pass" and not fourth.change_point  # the same run's data again
    assert second.step_time_ms > 1.3 * first.step_time_ms
    # Goodput per run, as the original runs have it (the copies are shifted in time as a whole).
    from analyzer import analyze

    good, slow = (analyze(REPO / "traces" / n, cache=False).goodput().goodput for n in (GOOD, SLOW))
    assert [p.goodput for p in h.points] == pytest.approx([good, slow, good, good], rel=1e-6)  # ISO times keep ms
    assert 0 < slow < 1 and 0 < good < 1
    assert any(s.startswith("not-a-run: ") for s in h.skipped)


def test_by_commit_keeps_the_latest_run_of_each_commit(runs):
    h = history(runs, "commit")
    assert [(p.run, p.commit) for p in h.points] == [("c-first", "aaa"), ("a-second", "bbb"), ("d-fourth", "ccc")]


def test_progress_hears_each_run_directory_in_name_order(runs):
    heard: list[tuple[int, int, str]] = []
    h = history(runs, "time", progress=lambda number, total, name: heard.append((number, total, name)))
    assert heard == [(1, 4, "a-second"), (2, 4, "b-third"), (3, 4, "c-first"), (4, 4, "d-fourth")]  # not not-a-run
    assert h.skipped == ["not-a-run: not a reftrain run directory (no run.json)"]


def test_cli_prints_the_table_and_writes_json(runs, tmp_path):
    out = tmp_path / "h.json"
    page = tmp_path / "h.html"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "analyzer.cli",
            "history",
            str(runs),
            "--json",
            str(out),
            "--html",
            str(page),
            "--progress",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    # stderr is a pipe: with --progress, plain lines; the last says every run is done.
    assert re.fullmatch(rf"analyzer: {re.escape(str(runs))}: 4/4 runs, \d+ s", done.stderr.splitlines()[-1])
    assert "CHANGE (slower)" in done.stdout and "CHANGE (faster)" in done.stdout
    doc = json.loads(out.read_text())
    assert doc["schema"] == "analyzer.history/1" and len(doc["points"]) == 4
    assert all(0 < p["goodput"] < 1 for p in doc["points"])
    assert "goodput %" in done.stdout and "goodput (%)" in page.read_text()
    text = page.read_text()
    assert "change (slower)" in text and "change (faster)" in text and '<td class="l">b-third</td>' in text
    bad = subprocess.run(
        [sys.executable, "-m", "analyzer.cli", "history", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
