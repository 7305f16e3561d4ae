"""Why the GPU is idle: HTA's idle-time breakdown, kernel launch statistics, host syncs and pageable copies.

Definitions (docs/metrics.md, "Why the GPU is idle"); all times integer ns
in the tables, ms or us (named) in the summaries.

**Idle-time breakdown per stream** (HTA's ``get_idle_time_breakdown``,
``hta/analyzers/breakdown_analysis.py``): on each stream, the device events
(kernels, memcpy, memset; not ``cuda_sync``) of HTA's window
(:func:`analyzer.metrics.overlap.hta_window`) in start order; the gap before
an event is ``start - end of the previous event on the stream``. A gap is

* ``host_wait`` when the event's launch call (the runtime event with its
  correlation id) started after the previous event ended: the host had not
  enqueued it yet;
* else ``kernel_wait`` when the gap is under :data:`KERNEL_WAIT_NS` (HTA's
  ``consecutive_kernel_delay=30``; HTA's docstring says nanoseconds but its
  timestamps are microseconds, so the threshold in effect is 30 us): the
  cost of launching back-to-back kernels;
* else ``other``: the stream waits on something else (an event from another
  stream, a collective, a host sync).

One deliberate difference: a negative gap (two events overlapping on one
stream, seen around CUDA-graph replays) counts as 0 here; HTA adds it, negative,
to kernel wait.

**Device idle by cause** (ours, per rank): the same three causes over the
gaps of the union of every stream, i.e. the time no device event runs at
all; each gap is classified by the event that ends it (the earliest
launched of those starting first). The three sum to the idle time of
``idle_pct`` (HTA's temporal breakdown) exactly.

**Kernel launch statistics** (HTA's ``get_cuda_kernel_launch_stats``,
``hta/analyzers/cuda_kernel_analysis.py``): every (host event, device event)
pair sharing the correlation id of a launch call (:data:`LAUNCH_CALLS`),
in HTA's window: ``cpu_duration`` (the launch call's duration),
``gpu_duration``, ``launch_delay = max(0, gpu start - (cpu start + cpu
duration))`` (HTA's: from the end of the runtime call). A *short kernel*
(HTA's histogram of them) runs shorter than its launch call, whose duration
is at most :data:`RUNTIME_CUTOFF_NS`; launch calls longer than that and
delays over :data:`LAUNCH_DELAY_CUTOFF_NS` are HTA's outliers.

**Host syncs** inside the ProfilerStep windows: calls of :data:`SYNC_CALLS`
(runtime) and :data:`SYNC_OPS` (ops); ``sync_idle`` is the device-idle time
(gaps of the union, clipped to the windows) whose gap contains the end of
such a call: the device drained and waited for the host that the sync held.

**Pageable host-to-device copies** inside the windows: memcpy events named
``Memcpy HtoD (Pageable -> Device)``; their time and its *exposed* part (no
compute or communication kernel runs meanwhile).

Everything is vectorized: one sort per rank, no Python loop over events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analyzer.metrics.frames import empty_frame
from analyzer.ingest.tables import DEVICE_KINDS
from analyzer.metrics.intervals import sweep, union
from analyzer.metrics.launch import launches
from analyzer.metrics.overlap import hta_window
from analyzer.metrics.text import is_in, text_mask

SCHEMA = "analyzer.idle/1"

# HTA's get_idle_time_breakdown(consecutive_kernel_delay=30), in its microseconds.
KERNEL_WAIT_NS = 30_000
# HTA's get_cuda_kernel_launch_stats(runtime_cutoff=50, launch_delay_cutoff=100), microseconds.
RUNTIME_CUTOFF_NS = 50_000
LAUNCH_DELAY_CUTOFF_NS = 100_000
CATEGORIES = ("host_wait", "kernel_wait", "other")

# The launch calls HTA pairs (include_memory_events=True): kernels, then async copies and memsets.
HTA_LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync")
# Ours add the driver API (Triton's kernels) and HIP's names, which HTA's list misses (a ROCm trace has no pairs there).
LAUNCH_CALLS = HTA_LAUNCH_CALLS + (
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "hipLaunchKernel",
    "hipExtModuleLaunchKernel",
    "hipModuleLaunchKernel",
    "hipMemcpyAsync",
    "hipMemsetAsync",
)
# Runtime calls that block the host until the device (or a stream, or an event) catches up; cudaMemcpy is the
# synchronous copy.
SYNC_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "hipStreamSynchronize",
    "hipDeviceSynchronize",
    "hipEventSynchronize",
    "hipMemcpy",
)
# Ops that copy a device scalar to the host (tensor.item(), bool(tensor), print of a device tensor).
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense")


def _named(column: pd.Series, names: tuple[str, ...]) -> np.ndarray:
    """Boolean per row: the name is one of ``names``; on a categorical, by its codes (no pass over every name)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        wanted = column.cat.categories.get_indexer(pd.Index(list(names)))
        codes: np.ndarray = column.cat.codes.to_numpy()
        return np.isin(codes, wanted[wanted >= 0])
    return is_in(column, names)


