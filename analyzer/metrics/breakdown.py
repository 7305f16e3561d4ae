"""Per-step time breakdown of one rank: parts that sum exactly to the step.

Device timeline (traces with GPU events; docs/metrics.md, "Step breakdown"):
within each ProfilerStep window ``W = [start, end)``, with ``C`` the union of
compute kernels, ``M`` the union of communication kernels and ``Y`` the
union of memcpy and memset, all streams merged,

* ``compute_ms``         = |(C \\ M) ∩ W|     compute with no communication running
* ``overlapped_comm_ms`` = |(C ∩ M) ∩ W|     communication hidden behind compute
* ``collective_wait_ms`` = |((M ∩ A) \\ C) ∩ W|  waiting at a collective for a later rank
* ``exposed_comm_ms``    = |(M \\ (C ∪ A)) ∩ W|  communication nothing hides, the wait left out
* ``exposed_memcpy_ms``  = |(Y \\ (C ∪ M)) ∩ W|
* ``idle_ms``            = |W| - |(C ∪ M ∪ Y) ∩ W|

``A`` is the rank's *waiting at collectives*: for each collective matched
across ranks (:func:`analyzer.metrics.stragglers.wait_intervals`), the interval from
this rank's arrival to the last rank's arrival. An NCCL kernel that started
early spins until the last rank arrives; that spin is the slow rank's cost,
not this rank's communication, so it is a part of its own.

These partition ``W``, so they sum to ``step_time_ms``; total compute busy
time is ``compute_ms + overlapped_comm_ms``. Device events are clipped to
the window (a kernel running across a step boundary is split).

Host timeline (CPU-only traces): the phase annotations the trainer writes
(``record_function`` ranges named in :data:`HOST_PHASES`) and the host
collective ops (``cpu_comm``: ``c10d::*``, ``gloo:*``, ``record_param_comms``,
on any thread) are the layers. Each instant of ``W`` goes to the first
phase of :data:`PHASE_PRECEDENCE` active there, else to ``exposed_comm_ms``
when a collective is active, else to ``other_ms``; before any phase,
``collective_wait_ms`` takes the instants of ``A`` (above) in which the
threads that issue collectives run no op: the training thread blocked on a
collective that a later rank has not joined yet. Without it the fast rank's
wait in DDP's all-reduce, at the end of ``backward()``, reads as a long
backward, and the waiting rank looks slow. Other collectives running inside
a phase (gloo work on its own threads during backward) are part of that
phase's time, as the trainer's own phase timers see it; ``comm_ms``
(the union of collective time in ``W``, both timelines) is reported beside
the parts and is not one of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from analyzer.metrics.intervals import Intervals, Timeline, sweep, union
from analyzer.metrics.text import is_in, text_mask
from analyzer.ingest.tables import DEVICE_KINDS

Source = Literal["device", "host"]

DEVICE_PARTS = (
    "compute_ms",
    "overlapped_comm_ms",
    "collective_wait_ms",
    "exposed_comm_ms",
    "exposed_memcpy_ms",
    "idle_ms",
)
# record_function names the reference trainer wraps its phases in.
HOST_PHASES = ("data", "forward", "backward", "optimizer", "grad_sync")
# Which phase an instant belongs to when ranges overlap (nesting): the more
# specific, shorter ranges first.
PHASE_PRECEDENCE = ("grad_sync", "optimizer", "backward", "forward", "data")
HOST_PARTS = tuple(f"{p}_ms" for p in HOST_PHASES) + ("collective_wait_ms", "exposed_comm_ms", "other_ms")
# Not a part: reported beside the parts on both timelines.
EXTRA_COLUMNS = ("comm_ms",)

_NS_PER_MS = 1e6
_COMPUTE, _COMM, _MEMCPY, _WAIT = 1, 2, 4, 8
_NO_INTERVALS: Intervals = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))


def parts_of(source: Source) -> tuple[str, ...]:
    """The columns that partition a step on this timeline."""
    return DEVICE_PARTS if source == "device" else HOST_PARTS


def source_of(events: pd.DataFrame) -> Source:
    """``device`` when the rank has any GPU-stream event, else ``host``."""
    return "device" if bool(is_in(events["kind"], DEVICE_KINDS).any()) else "host"


def _layer(events: pd.DataFrame, mask: pd.Series | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = np.asarray(mask, dtype=bool)
    return union(events["start_ns"].to_numpy(np.int64)[rows], events["end_ns"].to_numpy(np.int64)[rows])


def device_timeline(events: pd.DataFrame, waits: Intervals | None = None) -> Timeline:
    """Compute (bit 1), communication (bit 2), memcpy+memset (bit 4), waiting at collectives (bit 8) of one rank."""
    kind = events["kind"]
    return sweep(
        [
            _layer(events, kind == "compute"),
            _layer(events, kind == "comm"),
            _layer(events, is_in(kind, ("memcpy", "memset"))),
            union(*(waits if waits is not None else _NO_INTERVALS)),
        ]
    )


def phase_annotations(events: pd.DataFrame) -> np.ndarray:
    """Boolean row mask of host phase ranges (``user_annotation`` named a phase)."""
    mask: np.ndarray = (
        (events["kind"] == "annotation").to_numpy()
        & is_in(events["cat"], ("user_annotation",))
        & is_in(events["name"], HOST_PHASES)
    )
    return mask


def issuing_threads_busy(events: pd.DataFrame) -> np.ndarray:
    """Row mask of host ops (``cpu_op``, ``cpu_comm``) on the threads that issue ``c10d::*`` collectives.

    Those are the training threads; while one of them runs no op inside a
    collective's wait, it is blocked on that collective.
    """
    kind = events["kind"]
    issuing = (kind == "cpu_comm").to_numpy() & text_mask(events["name"], lambda n: n.startswith("c10d::"))
    threads = np.unique(events["tid"].to_numpy()[issuing])
    return is_in(kind, ("cpu_op", "cpu_comm")) & np.isin(events["tid"].to_numpy(), threads)


def host_timeline(events: pd.DataFrame, waits: Intervals | None = None) -> Timeline:
    """One layer per phase of :data:`HOST_PHASES` (bit ``2**i``), host collectives, waits, issuing threads' ops."""
    is_phase = phase_annotations(events)
    layers = [_layer(events, is_phase & is_in(events["name"], (phase,))) for phase in HOST_PHASES]
    layers.append(_layer(events, events["kind"] == "cpu_comm"))
    layers.append(union(*(waits if waits is not None else _NO_INTERVALS)))
    layers.append(_layer(events, issuing_threads_busy(events)) if waits is not None else _NO_INTERVALS)
    return sweep(layers)


