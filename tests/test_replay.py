"""The what-if replay of a step's dependency graph (analyzer.metrics.replay) on hand-built graphs with exact answers.

Times are in ns; every expected step length below is worked out by hand in the comment beside it.
"""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.ingest.tables import events_from_records
from analyzer.metrics.depgraph import BOUND_CATEGORIES, EDGE_KINDS, StepGraph
from analyzer.metrics.replay import (
    Replay,
    ReplayError,
    accumulate,
    apply,
    collective_order,
    comm_bandwidth,
    edge_facts,
    faster,
    longest_times,
    micro_batch_scale,
    no_launch_overhead,
    overlap_comm,
    replay,
    replay_weights,
    replayed_path,
    without_rank_delay,
)

CPU, GPU_COMPUTE, GPU_COMM = (
    BOUND_CATEGORIES.index(b) for b in ("cpu_bound", "gpu_compute_bound", "gpu_communication_bound")
)
LAUNCH_OVERHEAD = BOUND_CATEGORIES.index("gpu_kernel_launch_overhead")
KK_OVERHEAD = BOUND_CATEGORIES.index("gpu_kernel_kernel_overhead")


def graph(node_ts: list[int], edges: list[tuple[int, int, int, str, int, int]], start=0, end=None, rank=0) -> StepGraph:
    """A StepGraph from node times and edges ``(src, dst, weight, kind, event row, bound index)``."""
    src, dst, w, kind, ev, bound = zip(*edges)
    return StepGraph(
        rank=rank,
        step=1,
        start_node=start,
        end_node=len(node_ts) - 1 if end is None else end,
        node_ts_ns=np.asarray(node_ts, dtype=np.int64),
        node_event=np.full(len(node_ts), -1, dtype=np.int64),
        node_is_start=np.zeros(len(node_ts), dtype=bool),
        edge_src=np.asarray(src, dtype=np.int64),
        edge_dst=np.asarray(dst, dtype=np.int64),
        edge_weight_ns=np.asarray(w, dtype=np.int64),
        edge_kind=np.asarray([EDGE_KINDS.index(k) for k in kind], dtype=np.int8),
        edge_event=np.asarray(ev, dtype=np.int64),
        edge_bound=np.asarray(bound, dtype=np.int8),
    )


def gpu_step(launch_b_at: int = 20, b_start: int = 105):
    """One host thread launching a GEMM (A) and an elementwise kernel (B) on one stream, then a stream sync.

    Host: launch A [0, 10], launch B [launch_b_at, +10], cudaStreamSynchronize [40 or later, end];
    device: A [15, 95], B [b_start, b_start + 45]; the sync returns 10 after B ends. As the builder does, the
    synchronize is split at its release (B's end): its start to the release carries nothing, the release
    to its end the 10 ns return. Nodes: 0 launch A start, 1 its end, 2 launch B start, 3 its end, 4 sync
    start, 5 A start, 6 A end, 7 B start, 8 B end, 9 release, 10 sync end (the step's end).
    """
    b_end = b_start + 45
    sync_start = max(40, launch_b_at + 20)
    rows = [
        {"rank": 0, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "start_ns": 0, "end_ns": 10, "tid": 1},
        {"rank": 0, "cat": "kernel", "name": "sgemm_128x64_nn", "start_ns": 15, "end_ns": 95, "tid": 7},
        {
            "rank": 0,
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "start_ns": launch_b_at,
            "end_ns": launch_b_at + 10,
            "tid": 1,
        },
        {
            "rank": 0,
            "cat": "cuda_runtime",
            "name": "cudaStreamSynchronize",
            "start_ns": sync_start,
            "end_ns": b_end + 10,
            "tid": 1,
        },
        {
            "rank": 0,
            "cat": "kernel",
            "name": "vectorized_elementwise_kernel",
            "start_ns": b_start,
            "end_ns": b_end,
            "tid": 7,
        },
    ]
    events = events_from_records(sorted(rows, key=lambda r: r["start_ns"]))
    row = {n: i for i, n in enumerate(events["name"].astype(str) + "@" + events["start_ns"].astype(str))}
    la, lb = row["cudaLaunchKernel@0"], row[f"cudaLaunchKernel@{launch_b_at}"]
    ka, kb = row["sgemm_128x64_nn@15"], row[f"vectorized_elementwise_kernel@{b_start}"]
    sy = row[f"cudaStreamSynchronize@{sync_start}"]
    ts = [0, 10, launch_b_at, launch_b_at + 10, sync_start, 15, 95, b_start, b_end, b_end, b_end + 10]
    edges = [
        (0, 1, 10, "op", la, CPU),
        (1, 2, launch_b_at - 10, "op", -1, CPU),  # the host's own time between the calls
        (2, 3, 10, "op", lb, CPU),
        (3, 4, sync_start - launch_b_at - 10, "op", -1, CPU),
        (4, 9, 0, "op", sy, CPU),
        (9, 10, 10, "op", sy, CPU),
        (0, 5, 15, "launch_delay", la, LAUNCH_OVERHEAD),
        (5, 6, 80, "op", ka, GPU_COMPUTE),
        (2, 7, b_start - launch_b_at, "launch_delay", lb, LAUNCH_OVERHEAD),
        (6, 7, b_start - 95, "kernel_kernel", -1, KK_OVERHEAD),
        (7, 8, 45, "op", kb, GPU_COMPUTE),
        (8, 9, 0, "sync", -1, -1),
    ]
    return graph(ts, edges), events


