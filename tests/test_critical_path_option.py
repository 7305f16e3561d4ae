"""The critical path is computed only on request: the API option, the caches keyed on it, the CLI flag.

The input is a one-step synthetic trace (an op launches a kernel, a later op
waits for it); the expected paths are :func:`analyzer.metrics.critical_path.critical_paths`
of the loaded rank, computed directly, without the map or any cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer import cli, rankmap
from analyzer.api import analyze
from analyzer.ingest.cache import TraceCache
from analyzer.ingest.jobs import ParseJobs
from analyzer.ingest.load import load_traces
from analyzer.jsontext import dumps_json
from analyzer.metrics.critical_path import critical_paths
from analyzer.metrics.critical_summary import step_critical_path
from analyzer.render.html import report_html
from analyzer.render.text import report_text
from tests.synth import KinetoTrace

SECTION = "Critical path per profiled step"


def _trace(folder: Path) -> Path:
    t = KinetoTrace(rank=0, world_size=1)
    t.step(1, 0, 1000)
    t.cpu_op("aten::mm", 10, 100, input_dims=[[64, 64], [64, 64]], input_types=["float", "float"])
    t.runtime("cudaLaunchKernel", 100, 10, correlation=1)
    t.kernel("sgemm", 120, 500, correlation=1)
    t.cpu_op("aten::item", 600, 390)
    return t.write(folder / "rank0.json.gz")


def _expected(path: Path) -> list[dict]:
    """The step's path, as the report's JSON holds it, computed without the map."""
    rt = load_traces([path], cache=False, progress=False).ranks[0]
    out = [step_critical_path(cp).to_json() for cp in critical_paths(rt)]
    assert len(out) == 1  # one profiled step
    return out


def _paths(analysis) -> list[dict] | None:
    return None if analysis.critical_path is None else analysis.critical_path.to_json()


def test_paths_are_computed_only_when_asked_for(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    without = analyze(path, cache=False)
    assert without.critical_path is None and without.to_json()["critical_path"] is None
    assert "Critical path" not in report_text(without) and "Critical path" not in report_html(without)
    with_paths = analyze(path, cache=False, critical_path=True)
    assert _paths(with_paths) == _expected(path)
    assert SECTION in report_text(with_paths) and "<h2>Critical path</h2>" in report_html(with_paths)
    # Everything else is the same report.
    a, b = without.to_json(), with_paths.to_json()
    a.pop("critical_path"), b.pop("critical_path")
    assert dumps_json(a) == dumps_json(b)


def test_cached_summaries_key_on_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _trace(tmp_path)
    expected = _expected(path)
    summarize = rankmap.summarize_rank
    calls: list[bool] = []

    def counted(rt, critical_path=False):
        calls.append(critical_path)
        return summarize(rt, critical_path)

    monkeypatch.setattr(rankmap, "summarize_rank", counted)
    assert analyze(path).critical_path is None  # mapped, its summary stored without paths
    # A stored summary without paths must not answer a request for them: mapped again, with them.
    assert _paths(analyze(path, critical_path=True)) == expected
    assert calls == [False, True]
    # The summary with paths answers both requests (the paths dropped when not asked for).
    without = analyze(path)
    assert without.critical_path is None and without.to_json()["critical_path"] is None
    assert _paths(analyze(path, critical_path=True)) == expected
    assert calls == [False, True]


def test_early_workers_map_without_paths_is_not_taken_for_a_request_with_them(tmp_path: Path) -> None:
    from analyzer.engines import parse_and_map

    path = _trace(tmp_path)
    entry = TraceCache().entry_for(path)
    with ParseJobs([path], entries={path: entry}, task=parse_and_map) as jobs:  # a worker maps without paths
        analysis = analyze(path, jobs=jobs, critical_path=True)
    assert _paths(analysis) == _expected(path)


def test_cli_flag_and_the_report_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    path = _trace(folder)
    expected = _expected(path)
    out = tmp_path / "report.json"
    # Each report twice: the second is answered by the report cache, which keys on --critical-path.
    for flags, paths in (([], None), (["--critical-path"], expected), ([], None), (["--critical-path"], expected)):
        for _ in range(2):
            assert cli.main(["report", str(folder), "--json", str(out), *flags]) == 0
            text = capsys.readouterr().out
            assert (SECTION in text) == bool(flags), flags
            assert json.loads(out.read_text())["critical_path"] == paths
