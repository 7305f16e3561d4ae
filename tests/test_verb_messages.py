"""Every verb says the same about the same input: `analyzer suggest` prints the skipped files and
the warnings `analyzer report` prints (analyzer/verbs/printable.py, run_messages)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from synth import KinetoTrace
from test_cli import run_main


def _folder_with_warnings(folder: Path) -> Path:
    """Ranks 0 and 1 of a job whose distributedInfo says world_size 3 (a warning: rank 2 has no
    trace), one of them without ProfilerStep markers (another warning), and a file that is not a
    trace (skipped)."""
    folder.mkdir()
    for rank in (0, 1):
        t = KinetoTrace(rank=rank, world_size=3)
        for i in range(4):
            if rank == 0:
                t.step(10 + i, i * 1000, 1000)
            t.kernel("sgemm", i * 1000 + 100, 200, launch_us=i * 1000 + 30)
        t.write(folder / f"rank{rank}.json.gz")
    (folder / "rank2.json").write_text("{ not json")
    return folder


def _messages(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(("analyzer: warning:", "analyzer: skipped:"))]


def test_suggest_prints_the_warnings_report_prints(capsys, tmp_path) -> None:
    folder = _folder_with_warnings(tmp_path / "run")
    code, _, report_err = run_main(capsys, "report", str(folder), "--no-cache")
    assert code == 0
    expected = _messages(report_err)
    # The input's three problems, as report words them; suggest must print these very lines.
    assert any("world_size is 3 but 1 rank has no trace: 2" in line for line in expected), expected
    assert any("no ProfilerStep markers" in line and "rank1.json.gz" in line for line in expected), expected
    assert any(line.startswith("analyzer: skipped: rank2.json") for line in expected), expected
    code, _, suggest_err = run_main(capsys, "suggest", str(folder), "--no-cache")
    assert code == 0
    assert _messages(suggest_err) == expected