def test_unchanged_replay_is_the_measured_step_exactly():
    g, _ = gpu_step()
    r = replay(g)
    assert (r.length_ns, r.measured_ns) == (160, 160)
    # Every node at its measured time or earlier: the measured times satisfy every constraint.
    assert (r.node_ts_ns <= g.node_ts_ns).all()
    assert r.node_ts_ns[10] == 160


def test_waits_are_rewritten_to_what_the_node_waited_for():
    g, _ = gpu_step()
    w = replay_weights(g)
    # B was queued behind A (its stream's gap came last): its 85 ns "launch delay" keeps only the trace's
    # launch latency, A's binding 15 ns; every other weight stays.
    assert w[8] == 15
    others = [i for i in range(len(w)) if i != 8]
    assert (w[others] == g.edge_weight_ns[others]).all()


def test_faster_gemm_moves_a_queued_kernel_and_the_sync():
    g, events = gpu_step()
    facts = edge_facts(g, events)
    r = replay(g, apply(g, facts, [faster("gemm", 2.0)]))
    # A takes 40: ends at 55; B starts max(20 + 15, 55 + 10) = 65, ends 110; the sync returns at 120.
    assert r.length_ns == 120
    # The new path runs through the device: GEMM 40 + gap 10 + B 45 + return 10, launch 15 of 120 on it.
    assert replayed_path(g, r, events).breakdown_pct["gpu_compute_bound"] == pytest.approx(100 * 85 / 120)


def test_faster_kernel_does_nothing_when_the_step_waits_for_its_launch():
    # B is launched at 100 (the host is the bottleneck): B starts at 115 = launch + 15, 20 after A ends.
    g, events = gpu_step(launch_b_at=100, b_start=115)
    assert replay(g).length_ns == 170
    facts = edge_facts(g, events)
    # A twice as fast ends at 55, but B still waits for its launch: 170 again (the closed form would say 130).
    assert replay(g, apply(g, facts, [faster("gemm", 2.0)])).length_ns == 170
    # B's measured 20 ns gap after A was waiting for the launch, not a cost of the stream.
    assert replay_weights(g)[9] == 0


def test_no_launch_overhead():
    g, events = gpu_step()
    r = replay(g, apply(g, edge_facts(g, events), [no_launch_overhead]))
    # Host: launches take 0, so the sync starts at 20; device: A [0, 80], B [90, 135]; return at 145.
    assert r.length_ns == 145


def test_micro_batch_scale_scales_device_work_only():
    g, events = gpu_step()
    r = replay(g, apply(g, edge_facts(g, events), [micro_batch_scale(2.0)]))
    # A 160 [15, 175], B 90 [185, 275], return 285; launches and the host keep their time.
    assert r.length_ns == 285


