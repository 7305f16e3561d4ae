"""Top device kernels (or host ops on CPU-only traces) by total time, per rank.

Definitions (docs/metrics.md, "Top kernels and ops"):

* device (the rank has GPU events): events of kinds compute, comm, memcpy,
  memset inside the rank's analysis window, the one overlap and idle use
  (:func:`analyzer.metrics.overlap.hta_window`: with two or more
  ProfilerSteps, device events launched by the end of the last one),
  grouped by name; ``share_pct = 100 * total / sum of the durations of
  those device events`` (shares sum to 100; concurrent streams are counted
  once per kernel, so this is a share of kernel time, not of wall time).
  Summing every device event instead made per-step NCCL time 14 % higher
  than the window the rest of the report used (kernels launched after the
  last step, while the profiler was flushing).
* host (CPU-only traces): ``cpu_op`` and ``cpu_comm`` events grouped by
  name. Host ops nest (``aten::linear`` contains ``aten::addmm``), so
  ``total_ms`` is inclusive time and ``share_pct = 100 * total / profiled
  wall time`` (sum of the ProfilerStep windows, or the span of the host
  events without steps); host shares do not sum to 100.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.metrics.frames import empty_frame
from analyzer.metrics.overlap import hta_window
from analyzer.metrics.taxonomy import collective_kinds, row_classes
from analyzer.metrics.text import is_in
from analyzer.ingest.tables import DEVICE_KINDS

COLUMNS = ("rank", "source", "kind", "cls", "coll_kind", "name", "count", "total_ms", "mean_us", "max_us", "share_pct")
HOST_OP_KINDS = ("cpu_op", "cpu_comm")


def top_kernels(events: pd.DataFrame, steps: pd.DataFrame, rank: int, limit: int | None = 50) -> pd.DataFrame:
    """The ``limit`` names with the most total time on one rank (all when None).

    Columns: ``rank, source ("device"|"host"), kind, cls`` (kernel class of
    :mod:`analyzer.metrics.taxonomy`; None for host ops), ``coll_kind``
    (communication kernels: the collective kind carrying most of the name's
    time, host annotations first, :func:`~analyzer.metrics.taxonomy.collective_kinds`;
    else None), ``name, count,
    total_ms, mean_us, max_us, share_pct``; sorted by ``total_ms``
    descending, ties by name.
    """
    columns = ["name", "kind", "start_ns", "end_ns"]
    device = is_in(events["kind"], DEVICE_KINDS)
    if device.any():
        rows = hta_window(events, steps)
        source, sel = "device", events.loc[rows, columns]
    else:
        source, sel = "host", events.loc[is_in(events["kind"], HOST_OP_KINDS), columns]
    if sel.empty:
        return empty_frame(COLUMNS)
    dur_ns = (sel["end_ns"] - sel["start_ns"]).to_numpy(np.int64)
    # Aggregate on the categorical codes with numpy: one bincount per statistic.
    codes, names = pd.factorize(sel["name"])
    kinds = sel["kind"].to_numpy()
    classes = row_classes(events)[rows] if source == "device" else None
    coll = _dominant_collective_kind(events, sel, codes, dur_ns) if source == "device" else None
    n = len(names)
    count = np.bincount(codes, minlength=n)
    total_ns = np.bincount(codes, weights=dur_ns, minlength=n)
    max_ns = np.zeros(n, dtype=np.int64)
    np.maximum.at(max_ns, codes, dur_ns)
    first = np.unique(codes, return_index=True)[1]
    if source == "device":
        denominator_ns = float(dur_ns.sum())
    elif len(steps):
        denominator_ns = float((steps["end_ns"] - steps["start_ns"]).sum())
    else:
        denominator_ns = float(sel["end_ns"].max() - sel["start_ns"].min())
    out = pd.DataFrame(
        {
            "rank": rank,
            "source": source,
            "kind": [str(kinds[i]) for i in first],
            "cls": [classes[i] for i in first] if classes is not None else None,
            "coll_kind": pd.Series([coll.get(int(codes[i])) for i in first], dtype=object)
            if coll is not None
            else None,
            "name": [str(v) for v in names],
            "count": count.astype(np.int64),
            "total_ms": total_ns / 1e6,
            "mean_us": total_ns / count / 1e3,
            "max_us": max_ns / 1e3,
            "share_pct": 100.0 * total_ns / denominator_ns if denominator_ns > 0 else np.nan,
        }
    )
    out = out.sort_values(["total_ms", "name"], ascending=[False, True], kind="stable").reset_index(drop=True)
    return out if limit is None else out.head(limit).reset_index(drop=True)


def _dominant_collective_kind(
    events: pd.DataFrame, sel: pd.DataFrame, codes: np.ndarray, dur_ns: np.ndarray
) -> dict[int, str]:
    """Per name code of the communication kernels in ``sel``: the collective kind with most of its time."""
    comm = (sel["kind"] == "comm").to_numpy()
    if not comm.any():
        return {}
    kinds = collective_kinds(events).reindex(sel.index[comm])
    frame = pd.DataFrame({"code": codes[comm], "kind": kinds.to_numpy(object), "dur": dur_ns[comm]})
    totals = frame.groupby(["code", "kind"])["dur"].sum().reset_index()
    best = totals.sort_values(["code", "dur"], ascending=[True, False]).drop_duplicates("code")
    return dict(zip(best["code"].astype(int), best["kind"].astype(str)))
