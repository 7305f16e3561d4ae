"""Training throughput in tokens per second, all ranks together.

Definition (docs/metrics.md, "Throughput"): per steady-state optimizer step
``s`` of a reftrain run,

    ``tokens_per_s_s = mean over ranks r of tokens_per_step / t_{r,s}``

with ``tokens_per_step`` the manifest's global tokens per optimizer step
(all ranks, all micro-batches) and ``t_{r,s}`` rank ``r``'s ``step_time_ms``
in ``metrics/rank*.jsonl``: the same steps (warmup and profiled steps
excluded) and the same order of operations (rate per rank, then the mean
over ranks) as the manifest MFU (:func:`analyzer.metrics.mfu.mfu_from_manifest`),
so throughput and MFU are proportional step by step:
``mfu_s = tokens_per_s_s * flops.per_token / world_size / peak``. The run
value is the median over steps. ``step_time_ms`` in the table is the mean
over ranks, for reference.

``overall`` is the rate the run sustained: per rank ``r``,
``tokens_per_step * n_steps / sum_s t_{r,s}`` over the same steps, then the
mean over ranks. It differs from the median when steps are uneven: with
4 DataLoader workers behind a 600 ms-per-batch source, three steps in four
find a batch ready (90 ms) and the fourth waits (300 ms); the median says
90 ms per step, the run actually takes 150.

A folder of traces records no token counts, so it has no throughput
(``source`` ``none`` with the reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import numpy as np
import pandas as pd

from analyzer.ingest.formats import RunManifest

from analyzer.metrics.mfu import steady_state

STEP_COLUMNS = ("step", "n_ranks", "step_time_ms", "tokens", "tokens_per_s")


def _empty_steps() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="float64") for c in STEP_COLUMNS})


@dataclass(frozen=True)
class Throughput:
    """Tokens per second of a run (all ranks). ``median`` is None when unknown."""

    source: Literal["manifest", "none"]
    median: float | None = None
    overall: float | None = None
    reason: str | None = None
    steps: pd.DataFrame = field(default_factory=_empty_steps)


def throughput(manifest: RunManifest | Mapping[str, Any] | None, metrics: pd.DataFrame | None) -> Throughput:
    """Tokens per second per steady-state step and its median (see module doc)."""
    if manifest is None:
        return Throughput("none", reason="no run.json: traces do not record token counts")
    man = RunManifest.read(manifest)
    tokens_per_step = man.tokens_per_step
    if not tokens_per_step:
        return Throughput("none", reason="run.json lacks tokens_per_step")
    if metrics is None or metrics.empty or "step_time_ms" not in metrics.columns:
        return Throughput("none", reason="no metrics records (metrics/rank*.jsonl) to time the steps")
    steady = steady_state(metrics, man.warmup_steps or 0, man.profiled_steps)
    if steady.empty:
        return Throughput("none", reason="no steady-state steps (all are warmup or profiled)")
    rank_ms = pd.to_numeric(steady["step_time_ms"], errors="coerce").to_numpy(np.float64)
    per_rank = pd.DataFrame(
        {
            "step": steady["step"].to_numpy(),
            "rank": steady["rank"].to_numpy(),
            "step_time_ms": rank_ms,
            "tokens_per_s": float(tokens_per_step) / (rank_ms / 1e3),
        }
    )
    per_step = per_rank.groupby("step", sort=True).agg(
        n_ranks=("rank", "nunique"), step_time_ms=("step_time_ms", "mean"), tokens_per_s=("tokens_per_s", "mean")
    )
    steps = pd.DataFrame(
        {
            "step": per_step.index.to_numpy(np.int64),
            "n_ranks": per_step["n_ranks"].to_numpy(np.int64),
            "step_time_ms": per_step["step_time_ms"].to_numpy(np.float64),
            "tokens": float(tokens_per_step),
            "tokens_per_s": per_step["tokens_per_s"].to_numpy(np.float64),
        }
    )
    per_rank_time_s = per_rank.groupby("rank")["step_time_ms"].agg(["sum", "count"])
    overall = float((float(tokens_per_step) * per_rank_time_s["count"] / (per_rank_time_s["sum"] / 1e3)).mean())
    return Throughput("manifest", median=float(steps["tokens_per_s"].median()), overall=overall, steps=steps)
