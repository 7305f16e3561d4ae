"""The critical path's presentation: the brief kept per step, the report sections, the JSON, the overlaid trace.

The paths here are built by hand on a synthetic trace (one step: an op
launches a kernel, a later op waits for it), so every mark, arrow and
number has an exact expected value independent of the graph builder.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer.api import analyze
from analyzer.ingest.load import load_traces
from analyzer.metrics.critical_path import CriticalPath
from analyzer.metrics.critical_summary import (
    OPS_COLUMNS,
    RunCriticalPath,
    StepCriticalPath,
    run_critical_path,
    step_critical_path,
)
from analyzer.metrics.depgraph import BOUND_CATEGORIES, EDGE_KINDS, StepGraph
from analyzer.render.html import report_html
from analyzer.render.text import report_text
from analyzer.verbs.critical_trace import FLOW_CAT, MARK_ARG, overlay_trace
from tests.synth import KinetoTrace


def _trace(tmp_path: Path) -> Path:
    t = KinetoTrace(rank=0, world_size=1)
    t.step(1, 0, 1000)
    t.cpu_op("aten::mm", 10, 100, input_dims=[[64, 64], [64, 64]], input_types=["float", "float"])
    t.runtime("cudaLaunchKernel", 100, 10, correlation=1)
    t.kernel("sgemm", 120, 500, correlation=1)
    t.kernel("relu", 630, 10)
    t.cpu_op("aten::item", 600, 390)
    return t.write(tmp_path / "rank0.json.gz")


def _row(events: pd.DataFrame, name: str) -> int:
    rows = np.flatnonzero(events["name"].astype(str).to_numpy() == name)
    assert len(rows) == 1, name
    return int(rows[0])


def _path(events: pd.DataFrame) -> CriticalPath:
    """The step's path by hand: step start -> mm -> launch -> (launch delay) -> sgemm -> (sync) -> item end."""
    step, mm, launch = _row(events, "ProfilerStep#1"), _row(events, "aten::mm"), _row(events, "cudaLaunchKernel")
    sgemm, item = _row(events, "sgemm"), _row(events, "aten::item")
    # node: (ts_ns, event, is_start)
    nodes = [
        (0, step, True),
        (10_000, mm, True),
        (100_000, launch, True),
        (110_000, launch, False),
        (120_000, sgemm, True),
        (620_000, sgemm, False),
        (990_000, item, False),
        (1_000_000, step, False),
    ]
    kind = {k: i for i, k in enumerate(EDGE_KINDS)}
    bound = {b: i for i, b in enumerate(BOUND_CATEGORIES)}
    # edge: (src, dst, weight_ns, kind, event, bound)
    edges = [
        (0, 1, 10_000, "op", step, "cpu_bound"),
        (1, 2, 90_000, "op", mm, "cpu_bound"),
        (2, 3, 10_000, "op", launch, "cpu_bound"),
        (3, 4, 10_000, "launch_delay", sgemm, "gpu_kernel_launch_overhead"),
        (4, 5, 500_000, "op", sgemm, "gpu_compute_bound"),
        (5, 6, 0, "sync", -1, None),
        (6, 7, 10_000, "op", step, "cpu_bound"),
    ]
    graph = StepGraph(
        rank=0,
        step=1,
        start_node=0,
        end_node=7,
        node_ts_ns=np.array([n[0] for n in nodes], dtype=np.int64),
        node_event=np.array([n[1] for n in nodes], dtype=np.int64),
        node_is_start=np.array([n[2] for n in nodes], dtype=bool),
        edge_src=np.array([e[0] for e in edges], dtype=np.int64),
        edge_dst=np.array([e[1] for e in edges], dtype=np.int64),
        edge_weight_ns=np.array([e[2] for e in edges], dtype=np.int64),
        edge_kind=np.array([kind[e[3]] for e in edges], dtype=np.int8),
        edge_event=np.array([e[4] for e in edges], dtype=np.int64),
        edge_bound=np.array([bound[e[5]] if e[5] else -1 for e in edges], dtype=np.int8),
    )
    ops = pd.DataFrame(
        {
            "name": ["ProfilerStep#1", "aten::mm", "cudaLaunchKernel", "sgemm"],
            "kind": ["annotation", "cpu_op", "runtime", "compute"],
            "bound": ["cpu_bound", "cpu_bound", "cpu_bound", "gpu_compute_bound"],
            "ms_on_path": [0.02, 0.09, 0.01, 0.51],
            "pct": [3.1746, 14.2857, 1.5873, 80.9524],
            "count": [1, 1, 1, 1],
        }
    )
    breakdown = {b: 0.0 for b in BOUND_CATEGORIES}
    breakdown.update(cpu_bound=20.6349, gpu_compute_bound=79.3651, gpu_kernel_launch_overhead=1.5873)
    return CriticalPath(0, 1, 0.63, breakdown, ops, np.arange(len(edges), dtype=np.int64), graph)


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory):
    path = _trace(tmp_path_factory.mktemp("cp"))
    rt = load_traces([path], cache=False, progress=False).ranks[0]
    return path, rt, _path(rt.events)


