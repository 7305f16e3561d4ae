"""Memory: peak allocated and reserved bytes per step and per rank, and a timeline per rank.

Two sources (docs/metrics.md, "Memory"):

* **metrics records** of a reftrain run (docs/rundir.md): per step and
  rank ``mem_bytes``, the CUDA caching allocator's peak allocated bytes
  over the step (``torch.cuda.max_memory_allocated``, reset every step;
  ``mem_kind`` ``cuda_peak_allocated``) or the process's resident set at
  the step's end on CPU (``cpu_rss``), and ``mem_reserved_bytes``, the
  allocator's peak reserved bytes over the step (CUDA only; absent in
  older runs).
* **profiler memory events** of a trace taken with ``profile_memory=True``:
  one ``[memory]`` instant event per allocation and free, carrying the
  allocator's ``Total Allocated`` and ``Total Reserved`` bytes on that
  device right after it (PyTorch's ``profiler_kineto.cpp``;
  :func:`analyzer.ingest.tables.memory_table` reads them). The level only
  changes at an event, so the peak over a window ``[start, end)`` is
  exactly ``max(level at start, levels of the events inside)``, the level at
  start being the last event's before it (unknown, so left out, when the
  window starts before the device's first event).

Everything here is a pure function of those tables; bytes are int64.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analyzer.metrics.frames import empty_frame
from analyzer.ingest.tables import MEMORY_COLUMNS, memory_table

SCHEMA = "analyzer.memory/1"
TIMELINE_BINS = 200  # bins per device and rank of memory_timeline: a small table, enough for a plot
MIB = float(1 << 20)

EVENT_COLUMNS = MEMORY_COLUMNS  # RankTrace.memory (analyzer.ingest.tables.memory_table)
STEP_COLUMNS = ("step", "device", "peak_allocated_bytes", "peak_reserved_bytes", "n_events")
TIMELINE_COLUMNS = ("device", "start_ns", "end_ns", "allocated_bytes", "reserved_bytes")
RUN_STEP_COLUMNS = ("rank", "step", "source", "kind", "peak_allocated_bytes", "peak_reserved_bytes", "profiled")
RANK_COLUMNS = (
    "rank",
    "source",
    "kind",
    "peak_allocated_bytes",
    "peak_allocated_step",
    "peak_reserved_bytes",
    "peak_reserved_step",
    "n_steps",
)


def empty_events() -> pd.DataFrame:
    """A memory events table with no rows."""
    return memory_table({})


def _devices(events: pd.DataFrame) -> list[str]:
    """Devices in a stable order: accelerators first (by name), then cpu."""
    return sorted(events["device"].astype(str).unique(), key=lambda d: (d == "cpu", d))


def step_peaks(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Peak allocated and reserved bytes per (step window, device) from memory events.

    ``events``: :data:`EVENT_COLUMNS`, in time order (ties in file order);
    ``steps``: ``step, start_ns, end_ns``. The peak over ``[start, end)`` is
    ``max(level at start, levels of the events inside)`` (module docstring);
    ``n_events`` counts the events inside. A device with no event at or
    before a window's end has no row for it. Empty without events or steps.
    """
    if events.empty or steps.empty:
        return empty_frame(STEP_COLUMNS)
    rows = []
    starts = steps["start_ns"].to_numpy(np.int64)
    ends = steps["end_ns"].to_numpy(np.int64)
    for device in _devices(events):
        ev = events.loc[events["device"].astype(str) == device]
        ts = ev["ts_ns"].to_numpy(np.int64)
        alloc = ev["allocated_bytes"].to_numpy(np.int64)
        resv = ev["reserved_bytes"].to_numpy(np.int64)
        lo = np.searchsorted(ts, starts, side="left")  # first event inside
        hi = np.searchsorted(ts, ends, side="left")  # one past the last inside
        for step, a, b in zip(steps["step"].to_numpy(np.int64), lo, hi):
            if b == 0:  # no event at or before the window's end on this device
                continue
            first = a - 1 if a > 0 else a  # the level at start (the last event before), else the first inside
            rows.append((int(step), device, int(alloc[first:b].max()), int(resv[first:b].max()), int(b - a)))
    if not rows:
        return empty_frame(STEP_COLUMNS)
    order = {d: i for i, d in enumerate(_devices(events))}
    out = pd.DataFrame(rows, columns=list(STEP_COLUMNS))
    out["_d"] = out["device"].map(order)
    return out.sort_values(["step", "_d"], kind="stable").drop(columns="_d").reset_index(drop=True)


