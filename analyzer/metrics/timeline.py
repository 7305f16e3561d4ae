"""Rank-by-time occupancy and event windows, for timeline views.

Pure functions over the events tables of :mod:`analyzer.ingest.tables`:

* :func:`occupancy` cuts one rank's time axis into equal bins and says, per
  bin, which share of it went to each part of the step breakdown. It *is*
  the breakdown of :func:`analyzer.metrics.breakdown.step_breakdown`, applied
  to time bins instead of ProfilerStep windows, so the two views can never
  disagree: on a GPU trace the parts are compute, overlapped communication,
  exposed communication, exposed memcpy and idle; on a CPU-only trace the
  trainer's phases (data, forward, backward, optimizer, grad_sync), exposed
  communication and other. The fractions of a bin sum to 1.
* :func:`select_window` picks the events overlapping a time range, capped at
  a number a browser can draw, keeping the longest ones.
* :func:`overview` aligns several ranks and bins them over one common span.

Times are relative to a per-rank *origin* (see :func:`align_origins`), in
integer nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from analyzer.metrics.breakdown import Source, parts_of, source_of, step_breakdown
from analyzer.metrics.stragglers import collective_spans, wait_intervals

# Events drawn in a zoomed window, per timeline source: GPU-stream events on
# a device timeline; on a host timeline the annotations (phases, ProfilerStep)
# plus host ops and collectives.
_WINDOW_KINDS: dict[str, tuple[str, ...]] = {
    "device": ("compute", "comm", "memcpy", "memset"),
    "host": ("annotation", "cpu_op", "cpu_comm"),
}


def states_of(source: Source) -> tuple[str, ...]:
    """Occupancy state names (breakdown parts without ``_ms``) for a source."""
    return tuple(p.removesuffix("_ms") for p in parts_of(source))


def occupancy(
    events: pd.DataFrame,
    origin_ns: int,
    span_ns: tuple[int, int],
    n_bins: int,
    source: Source | None = None,
    waits: tuple[np.ndarray, np.ndarray] | None = None,
) -> pd.DataFrame:
    """Share of each time bin spent in each breakdown part, for one rank.

    ``span_ns`` is ``(t0, t1)`` relative to ``origin_ns``; it is cut into
    ``n = min(n_bins, t1 - t0)`` bins with edges ``t0 + i * (t1 - t0) // n``
    (widths differ by at most 1 ns when the span does not divide evenly; a
    span shorter than ``n_bins`` ns gets 1 ns bins rather than empty ones,
    whose shares would be 0/0).
    ``source`` defaults to ``device`` when the rank has GPU events;
    ``waits`` are the rank's waiting-at-collective intervals (absolute ns,
    :func:`analyzer.metrics.stragglers.wait_intervals`) for the ``collective_wait``
    state. Returns
    one row per bin with ``bin``, ``start_ns``, ``end_ns`` (relative), and
    one ``<state>_frac`` column per state of :func:`states_of`, each in
    [0, 1], summing to 1.
    """
    t0, t1 = int(span_ns[0]), int(span_ns[1])
    if n_bins < 1 or t1 <= t0:
        raise ValueError(f"need n_bins >= 1 and t1 > t0, got n_bins={n_bins}, span=({t0}, {t1})")
    source = source or source_of(events)
    n = min(n_bins, t1 - t0)
    edges = t0 + (np.arange(n + 1, dtype=np.int64) * (t1 - t0)) // n
    windows = pd.DataFrame(
        {"step": np.arange(n, dtype=np.int64), "start_ns": edges[:-1] + origin_ns, "end_ns": edges[1:] + origin_ns}
    )
    table = step_breakdown(events, windows, source, waits)
    out = pd.DataFrame({"bin": windows["step"], "start_ns": edges[:-1], "end_ns": edges[1:]})
    width_ms = table["step_time_ms"].to_numpy(np.float64)
    for part in parts_of(source):
        out[part.removesuffix("_ms") + "_frac"] = table[part].to_numpy(np.float64) / width_ms
    return out


def align_origins(
    steps_by_rank: Mapping[int, pd.DataFrame], events_by_rank: Mapping[int, pd.DataFrame]
) -> dict[int, int]:
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
        rank_steps = steps_by_rank.get(rank)
        if first_common is not None and rank_steps is not None:
            origins[rank] = int(rank_steps.loc[rank_steps["step"] == first_common, "start_ns"].iloc[0])
        elif len(events):
            origins[rank] = int(events["start_ns"].min())
        else:
            origins[rank] = 0
    return origins


def active_span(
    events_by_rank: Mapping[int, pd.DataFrame], origins: Mapping[int, int], source: Source
) -> tuple[int, int]:
    """``(t0, t1)`` relative ns covering every rank's events of ``source``.

    Falls back to ``(0, 1)`` when there are no such events, so that callers
    always get a non-empty span.
    """
    kinds = _WINDOW_KINDS[source]
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
    kinds = _WINDOW_KINDS[source]
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
        return Window(
            events=empty.astype({"rank": "int64", "lane": "int64", "start_ns": "int64", "end_ns": "int64"}), n_total=0
        )
    table = pd.concat(parts, ignore_index=True)
    n_total = len(table)
    if n_total > max_events:
        dur = table["end_ns"] - table["start_ns"]
        keep = table.assign(_dur=dur).sort_values(["_dur", "start_ns"], ascending=[False, True], kind="stable")
        table = keep.head(max_events).drop(columns="_dur")
    table = table.sort_values(["rank", "lane", "start_ns"], kind="stable").reset_index(drop=True)
    return Window(events=table, n_total=n_total)


@dataclass(frozen=True)
class Overview:
    """The rank-by-time occupancy of a set of ranks (see :func:`overview`).

    ``occupancy`` has one row per (rank, bin): ``rank``, ``bin``,
    ``start_ns``, ``end_ns`` (relative to the rank's origin) and the
    ``<state>_frac`` columns of :func:`states_of` for ``source``.
    ``steps`` has the ProfilerStep windows relative to each rank's origin
    (``rank, step, start_ns, end_ns``).
    """

    source: Source
    span_ns: tuple[int, int]
    origins: dict[int, int]
    occupancy: pd.DataFrame
    steps: pd.DataFrame


def overview(
    events_by_rank: Mapping[int, pd.DataFrame], steps_by_rank: Mapping[int, pd.DataFrame], n_bins: int
) -> Overview:
    """Occupancy of every rank over one common, aligned time span.

    The source is ``device`` when any rank has GPU events (then all ranks
    are read on their device timeline), else ``host``. Ranks are aligned
    with :func:`align_origins`; the span is :func:`active_span`, cut into
    ``n_bins`` bins.
    """
    source: Source = "device" if any(source_of(e) == "device" for e in events_by_rank.values()) else "host"
    origins = align_origins(steps_by_rank, events_by_rank)
    span = active_span(events_by_rank, origins, source)
    waits = wait_intervals(collective_spans(events_by_rank))  # as the analysis does (analyzer.api)
    tables = [
        occupancy(events, origins[rank], span, n_bins, source, waits.get(rank)).assign(rank=rank)
        for rank, events in sorted(events_by_rank.items())
    ]
    columns = ["rank", "bin", "start_ns", "end_ns"] + [f"{s}_frac" for s in states_of(source)]
    occ = pd.concat(tables, ignore_index=True)[columns] if tables else pd.DataFrame(columns=columns)
    step_rows = [
        pd.DataFrame(
            {
                "rank": rank,
                "step": steps["step"].to_numpy(np.int64),
                "start_ns": steps["start_ns"].to_numpy(np.int64) - origins[rank],
                "end_ns": steps["end_ns"].to_numpy(np.int64) - origins[rank],
            }
        )
        for rank, steps in sorted(steps_by_rank.items())
        if rank in origins and len(steps)
    ]
    step_table = (
        pd.concat(step_rows, ignore_index=True)
        if step_rows
        else pd.DataFrame({"rank": [], "step": [], "start_ns": [], "end_ns": []}, dtype="int64")
    )
    return Overview(source=source, span_ns=span, origins=origins, occupancy=occ, steps=step_table)


# ---------------------------------------------------------------------------
# The overview from rank summaries: a fine grid per rank in the map, bins in the reduce
# ---------------------------------------------------------------------------

# A rank's fine grid has at most this many bins (more than the 800 a timeline page offers).
FINE_BINS = 1024


@dataclass
class TimelineGrid:
    """One rank's time, one profiler window, on a fine grid: the map's share of :func:`overview_from_grids`.

    Fine bin ``i`` is ``[anchor_ns + i * bin_ns, anchor_ns + (i + 1) * bin_ns)`` on
    the rank's clock, for ``i`` in ``first_bin .. first_bin + n - 1`` (``n`` the
    length of each ``parts_ns`` array); they cover every event of the window
    that the timeline's states come from (:func:`active_span`'s kinds).
    ``anchor_ns`` is the start of the window's first ProfilerStep (the
    window's first such event when it has no step), ``bin_ns`` the smallest
    power of two (ns) that keeps ``n`` at most :data:`FINE_BINS` + 1.
    ``parts_ns``: the step breakdown's parts (:func:`analyzer.metrics.breakdown.breakdown_pieces`,
    before the waits at collectives) of each fine bin, integer ns (int32 when
    ``bin_ns`` fits). ``step``, ``step_start_ns``, ``step_end_ns``: the window's
    ProfilerSteps, in time order, on the rank's clock (arrays, not a table:
    a summary of 1,024 ranks decodes 1,024 fewer tables). ``window``: the profiler
    window's last step (reftrain file names; None otherwise); ``trace``: the file's name.
    """

    window: int | None
    trace: str
    source: Source
    anchor_ns: int
    bin_ns: int
    first_bin: int
    parts_ns: dict[str, np.ndarray]
    step: np.ndarray
    step_start_ns: np.ndarray
    step_end_ns: np.ndarray


def timeline_grid(
    events: pd.DataFrame, steps: pd.DataFrame, source: Source, window: int | None, trace: str
) -> TimelineGrid | None:
    """The fine grid of one rank's window (see :class:`TimelineGrid`); None without timeline events.

    The grid is anchored on the rank's own clock, so it needs no other rank:
    :func:`overview_from_grids` lines the ranks up afterwards.
    """
    from analyzer.metrics.breakdown import breakdown_pieces

    sel = events[events["kind"].isin(_WINDOW_KINDS[source])]
    if not len(sel):
        return None
    lo, hi = int(sel["start_ns"].min()), int(sel["end_ns"].max())
    step_table = steps[["step", "start_ns", "end_ns"]].sort_values("start_ns").reset_index(drop=True).astype("int64")
    anchor = int(step_table["start_ns"].iloc[0]) if len(step_table) else lo
    bin_ns = 1
    while True:
        first, last = (lo - anchor) // bin_ns, -((anchor - hi) // bin_ns)  # floor, ceil
        if last - first <= FINE_BINS + 1:
            break
        bin_ns *= 2
    edges = anchor + np.arange(first, last + 1, dtype=np.int64) * bin_ns
    windows = pd.DataFrame(
        {"step": np.arange(last - first, dtype=np.int64), "start_ns": edges[:-1], "end_ns": edges[1:]}
    )
    pieces = breakdown_pieces(events, windows, source)
    dtype = np.int32 if bin_ns < 2**31 else np.int64
    return TimelineGrid(
        window=window,
        trace=trace,
        source=source,
        anchor_ns=anchor,
        bin_ns=bin_ns,
        first_bin=int(first),
        parts_ns={p: v.astype(dtype) for p, v in pieces.parts_ns.items()},
        step=step_table["step"].to_numpy(np.int64),
        step_start_ns=step_table["start_ns"].to_numpy(np.int64),
        step_end_ns=step_table["end_ns"].to_numpy(np.int64),
    )


@dataclass
class RunTimeline:
    """What the reduce keeps for timelines: each rank's grids, and what the waits at collectives need.

    ``grids``: per rank, one :class:`TimelineGrid` per profiler window;
    ``movable`` per rank: :attr:`analyzer.metrics.breakdown.BreakdownPieces.movable`;
    ``waits`` per rank: its waiting-at-collective intervals (absolute ns,
    :func:`analyzer.metrics.stragglers.wait_intervals`). ``source``: ``device``
    when any rank has GPU events, else ``host`` (as :func:`overview`).
    """

    source: Source
    grids: dict[int, list[TimelineGrid]]
    movable: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]]
    waits: dict[int, tuple[np.ndarray, np.ndarray]]

    def windows(self) -> list[int | None]:
        """The profiler windows some rank has a grid for, in step order (None: a single unnamed window)."""
        found = {g.window for gs in self.grids.values() for g in gs}
        return sorted(found, key=lambda w: (w is None, w if w is not None else 0))

    def traces(self, window: int | None) -> dict[int, str]:
        """Per rank, the name of its trace file of ``window``."""
        return {r: g.trace for r, gs in sorted(self.grids.items()) for g in gs if g.window == window}


def overview_from_grids(tl: RunTimeline, window: int | None, n_bins: int) -> tuple[Overview, list[str]]:
    """:func:`overview` of one profiler window from the ranks' fine grids (no events needed).

    Ranks are aligned as :func:`align_origins` does: at the start of the
    first ProfilerStep every rank recorded, else at each rank's first event.
    Bins are whole numbers of fine bins of the coarsest rank's grid
    (``bin_ns``, a power of two), as many as fit about ``n_bins`` of them
    over the ranks' common span: between ``n_bins`` and ``2 * n_bins`` bins
    when the span allows (fewer when the grid is coarser), so the span may
    reach up to one fine bin beyond the first and last event. A bin's
    shares are then exactly :func:`occupancy`'s over the same edges
    (waits at collectives included). When a rank's origin is not its grid's
    anchor (the common step is not its window's first), its origin moves to
    the nearest fine-bin edge, at most half a fine bin. Ranks whose
    timeline is not the run's (a CPU-only rank in a GPU run) are left out;
    the second value says so.
    """
    from analyzer.metrics.breakdown import parts_of, parts_with_waits

    source = tl.source
    notes: list[str] = []
    grids = {r: g for r, gs in sorted(tl.grids.items()) for g in gs if g.window == window}
    other = sorted(r for r, g in grids.items() if g.source != source)
    if other:
        notes.append(
            f"{len(other)} rank(s) without a {source} timeline left out: {', '.join(map(str, other[:10]))}"
            + (" ..." if len(other) > 10 else "")
        )
    grids = {r: g for r, g in grids.items() if g.source == source}
    states = [f"{s}_frac" for s in states_of(source)]
    columns = ["rank", "bin", "start_ns", "end_ns"] + states
    if not grids:
        empty = pd.DataFrame({c: pd.Series(dtype="float64") for c in columns})
        steps = pd.DataFrame({"rank": [], "step": [], "start_ns": [], "end_ns": []}, dtype="int64")
        return Overview(source=source, span_ns=(0, 1), origins={}, occupancy=empty, steps=steps), notes
    origins, index, coarse = _aligned_origins(grids)
    lo = min(int(i[0]) for i in index.values())
    hi = max(int(i[-1]) for i in index.values()) + 1
    n_coarse = hi - lo
    group = 1
    while n_coarse // (2 * group) >= max(int(n_bins), 1):
        group *= 2
    first_bin, last_bin = lo // group, -(-hi // group)
    width = coarse * group
    edges = np.arange(first_bin, last_bin + 1, dtype=np.int64) * width
    nb = last_bin - first_bin
    remainder = "idle_ms" if source == "device" else "other_ms"
    parts_list = parts_of(source)
    shares = {p: np.empty(len(grids) * nb, dtype=np.float64) for p in parts_list}
    for i, (r, g) in enumerate(grids.items()):
        where = index[r] // group - first_bin
        parts = {
            p: np.bincount(where, weights=v.astype(np.float64), minlength=nb).astype(np.int64)
            for p, v in g.parts_ns.items()
        }
        covered = sum(parts.values())
        parts[remainder] = parts[remainder] + (width - covered)  # time outside the rank's grid: nothing ran
        lo_abs = edges[:-1] + origins[r]
        parts = parts_with_waits(parts, tl.movable.get(r, {}), tl.waits.get(r), lo_abs, lo_abs + width)
        for p in parts_list:
            # ms over ms, as occupancy() divides, so the shares are equal to the last bit.
            shares[p][i * nb : (i + 1) * nb] = (parts[p] / 1e6) / (width / 1e6)
    ranks = np.fromiter(grids, dtype=np.int64, count=len(grids))
    occ = pd.DataFrame(
        {
            "rank": np.repeat(ranks, nb),
            "bin": np.tile(np.arange(nb, dtype=np.int64), len(grids)),
            "start_ns": np.tile(edges[:-1], len(grids)),
            "end_ns": np.tile(edges[1:], len(grids)),
            **{p.removesuffix("_ms") + "_frac": shares[p] for p in parts_list},
        }
    )[columns]
    step_rows = [
        pd.DataFrame(
            {"rank": r, "step": g.step, "start_ns": g.step_start_ns - origins[r], "end_ns": g.step_end_ns - origins[r]}
        )
        for r, g in grids.items()
        if len(g.step)
    ]
    steps = (
        pd.concat(step_rows, ignore_index=True)
        if step_rows
        else pd.DataFrame({"rank": [], "step": [], "start_ns": [], "end_ns": []}, dtype="int64")
    )
    return Overview(
        source=source, span_ns=(int(edges[0]), int(edges[-1])), origins=origins, occupancy=occ, steps=steps
    ), notes


def _aligned_origins(grids: dict[int, TimelineGrid]) -> tuple[dict[int, int], dict[int, np.ndarray], int]:
    """Each rank's origin (the start of the first ProfilerStep every rank recorded, moved to the nearest
    fine-bin edge; else its grid's anchor), each of its fine bins' coarse bin relative to that origin, and
    the coarse bin width (ns: the coarsest rank's fine bin)."""
    common: set[int] | None = None
    for g in grids.values():
        ids = set(int(s) for s in g.step)
        common = ids if common is None else common & ids
    first_common = min(common) if common else None
    coarse = max(g.bin_ns for g in grids.values())
    origins: dict[int, int] = {}
    index: dict[int, np.ndarray] = {}  # per rank: each fine bin's coarse bin, relative to the origin
    for r, g in grids.items():
        shift = 0
        if first_common is not None:
            at = int(g.step_start_ns[np.flatnonzero(g.step == first_common)[0]])
            shift = round((at - g.anchor_ns) / g.bin_ns)
        origins[r] = g.anchor_ns + shift * g.bin_ns
        n = len(next(iter(g.parts_ns.values())))
        index[r] = (g.first_bin - shift + np.arange(n, dtype=np.int64)) * g.bin_ns // coarse
    return origins, index, coarse
