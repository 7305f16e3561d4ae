"""The replay of every shared trace's profiled steps, unchanged, is the measured step (issue's bar: within 2 %).

The builder's invariant makes the unchanged replay exact (the longest path is the span); the rewrites of
measured waits (analyzer.metrics.replay.replay_weights) must keep it so. Runs over every trace with
ProfilerStep markers in ../shared/traces (skipped where that folder is absent).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.errors import TraceError
from analyzer.ingest.load import load_trace
from analyzer.metrics.depgraph import build_step_graph
from analyzer.metrics.replay import apply, edge_facts, no_launch_overhead, replay
from tests.conftest import REPO

TRACES = REPO.parent / "shared" / "traces"
# At most this many steps per trace: the steps of one trace share their structure.
STEPS_PER_TRACE = 2


def trace_files() -> list[Path]:
    if not TRACES.is_dir():
        return []
    return sorted(p for p in TRACES.rglob("*.json*") if p.name.endswith((".json", ".json.gz")))


@pytest.mark.parametrize("path", trace_files(), ids=lambda p: str(p.relative_to(TRACES)))
def test_unchanged_replay_is_the_measured_step(path: Path):
    try:
        trace = load_trace(path)
    except TraceError as exc:
        pytest.skip(f"not a trace the analyzer reads: {exc}")
    steps = trace.steps["step"].astype(int).tolist()[:STEPS_PER_TRACE]
    if not steps:
        pytest.skip("no ProfilerStep markers")
    for step in steps:
        graph = build_step_graph(trace, step)
        r = replay(graph)
        assert r.measured_ns == graph.span_ns
        assert abs(r.length_ns - r.measured_ns) <= 0.02 * r.measured_ns, (step, r.length_ms, r.measured_ms)
        # A change can only shorten a step when it removes time: launches for free never lengthen one.
        fewer = replay(graph, apply(graph, edge_facts(graph, trace.events), [no_launch_overhead]))
        assert fewer.length_ns <= r.length_ns


def test_the_shared_traces_are_there():
    if not TRACES.is_dir():
        pytest.skip(f"shared traces not found at {TRACES} (only in the project's CI and dev machines)")
    assert len(trace_files()) >= 10