def memory_timeline(events: pd.DataFrame, n_bins: int = TIMELINE_BINS) -> pd.DataFrame:
    """Allocated and reserved bytes over time per device, in at most ``n_bins`` equal bins.

    The bins split ``[first event, last event]`` of the rank (all devices
    share them); a bin's value is the **peak** level over the bin: the max of
    the level carried in from before (the last earlier event's) and of the
    events inside, so a plot never hides a peak however many events a bin
    holds. Columns :data:`TIMELINE_COLUMNS` (trace clock, ns). With a single
    event time, one bin. Empty without events.
    """
    if events.empty:
        return empty_frame(TIMELINE_COLUMNS)
    ts_all = events["ts_ns"].to_numpy(np.int64)
    t0, t1 = int(ts_all.min()), int(ts_all.max())
    n = 1 if t1 == t0 else max(1, int(n_bins))
    edges = t0 + (np.arange(n + 1, dtype=np.float64) * ((t1 - t0) / n)).astype(np.int64)
    edges[-1] = t1 + 1  # the last event falls into the last bin
    low = np.iinfo(np.int64).min
    frames = []
    for device in _devices(events):
        ev = events.loc[events["device"].astype(str) == device]
        ts = ev["ts_ns"].to_numpy(np.int64)
        bin_of = np.searchsorted(edges, ts, side="right") - 1  # each event's bin
        first = np.searchsorted(ts, edges[:-1], side="left")  # each bin's first event (or the next bin's)
        out: dict[str, Any] = {"device": device, "start_ns": edges[:-1], "end_ns": edges[1:]}
        for col in ("allocated_bytes", "reserved_bytes"):
            level = ev[col].to_numpy(np.int64)
            inside = np.full(n, low, dtype=np.int64)
            np.maximum.at(inside, bin_of, level)
            carried = np.where(first > 0, level[np.clip(first - 1, 0, None)], low)  # the level at the bin's start
            out[col] = np.maximum(inside, carried)
        frame = pd.DataFrame(out)
        frames.append(frame.loc[frame["allocated_bytes"] > low])  # bins before the device's first event: no level
    table = pd.concat(frames, ignore_index=True)
    for col in ("start_ns", "end_ns", "allocated_bytes", "reserved_bytes"):
        table[col] = table[col].astype(np.int64)
    return table[list(TIMELINE_COLUMNS)]


@dataclass
class RankMemory:
    """One rank's memory from its trace (what the rank summary stores; docs/metrics.md, "Memory").

    ``steps``: :func:`step_peaks` over the ProfilerStep windows;
    ``timeline``: :func:`memory_timeline`; ``peaks``: per device the max
    allocated and reserved bytes over all the trace's memory events and
    their count (``device, peak_allocated_bytes, peak_reserved_bytes,
    n_events``).
    """

    steps: pd.DataFrame
    timeline: pd.DataFrame
    peaks: pd.DataFrame


def rank_memory(events: pd.DataFrame, steps: pd.DataFrame) -> RankMemory | None:
    """The rank's :class:`RankMemory`, or None when its trace has no memory events."""
    if events is None or events.empty:
        return None
    g = events.groupby("device", sort=False)
    peaks = pd.DataFrame(
        {
            "peak_allocated_bytes": g["allocated_bytes"].max(),
            "peak_reserved_bytes": g["reserved_bytes"].max(),
            "n_events": g.size(),
        }
    ).reset_index()
    order = {d: i for i, d in enumerate(_devices(events))}
    peaks = peaks.sort_values("device", key=lambda c: c.map(order), kind="stable").reset_index(drop=True)
    return RankMemory(steps=step_peaks(events, steps), timeline=memory_timeline(events), peaks=peaks)


def _accelerator(devices: pd.Series) -> pd.Series:
    return devices.astype(str) != "cpu"


