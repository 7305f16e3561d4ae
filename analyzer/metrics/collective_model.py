"""The collectives' timing model over the matched collective table (docs/metrics.md, "Collective timing model").

Input: :attr:`analyzer.api.RunAnalysis.collectives`, one row per collective
matched across ranks (:func:`analyzer.metrics.stragglers.collective_table`:
``step, kind, bytes, first_arrival_ns, skew_ms, last_rank, duration_ms``).
From it:

* :func:`collective_times`: each collective's start and end on its last
  arriver, on one aligned clock (ns);
* :func:`service_times_ms`: queue-corrected durations (a process group runs
  its collectives one after another);
* :func:`collective_tail_ms`: per step, the communication after the step's
  last collective is issued (what no compute hides);
* :func:`fit_alpha_beta`: the alpha-beta model (Hockney 1994) over service
  times and sizes, fixed cost and cost per byte;
* :func:`sync_delay_ms`: per rank, how long it holds the others up per step.

The suggestion rules read these (analyzer/verbs/suggest/facts.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

TIMES_COLUMNS: dict[str, str] = {
    "step": "int64",
    "bytes": "float64",
    "kind": "object",
    "start_ns": "float64",
    "end_ns": "float64",
}


def collective_times(collectives: pd.DataFrame) -> pd.DataFrame:
    """Per collective: ``step``, ``bytes``, ``kind`` and its start and end on the last arriver (ns), sorted by start.

    ``start_ns = first_arrival_ns + skew_ms * 1e6`` (the last arriver's
    start), ``end_ns = start_ns + duration_ms * 1e6``, both relative to the
    table's first arrival so that float64 keeps nanoseconds (epoch ns do not
    fit its mantissa). No rows on an empty table.
    """
    if collectives.empty:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in TIMES_COLUMNS.items()})
    first = collectives["first_arrival_ns"].to_numpy(np.int64)
    start = (first - first.min()).astype(np.float64) + collectives["skew_ms"].to_numpy(np.float64) * 1e6
    end = start + collectives["duration_ms"].to_numpy(np.float64) * 1e6
    out = pd.DataFrame(
        {
            "step": collectives["step"].to_numpy(np.int64),
            "bytes": collectives["bytes"].to_numpy(np.float64),
            "kind": collectives["kind"].astype(str).to_numpy(object),
            "start_ns": start,
            "end_ns": end,
        }
    )
    return out.sort_values("start_ns", kind="stable").reset_index(drop=True)


def service_times_ms(times: pd.DataFrame) -> np.ndarray:
    """Queue-corrected duration of each collective: ``end_i - max(start_i, max_{j<i} end_j)``, clipped at 0, in ms.

    A process group runs its collectives one after another (NCCL on one
    stream, gloo in issue order), so a collective issued while an earlier
    one still runs waits in the queue; its own service begins when that one
    ends. ``times``: :func:`collective_times` (sorted by start). One value
    per row, in its order.
    """
    start = times["start_ns"].to_numpy(np.float64)
    end = times["end_ns"].to_numpy(np.float64)
    if not len(end):
        return np.zeros(0, dtype=np.float64)
    prev_end = np.concatenate([[-np.inf], np.maximum.accumulate(end)[:-1]])
    service: np.ndarray = np.clip(end - np.maximum(start, prev_end), 0.0, None) / 1e6
    return service


def collective_tail_ms(times: pd.DataFrame) -> pd.Series:
    """Per step: the end of the step's last collective minus the start of its last-issued one, clipped at 0 (ms).

    Data parallelism issues its last gradient collective when backward has
    computed the last gradient; everything after that until the last
    collective ends is communication no compute hides (DDP waits for it at
    the end of backward, FSDP2 before the optimizer). ``times``:
    :func:`collective_times`. Indexed by step; empty without collectives.
    """
    g = times.groupby("step")
    return ((g["end_ns"].max() - g["start_ns"].max()).clip(lower=0) / 1e6).astype(np.float64)


def fit_alpha_beta(bytes_: np.ndarray, service_ms: np.ndarray) -> tuple[float | None, float | None]:
    """Least-squares ``service_ms = alpha_ms + bytes * per_byte_ms`` (the alpha-beta model of Hockney 1994).

    Over the finite pairs; needs two or more distinct sizes, else ``(None,
    None)``. A negative slope (sizes explain nothing) gives all fixed cost:
    ``(median service, 0)``; a negative intercept (no measurable fixed cost)
    the fit through the origin, ``(0, sum(x y) / sum(x^2))``. Unlike
    :func:`analyzer.metrics.collectives.alpha_beta` (per kind, rated as a
    bandwidth), one fit over all kinds, in ms and ms per byte.
    """
    x_all = np.asarray(bytes_, dtype=np.float64)
    y_all = np.asarray(service_ms, dtype=np.float64)
    ok = np.isfinite(x_all) & np.isfinite(y_all)
    x, y = x_all[ok], y_all[ok]
    if len(np.unique(x)) < 2:
        return None, None
    slope, intercept = np.polyfit(x, y, 1)
    if slope < 0:
        return float(np.median(y)), 0.0
    if intercept < 0:
        return 0.0, float(np.sum(x * y) / np.sum(x * x))
    return float(intercept), float(slope)


def sync_delay_ms(collectives: pd.DataFrame) -> dict[int, float]:
    """Per rank: how long it holds the others up per step, the median over steps (ms).

    Per step, the largest arrival skew (``skew_ms``) among the collectives
    the rank arrived at last, 0 in a step where it arrived last at none: a
    rank that is late by ``x`` at a gradient collective delays every other
    rank's step by ``x`` (later collectives of the step then start
    together). Steps: every step of the table. Only ranks that arrived last
    at least once are keys (``last_rank`` -1, all at once, names none).
    """
    if collectives.empty or "last_rank" not in collectives.columns:
        return {}
    steps = sorted(collectives["step"].unique())
    ranks = sorted(int(r) for r in collectives["last_rank"].unique() if r >= 0)
    out: dict[int, float] = {}
    for r in ranks:
        late = collectives.loc[collectives["last_rank"] == r].groupby("step")["skew_ms"].max()
        out[r] = float(late.reindex(steps, fill_value=0.0).median())
    return out


__all__ = [
    "TIMES_COLUMNS",
    "collective_times",
    "collective_tail_ms",
    "fit_alpha_beta",
    "service_times_ms",
    "sync_delay_ms",
]