def comm_step():
    """Host launches a GEMM then an all-reduce on one stream and syncs: A [10, 60], all-reduce [60, 160]."""
    rows = [
        {"rank": 0, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "start_ns": 0, "end_ns": 5, "tid": 1},
        {"rank": 0, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "start_ns": 5, "end_ns": 10, "tid": 1},
        {"rank": 0, "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "start_ns": 10, "end_ns": 160, "tid": 1},
        {"rank": 0, "cat": "kernel", "name": "sgemm_nn", "start_ns": 10, "end_ns": 60, "tid": 7},
        {
            "rank": 0,
            "cat": "kernel",
            "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "start_ns": 60,
            "end_ns": 160,
            "tid": 7,
            "msg_in_nelems": 250,
            "msg_dtype": "Float",
            "group_size": 2,
            "coll_name": "allreduce",
        },
    ]
    events = events_from_records(rows)
    # Nodes: 0 launch 1 start, 1 launch 2 start, 2 sync start, 3 GEMM start, 4 its end, 5 all-reduce start,
    # 6 its end, 7 the sync's release, 8 its end.
    ts = [0, 5, 10, 10, 60, 60, 160, 160, 160]
    edges = [
        (0, 1, 5, "op", 0, CPU),
        (1, 2, 5, "op", 1, CPU),
        (2, 7, 0, "op", 2, CPU),
        (7, 8, 0, "op", 2, CPU),
        (0, 3, 10, "launch_delay", 0, LAUNCH_OVERHEAD),
        (3, 4, 50, "op", 3, GPU_COMPUTE),
        (1, 5, 55, "launch_delay", 1, LAUNCH_OVERHEAD),
        (4, 5, 0, "kernel_kernel", -1, KK_OVERHEAD),
        (5, 6, 100, "op", 4, GPU_COMM),
        (6, 7, 0, "sync", -1, -1),
    ]
    return graph(ts, edges), events


def test_overlap_comm_floors_the_step_at_the_communication():
    g, events = comm_step()
    assert replay(g).length_ns == 160
    r = replay(g, apply(g, edge_facts(g, events), [overlap_comm]))
    # Without the all-reduce on the path the sync returns when the GEMM ends (60); the 100 ns all-reduce
    # still has to run within the step: 100.
    assert (r.length_ns, r.floor_ns) == (100, 100)


def test_comm_bandwidth_uses_bus_bytes():
    g, events = comm_step()
    facts = edge_facts(g, events)
    # 250 floats = 1000 bytes; all-reduce on 2 ranks: bus factor 2 * (2 - 1) / 2 = 1. One size only: no alpha.
    assert facts.bus_bytes[8] == pytest.approx(1000.0)
    assert facts.alpha_ns is None and facts.notes
    r = replay(g, apply(g, facts, [comm_bandwidth(20.0)]))
    # 1000 bytes at 20 GB/s = 50 ns: the all-reduce [60, 110], the sync returns at 110.
    assert r.length_ns == 110


def test_unknown_class_and_bad_factors_are_one_line_errors():
    with pytest.raises(ReplayError, match="unknown kernel class 'gemmm'"):
        faster("gemmm", 2)
    with pytest.raises(ReplayError, match="not positive"):
        micro_batch_scale(0)


def test_a_cycle_is_an_error():
    g = graph([0, 1, 2], [(0, 1, 1, "op", -1, CPU), (1, 2, 1, "op", -1, CPU), (2, 1, 0, "dependency", -1, -1)])
    with pytest.raises(ReplayError, match="cycle"):
        replay(g, g.edge_weight_ns)


def test_longest_times_match_networkx_on_random_dags():
    """The vectorized level-by-level relaxation against networkx's longest path (an independent implementation)."""
    nx = pytest.importorskip("networkx")
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(3, 60))
        pairs = {(int(a), int(b)) for a, b in rng.integers(0, n, size=(3 * n, 2)) if a < b}
        pairs |= {(0, v) for v in range(1, n)}  # every node reachable from the start
        pairs |= {(v, n - 1) for v in range(n - 1)}  # and reaching the end
        edges = sorted(pairs)
        w = rng.integers(0, 1000, size=len(edges))
        g = graph(list(range(n)), [(a, b, int(x), "op", -1, CPU) for (a, b), x in zip(edges, w)])
        t, _ = longest_times(g, g.edge_weight_ns)
        dag = nx.DiGraph()
        dag.add_weighted_edges_from((a, b, int(x)) for (a, b), x in zip(edges, w))
        assert t[n - 1] - t[0] == nx.dag_longest_path_length(dag)