def metrics_step_memory(metrics: pd.DataFrame | None) -> pd.DataFrame:
    """Per (rank, step) rows of :data:`RUN_STEP_COLUMNS` from the run's metrics records (source ``metrics``).

    ``kind`` is the record's ``mem_kind``; ``peak_reserved_bytes`` its
    ``mem_reserved_bytes`` (NaN when absent: CPU runs, older runs). Rows
    without ``mem_bytes`` are left out. A step recorded by several attempts
    of a restarted job keeps its last record.
    """
    if metrics is None or metrics.empty or not {"rank", "step", "mem_bytes"} <= set(metrics.columns):
        return empty_frame(RUN_STEP_COLUMNS)
    m = metrics.loc[pd.to_numeric(metrics["mem_bytes"], errors="coerce").notna()]
    if m.empty:
        return empty_frame(RUN_STEP_COLUMNS)
    if "attempt" in m.columns:
        m = m.sort_values("attempt", kind="stable")
    m = m.drop_duplicates(["rank", "step"], keep="last")
    reserved = (
        pd.to_numeric(m["mem_reserved_bytes"], errors="coerce")
        if "mem_reserved_bytes" in m.columns
        else pd.Series(np.nan, index=m.index)
    )
    out = pd.DataFrame(
        {
            "rank": m["rank"].astype(np.int64).to_numpy(),
            "step": m["step"].astype(np.int64).to_numpy(),
            "source": "metrics",
            "kind": (
                m["mem_kind"].astype(object).where(m["mem_kind"].notna(), "unknown")
                if "mem_kind" in m.columns
                else pd.Series("unknown", index=m.index)
            )
            .astype(str)
            .to_numpy(),
            "peak_allocated_bytes": pd.to_numeric(m["mem_bytes"], errors="coerce").to_numpy(np.float64),
            "peak_reserved_bytes": reserved.to_numpy(np.float64),
            "profiled": (
                m["profiled"].fillna(False).astype(bool).to_numpy()
                if "profiled" in m.columns
                else np.zeros(len(m), dtype=bool)
            ),
        }
    )
    return out.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)


def trace_step_memory(parts: dict[int, RankMemory | None]) -> pd.DataFrame:
    """Per (rank, ProfilerStep) rows of :data:`RUN_STEP_COLUMNS` from the ranks' memory events (source ``trace``).

    One device type per rank: its accelerator when the trace has one (the
    max over several devices of it), else the CPU allocator's; ``kind`` is
    the device type (``cuda``, ``hip``, ``cpu``). Profiled steps by
    definition (``profiled`` True).
    """
    frames = []
    for rank, rm in sorted(parts.items()):
        if rm is None or rm.steps.empty:
            continue
        s = rm.steps
        acc = s.loc[_accelerator(s["device"])]
        use = acc if len(acc) else s
        use = use.assign(kind=use["device"].astype(str).str.split(":").str[0])
        g = use.groupby("step", sort=True)
        frames.append(
            pd.DataFrame(
                {
                    "rank": rank,
                    "step": g["peak_allocated_bytes"].max().index.to_numpy(np.int64),
                    "source": "trace",
                    "kind": g["kind"].agg(lambda k: ",".join(sorted(k.unique()))).to_numpy(object),
                    "peak_allocated_bytes": g["peak_allocated_bytes"].max().to_numpy(np.float64),
                    "peak_reserved_bytes": g["peak_reserved_bytes"].max().to_numpy(np.float64),
                    "profiled": True,
                }
            )
        )
    if not frames:
        return empty_frame(RUN_STEP_COLUMNS)
    return pd.concat(frames, ignore_index=True)


def trace_rank_peaks(parts: dict[int, RankMemory | None]) -> pd.DataFrame:
    """Per rank, the peak over all its trace's memory events (:data:`RANK_COLUMNS`, source ``trace``).

    The rank's accelerator devices when it has any (the max over them), else
    its CPU allocator; ``peak_*_step`` is the ProfilerStep whose window
    reaches that peak (None when it lies outside every window, or the trace
    has none); ``n_steps`` the ProfilerSteps with memory figures.
    """
    rows = []
    for rank, rm in sorted(parts.items()):
        if rm is None or rm.peaks.empty:
            continue
        acc = rm.peaks.loc[_accelerator(rm.peaks["device"])]
        use = acc if len(acc) else rm.peaks
        devices = set(use["device"].astype(str))
        steps = rm.steps.loc[rm.steps["device"].astype(str).isin(devices)] if not rm.steps.empty else rm.steps
        row: dict[str, Any] = {
            "rank": int(rank),
            "source": "trace",
            "kind": ",".join(sorted({d.split(":")[0] for d in devices})),
            "n_steps": int(steps["step"].nunique()) if len(steps) else 0,
        }
        for col, step_col in (
            ("peak_allocated_bytes", "peak_allocated_step"),
            ("peak_reserved_bytes", "peak_reserved_step"),
        ):
            peak = float(use[col].max())
            at = steps.loc[steps[col] == peak, "step"] if len(steps) else pd.Series(dtype=np.int64)
            row[col], row[step_col] = peak, (int(at.min()) if len(at) else None)
        rows.append(row)
    return pd.DataFrame(rows, columns=list(RANK_COLUMNS)) if rows else empty_frame(RANK_COLUMNS)