def _window_arrays(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)


def step_breakdown(
    events: pd.DataFrame, steps: pd.DataFrame, source: Source | None = None, waits: Intervals | None = None
) -> pd.DataFrame:
    """Breakdown of each ProfilerStep window of one rank.

    ``events`` is one rank's events table, ``steps`` its ProfilerStep windows
    (``step``, ``start_ns``, ``end_ns``). ``source`` picks the timeline
    (default: ``device`` when there are GPU events). ``waits``: this rank's
    waiting-at-collective intervals on its trace clock
    (:func:`analyzer.metrics.stragglers.wait_intervals`); without them
    ``collective_wait_ms`` is 0 (one rank, or no matched collectives). Returns one row per step
    with ``step, start_ns, end_ns, step_time_ms, source``, the parts of
    :func:`parts_of` in ms (summing to ``step_time_ms``) and ``comm_ms``.
    Empty when ``steps`` is.

    Computed in two stages so that the per-rank work can run where the
    rank's events are (a map worker) and the waits, which need every rank,
    be applied afterwards: :func:`breakdown_pieces` then :func:`with_waits`.
    """
    return with_waits(breakdown_pieces(events, steps, source), waits)


@dataclass
class BreakdownPieces:
    """One rank's step breakdown before the waits at collectives are known.

    ``parts_ns``: each part of :func:`parts_of` per step (int64 ns) as if the
    rank never waited (``collective_wait`` all zero); ``comm_ns``: the union
    of collective time per step. ``movable``: per part, the instants a wait
    would move from that part to ``collective_wait`` (sorted, disjoint
    intervals): on the device timeline the exposed communication ``M \\ C``;
    on the host timeline the instants of each phase (and of exposed
    communication) inside a collective (``M``) in which the issuing threads
    run no op. :func:`with_waits` subtracts ``|movable ∩ A ∩ W|`` from the
    part and adds it to ``collective_wait``. The host pieces use that the
    waits lie inside the rank's collectives (``A ⊂ M``), which
    :func:`analyzer.metrics.stragglers.wait_intervals` guarantees (a wait
    is the head of a collective's own span). Compact: a few intervals per
    collective, whatever the number of events.
    """

    source: Source
    step: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    parts_ns: dict[str, np.ndarray]
    comm_ns: np.ndarray
    movable: dict[str, Intervals]


def _segments(tl: Timeline, select: np.ndarray) -> Intervals:
    return union(tl.seg_start_ns[select], tl.seg_end_ns[select])


