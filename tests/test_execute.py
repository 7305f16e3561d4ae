"""The execution of the per-rank map (analyzer/execute.py) and its progress on stderr (analyzer/cli.py).

The progress counts are exact (files and ranks done of their totals, one
report after planning and one per unit, however the unit's result came);
the drawing is tested with a synthetic clock, never by timing.
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synth import KinetoTrace

from analyzer.api import analyze
from analyzer.cli import PLAIN_EVERY_S, ProgressLine, main
from analyzer.execute import Progress, plan, ExecOptions


def _folder(root: Path, n_ranks: int) -> Path:
    """A trace folder of ``n_ranks`` one-file ranks, one ProfilerStep each."""
    folder = root / "traces"
    for rank in range(n_ranks):
        t = KinetoTrace(rank=rank, world_size=n_ranks)
        t.step(1, 0, 1000)
        t.kernel("sgemm", 100, 300 + 50 * rank)
        t.write(folder / f"rank{rank}.json.gz")
    return folder


def _two_window_run(root: Path) -> Path:
    """A reftrain run directory: 2 ranks, each with a trace in two profiler windows (steps 2 and 5)."""
    run = root / "run"
    traces = []
    for rank in (0, 1):
        for step, start in ((2, 0), (5, 10_000)):
            t = KinetoTrace(rank=rank, world_size=2, gpu=False)
            t.step(step, start, 100)
            rel = f"traces/step{step}/rank{rank}.pt.trace.json.gz"
            t.write(run / rel)
            traces.append(rel)
    files = {
        "config": "config.yaml",
        "metrics": [],
        "collectives": [],
        "telemetry": [],
        "traces": traces,
        "checkpoints": [],
    }
    manifest = {
        "schema": "reftrain.run/1",
        "run_id": "run",
        "status": "completed",
        "world_size": 2,
        "backend": "gloo",
        "files": files,
        "schemas": {},
    }
    (run / "run.json").write_bytes(orjson.dumps(manifest))
    return run


def test_progress_counts_each_rank_once_mapped_or_from_its_summary(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 3)
    expected = [Progress(done, 3, done, 3) for done in range(4)]  # planned, then one per rank
    heard: list[Progress] = []
    analyze(folder, cache=False, progress=heard.append)
    assert heard == expected
    # Cached: the first analysis maps and stores the summaries, the second reads them (and stores the
    # finished analysis), the third is that finished analysis: no map to report.
    for expect in (expected, expected, []):
        heard = []
        analyze(folder, progress=heard.append)
        assert heard == expect


def test_ranks_taken_from_the_early_parse_jobs_count_too(tmp_path: Path) -> None:
    from analyzer.engines import parse_and_map
    from analyzer.ingest.jobs import ParseJobs

    folder = _folder(tmp_path, 2)
    heard: list[Progress] = []
    with ParseJobs(sorted(folder.glob("*.json.gz")), workers=1, task=parse_and_map) as pending:
        a = analyze(folder, cache=False, jobs=pending, progress=heard.append)
        assert not any(f in pending for f in folder.iterdir())  # both ranks were taken from the workers
    assert [r.rank for r in a.ranks] == [0, 1] and a.errors == []
    assert heard == [Progress(0, 2, 0, 2), Progress(1, 2, 1, 2), Progress(2, 2, 2, 2)]


def test_a_ranks_windows_are_one_unit_of_progress(tmp_path: Path) -> None:
    run = _two_window_run(tmp_path)
    heard: list[Progress] = []
    a = analyze(run, cache=False, progress=heard.append)
    assert [r.rank for r in a.ranks] == [0, 1]
    assert heard == [Progress(0, 4, 0, 2), Progress(2, 4, 1, 2), Progress(4, 4, 2, 2)]


def test_plan_groups_a_ranks_windows_and_reads_misses_first(tmp_path: Path) -> None:
    run = _two_window_run(tmp_path)
    sets = [sorted((run / "traces" / f"step{n}").iterdir()) for n in (2, 5)]
    planned = plan(sets, ExecOptions(cache=False))
    assert [[f.path.relative_to(run).as_posix() for f in u.files] for u in planned.units] == [
        ["traces/step2/rank0.pt.trace.json.gz", "traces/step5/rank0.pt.trace.json.gz"],
        ["traces/step2/rank1.pt.trace.json.gz", "traces/step5/rank1.pt.trace.json.gz"],
    ]
    assert all(not f.hit and f.entry is None for s in planned.sets for f in s.order)


class Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _feed(line: ProgressLine, clock: Clock, at: list[tuple[float, int]], total: int) -> None:
    for t, done in at:
        clock.now = 100.0 + t
        line(Progress(done, total, done, total))


def test_plain_lines_at_most_every_few_seconds_and_when_done() -> None:
    out, clock = io.StringIO(), Clock()
    line = ProgressLine("runs/big", out, in_place=False, clock=clock)
    # Counts at 0, 1, 4 s (within PLAIN_EVERY_S of the start: silent), 6 s (a line), 7 s (silent), 12 s (a line),
    # 13 s (done: a line however soon).
    assert PLAIN_EVERY_S == 5.0
    _feed(line, clock, [(0, 0), (1, 1), (4, 2), (6, 3), (7, 4), (12, 6), (13, 8)], 8)
    line.close()
    assert out.getvalue().splitlines() == [
        "analyzer: runs/big: 3/8 ranks (3/8 trace files), 6 s, about 10 s left",  # 6 s x 5 left / 3 done
        "analyzer: runs/big: 6/8 ranks (6/8 trace files), 12 s, about 4 s left",
        "analyzer: runs/big: 8/8 ranks (8/8 trace files), 13 s",
    ]
    assert "\r" not in out.getvalue()


def test_terminal_line_is_rewritten_in_place_cut_to_the_width_and_erased(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "44")  # shutil.get_terminal_size reads it first
    out, clock = io.StringIO(), Clock()
    line = ProgressLine("t", out, in_place=True, clock=clock)
    _feed(line, clock, [(0, 0), (2, 1), (3, 2)], 2)
    line.close()
    assert out.getvalue() == (
        "\ranalyzer: t: 0/2 ranks (0/2 trace files), 0\x1b[K"  # 43 characters: the terminal is 44 wide
        "\ranalyzer: t: 1/2 ranks (1/2 trace files), 2\x1b[K"
        "\ranalyzer: t: 2/2 ranks (2/2 trace files), 3\x1b[K"
        "\r\x1b[K"
    )


def test_nothing_drawn_without_ranks() -> None:
    out = io.StringIO()
    line = ProgressLine("run", out, in_place=True, clock=Clock())
    line(Progress(0, 0, 0, 0))  # a run directory with records but no traces
    line.close()
    assert out.getvalue() == ""


def test_cli_progress_on_stderr_only(tmp_path: Path, capsys) -> None:
    folder = _folder(tmp_path, 2)
    out_json = tmp_path / "report.json"
    assert main(["report", str(folder), "--no-cache", "--json", str(out_json), "--progress"]) == 0
    captured = capsys.readouterr()
    # pytest's captured stderr is not a terminal: with --progress, plain lines; this map is short: the final one.
    progress = re.compile(r"^analyzer: .*traces: 2/2 ranks \(2/2 trace files\), \d+ s$", re.M)
    assert len(progress.findall(captured.err)) == 1
    assert "trace files)" not in captured.out and b"trace files)" not in out_json.read_bytes()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("tty", "flag", "drawn"),
    [
        (True, None, "in place"),
        (True, False, None),
        (True, True, "in place"),
        (False, None, None),
        (False, False, None),
        (False, True, "plain"),
    ],
)
def test_who_draws_progress(monkeypatch, tty: bool, flag: bool | None, drawn: str | None) -> None:
    import argparse

    from analyzer import cli

    monkeypatch.setattr(sys, "stderr", _Terminal() if tty else io.StringIO())
    with cli._progress(Path("run"), argparse.Namespace(progress=flag)) as line:
        assert (None if line is None else "in place" if line.in_place else "plain") == drawn
