"""Top device kernels (or host ops on CPU-only traces) by total time, per rank.

Definitions (docs/metrics.md, "Top kernels and ops"), over every event of
the rank's trace:

* device (the rank has GPU events): events of kinds compute, comm, memcpy,
  memset, grouped by name; ``share_pct = 100 * total / sum of the durations
  of all device events of the rank`` (shares sum to 100; concurrent streams
  are counted once per kernel, so this is a share of kernel time, not of
  wall time).
* host (CPU-only traces): ``cpu_op`` and ``cpu_comm`` events grouped by
  name. Host ops nest (``aten::linear`` contains ``aten::addmm``), so
  ``total_ms`` is inclusive time and ``share_pct = 100 * total / profiled
  wall time`` (sum of the ProfilerStep windows, or the span of the host
  events without steps); host shares do not sum to 100.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.tables import DEVICE_KINDS

COLUMNS = ("rank", "source", "kind", "name", "count", "total_ms", "mean_us", "max_us", "share_pct")
HOST_OP_KINDS = ("cpu_op", "cpu_comm")


def top_kernels(events: pd.DataFrame, steps: pd.DataFrame, rank: int, limit: int | None = 50) -> pd.DataFrame:
    """The ``limit`` names with the most total time on one rank (all when None).

    Columns: ``rank, source ("device"|"host"), kind, name, count, total_ms,
    mean_us, max_us, share_pct``; sorted by ``total_ms`` descending, ties by
    name.
    """
    device = events["kind"].isin(DEVICE_KINDS)
    if device.any():
        source, sel = "device", events.loc[device]
    else:
        source, sel = "host", events.loc[events["kind"].isin(HOST_OP_KINDS)]
    if sel.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
    dur_ns = (sel["end_ns"] - sel["start_ns"]).to_numpy(np.int64)
    frame = pd.DataFrame({"name": sel["name"].astype(str).to_numpy(), "kind": sel["kind"].astype(str).to_numpy(), "dur_ns": dur_ns})
    grouped = frame.groupby("name", sort=False).agg(
        kind=("kind", "first"), count=("dur_ns", "size"), total_ns=("dur_ns", "sum"), max_ns=("dur_ns", "max")
    )
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
            "kind": grouped["kind"].to_numpy(),
            "name": grouped.index.to_numpy(),
            "count": grouped["count"].to_numpy(np.int64),
            "total_ms": grouped["total_ns"].to_numpy() / 1e6,
            "mean_us": grouped["total_ns"].to_numpy() / grouped["count"].to_numpy() / 1e3,
            "max_us": grouped["max_ns"].to_numpy() / 1e3,
            "share_pct": 100.0 * grouped["total_ns"].to_numpy() / denominator_ns if denominator_ns > 0 else np.nan,
        }
    )
    out = out.sort_values(["total_ms", "name"], ascending=[False, True], kind="stable").reset_index(drop=True)
    return out if limit is None else out.head(limit).reset_index(drop=True)
