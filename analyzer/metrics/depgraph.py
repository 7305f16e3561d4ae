"""The dependency graph of one profiled step: instants joined by the constraints between them.

The model is HTA's critical-path graph (``hta/analyzers/critical_path_analysis.py``), built here
with sorted arrays instead of a per-event walk. Nodes are instants (the start and the end of an
event, plus a few synthetic ones); an edge ``u -> v`` says ``v`` cannot happen before ``u`` plus the
edge's weight, the time it carries. Every weight is *measured* from the trace, so replaying the
unchanged graph (each node at the latest of its in-edges' ``src + weight``) reproduces the step.

Which events (HTA's choice, so the two agree): host events of category ``cpu_op``, the runtime
categories (``cuda_runtime``, ``cuda_driver``, ``hip_runtime``, ``hip_driver``) and host
collectives (kind ``cpu_comm``) that start inside the window and last more than 0 ns; the step's
own ``ProfilerStep#N`` annotation as the root of its thread; device events (kernels, memcpy,
memset) whose launch call is one of those host events. Window: ``[start, end]`` of the
``ProfilerStep#N`` annotation (``step=-1``: the whole trace, from its first event's start to its
last graph event's end).

Edges (:data:`EDGE_KINDS`):

* ``op``: the time a host event spends between consecutive instants of its thread (its start, its
  children's starts and ends, its end), attributed to the innermost event open in that segment;
  a device event's duration.
* ``launch_delay``: a launch call's start to its device event's start, weight the measured
  delay, when the stream was idle at the launch (the previous event on the stream ended before the
  call started; HTA's test). Otherwise the device event waited in the stream's queue: the edge from
  the previous event's end is a ``kernel_kernel`` edge carrying the gap, and the launch a
  zero-weight ``dependency``. Two events overlapping on one stream (CUDA graph replays): the later
  waits behind the earlier one's start, that edge carrying the earlier event's time in its category.
  Queued behind device work launched before the window (the previous step's backlog, events not in
  the graph): start node -> a node at the backlog's end (an ``op`` edge charged to the backlog's
  last event, in its category) -> the event (``kernel_kernel``, the gap).
* ``sync``: a device event's end to the release of a blocking host call that waited for it
  (:data:`BLOCKING_CALLS`), zero weight. A blocking call ``[s, e]`` gets a *release* node (a
  second non-start node of the call's event) at ``r = clip(latest awaited end, s, e)``: ``s -> r``
  is its wait and ``r -> e`` an ``op`` edge carrying the return after the release. So the host is
  on the path only for the part of the call after the device finished, and a replay with faster
  device work moves the release. Which device events a call awaits: the ``cuda_sync`` events of
  newer traces (``Stream Sync``: the last event on that stream; ``Context Sync``: the last on every
  stream); without them, per stream the last event launched before the call that ended by its
  return (the trace does not say which stream a stream synchronize waits on); a blocking memcpy
  its own copy.
* ``dependency``: zero-weight order: the start node to every node without a predecessor, every
  node without a successor to the end node, stream order behind a launch edge, launch order behind
  a kernel-kernel edge.
* ``cross_rank``: in a joined multi-rank graph (:func:`join_ranks`), from each rank's start of a
  matched collective to every other rank's end of it.

Absorbing ``op`` edges (:func:`_resolve_absorbing`): the main thread's own time (the step
annotation's segments: untraced Python, or waiting on another thread), the time between another
thread's top-level ops (HTA: zero-weight dependencies) and a blocking call's wait carry their
measured time only where no other in-edge arrives at their node on time, else 0: the path then goes
through what explains the time, and the longest path stays the span. Hand-offs: a run of another
thread's top-level ops (no main-thread instant between them) gets an ``op`` edge from the main
thread's latest instant before it and one to the main thread's next instant after it, carrying the
main thread's time between (charged to the main thread's open op there).

Invariants (tests/test_depgraph*.py): a DAG; ``node_ts_ns[dst] >= node_ts_ns[src] + weight`` up to
:data:`ROUNDING_NS` per edge (Kineto rounds a child's end and its parent's end separately; a
negative measured time is stored as 0); every node is reachable from ``start_node`` and reaches
``end_node``; the longest path from ``start_node`` to ``end_node`` equals
``node_ts_ns[end_node] - node_ts_ns[start_node]`` up to the same rounding per edge on it. The end
node sits at the later of the window's end and the last graph event's end (device work launched
in the step and still running after its annotation closed belongs to the step).

Differences from HTA, by design (docs/metrics.md, "Critical path"): HTA's graph has no single
start and end (its longest path may start and end anywhere), no edge into the previous step's
device backlog, and gives no weight to a blocking call, to the step annotation's own time and to
the gaps between a thread's top-level ops; ours is anchored at the step's start and end so the
path length is the measured span. HTA drops a kernel-kernel edge over 1.5 ms; we keep it (the kernel
waited in its stream's queue that long). Cross-thread runtime-lock edges are not modelled.
Event record/wait (``Event Sync``, ``Stream Wait Event``) need the ``cuda_sync`` events' record
correlation, which the loader does not keep: those waits are not edges yet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import numpy.typing as npt
import pandas as pd

from analyzer.errors import AnalyzerError
from analyzer.ingest.tables import DEVICE_KINDS, RUNTIME_CATS, RankTrace
from analyzer.metrics.nesting import nest, thread_keys
from analyzer.metrics.text import is_in, text_mask

EDGE_KINDS = ("op", "launch_delay", "kernel_kernel", "dependency", "sync", "cross_rank")
BOUND_CATEGORIES = (
    "cpu_bound",
    "data_loading",
    "gpu_compute_bound",
    "gpu_communication_bound",
    "gpu_kernel_kernel_overhead",
    "gpu_kernel_launch_overhead",
)
OP, LAUNCH_DELAY, KERNEL_KERNEL, DEPENDENCY, SYNC, CROSS_RANK = range(len(EDGE_KINDS))
CPU_BOUND, DATA_LOADING, GPU_COMPUTE, GPU_COMM, GPU_KK, GPU_LAUNCH = range(len(BOUND_CATEGORIES))

# Host calls that block until device work finishes (HTA's BLOCKING_SYNC_CALLS without cudaMemcpyAsync,
# which HTA times as a runtime-lock call, plus the HIP names). cudaEventQuery only polls: it is in
# HTA's list, so it is here, and it awaits nothing (its release is its start).
BLOCKING_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventQuery",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "hipDeviceSynchronize",
        "hipStreamSynchronize",
        "hipEventQuery",
        "hipEventSynchronize",
        "hipMemcpy",
    }
)
# Without cuda_sync events: calls that await every device event launched before them.
_AWAIT_ALL = frozenset(
    {"cudaDeviceSynchronize", "cudaStreamSynchronize", "hipDeviceSynchronize", "hipStreamSynchronize"}
)
_AWAIT_OWN = frozenset({"cudaMemcpy", "hipMemcpy"})
# Host categories whose events are graph nodes (HTA's operator-or-runtime mask, plus the HIP runtime).
_HOST_CATS = frozenset({"cpu_op"}) | RUNTIME_CATS
# Per edge, Kineto's separate rounding of a parent's and a child's end (1 us in microsecond traces).
ROUNDING_NS = 1_000
_STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass(frozen=True)
class StepGraph:
    """The dependency graph of one step of one rank (the module docstring says what nodes and edges
    are). Node and edge ids are positions in these arrays; ``node_event``/``edge_event`` are row
    positions (iloc) in the rank's events table, -1 for synthetic nodes and unattributed edges.
    ``node_rank`` is set only on a joined multi-rank graph (:func:`join_ranks`): the rank of each
    node, whose ``node_event`` then indexes that rank's events table."""

    rank: int
    step: int
    start_node: int
    end_node: int
    node_ts_ns: np.ndarray
    node_event: np.ndarray
    node_is_start: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_weight_ns: np.ndarray
    edge_kind: np.ndarray
    edge_event: np.ndarray
    edge_bound: np.ndarray
    node_rank: np.ndarray | None = field(default=None)

    @property
    def span_ns(self) -> int:
        """The measured span the graph covers: end node's time less the start node's."""
        return int(self.node_ts_ns[self.end_node] - self.node_ts_ns[self.start_node])


