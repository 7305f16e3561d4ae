"""Training curves: one value per optimizer step per metric, all ranks together.

Definitions (docs/dashboard.md, "Training curves"). For a reftrain run's
metrics records (docs/rundir.md), per step ``s`` over the ranks ``r`` that
recorded it:

| metric | value at step s | unit |
| --- | --- | --- |
| ``loss`` | mean over ranks of the record's ``loss`` | - |
| ``lr`` | mean over ranks of ``lr`` (one schedule: equal on every rank) | - |
| ``grad_norm`` | mean over ranks of ``grad_norm`` (the global norm: equal on every rank) | - |
| ``tokens_per_s`` | mean over ranks of ``tokens_per_step / step_time_s`` (all ranks' tokens; as analyzer.throughput) | tokens/s |
| ``mfu`` | mean over ranks of the record's ``mfu`` | fraction of peak |
| ``step_time_ms`` | mean over ranks of ``step_time_ms`` (as the headline step time) | ms |
| ``mem_bytes`` | max over ranks of ``mem_bytes`` (the rank closest to running out) | bytes |

Every step is kept, warmup and profiled ones included, flagged in the
``warmup`` and ``profiled`` columns so a chart can mark them; the run's
headline statistics leave them out, a curve shows them. A metric no record
carries (``grad_norm`` without clipping, anything for a folder of traces) has
no rows, and ``missing`` says why.

:func:`smooth` is the optional smoothing of a chart: the trailing mean over
the last ``window`` steps present (fewer at the start), per run and metric.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd

from analyzer.ingest.formats import RunManifest

# metric -> (label, unit, how ranks combine)
METRICS: dict[str, tuple[str, str, str]] = {
    "loss": ("loss", "", "mean"),
    "lr": ("learning rate", "", "mean"),
    "grad_norm": ("gradient norm", "", "mean"),
    "tokens_per_s": ("tokens/s (all ranks)", "tokens/s", "mean"),
    "mfu": ("MFU", "fraction of peak", "mean"),
    "step_time_ms": ("step time", "ms", "mean"),
    "mem_bytes": ("peak memory (max over ranks)", "bytes", "max"),
}
COLUMNS = ("metric", "step", "value", "n_ranks", "warmup", "profiled")


def _empty() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "metric": pd.Series(dtype="object"),
            "step": pd.Series(dtype="int64"),
            "value": pd.Series(dtype="float64"),
            "n_ranks": pd.Series(dtype="int64"),
            "warmup": pd.Series(dtype="bool"),
            "profiled": pd.Series(dtype="bool"),
        }
    )


@dataclass(frozen=True)
class Curves:
    """Per-step training curves of a run, long form (one row per metric and step).

    ``table`` columns: :data:`COLUMNS`. ``missing`` maps a metric of
    :data:`METRICS` without rows to the reason. ``profiled_steps`` and
    ``warmup_steps`` come from the manifest.
    """

    table: pd.DataFrame = field(default_factory=_empty)
    missing: dict[str, str] = field(default_factory=dict)
    warmup_steps: int = 0
    profiled_steps: tuple[int, ...] = ()

    @property
    def metrics(self) -> list[str]:
        """The metrics with at least one value, in :data:`METRICS` order."""
        present = set(self.table["metric"].unique())
        return [m for m in METRICS if m in present]

    def series(self, metric: str) -> pd.DataFrame:
        """The rows of one metric, by step."""
        return self.table[self.table["metric"] == metric].reset_index(drop=True)

    def wide(self) -> pd.DataFrame:
        """One row per step, one column per metric (plus ``warmup``, ``profiled``)."""
        if self.table.empty:
            return pd.DataFrame({"step": pd.Series(dtype="int64")})
        values = self.table.pivot(index="step", columns="metric", values="value")
        values = values[[m for m in METRICS if m in values.columns]]
        flags = self.table.groupby("step")[["warmup", "profiled"]].first()
        return values.join(flags).reset_index()


def training_curves(manifest: RunManifest | Mapping[str, Any] | None, metrics: pd.DataFrame | None) -> Curves:
    """The per-step curves of a run (see module doc)."""
    if manifest is None or metrics is None or metrics.empty or "step" not in metrics.columns:
        reason = (
            "a folder of traces has no per-step metrics records"
            if manifest is None
            else "no metrics records (metrics/rank*.jsonl)"
        )
        return Curves(missing={m: reason for m in METRICS})
    man = RunManifest.read(manifest)
    warmup = man.warmup_steps or 0
    profiled = tuple(sorted(set(man.profiled_steps)))
    rows = metrics.copy()
    tokens_per_step = man.tokens_per_step
    missing: dict[str, str] = {}
    if tokens_per_step and "step_time_ms" in rows.columns:
        ms = pd.to_numeric(rows["step_time_ms"], errors="coerce")
        rows["tokens_per_s"] = float(tokens_per_step) / (ms / 1e3)
    else:
        missing["tokens_per_s"] = "run.json lacks tokens_per_step" if not tokens_per_step else "no step_time_ms"
        rows = rows.drop(columns=["tokens_per_s"], errors="ignore")
    parts = []
    for name, (_, _, how) in METRICS.items():
        if name in missing:
            continue
        if name not in rows.columns:
            missing[name] = f"the metrics records have no {name} field"
            continue
        values = pd.DataFrame(
            {
                "step": rows["step"].astype("int64"),
                "rank": rows["rank"],
                "value": pd.to_numeric(rows[name], errors="coerce").astype("float64"),
            }
        )
        values = values[np.isfinite(values["value"].to_numpy())]
        if values.empty:
            missing[name] = f"no record has a {name} value" + (
                " (grad_norm is null when optim.grad_clip is 0)" if name == "grad_norm" else ""
            )
            continue
        per_step = (
            values.groupby("step", sort=True).agg(value=("value", how), n_ranks=("rank", "nunique")).reset_index()
        )
        per_step.insert(0, "metric", name)
        parts.append(per_step)
    if not parts:
        return Curves(missing=missing, warmup_steps=warmup, profiled_steps=profiled)
    table = pd.concat(parts, ignore_index=True)
    table["n_ranks"] = table["n_ranks"].astype("int64")
    table["warmup"] = table["step"] < warmup
    table["profiled"] = table["step"].isin(profiled)
    return Curves(table[list(COLUMNS)], missing, warmup, profiled)


def smooth(table: pd.DataFrame, window: int, by: tuple[str, ...] = ("metric",)) -> pd.DataFrame:
    """``table`` with ``value`` replaced by its trailing mean over ``window`` rows
    per group of ``by`` (rows ordered by step); ``window`` 1 returns a copy."""
    if window < 1:
        raise ValueError(f"smoothing window must be at least 1 step, got {window}")
    out = table.sort_values([*by, "step"]).reset_index(drop=True)
    if window > 1 and len(out):
        out["value"] = out.groupby(list(by), sort=False)["value"].transform(
            lambda v: v.rolling(window, min_periods=1).mean()
        )
    return out


def overlay(curves: Mapping[str, Curves], metric: str) -> pd.DataFrame:
    """One metric of several runs, long form with a ``run`` column (Compare's overlay)."""
    parts = []
    for run, c in curves.items():
        s = c.series(metric)
        if len(s):
            parts.append(s.assign(run=run))
    if not parts:
        return _empty().assign(run=pd.Series(dtype="object"))
    return pd.concat(parts, ignore_index=True)
