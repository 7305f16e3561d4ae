"""The step dependency graph (analyzer.metrics.depgraph): exact edges on synthesized steps, and the
graph's invariants on every shared trace with steps.

Synthesized steps use whole microseconds, so every expected weight is exact; the graph's
invariants (a DAG; each edge's time fits between its nodes; every node reachable from the start
and reaching the end; the longest path equal to the measured span) are checked on each.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse
import scipy.sparse.csgraph

from analyzer.errors import AnalyzerError
from analyzer.ingest.load import load_trace
from analyzer.ingest.tables import RankTrace, events_from_records, steps_from_events
from analyzer.metrics.critical_path import critical_path
from analyzer.metrics.depgraph import (
    BOUND_CATEGORIES,
    EDGE_KINDS,
    ROUNDING_NS,
    StepGraph,
    build_step_graph,
    join_ranks,
    longest_paths,
    path_edges,
    step_graph,
    topological_order,
)
from synth import KinetoTrace

US = 1_000
MAIN, BWD = 100, 200


def host(name: str, start_us: int, dur_us: int, cat: str = "cpu_op", tid: int = MAIN, corr: int = -1) -> dict:
    return {
        "rank": 0,
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": tid,
        "start_ns": start_us * US,
        "end_ns": (start_us + dur_us) * US,
        "correlation": corr,
    }


def device(name: str, start_us: int, dur_us: int, corr: int, stream: int = 7) -> dict:
    return {
        "rank": 0,
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": stream,
        "stream": stream,
        "start_ns": start_us * US,
        "end_ns": (start_us + dur_us) * US,
        "correlation": corr,
    }


def launch(start_us: int, corr: int, dur_us: int = 5, tid: int = MAIN) -> dict:
    return host("cudaLaunchKernel", start_us, dur_us, cat="cuda_runtime", tid=tid, corr=corr)


def tables(records: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    events = events_from_records(records).sort_values("start_ns", kind="stable").reset_index(drop=True)
    return events, steps_from_events(events)


def check_invariants(g: StepGraph) -> int:
    """The contract's invariants, each asserted exactly (rounding: ROUNDING_NS per edge); returns the
    longest path's length (ns)."""
    order = topological_order(g)  # raises on a cycle
    assert sorted(order.tolist()) == list(range(len(g.node_ts_ns)))
    slack = g.node_ts_ns[g.edge_dst] - g.node_ts_ns[g.edge_src] - g.edge_weight_ns
    assert (slack >= -ROUNDING_NS).all(), f"{int((slack < -ROUNDING_NS).sum())} edges carry more than their time"
    assert (g.edge_weight_ns >= 0).all()
    zero_kinds = [EDGE_KINDS.index(k) for k in ("dependency", "sync", "cross_rank")]
    assert (g.edge_weight_ns[np.isin(g.edge_kind, zero_kinds)] == 0).all()
    assert (g.edge_bound[np.isin(g.edge_kind, zero_kinds)] == -1).all()
    dist, via = longest_paths(g)
    assert (dist > -(1 << 61)).all(), "a node the start node does not reach"
    n = len(g.node_ts_ns)
    reverse = scipy.sparse.csr_matrix((np.ones(len(g.edge_src)), (g.edge_dst, g.edge_src)), shape=(n, n))
    reaches_end = scipy.sparse.csgraph.breadth_first_order(reverse, g.end_node, return_predecessors=False)
    assert len(reaches_end) == n, "a node that does not reach the end node"
    path = path_edges(g, via)
    assert abs(int(dist[g.end_node]) - g.span_ns) <= ROUNDING_NS * len(path)
    assert int(g.edge_weight_ns[path].sum()) == int(dist[g.end_node])
    return int(dist[g.end_node])