def breakdown_pieces(events: pd.DataFrame, steps: pd.DataFrame, source: Source | None = None) -> BreakdownPieces:
    """The per-rank stage of :func:`step_breakdown` (see :class:`BreakdownPieces`)."""
    source = source or source_of(events)
    lo, hi = _window_arrays(steps)
    width_ns = hi - lo
    if source == "device":
        tl = device_timeline(events, None)
        compute, comm = (tl.mask & _COMPUTE) != 0, (tl.mask & _COMM) != 0
        work = tl.mask & (_COMPUTE | _COMM | _MEMCPY)
        parts_ns = {
            "compute_ms": tl.length_in(compute & ~comm, lo, hi),
            "overlapped_comm_ms": tl.length_in(compute & comm, lo, hi),
            "collective_wait_ms": np.zeros(len(lo), dtype=np.int64),
            "exposed_comm_ms": tl.length_in(comm & ~compute, lo, hi),
            "exposed_memcpy_ms": tl.length_in(work == _MEMCPY, lo, hi),
        }
        parts_ns["idle_ms"] = width_ns - tl.length_in(work != 0, lo, hi)
        comm_ns = tl.length_in(comm, lo, hi)
        movable = {"exposed_comm_ms": _segments(tl, comm & ~compute)}
    else:
        tl = host_timeline(events, _NO_INTERVALS)  # with the issuing threads' layer (bit n + 2)
        n = len(HOST_PHASES)
        comm = (tl.mask & (1 << n)) != 0
        idle_thread = (tl.mask & (1 << (n + 2))) == 0
        bit = {p: 1 << i for i, p in enumerate(HOST_PHASES)}
        parts_ns = {"collective_wait_ms": np.zeros(len(lo), dtype=np.int64)}
        movable = {}
        claimed = np.zeros(len(tl.mask), dtype=bool)
        for phase in PHASE_PRECEDENCE:
            mine = ((tl.mask & bit[phase]) != 0) & ~claimed
            parts_ns[f"{phase}_ms"] = tl.length_in(mine, lo, hi)
            movable[f"{phase}_ms"] = _segments(tl, mine & comm & idle_thread)
            claimed |= mine
        exposed = comm & ~claimed
        parts_ns["exposed_comm_ms"] = tl.length_in(exposed, lo, hi)
        movable["exposed_comm_ms"] = _segments(tl, exposed & idle_thread)
        claimed |= exposed
        parts_ns["other_ms"] = width_ns - tl.length_in(claimed, lo, hi)
        parts_ns = {p: parts_ns[p] for p in HOST_PARTS}
        comm_ns = tl.length_in(comm, lo, hi)
    return BreakdownPieces(
        source=source,
        step=steps["step"].to_numpy(np.int64),
        start_ns=lo,
        end_ns=hi,
        parts_ns=parts_ns,
        comm_ns=comm_ns,
        movable={k: v for k, v in movable.items() if len(v[0])},
    )


def parts_with_waits(
    parts_ns: dict[str, np.ndarray],
    movable: dict[str, Intervals],
    waits: Intervals | None,
    lo: np.ndarray,
    hi: np.ndarray,
) -> dict[str, np.ndarray]:
    """``parts_ns`` (ns per window ``[lo, hi)``, before the waits) with ``|movable ∩ A ∩ W|``
    moved from each part to ``collective_wait_ms`` (:class:`BreakdownPieces`); new arrays."""
    out = {k: v.astype(np.int64, copy=True) for k, v in parts_ns.items()}
    if waits is not None and len(waits[0]):
        waited = union(*waits)
        for part, intervals in movable.items():
            tl = sweep([intervals, waited])
            moved = tl.length_in(tl.mask == 3, lo, hi)
            out[part] -= moved
            out["collective_wait_ms"] += moved
    return out


def with_waits(pieces: BreakdownPieces, waits: Intervals | None) -> pd.DataFrame:
    """The step breakdown table of :func:`step_breakdown` from its per-rank
    pieces and the rank's waits at collectives (None: it never waited)."""
    lo, hi = pieces.start_ns, pieces.end_ns
    parts_ns = parts_with_waits(pieces.parts_ns, pieces.movable, waits, lo, hi)
    out = pd.DataFrame(
        {
            "step": pieces.step,
            "start_ns": lo,
            "end_ns": hi,
            "step_time_ms": (hi - lo) / _NS_PER_MS,
            "source": pieces.source,
        }
    )
    for name, ns in parts_ns.items():
        out[name] = ns / _NS_PER_MS
    out["comm_ms"] = pieces.comm_ns / _NS_PER_MS
    return out


def summarize_breakdown(table: pd.DataFrame, source: Source) -> dict[str, dict[str, float]]:
    """Per part: ``median_ms`` and ``mean_ms`` over steps, and ``pct`` of step time.

    ``pct = 100 * sum(part) / sum(step_time)`` over the steps, so the parts'
    percentages sum to 100 (medians of parts need not add up to the median
    step). Empty dict when there are no steps.
    """
    if table.empty:
        return {}
    total_ms = float(table["step_time_ms"].sum())
    out: dict[str, dict[str, float]] = {}
    for part in parts_of(source):
        col = table[part]
        out[part.removesuffix("_ms")] = {
            "median_ms": float(col.median()),
            "mean_ms": float(col.mean()),
            "pct": 100.0 * float(col.sum()) / total_ms if total_ms > 0 else float("nan"),
        }
    return out