def test_step_brief_keeps_the_top_ops_by_time_on_the_path(traced) -> None:
    _, _, cp = traced
    brief = step_critical_path(cp, top=2)
    assert (brief.rank, brief.step, brief.length_ms, brief.n_ops) == (0, 1, 0.63, 4)
    assert list(brief.breakdown_pct) == list(BOUND_CATEGORIES)
    assert brief.breakdown_pct["gpu_compute_bound"] == 79.3651
    assert tuple(brief.ops.columns) == OPS_COLUMNS
    assert brief.ops["name"].tolist() == ["sgemm", "aten::mm"]
    assert brief.ops["ms_on_path"].tolist() == [0.51, 0.09]
    entry = brief.to_json()
    assert entry["ops"][0] == {
        "name": "sgemm",
        "kind": "compute",
        "bound": "gpu_compute_bound",
        "ms_on_path": 0.51,
        "pct": 80.9524,
        "count": 1,
    }
    one = dataclasses.replace(brief, rank=1)
    run = run_critical_path({1: [dataclasses.replace(one, step=3), one], 0: [brief]})
    assert [(p.rank, p.step) for p in run.paths] == [(0, 1), (1, 1), (1, 3)]
    assert run.table()["gpu_compute_bound"].tolist() == [79.3651] * 3


def test_overlay_marks_the_path_and_reloads_as_the_same_events(traced, tmp_path: Path) -> None:
    _, rt, cp = traced
    overlay = overlay_trace(rt, [cp])
    ev = rt.events
    on_path = {_row(ev, n) for n in ("ProfilerStep#1", "aten::mm", "cudaLaunchKernel", "sgemm", "aten::item")}
    assert (overlay.n_marked, overlay.n_flows, overlay.steps) == (5, 2, (1,))
    out = tmp_path / "overlay.json.gz"
    overlay.write(out)
    doc = json.loads(gzip.decompress(out.read_bytes()))
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {i for i, e in enumerate(xs) if e["args"].get(MARK_ARG) == 1} == on_path
    # Time on the path per event: the weights of the path edges attributed to it, in ms.
    by_name = {e["name"]: e["args"] for e in xs}
    assert by_name["sgemm"]["critical_path_ms"] == 0.51
    assert by_name["ProfilerStep#1"]["critical_path_ms"] == 0.02
    assert by_name["aten::item"]["critical_path_steps"] == [1]
    assert MARK_ARG not in by_name["relu"]
    # Arrows where the path changes lane: launch -> kernel, kernel -> the op that waited for it.
    flows = [e for e in doc["traceEvents"] if e.get("cat") == FLOW_CAT]
    pairs = [(flows[i]["tid"], flows[i + 1]["tid"], flows[i]["args"]["kind"]) for i in range(0, len(flows), 2)]
    stream, host = 7, int(ev["tid"].iloc[_row(ev, "aten::mm")])
    assert pairs == [(host, stream, "launch_delay"), (stream, host, "sync")]
    assert [f["ts"] for f in flows] == [109.999, 120.0, 619.999, 989.999]  # ends 1 ns early
    assert [f["ph"] for f in flows] == ["s", "f", "s", "f"] and flows[1]["bp"] == "e"
    # Our own loader reads the overlay back into the same events table (times from the first event).
    back = load_traces([out], cache=False, progress=False).ranks[0]
    assert back.rank == rt.rank and back.clock_origin_ns == rt.clock_origin_ns + int(ev["start_ns"].min())
    for col in ("name", "kind", "cat", "pid", "tid", "stream", "correlation", "external_id", "input_dims"):
        assert back.events[col].astype(object).tolist() == ev[col].astype(object).tolist(), col
    t0 = int(ev["start_ns"].min())
    assert (back.events["start_ns"].to_numpy() == ev["start_ns"].to_numpy() - t0).all()
    assert (back.events["end_ns"].to_numpy() == ev["end_ns"].to_numpy() - t0).all()
    assert back.steps["step"].tolist() == [1]


