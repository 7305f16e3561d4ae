"""HTA's rules (depgraph.HTA_RULES): each switch of GraphRules on a synthesized step with exact edges
and path lengths (tests/test_critical_path_hta.py compares with HTA itself on the shared traces)."""

from __future__ import annotations

import dataclasses

import pytest

from analyzer.metrics.critical_path import critical_path
from analyzer.metrics.depgraph import (
    HTA_RULES,
    OUR_RULES,
    ROUNDING_NS,
    StepGraph,
    longest_paths,
    step_graph,
    topological_order,
)
from test_depgraph import BWD, check_invariants, device, edges, gpu_bound_step, host, launch, tables


def check_hta_invariants(g: StepGraph) -> int:
    """The contract's invariants but the span: under HTA's rules the longest path is HTA's, at most the
    span. Returns its length (ns)."""
    topological_order(g)  # raises on a cycle
    slack = g.node_ts_ns[g.edge_dst] - g.node_ts_ns[g.edge_src] - g.edge_weight_ns
    assert (slack >= -ROUNDING_NS).all()
    dist, _ = longest_paths(g)
    assert (dist > -(1 << 61)).all(), "a node the start node does not reach"
    assert int(dist[g.end_node]) <= g.span_ns
    return int(dist[g.end_node])


def test_gpu_bound_step_under_hta_rules_edges_exactly() -> None:
    """K1 12..52 (launched at 5), K2 55..85 (launched at 15, queued behind K1), a synchronize 25..88 in a
    0..100 us step, no cuda_sync events. HTA's graph: the synchronize awaits nothing and carries no
    time, the step's own time carries none, no launch edge into the queued K2; its path is the device
    chain, 7 + 40 + 3 + 30 = 80 us (ours: the step, 100 us)."""
    events, steps = tables(gpu_bound_step())
    g = step_graph(events, steps, 1, rules=HTA_RULES)
    assert check_hta_invariants(g) == 80_000
    assert edges(g, events) == {
        ("dependency", "START", "ProfilerStep#1.start", 0),
        ("op", "ProfilerStep#1.start", "cudaLaunchKernel.start", 0),
        ("op", "cudaLaunchKernel.start", "cudaLaunchKernel.end", 5),
        ("op", "cudaLaunchKernel.end", "cudaLaunchKernel.start", 0),
        ("op", "cudaLaunchKernel.end", "cudaDeviceSynchronize.start", 0),
        ("op", "cudaDeviceSynchronize.start", "cudaDeviceSynchronize.release", 0),
        ("op", "cudaDeviceSynchronize.release", "cudaDeviceSynchronize.end", 0),
        ("op", "cudaDeviceSynchronize.end", "ProfilerStep#1.end", 0),
        ("launch_delay", "cudaLaunchKernel.start", "K1.start", 7),
        ("op", "K1.start", "K1.end", 40),
        ("kernel_kernel", "K1.end", "K2.start", 3),
        ("op", "K2.start", "K2.end", 30),
        ("dependency", "K2.end", "END", 0),
        ("dependency", "ProfilerStep#1.end", "END", 0),
    }
    cp = critical_path(g, events)
    assert cp.length_ms == pytest.approx(0.080)
    assert cp.breakdown_pct["gpu_compute_bound"] == pytest.approx(87.5)
    assert cp.breakdown_pct["gpu_kernel_launch_overhead"] == pytest.approx(8.75)
    assert cp.breakdown_pct["gpu_kernel_kernel_overhead"] == pytest.approx(3.75)
    assert check_invariants(step_graph(events, steps, 1)) == 100_000


@pytest.mark.parametrize(("root_cat", "want_us"), [("user_annotation", 40), ("cpu_op", 100)])
def test_host_gaps_carry_no_time_under_hta_rules(root_cat: str, want_us: int) -> None:
    """Two 20 us ops in a 0..100 us step: HTA chains top-level ops by zero-weight dependencies (40 us);
    a cpu_op step annotation is an op in HTA's graph too, its segments between children carry time."""
    events, steps = tables(
        [host("ProfilerStep#1", 0, 100, cat=root_cat), host("aten::a", 10, 20), host("aten::b", 60, 20)]
    )
    assert check_hta_invariants(step_graph(events, steps, 1, rules=HTA_RULES)) == want_us * 1_000
    no_gaps = dataclasses.replace(OUR_RULES, host_gaps_carry_time=False)
    assert check_hta_invariants(step_graph(events, steps, 1, rules=no_gaps)) == want_us * 1_000
    assert check_invariants(step_graph(events, steps, 1)) == 100_000