def _is_pageable_htod(name: str) -> bool:
    return "HtoD" in name and "Pageable" in name


@dataclass(frozen=True)
class DeviceGaps:
    """The gaps of one rank's device timeline (union of all streams), ns: ``start``, ``end``, ``category`` (codes
    into CATEGORIES); ``span_ns`` from the first device event's start to the last one's end."""

    start: np.ndarray
    end: np.ndarray
    category: np.ndarray
    span_ns: int

    def idle_ns(self, category: str | None = None) -> int:
        """Idle time of one cause (all causes when None)."""
        sel = np.ones(len(self.start), dtype=bool) if category is None else self.category == CATEGORIES.index(category)
        return int((self.end[sel] - self.start[sel]).sum())


@dataclass(frozen=True)
class _Columns:
    """The columns every figure here reads, as numpy arrays, and HTA's window: computed once per rank."""

    events: pd.DataFrame
    kind: pd.Series
    name: pd.Series
    stream: np.ndarray
    start: np.ndarray
    end: np.ndarray
    corr: np.ndarray
    tid: np.ndarray
    device: np.ndarray
    window: np.ndarray

    @classmethod
    def of(cls, events: pd.DataFrame, steps: pd.DataFrame) -> "_Columns":
        kind = events["kind"]
        return cls(
            events,
            kind,
            events["name"],
            events["stream"].to_numpy(np.int64),
            events["start_ns"].to_numpy(np.int64),
            events["end_ns"].to_numpy(np.int64),
            events["correlation"].to_numpy(np.int64),
            events["tid"].to_numpy(np.int64),
            is_in(kind, DEVICE_KINDS),
            hta_window(events, steps),
        )


def _window_device(c: _Columns) -> pd.DataFrame:
    # The launch call of a device event (analyzer.metrics.launch.launches: computed once per rank table, the
    # attribution and the breakdown read it too).
    link = launches(c.events)
    pos = link.index.get_indexer(c.events.index[c.window])
    launch_ns = np.full(len(pos), -1, dtype=np.int64)
    if len(link):
        launch_ns[pos >= 0] = link["start_ns"].to_numpy(np.int64)[pos[pos >= 0]]
    return pd.DataFrame(
        {"stream": c.stream[c.window], "start_ns": c.start[c.window], "end_ns": c.end[c.window], "launch_ns": launch_ns}
    )


def window_device(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The device events of HTA's window: ``stream, start_ns, end_ns, launch_ns`` (the launch call's start, -1
    when the trace lacks it), in table order."""
    return _window_device(_Columns.of(events, steps))


def _classify(gap_ns: np.ndarray, prev_end_ns: np.ndarray, launch_ns: np.ndarray) -> np.ndarray:
    """HTA's rule per gap: host wait if launched after the previous end, else kernel wait under KERNEL_WAIT_NS, else other."""
    host = (launch_ns >= 0) & (launch_ns > prev_end_ns)
    kernel = ~host & (gap_ns < KERNEL_WAIT_NS)
    return np.where(host, 0, np.where(kernel, 1, 2)).astype(np.int8)


