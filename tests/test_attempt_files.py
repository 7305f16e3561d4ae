"""recorder.manifest.earlier_attempt_files: what the attempts before a restart left on disk.

A job restarted twice (attempt 2 running) must list the traces of attempts 0 and 1: the
glob of attempt 1 (traces/attempt1/*/...) must not be filtered by the rule meant for attempt
0's glob (skip traces/attempt*/), which would leave every trace of attempt 1 and later out of
run.json's files.traces. Files only; nothing is timed.
"""

from __future__ import annotations

from pathlib import Path

from analyzer.ingest.formats import attempt_folder, records_file, trace_file
from recorder import manifest


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def test_every_earlier_attempt_is_listed_and_the_running_one_is_not(tmp_path: Path) -> None:
    run = tmp_path / "run"
    windows = {0: 3, 1: 5, 2: 7}  # attempt -> the step its profiler window ends at
    for attempt, step in windows.items():
        for rank in range(2):
            _touch(run / "traces" / f"{attempt_folder(attempt)}{trace_file(step, rank)}")
            _touch(run / records_file("metrics", rank, attempt))
    _touch(run / "traces" / ".analyzer-cache" / "x.json")  # the analyzer's cache: never a trace
    got = manifest.earlier_attempt_files(run, attempt=2, world_size=2)
    expect = sorted(f"traces/{attempt_folder(a)}{trace_file(windows[a], r)}" for a in (0, 1) for r in range(2))
    assert sorted(got["traces"]) == expect
    assert got["metrics"] == [records_file("metrics", r, a) for a in (0, 1) for r in range(2)]
    first = manifest.earlier_attempt_files(run, attempt=1, world_size=2)
    assert sorted(first["traces"]) == [f"traces/{trace_file(3, r)}" for r in range(2)]  # attempt 0's only
