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
# Beyond this many (rank, step) paths, the ops are listed for each rank's longest step only: the text stays short.
MAX_STEPS_WITH_OPS = 8
HEADERS = ["rank", "step", "length ms", *SHORT_LABELS]
OPS_HEADERS = ["name", "kind", "bound", "ms on path", "% of path", "count"]


def breakdown_rows(a: "RunAnalysis") -> list[list[object]]:
    """One row per (rank, step): rank, step, path length (ms) and the six category percentages."""
    return [
        [p.rank, p.step, num(p.length_ms, ".2f"), *(num(p.breakdown_pct[c]) for c in BOUND_CATEGORIES)]
        for p in a.critical_path.paths
    ]


def steps_with_ops(a: "RunAnalysis") -> list["StepCriticalPath"]:
    """The paths whose ops are listed: every one, or each rank's longest when there are many."""
    paths = a.critical_path.paths
    if len(paths) <= MAX_STEPS_WITH_OPS:
        return list(paths)
    longest: dict[int, StepCriticalPath] = {}
    for p in paths:
        if p.rank not in longest or p.length_ms > longest[p.rank].length_ms:
            longest[p.rank] = p
    return [longest[r] for r in sorted(longest)]


def ops_rows(p: "StepCriticalPath", width: int, top: int = TOP_OPS_SHOWN) -> list[list[object]]:
    """The ``top`` ops with the most time on one step's path."""
    return [
        [short_kernel_name(str(o.name), width), o.kind, o.bound, num(o.ms_on_path, ".3f"), num(o.pct), o.count]
        for o in p.ops.head(top).itertuples(index=False)
    ]


def ops_note(a: "RunAnalysis") -> str:
    shown = steps_with_ops(a)
    which = "each step" if len(shown) == len(a.critical_path.paths) else "each rank's longest step"
    return f"Top {TOP_OPS_SHOWN} ops on the critical path of {which} (ms on path: the op's time on the path)"