def test_report_sections_and_json_show_the_paths(traced) -> None:
    path, _, cp = traced
    brief = step_critical_path(cp)
    ra = dataclasses.replace(analyze(path, cache=False), critical_path=RunCriticalPath([brief]))
    entry = ra.to_json()["critical_path"]
    assert entry == [brief.to_json()] and entry[0]["length_ms"] == 0.63
    text = report_text(ra)
    section = text[text.index("Critical path per profiled step") :]
    lines = section.splitlines()
    assert lines[1].split() == [
        "rank",
        "step",
        "length",
        "ms",
        "cpu",
        "%",
        "data",
        "%",
        "compute",
        "%",
        "comm",
        "%",
    ] + [
        "kernel-kernel",
        "%",
        "launch",
        "%",
    ]
    assert lines[3].split() == ["0", "1", "0.63", "20.6", "0.0", "79.4", "0.0", "0.0", "1.6"]
    assert "rank 0, step 1 (0.63 ms, 4 ops on the path)" in section
    assert [ln.split()[0] for ln in lines[9:13]] == ["sgemm", "aten::mm", "ProfilerStep#1", "cudaLaunchKernel"]
    page = report_html(ra)
    assert "<h2>Critical path</h2>" in page and "r0 s1" in page
    assert "<td>79.4</td>" in page and '<td class="l">sgemm</td>' in page


def test_report_without_profiled_steps_has_no_section(traced) -> None:
    path, _, _ = traced
    ra = dataclasses.replace(analyze(path, cache=False), critical_path=RunCriticalPath([]))
    assert ra.to_json()["critical_path"] == []
    assert "Critical path" not in report_text(ra) and "Critical path" not in report_html(ra)


def test_brief_is_stored_in_the_rank_summary_format() -> None:
    from analyzer import rankcache

    brief = StepCriticalPath(
        2,
        7,
        1.5,
        {b: 0.0 for b in BOUND_CATEGORIES},
        pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(OPS_COLUMNS, [object] * 3 + ["float64"] * 2 + ["int64"])}),
        0,
    )
    arrays: list[np.ndarray] = []
    back = rankcache.decode(rankcache.encode([brief], arrays), arrays)[0]
    assert (back.rank, back.step, back.length_ms, back.breakdown_pct) == (2, 7, 1.5, brief.breakdown_pct)
    assert list(back.ops.columns) == list(OPS_COLUMNS)


