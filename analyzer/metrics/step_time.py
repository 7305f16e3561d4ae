"""The run's step time: one definition, used by every surface (docs/metrics.md, "Step time").

Two step times exist for a reftrain run, and they differ: the profiler slows
the steps it records (a reftrain run measured 60.5 ms steady, about 83 ms
profiled), so every surface must say which one it shows.

* **steady-state** (``steady_ms``): over the steady-state steps of the
  metrics records (``metrics/rank*.jsonl``; warm-up and profiled steps left
  out, :func:`analyzer.metrics.mfu.steady_state`), per step the mean over
  ranks of ``step_time_ms``, then the median over steps. These are the
  steps of the run's MFU and its shape of aggregation (median over steps
  of a mean over ranks; MFU averages each rank's own MFU, i.e. ``1 / t``,
  so it is not exactly FLOPs / (this step time x peak): Jensen's gap,
  docs/metrics.md "MFU and HFU"). The suggestions' ``step_time_ms``
  (analyzer.suggest.facts) is this same figure.
* **profiled windows** (``profiled_ms``): the same median over steps of the
  mean over ranks, over the ProfilerStep windows of the traces. The step
  breakdown, overlap and idle figures cover these steps, so their parts add
  up to this step time, not to the steady one.

The **headline** (``ms``) is the steady-state step time when the run has
metrics records, else the profiled-window one (trace folders). Per rank the
same choice applies to that rank's median over its steps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import pandas as pd

StepTimeSource = Literal["steady_state", "profiled_windows"]
LABELS: dict[str, str] = {
    "steady_state": "steady-state steps (metrics records)",
    "profiled_windows": "profiled windows (ProfilerStep)",
}


@dataclass(frozen=True)
class StepTime:
    """The run's step times in ms; None where the run has no such steps."""

    ms: float | None
    source: StepTimeSource | None
    steady_ms: float | None
    n_steady_steps: int
    profiled_ms: float | None
    n_profiled_steps: int

    @property
    def label(self) -> str:
        """What the headline covers, in words ("steady-state steps (metrics records)")."""
        return LABELS[self.source] if self.source else "no steps"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["label"] = self.label
        return out


def median_of_rank_mean(table: pd.DataFrame | None) -> tuple[float | None, int]:
    """Median over steps of the mean over ranks of ``step_time_ms``, and the number of steps.

    ``table`` has ``rank, step, step_time_ms`` (more columns are ignored);
    missing values are ignored. (None, 0) on an empty or missing table.
    """
    if table is None or table.empty or "step_time_ms" not in table.columns:
        return None, 0
    per_step = pd.to_numeric(table["step_time_ms"], errors="coerce").groupby(table["step"].to_numpy()).mean().dropna()
    if per_step.empty:
        return None, 0
    return float(per_step.median()), int(len(per_step))


def step_time(steady: pd.DataFrame | None, profiled: pd.DataFrame | None) -> StepTime:
    """The run's :class:`StepTime` from its steady-state metrics rows and its ProfilerStep rows."""
    steady_ms, n_steady = median_of_rank_mean(steady)
    profiled_ms, n_profiled = median_of_rank_mean(profiled)
    if steady_ms is not None:
        ms, source = steady_ms, "steady_state"
    elif profiled_ms is not None:
        ms, source = profiled_ms, "profiled_windows"
    else:
        ms, source = None, None
    return StepTime(ms, source, steady_ms, n_steady, profiled_ms, n_profiled)  # type: ignore[arg-type]
