"""Communication/compute overlap and idle time, the way HTA defines them.

Two overlap figures, side by side (docs/metrics.md, "Overlap"):

* ``comm_comp_overlap_pct`` (HTA's definition, ``get_comm_comp_overlap``):
  ``100 * |C ∩ M| / |M|``, the share of communication time during which some
  compute kernel also runs, over all device events of HTA's window.
* ``exposed_comm_pct``: ``100 * sum(exposed_comm) / sum(step_time)`` over
  the ProfilerStep windows, the share of step time in which communication
  runs and nothing hides it (see :mod:`analyzer.metrics.breakdown`).

``idle_pct`` follows HTA's ``get_temporal_breakdown``: over the span from
the first device event's start to the last one's end (HTA's "kernel
time"), the share in which no device event runs at all.

HTA's window, read from ``hta/common/trace.py``
(``_filter_irrelevant_gpu_kernels`` with ``include_last_profiler_step=True``):
when a rank has two or more ProfilerStep markers, a device event is kept
iff some host event with the same correlation id (its launch, e.g.
``cudaLaunchKernel``) starts no later than the end of the last
ProfilerStep; with fewer markers every device event is kept.

Deliberate differences from HTA, each measured on the shared sample traces
and explained in docs/metrics.md: communication kernels are any name
containing nccl/rccl (HTA: ``^nccl`` or ``ncclKernel``, plus ``^hip``);
compute is every other kernel (HTA also drops names matching ``Memcpy``,
``Sync`` and a few vendor patterns); times stay in exact nanoseconds (HTA
rounds start up and end down to whole microseconds); and ``cuda_sync``
events are not device activity (HTA counts a ``Stream Sync`` with a stream
id as a kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzer.metrics.intervals import sweep, union
from analyzer.metrics.memo import per_table
from analyzer.metrics.text import is_in
from analyzer.ingest.tables import DEVICE_KINDS


@dataclass(frozen=True)
class OverlapResult:
    """Whole-window totals of one rank (ns) and the derived percentages.

    Percentages are None when undefined: no communication (overlap) or no
    device events (idle).
    """

    comm_ns: int
    comm_overlapped_ns: int
    compute_ns: int
    busy_ns: int
    span_ns: int
    n_device_events: int

    @property
    def comm_comp_overlap_pct(self) -> float | None:
        return 100.0 * self.comm_overlapped_ns / self.comm_ns if self.comm_ns > 0 else None

    @property
    def idle_pct(self) -> float | None:
        return 100.0 * (self.span_ns - self.busy_ns) / self.span_ns if self.span_ns > 0 else None

    @property
    def compute_pct(self) -> float | None:
        """HTA's ``compute_time_pctg``: union of compute over the span."""
        return 100.0 * self.compute_ns / self.span_ns if self.span_ns > 0 else None

    @property
    def non_compute_pct(self) -> float | None:
        """HTA's ``non_compute_time_pctg``: busy without compute (communication, memcpy) over the span."""
        return 100.0 * (self.busy_ns - self.compute_ns) / self.span_ns if self.span_ns > 0 else None