def test_report_writes_the_overlay_of_the_asked_rank(tmp_path: Path, capsys) -> None:
    from analyzer import cli
    from analyzer.metrics.critical_path import critical_paths

    folder = tmp_path / "run"
    for rank in (0, 1):
        t = KinetoTrace(rank=rank, world_size=2)
        t.step(1, 0, 1000)
        t.cpu_op("aten::mm", 10, 100)
        t.kernel("sgemm", 120, 500 + 100 * rank, launch_us=50)
        t.write(folder / f"rank{rank}.json.gz")
    out = tmp_path / "cp.json.gz"
    code = cli.main(
        ["report", str(folder), "--no-cache", "--critical-path-trace", str(out), "--critical-path-rank", "1"]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    rt = load_traces([folder / "rank1.json.gz"], cache=False, progress=False).ranks[1]
    (cp,) = critical_paths(rt)
    expected = {int(e) for e in cp.graph.edge_event[cp.path_edges] if e >= 0}
    expected |= {int(e) for e in cp.graph.node_event[cp.graph.edge_src[cp.path_edges]] if e >= 0}
    expected |= {int(e) for e in cp.graph.node_event[cp.graph.edge_dst[cp.path_edges]] if e >= 0}
    doc = json.loads(gzip.decompress(out.read_bytes()))
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {i for i, e in enumerate(xs) if e["args"].get(MARK_ARG) == 1} == expected
    assert doc["distributedInfo"]["rank"] == 1
    assert f"rank 1's trace (rank1.json.gz) with the critical path of step(s) 1 marked ({len(expected)} events" in err
    # A rank the run does not have: one line, exit 2, no overlay written, the report printed.
    code = cli.main(
        ["report", str(folder), "--critical-path-trace", str(tmp_path / "x.json"), "--critical-path-rank", "5"]
    )
    out_text, err = capsys.readouterr()
    assert code == 2 and "rank 5: not in this run (ranks: 0, 1)" in err and not (tmp_path / "x.json").exists()
    assert "Critical path per profiled step" in out_text  # the report itself is still printed


def test_overlay_of_a_trace_without_steps_is_one_line(tmp_path: Path) -> None:
    from analyzer.errors import AnalyzerError
    from analyzer.verbs.critical_trace import critical_path_trace

    t = KinetoTrace(rank=0, world_size=1)
    t.kernel("sgemm", 120, 500, launch_us=50)
    path = t.write(tmp_path / "rank0.json.gz")
    with pytest.raises(AnalyzerError, match=r"rank0.json.gz: no ProfilerStep window, so no critical path to mark"):
        critical_path_trace(path)


def test_reports_print_at_most_eight_paths(traced) -> None:
    from analyzer.render.critical_path import shown_note, shown_paths

    path, _, cp = traced
    brief = step_critical_path(cp)
    base = analyze(path, cache=False)

    def run(paths: list[tuple[int, int, float]]):
        briefs = [dataclasses.replace(brief, rank=r, step=s, length_ms=ms) for r, s, ms in paths]
        return dataclasses.replace(base, critical_path=RunCriticalPath(briefs))

    # 3 ranks x 4 steps: each rank's longest step.
    few_ranks = run([(r, s, 10.0 * r + s) for r in range(3) for s in range(4)])
    assert [(p.rank, p.step) for p in shown_paths(few_ranks)] == [(0, 3), (1, 3), (2, 3)]
    assert shown_note(few_ranks) == "  Shown: each rank's longest step (3 of 12 paths; the JSON report has every one)."
    text = report_text(few_ranks)
    assert text.count("ops on the path)") == 3 and len(few_ranks.to_json()["critical_path"]) == 12
    # 12 ranks x 1 step of (5 r mod 12) ms: the 8 longest (ranks 7, 2, 9, 4, 11, 6, 1, 8), by rank.
    many = run([(r, 1, float((r * 5) % 12)) for r in range(12)])
    assert [p.rank for p in shown_paths(many)] == [1, 2, 4, 6, 7, 8, 9, 11]
    assert "the 8 ranks with the longest step (8 of 12 paths" in shown_note(many)
    # Up to 8 paths, every one and no note.
    eight = run([(r, s, 1.0) for r in range(2) for s in range(4)])
    assert len(shown_paths(eight)) == 8 and shown_note(eight) == ""