def test_critical_path_is_a_longest_path():
    g, _ = gpu_step()
    r = replay(g)
    w = r.weight_ns
    assert (w == replay_weights(g)).all()
    assert int(w[r.path_edges].sum()) == r.length_ns
    assert g.edge_src[r.path_edges[0]] == g.start_node and g.edge_dst[r.path_edges[-1]] == g.end_node
    assert (g.edge_dst[r.path_edges[:-1]] == g.edge_src[r.path_edges[1:]]).all()


def test_removing_a_late_ranks_delay():
    """Two ranks, one all-reduce each; rank 1 arrives 70 ns late, so rank 0's all-reduce takes 100, rank 1's 30."""

    def rank_graph(rank: int, compute: int, comm: int):
        rows = [
            {"rank": rank, "cat": "cpu_op", "name": "aten::mm", "start_ns": 0, "end_ns": compute, "tid": 1},
            {
                "rank": rank,
                "cat": "cpu_op",
                "name": "gloo:all_reduce",
                "start_ns": compute,
                "end_ns": compute + comm,
                "tid": 1,
            },
        ]
        events = events_from_records(rows)
        g = graph(
            [0, compute, compute + comm],
            [(0, 1, compute, "op", 0, CPU), (1, 2, comm, "op", 1, CPU)],
            rank=rank,
        )
        return g, events

    g0, e0 = rank_graph(0, 30, 100)
    g1, e1 = rank_graph(1, 100, 30)
    graphs, facts = {0: g0, 1: g1}, {0: edge_facts(g0, e0), 1: edge_facts(g1, e1)}
    assert facts[0].is_comm.tolist() == [False, True]
    order = {0: np.array([1]), 1: np.array([1])}
    out = without_rank_delay(graphs, facts, order, 1)
    # Rank 0 no longer waits: its all-reduce takes rank 1's 30 ns, the step 30 + 30 = 60 instead of 130.
    assert list(out) == [0]
    assert isinstance(replay(g0, out[0]), Replay) and replay(g0, out[0]).length_ns == 60
    with pytest.raises(ReplayError, match="rank 5 is not traced"):
        without_rank_delay(graphs, facts, order, 5)


