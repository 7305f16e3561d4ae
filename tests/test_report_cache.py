"""`analyzer report`'s result cache and the parse jobs started before pandas.

The cache must replay exactly what the analysis printed and wrote, and
must miss whenever an input, an option or the code changed; the parse
jobs must give the same tables as parsing in-process, and the CLI's start
must not import numpy or pandas (the point of both).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synth import KinetoTrace
from test_compare import PEAK, write_run

import analyzer.api
from analyzer import cli
from analyzer.ingest import jobs, load
from analyzer.verbs import report_cache
from analyzer.errors import TraceError


@pytest.fixture
def run(tmp_path: Path) -> Path:
    folder = write_run(tmp_path / "run")
    # A third rank id beyond world_size 2: the analysis warns about it, and
    # the warning must be replayed from the cache.
    t = KinetoTrace(rank=5, world_size=2)
    t.step(10, 0, 1000)
    t.kernel("sgemm", 100, 200)
    t.write(folder / "rank5.json.gz")
    return folder


def main(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_analysis(monkeypatch):
    """Make any analysis fail loudly: a report that still succeeds came from the cache."""

    def refuse(*args, **kwargs):
        raise AssertionError("analyzed although the report was cached")

    def arm() -> None:
        monkeypatch.setattr(analyzer.api, "analyze", refuse)

    return arm


def test_second_report_is_replayed_exactly(run: Path, tmp_path: Path, capsys, no_analysis) -> None:
    first_json, second_json = tmp_path / "a.json", tmp_path / "b.json"
    code, out1, err1 = main(capsys, "report", str(run), "--json", str(first_json), "--peak-flops", str(PEAK))
    assert code == 0
    assert "analyzer: warning: ranks 5 are outside world_size 2" in err1
    no_analysis()
    code, out2, err2 = main(capsys, "report", str(run), "--json", str(second_json), "--peak-flops", str(PEAK))
    assert code == 0
    assert out2 == out1 and err2 == err1
    a, b = json.loads(first_json.read_text()), json.loads(second_json.read_text())
    assert b["generator"]["created_at"] >= a["generator"]["created_at"]
    a["generator"].pop("created_at"), b["generator"].pop("created_at")
    assert a == b
    assert b["run"]["mfu"]["source"] == "trace-shapes" and [r["rank"] for r in b["ranks"]] == [0, 1, 5]
    entries = list((run / ".analyzer-cache").glob("report.*.json"))
    assert len(entries) == 1


@pytest.mark.parametrize("change", ["touch a trace", "add a trace", "other --top", "other --peak-flops", "code"])
def test_any_change_misses(run: Path, capsys, no_analysis, monkeypatch, change: str) -> None:
    argv = ["report", str(run), "--peak-flops", str(PEAK)]
    assert main(capsys, *argv)[0] == 0
    if change == "touch a trace":
        st = (run / "rank0.json.gz").stat()
        os.utime(run / "rank0.json.gz", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    elif change == "add a trace":
        (run / "rank1.json.gz").rename(run / "rank1-copy.json.gz")
    elif change == "other --top":
        argv += ["--top", "3"]
    elif change == "other --peak-flops":
        argv[-1] = str(PEAK * 2)
    else:
        monkeypatch.setattr(report_cache, "_code", [("analyzer/api.py", 1, 2)])
    no_analysis()
    code, _, err = main(capsys, *argv)
    assert code == 3 and "analyzed although the report was cached" in err


def test_no_cache_and_html_always_analyze(run: Path, tmp_path: Path, capsys, no_analysis) -> None:
    assert main(capsys, "report", str(run))[0] == 0
    no_analysis()
    for argv in (["--no-cache"], ["--html", str(tmp_path / "r.html")]):
        code, _, err = main(capsys, "report", str(run), *argv)
        assert code == 3 and "analyzed although" in err, argv


def test_output_written_into_the_run_does_not_invalidate_it(run: Path, capsys, no_analysis) -> None:
    target = run / "report.json"
    assert main(capsys, "report", str(run), "--json", str(target))[0] == 0
    assert main(capsys, "report", str(run), "--json", str(target))[0] == 0  # the file now exists: still a hit?
    no_analysis()
    code, _, err = main(capsys, "report", str(run), "--json", str(target))
    assert code == 0, err
    assert json.loads(target.read_text())["schema"] == "analyzer.report/1"


def test_corrupt_entry_is_ignored_and_rewritten(run: Path, capsys) -> None:
    code, out, _ = main(capsys, "report", str(run))
    (entry,) = (run / ".analyzer-cache").glob("report.*.json")
    entry.write_text("{ not json")
    code, out2, _ = main(capsys, "report", str(run))
    assert code == 0 and out2 == out
    assert json.loads(entry.read_text())["document"]["schema"] == "analyzer.report/1"


def test_cli_start_imports_neither_numpy_nor_pandas(run: Path) -> None:
    """Up to the cache lookup and the start of the parse workers, nothing heavy is imported."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from analyzer import cli\nfrom analyzer.verbs import report_cache\n"
        f"jobs = cli.start_parsing([Path({str(run)!r})], cache=False)\n"
        "assert jobs is not None and len(jobs._pending) == 3\n"
        f"report_cache.entry_path(Path({str(run)!r}), {{}})\n"
        "heavy = [m for m in ('numpy', 'pandas', 'pyarrow') if m in sys.modules]\n"
        "jobs.close()\n"
        "print(heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_parse_jobs_give_the_in_process_tables(run: Path, tmp_path: Path) -> None:
    files = sorted(run.glob("*.json.gz"))
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [')
    with jobs.ParseJobs([*files, broken], workers=2) as pending:
        assert all(f in pending for f in files) and broken in pending
        for f in files:
            pd.testing.assert_frame_equal(load.rank_trace(pending.take(f)).events, load.parse_trace(f).events)
        workers = list(pending._pool._processes.values())
        with pytest.raises(TraceError) as err:
            pending.take(broken)
        assert err.value.path == broken.absolute() and "ends early" in str(err.value)
        # The last result taken stops the workers (their memory is not held through the analysis).
        assert pending._pool is None and not any(w.is_alive() for w in workers)


def test_load_traces_takes_started_jobs(run: Path, monkeypatch) -> None:
    files = sorted(run.glob("*.json.gz"))
    with jobs.ParseJobs(files) as pending:
        monkeypatch.setattr(load, "parse_columns", lambda path: pytest.fail(f"parsed {path} again in-process"))
        ts = load.load_traces(run, cache=False, jobs=pending)
    assert sorted(ts.ranks) == [0, 1, 5]


def test_closing_unfinished_jobs_stops_the_workers(tmp_path: Path) -> None:
    """Files nobody takes (the analysis failed early) are abandoned, not awaited."""
    t = KinetoTrace(rank=0, world_size=1)
    for i in range(40_000):
        t.cpu_op(f"op{i % 50}", i * 10, 5)
    first, second = t.write(tmp_path / "big.json"), t.write(tmp_path / "big2.json")
    pending = jobs.ParseJobs([first, second], workers=1)
    workers = list(pending._pool._processes.values())
    result = pending._pending[second.absolute()]
    assert not result.done()  # one worker, two big files: the second has not even started
    pending.close()
    assert pending._pool is None and not any(w.is_alive() for w in workers)
    assert result.cancelled() or not result.done() or result.exception() is not None


def test_nothing_a_worker_does_ends_the_analysis(run: Path, monkeypatch) -> None:
    """A RecursionError in a worker does not make every verb exit 3: an
    exception is that file's error, and a worker that dies (the OOM killer's
    SIGKILL) costs only the file that killed it: the others, whose pool broke
    with it, are parsed again one by one."""
    import signal

    from analyzer.ingest import cache

    files = sorted(run.glob("*.json.gz"))  # rank0, rank1, rank5
    real = cache.parse_and_store
    doom = {files[0].name: RecursionError("maximum recursion depth exceeded"), files[1].name: MemoryError()}

    def hostile(path, entry):
        if path.name in doom:
            raise doom[path.name]
        if path.name == "killer.json.gz":
            os.kill(os.getpid(), signal.SIGKILL)
        return real(path, entry)

    monkeypatch.setattr(cache, "parse_and_store", hostile)
    # Forked workers inherit the patch (forkserver ones would import the real function).
    monkeypatch.setattr(jobs, "start_method", lambda: "fork")
    killer = run / "killer.json.gz"
    killer.write_bytes(files[2].read_bytes())
    with jobs.ParseJobs([*files, killer], workers=2) as pending:
        outcomes = {}
        for f in [*files, killer]:
            try:
                outcomes[f.name] = len(pending.take(f).columns["ts_ns"])
            except TraceError as err:
                outcomes[f.name] = str(err)
    assert (
        outcomes[files[0].name]
        == f"{files[0].name}: could not be parsed (RecursionError: maximum recursion depth exceeded)"
    )
    assert outcomes[files[1].name] == f"{files[1].name}: could not be parsed (MemoryError: no message)"
    assert outcomes["killer.json.gz"] == "killer.json.gz: the parse worker died (killed by SIGKILL (out of memory?))"
    assert outcomes[files[2].name] == len(load.parse_trace(files[2]).events)  # parsed, alone or not

    # In-process (one worker), the same lines, and the other ranks are analyzed.
    killer.unlink()
    ts = load.load_traces(run, cache=False, workers=1)
    assert sorted(ts.ranks) == [5]
    assert [str(e).split(" (")[0] for e in ts.errors] == [f"{f.name}: could not be parsed" for f in files[:2]]
