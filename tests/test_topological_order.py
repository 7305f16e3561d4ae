"""The dependency graph's topological order (analyzer.metrics.depgraph.topological_order).

Exact orders on hand-made graphs (ties of time broken by chains of same-instant edges, cycles
refused), and on every shared trace with steps the same critical path as with an independent
order (the standard library's graphlib), which shows the paths do not depend on the order chosen.
"""

from __future__ import annotations

import graphlib
from pathlib import Path

import numpy as np
import pytest

from analyzer.errors import AnalyzerError
from analyzer.metrics import depgraph
from analyzer.metrics.critical_path import critical_path
from analyzer.metrics.depgraph import StepGraph, build_step_graph, longest_paths, topological_order
from tests.test_depgraph import SHARED_WITH_STEPS, shared_trace


def _graph(ts: list[int], edges: list[tuple[int, int]]) -> StepGraph:
    n, m = len(ts), len(edges)
    return StepGraph(
        rank=0,
        step=1,
        start_node=0,
        end_node=n - 1,
        node_ts_ns=np.asarray(ts, dtype=np.int64),
        node_event=np.full(n, -1, dtype=np.int64),
        node_is_start=np.zeros(n, dtype=bool),
        edge_src=np.asarray([s for s, _ in edges], dtype=np.int64),
        edge_dst=np.asarray([d for _, d in edges], dtype=np.int64),
        edge_weight_ns=np.asarray([ts[d] - ts[s] for s, d in edges], dtype=np.int64),
        edge_kind=np.zeros(m, dtype=np.int64),
        edge_event=np.full(m, -1, dtype=np.int64),
        edge_bound=np.full(m, -1, dtype=np.int64),
    )


def _forward(g: StepGraph, order: np.ndarray) -> bool:
    position = np.empty(len(order), dtype=np.int64)
    position[order] = np.arange(len(order))
    return bool((position[g.edge_src] < position[g.edge_dst]).all())


def test_same_instant_nodes_follow_their_chain_not_their_ids() -> None:
    # Nodes 1..4 all at t=10, chained 4 -> 3 -> 2 -> 1 (ids against the chain); node 5 at t=5 comes first
    # of the later ones though its id is larger; 6 at t=20 is the end.
    g = _graph([0, 10, 10, 10, 10, 5, 20], [(0, 5), (5, 4), (4, 3), (3, 2), (2, 1), (1, 6), (0, 6)])
    order = topological_order(g)
    assert order.tolist() == [0, 5, 4, 3, 2, 1, 6]
    assert _forward(g, order)


def test_a_cycle_is_one_error_line() -> None:
    same_instant = _graph([0, 10, 10, 20], [(0, 1), (1, 2), (2, 1), (2, 3)])
    with pytest.raises(AnalyzerError, match=r"^rank 0 step 1: the dependency graph has a cycle$"):
        topological_order(same_instant)
    through_time = _graph([0, 10, 15, 20], [(0, 1), (1, 2), (2, 1), (2, 3)])  # 2 -> 1 goes back in time
    with pytest.raises(AnalyzerError, match="has a cycle"):
        topological_order(through_time)


def test_an_edge_back_in_time_still_goes_forward_in_the_order() -> None:
    # 2 (t=12) -> 1 (t=11): outside the graph's invariant, ordered all the same (1 after 2).
    g = _graph([0, 11, 12, 20], [(0, 2), (2, 1), (1, 3)])
    assert topological_order(g).tolist() == [0, 2, 1, 3]


def _graphlib_order(g: StepGraph) -> np.ndarray:
    sorter: graphlib.TopologicalSorter = graphlib.TopologicalSorter()
    for v in range(len(g.node_ts_ns)):
        sorter.add(v)
    for s, d in zip(g.edge_src.tolist(), g.edge_dst.tolist()):
        sorter.add(d, s)
    return np.asarray(list(sorter.static_order()), dtype=np.int64)


@pytest.mark.parametrize("rel", SHARED_WITH_STEPS, ids=[Path(r).name[:40] for r in SHARED_WITH_STEPS])
def test_paths_do_not_depend_on_the_order(hta_samples: Path, rel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first step of each shared trace with steps (the graph builder orders nodes too, for the
    absorbing edges): the graph, the longest paths and the critical path are the same, to the
    nanosecond and the edge, with graphlib's order (which knows nothing of time) as with ours."""
    rt = shared_trace(hta_samples.parent / rel)
    step = int(rt.steps["step"].iloc[0])
    ours = build_step_graph(rt, step)
    assert _forward(ours, topological_order(ours))
    monkeypatch.setattr(depgraph, "topological_order", _graphlib_order)
    theirs = build_step_graph(rt, step)
    assert np.array_equal(ours.edge_weight_ns, theirs.edge_weight_ns)
    dist_theirs, via_theirs = longest_paths(theirs)
    path_theirs = critical_path(theirs, rt.events)
    monkeypatch.undo()
    dist_ours, via_ours = longest_paths(ours)
    assert np.array_equal(dist_ours, dist_theirs) and np.array_equal(via_ours, via_theirs)
    path_ours = critical_path(ours, rt.events)
    assert np.array_equal(path_ours.path_edges, path_theirs.path_edges)
    assert path_ours.breakdown_pct == path_theirs.breakdown_pct
