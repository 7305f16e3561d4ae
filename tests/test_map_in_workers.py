"""The CLI's early workers map whole ranks (analyzer.engines.parse_and_map) when every file is a rank of its own.

The report must not depend on where a rank was summarized: the same JSON as the map in this process, the same
one-line error for a bad file, and no heavy import before the workers fork.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from synth import KinetoTrace

from analyzer import cli
from analyzer.api import analyze
from analyzer.engines import parse_and_map
from analyzer.errors import TraceError
from analyzer.ingest import jobs
from analyzer.rankmap import UnitResult


def _rank(rank: int, world: int, slow_us: int = 0) -> KinetoTrace:
    t = KinetoTrace(rank=rank, world_size=world)
    for i, start in enumerate((0, 2000)):
        t.step(10 + i, start, 1800)
        t.linear(start + 100, 64, 128, 256, 300 + slow_us)
        t.kernel(
            "ncclKernel_AllReduce_RING_LL_Sum_float",
            start + 1000,
            400,
            stream=20,
            args=t.comm_args("allreduce", 1 << 16),
        )
    return t


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    out = tmp_path / "ranks"
    out.mkdir()
    for rank in range(4):
        _rank(rank, 4, slow_us=100 * rank).write(out / f"rank{rank}.json.gz")
    return out


def _report(analysis) -> dict:
    doc = analysis.to_json()
    doc.pop("generator", None)
    return json.loads(json.dumps(doc, default=str))


@pytest.mark.parametrize(
    ("n_files", "cpus", "expected"),
    [(1, 2, False), (3, 2, False), (4, 2, True), (8, 2, True), (7, 4, False), (8, 4, True), (8, 1, False)],
)
def test_workers_map_when_each_gets_two_files(n_files: int, cpus: int, expected: bool) -> None:
    assert cli.map_in_workers(n_files, cpus) is expected


def test_mapped_in_workers_is_the_same_report(folder: Path) -> None:
    files = sorted(folder.glob("*.json.gz"))
    with jobs.ParseJobs(files, workers=2, task=parse_and_map) as pending:
        in_workers = analyze(folder, cache=False, jobs=pending)
    here = analyze(folder, cache=False)
    assert [r.rank for r in in_workers.ranks] == [0, 1, 2, 3]
    # rank 3's GEMM is 300 us longer than rank 0's in each of the two steps: a difference the map must carry.
    gemm_ms = {r.rank: r.breakdown["compute"]["mean_ms"] for r in in_workers.ranks}
    assert gemm_ms[3] - gemm_ms[0] == pytest.approx(0.3, abs=1e-9)
    assert _report(in_workers) == _report(here)


def test_a_bad_file_is_one_line_either_way(folder: Path) -> None:
    broken = folder / "rank9.json"
    broken.write_text('{"traceEvents": [')
    files = sorted([*folder.glob("*.json.gz"), broken])
    with jobs.ParseJobs(files, workers=2, task=parse_and_map) as pending:
        # The worker's answer for the bad file is its outcome, not an exception.
        result = pending.take(broken)
        assert isinstance(result, UnitResult) and result.part is None
        ((path, error, _warnings),) = result.outcomes
        assert path == broken and isinstance(error, TraceError) and "ends early" in str(error)
    with jobs.ParseJobs(files, workers=2, task=parse_and_map) as pending:
        in_workers = analyze(folder, cache=False, jobs=pending)
    here = analyze(folder, cache=False)
    assert in_workers.errors == here.errors and len(here.errors) == 1 and here.errors[0].startswith("rank9.json: ")
    assert [r.rank for r in in_workers.ranks] == [0, 1, 2, 3]


def test_cli_chooses_the_task_before_any_heavy_import(folder: Path, tmp_path: Path) -> None:
    """Four files on two CPUs: the workers map; the choice imports neither numpy, pandas nor pyarrow (the workers
    are forked from a process without threads, analyzer.ingest.jobs)."""
    code = (
        "import sys, os\n"
        "from pathlib import Path\n"
        "os.sched_setaffinity(0, {0, 1}) if len(os.sched_getaffinity(0)) > 2 else None\n"
        "from analyzer import cli\n"
        f"pending = cli.start_parsing([Path({str(folder)!r})], cache=False)\n"
        "heavy = [m for m in ('numpy', 'pandas', 'pyarrow') if m in sys.modules]\n"
        # The task may come with its options bound (functools.partial): its function is what was chosen.
        "print(getattr(pending.task, 'func', pending.task).__name__, len(pending._pending), heavy)\n"
        "pending.close()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["parse_and_map", "4", "[]"]


def test_windows_of_one_rank_are_not_mapped_file_by_file(tmp_path: Path) -> None:
    """Two profiler windows per rank (reftrain's flat ``rank{R}.step{N}`` names): a rank's unit is both its files
    (analyzer.execute.plan), so the workers only parse."""
    run = tmp_path / "windows"
    run.mkdir()
    for window in (10, 20):
        for rank in range(2):
            _rank(rank, 2).write(run / f"rank{rank}.step{window}.json.gz")
    pending = cli.start_parsing([run], cache=False)
    assert pending is not None
    try:
        assert len(pending._pending) == 4 and pending.task is jobs.parse_file
    finally:
        pending.close()


def test_a_worker_that_dies_costs_its_file_only(folder: Path, monkeypatch) -> None:
    """The OOM killer's SIGKILL in a mapping worker: that file is one error line, every other rank is mapped."""
    import os
    import signal

    from analyzer.ingest import cache

    real = cache.parse_and_store

    def hostile(path, entry):
        if path.name == "killer.json.gz":
            os.kill(os.getpid(), signal.SIGKILL)
        return real(path, entry)

    monkeypatch.setattr(cache, "parse_and_store", hostile)
    monkeypatch.setattr(jobs, "start_method", lambda: "fork")  # forked workers inherit the patch
    killer = folder / "killer.json.gz"
    killer.write_bytes((folder / "rank0.json.gz").read_bytes())
    files = sorted(folder.glob("*.json.gz"))
    with jobs.ParseJobs(files, workers=2, task=parse_and_map) as pending:
        got = {}
        for f in files:
            try:
                result = pending.take(f)
                got[f.name] = result.part.rank
            except TraceError as err:
                got[f.name] = str(err)
    assert got == {
        "killer.json.gz": "killer.json.gz: the parse worker died (killed by SIGKILL (out of memory?))",
        "rank0.json.gz": 0,
        "rank1.json.gz": 1,
        "rank2.json.gz": 2,
        "rank3.json.gz": 3,
    }


def _sigterm_disposition(path, entry):
    import signal

    return signal.getsignal(signal.SIGTERM)


def test_workers_take_sigterm_by_default_whatever_the_parent_installed(folder: Path, monkeypatch) -> None:
    """A training job's recorder installs a Python SIGTERM handler; forked parse workers must not inherit it.

    A worker running such a handler survived the pool's terminate() while blocked
    writing a result nobody read, and the suite waited on it forever.
    """
    import signal

    monkeypatch.setattr(jobs, "start_method", lambda: "fork")
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        files = sorted(folder.glob("*.json.gz"))[:2]
        with jobs.ParseJobs(files, workers=2, task=_sigterm_disposition) as pending:
            got = [pending.take(f) for f in files]
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert got == [signal.SIG_DFL, signal.SIG_DFL]
