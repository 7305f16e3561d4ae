"""``analyzer export``: a run's analysis as plain tables other tools can read.

:func:`export_tables` builds the tables (pure: RunAnalysis in, DataFrames
out); :func:`write_tables` writes one file per table in the chosen format.
Tables (columns documented in docs/cli.md, "export"):

* ``summary``: one row: MFU (median, source, lower_bound, flop_coverage),
  HFU, step time (ms, source label), flagged straggler ranks;
* ``ranks``: one row per rank, the per-rank report table (step times,
  HTA overlap, exposed communication, idle, compute) plus the breakdown's
  mean ms per part as ``breakdown_<part>_ms``;
* ``curves``: the per-step training curves (analyzer.curves, wide: one
  column per metric), reftrain runs only;
* ``mfu_steps``: MFU per step as the headline computes it;
* ``stragglers``: per rank and step, step time, ratio and lateness;
* ``kernels``: the report's top kernels (or host ops) table.

An empty table (a trace folder has no curves) is not written.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pandas as pd

from analyzer.errors import AnalyzerError

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis

FORMATS = ("csv", "parquet")
TARGETS = (*FORMATS, "tensorboard", "wandb", "mlflow")  # analyzer/verbs/export/tensorboard.py, wandb.py, mlflow.py


def curve_points(tables: dict[str, pd.DataFrame]) -> Iterator[tuple[str, int, object]]:
    """``(tag, step, value)`` of every training-curve point, tagged ``train/<metric>`` (the trackers' writers)."""
    curves = tables.get("curves")
    if curves is None:
        return
    for col in curves.columns:
        if col in ("step", "warmup", "profiled"):
            continue
        for step, value in zip(curves["step"], curves[col]):
            yield f"train/{col}", int(step), value


def export_tables(a: "RunAnalysis", top: int = 50) -> dict[str, pd.DataFrame]:
    """The tables of the module doc, by name."""
    from analyzer.metrics.curves import training_curves
    from analyzer.verbs.report import top_kernels_table

    m, st = a.mfu, a.step_time
    summary = pd.DataFrame([{
        "mfu": m.median, "mfu_source": m.source, "mfu_lower_bound": bool(m.lower_bound),
        "flop_coverage": m.flop_coverage, "hfu": m.hfu_median,
        "step_time_ms": st.ms, "step_time_source": st.label,
        "straggler_ranks": ",".join(str(r) for r in a.stragglers.ranks),
    }])
    rank_rows = []
    for r in a.ranks:
        row = {
            "rank": r.rank, "timeline": r.source, "n_steps": r.n_steps, "step_time_ms": r.step_time_ms,
            "steady_step_time_ms": r.steady_step_time_ms, "profiled_step_time_ms": r.profiled_step_time_ms,
            "comm_comp_overlap_pct": r.comm_comp_overlap_pct, "exposed_comm_pct": r.exposed_comm_pct,
            "idle_pct": r.idle_pct, "compute_pct": r.compute_pct, "device_name": r.device_name,
        }
        row.update({f"breakdown_{part}_ms": v.get("mean_ms") for part, v in r.breakdown.items()})
        rank_rows.append(row)
    tables = {
        "summary": summary,
        "ranks": pd.DataFrame(rank_rows),
        "curves": training_curves(a.manifest, a.metrics).wide(),
        "mfu_steps": m.steps.reset_index(drop=True) if m.source != "none" else pd.DataFrame(),
        "stragglers": a.stragglers.per_step.reset_index(drop=True),
        "kernels": top_kernels_table(a, top).reset_index(drop=True),
    }
    return {name: t for name, t in tables.items() if len(t) and len(t.columns)}


def write_tables(tables: dict[str, pd.DataFrame], fmt: str, out_dir: Path) -> list[Path]:
    """Write ``<name>.<fmt>`` per table into ``out_dir`` (created); the paths written."""
    if fmt not in FORMATS:
        raise AnalyzerError(f"export: unknown format {fmt!r} (one of {', '.join(FORMATS)})")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AnalyzerError(f"{out_dir}: cannot create the export folder ({exc.strerror or exc})") from None
    written = []
    for name, table in tables.items():
        path = out_dir / f"{name}.{fmt}"
        try:
            if fmt == "csv":
                table.to_csv(path, index=False)
            else:
                # Category and object columns as text: Parquet readers elsewhere need no pandas metadata.
                table.to_parquet(path, index=False)
        except OSError as exc:
            raise AnalyzerError(f"{path}: cannot write ({exc.strerror or exc})") from None
        written.append(path)
    return written