def test_backward_thread_found_by_a_forward_annotation() -> None:
    """The forward thread is named by a ``## forward ##`` user annotation, which is not a graph event:
    the backward thread's ops still go on the forward thread, so HTA's path runs through both passes
    (30 + 40 us), not only the longer one (40 us)."""
    events, steps = tables(
        [
            host("ProfilerStep#1", 0, 100, cat="user_annotation"),
            host("## forward ##", 0, 40, cat="user_annotation"),
            host("aten::linear", 5, 30),
            host("autograd::engine::evaluate_function: MmBackward0", 50, 40, tid=BWD),
        ]
    )
    g = step_graph(events, steps, 1, rules=HTA_RULES)
    assert check_hta_invariants(g) == 70_000
    assert ("op", "aten::linear.end", "autograd::engine::evaluate_function: MmBackward0.start", 0) in edges(g, events)


def test_long_kernel_gap_is_no_edge_under_hta_rules() -> None:
    """K2 queued behind K1 starts 1.6 ms after K1's end: HTA drops a kernel-kernel edge of 1.5 ms or
    more, so K2 has no in-edge but from the start node (its launch is not idle: K1 was running)."""
    events, steps = tables(
        [
            host("ProfilerStep#1", 0, 2000, cat="user_annotation"),
            launch(0, 1),
            device("K1", 10, 100, 1),
            launch(20, 2),
            device("K2", 1710, 50, 2),
        ]
    )
    g = step_graph(events, steps, 1, rules=HTA_RULES)
    got = edges(g, events)
    assert not any(d == "K2.start" and k == "kernel_kernel" for k, _, d, _ in got)
    assert ("dependency", "START", "K2.start", 0) in got
    assert check_hta_invariants(g) == 110_000  # K1's launch delay 10 + K1 100; K2 on its own 50
    kept = dataclasses.replace(HTA_RULES, max_kernel_gap_ns=None)
    assert ("kernel_kernel", "K1.end", "K2.start", 1600) in edges(step_graph(events, steps, 1, rules=kept), events)


def test_queue_length_launch_test() -> None:
    """K2's launch (at 60) finds its stream idle (K1 ended at 50), but K3 is launched (at 70) before K2
    starts (at 90): HTA's queue length after K2's start is 1, not 0, so K2 gets no launch edge but the
    kernel-kernel gap from K1 (40 us); ours, the launch delay (30 us)."""
    events, steps = tables(
        [
            host("ProfilerStep#1", 0, 200, cat="user_annotation"),
            launch(0, 1),
            device("K1", 10, 40, 1),
            launch(60, 2),
            launch(70, 3),
            device("K2", 90, 10, 2),
            device("K3", 100, 10, 3),
        ]
    )
    hta = edges(step_graph(events, steps, 1, rules=HTA_RULES), events)
    assert ("kernel_kernel", "K1.end", "K2.start", 40) in hta
    assert not any(k == "launch_delay" and d == "K2.start" for k, _, d, _ in hta)
    ours = edges(step_graph(events, steps, 1), events)
    assert ("launch_delay", "cudaLaunchKernel.start", "K2.start", 30) in ours


def test_one_device_event_per_launch_under_hta_rules() -> None:
    """A CUDA graph launch starting three kernels: HTA keeps the last one only."""
    events, steps = tables(
        [
            host("ProfilerStep#1", 0, 100, cat="user_annotation"),
            host("cudaGraphLaunch", 0, 10, cat="cuda_runtime", corr=1),
            device("G1", 20, 10, 1),
            device("G2", 30, 10, 1),
            device("G3", 40, 10, 1),
        ]
    )
    g = step_graph(events, steps, 1, rules=HTA_RULES)
    names = set(events["name"].to_numpy(object)[g.node_event[g.node_event >= 0]])
    assert {"G1", "G2"}.isdisjoint(names) and "G3" in names
    every = step_graph(events, steps, 1)
    assert {"G1", "G2", "G3"} <= set(events["name"].to_numpy(object)[every.node_event[every.node_event >= 0]])
