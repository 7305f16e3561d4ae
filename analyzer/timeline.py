"""Rank-by-time occupancy and event windows, for timeline views.

Two pure functions over the events tables of :mod:`analyzer.tables`:

* :func:`occupancy` bins one rank's time axis and says, per bin, which share
  of the bin was spent in each *state*; the states partition time, so the
  five fractions of a bin sum to 1 (docs/metrics.md, "Timeline occupancy").
* :func:`select_window` picks the events overlapping a time range, capped at
  a number a browser can draw, keeping the longest ones.

States (per instant, on one rank, first match wins):

=================== ===========================================================
``comm_overlapped``  a communication interval and a compute interval are active
``comm_exposed``     communication active, no compute
``compute``          compute active, no communication
``memcpy_exposed``   only a memcpy/memset active
``idle``             nothing active
=================== ===========================================================

Sources: on a trace with GPU events the intervals are device events
(``compute``, ``comm``, ``memcpy``/``memset`` kinds, all streams merged); a
CPU-only trace has no device events, so host ops stand in: ``cpu_op`` as
compute and ``cpu_comm`` (c10d ops, gloo annotations) as communication, with
no memcpy. Annotations (ProfilerStep#N, user ranges) never count: they span
everything. Times are relative to a per-rank *origin* (see
:func:`align_origins`), in integer nanoseconds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping

import numpy as np
import pandas as pd

from analyzer.tables import DEVICE_KINDS

STATES = ("compute", "comm_overlapped", "comm_exposed", "memcpy_exposed", "idle")
Source = Literal["device", "host"]

# Which event kinds play compute / comm / memcpy for each source.
_SOURCE_KINDS: dict[str, dict[str, tuple[str, ...]]] = {
    "device": {"compute": ("compute",), "comm": ("comm",), "memcpy": ("memcpy", "memset")},
    "host": {"compute": ("cpu_op",), "comm": ("cpu_comm",), "memcpy": ()},
}


def source_of(events: pd.DataFrame) -> Source:
    """``device`` when the table has any GPU-stream event, else ``host``."""
    return "device" if bool(events["kind"].isin(DEVICE_KINDS).any()) else "host"


def merge_intervals(start_ns: np.ndarray, end_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of half-open intervals ``[start, end)`` as sorted disjoint ones.

    Empty and negative-length intervals are dropped; touching intervals merge.
    """
    start = np.asarray(start_ns, dtype=np.int64)
    end = np.asarray(end_ns, dtype=np.int64)
    keep = end > start
    start, end = start[keep], end[keep]
    if start.size == 0:
        return start, end
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    run_end = np.maximum.accumulate(end)
    # A new merged interval begins where a start lies beyond every earlier end.
    new = np.empty(start.size, dtype=bool)
    new[0] = True
    new[1:] = start[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, start.size - 1)
    return start[first], run_end[last]


def covered_ns(start_ns: np.ndarray, end_ns: np.ndarray, edges_ns: np.ndarray) -> np.ndarray:
    """Time covered by the union of the intervals inside each bin.

    ``edges_ns`` are ``n + 1`` increasing bin edges; returns ``n`` int64
    durations, bin ``i`` being ``[edges[i], edges[i+1])``.
    """
    s, e = merge_intervals(start_ns, end_ns)
    edges = np.asarray(edges_ns, dtype=np.int64)
    # cumulative(t) = covered time in (-inf, t): whole intervals that start
    # before t, minus the part of the last one that lies beyond t (only the
    # last can straddle t because the intervals are disjoint and sorted).
    prefix = np.concatenate(([0], np.cumsum(e - s)))
    k = np.searchsorted(s, edges, side="right")
    cumulative = prefix[k]
    straddle = k > 0
    beyond = np.zeros(edges.size, dtype=np.int64)
    beyond[straddle] = np.maximum(e[k[straddle] - 1] - edges[straddle], 0)
    cumulative = cumulative - beyond
    return np.diff(cumulative)


