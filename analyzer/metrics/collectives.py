"""Collectives of one rank's trace: size, achieved bandwidth, alpha-beta fit, diagnosis.

Definitions (docs/suggestions.md, "Communication from the trace alone"):

- one row per communication kernel (``kind == "comm"``): its kind from the
  one taxonomy (:func:`analyzer.metrics.taxonomy.collective_kinds`), the
  message from the kernel's own ``In msg nelems`` / ``dtype`` / ``Group
  size`` args (PyTorch >= 2.3) or else those of the host
  ``record_param_comms`` op that launched it (by correlation id);
- ``size_bytes`` is nccl-tests' S: the input bytes, and for all_gather the
  output bytes (input times n), as nccl-tests' ``AllGatherGetBw`` counts;
- ``algbw_gbps = size_bytes / duration`` (GB/s, 1e9 bytes/s) and
  ``busbw_gbps = algbw * factor`` with nccl-tests' factors (PERFORMANCE.md):
  all_reduce ``2(n-1)/n``; all_gather, reduce_scatter, all_to_all
  ``(n-1)/n``; broadcast, reduce, send/recv ``1``. The kernel duration on
  one rank includes any time it waited inside the kernel for its peers, so
  busbw is a lower bound of the link's rate;
- alpha-beta per kind: least squares of ``duration = alpha + size / beta``
  over that kind's collectives (needs two or more distinct sizes);
- diagnosis over the collectives with a known size, by their time share.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analyzer.metrics.text import text_map
from analyzer.metrics.dtypes import MESSAGE_DTYPE_BYTES
from analyzer.metrics.stragglers import busbw_factor

COLUMNS = (
    "kind",
    "start_ns",
    "duration_ns",
    "size_bytes",
    "group_size",
    "dtype",
    "algbw_gbps",
    "busbw_gbps",
    "protocol",
)

# NCCL's protocol in the kernel name (``ncclKernel_AllReduce_RING_LL_Sum_float``,
# ``ncclDevKernel_AllGather_RING_LL128``): NCCL's tuner picks LL only for small
# messages (tens to hundreds of KiB; src/graph/tuning.cc), so LL names a small
# message where the trace carries no size.
_PROTOCOL_RE = re.compile(r"_(LL128|LL|SIMPLE)(?:_|\(|$)", re.I)
# A collective is "waiting" when it runs this many times its kind's (and
# size's) median duration: equal work takes equal time unless a peer is late.
WAIT_FACTOR = 10.0

# A collective is "small" below this size: NCCL's LL/LL128 protocols and a
# ring's per-step latency dominate there (nccl-tests curves flatten near
# peak only from a few MB on every fabric in the hardware table).
SMALL_BYTES = 1 << 20
# Large collectives are "near peak" from this fraction of the link's busbw,
# "far below" under FAR_BELOW; the spread is (p90 - p10) / median of their busbw.
NEAR_PEAK = 0.5
FAR_BELOW = 0.2
WIDE_SPREAD = 1.0


def collective_table(events: pd.DataFrame) -> pd.DataFrame:
    """One row per communication kernel of one rank; columns :data:`COLUMNS` (see the module docstring)."""
    from analyzer.metrics.launch import launching_op
    from analyzer.metrics.taxonomy import collective_kinds

    comm = events.loc[(events["kind"] == "comm").to_numpy()]
    if comm.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in COLUMNS})
    kinds = collective_kinds(events).reindex(comm.index).to_numpy(object)
    nelems = comm["msg_in_nelems"].to_numpy(np.int64).copy()
    out_nelems = comm["msg_out_nelems"].to_numpy(np.int64).copy()
    group = comm["group_size"].to_numpy(np.int64).copy()
    dtype = np.array(comm["msg_dtype"].astype(object).to_numpy(), dtype=object)  # a copy: filled below
    # Older PyTorch writes the message only on record_param_comms: take it from the launching host op.
    host = events.loc[(events["kind"] == "cpu_comm").to_numpy() & (events["msg_in_nelems"].to_numpy() >= 0)]
    missing = nelems < 0
    if missing.any() and not host.empty:
        host = host.reset_index(drop=True)
        pos = launching_op(events, comm.index[missing], host[["pid", "tid", "start_ns", "end_ns"]])
        ok = pos >= 0
        idx = np.flatnonzero(missing)[ok]
        src = host.iloc[pos[ok]]
        nelems[idx] = src["msg_in_nelems"].to_numpy(np.int64)
        out_nelems[idx] = src["msg_out_nelems"].to_numpy(np.int64)
        group[idx] = src["group_size"].to_numpy(np.int64)
        dtype[idx] = src["msg_dtype"].astype(object).to_numpy()
    elem = text_map(pd.Series(dtype), lambda d: MESSAGE_DTYPE_BYTES.get(d, np.nan), np.nan).astype(np.float64)
    n = group.astype(np.float64)
    size = np.where(nelems >= 0, nelems * elem, np.nan)
    # nccl-tests' S for all_gather is the gathered (output) size.
    gathered = np.where(out_nelems >= 0, out_nelems * elem, size * n)
    size = np.where(kinds == "all_gather", gathered, size)
    duration = (comm["end_ns"] - comm["start_ns"]).to_numpy(np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(duration > 0, size / duration, np.nan)  # bytes/ns == GB/s
    factor = np.array([busbw_factor(str(k), int(m)) for k, m in zip(kinds, group)], dtype=np.float64)
    return (
        pd.DataFrame(
            {
                "kind": kinds,
                "start_ns": comm["start_ns"].to_numpy(np.int64),
                "duration_ns": duration,
                "size_bytes": size,
                "group_size": group,
                "dtype": dtype,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * factor,
                "protocol": [protocol_of(str(n)) for n in comm["name"].astype(object)],
            }
        )
        .sort_values("start_ns", kind="stable")
        .reset_index(drop=True)
    )


def protocol_of(kernel_name: str) -> str | None:
    """``LL``, ``LL128`` or ``SIMPLE`` from an NCCL/RCCL kernel name; None when the name does not say."""
    m = _PROTOCOL_RE.search(kernel_name)
    return m.group(1).upper() if m else None


@dataclass(frozen=True)
class AlphaBeta:
    """``duration = alpha + size / beta`` for one kind: alpha in us, beta in GB/s, over ``count`` collectives."""

    kind: str
    alpha_us: float
    beta_gbps: float
    count: int
    r2: float


def alpha_beta(table: pd.DataFrame) -> dict[str, AlphaBeta]:
    """Least-squares alpha-beta per kind over collectives with a known size; kinds with fewer than two distinct sizes, or a non-positive slope, are left out."""
    out: dict[str, AlphaBeta] = {}
    known = table.loc[np.isfinite(table["size_bytes"].to_numpy(np.float64))]
    for kind, rows in known.groupby("kind", sort=True):
        x = rows["size_bytes"].to_numpy(np.float64)
        y = rows["duration_ns"].to_numpy(np.float64)
        if np.unique(x).size < 2:
            continue
        slope, intercept = np.polyfit(x, y, 1)
        if slope <= 0:
            continue
        pred = intercept + slope * x
        ss_tot = float(((y - y.mean()) ** 2).sum())
        r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
        out[str(kind)] = AlphaBeta(str(kind), intercept / 1e3, 1.0 / slope, len(rows), r2)
    return out


@dataclass(frozen=True)
class CommDiagnosis:
    """``verdict``: latency_bound, bandwidth_bound, waiting or mixed; ``evidence`` holds the figures it rests on."""

    verdict: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


def diagnose(table: pd.DataFrame, link_gbps: float | None) -> CommDiagnosis | None:
    """Latency-bound, bandwidth-bound or waiting, by where the collectives' time goes.

    - latency_bound: over half the communication time is in collectives
      under :data:`SMALL_BYTES` (bucket size, fewer collectives);
    - with the large ones' median busbw against the link peak: at least
      :data:`NEAR_PEAK` of it is bandwidth_bound (overlap, compression,
      another sharding); under :data:`FAR_BELOW` with a spread of at least
      :data:`WIDE_SPREAD` is waiting (a slower peer or a sync point: one
      rank's kernel time holds the wait; profile all ranks to tell);
    - otherwise mixed. None without a collective of known size; with no
      link peak only the latency test can decide.
    """
    known = table.loc[np.isfinite(table["size_bytes"].to_numpy(np.float64)) & (table["duration_ns"].to_numpy() > 0)]
    if known.empty:
        return diagnose_unsized(table)
    dur = known["duration_ns"].to_numpy(np.float64)
    small = known["size_bytes"].to_numpy(np.float64) < SMALL_BYTES
    total = float(dur.sum())
    small_share = float(dur[small].sum()) / total
    ev: dict[str, Any] = {
        "collectives": int(len(known)),
        "comm_ms": total / 1e6,
        "small_time_share": small_share,
        "small_count": int(small.sum()),
        "link_gbps": link_gbps,
    }
    if small_share > 0.5:
        return CommDiagnosis(
            "latency_bound",
            f"{small_share:.0%} of collective time is in {int(small.sum())} messages under {SMALL_BYTES >> 20} MiB",
            ev,
        )
    busbw = known.loc[~small, "busbw_gbps"].to_numpy(np.float64)
    busbw = busbw[np.isfinite(busbw)]
    if busbw.size == 0 or not link_gbps:
        return CommDiagnosis(
            "mixed", "large collectives cannot be rated: no bus bandwidth or no link peak for this device", ev
        )
    med = float(np.median(busbw))
    spread = float((np.percentile(busbw, 90) - np.percentile(busbw, 10)) / med) if med > 0 else float("inf")
    large_dur = dur[~small]
    ev.update(
        large_count=int((~small).sum()),
        large_size_median_bytes=float(np.median(known["size_bytes"].to_numpy(np.float64)[~small])),
        large_duration_p10_us=float(np.percentile(large_dur, 10)) / 1e3,
        large_duration_p90_us=float(np.percentile(large_dur, 90)) / 1e3,
        large_busbw_median_gbps=med,
        large_busbw_spread=spread,
        fraction_of_peak=med / link_gbps,
    )
    if med >= NEAR_PEAK * link_gbps:
        return CommDiagnosis(
            "bandwidth_bound", f"large collectives reach {med / link_gbps:.0%} of the {link_gbps:g} GB/s link", ev
        )
    if med < FAR_BELOW * link_gbps and spread >= WIDE_SPREAD:
        return CommDiagnosis(
            "waiting",
            f"large collectives reach only {med / link_gbps:.0%} of the {link_gbps:g} GB/s link with a spread of {spread:.1f}x: "
            "a slower peer or a sync point, not the network; profile all ranks to tell",
            ev,
        )
    return CommDiagnosis("mixed", f"large collectives at {med / link_gbps:.0%} of the link, spread {spread:.1f}x", ev)


def diagnose_unsized(table: pd.DataFrame) -> CommDiagnosis | None:
    """The diagnosis when no collective carries its message size (traces before PyTorch 2.x's comm args).

    Per kind, a collective longer than :data:`WAIT_FACTOR` times the kind's
    median duration counts its excess over the median as waiting (one
    rank's kernel holds the wait for its peers; without sizes, equal work
    per kind is the assumption, strongest when NCCL's protocol is the same
    small-message LL for all of them):

    - waiting: over half the communication time is that excess;
    - latency_bound: over half of it is in kernels of NCCL's LL protocol,
      which NCCL picks for small messages (many small messages: buckets);
    - otherwise mixed. None without a collective of positive duration.
    """
    rows = table.loc[table["duration_ns"].to_numpy() > 0]
    if rows.empty:
        return None
    dur = rows["duration_ns"].to_numpy(np.float64)
    median = rows.groupby("kind", sort=False)["duration_ns"].transform("median").to_numpy(np.float64)
    long_ = dur > WAIT_FACTOR * median
    total = float(dur.sum())
    wait_share = float((dur - median)[long_].sum()) / total
    proto = (
        rows["protocol"].astype(object).to_numpy() if "protocol" in rows.columns else np.full(len(rows), None, object)
    )
    ll = proto == "LL"
    ll_share = float(dur[ll].sum()) / total
    ev: dict[str, Any] = {
        "collectives": int(len(rows)),
        "comm_ms": total / 1e6,
        "sizes_known": False,
        "duration_median_us": float(np.median(dur)) / 1e3,
        "duration_p90_us": float(np.percentile(dur, 90)) / 1e3,
        "duration_max_us": float(dur.max()) / 1e3,
        "long_count": int(long_.sum()),
        "waiting_time_share": wait_share,
        "ll_protocol_time_share": ll_share,
    }
    if wait_share > 0.5:
        return CommDiagnosis(
            "waiting",
            f"{int(long_.sum())} of {len(rows)} collectives run over {WAIT_FACTOR:g}x their kind's median "
            f"({float(np.median(dur)) / 1e3:.0f} us) and that excess is {wait_share:.0%} of collective time: "
            "a slower peer or a sync point, not the transfer; profile all ranks to tell",
            ev,
        )
    if ll_share > 0.5:
        return CommDiagnosis(
            "latency_bound", f"{ll_share:.0%} of collective time is in NCCL LL-protocol kernels (small messages)", ev
        )
    return CommDiagnosis(
        "mixed", f"no message sizes; {wait_share:.0%} of collective time over {WAIT_FACTOR:g}x the median", ev
    )
