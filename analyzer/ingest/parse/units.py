"""The time unit of a trace's ``ts``/``dur``, decided from the events.

The Chrome trace format says ``ts`` is in microseconds and
``displayTimeUnit`` only a display hint; Kineto writes µs, some exporters
write integer ns and say ``"displayTimeUnit": "ns"``, and real traces exist
whose header says ``"ns"`` over µs data (and ns traces that say nothing).
So the header is a hint and the data decides when it speaks clearly.

Each piece of evidence below either names a unit or abstains; the data
decides when the pieces that speak agree, else the header does. Thresholds
sit one or more orders of magnitude away from anything a real trace of the
other unit holds (the shared traces: 10th percentile of kernels 2.0 to
7.7 µs, of host ops 0.28 to 12.6 µs), so that a trace is never flipped on
borderline numbers:

* **Range**: a median ``ts`` above 9.22e15 cannot be µs (as ns it would
  overflow int64 past the year 2262); epoch-ns exporters land here.
* **Decimals**: ns are written as integers; when at least half of 16 or
  more durations carry a fraction, the unit is coarser than ns: µs (Kineto
  writes µs with three decimals, the ns digits).
* **Kernels** (100 or more): the 10th percentile of their durations. Every
  step of GPU work has tiny kernels (fills, scalar reductions, optimizer
  steps) of a few µs: under 100 units, read as ns, would make a tenth of
  the kernels shorter than 0.1 µs, below any launch; 500 or more, read as
  µs, would make the shortest tenth all longer than 0.5 ms.
* **Host ops** (100 or more ``cpu_op`` events): the same on their 10th
  percentile: under 50 units is a tenth of the ops under 50 ns as ns (the
  shortest recorded ops take about 0.3 µs); 500 or more is the shortest
  tenth all above 0.5 ms as µs (``aten::empty``, ``aten::view`` take about 1 µs).
* **Steps**: the median ``ProfilerStep#`` duration: under 1,000 units
  would be a step shorter than 1 µs as ns; 1e9 or more a step of over
  16 minutes as µs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from analyzer.ingest.parse.classify import MAX_TIME_NS

NS, US = 1, 1000  # ns per unit

# Below these counts a percentile says little: the synthetic traces of the
# tests hold a few kernels of milliseconds each.
MIN_SHORT_EVENTS = 100
MIN_DECIMAL_SAMPLES = 16


@dataclass(frozen=True)
class UnitEvidence:
    """The raw (trace-unit) numbers the decision reads."""

    median_ts: float | None
    durations: int
    fractional_durations: int
    kernel_p10: float | None
    kernels: int
    host_op_p10: float | None
    host_ops: int
    step_median: float | None


@dataclass(frozen=True)
class UnitDecision:
    """``unit_ns``: ns per unit used; ``note``: one sentence for the file's
    warnings when the unit is ns or the data overruled the header, else None."""

    unit_ns: int
    note: str | None


def time_unit_ns(display_time_unit: Any) -> int:
    """ns per unit the header claims: 1 for ``"displayTimeUnit": "ns"``, else
    1000 (µs, the Chrome trace format's unit; Kineto's ``"ms"`` is a display hint)."""
    return NS if isinstance(display_time_unit, str) and display_time_unit.strip().lower() == "ns" else US


def gather(
    ts_parts: Sequence[np.ndarray],
    dur_parts: Sequence[np.ndarray],
    cat_parts: Sequence[np.ndarray],
    name_parts: Sequence[np.ndarray],
    kernel_cats: Sequence[int],
    host_op_cats: Sequence[int],
    step_names: Sequence[int],
) -> UnitEvidence:
    """The evidence from the parser's raw column parts (one array per block).

    Vectorised over the parts: a few passes of numpy, no per-event Python.
    """
    if not ts_parts:
        return UnitEvidence(None, 0, 0, None, 0, None, 0, None)
    ts = np.concatenate(ts_parts)
    dur = np.concatenate(dur_parts)
    cats = np.concatenate(cat_parts)
    kernel_dur = dur[np.isin(cats, kernel_cats)] if kernel_cats else dur[:0]
    host_dur = dur[np.isin(cats, host_op_cats)] if host_op_cats else dur[:0]
    step_dur = dur[np.isin(np.concatenate(name_parts), step_names)] if step_names else dur[:0]
    fractional = int(np.count_nonzero(dur != np.floor(dur))) if dur.dtype.kind == "f" else 0
    return UnitEvidence(
        median_ts=float(np.median(ts)),
        durations=len(dur),
        fractional_durations=fractional,
        kernel_p10=float(np.percentile(kernel_dur, 10)) if len(kernel_dur) else None,
        kernels=len(kernel_dur),
        host_op_p10=float(np.percentile(host_dur, 10)) if len(host_dur) else None,
        host_ops=len(host_dur),
        step_median=float(np.median(step_dur)) if len(step_dur) else None,
    )


@dataclass(frozen=True)
class Vote:
    """One piece of evidence naming a unit; ``exact``: range or decimals,
    which the magnitudes of durations cannot overrule."""

    unit_ns: int
    reason: str
    exact: bool = False


def votes(ev: UnitEvidence) -> list[Vote]:
    """A :class:`Vote` for each piece of evidence that names a unit (module docstring)."""
    out: list[Vote] = []
    if ev.median_ts is not None and ev.median_ts > MAX_TIME_NS // US:
        out.append(Vote(NS, f"the median ts {ev.median_ts:.4g} is beyond int64 ns if read as µs", exact=True))
    if ev.durations >= MIN_DECIMAL_SAMPLES and 2 * ev.fractional_durations >= ev.durations:
        share = 100 * ev.fractional_durations / ev.durations
        out.append(Vote(US, f"{share:.0f} % of durations have decimals, which integer ns never have", exact=True))
    if ev.kernel_p10 is not None and ev.kernels >= MIN_SHORT_EVENTS:
        if ev.kernel_p10 < 100:
            out.append(
                Vote(
                    US,
                    f"the shortest tenth of {ev.kernels} kernels last under {ev.kernel_p10:.4g} units, under 0.1 µs as ns",
                )
            )
        elif ev.kernel_p10 >= 500:
            out.append(
                Vote(
                    NS,
                    f"the shortest tenth of {ev.kernels} kernels last {ev.kernel_p10:.4g} units or more, over 0.5 ms each as µs",
                )
            )
    if ev.host_op_p10 is not None and ev.host_ops >= MIN_SHORT_EVENTS:
        if ev.host_op_p10 < 50:
            out.append(
                Vote(
                    US,
                    f"the shortest tenth of {ev.host_ops} host ops last under {ev.host_op_p10:.4g} units, under 50 ns as ns",
                )
            )
        elif ev.host_op_p10 >= 500:
            out.append(
                Vote(
                    NS,
                    f"the shortest tenth of {ev.host_ops} host ops last {ev.host_op_p10:.4g} units or more, over 0.5 ms each as µs",
                )
            )
    if ev.step_median is not None:
        if ev.step_median < 1000:
            out.append(Vote(US, f"the median ProfilerStep lasts {ev.step_median:.4g} units, under 1 µs as ns"))
        elif ev.step_median >= 1e9:
            out.append(Vote(NS, f"the median ProfilerStep lasts {ev.step_median:.4g} units, over 16 minutes as µs"))
    return out


def decide(display_time_unit: Any, ev: UnitEvidence) -> UnitDecision:
    """The unit to read ``ts``/``dur`` in: the data's when its evidence
    agrees (range and decimals first: they are exact), else the header's."""
    hinted = time_unit_ns(display_time_unit)
    said = votes(ev)
    pool = [v for v in said if v.exact] or said
    if len({v.unit_ns for v in pool}) == 1:
        unit, reason = pool[0].unit_ns, pool[0].reason
    else:
        unit, reason = hinted, ""
    name = {NS: "nanoseconds", US: "microseconds"}
    if unit != hinted:
        claim = (
            f'the trace says "displayTimeUnit": {display_time_unit!r}'
            if isinstance(display_time_unit, str)
            else "the trace has no displayTimeUnit"
        )
        header = "nanoseconds" if hinted == NS else "microseconds"
        return UnitDecision(unit, f"timestamps read as {name[unit]}, not {header} ({claim}), because {reason}")
    if unit == NS:
        return UnitDecision(NS, 'timestamps read as nanoseconds (the trace says "displayTimeUnit": "ns")')
    return UnitDecision(US, None)