def rank_peaks(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank, the peak over its steps of one source (:data:`RANK_COLUMNS`).

    ``steps``: :data:`RUN_STEP_COLUMNS` rows of one source. Metrics records:
    the steps the profiler did not run in (warmup included: the first
    steps allocate the optimizer's state and often set the peak; a
    profiled step's RSS holds the profiler's own buffers), all steps when
    every step was profiled. ``peak_*_step`` is the first step reaching it.
    """
    if steps.empty:
        return empty_frame(RANK_COLUMNS)
    rows = []
    for rank in sorted(int(r) for r in steps["rank"].unique()):
        s = steps.loc[steps["rank"] == rank]
        if s["source"].iloc[0] == "metrics" and (~s["profiled"].astype(bool)).any():
            s = s.loc[~s["profiled"].astype(bool)]
        row: dict[str, Any] = {
            "rank": rank,
            "source": str(s["source"].iloc[0]),
            "kind": ",".join(sorted(s["kind"].astype(str).unique())),
            "n_steps": int(len(s)),
        }
        for col, step_col in (
            ("peak_allocated_bytes", "peak_allocated_step"),
            ("peak_reserved_bytes", "peak_reserved_step"),
        ):
            values = pd.to_numeric(s[col], errors="coerce").to_numpy(np.float64)
            if np.isfinite(values).any():
                i = int(np.nanargmax(values))
                row[col], row[step_col] = float(values[i]), int(s["step"].to_numpy(np.int64)[i])
            else:
                row[col], row[step_col] = None, None
        rows.append(row)
    return pd.DataFrame(rows, columns=list(RANK_COLUMNS))


@dataclass
class RunMemory:
    """The run's memory (docs/metrics.md, "Memory"); bytes.

    ``steps``: per (rank, step), :data:`RUN_STEP_COLUMNS`, both sources
    (``metrics`` for every recorded step, ``trace`` for the ProfilerSteps of
    traces with memory events). ``ranks``: per rank, :func:`rank_peaks` of
    the headline source: the metrics records when the run has them, else the
    traces (:func:`trace_rank_peaks`: the peak over all of a rank's memory
    events, so a trace without ProfilerSteps has one too). ``source`` names
    it (None: no memory figures at all).
    ``timeline``: per rank, its :func:`memory_timeline` (``rank`` first).
    ``trace_peaks``: per (rank, device) the peak over all the trace's
    memory events. ``peak_allocated_bytes`` / ``peak_reserved_bytes``: the
    run's peak, the max over ranks (the rank closest to running out).
    """

    steps: pd.DataFrame = field(default_factory=lambda: empty_frame(RUN_STEP_COLUMNS))
    ranks: pd.DataFrame = field(default_factory=lambda: empty_frame(RANK_COLUMNS))
    timeline: pd.DataFrame = field(default_factory=lambda: empty_frame(("rank", *TIMELINE_COLUMNS)))
    trace_peaks: pd.DataFrame = field(
        default_factory=lambda: empty_frame(
            ("rank", "device", "peak_allocated_bytes", "peak_reserved_bytes", "n_events")
        )
    )
    source: str | None = None

    @property
    def kind(self) -> str | None:
        """What the headline bytes are: ``cuda_peak_allocated``, ``cpu_rss``, or a trace device (``cuda:0``)."""
        if self.ranks.empty:
            return None
        kinds = sorted({k for ks in self.ranks["kind"].astype(str) for k in ks.split(",")})
        return ",".join(kinds)

    def _peak(self, col: str) -> float | None:
        if self.ranks.empty:
            return None
        values = pd.to_numeric(self.ranks[col], errors="coerce").dropna()
        return float(values.max()) if len(values) else None

    @property
    def peak_allocated_bytes(self) -> float | None:
        return self._peak("peak_allocated_bytes")

    @property
    def peak_reserved_bytes(self) -> float | None:
        return self._peak("peak_reserved_bytes")

    def per_step(self) -> pd.DataFrame:
        """Per (source, step): the max over ranks of both peaks and the rank holding the allocated one."""
        s = self.steps
        if s.empty:
            return empty_frame(("step", "source", "peak_allocated_bytes", "peak_reserved_bytes", "rank", "n_ranks"))
        alloc = pd.to_numeric(s["peak_allocated_bytes"], errors="coerce")
        s = s.assign(_a=alloc.fillna(-1.0))
        idx = s.groupby(["source", "step"], sort=True)["_a"].idxmax()
        g = s.groupby(["source", "step"], sort=True)
        out = pd.DataFrame(
            {
                "peak_allocated_bytes": g["peak_allocated_bytes"].max(),
                "peak_reserved_bytes": g["peak_reserved_bytes"].max(),
                "rank": s.loc[idx.to_numpy(), "rank"].to_numpy(np.int64),
                "n_ranks": g["rank"].nunique(),
            }
        ).reset_index()
        return out[["step", "source", "peak_allocated_bytes", "peak_reserved_bytes", "rank", "n_ranks"]]

    def to_json(self) -> dict[str, Any]:
        """The report's ``memory`` block: the headline, per rank, per step (max over ranks), trace peaks.
        Byte counts and steps are integers (null where unknown). The timeline stays in the API
        (``RunAnalysis.memory.timeline``)."""
        return {
            "schema": SCHEMA,
            "source": self.source,
            "kind": self.kind,
            "peak_allocated_bytes": _whole(self.peak_allocated_bytes),
            "peak_reserved_bytes": _whole(self.peak_reserved_bytes),
            "ranks": _records(self.ranks),
            "steps": _records(self.per_step()),
            "trace_peaks": _records(self.trace_peaks),
        }


def _whole(v: Any) -> Any:
    """A finite integral number as an int (bytes, steps held in float columns beside NaN); NaN as None."""
    if isinstance(v, (float, np.floating)):
        if not np.isfinite(v):
            return None
        return int(v) if float(v).is_integer() else float(v)
    return int(v) if isinstance(v, np.integer) else v


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {
            str(k): _whole(v)
            if str(k).endswith(("_bytes", "_step", "step", "rank", "n_ranks", "n_steps", "n_events"))
            else v
            for k, v in row.items()
        }
        for row in frame.to_dict("records")
    ]


def run_memory(metrics: pd.DataFrame | None, parts: dict[int, RankMemory | None]) -> RunMemory:
    """The run's :class:`RunMemory` from its metrics records and every rank's :class:`RankMemory`."""
    from_metrics = metrics_step_memory(metrics)
    from_trace = trace_step_memory(parts)
    steps = (
        pd.concat([t for t in (from_metrics, from_trace) if not t.empty], ignore_index=True)
        if not (from_metrics.empty and from_trace.empty)
        else empty_frame(RUN_STEP_COLUMNS)
    )
    trace_ranks = trace_rank_peaks(parts)
    source = "metrics" if not from_metrics.empty else "trace" if not trace_ranks.empty else None
    ranks = rank_peaks(from_metrics) if source == "metrics" else trace_ranks
    timelines = [
        rm.timeline.assign(rank=r) for r, rm in sorted(parts.items()) if rm is not None and not rm.timeline.empty
    ]
    timeline = (
        pd.concat(timelines, ignore_index=True)[["rank", *TIMELINE_COLUMNS]]
        if timelines
        else empty_frame(("rank", *TIMELINE_COLUMNS))
    )
    peaks = [rm.peaks.assign(rank=r) for r, rm in sorted(parts.items()) if rm is not None and not rm.peaks.empty]
    trace_peaks = (
        pd.concat(peaks, ignore_index=True)[
            ["rank", "device", "peak_allocated_bytes", "peak_reserved_bytes", "n_events"]
        ]
        if peaks
        else RunMemory().trace_peaks
    )
    return RunMemory(steps=steps, ranks=ranks, timeline=timeline, trace_peaks=trace_peaks, source=source)
