"""Trace-driven what-if replay: a step's dependency graph re-simulated with changed durations.

The graph (:class:`analyzer.metrics.depgraph.StepGraph`) has instants as
nodes and constraints as edges: ``t[dst] >= t[src] + weight``. The replay
gives every node the earliest time its constraints allow,

    t'[start] = t[start];   t'[v] = max over in-edges (u, v) of t'[u] + w'(u, v)

(longest path from the start node, in topological order), and predicts the
step as ``t'[end] - t'[start]``. With the measured weights this is the
measured span exactly (the builder's invariant: the longest path is the
span). Resource order holds under any change because it is in the graph:
ops on one thread follow each other by ``dependency`` edges, kernels on one
stream by ``kernel_kernel`` edges.

What a measured wait becomes (:func:`replay_weights`). A measured gap is
either work or waiting for something else, and only work is a fixed cost:

* a device event's start waits for its launch (``launch_delay``) and for the
  previous event on its stream (``kernel_kernel``), each carrying the measured
  delay to the start. The constraint whose source came last (the smallest
  weight) is the one the start waited for and keeps its weight; the others
  were waiting for it and keep only their kind's intrinsic cost, the median
  weight of the binding edges of that kind in the step (the trace's own launch
  latency and back-to-back kernel gap), capped at their measured weight. So
  a kernel that waited for its launch starts right after the previous kernel
  when the launch moves earlier, and a kernel queued behind a long kernel no
  longer carries the queue time as a "launch delay" when that kernel shrinks.
* a host call that waits for the device (stream or device synchronize, a
  blocking copy) is split by the builder at its *release*: its start to the
  release carries no time, a ``sync`` edge from the awaited device work's end
  makes the release, and the release to its end carries the return. A ``sync``
  edge's measured gap (the work ended before the call began) is no cost and
  becomes 0, so the call returns that long after the device work, wherever
  that lands.
* a queued device event's launch is a zero-weight ``dependency`` edge (the
  builder's choice), so when its stream's previous event shrinks a lot, the
  replay may start it earlier than its launch plus a launch latency: a
  prediction for a large kernel speed-up on a launch-bound stream is then
  optimistic by up to one launch latency per kernel.

Both rewrites keep the unchanged replay exact: each edge they lower was not
the one its node waited for (or the wait moved onto a binding edge).

What-if changes (:data:`CHANGES`) are pure functions of the graph, its
:class:`EdgeFacts` and the weights, returning new weights (and a floor under
the step: work a change moves off the path that still has to run). The
models, their assumptions and measured accuracy are in docs/suggestions.md
("Replay").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import pandas as pd

from analyzer.errors import AnalyzerError
from analyzer.ingest.schema import FLOP_OPS, MEMORY_BOUND_OPS
from analyzer.metrics.collective_model import fit_alpha_beta
from analyzer.metrics.collectives import collective_table
from analyzer.metrics.critical_path import CriticalPath, critical_path
from analyzer.metrics.depgraph import EDGE_KINDS, StepGraph, longest_paths, path_edges
from analyzer.metrics.idle import LAUNCH_CALLS
from analyzer.metrics.intervals import total_ns, union
from analyzer.metrics.taxonomy import CLASSES, row_classes
from analyzer.metrics.text import is_in, text_mask

OP, LAUNCH_DELAY, KERNEL_KERNEL, DEPENDENCY, SYNC, CROSS_RANK = (EDGE_KINDS.index(k) for k in EDGE_KINDS)
# Constraints into a device event's start that carry the measured delay (see the module docstring).
WAIT_KINDS = (LAUNCH_DELAY, KERNEL_KERNEL)
# PyTorch's profiler annotates the optimizer's step and zero_grad with names starting so.
OPTIMIZER_PREFIX = "Optimizer."
# Host ops whose time grows with the batch on CPU-only graphs: the aten ops doing per-sample work.
BATCH_HOST_OPS = FLOP_OPS | MEMORY_BOUND_OPS | frozenset({"aten::embedding", "aten::embedding_backward"})


class ReplayError(AnalyzerError):
    """A graph the replay cannot simulate (a cycle), or a change that does not apply to it."""


@dataclass(frozen=True)
class Replay:
    """The replayed step: its predicted length and the measured one (ns).

    ``node_ts_ns``: each instant's replayed time (the start node keeps its
    measured time). ``path_edges``: the edges of the replayed critical path,
    start to end. ``weight_ns``: the weights replayed (its breakdown and ops:
    :func:`replayed_path`). ``floor_ns``: a lower bound a change set on the
    step (work moved off the path that still runs within it); ``length_ns``
    already includes it.
    """

    length_ns: int
    measured_ns: int
    node_ts_ns: np.ndarray
    path_edges: np.ndarray
    weight_ns: np.ndarray
    floor_ns: int = 0

    @property
    def length_ms(self) -> float:
        return self.length_ns / 1e6

    @property
    def measured_ms(self) -> float:
        return self.measured_ns / 1e6


@dataclass(frozen=True)
class EdgeFacts:
    """Per edge, what the event its time is attributed to is (the inputs of the what-if changes).

    ``event_kind``: the events table's kind ('' without an event);
    ``cls``: the kernel class (:mod:`analyzer.metrics.taxonomy`), None for
    host events; ``is_launch``: a kernel/copy launch call
    (:data:`analyzer.metrics.idle.LAUNCH_CALLS`); ``is_comm``: a collective
    (device communication kernel or host ``cpu_comm`` op); ``scales_with_batch``:
    work proportional to the batch (device compute, memcpy and memset; on a
    graph without device events, the aten ops of :data:`BATCH_HOST_OPS`);
    ``bus_bytes``: a device collective's bus bytes (nccl-tests' size times its
    bus factor, NaN when unknown); ``alpha_ns``: the fixed cost of the trace's
    own collectives from the alpha-beta fit (None when it cannot be fitted);
    ``comm_busy_ns``: the union of the intervals of the collectives the graph's
    edges carry (ns); ``host_gap``: host time outside every op (an ``op`` edge
    of an annotation such as ``ProfilerStep#N``: Python between ops, or a wait
    no op records, such as DDP's ``work.wait()`` on a gloo collective);
    ``comm_wait_ns``: per host-gap edge, the part of it during which a
    collective was in flight (a host waiting for communication), 0 elsewhere;
    ``once_ns``: per edge, its part inside the optimizer's step or zero_grad
    (PyTorch's ``Optimizer.step#...`` / ``Optimizer.zero_grad#...``
    annotations), which runs once per step whatever the batch or the number of
    micro-batches.
    """

    event_kind: np.ndarray
    cls: np.ndarray
    is_launch: np.ndarray
    is_comm: np.ndarray
    scales_with_batch: np.ndarray
    bus_bytes: np.ndarray
    alpha_ns: float | None
    comm_busy_ns: int = 0
    host_gap: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    comm_wait_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    once_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    notes: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Weights:
    """A change's result: new edge weights (ns) and a floor under the step (ns)."""

    weight_ns: np.ndarray
    floor_ns: int = 0


def replay_weights(graph: StepGraph) -> np.ndarray:
    """The weights the replay starts from: the measured ones with waits a change may remove taken out.

    See the module docstring. Returns a new int64 array; the unchanged replay
    with it is the measured span exactly.
    """
    ts = graph.node_ts_ns.astype(np.int64)
    src, dst = graph.edge_src.astype(np.int64), graph.edge_dst.astype(np.int64)
    w = graph.edge_weight_ns.astype(np.int64).copy()
    kind = graph.edge_kind
    n = len(ts)
    if not len(w):
        return w
    lowest = np.iinfo(np.int64).min
    # Waits into device starts. A node waited for the constraint that arrived at its time and whose
    # source came last: per node the latest source among its tight in-edges (of every kind).
    tight = ts[src] + w >= ts[dst]
    latest = np.full(n, lowest, dtype=np.int64)
    np.maximum.at(latest, dst[tight], ts[src[tight]])
    e = np.flatnonzero(is_in_codes(kind, WAIT_KINDS))
    binding = tight[e] & (ts[src[e]] == latest[dst[e]])
    for k in WAIT_KINDS:
        of_kind = kind[e] == k
        held = w[e[of_kind & binding]]
        intrinsic = int(np.median(held)) if len(held) else 0
        lower = e[of_kind & ~binding]
        w[lower] = np.minimum(w[lower], intrinsic)
    # A sync edge is an ordering: the device work's end releases the waiting call. A measured gap on it
    # (the work ended before the call began) is no cost; exact, since the call's own start edge holds it.
    w[kind == SYNC] = 0
    return w


def is_in_codes(codes: np.ndarray, values: tuple[int, ...]) -> np.ndarray:
    """Mask of ``codes`` (small ints) equal to any of ``values``."""
    return np.isin(codes, np.asarray(values, dtype=codes.dtype))


def longest_times(graph: StepGraph, weight_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each node's earliest time under ``weight_ns`` (ns), and the in-edge it arrives by (-1 for none).

    The longest path from the start node, in topological order
    (:func:`analyzer.metrics.depgraph.longest_paths`, the builder's own).
    Raises ReplayError on a cycle.
    """
    try:
        dist, via = longest_paths(graph, np.asarray(weight_ns, dtype=np.int64))
    except AnalyzerError as exc:
        raise ReplayError(str(exc)) from None
    return int(graph.node_ts_ns[graph.start_node]) + dist, via


def replayed_path(graph: StepGraph, r: Replay, events: pd.DataFrame) -> CriticalPath:
    """The critical path of the replayed step: its breakdown by HTA's categories and its ops ranked by
    time on it (:func:`analyzer.metrics.critical_path.critical_path` of the graph with the replayed weights;
    a floor the change set is not on it)."""
    return critical_path(dataclasses.replace(graph, edge_weight_ns=r.weight_ns), events)


def replay(graph: StepGraph, weights: Weights | np.ndarray | None = None) -> Replay:
    """Replay ``graph`` with ``weights`` (default :func:`replay_weights`: the unchanged step)."""
    if weights is None:
        weights = Weights(replay_weights(graph))
    elif isinstance(weights, np.ndarray):
        weights = Weights(weights)
    w = np.asarray(weights.weight_ns, dtype=np.int64)
    if len(w) != len(graph.edge_src):
        raise ReplayError(f"{len(w)} weights for {len(graph.edge_src)} edges")
    if len(w) and int(w.min()) < 0:
        raise ReplayError("an edge weight is negative")
    if graph.start_node < 0:  # a graph of no events (an empty trace or window): nothing to replay
        empty = np.zeros(0, dtype=np.int64)
        return Replay(0, 0, graph.node_ts_ns.astype(np.int64), empty, w, int(weights.floor_ns))
    t, via = longest_times(graph, w)
    path = path_edges(graph, via)
    start = int(graph.node_ts_ns[graph.start_node])
    length = max(int(t[graph.end_node]) - start, int(weights.floor_ns))
    return Replay(
        length_ns=length,
        measured_ns=int(graph.node_ts_ns[graph.end_node]) - start,
        node_ts_ns=t,
        path_edges=path,
        weight_ns=w,
        floor_ns=int(weights.floor_ns),
    )


# ---------------------------------------------------------------------------
# What each edge's time is (the inputs of the changes)
# ---------------------------------------------------------------------------


def edge_facts(graph: StepGraph, events: pd.DataFrame) -> EdgeFacts:
    """:class:`EdgeFacts` of ``graph``'s edges from the rank's events table (``edge_event`` is a row position)."""
    ev = graph.edge_event.astype(np.int64)
    has = ev >= 0
    rows = ev[has]
    n_edges = len(ev)
    event_kind = np.full(n_edges, "", dtype=object)
    event_kind[has] = events["kind"].astype(str).to_numpy(object)[rows]
    cls = np.full(n_edges, None, dtype=object)
    cls[has] = row_classes(events)[rows]
    names = np.full(n_edges, "", dtype=object)
    names[has] = events["name"].astype(str).to_numpy(object)[rows]
    is_launch = np.isin(names, np.asarray(LAUNCH_CALLS, dtype=object))
    is_comm = np.isin(event_kind, np.asarray(["comm", "cpu_comm"], dtype=object))
    device_graph = bool(np.isin(event_kind, np.asarray(["compute", "comm", "memcpy", "memset"], dtype=object)).any())
    if device_graph:
        scales = np.isin(event_kind, np.asarray(["compute", "memcpy", "memset"], dtype=object))
    else:
        scales = (event_kind == "cpu_op") & np.isin(names, np.asarray(sorted(BATCH_HOST_OPS), dtype=object))
    op = graph.edge_kind == OP
    bus, alpha, notes = _collective_sizes(events, ev)
    comm_rows = np.unique(ev[is_comm & op])
    busy = union(events["start_ns"].to_numpy(np.int64)[comm_rows], events["end_ns"].to_numpy(np.int64)[comm_rows])
    host_gap = op & (event_kind == "annotation")
    lo, hi = graph.node_ts_ns[graph.edge_src], graph.node_ts_ns[graph.edge_dst]
    w = graph.edge_weight_ns.astype(np.int64)
    return EdgeFacts(
        event_kind=event_kind,
        cls=cls,
        is_launch=is_launch & op,
        is_comm=is_comm & op,
        scales_with_batch=scales & op,
        bus_bytes=bus,
        alpha_ns=alpha,
        comm_busy_ns=total_ns(busy),
        host_gap=host_gap,
        comm_wait_ns=np.where(host_gap, covered_ns(lo, hi, busy), 0).astype(np.int64),
        once_ns=np.where(op, np.minimum(covered_ns(lo, hi, _optimizer_intervals(events)), w), 0).astype(np.int64),
        notes=notes,
    )


def _optimizer_intervals(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The union of the optimizer's annotations (``Optimizer.step#AdamW.step``, ``Optimizer.zero_grad#...``)."""
    rows = np.flatnonzero(
        is_in(events["kind"], ("annotation",)) & text_mask(events["name"], lambda n: n.startswith(OPTIMIZER_PREFIX))
    )
    return union(events["start_ns"].to_numpy(np.int64)[rows], events["end_ns"].to_numpy(np.int64)[rows])


def covered_ns(lo: np.ndarray, hi: np.ndarray, intervals: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per query ``[lo, hi)``, its length covered by ``intervals`` (sorted, disjoint: :func:`~analyzer.metrics.intervals.union`)."""
    s, e = intervals
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    if not len(s):
        return np.zeros(len(lo), dtype=np.int64)
    length = e - s
    before = np.concatenate([[0], np.cumsum(length)])  # covered length of the intervals before index k

    def up_to(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(s, t, side="right") - 1  # the last interval starting at or before t
        kk = np.clip(k, 0, None)
        return np.where(k >= 0, before[kk] + np.clip(t - s[kk], 0, length[kk]), 0)

    out: np.ndarray = np.clip(up_to(hi) - up_to(lo), 0, None)
    return out


def _collective_sizes(events: pd.DataFrame, ev: np.ndarray) -> tuple[np.ndarray, float | None, tuple[str, ...]]:
    """Per edge the bus bytes of its device collective (NaN otherwise), and the alpha-beta fixed cost (ns)."""
    bus = np.full(len(ev), np.nan, dtype=np.float64)
    comm_rows = np.flatnonzero(is_in(events["kind"], ("comm",)))
    if not len(comm_rows):
        return bus, None, ()
    table = collective_table(events)
    # collective_table sorts the comm rows by start (stable); the events are sorted by start already.
    order = comm_rows[np.argsort(events["start_ns"].to_numpy(np.int64)[comm_rows], kind="stable")]
    factor = table["busbw_gbps"].to_numpy(np.float64) / table["algbw_gbps"].to_numpy(np.float64)
    size = table["size_bytes"].to_numpy(np.float64)
    per_row = np.full(len(events), np.nan, dtype=np.float64)
    per_row[order] = size * factor
    has = ev >= 0
    bus[has] = per_row[ev[has]]
    alpha_ms, _ = fit_alpha_beta(size, table["duration_ns"].to_numpy(np.float64) / 1e6)
    notes = () if alpha_ms is not None else ("collectives of fewer than two sizes: no fixed cost fitted, taken as 0",)
    return bus, (None if alpha_ms is None else alpha_ms * 1e6), notes


# ---------------------------------------------------------------------------
# What-if changes: (graph, facts, weights) -> Weights
# ---------------------------------------------------------------------------

Change = Callable[[StepGraph, EdgeFacts, Weights], Weights]


def faster(cls: str, factor: float) -> Change:
    """Device events of kernel class ``cls`` (:data:`analyzer.metrics.taxonomy.CLASSES`) ``factor`` times faster."""
    if cls not in CLASSES:
        raise ReplayError(f"unknown kernel class {cls!r}: one of {', '.join(CLASSES)}")
    if not factor > 0:
        raise ReplayError(f"speed-up factor {factor} is not positive")

    def change(graph: StepGraph, facts: EdgeFacts, weights: Weights) -> Weights:
        sel = (graph.edge_kind == OP) & (facts.cls == cls)
        w = weights.weight_ns.copy()
        w[sel] = np.rint(w[sel] / factor).astype(np.int64)
        return Weights(w, weights.floor_ns)

    return change


def comm_bandwidth(busbw_gbps: float) -> Change:
    """Device collectives at ``busbw_gbps`` bus bandwidth: ``alpha + bus_bytes / busbw`` (alpha-beta, Hockney 1994).

    ``alpha`` is the fixed cost fitted on the trace's own collectives
    (:func:`analyzer.metrics.collective_model.fit_alpha_beta`; 0 when it
    cannot be fitted). Collectives of unknown size keep their time.
    """
    if not busbw_gbps > 0:
        raise ReplayError(f"bus bandwidth {busbw_gbps} GB/s is not positive")

    def change(graph: StepGraph, facts: EdgeFacts, weights: Weights) -> Weights:
        sel = facts.is_comm & np.isfinite(facts.bus_bytes)
        w = weights.weight_ns.copy()
        # bytes / (GB/s) = ns.
        w[sel] = np.rint((facts.alpha_ns or 0.0) + facts.bus_bytes[sel] / busbw_gbps).astype(np.int64)
        return Weights(w, weights.floor_ns)

    return change


def no_launch_overhead(graph: StepGraph, facts: EdgeFacts, weights: Weights) -> Weights:
    """Launches cost nothing (CUDA graphs): launch delays and the launch calls' own CPU time go to 0."""
    w = weights.weight_ns.copy()
    w[(graph.edge_kind == LAUNCH_DELAY) | facts.is_launch] = 0
    return Weights(w, weights.floor_ns)


def overlap_comm(graph: StepGraph, facts: EdgeFacts, weights: Weights) -> Weights:
    """Communication hidden behind compute: collectives block nothing on the path.

    Their edges carry no time, nor does the host's waiting for them
    (:attr:`EdgeFacts.comm_wait_ns`), and the step is floored at the time
    communication keeps a rank busy: the union of the collectives' measured
    intervals (:attr:`EdgeFacts.comm_busy_ns`; a host collective and the
    worker thread running it count once), scaled by the ratio of their
    current to their measured edge weights (a bandwidth change applied
    before this one).
    """
    w = weights.weight_ns.copy()
    measured = float(graph.edge_weight_ns[facts.is_comm].sum())
    now = float(w[facts.is_comm].sum())
    floor = int(round(facts.comm_busy_ns * (now / measured if measured > 0 else 1.0)))
    w[facts.is_comm] = 0
    # The host no longer waits for it either (a wait no op records: time outside every op while it ran).
    w = np.maximum(w - facts.comm_wait_ns, 0)
    return Weights(w, max(weights.floor_ns, floor))


def micro_batch_scale(factor: float) -> Change:
    """A ``factor`` times larger micro-batch: the work that grows with the batch (EdgeFacts.scales_with_batch,
    less its part in the optimizer, EdgeFacts.once_ns) takes ``factor`` times as long; launches, waits,
    the optimizer and the collectives (the same gradients) keep their time."""
    if not factor > 0:
        raise ReplayError(f"micro-batch factor {factor} is not positive")

    def change(graph: StepGraph, facts: EdgeFacts, weights: Weights) -> Weights:
        w = weights.weight_ns.copy()
        sel = facts.scales_with_batch
        once = np.minimum(facts.once_ns[sel], w[sel])
        w[sel] = once + np.rint((w[sel] - once) * factor).astype(np.int64)
        return Weights(w, weights.floor_ns)

    return change


def accumulate(factor: int) -> Change:
    """``factor`` times the micro-batches per optimizer step (gradient accumulation without sync).

    Every ``op`` edge repeats ``factor`` times (forward, backward, data
    loading, the host's own time) except what happens once per optimizer
    step: the collectives (the gradients are reduced once, after the last
    micro-batch), the host's waits for them (EdgeFacts.comm_wait_ns) and the
    optimizer (EdgeFacts.once_ns). Waits between events (launch delays,
    stream gaps) keep their time: a lower bound for them.
    """
    if factor < 1:
        raise ReplayError(f"accumulation factor {factor} is below 1")

    def change(graph: StepGraph, facts: EdgeFacts, weights: Weights) -> Weights:
        w = weights.weight_ns.copy()
        sel = (graph.edge_kind == OP) & ~facts.is_comm
        once = np.minimum(facts.once_ns[sel] + facts.comm_wait_ns[sel], w[sel])
        w[sel] = once + (w[sel] - once) * factor
        return Weights(w, weights.floor_ns)

    return change


def apply(graph: StepGraph, facts: EdgeFacts, changes: list[Change]) -> Weights:
    """The replay's start weights with ``changes`` applied in order."""
    weights = Weights(replay_weights(graph))
    for change in changes:
        weights = change(graph, facts, weights)
    return weights


# ---------------------------------------------------------------------------
# Several ranks: one rank's delay removed
# ---------------------------------------------------------------------------


def collective_order(graph: StepGraph, facts: EdgeFacts, events: pd.DataFrame) -> np.ndarray:
    """The collective events of a rank's step (row positions) in issue order (their start, then row)."""
    rows = np.unique(graph.edge_event[facts.is_comm])
    start = events["start_ns"].to_numpy(np.int64)[rows]
    return rows[np.lexsort((rows, start))]


def without_rank_delay(
    graphs: Mapping[int, StepGraph], facts: Mapping[int, EdgeFacts], order: Mapping[int, np.ndarray], rank: int
) -> dict[int, Weights]:
    """Per other rank, weights with the waits for ``rank`` taken out of its collectives.

    ``order``: per rank its collectives (:func:`collective_order`). The k-th
    collective of the step is the same collective on every rank (one process
    group issues them in one order). A collective's time on a rank is the sum
    of its edges' weights. Where ``rank`` took the least time in it, it
    arrived last and the others waited for it: their time there becomes
    ``rank``'s (the transfer alone; each of its edges scaled alike), and so
    does the host's wait for it (host-gap edges overlapping the first
    ``wait`` ns of the collective, :attr:`EdgeFacts.host_gap`). Replaying the
    other ranks with these weights predicts the job's step without
    ``rank``'s delay (``rank`` itself then runs at the pace of the others, so
    it is not replayed). Raises ReplayError when the ranks' steps hold
    different numbers of collectives, or ``rank`` is not among them.
    """
    if rank not in graphs:
        raise ReplayError(f"rank {rank} is not traced (ranks {', '.join(map(str, sorted(graphs)))})")
    counts = {r: len(o) for r, o in order.items()}
    if len(set(counts.values())) > 1:
        raise ReplayError(f"ranks hold different numbers of collectives in the step: {counts}")
    base = {r: Weights(replay_weights(g)) for r, g in graphs.items()}

    def per_collective(r: int) -> tuple[np.ndarray, np.ndarray]:
        """(per edge: its collective's index in order[r] or -1, per collective: its time on rank r)."""
        g = graphs[r]
        index = np.full(len(g.edge_event), -1, dtype=np.int64)
        pos = {int(row): k for k, row in enumerate(order[r])}
        comm = np.flatnonzero(facts[r].is_comm)
        index[comm] = [pos.get(int(row), -1) for row in g.edge_event[comm]]
        ok = index >= 0
        time = np.bincount(index[ok], weights=base[r].weight_ns[ok], minlength=len(order[r]))
        return index, time.astype(np.int64)

    split = {r: per_collective(r) for r in graphs}
    late = split[rank][1]
    rank_last = late <= np.stack([split[r][1] for r in graphs]).min(axis=0)
    out = {}
    for r in (r for r in graphs if r != rank):
        g, w = graphs[r], base[r].weight_ns.copy()
        index, time = split[r]
        waited = np.where(rank_last, np.maximum(time - late, 0), 0)
        # While it waited, the host of this rank sat outside every op (DDP's wait on a gloo collective)
        # or in the collective itself: both shrink by the wait.
        first = np.full(len(order[r]), np.iinfo(np.int64).max, dtype=np.int64)
        on = index >= 0
        np.minimum.at(first, index[on], g.node_ts_ns[g.edge_src[on]])
        hit = rank_last & (waited > 0)
        windows = union(first[hit], first[hit] + waited[hit])
        gap = facts[r].host_gap
        lo, hi = g.node_ts_ns[g.edge_src], g.node_ts_ns[g.edge_dst]
        w[gap] = np.maximum(w[gap] - covered_ns(lo[gap], hi[gap], windows), 0)
        keep = np.where(time > 0, (time - waited) / np.maximum(time, 1), 1.0)
        w[on] = np.rint(w[on] * keep[index[on]]).astype(np.int64)
        out[r] = Weights(w)
    return out


__all__ = [
    "CHANGES",
    "EdgeFacts",
    "Replay",
    "accumulate",
    "ReplayError",
    "Weights",
    "apply",
    "comm_bandwidth",
    "edge_facts",
    "faster",
    "micro_batch_scale",
    "no_launch_overhead",
    "overlap_comm",
    "replay",
    "replay_weights",
    "replayed_path",
    "without_rank_delay",
]

# The changes by their command-line names (analyzer whatif).
CHANGES = (
    "faster",
    "comm_bandwidth",
    "no_launch_overhead",
    "overlap_comm",
    "micro_batch_scale",
    "accumulate",
    "remove_rank_delay",
)
