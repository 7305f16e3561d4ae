"""Both trace layouts of a reftrain run directory (docs/rundir.md, the `traces/` rows of the layout).

New runs write one folder per profiler window, ``traces/step{N}/rank{R}.pt.trace.json.gz``;
older runs (and the examples under traces/ in the repository) hold
``traces/rank{R}.step{N}.json.gz``. The analyzer groups either by window and
merges a rank's windows into one trace.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synth import KinetoTrace

from analyzer.ingest.locate import run_trace_files, trace_window
from analyzer.ingest.rundir import read_run_dir

REPO = Path(__file__).resolve().parent.parent
NEW = "traces/step{n}/rank{r}.pt.trace.json.gz"
OLD = "traces/rank{r}.step{n}.json.gz"


def _metrics(rank: int, step: int) -> dict:
    return {
        "step": step,
        "rank": rank,
        "loss": 5.0,
        "step_time_ms": 100.0,
        "data_wait_ms": 1.0,
        "forward_ms": 30.0,
        "backward_ms": 50.0,
        "optimizer_ms": 5.0,
        "grad_sync_ms": 0.0,
        "comm_ms": 20.0,
        "tokens": 512,
        "tokens_per_s": 5120.0,
        "mfu": 0.25,
        "hfu": 0.25,
        "mem_bytes": 1 << 30,
        "mem_kind": "cpu_rss",
        "profiled": step in (2, 5),
        "lr": 0.001,
        "time_ns": 1_700_000_000_000_000_000 + step,
    }


def _run(root: Path, layout: str, listed: bool) -> Path:
    """2 ranks, 6 steps, two profiler windows (step 2 and step 5), one ProfilerStep each."""
    run = root / "run"
    traces = []
    for rank in (0, 1):
        (run / "metrics").mkdir(parents=True, exist_ok=True)
        (run / f"metrics/rank{rank}.jsonl").write_bytes(
            b"".join(orjson.dumps(_metrics(rank, s)) + b"\n" for s in range(6))
        )
        for n, start in ((2, 0), (5, 10_000)):
            t = KinetoTrace(rank=rank, world_size=2, gpu=False)
            t.step(n, start, 100)
            rel = layout.format(n=n, r=rank)
            t.write(run / rel)
            traces.append(rel)
    files = {
        "config": "config.yaml",
        "metrics": ["metrics/rank0.jsonl", "metrics/rank1.jsonl"],
        "collectives": [],
        "telemetry": [],
        "traces": sorted(traces) if listed else [],
        "checkpoints": [],
    }
    manifest = {
        "schema": "reftrain.run/1",
        "run_id": "run",
        "status": "completed",
        "world_size": 2,
        "backend": "gloo",
        "files": files,
        "schemas": {"metrics": "reftrain.metrics/1"},
    }
    (run / "run.json").write_bytes(orjson.dumps(manifest))
    return run


def test_trace_window_of_either_layout() -> None:
    assert trace_window(Path("run/traces/step7/rank1.pt.trace.json.gz")) == 7
    assert trace_window(Path("run/traces/rank10.step12.json.gz")) == 12
    assert trace_window(Path("run/traces/rank0.step3.json")) == 3
    # Not reftrain's: no window.
    assert trace_window(Path("hta/rank-0.json.gz")) is None
    assert trace_window(Path("run/traces/step7/notes.txt")) is None
    assert trace_window(Path("run/traces/checkpoints/rank0.pt.trace.json.gz")) is None


@pytest.mark.parametrize("layout", [NEW, OLD], ids=["per-window-folder", "flat"])
@pytest.mark.parametrize("listed", [True, False], ids=["listed", "found-on-disk"])
def test_run_dir_traces_in_either_layout(tmp_path: Path, layout: str, listed: bool) -> None:
    run = _run(tmp_path, layout, listed)
    # A cache folder beside the traces is never taken for a window.
    (run / "traces/.analyzer-cache").mkdir()
    (run / "traces/.analyzer-cache/rank0.json").write_bytes(b"{}")
    expected = [(run / layout.format(n=n, r=r)).absolute() for n in (2, 5) for r in (0, 1)]
    if layout == OLD:  # natural order of the flat names: rank first
        expected = [(run / layout.format(n=n, r=r)).absolute() for r in (0, 1) for n in (2, 5)]
    assert read_run_dir(run).trace_paths == expected
    assert run_trace_files(run) == expected


@pytest.mark.parametrize("layout", [NEW, OLD], ids=["per-window-folder", "flat"])
def test_analysis_merges_each_ranks_windows(tmp_path: Path, layout: str) -> None:
    from analyzer.api import analyze

    a = analyze(_run(tmp_path, layout, listed=True), cache=False)
    got = sorted(zip(a.steps["rank"], a.steps["step"]))
    assert got == [(0, 2), (0, 5), (1, 2), (1, 5)]


@pytest.mark.parametrize("name", ["example-ddp-w2", "example-ddp-w2-slow-rank1"])
def test_example_runs_in_the_repository_stay_readable(name: str) -> None:
    """The committed examples use the flat layout; they must keep analysing."""
    from analyzer.api import analyze

    run = REPO / "traces" / name
    if not run.is_dir():
        pytest.skip(f"{run} is not in this checkout")
    a = analyze(run, cache=False)
    assert sorted(r.rank for r in a.ranks) == [0, 1] and sorted(set(a.steps["step"])) == [6, 7]


def test_a_traces_folder_with_one_window_is_that_window(tmp_path: Path) -> None:
    from analyzer.errors import AnalyzerError
    from analyzer.ingest.locate import find_trace_files

    run = _run(tmp_path, NEW, listed=True)
    with pytest.raises(AnalyzerError, match="in subfolders.*pass that folder"):
        find_trace_files(run / "traces")  # two windows: the user picks one
    for f in (run / "traces/step5").iterdir():
        f.unlink()
    (run / "traces/step5").rmdir()
    assert [p.name for p in find_trace_files(run / "traces")] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
