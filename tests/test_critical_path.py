"""The critical path (analyzer.metrics.critical_path) on synthesized steps with exact answers.

Each step is built so that one path is the longest by construction (whole microseconds; the
expected lengths and shares are sums of the given durations).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analyzer.ingest.load import load_trace
from analyzer.ingest.tables import empty_events, empty_steps
from analyzer.metrics.critical_path import OPS_COLUMNS, critical_path, critical_paths
from analyzer.metrics.depgraph import BOUND_CATEGORIES, step_graph
from synth import KinetoTrace
from test_depgraph import device, gpu_bound_step, host, launch, tables


def test_gpu_bound_step_breakdown_exactly() -> None:
    """gpu_bound_step: 5 us of the step's own host time, a 7 us launch delay, K1 40 us, a 3 us queue gap,
    K2 30 us, the synchronize's 3 us return after K2, then 12 us of the step's own time: 100 us."""
    events, steps = tables(gpu_bound_step())
    cp = critical_path(step_graph(events, steps, 1), events)
    assert cp.length_ms == pytest.approx(0.1, abs=1e-12)
    assert cp.breakdown_pct == pytest.approx(
        {
            "cpu_bound": 20.0,  # 5 + 3 + 12 (the two launch calls are off the path: the device's path arrives later)
            "data_loading": 0.0,
            "gpu_compute_bound": 70.0,
            "gpu_communication_bound": 0.0,
            "gpu_kernel_kernel_overhead": 3.0,
            "gpu_kernel_launch_overhead": 7.0,
        }
    )
    assert list(cp.breakdown_pct) == list(BOUND_CATEGORIES)
    ops = cp.ops.set_index(["name", "bound"])
    assert ops.loc[("K1", "gpu_compute_bound"), "ms_on_path"] == pytest.approx(0.040)
    assert ops.loc[("K1", "gpu_kernel_launch_overhead"), "ms_on_path"] == pytest.approx(0.007)
    assert ops.loc[("K1", "gpu_kernel_kernel_overhead"), "ms_on_path"] == pytest.approx(
        0.003
    )  # HTA: the earlier kernel's
    assert ops.loc[("ProfilerStep#1", "cpu_bound"), "ms_on_path"] == pytest.approx(0.017)
    assert ops.loc[("cudaDeviceSynchronize", "cpu_bound"), "ms_on_path"] == pytest.approx(0.003)
    assert cp.ops["pct"].sum() == pytest.approx(100.0)
    assert tuple(cp.ops.columns) == OPS_COLUMNS
    assert cp.ops["ms_on_path"].is_monotonic_decreasing
    # The path's edges, in order, sum to its length and chain node to node.
    g = cp.graph
    assert int(g.edge_weight_ns[cp.path_edges].sum()) == 100_000
    assert (g.edge_dst[cp.path_edges[:-1]] == g.edge_src[cp.path_edges[1:]]).all()


def test_cpu_bound_step_breakdown_exactly() -> None:
    """Op A 10..50 launches a 10 us kernel; op B 60..90; the step 0..100: all of it is host time."""
    events, steps = tables(
        [
            host("ProfilerStep#1", 0, 100, cat="user_annotation"),
            host("A", 10, 40),
            launch(20, 1),
            device("K", 30, 10, 1),
            host("B", 60, 30),
        ]
    )
    cp = critical_path(step_graph(events, steps, 1), events)
    assert cp.breakdown_pct["cpu_bound"] == pytest.approx(100.0)
    got = dict(zip(cp.ops["name"], cp.ops["ms_on_path"]))
    assert got == pytest.approx({"A": 0.035, "B": 0.030, "ProfilerStep#1": 0.030, "cudaLaunchKernel": 0.005})
    assert dict(zip(cp.ops["name"], cp.ops["count"]))["A"] == 1


def test_data_loading_patterns() -> None:
    events, steps = tables(
        [
            host("ProfilerStep#1", 0, 100, cat="user_annotation"),
            host("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 40),
            host("forward", 40, 60),
        ]
    )
    g = step_graph(events, steps, 1, data_load_patterns=(r"DataLoader",))
    assert critical_path(g, events).breakdown_pct["data_loading"] == pytest.approx(40.0)


def test_previous_step_backlog_is_device_time() -> None:
    """The stream is busy until 60 with a kernel launched before the step (0..95); the step's kernel,
    launched at 5, runs 62..98 behind it, past the annotation's end: the path is the backlog (60 us,
    the earlier kernel's time in the window), the 2 us gap and the kernel's 36 us."""
    events, steps = tables(
        [
            launch(-50, 1, dur_us=5),
            device("earlier", -40, 100, 1),
            host("ProfilerStep#1", 0, 95, cat="user_annotation"),
            launch(5, 2),
            device("K", 62, 36, 2),
        ]
    )
    cp = critical_path(step_graph(events, steps, 1), events)
    got = dict(zip(zip(cp.ops["name"], cp.ops["bound"]), cp.ops["ms_on_path"]))
    assert got == pytest.approx(
        {
            ("earlier", "gpu_compute_bound"): 0.060,
            ("earlier", "gpu_kernel_kernel_overhead"): 0.002,
            ("K", "gpu_compute_bound"): 0.036,
        }
    )
    assert cp.length_ms == pytest.approx(0.098)


def test_critical_paths_one_per_step_and_none_without(tmp_path: Path) -> None:
    t = KinetoTrace(rank=3, world_size=4)
    t.step(7, 0, 100)
    t.kernel("K", 20, 50, launch_us=10)
    t.step(8, 100, 50)
    t.cpu_op("aten::add", 110, 30)
    rt = load_trace(t.write(tmp_path / "rank3.json.gz"))
    cps = critical_paths(rt)
    assert [(c.rank, c.step) for c in cps] == [(3, 7), (3, 8)]
    assert [c.length_ms for c in cps] == pytest.approx([0.1, 0.05])
    assert cps[1].breakdown_pct["cpu_bound"] == pytest.approx(100.0)

    bare = KinetoTrace(rank=0)
    bare.cpu_op("aten::add", 0, 30)
    assert critical_paths(load_trace(bare.write(tmp_path / "bare.json.gz"))) == []


def test_no_events_give_an_empty_path() -> None:
    g = step_graph(empty_events(), empty_steps(), -1)
    cp = critical_path(g, empty_events())
    assert cp.length_ms == 0.0 and set(cp.breakdown_pct.values()) == {0.0}
    assert cp.ops.empty and len(cp.path_edges) == 0
    assert np.array_equal(g.node_ts_ns, np.zeros(0, np.int64))
