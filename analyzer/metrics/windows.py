"""Step windows that fit the trace, and the one analysis window of a rank.

A ProfilerStep window is the profiler's own annotation; nothing forces it to
fit the events. Seen in the wild: a ``ProfilerStep#N`` ending 13 s after the
last event of its trace (the profiler was stopped long after the last step
ran), which a step breakdown takes as a 13.3 s step, mostly idle, and two
suggestions were built on it. Windows can also overlap each other (merged
profiler windows, a step marker left open). :func:`check_windows` fixes
each window to the trace and says what it did (docs/metrics.md, "Step
windows"):

* **past the events**: a window reaching beyond the last event of the rank
  (or starting before its first) by more than :data:`OVERHANG_MIN_NS` and
  more than half the median length of the rank's other windows (half its
  own length when it is the only one) is clipped to the events' extent. A
  shorter overhang is a step's ordinary idle tail (the GPU waiting for the
  next batch), which the breakdown must count as idle;
* **overlapping**: a window starting before the previous window's end starts
  at that end instead (time is counted in one step only); flagged when the
  overlap exceeds :data:`OVERLAP_MIN_NS` and 1 % of the window (clock
  rounding between consecutive markers is not a defect);
* **empty**: a window with no time left after that, or lying wholly outside
  the events, is dropped.

A clipped window is kept, with ``flagged`` true and a warning naming the
step, the rank and the seconds removed; a dropped one is listed in the
warnings. No suggestion rule reads a flagged window
(analyzer.suggest.facts): its length is an artefact of the trace, not a
measurement of the step.

The events' extent is taken over every event except the ProfilerStep
markers themselves (host annotations and their GPU copies).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analyzer.metrics.text import text_mask

COLUMNS = ("step", "start_ns", "end_ns", "flagged")
# An overhang past the events shorter than this is never clipped: 10 ms is
# longer than any launch gap or data wait seen at a step's end in the shared
# traces, and far shorter than a stopped profiler's tail (13 s in the wild).
OVERHANG_MIN_NS = 10_000_000
OVERLAP_MIN_NS = 10_000


@dataclass
class WindowCheck:
    """Fixed step windows of one rank (``step, start_ns, end_ns, flagged``) and a warning per change."""

    steps: pd.DataFrame
    warnings: list[str] = field(default_factory=list)

    @property
    def n_flagged(self) -> int:
        return int(self.steps["flagged"].sum()) if len(self.steps) else 0


def events_extent(events: pd.DataFrame) -> tuple[int, int] | None:
    """(first start, last end) in ns over the events that are not ProfilerStep markers; None when there are none."""
    rest = ~text_mask(events["name"], lambda n: n.startswith("ProfilerStep#"))
    if not rest.any():
        return None
    # On the two columns' arrays: selecting the rows of the whole table copied every column (6 ms a rank).
    return int(events["start_ns"].to_numpy()[rest].min()), int(events["end_ns"].to_numpy()[rest].max())


def check_windows(events: pd.DataFrame, steps: pd.DataFrame, rank: int) -> WindowCheck:
    """Clip or drop the step windows of one rank that do not fit its events or overlap (see module doc)."""
    if steps.empty:
        return WindowCheck(steps.assign(flagged=np.zeros(0, dtype=bool)))
    extent = events_extent(events)
    order = steps.sort_values(["start_ns", "end_ns"], kind="stable")
    lengths = (order["end_ns"] - order["start_ns"]).to_numpy(np.int64)
    out, warnings = [], []
    prev_end = None
    for i, (step, start, end) in enumerate(
        zip(order["step"].to_numpy(np.int64), order["start_ns"].to_numpy(np.int64), order["end_ns"].to_numpy(np.int64))
    ):
        s, e, why = int(start), int(end), []
        others = np.delete(lengths, i)
        typical = float(np.median(others)) if len(others) else float(lengths[i])
        limit = max(OVERHANG_MIN_NS, 0.5 * typical)
        if extent is not None:
            lo, hi = extent
            if e - hi > limit or (s >= hi):
                why.append(f"ends {(e - hi) / 1e9:.3f} s after the last event")
                e = min(e, hi)
            if lo - s > limit or (e <= lo):
                why.append(f"starts {(lo - s) / 1e9:.3f} s before the first event")
                s = max(s, lo)
        if prev_end is not None and s < prev_end:
            if prev_end - s > max(OVERLAP_MIN_NS, 0.01 * (e - s)):
                why.append(f"overlaps the previous step by {(prev_end - s) / 1e9:.3f} s")
            s = prev_end
        if e <= s:
            warnings.append(f"rank {rank}: ProfilerStep#{step} dropped: {'; '.join(why) or 'no time left'}")
            continue
        if why:
            warnings.append(
                f"rank {rank}: ProfilerStep#{step} clipped to the trace ({'; '.join(why)}): "
                f"{(end - start) / 1e6:.1f} ms -> {(e - s) / 1e6:.1f} ms, not used by suggestions"
            )
        out.append((int(step), s, e, bool(why)))
        prev_end = e
    table = (
        pd.DataFrame(out, columns=list(COLUMNS))
        if out
        else pd.DataFrame(
            {
                "step": pd.Series(dtype="int64"),
                "start_ns": pd.Series(dtype="int64"),
                "end_ns": pd.Series(dtype="int64"),
                "flagged": pd.Series(dtype=bool),
            }
        )
    )
    table = table.astype({"step": "int64", "start_ns": "int64", "end_ns": "int64", "flagged": bool})
    return WindowCheck(table.reset_index(drop=True), warnings)