def edges(g: StepGraph, events: pd.DataFrame) -> set[tuple[str, str, str, int]]:
    """Each edge as (kind, source, destination, weight in us); nodes named ``event.start``/``event.end``,
    a release node ``event.release``, synthetic nodes ``START``/``END``."""

    def node(v: int) -> str:
        if v == g.start_node:
            return "START"
        if v == g.end_node:
            return "END"
        e = int(g.node_event[v])
        name = str(events["name"].iloc[e])
        if g.node_is_start[v]:
            return f"{name}.start"
        ends = np.flatnonzero((g.node_event == e) & ~g.node_is_start)
        return f"{name}.end" if v == ends[0] else f"{name}.release"

    return {
        (EDGE_KINDS[k], node(s), node(d), int(w) // US)
        for s, d, w, k in zip(g.edge_src, g.edge_dst, g.edge_weight_ns, g.edge_kind)
    }


def gpu_bound_step() -> list[dict]:
    """Step 0..100 us: a launch at 5 (kernel K1 12..52: 7 us launch delay), a launch at 15 whose kernel
    K2 waits in the queue until 55 (3 us gap), a device synchronize 25..88 released at K2's end (85)."""
    return [
        host("ProfilerStep#1", 0, 100, cat="user_annotation"),
        launch(5, 1),
        device("K1", 12, 40, 1),
        launch(15, 2),
        device("K2", 55, 30, 2),
        host("cudaDeviceSynchronize", 25, 63, cat="cuda_runtime"),
    ]


def test_gpu_bound_step_edges_exactly() -> None:
    events, steps = tables(gpu_bound_step())
    g = step_graph(events, steps, 1)
    check_invariants(g)
    got = edges(g, events)
    expected = {
        ("launch_delay", "cudaLaunchKernel.start", "K1.start", 7),
        ("op", "K1.start", "K1.end", 40),
        ("kernel_kernel", "K1.end", "K2.start", 3),
        ("dependency", "cudaLaunchKernel.start", "K2.start", 0),
        ("op", "K2.start", "K2.end", 30),
        ("sync", "K2.end", "cudaDeviceSynchronize.release", 0),
        # waiting is not work: the wait carries 0 where the device's path arrives on time
        ("op", "cudaDeviceSynchronize.start", "cudaDeviceSynchronize.release", 0),
        ("op", "cudaDeviceSynchronize.release", "cudaDeviceSynchronize.end", 3),
        ("dependency", "ProfilerStep#1.end", "END", 0),
        ("dependency", "START", "ProfilerStep#1.start", 0),
    }
    assert expected <= got, expected - got
    assert g.span_ns == 100 * US
    # A device synchronize awaits each stream's last event launched before it: K2, not K1.
    assert not any(e[0] == "sync" and e[1] == "K1.end" for e in got)


def test_cpu_bound_step_nesting_exactly() -> None:
    """Step 0..100: op A 10..50 holds a launch 20..25 (kernel 30..40); op B 60..90. The host chain in
    call-stack order, each segment charged to the op open in it; the kernel ends long before the step."""
    events, steps = tables(
        [
            host("ProfilerStep#1", 0, 100, cat="user_annotation"),
            host("A", 10, 40),
            launch(20, 1),
            device("K", 30, 10, 1),
            host("B", 60, 30),
        ]
    )
    g = step_graph(events, steps, 1)
    check_invariants(g)
    got = edges(g, events)
    assert {
        ("op", "ProfilerStep#1.start", "A.start", 10),
        ("op", "A.start", "cudaLaunchKernel.start", 10),
        ("op", "cudaLaunchKernel.start", "cudaLaunchKernel.end", 5),
        ("op", "cudaLaunchKernel.end", "A.end", 25),
        ("op", "A.end", "B.start", 10),
        ("op", "B.start", "B.end", 30),
        ("op", "B.end", "ProfilerStep#1.end", 10),
        ("launch_delay", "cudaLaunchKernel.start", "K.start", 10),
        ("op", "K.start", "K.end", 10),
        ("dependency", "K.end", "END", 0),
    } <= got
    # Segment attribution: A's time between its children is A's, the step's own time the annotation's.
    a = int(np.flatnonzero(events["name"] == "A")[0])
    on_a = g.edge_weight_ns[(g.edge_event == a) & (g.edge_kind == EDGE_KINDS.index("op"))].sum()
    assert on_a == 35 * US
    assert BOUND_CATEGORIES[g.edge_bound[g.edge_event == a][0]] == "cpu_bound"


def test_sync_after_the_device_finished_is_host_time() -> None:
    """The kernel ends at 30, the synchronize runs 40..50: released at its start, its 10 us are the host's."""
    events, steps = tables(
        [
            host("ProfilerStep#1", 0, 60, cat="user_annotation"),
            launch(5, 1),
            device("K", 12, 18, 1),
            host("cudaDeviceSynchronize", 40, 10, cat="cuda_runtime"),
        ]
    )
    g = step_graph(events, steps, 1)
    check_invariants(g)
    got = edges(g, events)
    assert ("op", "cudaDeviceSynchronize.start", "cudaDeviceSynchronize.release", 0) in got
    assert ("op", "cudaDeviceSynchronize.release", "cudaDeviceSynchronize.end", 10) in got


def test_stream_sync_event_awaits_only_its_stream() -> None:
    """A cuda_sync "Stream Sync" on stream 7: the release is stream 7's last kernel (ends 60), not
    stream 8's (ends 80, still running when the call returns at 62)."""
    records = [
        host("ProfilerStep#1", 0, 100, cat="user_annotation"),
        launch(2, 1),
        device("K7", 20, 40, 1, stream=7),
        launch(8, 2),
        device("K8", 30, 50, 2, stream=8),
        host("cudaStreamSynchronize", 30, 32, cat="cuda_runtime", corr=9),
        {**device("Stream Sync", 30, 31, 9, stream=7), "cat": "cuda_sync"},
    ]
    events, steps = tables(records)
    g = step_graph(events, steps, 1)
    check_invariants(g)
    got = edges(g, events)
    assert ("sync", "K7.end", "cudaStreamSynchronize.release", 0) in got
    assert not any(e[0] == "sync" and e[1] == "K8.end" for e in got)
    assert ("op", "cudaStreamSynchronize.release", "cudaStreamSynchronize.end", 2) in got


def test_overlapping_events_on_one_stream_wait_behind_the_earlier_start() -> None:
    """A CUDA-graph replay can overlap events on one stream: the later waits behind the earlier one's
    start (never behind its end, which would put the edge backwards in time)."""
    events, steps = tables(
        [
            host("ProfilerStep#1", 0, 100, cat="user_annotation"),
            launch(2, 1),
            device("G1", 10, 30, 1),
            device("G2", 35, 20, 1),
        ]
    )
    g = step_graph(events, steps, 1)
    check_invariants(g)
    got = edges(g, events)
    assert ("kernel_kernel", "G1.start", "G2.start", 25) in got


def test_backward_thread_hands_off_to_the_main_thread() -> None:
    """The main thread runs forward 0..30, then waits (untraced) while the backward thread runs 32..80,
    then an optimizer op 82..95. The path takes the backward thread: the main thread's untraced time
    during it is explained by it, so the step annotation's own time on the path is 2 + 2 + 5 us."""
    events, steps = tables(
        [
            host("ProfilerStep#1", 0, 100, cat="user_annotation"),
            host("forward", 0, 30),
            host("bwd_op_a", 32, 20, tid=BWD),
            host("bwd_op_b", 55, 25, tid=BWD),
            host("optimizer", 82, 13),
        ]
    )
    g = step_graph(events, steps, 1)
    check_invariants(g)
    dist, via = longest_paths(g)
    path = path_edges(g, via)
    root = int(np.flatnonzero(events["name"] == "ProfilerStep#1")[0])
    on_root = int(g.edge_weight_ns[path][g.edge_event[path] == root].sum())
    # 30 -> 32 (hand-off), 52 -> 55 (the backward thread's own gap), 80 -> 82 (hand-back), 95 -> 100.
    gap = int(g.edge_weight_ns[path][g.edge_event[path] == -1].sum())
    assert (on_root, gap) == (2 * US + 2 * US + 5 * US, 3 * US)
    names = {str(events["name"].iloc[e]) for e in g.edge_event[path] if e >= 0}
    assert {"bwd_op_a", "bwd_op_b", "forward", "optimizer"} <= names


def test_whole_trace_and_missing_step() -> None:
    events, steps = tables(gpu_bound_step())
    g = step_graph(events, steps, -1)
    check_invariants(g)
    # From the first event (the annotation, 0) to the last graph event's end (the synchronize, 88).
    assert g.span_ns == 88 * US
    with pytest.raises(AnalyzerError, match=r"no ProfilerStep#7 in the trace \(steps: 1\)"):
        step_graph(events, steps, 7)


@pytest.mark.parametrize(
    "era, time_format, time_unit",
    [("today", "float", "us"), ("tb_plugin", "int", "us"), ("today", "float", "ns")],
)
def test_loaded_synthetic_trace_matches_the_table_builder(tmp_path: Path, era, time_format, time_unit) -> None:
    """The same GPU-bound step written as a Kineto file of each format era and loaded: the same edges."""
    t = KinetoTrace(rank=0, world_size=1, era=era, time_format=time_format, time_unit=time_unit)
    t.step(1, 0, 100)
    t.kernel("K1", 12, 40, launch_us=5)
    t.kernel("K2", 55, 30, launch_us=15)
    t.runtime("cudaDeviceSynchronize", 25, 63, correlation=99)
    rt = load_trace(t.write(tmp_path / "rank0.json.gz"))
    g = build_step_graph(rt, 1)
    check_invariants(g)
    got = edges(g, rt.events)
    assert ("kernel_kernel", "K1.end", "K2.start", 3) in got
    assert ("launch_delay", "cudaLaunchKernel.start", "K1.start", 7) in got
    assert ("op", "cudaDeviceSynchronize.release", "cudaDeviceSynchronize.end", 3) in got


def test_join_ranks_links_matched_collectives(tmp_path: Path) -> None:
    """Two ranks, one all-reduce each: rank 1 arrives late (starts 40 vs 20); both end at 70. The joined
    graph has an edge from each rank's collective start to the other's end, and keeps the invariants
    of each rank inside it."""
    traces = []
    for rank, begin in ((0, 20), (1, 40)):
        t = KinetoTrace(rank=rank, world_size=2)
        t.step(1, 0, 100)
        t.kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            begin,
            70 - begin,
            stream=20,
            launch_us=begin - 10,
            args=t.comm_args("allreduce", 1024),
        )
        traces.append(load_trace(t.write(tmp_path / f"rank{rank}.json.gz")))
    g = join_ranks(traces, 1)
    assert g.rank == -1 and g.node_rank is not None
    cross = np.flatnonzero(g.edge_kind == EDGE_KINDS.index("cross_rank"))
    assert len(cross) == 2
    pairs = {
        (int(g.node_rank[s]), int(g.node_ts_ns[s]) // US, int(g.node_rank[d]), int(g.node_ts_ns[d]) // US)
        for s, d in zip(g.edge_src[cross], g.edge_dst[cross])
    }
    assert pairs == {(0, 20, 1, 70), (1, 40, 0, 70)}
    topological_order(g)
    dist, _ = longest_paths(g)
    assert int(dist[g.end_node]) == 100 * US
    # The joined path names each rank's events from that rank's table.
    cp = critical_path(g, {t.rank: t.events for t in traces})
    assert cp.length_ms == pytest.approx(0.1)
    assert "ProfilerStep#1" in set(cp.ops["name"])


# The shared traces with ProfilerStep markers (under ../shared/traces), but df_index_resolver (123k
# events, the same code paths as trace_diff, 10x slower). The other shared traces have no steps.
SHARED_WITH_STEPS = (
    "hta-samples/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta-samples/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "hta-samples/distributed_info_unavailable/distributed_info_not_found.json.gz",
    "hta-samples/mixed_files/rank_non_gpu.json.gz",
    "hta-samples/nccl_parser_config/nccl_data.json.gz",
    "hta-samples/trace_diff/control/control.json.gz",
    "hta-samples/trace_diff/test/test.json.gz",
    "tracelens-samples/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens-samples/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz",
    "tracelens-samples/h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "tracelens-samples/inference/sglang_decode/capture_traces/bs_32_rank0.json.gz",
    "tracelens-samples/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens-samples/mi300/gaunernst_bert-small-uncased__1016001.json.gz",
)


@functools.lru_cache(maxsize=None)
def shared_trace(path: Path) -> RankTrace:
    """A shared trace, loaded once per session (the HTA conformance test reads some of the same)."""
    return load_trace(path)


@pytest.mark.parametrize("rel", SHARED_WITH_STEPS, ids=[Path(r).name[:40] for r in SHARED_WITH_STEPS])
def test_invariants_on_every_shared_trace_with_steps(hta_samples: Path, rel: str) -> None:
    """The first step of each (the other steps of trace_diff and nccl are alike; all 20 steps of the
    HTA samples passed when measured, at ~0.3 s a step, too slow to run every time)."""
    rt = shared_trace(hta_samples.parent / rel)
    step = int(rt.steps["step"].iloc[0])
    g = build_step_graph(rt, step)
    # No rounding needed on these: the longest path is the span to the nanosecond.
    assert check_invariants(g) == g.span_ns, f"{rel} step {step}"


def test_backward_thread_is_put_on_the_forward_thread() -> None:
    """HTA's rule: one thread with "forward" ops and one with "autograd" ops: the backward thread's ops
    go on the forward thread, where they nest in the step like its own ops (no hand-off edges)."""
    events, steps = tables(
        [
            host("ProfilerStep#1", 0, 100, cat="user_annotation"),
            host("forward", 0, 30),
            host("autograd::engine::evaluate_function: AddmmBackward0", 32, 20, tid=BWD),
            host("optimizer", 82, 13),
        ]
    )
    g = step_graph(events, steps, 1)
    check_invariants(g)
    got = edges(g, events)
    assert ("op", "forward.end", "autograd::engine::evaluate_function: AddmmBackward0.start", 2) in got
    assert ("op", "autograd::engine::evaluate_function: AddmmBackward0.end", "optimizer.start", 30) in got


def test_join_ranks_cpu_only_gloo(tmp_path: Path) -> None:
    """CPU-only ranks: the gloo annotations on the comm thread are the matched collectives; the two
    all-reduces of each rank are matched in order (1st with 1st, 2nd with 2nd)."""
    traces = []
    for rank in (0, 1):
        t = KinetoTrace(rank=rank, world_size=2, gpu=False, backend="gloo")
        t.step(1, 0, 100)
        t.cpu_op("c10d::allreduce_", 10, 5)
        t.annotation("gloo:all_reduce", 12 + rank, 20 - rank, tid=t.comm_tid)
        t.cpu_op("c10d::allreduce_", 50, 5)
        t.annotation("gloo:all_reduce", 52 + 3 * rank, 30 - 3 * rank, tid=t.comm_tid)
        traces.append(load_trace(t.write(tmp_path / f"rank{rank}.json.gz")))
    g = join_ranks(traces, 1)
    cross = np.flatnonzero(g.edge_kind == EDGE_KINDS.index("cross_rank"))
    pairs = {
        (int(g.node_rank[s]), int(g.node_ts_ns[s]) // US, int(g.node_rank[d]), int(g.node_ts_ns[d]) // US)
        for s, d in zip(g.edge_src[cross], g.edge_dst[cross])
    }
    assert pairs == {(0, 12, 1, 32), (1, 13, 0, 32), (0, 52, 1, 82), (1, 55, 0, 82)}