def stream_idle(dev: pd.DataFrame) -> pd.DataFrame:
    """Idle-time breakdown per stream (HTA's; module doc) of :func:`window_device`'s events.

    One row per (``stream``, ``idle_category``) for every stream with device
    events and every category of CATEGORIES: ``idle_ns``, ``n_gaps`` (gaps of
    that category, zero-length ones included as HTA counts them),
    ``idle_ratio`` (of the stream's idle time; NaN when it has none).
    """
    stream = dev["stream"].to_numpy(np.int64)
    start = dev["start_ns"].to_numpy(np.int64)
    end = dev["end_ns"].to_numpy(np.int64)
    launch = dev["launch_ns"].to_numpy(np.int64)
    order = np.lexsort((start, stream))
    stream, start, end, launch = stream[order], start[order], end[order], launch[order]
    streams = np.unique(stream)
    n = len(stream)
    follows = np.zeros(n, dtype=bool)
    follows[1:] = stream[1:] == stream[:-1]
    prev_end = np.zeros(n, dtype=np.int64)
    prev_end[1:] = end[:-1]
    gap = np.clip(start - prev_end, 0, None)
    cat = _classify(start - prev_end, prev_end, launch)
    s_idx = np.searchsorted(streams, stream[follows])
    key = s_idx * len(CATEGORIES) + cat[follows]
    size = len(streams) * len(CATEGORIES)
    idle = np.bincount(key, weights=gap[follows].astype(np.float64), minlength=size).astype(np.int64)
    count = np.bincount(key, minlength=size).astype(np.int64)
    total = idle.reshape(-1, len(CATEGORIES)).sum(axis=1).repeat(len(CATEGORIES)).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(total > 0, idle / np.where(total > 0, total, 1.0), np.nan)
    return pd.DataFrame(
        {
            "stream": streams.repeat(len(CATEGORIES)),
            "idle_category": np.tile(np.array(CATEGORIES, dtype=object), len(streams)),
            "idle_ns": idle,
            "n_gaps": count,
            "idle_ratio": ratio,
        }
    )


def device_gaps(dev: pd.DataFrame) -> DeviceGaps:
    """The gaps of the union of every stream's device events, each classified by the event ending it (module doc)."""
    start = dev["start_ns"].to_numpy(np.int64)
    end = dev["end_ns"].to_numpy(np.int64)
    launch = dev["launch_ns"].to_numpy(np.int64)
    keep = end > start  # zero-length events occupy nothing (as in the interval union of idle_pct)
    start, end, launch = start[keep], end[keep], launch[keep]
    empty = np.zeros(0, dtype=np.int64)
    if len(start) == 0:
        return DeviceGaps(empty, empty, np.zeros(0, dtype=np.int8), 0)
    order = np.lexsort((launch, start))
    start, end, launch = start[order], end[order], launch[order]
    run_end = np.maximum.accumulate(end)
    is_gap = start[1:] > run_end[:-1]
    g0, g1, lnch = run_end[:-1][is_gap], start[1:][is_gap], launch[1:][is_gap]
    return DeviceGaps(g0, g1, _classify(g1 - g0, g0, lnch), int(run_end[-1] - start[0]))


def launch_stats(events: pd.DataFrame, steps: pd.DataFrame, calls: tuple[str, ...] = LAUNCH_CALLS) -> pd.DataFrame:
    """Kernel launch statistics (HTA's ``get_cuda_kernel_launch_stats``; module doc), one row per pair.

    Columns ``correlation``, ``cpu_duration_ns``, ``gpu_duration_ns``,
    ``launch_delay_ns``. The pairs are HTA's: every host event carrying the
    correlation id of a ``calls`` event, joined with every device event of
    HTA's window carrying it; host events after the end of the last
    ProfilerStep are out of that window (with two or more steps).
    ``calls=HTA_LAUNCH_CALLS`` gives HTA's exact set.
    """
    return _launch_stats(_Columns.of(events, steps), steps, calls)