def _intervals(events: pd.DataFrame, kinds: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    sel = events[events["kind"].isin(kinds)] if kinds else events.iloc[:0]
    return sel["start_ns"].to_numpy(np.int64), sel["end_ns"].to_numpy(np.int64)


def occupancy(
    events: pd.DataFrame,
    origin_ns: int,
    span_ns: tuple[int, int],
    n_bins: int,
    source: Source | None = None,
) -> pd.DataFrame:
    """Share of each bin spent in each state, for one rank.

    ``span_ns`` is ``(t0, t1)`` relative to ``origin_ns``; it is cut into
    ``n_bins`` bins with edges ``t0 + i * (t1 - t0) // n_bins`` (widths
    differ by at most 1 ns when the span does not divide evenly).
    ``source`` defaults to :func:`source_of`. Returns one row per bin with
    ``bin``, ``start_ns``, ``end_ns`` (relative), and one ``<state>_frac``
    column per state in :data:`STATES`, each in [0, 1], summing to 1.
    """
    t0, t1 = int(span_ns[0]), int(span_ns[1])
    if n_bins < 1 or t1 <= t0:
        raise ValueError(f"need n_bins >= 1 and t1 > t0, got n_bins={n_bins}, span=({t0}, {t1})")
    edges = t0 + (np.arange(n_bins + 1, dtype=np.int64) * (t1 - t0)) // n_bins
    kinds = _SOURCE_KINDS[source or source_of(events)]
    rel = events.assign(
        start_ns=events["start_ns"].to_numpy(np.int64) - origin_ns,
        end_ns=events["end_ns"].to_numpy(np.int64) - origin_ns,
    )
    cs, ce = _intervals(rel, kinds["compute"])
    ms, me = _intervals(rel, kinds["comm"])
    ys, ye = _intervals(rel, kinds["memcpy"])
    compute = covered_ns(cs, ce, edges)
    comm = covered_ns(ms, me, edges)
    compute_or_comm = covered_ns(np.concatenate((cs, ms)), np.concatenate((ce, me)), edges)
    anything = covered_ns(np.concatenate((cs, ms, ys)), np.concatenate((ce, me, ye)), edges)
    width = np.diff(edges).astype(np.float64)
    # Inclusion-exclusion over unions: |A and B| = |A| + |B| - |A or B|.
    both = compute + comm - compute_or_comm
    parts = {
        "compute": compute - both,
        "comm_overlapped": both,
        "comm_exposed": comm - both,
        "memcpy_exposed": anything - compute_or_comm,
        "idle": (edges[1:] - edges[:-1]) - anything,
    }
    out = pd.DataFrame({"bin": np.arange(n_bins, dtype=np.int64), "start_ns": edges[:-1], "end_ns": edges[1:]})
    for state in STATES:
        out[f"{state}_frac"] = parts[state] / width
    return out


def align_origins(steps_by_rank: Mapping[int, pd.DataFrame], events_by_rank: Mapping[int, pd.DataFrame]) -> dict[int, int]:
    """Per-rank time origin (ns, the rank's own clock) that lines ranks up.

    Each rank's trace has its own clock. The origin is the start of the first
    ProfilerStep that every rank recorded (a step boundary is close to a
    synchronization point in data-parallel training); when the ranks share
    no step, each rank's first event. Ranks with no events get origin 0.
    """
    common: set[int] | None = None
    for rank, steps in steps_by_rank.items():
        ids = set(int(s) for s in steps["step"]) if len(steps) else set()
        common = ids if common is None else common & ids
    first_common = min(common) if common else None
    origins: dict[int, int] = {}
    for rank, events in events_by_rank.items():
        steps = steps_by_rank.get(rank)
        if first_common is not None and steps is not None:
            origins[rank] = int(steps.loc[steps["step"] == first_common, "start_ns"].iloc[0])
        elif len(events):
            origins[rank] = int(events["start_ns"].min())
        else:
            origins[rank] = 0
    return origins


def active_span(events_by_rank: Mapping[int, pd.DataFrame], origins: Mapping[int, int], source: Source) -> tuple[int, int]:
    """``(t0, t1)`` relative ns covering every rank's events of ``source``.

    Falls back to ``(0, 1)`` when there are no such events, so that callers
    always get a non-empty span.
    """
    kinds = sum(_SOURCE_KINDS[source].values(), ())
    lo, hi = None, None
    for rank, events in events_by_rank.items():
        sel = events[events["kind"].isin(kinds)]
        if not len(sel):
            continue
        s = int(sel["start_ns"].min()) - origins[rank]
        e = int(sel["end_ns"].max()) - origins[rank]
        lo = s if lo is None else min(lo, s)
        hi = e if hi is None else max(hi, e)
    if lo is None or hi is None or hi <= lo:
        return (0, 1)
    return (lo, hi)


@dataclass(frozen=True)
class Window:
    """Events overlapping a time range, at most ``max_events`` of them.

    ``events`` has ``rank``, ``lane`` (GPU stream or host thread), ``kind``,
    ``name`` (str), ``start_ns``, ``end_ns`` (relative to the rank's origin,
    not clipped), sorted by rank, lane, start. ``n_total`` is how many events
    overlapped the range; ``n_total - len(events)`` were dropped, the
    shortest first.
    """

    events: pd.DataFrame
    n_total: int

    @property
    def n_dropped(self) -> int:
        return self.n_total - len(self.events)


def select_window(
    events_by_rank: Mapping[int, pd.DataFrame],
    origins: Mapping[int, int],
    span_ns: tuple[int, int],
    max_events: int,
    source: Source,
) -> Window:
    """Events of ``source`` overlapping ``[t0, t1)`` (relative ns) on all ranks.

    When more than ``max_events`` overlap, the longest ``max_events`` are kept
    (ties broken by earlier start): short events are the ones a zoomed-out
    view cannot show anyway.
    """
    t0, t1 = int(span_ns[0]), int(span_ns[1])
    kinds = sum(_SOURCE_KINDS[source].values(), ())
    parts = []
    for rank, events in events_by_rank.items():
        origin = origins[rank]
        start = events["start_ns"].to_numpy(np.int64) - origin
        end = events["end_ns"].to_numpy(np.int64) - origin
        mask = events["kind"].isin(kinds).to_numpy() & (start < t1) & (end > t0)
        if not mask.any():
            continue
        sel = events.loc[mask]
        lane = sel["stream"] if source == "device" else sel["tid"]
        parts.append(
            pd.DataFrame(
                {
                    "rank": np.full(int(mask.sum()), rank, dtype=np.int64),
                    "lane": lane.to_numpy(np.int64),
                    "kind": sel["kind"].astype(str).to_numpy(),
                    "name": sel["name"].astype(str).to_numpy(),
                    "start_ns": start[mask],
                    "end_ns": end[mask],
                }
            )
        )
    if not parts:
        empty = pd.DataFrame({"rank": [], "lane": [], "kind": [], "name": [], "start_ns": [], "end_ns": []})
        return Window(events=empty.astype({"rank": "int64", "lane": "int64", "start_ns": "int64", "end_ns": "int64"}), n_total=0)
    table = pd.concat(parts, ignore_index=True)
    n_total = len(table)
    if n_total > max_events:
        dur = table["end_ns"] - table["start_ns"]
        keep = table.assign(_dur=dur).sort_values(["_dur", "start_ns"], ascending=[False, True], kind="stable")
        table = keep.head(max_events).drop(columns="_dur")
    table = table.sort_values(["rank", "lane", "start_ns"], kind="stable").reset_index(drop=True)
    return Window(events=table, n_total=n_total)