def gloo_rank(rank: int, compute: int, comm: int, optimizer: bool = False):
    """A CPU rank's step as the builder sees DDP on gloo: ProfilerStep#1 [0, 200] on the main thread, aten::mm
    [0, compute], then the thread waits outside every op (the wait no op records) while gloo:all_reduce runs
    [compute, compute + comm] on gloo's thread, then aten::add [180, 200] (inside ``Optimizer.step#SGD.step``
    with ``optimizer``). compute + comm = 180. As in the builder's graphs, gloo's thread hangs off the start
    node by a zero-weight edge: nothing in the trace ties it to the main thread."""
    rows = [
        {"rank": rank, "cat": "user_annotation", "name": "ProfilerStep#1", "start_ns": 0, "end_ns": 200, "tid": 1},
        {"rank": rank, "cat": "cpu_op", "name": "aten::mm", "start_ns": 0, "end_ns": compute, "tid": 1},
        {"rank": rank, "cat": "cpu_op", "name": "gloo:all_reduce", "start_ns": compute, "end_ns": 180, "tid": 2},
        {"rank": rank, "cat": "cpu_op", "name": "aten::add", "start_ns": 180, "end_ns": 200, "tid": 1},
    ]
    if optimizer:
        rows.append(
            {"rank": rank, "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "start_ns": 180, "end_ns": 200}
        )
    events = events_from_records(rows)
    assert events["kind"].astype(str).tolist()[:4] == ["annotation", "cpu_op", "cpu_comm", "cpu_op"]
    # Nodes: 0 step start, 1 mm start, 2 mm end, 3 add start, 4 add end, 5 step end (the end node),
    # 6 all-reduce start, 7 its end.
    ts = [0, 0, compute, 180, 200, 200, compute, 180]
    edges = [
        (0, 1, 0, "op", 0, CPU),
        (1, 2, compute, "op", 1, CPU),
        (2, 3, 180 - compute, "op", 0, CPU),  # the wait: ProfilerStep's own time
        (3, 4, 20, "op", 3, CPU),
        (4, 5, 0, "op", 0, CPU),
        (0, 6, 0, "dependency", -1, -1),
        (6, 7, comm, "op", 2, CPU),
        (7, 5, 0, "dependency", -1, -1),
    ]
    g = graph(ts, edges, end=5, rank=rank)
    return g, events


def test_overlap_comm_removes_the_hosts_wait_for_it():
    g, events = gloo_rank(0, 100, 80)
    facts = edge_facts(g, events)
    # The 80 ns the main thread sat outside every op were all while the all-reduce ran.
    assert facts.comm_wait_ns.tolist() == [0, 0, 80, 0, 0, 0, 0, 0]
    r = replay(g, apply(g, facts, [overlap_comm]))
    # mm 100 + add 20 = 120; the 80 ns all-reduce still fits in the step (floor 80).
    assert (r.length_ns, r.floor_ns) == (120, 80)


def test_removing_a_late_ranks_delay_on_gloo():
    # Rank 1 computes 160 ns, so rank 0's all-reduce waits 60 of its 80 ns; rank 1's takes 20 (the transfer).
    (g0, e0), (g1, e1) = gloo_rank(0, 100, 80), gloo_rank(1, 160, 20)
    graphs, facts = {0: g0, 1: g1}, {0: edge_facts(g0, e0), 1: edge_facts(g1, e1)}
    order = {r: collective_order(graphs[r], facts[r], e) for r, e in ((0, e0), (1, e1))}
    assert order[0].tolist() == [2]  # the all-reduce's row
    out = without_rank_delay(graphs, facts, order, 1)
    # Rank 0's wait shrinks by 60 (80 -> 20), its all-reduce to 20: mm 100 + 20 + add 20 = 140.
    assert replay(g0, out[0]).length_ns == 140
    # Rank 0 arriving last would remove nothing from rank 1: its all-reduce was already the shortest.
    assert replay(g1, without_rank_delay(graphs, facts, order, 0)[1]).length_ns == 200


def test_a_larger_micro_batch_leaves_the_optimizer_alone():
    g, events = gloo_rank(0, 100, 80)
    # mm 200 + the wait 80 + add 40 (an elementwise op doing per-sample work) = 320.
    assert replay(g, apply(g, edge_facts(g, events), [micro_batch_scale(2.0)])).length_ns == 320
    g, events = gloo_rank(0, 100, 80, optimizer=True)
    # The add inside the optimizer's step keeps its 20: 300.
    assert edge_facts(g, events).once_ns.tolist() == [0, 0, 0, 20, 0, 0, 0, 0]
    assert replay(g, apply(g, edge_facts(g, events), [micro_batch_scale(2.0)])).length_ns == 300


def test_accumulation_repeats_all_but_the_sync_and_the_optimizer():
    g, events = gloo_rank(0, 100, 80, optimizer=True)
    # Two micro-batches of mm (200), one wait for the gradients' all-reduce (80), one optimizer step (20).
    assert replay(g, apply(g, edge_facts(g, events), [accumulate(2)])).length_ns == 300
    with pytest.raises(ReplayError, match="below 1"):
        accumulate(0)


def test_the_builders_graphs_of_a_gloo_step_give_the_same_answers():
    """The same two gloo ranks through analyzer.metrics.depgraph's builder (its hand-off edges tie gloo's
    thread to the main thread): the answers worked out by hand above."""
    import pandas as pd

    from analyzer.metrics.depgraph import step_graph

    steps = pd.DataFrame({"step": [1], "start_ns": [0], "end_ns": [200]})
    built = {}
    for rank, (compute, comm) in {0: (100, 80), 1: (160, 20)}.items():
        _, events = gloo_rank(rank, compute, comm, optimizer=True)
        g = step_graph(events, steps, 1, rank)
        built[rank] = (g, edge_facts(g, events), events)
    g0, f0, _ = built[0]
    assert replay(g0).length_ns == 200
    assert replay(g0, apply(g0, f0, [overlap_comm])).length_ns == 120
    assert replay(g0, apply(g0, f0, [accumulate(2)])).length_ns == 300
    assert replay(g0, apply(g0, f0, [micro_batch_scale(2.0)])).length_ns == 300
    graphs, facts = {r: b[0] for r, b in built.items()}, {r: b[1] for r, b in built.items()}
    order = {r: collective_order(*b) for r, b in built.items()}
    assert replay(g0, without_rank_delay(graphs, facts, order, 1)[0]).length_ns == 140
