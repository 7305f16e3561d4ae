"""The rows and words of the report's critical-path section (``RunAnalysis.critical_path``).

Per rank and profiled step: the path's length and its breakdown by what
bounds it (HTA's six categories, docs/metrics.md "Critical path"), then the
ops with the most time on the path. The text report
(:func:`analyzer.render.text.critical_path_lines`) and the HTML report
(:func:`analyzer.render.html.critical_path_html`) lay out the same rows.
Nothing here computes a metric.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analyzer.metrics.depgraph import BOUND_CATEGORIES
from analyzer.render.format import num, short_kernel_name

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis
    from analyzer.metrics.critical_summary import StepCriticalPath

TITLE = "Critical path per profiled step (what bounds the step: % of the path's time, HTA's categories)"
# Short column labels for HTA's category names, in BOUND_CATEGORIES order; LEGEND spells them out.
SHORT_LABELS = ("cpu %", "data %", "compute %", "comm %", "kernel-kernel %", "launch %")
LEGEND = "  " + "; ".join(f"{short.removesuffix(' %')}: {name}" for short, name in zip(SHORT_LABELS, BOUND_CATEGORIES))
TOP_OPS_SHOWN = 5
# At most this many (rank, step) paths are printed, so the section stays short on a run of many ranks or
# steps: all of them up to this many, else each rank's longest step, else the longest of those. The JSON
# report and the API keep every one.
MAX_PATHS_SHOWN = 8
HEADERS = ["rank", "step", "length ms", *SHORT_LABELS]
OPS_HEADERS = ["name", "kind", "bound", "ms on path", "% of path", "count"]


def all_paths(a: "RunAnalysis") -> list["StepCriticalPath"]:
    """Every rank's and step's path; none when the analysis did not compute them (no section then)."""
    return [] if a.critical_path is None else a.critical_path.paths


def shown_paths(a: "RunAnalysis") -> list["StepCriticalPath"]:
    """The paths the reports print (:data:`MAX_PATHS_SHOWN`), by rank then step."""
    paths = all_paths(a)
    if len(paths) <= MAX_PATHS_SHOWN:
        return list(paths)
    longest: dict[int, StepCriticalPath] = {}
    for p in paths:
        if p.rank not in longest or p.length_ms > longest[p.rank].length_ms:
            longest[p.rank] = p
    kept = sorted(longest.values(), key=lambda p: (-p.length_ms, p.rank))[:MAX_PATHS_SHOWN]
    return sorted(kept, key=lambda p: p.rank)


def shown_note(a: "RunAnalysis") -> str:
    """Which paths the section prints, when not all of them."""
    shown, paths = shown_paths(a), all_paths(a)
    if len(shown) == len(paths):
        return ""
    n_ranks = len({p.rank for p in paths})
    which = "each rank's longest step" if len(shown) == n_ranks else f"the {len(shown)} ranks with the longest step"
    return f"  Shown: {which} ({len(shown)} of {len(paths)} paths; the JSON report has every one)."


def breakdown_rows(a: "RunAnalysis") -> list[list[object]]:
    """One row per shown (rank, step): rank, step, path length (ms) and the six category percentages."""
    return [
        [p.rank, p.step, num(p.length_ms, ".2f"), *(num(p.breakdown_pct[c]) for c in BOUND_CATEGORIES)]
        for p in shown_paths(a)
    ]


def ops_rows(p: "StepCriticalPath", width: int, top: int = TOP_OPS_SHOWN) -> list[list[object]]:
    """The ``top`` ops with the most time on one step's path."""
    return [
        [short_kernel_name(str(o.name), width), o.kind, o.bound, num(o.ms_on_path, ".3f"), num(o.pct), o.count]
        for o in p.ops.head(top).itertuples(index=False)
    ]


OPS_NOTE = f"Top {TOP_OPS_SHOWN} ops on each critical path above (ms on path: the op's time on the path)"