def _launch_stats(c: _Columns, steps: pd.DataFrame, calls: tuple[str, ...]) -> pd.DataFrame:
    linked = c.corr >= 0  # only rows with a correlation id take part: the sets below are built over those
    host = linked & ~c.device & (c.stream == -1)
    if len(steps) >= 2:
        host &= c.start <= int(steps["end_ns"].max())
    wanted = np.unique(c.corr[host & _named(c.name, calls)])
    rows = np.flatnonzero(linked & (host | c.window))
    has = np.zeros(len(c.corr), dtype=bool)
    has[rows[np.isin(c.corr[rows], wanted)]] = True
    dev_sel = c.window & has
    host_sel = host & has
    # HTA's inner merge on the correlation id (every host row with every device row of the id), by sorted ids.
    h = np.flatnonzero(host_sel)
    h = h[np.argsort(c.corr[h], kind="stable")]
    d = np.flatnonzero(dev_sel)
    lo = np.searchsorted(c.corr[h], c.corr[d], side="left")
    n = np.searchsorted(c.corr[h], c.corr[d], side="right") - lo
    d_rows = np.repeat(d, n)
    offsets = np.arange(len(d_rows)) - np.repeat(np.cumsum(n) - n, n)
    h_rows = h[np.repeat(lo, n) + offsets]
    cpu_end, gpu_start = c.end[h_rows], c.start[d_rows]
    return pd.DataFrame(
        {
            "correlation": c.corr[d_rows],
            "cpu_duration_ns": cpu_end - c.start[h_rows],
            "gpu_duration_ns": c.end[d_rows] - gpu_start,
            "launch_delay_ns": np.clip(gpu_start - cpu_end, 0, None),
        }
    )


@dataclass(frozen=True)
class LaunchSummary:
    """One rank's launch statistics (:func:`launch_stats`) condensed; times in us, None without launches.

    ``short_share``: share of launches that are HTA's short kernels (GPU
    duration under the launch call's, the call at most RUNTIME_CUTOFF_NS);
    ``n_runtime_outliers`` / ``n_delay_outliers``: calls over
    RUNTIME_CUTOFF_NS, delays over LAUNCH_DELAY_CUTOFF_NS;
    ``cpu_launch_ms``: summed launch-call time.
    """

    n_launches: int = 0
    cpu_duration_us_p50: float | None = None
    cpu_duration_us_p95: float | None = None
    cpu_duration_us_mean: float | None = None
    gpu_duration_us_p50: float | None = None
    gpu_duration_us_mean: float | None = None
    launch_delay_us_p50: float | None = None
    launch_delay_us_p95: float | None = None
    launch_delay_us_max: float | None = None
    short_share: float | None = None
    n_short: int = 0
    n_runtime_outliers: int = 0
    n_delay_outliers: int = 0
    cpu_launch_ms: float = 0.0

    @classmethod
    def of(cls, stats: pd.DataFrame) -> "LaunchSummary":
        if stats.empty:
            return cls()
        cpu = stats["cpu_duration_ns"].to_numpy(np.float64)
        gpu = stats["gpu_duration_ns"].to_numpy(np.float64)
        delay = stats["launch_delay_ns"].to_numpy(np.float64)
        short = (cpu <= RUNTIME_CUTOFF_NS) & (gpu < cpu)
        c50, c95, g50, d50, d95 = (
            float(v) / 1e3 for v in (*np.percentile(cpu, [50, 95]), np.median(gpu), *np.percentile(delay, [50, 95]))
        )
        return cls(
            n_launches=len(stats),
            cpu_duration_us_p50=c50,
            cpu_duration_us_p95=c95,
            cpu_duration_us_mean=float(cpu.mean()) / 1e3,
            gpu_duration_us_p50=g50,
            gpu_duration_us_mean=float(gpu.mean()) / 1e3,
            launch_delay_us_p50=d50,
            launch_delay_us_p95=d95,
            launch_delay_us_max=float(delay.max()) / 1e3,
            short_share=float(short.mean()),
            n_short=int(short.sum()),
            n_runtime_outliers=int((cpu > RUNTIME_CUTOFF_NS).sum()),
            n_delay_outliers=int((delay > LAUNCH_DELAY_CUTOFF_NS).sum()),
            cpu_launch_ms=float(cpu.sum()) / 1e6,
        )


def _windows(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    if steps.empty:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    return union(steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64))


