"""The critical path of each profiled step, kept small: what the report, the API and the dashboard show.

:func:`analyzer.metrics.critical_path.critical_paths` finds a step's
critical path on its dependency graph (the longest path from the step's
start to its end; docs/metrics.md, "Critical path"). Its result holds the
whole graph, as large as the step's events; a rank summary
(:mod:`analyzer.rankmap`) keeps only :class:`StepCriticalPath`: the
length, the breakdown by what bounds the path (HTA's six categories, in
percent of the path's weighted time) and the :data:`TOP_OPS` ops with the
most time on the path. Per profiled step (``ProfilerStep#N``) of each rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analyzer.metrics.critical_path import CriticalPath
from analyzer.metrics.depgraph import BOUND_CATEGORIES

# Ops kept per step: the text and HTML reports show 5, the JSON report and the dashboard this many.
TOP_OPS = 20
OPS_COLUMNS = ("name", "kind", "bound", "ms_on_path", "pct", "count")


@dataclass(frozen=True)
class StepCriticalPath:
    """One rank's one profiled step: its critical path in brief.

    ``length_ms``: the longest path's length (ms), which is the step's
    measured span. ``breakdown_pct``: every name of
    :data:`~analyzer.metrics.depgraph.BOUND_CATEGORIES`, in that order, to
    its percent of the path's weighted time (summing to 100 when the path
    carries time; all 0.0 when it carries none). ``ops``: the :data:`TOP_OPS`
    events on the path with the most time on it (columns
    :data:`OPS_COLUMNS`: the op or kernel name, the events table's kind,
    the bound category, ms on the path, its percent of the path's weighted
    time, and how many distinct events of that name the path passes
    through), most time first. ``n_ops``: how many such rows the whole
    path has (distinct name, kind and bound).
    """

    rank: int
    step: int
    length_ms: float
    breakdown_pct: dict[str, float]
    ops: pd.DataFrame
    n_ops: int

    def to_json(self) -> dict[str, Any]:
        """The entry of the report's ``critical_path`` list (docs/metrics.md, "The report")."""
        return {
            "rank": self.rank,
            "step": self.step,
            "length_ms": self.length_ms,
            "breakdown_pct": dict(self.breakdown_pct),
            "n_ops": self.n_ops,
            "ops": self.ops.to_dict("records"),
        }


def step_critical_path(cp: CriticalPath, top: int = TOP_OPS) -> StepCriticalPath:
    """The brief of one computed critical path: its length, breakdown and ``top`` ops."""
    ops = cp.ops.sort_values("ms_on_path", ascending=False, kind="stable")
    kept = ops.head(top).reset_index(drop=True)
    table = pd.DataFrame(
        {
            "name": kept["name"].astype(str).to_numpy(dtype=object),
            "kind": kept["kind"].astype(str).to_numpy(dtype=object),
            "bound": kept["bound"].astype(str).to_numpy(dtype=object),
            "ms_on_path": kept["ms_on_path"].to_numpy(dtype="float64"),
            "pct": kept["pct"].to_numpy(dtype="float64"),
            "count": kept["count"].to_numpy(dtype="int64"),
        }
    )
    return StepCriticalPath(
        rank=int(cp.rank),
        step=int(cp.step),
        length_ms=float(cp.length_ms),
        breakdown_pct={name: float(cp.breakdown_pct.get(name, 0.0)) for name in BOUND_CATEGORIES},
        ops=table,
        n_ops=int(len(ops)),
    )


@dataclass
class RunCriticalPath:
    """Every rank's profiled steps' critical paths (``RunAnalysis.critical_path``), by rank then step."""

    paths: list[StepCriticalPath] = field(default_factory=list)

    def to_json(self) -> list[dict[str, Any]]:
        """The report's top-level ``critical_path`` list: one entry per rank and profiled step."""
        return [p.to_json() for p in self.paths]

    def for_rank(self, rank: int) -> list[StepCriticalPath]:
        """One rank's steps, in step order."""
        return [p for p in self.paths if p.rank == rank]

    def table(self) -> pd.DataFrame:
        """One row per (rank, step): ``rank``, ``step``, ``length_ms`` and one column per bound category (percent)."""
        columns: dict[str, Any] = {
            "rank": pd.Series([p.rank for p in self.paths], dtype="int64"),
            "step": pd.Series([p.step for p in self.paths], dtype="int64"),
            "length_ms": pd.Series([p.length_ms for p in self.paths], dtype="float64"),
        }
        for name in BOUND_CATEGORIES:
            columns[name] = pd.Series([p.breakdown_pct[name] for p in self.paths], dtype="float64")
        return pd.DataFrame(columns)


def run_critical_path(per_rank: dict[int, list[StepCriticalPath]]) -> RunCriticalPath:
    """The run's critical paths from each rank's, ordered by rank then step."""
    return RunCriticalPath([p for rank in sorted(per_rank) for p in sorted(per_rank[rank], key=lambda p: p.step)])
