"""`--quiet` on the analysis commands and `analyzer history`'s progress (analyzer/cli.py; docs/cli.md, "Progress").

Exact output on synthetic traces; the progress lines are drawn with a clock the
test moves by hand, never timed.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synth import KinetoTrace

from analyzer import cli
from analyzer.cli import RunsProgress, main
from analyzer.execute import Progress


def _folder(root: Path) -> Path:
    """Two one-file ranks and an empty file, which is skipped with one line."""
    folder = root / "traces"
    for rank in range(2):
        t = KinetoTrace(rank=rank, world_size=2)
        t.step(1, 0, 1000)
        t.kernel("sgemm", 100, 300 + 50 * rank)
        t.write(folder / f"rank{rank}.json.gz")
    (folder / "rank9.json").write_text("")
    return folder


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_quiet_keeps_stdout_exit_code_and_problems_drops_notes_and_progress(tmp_path: Path, capsys) -> None:
    folder = _folder(tmp_path)
    code, out, err = _run(capsys, "report", str(folder), "--progress")
    q_code, q_out, q_err = _run(capsys, "report", str(folder), "--quiet")  # replayed from the report cache
    assert (code, q_code) == (0, 0) and q_out == out and "sgemm" in out
    skipped = [line for line in err.splitlines() if line.startswith("analyzer: skipped: ")]
    assert len(skipped) == 1 and "rank9.json" in skipped[0]
    # The empty file is a unit of the map too (it is read to be skipped).
    assert len(re.findall(r"^analyzer: .*traces: 3/3 ranks \(3/3 trace files\), \d+ s$", err, re.M)) == 1
    assert q_err.splitlines() == skipped  # the problem stays; the progress line goes

    code, out, err = _run(capsys, "export", str(folder), "--to", "csv", str(tmp_path / "a"))
    q_code, q_out, q_err = _run(capsys, "export", str(folder), "--quiet", "--to", "csv", str(tmp_path / "b"))
    assert (code, q_code) == (0, 0) and out == q_out == ""
    assert [line for line in err.splitlines() if line.startswith("analyzer: note: wrote ")] != []
    assert q_err.splitlines() == skipped
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(p.name for p in (tmp_path / "b").iterdir())
    # Quiet is the one command's: the next command in this process says its notes again.
    assert "analyzer: note: wrote " in _run(capsys, "export", str(folder), "--to", "csv", str(tmp_path / "c"))[2]


def test_quiet_errors_are_still_one_line(tmp_path: Path, capsys) -> None:
    code, out, err = _run(capsys, "report", str(tmp_path / "missing"), "--quiet")
    assert (code, out) == (2, "")
    assert err.splitlines() == [f"analyzer: error: {tmp_path / 'missing'}: no such file or directory"]


def test_quiet_with_progress_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["report", "x", "--quiet", "--progress"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("--quiet shows no progress: leave out --progress")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tty", [True, False])
def test_quiet_draws_nothing_even_on_a_terminal(monkeypatch, tty: bool) -> None:
    monkeypatch.setattr(sys, "stderr", _Terminal() if tty else io.StringIO())
    assert cli._drawn(argparse.Namespace(progress=None, quiet=True)) is None
    assert cli._drawn(argparse.Namespace(progress=False, quiet=True)) is None
    assert cli._drawn(argparse.Namespace(progress=None, quiet=False)) is (True if tty else None)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_history_plain_lines_count_runs_and_the_time_left_over_runs() -> None:
    out, clock = io.StringIO(), Clock()
    line = RunsProgress("runs", out, in_place=False, clock=clock)
    heard = line(1, 3, "a")  # at 0 s: within PLAIN_EVERY_S of the start, silent
    clock.now = 106.0
    heard(Progress(1, 2, 1, 2))  # half of run 1 done in 6 s: 2.5 runs left, about 30 s
    clock.now = 108.0
    line(2, 3, "b")  # 2 s after the last line: silent
    clock.now = 112.0
    line(3, 3, "c\x1b[2J")  # 2 runs done in 12 s: about 6 s left; the name's controls escaped
    clock.now = 114.0
    line.finish()
    line.close()
    assert out.getvalue().splitlines() == [
        "analyzer: runs: run 1/3 (a): 1/2 ranks (1/2 trace files), 6 s, about 30 s left",
        "analyzer: runs: run 3/3 (c\\x1b[2J), 12 s, about 6 s left",
        "analyzer: runs: 3/3 runs, 14 s",
    ]


def test_history_terminal_line_in_place_and_erased(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    out, clock = io.StringIO(), Clock()
    line = RunsProgress("runs", out, in_place=True, clock=clock)
    heard = line(1, 2, "a")
    clock.now = 102.0
    heard(Progress(2, 2, 2, 2))
    heard(Progress(0, 0, 0, 0))  # a run without traces: nothing to add
    clock.now = 104.0
    line(2, 2, "b")
    line.finish()
    line.close()
    assert out.getvalue() == (
        "\ranalyzer: runs: run 1/2 (a), 0 s\x1b[K"
        "\ranalyzer: runs: run 1/2 (a): 2/2 ranks (2/2 trace files), 2 s, about 2 s left\x1b[K"
        "\ranalyzer: runs: run 2/2 (b), 4 s, about 4 s left\x1b[K"
        "\ranalyzer: runs: 2/2 runs, 4 s\x1b[K"
        "\r\x1b[K"
    )
