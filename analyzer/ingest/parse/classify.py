"""Stage 3 of reading a trace: which decoded events become rows, and what
each row needs.

Pure functions over lists of :class:`analyzer.ingest.parse.decode.Event`
(or the values picked from them); :class:`analyzer.ingest.parse.columns.Columns`
applies them block by block:

* :func:`complete_events`: complete events (``"ph": "X"``) are rows;
  metadata events (process and thread names) go aside; the rest are skipped.
* :func:`valid_times`: the rows whose ``ts``/``dur`` are valid
  (:func:`raw_times`); the others are dropped and counted.
* :func:`text_fields` and :func:`drop_trace_span`: category and name as text,
  without Kineto's own ``cat: "Trace"`` span.
* :func:`on_gpu_timeline` and :func:`wants_args`: per distinct category or
  name, whether the row has a stream and whether its args are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from operator import attrgetter
from typing import Any, Callable

import numpy as np

from analyzer.ingest.parse.decode import Event
from analyzer.ingest.schema import CPU_COMM_RE, GPU_TIMELINE_CATS, SHAPE_OPS, canonical_category

_TS, _DUR, _CAT, _NAME = (attrgetter(f) for f in ("ts", "dur", "cat", "name"))
_STR = {str}

# Largest start or duration kept, in ns: 2**62, so that start + duration
# fits int64 (292 years; epoch-based Kineto clocks are at about 1.7e18 ns).
MAX_TIME_NS = 1 << 62


def complete_events(events: list[Event], on_metadata: Callable[[Event], None]) -> list[Event]:
    """The events that can become rows: complete events (``"ph": "X"``).
    Metadata events (``"M"``: process and thread names) go to
    ``on_metadata``; instants, flows and counters are not rows."""
    xs = [e for e in events if e.ph == "X"]
    if len(xs) != len(events):
        for e in events:
            if e.ph == "M":
                on_metadata(e)
    return xs


def raw_times(values: list) -> tuple[np.ndarray, np.ndarray | None]:
    """ts or dur values as written -> (numbers, valid mask or None when all
    are valid).

    Valid: a JSON number (not a string, a bool or null), finite, >= 0 and
    at most :data:`MAX_TIME_NS` (the bound in the trace's unit is applied
    after conversion, :func:`analyzer.ingest.parse.columns.to_ns`, once the
    unit is known). The numbers are int64 when every value is an integer,
    else float64; invalid entries hold 0.
    """
    try:
        arr = np.asarray(values)
    except ValueError:  # ragged lists
        return _raw_times_exact(values)
    kind = arr.dtype.kind if arr.ndim == 1 else "O"
    if kind == "i":
        ok = (arr >= 0) & (arr <= MAX_TIME_NS)
    elif kind == "f":
        with np.errstate(invalid="ignore"):  # NaN compares False: invalid, no warning
            ok = (arr >= 0) & (arr <= MAX_TIME_NS)
    else:  # text, bools, nulls, integers beyond int64: value by value
        return _raw_times_exact(values)
    if ok.all():
        return arr, None
    return np.where(ok, arr, 0), ok


def _raw_times_exact(values: list) -> tuple[np.ndarray, np.ndarray]:
    nums = [v if (type(v) is int or type(v) is float) and 0 <= v <= MAX_TIME_NS else None for v in values]
    ok = np.array([v is not None for v in nums], dtype=bool)
    arr = np.asarray([0 if v is None else v for v in nums])
    if arr.dtype.kind not in "if":  # empty
        arr = arr.astype(np.int64)
    return arr, ok


@dataclass
class TimedRows:
    """The result of :func:`valid_times` for one block: the kept events and
    their ts/dur in the trace's unit; ``invalid`` rows were dropped
    (``no_time`` of them for a missing ts or dur), ``first_invalid``
    describes the first."""

    events: list[Event]
    ts: np.ndarray
    dur: np.ndarray
    invalid: int = 0
    no_time: int = 0
    first_invalid: str | None = None


def valid_times(xs: list[Event]) -> TimedRows:
    """The events whose ts and dur are valid (:func:`raw_times`), and those
    as numbers in the trace's unit."""
    tss = list(map(_TS, xs))
    durs = list(map(_DUR, xs))
    ts, ts_ok = raw_times(tss)
    dur, dur_ok = raw_times(durs)
    if ts_ok is None:
        if dur_ok is None:
            return TimedRows(xs, ts, dur)
        ok = dur_ok
    else:
        ok = ts_ok if dur_ok is None else ts_ok & dur_ok
    bad = np.flatnonzero(~ok)
    no_time = sum(1 for i in bad if tss[i] is None or durs[i] is None)
    first = int(bad[0])
    return TimedRows(
        list(compress(xs, ok.tolist())),
        ts[ok],
        dur[ok],
        invalid=len(bad),
        no_time=no_time,
        first_invalid=event_example(xs[first].name, tss[first], durs[first]),
    )


def text_fields(xs: list[Event]) -> tuple[list[str], list[str]]:
    """Category and name of each event as text: a missing or false value is
    "", anything else that is not text becomes its str() (both, when either
    is not text)."""
    cats = list(map(_CAT, xs))
    names = list(map(_NAME, xs))
    if set(map(type, cats)) <= _STR and set(map(type, names)) <= _STR:
        return cats, names
    out_c, out_n = [], []
    for cat, name in zip(cats, names):
        cat, name = cat or "", name or ""
        if type(name) is not str or type(cat) is not str:
            cat, name = str(cat), str(name)
        out_c.append(cat)
        out_n.append(name)
    return out_c, out_n


def drop_trace_span(
    xs: list[Event], cats: list[str], names: list[str], ts: np.ndarray, dur: np.ndarray
) -> tuple[list[Event], list[str], list[str], np.ndarray, np.ndarray]:
    """The rows without Kineto's ``cat: "Trace"`` span (the profiler's own
    window, which HTA drops too)."""
    if "Trace" not in cats:
        return xs, cats, names, ts, dur
    keep = [c != "Trace" for c in cats]
    mask = np.array(keep, dtype=bool)
    return list(compress(xs, keep)), list(compress(cats, keep)), list(compress(names, keep)), ts[mask], dur[mask]


def on_gpu_timeline(cats: list[str], known: dict[str, bool]) -> dict[str, bool]:
    """Category (as written) -> whether its events sit on a GPU stream,
    judged once per distinct spelling in today's names; ``known`` is the
    file's memo, updated and returned."""
    for c in set(cats).difference(known):
        known[c] = canonical_category(c) in GPU_TIMELINE_CATS
    return known


def wants_args(names: list[str], known: dict[str, bool]) -> dict[str, bool]:
    """Name -> whether a row of that name keeps its shape args: the FLOP
    counter's ops and the embedding (SHAPE_OPS) and host collectives (CPU_COMM_RE); judged once
    per distinct name, ``known`` is the file's memo, updated and returned."""
    for name in set(names).difference(known):
        known[name] = name in SHAPE_OPS or bool(CPU_COMM_RE.search(name))
    return known


def event_example(name: Any, ts: Any, dur: Any) -> str:
    """An event's name and times for a message, each cut to a readable length."""

    def short(v: Any) -> str:
        text = repr(v)
        return text if len(text) <= 40 else text[:37] + "..."

    return f"{short(name)} with ts={short(ts)}, dur={short(dur)}"