class _Builder:
    """Accumulates nodes and edges as arrays (one append per batch, never per event)."""

    def __init__(self) -> None:
        self.nodes: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.edges: list[tuple[np.ndarray, ...]] = []
        self.n = 0
        self.m = 0

    def add_nodes(self, ts: np.ndarray, event: np.ndarray, is_start: np.ndarray) -> np.ndarray:
        ids = np.arange(self.n, self.n + len(ts), dtype=np.int64)
        self.nodes.append((np.asarray(ts, np.int64), np.asarray(event, np.int64), np.asarray(is_start, bool)))
        self.n += len(ts)
        return ids

    def add_edges(
        self,
        src: npt.ArrayLike,
        dst: npt.ArrayLike,
        weight: npt.ArrayLike,
        kind: int,
        event: npt.ArrayLike,
        bound: npt.ArrayLike,
    ) -> np.ndarray:
        """Appends edges; returns their ids."""
        src_ids = np.asarray(src, np.int64)
        m = len(src_ids)
        first = self.m
        self.m += m
        self.edges.append(
            (
                src_ids,
                np.asarray(dst, np.int64),
                np.broadcast_to(np.asarray(weight, np.int64), (m,)).copy(),
                np.broadcast_to(np.asarray(kind, np.int8), (m,)).copy(),
                np.broadcast_to(np.asarray(event, np.int64), (m,)).copy(),
                np.broadcast_to(np.asarray(bound, np.int8), (m,)).copy(),
            )
        )
        return np.arange(first, first + m, dtype=np.int64)

    def arrays(self) -> tuple[np.ndarray, ...]:
        if not self.nodes:
            return (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool), *self._no_edges())
        ts, ev, st = (np.concatenate(c) for c in zip(*self.nodes))
        return (ts, ev, st, *([np.concatenate(c) for c in zip(*self.edges)] if self.edges else self._no_edges()))

    @staticmethod
    def _no_edges() -> tuple[np.ndarray, ...]:
        i8, i64 = np.zeros(0, np.int8), np.zeros(0, np.int64)
        return (i64, i64.copy(), i64.copy(), i8, i64.copy(), i8.copy())


def _step_window(events: pd.DataFrame, steps: pd.DataFrame, step: int) -> tuple[int, int, int]:
    """``(start_ns, end_ns, root row)`` of step ``step`` (the ProfilerStep#N annotation's row, -1
    for ``step=-1``, the whole trace: first start to last end). Raises AnalyzerError for a step the
    trace does not have."""
    if step == -1:
        if events.empty:
            return 0, 0, -1
        return int(events["start_ns"].min()), int(events["end_ns"].max()), -1
    row = steps.loc[steps["step"] == step]
    if row.empty:
        have = ", ".join(str(s) for s in steps["step"].tolist()) or "none"
        raise AnalyzerError(f"no ProfilerStep#{step} in the trace (steps: {have})")
    start, end = int(row["start_ns"].iloc[0]), int(row["end_ns"].iloc[0])
    name = f"ProfilerStep#{step}"
    hit = np.flatnonzero(
        text_mask(events["name"], lambda n: n == name)
        & (events["start_ns"].to_numpy(np.int64) == start)
        & ~is_in(events["kind"], DEVICE_KINDS)
    )
    return start, end, int(hit[0]) if len(hit) else -1