def _in_windows(t: np.ndarray, w: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Boolean per instant: inside one of the disjoint sorted windows ``[start, end)``."""
    k = np.searchsorted(w[0], t, side="right") - 1
    return (k >= 0) & (t < w[1][np.clip(k, 0, None)]) if len(w[0]) else np.zeros(len(t), dtype=bool)


@dataclass(frozen=True)
class SyncPoints:
    """Host syncs of one rank inside the step windows: ``n`` sync points (the outermost sync of a nest on its
    thread: ``aten::item`` around ``_local_scalar_dense`` around ``cudaStreamSynchronize`` is one), their
    ``host_ns``, and ``idle_ns``: device gaps, clipped to the windows, that contain the end of a sync call
    (each gap once)."""

    n: int = 0
    host_ns: int = 0
    idle_ns: int = 0


def host_syncs(events: pd.DataFrame, steps: pd.DataFrame, gaps: DeviceGaps) -> tuple[pd.DataFrame, SyncPoints]:
    """The host syncs starting inside the step windows, and the device idle after them (module doc).

    Returns (one row per sync name with ``calls`` and ``host_ns``, sorted by
    host time; the :class:`SyncPoints`).
    """
    return _host_syncs(_Columns.of(events, steps), _windows(steps), gaps)


def _host_syncs(c: _Columns, w: tuple[np.ndarray, np.ndarray], gaps: DeviceGaps) -> tuple[pd.DataFrame, SyncPoints]:
    sync = (is_in(c.kind, ("runtime",)) & _named(c.name, SYNC_CALLS)) | (
        is_in(c.kind, ("cpu_op",)) & _named(c.name, SYNC_OPS)
    )
    sync &= _in_windows(c.start, w)
    end = c.end[sync]
    host_ns = end - c.start[sync]
    if isinstance(c.name.dtype, pd.CategoricalDtype):  # by the codes: no strings for the other rows
        used, codes = np.unique(c.name.cat.codes.to_numpy()[sync], return_inverse=True)
        names = c.name.cat.categories[used].tolist()
    else:
        codes, uniques = pd.factorize(c.name[sync].astype(object).to_numpy())
        names = list(uniques)
    calls = np.bincount(codes, minlength=len(names)).astype(np.int64)
    per_name = np.bincount(codes, weights=host_ns.astype(np.float64), minlength=len(names)).astype(np.int64)
    label = np.array([str(n) for n in names], dtype=object)
    order = np.lexsort((label, -per_name))
    table = pd.DataFrame({"name": label[order], "calls": calls[order], "host_ns": per_name[order]})
    # Sync points: the outermost sync of a nest on its thread (aten::item > _local_scalar_dense > cudaStreamSynchronize
    # is one wait, not three). Syncs are few (tens per step): one pass over them.
    rows = np.flatnonzero(sync)
    rows = rows[np.lexsort((-c.end[rows], c.start[rows], c.tid[rows]))]
    outer = np.ones(len(rows), dtype=bool)
    open_end: dict[int, int] = {}  # per thread: the end of the outermost sync still open
    for i, (tid, s0, e0) in enumerate(zip(c.tid[rows].tolist(), c.start[rows].tolist(), c.end[rows].tolist())):
        if s0 < open_end.get(tid, s0) and e0 <= open_end[tid]:
            outer[i] = False
        else:
            open_end[tid] = max(e0, open_end.get(tid, e0))
    nest_host = (c.end[rows] - c.start[rows])[outer]
    points = SyncPoints(int(outer.sum()), int(nest_host.sum()), 0)
    if len(end) == 0 or len(gaps.start) == 0:
        return table, points
    ends = np.sort(end)
    # A gap [g0, g1] holds a sync's end when some end lies in it: count the ends up to g1 minus those before g0.
    holds = np.searchsorted(ends, gaps.end, side="right") - np.searchsorted(ends, gaps.start, side="left") > 0
    tl = sweep([(gaps.start[holds], gaps.end[holds]), w])
    return table, SyncPoints(points.n, points.host_ns, tl.total(tl.mask == 3))


@dataclass(frozen=True)
class PageableCopies:
    """Pageable host-to-device copies inside the step windows: ``n``, ``time_ns`` (their union, clipped to the
    windows), ``exposed_ns`` (of that, when no compute or communication kernel runs)."""

    n: int = 0
    time_ns: int = 0
    exposed_ns: int = 0


def pageable_copies(events: pd.DataFrame, steps: pd.DataFrame) -> PageableCopies:
    """:class:`PageableCopies` of one rank (module doc)."""
    return _pageable_copies(_Columns.of(events, steps), _windows(steps))


def _pageable_copies(c: _Columns, w: tuple[np.ndarray, np.ndarray]) -> PageableCopies:
    copy = is_in(c.kind, ("memcpy",))
    if not copy.any() or len(w[0]) == 0:
        return PageableCopies()
    copy &= text_mask(c.name, _is_pageable_htod)
    if not copy.any():
        return PageableCopies()
    kernels = is_in(c.kind, ("compute", "comm"))
    tl = sweep([union(c.start[copy], c.end[copy]), union(c.start[kernels], c.end[kernels]), w])
    inside = (tl.mask & 1 != 0) & (tl.mask & 4 != 0)
    return PageableCopies(
        n=int(_in_windows(c.start[copy], w).sum()),
        time_ns=tl.total(inside),
        exposed_ns=tl.total(inside & (tl.mask & 2 == 0)),
    )


STREAM_COLUMNS = ("stream", "idle_category", "idle_ns", "n_gaps", "idle_ratio")
SYNC_COLUMNS = ("name", "calls", "host_ns")


@dataclass
class IdleTables:
    """One rank's idle figures (the RankPart entry; small): ``streams`` (:func:`stream_idle`), ``device``
    (:class:`DeviceGaps` totals: ``host_wait_ns``, ``kernel_wait_ns``, ``other_ns``, ``idle_ns``, ``span_ns``,
    ``n_gaps``), ``launch``, ``syncs`` (per name) and ``sync_points``, ``pageable``, and the windows they are counted in
    (``n_steps``, ``step_ns``: summed ProfilerStep windows)."""

    streams: pd.DataFrame
    device: dict[str, int]
    launch: LaunchSummary
    syncs: pd.DataFrame
    sync_points: SyncPoints = field(default_factory=SyncPoints)
    pageable: PageableCopies = field(default_factory=PageableCopies)
    n_steps: int = 0
    step_ns: int = 0


_NO_DEVICE = {**{f"{k}_ns": 0 for k in CATEGORIES}, "idle_ns": 0, "span_ns": 0, "n_gaps": 0}


def rank_idle(events: pd.DataFrame, steps: pd.DataFrame) -> IdleTables:
    """Every idle figure of one rank from its events and (checked) step windows."""
    c = _Columns.of(events, steps)
    w = _windows(steps)
    if not c.device.any():  # a CPU-only trace: no device to be idle (its figures are the empty ones)
        return IdleTables(
            streams=stream_idle(_window_device(c)),
            device=dict(_NO_DEVICE),
            launch=LaunchSummary(),
            syncs=pd.DataFrame(
                {
                    "name": pd.Series(dtype=object),
                    "calls": pd.Series(dtype=np.int64),
                    "host_ns": pd.Series(dtype=np.int64),
                }
            ),
            n_steps=len(steps),
            step_ns=int((w[1] - w[0]).sum()),
        )
    dev = _window_device(c)
    gaps = device_gaps(dev)
    device = {f"{k}_ns": gaps.idle_ns(k) for k in CATEGORIES}
    device.update(idle_ns=gaps.idle_ns(), span_ns=gaps.span_ns, n_gaps=len(gaps.start))
    syncs, points = _host_syncs(c, w, gaps)
    return IdleTables(
        streams=stream_idle(dev),
        device=device,
        launch=LaunchSummary.of(_launch_stats(c, steps, LAUNCH_CALLS)),
        syncs=syncs,
        sync_points=points,
        pageable=_pageable_copies(c, w),
        n_steps=len(steps),
        step_ns=int((w[1] - w[0]).sum()),
    )


# ---------------------------------------------------------------------------
# The run's tables (the reduce)


@dataclass
class RunIdle:
    """Every rank's idle figures (docs/metrics.md, "Why the GPU is idle").

    ``ranks``: one row per rank: ``span_ms``, ``idle_ms`` and per cause
    ``<cause>_ms`` and ``<cause>_pct`` (of the idle time), ``idle_pct`` (of
    the span); the launch statistics (:class:`LaunchSummary`'s fields);
    ``n_steps``, ``step_ms``, ``syncs_per_step`` (sync points),
    ``sync_host_ms`` and ``sync_idle_ms`` (:class:`SyncPoints`); ``pageable_htod_per_step``, ``pageable_htod_ms``,
    ``pageable_htod_exposed_ms``. ``streams``: :func:`stream_idle`'s rows
    with ``rank`` first, times in ms and ``idle_pct`` (of the stream's idle).
    ``syncs``: ``rank, name, calls, host_ms`` inside the step windows.
    """

    ranks: pd.DataFrame
    streams: pd.DataFrame
    syncs: pd.DataFrame

    def to_json(self) -> dict[str, Any]:
        """The report's ``idle`` block."""
        return {
            "schema": SCHEMA,
            "ranks": self.ranks.to_dict("records"),
            "streams": self.streams.to_dict("records"),
            "syncs": self.syncs.to_dict("records"),
        }


RANK_COLUMNS = (
    "rank",
    "span_ms",
    "idle_ms",
    "idle_pct",
    *(f"{c}_ms" for c in CATEGORIES),
    *(f"{c}_pct" for c in CATEGORIES),
    *LaunchSummary.__dataclass_fields__,
    "n_steps",
    "step_ms",
    "syncs_per_step",
    "sync_host_ms",
    "sync_idle_ms",
    "pageable_htod_per_step",
    "pageable_htod_ms",
    "pageable_htod_exposed_ms",
)


def _rank_row(rank: int, t: IdleTables) -> dict[str, Any]:
    d = t.device
    idle = d.get("idle_ns", 0)
    row: dict[str, Any] = {
        "rank": rank,
        "span_ms": d.get("span_ns", 0) / 1e6,
        "idle_ms": idle / 1e6,
        "idle_pct": 100.0 * idle / d["span_ns"] if d.get("span_ns") else None,
    }
    for c in CATEGORIES:
        row[f"{c}_ms"] = d.get(f"{c}_ns", 0) / 1e6
    for c in CATEGORIES:
        row[f"{c}_pct"] = 100.0 * d.get(f"{c}_ns", 0) / idle if idle else None
    row.update(t.launch.__dict__)
    sp = t.sync_points
    row.update(
        n_steps=t.n_steps,
        step_ms=t.step_ns / 1e6,
        syncs_per_step=sp.n / t.n_steps if t.n_steps else None,
        sync_host_ms=sp.host_ns / 1e6,
        sync_idle_ms=sp.idle_ns / 1e6,
        pageable_htod_per_step=t.pageable.n / t.n_steps if t.n_steps else None,
        pageable_htod_ms=t.pageable.time_ns / 1e6,
        pageable_htod_exposed_ms=t.pageable.exposed_ns / 1e6,
    )
    return row


def run_idle(parts: dict[int, IdleTables | None]) -> RunIdle:
    """Every rank's figures with a ``rank`` column (ranks without figures are left out)."""
    have = {r: t for r, t in sorted(parts.items()) if t is not None}
    ranks = pd.DataFrame([_rank_row(r, t) for r, t in have.items()], columns=list(RANK_COLUMNS))
    streams = [t.streams.assign(rank=r) for r, t in have.items() if len(t.streams)]
    s = pd.concat(streams, ignore_index=True) if streams else empty_frame(("rank", *STREAM_COLUMNS))
    s = pd.DataFrame(
        {
            "rank": s["rank"],
            "stream": s["stream"],
            "idle_category": s["idle_category"],
            "idle_ms": pd.to_numeric(s["idle_ns"]) / 1e6,
            "n_gaps": s["n_gaps"],
            "idle_pct": 100.0 * pd.to_numeric(s["idle_ratio"]),
        }
    )
    syncs = [t.syncs.assign(rank=r) for r, t in have.items() if len(t.syncs)]
    y = pd.concat(syncs, ignore_index=True) if syncs else empty_frame(("rank", *SYNC_COLUMNS))
    y = pd.DataFrame(
        {"rank": y["rank"], "name": y["name"], "calls": y["calls"], "host_ms": pd.to_numeric(y["host_ns"]) / 1e6}
    )
    return RunIdle(ranks=ranks, streams=s, syncs=y)
