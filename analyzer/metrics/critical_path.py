"""The critical path of a profiled step: the longest path through its dependency graph.

The graph (:mod:`analyzer.metrics.depgraph`) joins the step's instants by the constraints between
them, each edge carrying the time it measured. The critical path is the longest path from the
step's start node to its end node; its length is the step's measured span (the graph's invariant),
and each of its edges is charged to one of HTA's categories (:data:`BOUND_CATEGORIES`, HTA's
``CPGraph.bound_by``): a host op's time is ``cpu_bound`` (``data_loading`` when its name matches a
caller's pattern), a device event's ``gpu_compute_bound`` or, for a collective kernel (nccl/rccl in
its name), ``gpu_communication_bound``; a launch delay is ``gpu_kernel_launch_overhead``, a gap
between events of one stream ``gpu_kernel_kernel_overhead``. Zero-weight edges (dependencies,
syncs, cross-rank) carry no time.

``breakdown_pct[c]`` = 100 x (summed weight of the path's edges of category c) / (summed weight of
all its edges), HTA's ``CPGraph.summary()``. Units: ms for lengths, percent of the path's time for
shares. docs/metrics.md, "Critical path", says how this agrees with HTA and where it differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from analyzer.ingest.tables import RankTrace
from analyzer.metrics.depgraph import BOUND_CATEGORIES, StepGraph, build_step_graph, longest_paths, path_edges

OPS_COLUMNS = ("name", "kind", "bound", "ms_on_path", "pct", "count")


@dataclass(frozen=True)
class CriticalPath:
    """The critical path of one step of one rank (or of a joined multi-rank graph, rank -1).

    ``length_ms``: the longest path's length (= the step's measured span). ``breakdown_pct``: every
    BOUND_CATEGORIES name -> % of the path's weighted time. ``ops``: the events on the path ranked
    by their time on it (OPS_COLUMNS: name, the events table's kind, bound, ms_on_path, pct of the
    path's time, count of distinct events of that name). ``path_edges``: edge ids of the path in
    order, into ``graph``."""

    rank: int
    step: int
    length_ms: float
    breakdown_pct: dict[str, float]
    ops: pd.DataFrame
    path_edges: np.ndarray
    graph: StepGraph


def _empty_ops() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "name": pd.Series(dtype=object),
            "kind": pd.Series(dtype=object),
            "bound": pd.Series(dtype=object),
            "ms_on_path": pd.Series(dtype=np.float64),
            "pct": pd.Series(dtype=np.float64),
            "count": pd.Series(dtype=np.int64),
        }
    )


def critical_path(graph: StepGraph, events: pd.DataFrame | Mapping[int, pd.DataFrame]) -> CriticalPath:
    """The longest path of ``graph`` from its start node to its end node, broken down by HTA's
    categories; ``events`` is the rank's events table the graph's events index (iloc), or for a
    joined multi-rank graph (:func:`analyzer.metrics.depgraph.join_ranks`) each rank's table by
    rank. A graph of no nodes (a trace of no events) gives a path of length 0 with every share 0."""
    if graph.start_node < 0:
        return CriticalPath(
            graph.rank,
            graph.step,
            0.0,
            {c: 0.0 for c in BOUND_CATEGORIES},
            _empty_ops(),
            np.zeros(0, np.int64),
            graph,
        )
    dist, via = longest_paths(graph)
    path = path_edges(graph, via)
    weight = graph.edge_weight_ns[path]
    bound = graph.edge_bound[path]
    total = int(weight.sum())
    per_bound = np.bincount(bound[bound >= 0], weights=weight[bound >= 0], minlength=len(BOUND_CATEGORIES))
    breakdown = {c: (100.0 * float(per_bound[i]) / total if total else 0.0) for i, c in enumerate(BOUND_CATEGORIES)}
    return CriticalPath(
        rank=graph.rank,
        step=graph.step,
        length_ms=float(dist[graph.end_node]) / 1e6,
        breakdown_pct=breakdown,
        ops=_path_ops(graph, path, events, total),
        path_edges=path,
        graph=graph,
    )


def _path_ops(
    graph: StepGraph, path: np.ndarray, events: pd.DataFrame | Mapping[int, pd.DataFrame], total_ns: int
) -> pd.DataFrame:
    """The path's time per (event name, kind, bound), largest first."""
    ev = graph.edge_event[path]
    keep = (ev >= 0) & (graph.edge_weight_ns[path] > 0) & (graph.edge_bound[path] >= 0)
    if not keep.any():
        return _empty_ops()
    rows = ev[keep]
    if isinstance(events, pd.DataFrame):
        ranks = np.zeros(len(rows), np.int64)
        tables = {0: events}
    else:  # a joined multi-rank graph: an edge's event is in its source node's rank's table
        if graph.node_rank is None:
            raise ValueError("events by rank are for a joined multi-rank graph (join_ranks); pass the rank's table")
        ranks = graph.node_rank[graph.edge_src[path][keep]]
        tables = dict(events)
    names = np.empty(len(rows), dtype=object)
    kinds = np.empty(len(rows), dtype=object)
    for r in np.unique(ranks).tolist():
        at = ranks == r
        names[at] = tables[r]["name"].to_numpy(object)[rows[at]].astype(str)
        kinds[at] = tables[r]["kind"].to_numpy(object)[rows[at]].astype(str)
    frame = pd.DataFrame(
        {
            "name": names,
            "kind": kinds,
            "bound": np.asarray(BOUND_CATEGORIES, dtype=object)[graph.edge_bound[path][keep]],
            "ns": graph.edge_weight_ns[path][keep],
            "event": ranks * (1 << 40) + rows,
        }
    )
    out = (
        frame.groupby(["name", "kind", "bound"], sort=False)
        .agg(ns=("ns", "sum"), count=("event", "nunique"))
        .reset_index()
    )
    out["ms_on_path"] = out["ns"] / 1e6
    out["pct"] = 100.0 * out["ns"] / total_ns
    out["count"] = out["count"].astype(np.int64)
    out = out.sort_values(["ms_on_path", "name"], ascending=[False, True], kind="stable").reset_index(drop=True)
    return out[list(OPS_COLUMNS)]


def critical_paths(trace: RankTrace, data_load_patterns: Sequence[str] = ()) -> list[CriticalPath]:
    """One critical path per profiled step (ProfilerStep#N) of the rank, in step order; empty
    without steps. ``data_load_patterns``: see :func:`analyzer.metrics.depgraph.step_graph`."""
    return [
        critical_path(build_step_graph(trace, int(step), data_load_patterns), trace.events)
        for step in trace.steps["step"].tolist()
    ]