def _remap_backward_thread(events: pd.DataFrame, rows: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """HTA's rule: when exactly one thread has ``cpu_op``/``user_annotation`` events named with
    "autograd" and exactly one with "forward", and they differ, the backward thread's events are put
    on the forward thread (the two passes do not overlap; the path then runs through both)."""
    sub = events.iloc[rows]
    cats = is_in(sub["cat"], ("cpu_op", "user_annotation"))

    def only_tid(word: str) -> int | None:
        hit = text_mask(sub["name"], lambda n: word in n) & cats
        tids = np.unique(tid[hit])
        return int(tids[0]) if len(tids) == 1 else None

    fwd, bwd = only_tid("forward"), only_tid("autograd")
    if fwd is None or bwd is None or fwd == bwd:
        return tid
    return np.where(tid == bwd, fwd, tid)


def step_graph(
    events: pd.DataFrame,
    steps: pd.DataFrame,
    step: int,
    rank: int = 0,
    data_load_patterns: Sequence[str] = (),
) -> StepGraph:
    """The dependency graph of ProfilerStep#``step`` (``-1``: the whole trace) of one rank.

    ``events``/``steps`` are the rank's tables (analyzer/ingest/tables.py); node and edge events are
    row positions in ``events``. ``data_load_patterns``: regular expressions; a host event whose name
    matches one is ``data_loading`` on the path instead of ``cpu_bound`` (HTA's ``data_load_events``,
    none by default). Times in ns. Raises AnalyzerError for a step the trace does not have.
    """
    ws, we, root = _step_window(events, steps, step)
    b = _Builder()
    if events.empty:
        return _finish(b, rank, step, -1, -1)
    start_node = int(b.add_nodes(np.array([ws]), np.array([-1]), np.array([True]))[0])

    start = events["start_ns"].to_numpy(np.int64)
    end = events["end_ns"].to_numpy(np.int64)
    kind = events["kind"]
    device = is_in(kind, DEVICE_KINDS)
    corr = events["correlation"].to_numpy(np.int64)

    # Host events of the window (HTA: start inside the window, positive duration).
    host_mask = (
        ~device
        & (events["stream"].to_numpy(np.int64) < 0)
        & (is_in(events["cat"], _HOST_CATS) | is_in(kind, ("cpu_comm",)))
        & (start >= ws)
        & (start <= we)
        & (end > start)
    )
    if root >= 0:
        host_mask[root] = True
    hrows = np.flatnonzero(host_mask)
    tid = _remap_backward_thread(events, hrows, events["tid"].to_numpy(np.int64)[hrows])
    hkey = thread_keys(events["pid"].to_numpy(np.int64)[hrows], tid)
    hs, he = start[hrows], end[hrows]
    _, hparent, hdepth = nest(hkey, hs, he)
    names = events["name"]
    blocking_all = text_mask(names, BLOCKING_CALLS.__contains__) & is_in(kind, ("runtime",))
    hblock = blocking_all[hrows]

    # Device events launched by a host call of the window (by correlation id).
    runtime_rows = np.flatnonzero(host_mask & (corr >= 0) & is_in(kind, ("runtime", "other")))
    rt_by_corr = pd.Series(runtime_rows, index=corr[runtime_rows])
    rt_by_corr = rt_by_corr[~rt_by_corr.index.duplicated()]
    drows_all = np.flatnonzero(device & (corr >= 0))
    launch_row = rt_by_corr.reindex(corr[drows_all]).to_numpy()
    keep = ~np.isnan(launch_row)
    drows = drows_all[keep]
    dlaunch = launch_row[keep].astype(np.int64)

    # Nodes: host start/end, device start/end, a release node per blocking call.
    nh, nd = len(hrows), len(drows)
    h_start = b.add_nodes(hs, hrows, np.ones(nh, bool))
    h_end = b.add_nodes(he, hrows, np.zeros(nh, bool))
    ds, de = start[drows], end[drows]
    d_start = b.add_nodes(ds, drows, np.ones(nd, bool))
    d_end = b.add_nodes(de, drows, np.zeros(nd, bool))
    host_pos = np.full(len(events), -1, np.int64)
    host_pos[hrows] = np.arange(nh)

    bound_host = _host_bounds(names, hrows, data_load_patterns)

    # Device side: op edges, then per stream launch-or-queue edges.
    dkind = kind.to_numpy(object)[drows]
    dbound = np.where(dkind == "comm", GPU_COMM, GPU_COMPUTE).astype(np.int8)
    b.add_edges(d_start, d_end, de - ds, OP, drows, dbound)
    skey = thread_keys(events["pid"].to_numpy(np.int64)[drows], events["stream"].to_numpy(np.int64)[drows])
    order = np.lexsort((de, ds, skey))
    so_key = skey[order]
    first = np.r_[True, so_key[1:] != so_key[:-1]] if nd else np.zeros(0, bool)
    # Latest end among earlier events of the same stream (HTA's "previous event ended" test) and
    # the event that ends then.
    so_end = de[order]
    grp = np.cumsum(first) - 1
    cmax_pos = _group_running_argmax(so_end, grp)
    prev_pos = np.r_[-1, cmax_pos[:-1]] if nd else np.zeros(0, np.int64)
    prev_pos = np.where(first, -1, prev_pos)
    has_prev = prev_pos >= 0
    prev_idx = np.where(has_prev, order[np.clip(prev_pos, 0, None)], -1)
    lrow = dlaunch[order]
    lnode = h_start[host_pos[lrow]]
    lts = start[lrow]
    cur = order
    prev_end_ts = np.where(has_prev, de[np.clip(prev_idx, 0, None)], np.iinfo(np.int64).min)
    # Device work launched before the window and still running or queued on the stream (the
    # previous step's backlog): the latest end among those events started before this one.
    out_row, out_end = _backlog(events, device, drows[order], start, end)
    backlog = (out_end > prev_end_ts) & (out_end >= lts)
    idle_at_launch = (prev_end_ts < lts) & ~backlog
    # Stream idle at the launch: the launch delay carries the time; else the queue gap does.
    li = cur[idle_at_launch]
    b.add_edges(
        lnode[idle_at_launch],
        d_start[li],
        np.maximum(ds[li] - lts[idle_at_launch], 0),
        LAUNCH_DELAY,
        drows[li],
        GPU_LAUNCH,
    )
    # Behind the backlog: from the start node to the backlog's end (the earlier event's time in the
    # window, in its category), then the gap to this event.
    bi = cur[backlog]
    if len(bi):
        b_row = out_row[backlog]
        b_ts = np.minimum(out_end[backlog], ds[bi])
        b_node = b.add_nodes(b_ts, b_row, np.zeros(len(bi), bool))
        b_bound = np.where(kind.to_numpy(object)[b_row] == "comm", GPU_COMM, GPU_COMPUTE).astype(np.int8)
        b.add_edges(np.full(len(bi), start_node), b_node, np.maximum(b_ts - ws, 0), OP, b_row, b_bound)
        b.add_edges(b_node, d_start[bi], ds[bi] - b_ts, KERNEL_KERNEL, b_row, GPU_KK)
        b.add_edges(lnode[backlog], d_start[bi], 0, DEPENDENCY, -1, -1)
        bp = backlog & has_prev
        b.add_edges(d_end[prev_idx[bp]], d_start[cur[bp]], 0, DEPENDENCY, -1, -1)
    q = ~idle_at_launch & ~backlog
    qi, qp = cur[q], prev_idx[q]
    ov = de[qp] > ds[qi]
    b.add_edges(d_end[qp[~ov]], d_start[qi[~ov]], ds[qi[~ov]] - de[qp[~ov]], KERNEL_KERNEL, drows[qp[~ov]], GPU_KK)
    # Overlapping the previous event on its stream (CUDA graph replays): it waited behind that
    # event's start, and the time between the two starts is the earlier event's, in its category.
    b.add_edges(d_start[qp[ov]], d_start[qi[ov]], ds[qi[ov]] - ds[qp[ov]], KERNEL_KERNEL, drows[qp[ov]], dbound[qp[ov]])
    b.add_edges(lnode[q], d_start[qi], 0, DEPENDENCY, -1, -1)
    # Stream order behind a launch edge: from the previous event's end when it ended by then, else
    # its start (events overlapping on one stream: CUDA graph replays).
    pi, pp = cur[idle_at_launch & has_prev], prev_idx[idle_at_launch & has_prev]
    before = de[pp] <= ds[pi]
    b.add_edges(np.where(before, d_end[pp], d_start[pp]), d_start[pi], 0, DEPENDENCY, -1, -1)

    # Host side: consecutive instants of each thread, in call-stack (Euler tour) order.
    tour_node = np.r_[h_start, h_end]
    tour_ts = np.r_[hs, he]
    tour_is_start = np.r_[np.ones(nh, bool), np.zeros(nh, bool)]
    tour_ev = np.r_[np.arange(nh), np.arange(nh)]
    tour_depth = np.r_[hdepth, -hdepth]
    # Same time: ends before starts; outer starts first, inner ends first.
    t_order = np.lexsort((tour_depth, tour_is_start, tour_ts, np.r_[hkey, hkey]))
    tn, tt, tst, tev = tour_node[t_order], tour_ts[t_order], tour_is_start[t_order], tour_ev[t_order]
    tk = np.r_[hkey, hkey][t_order]
    # The open event after each instant: its event when it is a start, else its event's parent.
    open_after = np.where(tst, tev, hparent[tev]) if nh else np.zeros(0, np.int64)
    main_key = _main_thread(hkey, hs, he, hdepth, host_pos[root] if root >= 0 else -1)
    same = tk[1:] == tk[:-1]
    a, c = np.flatnonzero(same), np.flatnonzero(same) + 1
    seg_ev = open_after[a]
    w = np.maximum(tt[c] - tt[a], 0)
    on_main = tk[a] == main_key
    # The main thread's own time outside any traced op inside it (the root annotation's own segments,
    # or top-level gaps without a root): untraced Python, or waiting on another thread. It can absorb:
    # it carries its time only where nothing else arrives on time (_resolve_absorbing).
    own = on_main & (seg_ev == (host_pos[root] if root >= 0 else -1))
    # Another thread's time between its top-level ops is absorbing too (HTA: zero-weight dependencies).
    top_gap = (seg_ev < 0) & ~own
    # A blocking call's own segment (its start to its end, no children) goes through its release.
    blocking_seg = tst[a] & ~tst[c] & (tev[a] == tev[c]) & hblock[tev[a]]
    plain = ~top_gap & ~blocking_seg & ~own
    b.add_edges(tn[a[plain]], tn[c[plain]], w[plain], OP, hrows[seg_ev[plain]], bound_host[seg_ev[plain]])
    absorbing = [
        b.add_edges(tn[a[own]], tn[c[own]], 0, OP, root, CPU_BOUND),
        b.add_edges(tn[a[top_gap]], tn[c[top_gap]], 0, OP, -1, CPU_BOUND),
    ]

    # Blocking calls: release nodes and sync edges.
    bpos = tev[a[blocking_seg]]
    absorbing.append(
        _blocking_calls(
            b, events, hrows, bpos, h_start, h_end, drows, d_end, dlaunch, skey, start, end, corr, bound_host
        )
    )

    # Hand-offs: a run of another thread's top-level ops (ops with no main-thread instant between
    # them) starts after the main thread's latest instant before it and is awaited by the main
    # thread's next instant after it; both edges carry the main thread's time between (the open op
    # there is charged). Added after the thread chains, so that on a tie the main thread's own op
    # keeps the path.
    mpos = np.flatnonzero(tk == main_key)
    m_ts, m_node = tt[mpos], tn[mpos]
    m_open = open_after[mpos]
    other_top = np.flatnonzero((hkey != main_key) & (hparent < 0))
    other_top = other_top[np.lexsort((hs[other_top], hkey[other_top]))]
    if len(other_top) and len(mpos):
        o_s, o_e, o_k = hs[other_top], he[other_top], hkey[other_top]
        p = np.searchsorted(m_ts, o_s, side="right") - 1
        j = np.searchsorted(m_ts, o_e, side="left")
        first_of_thread = np.r_[True, o_k[1:] != o_k[:-1]]
        last_of_thread = np.r_[o_k[1:] != o_k[:-1], True]
        # A main-thread instant falls between this op and the previous (next) one of its thread.
        prev_end = np.r_[np.iinfo(np.int64).min, o_e[:-1]]
        next_start = np.r_[o_s[1:], np.iinfo(np.int64).max]
        run_start = first_of_thread | ((p >= 0) & (m_ts[np.clip(p, 0, None)] >= prev_end))
        run_end = last_of_thread | ((j < len(mpos)) & (m_ts[np.clip(j, 0, len(mpos) - 1)] <= next_start))
        has_p = (p >= 0) & run_start
        pp = p[has_p]
        ev_p = np.where(m_open[pp] >= 0, hrows[np.clip(m_open[pp], 0, None)], -1)
        bd_p = np.where(m_open[pp] >= 0, bound_host[np.clip(m_open[pp], 0, None)], CPU_BOUND)
        b.add_edges(m_node[pp], h_start[other_top[has_p]], o_s[has_p] - m_ts[pp], OP, ev_p, bd_p)
        has_j = (j < len(mpos)) & (j > 0) & run_end
        jj = j[has_j]
        ev_j = np.where(m_open[jj - 1] >= 0, hrows[np.clip(m_open[jj - 1], 0, None)], -1)
        bd_j = np.where(m_open[jj - 1] >= 0, bound_host[np.clip(m_open[jj - 1], 0, None)], CPU_BOUND)
        b.add_edges(h_end[other_top[has_j]], m_node[jj], m_ts[jj] - o_e[has_j], OP, ev_j, bd_j)

    # Anchor: start node before every source, every sink before the end node.
    ts, ev, st, src, dst, wt, kd, ee, bd = b.arrays()
    # A step ends at its annotation's end or its last event's; a whole trace at its last graph event.
    end_ts = max(we, int(ts.max())) if root >= 0 else int(ts.max())
    end_node = int(b.add_nodes(np.array([end_ts]), np.array([-1]), np.array([False]))[0])
    has_in = np.zeros(b.n, bool)
    has_in[dst] = True
    has_out = np.zeros(b.n, bool)
    has_out[src] = True
    sources = np.flatnonzero(~has_in)
    sources = sources[(sources != start_node) & (sources != end_node)]
    sinks = np.flatnonzero(~has_out)
    sinks = sinks[(sinks != end_node) & (sinks != start_node)]
    if len(mpos):
        # The main thread's first instant: the start node's time until then is the main thread's.
        first = m_node[0]
        sources = sources[sources != first]
        if root >= 0:  # the root annotation starts at the window's start
            b.add_edges([start_node], [first], 0, DEPENDENCY, -1, -1)
        else:
            absorbing.append(b.add_edges([start_node], [first], 0, OP, -1, CPU_BOUND))
    b.add_edges(np.full(len(sources), start_node), sources, 0, DEPENDENCY, -1, -1)
    b.add_edges(sinks, np.full(len(sinks), end_node), 0, DEPENDENCY, -1, -1)
    if len(sinks) == 0:
        b.add_edges([start_node], [end_node], 0, DEPENDENCY, -1, -1)
    graph = _finish(b, rank, step, start_node, end_node)
    return _resolve_absorbing(graph, np.concatenate(absorbing))


def _backlog(
    events: pd.DataFrame, device: np.ndarray, rows: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per device row in ``rows``: the row and end of the latest-ending device event *not* in
    ``rows`` on the same stream that started before it (-1 and int64 min when none)."""
    none_row = np.full(len(rows), -1, np.int64)
    none_end = np.full(len(rows), np.iinfo(np.int64).min, np.int64)
    outside = device.copy()
    outside[rows] = False
    orows = np.flatnonzero(outside)
    if len(orows) == 0 or len(rows) == 0:
        return none_row, none_end
    both = np.r_[orows, rows]
    key = thread_keys(events["pid"].to_numpy(np.int64)[both], events["stream"].to_numpy(np.int64)[both])
    ok, qk = key[: len(orows)], key[len(orows) :]
    order = np.lexsort((start[orows], ok))
    ok, o_s, o_e, o_r = ok[order], start[orows][order], end[orows][order], orows[order]
    first = np.r_[True, ok[1:] != ok[:-1]]
    arg = _group_running_argmax(o_e, np.cumsum(first) - 1)
    # Per query, the last outside event of its stream starting before it.
    lo = np.searchsorted(ok, qk, side="left")
    pos = np.empty(len(rows), np.int64)
    for k in np.unique(qk):  # few: one per stream
        sel = qk == k
        a, z = np.searchsorted(ok, k, side="left"), np.searchsorted(ok, k, side="right")
        pos[sel] = a + np.searchsorted(o_s[a:z], start[rows][sel], side="left") - 1
    found = (pos >= lo) & (pos >= 0)
    found &= ok[np.clip(pos, 0, None)] == qk
    at = arg[np.clip(pos, 0, None)]
    return np.where(found, o_r[at], -1), np.where(found, o_e[at], np.iinfo(np.int64).min)


def _main_thread(hkey: np.ndarray, hs: np.ndarray, he: np.ndarray, hdepth: np.ndarray, root_pos: int) -> int:
    """The thread key of the step's root annotation; without one, the thread with the most top-level time."""
    if root_pos >= 0:
        return int(hkey[root_pos])
    if len(hkey) == 0:
        return -1
    top = hdepth == 0
    keys, inv = np.unique(hkey[top], return_inverse=True)
    busy = np.bincount(inv, weights=(he - hs)[top].astype(np.float64))
    return int(keys[int(np.argmax(busy))])


def _group_running_argmax(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Per position, the position of the largest value so far within its group (groups contiguous)."""
    n = len(values)
    if n == 0:
        return np.zeros(0, np.int64)
    # Offset each group above the previous so a global running max never crosses a group boundary.
    span = int(values.max() - values.min()) + 1
    lifted = (values - values.min()).astype(np.int64) + group.astype(np.int64) * span
    run = np.maximum.accumulate(lifted)
    # Position of the running max: the last position where the value equalled it.
    is_new = lifted == run
    idx = np.where(is_new, np.arange(n), 0)
    return np.maximum.accumulate(idx)


def _argmax_per_key(items: np.ndarray, key: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Per distinct key, the item with the largest value (the last such in ``items``' order on ties)."""
    if len(items) == 0:
        return np.zeros(0, np.int64)
    order = np.lexsort((value, key))
    last = np.r_[key[order][1:] != key[order][:-1], True]
    return np.asarray(items, np.int64)[order[last]]


def _host_bounds(names: pd.Series, hrows: np.ndarray, patterns: Sequence[str]) -> np.ndarray:
    """Per host event of the graph, its category on the path: data_loading when its name matches a
    pattern, else cpu_bound."""
    out = np.full(len(hrows), CPU_BOUND, np.int8)
    if patterns:
        regex = re.compile("|".join(f"(?:{p})" for p in patterns))
        hit = text_mask(names, lambda n: regex.search(n) is not None)[hrows]
        out[hit] = DATA_LOADING
    return out


def _blocking_calls(
    b: _Builder,
    events: pd.DataFrame,
    hrows: np.ndarray,
    bpos: np.ndarray,
    h_start: np.ndarray,
    h_end: np.ndarray,
    drows: np.ndarray,
    d_end: np.ndarray,
    dlaunch: np.ndarray,
    skey: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    corr: np.ndarray,
    bound_host: np.ndarray,
) -> np.ndarray:
    """Release nodes, wait/return edges and sync edges of the blocking calls at host positions
    ``bpos``; returns the ids of the wait edges (start -> release), in the order added."""
    if len(bpos) == 0:
        return np.zeros(0, np.int64)
    brow = hrows[bpos]
    bs, be = start[brow], end[brow]
    bname = events["name"].to_numpy(object)[brow].astype(str)
    nd = len(drows)
    # Awaited device events: pairs (blocking position index, device index).
    pairs_b: list[np.ndarray] = []
    pairs_d: list[np.ndarray] = []
    sync_rows = np.flatnonzero(is_in(events["cat"], ("cuda_sync",)))
    by_corr = pd.Series(np.arange(len(brow)), index=corr[brow])
    by_corr = by_corr[~by_corr.index.duplicated() & (by_corr.index >= 0)]
    ds = start[drows]
    synced = np.zeros(len(brow), bool)
    if len(sync_rows) and nd:
        s_corr = corr[sync_rows]
        s_b = by_corr.reindex(s_corr).to_numpy()
        ok = ~np.isnan(s_b)
        sync_rows, s_b = sync_rows[ok], s_b[ok].astype(np.int64)
        s_name = events["name"].to_numpy(object)[sync_rows].astype(str)
        s_stream = thread_keys(
            np.r_[events["pid"].to_numpy(np.int64)[sync_rows], events["pid"].to_numpy(np.int64)[drows]],
            np.r_[events["stream"].to_numpy(np.int64)[sync_rows], events["stream"].to_numpy(np.int64)[drows]],
        )
        sk, dk = s_stream[: len(sync_rows)], s_stream[len(sync_rows) :]
        dpid = events["pid"].to_numpy(np.int64)[drows]
        spid = events["pid"].to_numpy(np.int64)[sync_rows]
        s_end = end[sync_rows]
        for i in range(len(sync_rows)):  # few: one per synchronize call
            if s_name[i] == "Context Sync":
                cand = np.flatnonzero((dpid == spid[i]) & (ds <= s_end[i]))
            elif s_name[i] == "Stream Sync":
                cand = np.flatnonzero((dk == sk[i]) & (ds <= s_end[i]))
            else:
                continue
            if len(cand) == 0:
                synced[s_b[i]] = True
                continue
            # The last event started on each stream by then.
            last = _argmax_per_key(cand, dk[cand], ds[cand])
            pairs_b.append(np.full(len(last), s_b[i]))
            pairs_d.append(last)
            synced[s_b[i]] = True
    if nd:
        lts = start[dlaunch]
        for name_set, own in ((_AWAIT_ALL, False), (_AWAIT_OWN, True)):
            pick = np.flatnonzero(~synced & np.isin(bname, list(name_set)))
            for k in pick:  # few: one per synchronize call
                if own:
                    cand = np.flatnonzero(corr[drows] == corr[brow[k]])
                else:
                    # Launched before the call and done by its return (the trace does not say which
                    # stream a stream synchronize waits on: the latest of each stream that fits).
                    cand = np.flatnonzero((lts < bs[k]) & (end[drows] <= be[k]))
                    cand = _argmax_per_key(cand, skey[cand], end[drows][cand])
                if len(cand):
                    pairs_b.append(np.full(len(cand), k))
                    pairs_d.append(cand.astype(np.int64))
    pb = np.concatenate(pairs_b) if pairs_b else np.zeros(0, np.int64)
    pd_ = np.concatenate(pairs_d) if pairs_d else np.zeros(0, np.int64)
    awaited = np.full(len(brow), np.iinfo(np.int64).min)
    if len(pb):
        np.maximum.at(awaited, pb, end[drows][pd_])
    release = np.clip(np.maximum(awaited, bs), bs, be)
    r_node = b.add_nodes(release, brow, np.zeros(len(brow), bool))
    waits = b.add_edges(h_start[bpos], r_node, 0, OP, brow, bound_host[bpos])
    b.add_edges(r_node, h_end[bpos], be - release, OP, brow, bound_host[bpos])
    if len(pb):
        b.add_edges(d_end[pd_], r_node[pb], 0, SYNC, -1, -1)
    return waits


def _finish(b: _Builder, rank: int, step: int, start_node: int, end_node: int) -> StepGraph:
    ts, ev, st, src, dst, wt, kd, ee, bd = b.arrays()
    return StepGraph(
        rank=rank,
        step=step,
        start_node=start_node,
        end_node=end_node,
        node_ts_ns=ts,
        node_event=ev,
        node_is_start=st,
        edge_src=src,
        edge_dst=dst,
        edge_weight_ns=wt,
        edge_kind=kd,
        edge_event=ee,
        edge_bound=bd,
    )


def topological_order(graph: StepGraph) -> np.ndarray:
    """Node ids in an order where every edge goes forward; raises AnalyzerError on a cycle."""
    n = len(graph.node_ts_ns)
    src, dst = graph.edge_src, graph.edge_dst
    indeg = np.bincount(dst, minlength=n)
    out_order = np.argsort(src, kind="stable")
    out_start = np.searchsorted(src[out_order], np.arange(n + 1))
    succ = dst[out_order].tolist()
    starts = out_start.tolist()
    deg = indeg.tolist()
    # Kahn's algorithm, ready nodes taken in time order so ties keep the trace's order.
    ts = graph.node_ts_ns.tolist()
    import heapq

    ready = [(ts[v], v) for v in range(n) if deg[v] == 0]
    heapq.heapify(ready)
    out: list[int] = []
    while ready:
        _, v = heapq.heappop(ready)
        out.append(v)
        for k in range(starts[v], starts[v + 1]):
            u = succ[k]
            deg[u] -= 1
            if deg[u] == 0:
                heapq.heappush(ready, (ts[u], u))
    if len(out) != n:
        raise AnalyzerError(f"rank {graph.rank} step {graph.step}: the dependency graph has a cycle")
    return np.asarray(out, dtype=np.int64)


def longest_paths(graph: StepGraph, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per node, the longest path length (ns) from the start node, and the in-edge it arrives by
    (-1 for the start node and nodes it does not reach). ``weights`` replaces the edge weights
    (same order). Of in-edges arriving at the same time, the path takes the one from the latest
    instant (the last constraint released: another thread's op that ends inside the main thread's
    untraced time, rather than the untraced time itself); then the one added first."""
    w = graph.edge_weight_ns if weights is None else weights
    n = len(graph.node_ts_ns)
    order = topological_order(graph)
    in_order = np.argsort(graph.edge_dst, kind="stable")
    in_start = np.searchsorted(graph.edge_dst[in_order], np.arange(n + 1)).tolist()
    ie = in_order.tolist()
    src = graph.edge_src.tolist()
    wl = w.tolist()
    tsl = graph.node_ts_ns.tolist()
    unreached = -(1 << 62)
    dist = [unreached] * n
    via = [-1] * n
    dist[graph.start_node] = 0
    for v in order.tolist():
        best, arg, arg_ts = dist[v], via[v], unreached
        for k in range(in_start[v], in_start[v + 1]):
            e = ie[k]
            u = src[e]
            d = dist[u]
            if d == unreached:
                continue
            d += wl[e]
            if d > best or (d == best and tsl[u] > arg_ts):
                best, arg, arg_ts = d, e, tsl[u]
        dist[v], via[v] = best, arg
    return np.asarray(dist, dtype=np.int64), np.asarray(via, dtype=np.int64)


def path_edges(graph: StepGraph, via: np.ndarray) -> np.ndarray:
    """The edges of the longest path to the end node, in order (from :func:`longest_paths`' ``via``)."""
    out = []
    v = graph.end_node
    while v != graph.start_node:
        e = int(via[v])
        if e < 0:
            break
        out.append(e)
        v = int(graph.edge_src[e])
    return np.asarray(out[::-1], dtype=np.int64)


def _resolve_absorbing(graph: StepGraph, absorbing: np.ndarray) -> StepGraph:
    """Weights of the absorbing edges: a blocking call's wait (start -> release) and the main
    thread's own untraced time. Each carries its measured time only where no other in-edge of its
    node arrives on time (the wait was for work the graph cannot see; the untraced time was the
    main thread's own), else 0 (the time is explained by the path that arrives then). So the longest
    path stays the measured span, and a replay that speeds up what was awaited moves the node.

    One pass in topological order: a node's absorbing edge is settled once its other in-edges are."""
    wait_edges = absorbing
    if len(wait_edges) == 0:
        return graph
    w = graph.edge_weight_ns.copy()
    src, dst, ts = graph.edge_src, graph.edge_dst, graph.node_ts_ns
    n = len(ts)
    order = topological_order(graph)
    in_order = np.argsort(dst, kind="stable")
    in_start = np.searchsorted(dst[in_order], np.arange(n + 1)).tolist()
    ie = in_order.tolist()
    srcl, wl, tsl = src.tolist(), w.tolist(), ts.tolist()
    wait_at = {int(dst[e]): int(e) for e in wait_edges}
    for e in wait_edges:
        wl[int(e)] = 0
    t0 = tsl[graph.start_node]
    unreached = -(1 << 62)
    dist = [unreached] * n
    dist[graph.start_node] = 0
    for v in order.tolist():
        best = dist[v]
        e = wait_at.get(v)
        for k in range(in_start[v], in_start[v + 1]):
            f = ie[k]
            d = dist[srcl[f]]
            if f != e and d != unreached and d + wl[f] > best:
                best = d + wl[f]
        if e is not None:
            d = dist[srcl[e]]
            if best < tsl[v] - t0:
                wl[e] = max(tsl[v] - tsl[srcl[e]], 0)
            if d != unreached:
                best = max(best, d + wl[e])
        dist[v] = best
    return StepGraph(**{**graph.__dict__, "edge_weight_ns": np.asarray(wl, dtype=np.int64)})


def build_step_graph(trace: RankTrace, step: int, data_load_patterns: Sequence[str] = ()) -> StepGraph:
    """:func:`step_graph` of one rank's trace."""
    return step_graph(trace.events, trace.steps, step, trace.rank, data_load_patterns)


_COLLECTIVE_ANNOTATION = re.compile(r"^(gloo|nccl):")


def _collective_nodes(graph: StepGraph, events: pd.DataFrame) -> pd.DataFrame:
    """The collectives of one rank's graph, in start order: ``key`` (process group and the
    collective's ordinal in it), ``start`` and ``end`` node ids. Device collectives (kind ``comm``)
    where the graph has them, else host ``gloo:*``/``nccl:*`` annotations (CPU-only traces)."""
    starts = np.flatnonzero(graph.node_is_start & (graph.node_event >= 0))
    rows = graph.node_event[starts]
    kinds = events["kind"].to_numpy(object)[rows]
    pick = kinds == "comm"
    if not pick.any():
        names = events["name"].to_numpy(object)[rows]
        pick = (kinds == "cpu_comm") & np.array([bool(_COLLECTIVE_ANNOTATION.match(str(n))) for n in names], bool)
    starts, rows = starts[pick], rows[pick]
    # Each event's end node: the non-start node of the same event that is not a release node (the
    # event's end is added before any release node, so the first such node).
    ends_all = np.flatnonzero(~graph.node_is_start & (graph.node_event >= 0))
    first_end = pd.Series(ends_all, index=graph.node_event[ends_all])
    first_end = first_end[~first_end.index.duplicated()]
    ends = first_end.reindex(rows).to_numpy(np.int64)
    order = np.argsort(graph.node_ts_ns[starts], kind="stable")
    starts, rows, ends = starts[order], rows[order], ends[order]
    pg = events["pg_name"].astype(object).to_numpy()[rows]
    pg = np.array(["" if (p is None or p != p) else str(p) for p in pg], dtype=object)
    ordinal = pd.Series(np.ones(len(pg), np.int64)).groupby(pg).cumsum().to_numpy() - 1 if len(pg) else pg
    return pd.DataFrame({"pg": pg, "ordinal": ordinal, "start": starts, "end": ends})


def join_ranks(traces: Sequence[RankTrace], step: int) -> StepGraph:
    """The graphs of step ``step`` of several ranks joined into one (rank -1), with ``cross_rank``
    edges between matched collectives.

    Node ids: rank ``traces[i]``'s nodes follow those of the ranks before it, in the given order;
    ``node_rank`` says whose each node is (``node_event`` and ``edge_event`` index that rank's
    events table; an edge's rank is its source node's). A new start node (the earliest rank start)
    precedes every rank's start node, and every rank's end node precedes a new end node (the latest
    rank end), by zero-weight dependencies. Collectives are matched by process group and their
    order in it on each rank (k-th all-reduce of group "0" with the k-th on every other rank); a
    matched collective cannot end on one rank before it started on every other: an edge from each
    rank's start of it to every other rank's end of it. A rank that lacks the step is an error.
    """
    graphs = [build_step_graph(t, step) for t in traces]
    offsets = np.cumsum([0] + [len(g.node_ts_ns) for g in graphs])

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(g, name) for g in graphs])

    node_ts, node_event, node_is_start = cat("node_ts_ns"), cat("node_event"), cat("node_is_start")
    node_rank = np.concatenate([np.full(len(g.node_ts_ns), t.rank, np.int64) for g, t in zip(graphs, traces)])
    shift = np.concatenate([np.full(len(g.edge_src), o, np.int64) for g, o in zip(graphs, offsets[:-1])])
    src, dst = cat("edge_src") + shift, cat("edge_dst") + shift
    weight, kind, event, bound = cat("edge_weight_ns"), cat("edge_kind"), cat("edge_event"), cat("edge_bound")
    real = [i for i, g in enumerate(graphs) if g.start_node >= 0]
    n = len(node_ts)
    start_ts = min((int(graphs[i].node_ts_ns[graphs[i].start_node]) for i in real), default=0)
    end_ts = max((int(graphs[i].node_ts_ns[graphs[i].end_node]) for i in real), default=0)
    new_src = [np.array([n] * len(real), np.int64), np.array([offsets[i] + graphs[i].end_node for i in real], np.int64)]
    new_dst = [
        np.array([offsets[i] + graphs[i].start_node for i in real], np.int64),
        np.array([n + 1] * len(real), np.int64),
    ]
    colls = [_collective_nodes(graphs[i], traces[i].events).assign(offset=offsets[i], r=i) for i in real]
    if colls:
        allc = pd.concat(colls, ignore_index=True)
        pairs = allc.merge(allc, on=["pg", "ordinal"], suffixes=("_a", "_b"))
        pairs = pairs[pairs["r_a"] != pairs["r_b"]]
        new_src.append((pairs["start_a"] + pairs["offset_a"]).to_numpy(np.int64))
        new_dst.append((pairs["end_b"] + pairs["offset_b"]).to_numpy(np.int64))
    ns, nd = np.concatenate(new_src), np.concatenate(new_dst)
    m = len(ns)
    is_cross = np.zeros(m, bool)
    is_cross[2 * len(real) :] = True
    return StepGraph(
        rank=-1,
        step=step,
        start_node=n,
        end_node=n + 1,
        node_ts_ns=np.r_[node_ts, start_ts, end_ts].astype(np.int64),
        node_event=np.r_[node_event, -1, -1].astype(np.int64),
        node_is_start=np.r_[node_is_start, True, False].astype(bool),
        edge_src=np.r_[src, ns],
        edge_dst=np.r_[dst, nd],
        edge_weight_ns=np.r_[weight, np.zeros(m, np.int64)],
        edge_kind=np.r_[kind, np.where(is_cross, CROSS_RANK, DEPENDENCY).astype(np.int8)],
        edge_event=np.r_[event, np.full(m, -1, np.int64)],
        edge_bound=np.r_[bound, np.full(m, -1, np.int8)],
        node_rank=np.r_[node_rank, -1, -1],
    )