def hta_window(events: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """Boolean row mask: device events inside HTA's analysis window (see module doc).

    Read-only: the overlap, the top kernels, the attribution and the idle causes of a rank
    all ask for the same window, which is computed once per events table and window end
    (analyzer.metrics.memo; about 8 ms per ask on a 50 MB trace)."""
    last_end_ns = int(steps["end_ns"].max()) if len(steps) >= 2 else None
    masks = _window_masks(events)
    if last_end_ns not in masks:
        mask = _hta_window(events, last_end_ns)
        mask.setflags(write=False)
        masks[last_end_ns] = mask
    return masks[last_end_ns]


@per_table
def _window_masks(events: pd.DataFrame) -> dict[int | None, np.ndarray]:
    return {}


def _hta_window(events: pd.DataFrame, last_end_ns: int | None) -> np.ndarray:
    device = is_in(events["kind"], DEVICE_KINDS)
    if last_end_ns is None:
        return device
    corr = events["correlation"].to_numpy(np.int64)
    launched = ~device & (corr >= 0) & (events["start_ns"].to_numpy(np.int64) <= last_end_ns)
    return device & np.isin(corr, np.unique(corr[launched]))


def overlap(events: pd.DataFrame, steps: pd.DataFrame) -> OverlapResult:
    """HTA-style overlap and idle totals of one rank over :func:`hta_window`."""
    sel = events.loc[hta_window(events, steps), ["kind", "start_ns", "end_ns"]]
    kind = sel["kind"]
    start = sel["start_ns"].to_numpy(np.int64)
    end = sel["end_ns"].to_numpy(np.int64)
    is_compute = (kind == "compute").to_numpy()
    is_comm = (kind == "comm").to_numpy()
    tl = sweep([union(start[is_compute], end[is_compute]), union(start[is_comm], end[is_comm]), union(start, end)])
    compute, comm, busy = (tl.mask & 1) != 0, (tl.mask & 2) != 0, (tl.mask & 4) != 0
    span = int(end.max() - start.min()) if len(sel) else 0
    return OverlapResult(
        comm_ns=tl.total(comm),
        comm_overlapped_ns=tl.total(comm & compute),
        compute_ns=tl.total(compute),
        busy_ns=tl.total(busy),
        span_ns=span,
        n_device_events=len(sel),
    )


def exposed_comm_pct(step_table: pd.DataFrame) -> float | None:
    """``100 * sum(exposed_comm_ms) / sum(step_time_ms)`` over a rank's steps; None without steps."""
    if step_table.empty:
        return None
    total = float(step_table["step_time_ms"].sum())
    return 100.0 * float(step_table["exposed_comm_ms"].sum()) / total if total > 0 else None


SPAN_PARTS = ("computation", "exposed_comm", "exposed_memcpy", "idle")


def span_breakdown(events: pd.DataFrame, memset_as: str = "memcpy", launched_only: bool = False) -> dict[str, float]:
    """:func:`span_parts_ns` in percent of the span (the parts sum to 100); empty dict without device events."""
    parts, span = span_parts_ns(events, memset_as, launched_only)
    return {k: 100.0 * v / span for k, v in parts.items()} if span > 0 else {}


def span_parts_ns(
    events: pd.DataFrame, memset_as: str = "memcpy", launched_only: bool = False
) -> tuple[dict[str, int], int]:
    """Breakdown of one rank over its whole device span, in ns, and the span (TraceLens's window).

    TraceLens's ``gpu_timeline.csv`` (``GPUEventAnalyser.compute_metrics``):
    over ``[first device event start, last device event end]``, with ``C``
    the union of compute kernels, ``M`` of communication kernels and ``Y`` of
    copies: ``computation = |C|``, ``exposed_comm = |M \\ C|``,
    ``exposed_memcpy = |Y \\ (C u M)|``, ``idle = span - |C u M u Y|``; they
    sum to 100. ``memset_as`` says where memsets go: ``"memcpy"`` (this
    project's breakdown, with the copies) or ``"compute"`` (TraceLens puts
    ``gpu_memset`` events with the computation kernels). ``launched_only``
    keeps only device events whose launch call is in the trace (TraceLens
    keeps only kernels linked into its call tree; a trace cut at the start
    has kernels whose launch fell before the cut). ``({}, 0)`` without
    device events.
    """
    if launched_only:
        from analyzer.metrics.launch import launches

        device_rows = is_in(events["kind"], DEVICE_KINDS)
        events = events.loc[~device_rows | events.index.isin(launches(events).index)]
    kind = events["kind"].astype(object).to_numpy()
    start = events["start_ns"].to_numpy(np.int64)
    end = events["end_ns"].to_numpy(np.int64)
    compute = (kind == "compute") | ((kind == "memset") if memset_as == "compute" else False)
    copies = (kind == "memcpy") | ((kind == "memset") if memset_as != "compute" else False)
    comm = kind == "comm"
    device = compute | copies | comm
    if not device.any():
        return {}, 0
    tl = sweep([union(start[compute], end[compute]), union(start[comm], end[comm]), union(start[copies], end[copies])])
    c, m, y = (tl.mask & 1) != 0, (tl.mask & 2) != 0, (tl.mask & 4) != 0
    span = int(end[device].max() - start[device].min())
    busy = tl.total(c | m | y)
    parts = {
        "computation": tl.total(c),
        "exposed_comm": tl.total(m & ~c),
        "exposed_memcpy": tl.total(y & ~c & ~m),
        "idle": span - busy,
    }
    return parts, span


def kernel_utilization(events: pd.DataFrame, win_start_ns: np.ndarray, win_end_ns: np.ndarray) -> dict[int, np.ndarray]:
    """Per device (pid): share (0..1) of each window ``[start, end)`` in which some kernel runs.

    The TensorBoard profiler plugin's "GPU Utilization" (its
    ``gpu_metrics_parser``): kernels only (compute and communication; copies
    and memsets are not kernels there), merged across streams, per device.
    """
    kind = events["kind"].astype(object).to_numpy()
    sel = events.loc[(kind == "compute") | (kind == "comm"), ["pid", "start_ns", "end_ns"]]
    starts = np.asarray(win_start_ns, dtype=np.int64)
    ends = np.asarray(win_end_ns, dtype=np.int64)
    out = {}
    for pid, g in sel.groupby("pid"):
        tl = sweep([union(g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))])
        busy = tl.length_in(tl.mask != 0, starts, ends)
        out[int(pid)] = busy / np.maximum(ends - starts, 1)
    return out
