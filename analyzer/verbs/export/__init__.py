"""``analyzer export``: a run's analysis as plain tables other tools can read, and into trackers.

:func:`export_run` builds an :class:`Export` (pure: RunAnalysis in, tables,
identity and report documents out); :func:`write_tables` writes one file per
table in the chosen format; ``tensorboard.py``, ``mlflow.py`` and
``wandb.py`` log it into a tracker. Tables (columns in docs/export.md):

* ``summary``: one row: MFU (median, source, lower_bound, flop_coverage),
  HFU, step time (ms, source label), tokens/s, flagged straggler ranks;
* ``ranks``: one row per rank, the per-rank report table (step times,
  HTA overlap, exposed communication, idle, compute) plus the breakdown's
  mean ms per part as ``breakdown_<part>_ms``;
* ``curves``: the per-step training curves (analyzer.metrics.curves, wide: one
  column per metric, each an aggregate over ranks), reftrain runs only;
* ``mfu_steps``: MFU per step as the headline computes it;
* ``stragglers``: per rank and step, step time, ratio and lateness;
* ``kernels``: the report's top kernels (or host ops) table;
* ``ops``, ``modules``: device and host time per op and per nn.Module path and rank
  (analyzer.metrics.attribution);
* ``roofline``: per op, FLOPs, bytes, rates, bound and efficiency (analyzer.metrics.roofline);
* ``collectives``: one row per collective matched across ranks;
* ``memory``: peak allocated and reserved bytes per step and rank (analyzer.metrics.memory).

An empty table (a trace folder has no curves) is not written.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import pandas as pd

from analyzer.errors import AnalyzerError

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis

FORMATS = ("csv", "parquet")
CURVE_PREFIX = "run/"
TARGETS = (*FORMATS, "tensorboard", "wandb", "mlflow")  # analyzer/verbs/export/tensorboard.py, wandb.py, mlflow.py


def curve_points(tables: dict[str, pd.DataFrame]) -> Iterator[tuple[str, int, object]]:
    """``(tag, step, value)`` of every training-curve point, tagged ``run/<metric>``: the value over all ranks
    of analyzer.metrics.curves (``train/<field>`` is rank 0's own record in the trainer's live logging;
    docs/export.md, "One name, one meaning")."""
    curves = tables.get("curves")
    if curves is None:
        return
    for col in curves.columns:
        if col in ("step", "warmup", "profiled"):
            continue
        for step, value in zip(curves["step"], curves[col]):
            yield f"{CURVE_PREFIX}{col}", int(step), value


@dataclass(frozen=True)
class Export:
    """What an export writes: the tables, the run's identity and its report documents.

    ``run_id``: the run's stable id, the one a tracker finds the run by on re-export (tag
    ``analyzer.run_id``): ``<run_id>@<start_time>`` of the manifest (the trainer's run name, unique
    only within its runs folder, and when it started), else the analyzed folder's absolute path.
    ``run_name``: the run's name (the manifest's ``run_id``, else the folder's name); it names the
    TensorBoard sub-folder and the tracker run.
    ``artifacts``: file name -> text, the report as ``report.json`` (schema analyzer.report/1) and
    ``report.html`` where HTML can be rendered here (trackers only: a table export has none); ``notes``: what
    was left out and why. ``config``: the trainer's resolved config (run.json), empty for a folder of traces; it
    says where the trainer's live logger wrote (its W&B project).
    """

    tables: dict[str, pd.DataFrame]
    run_id: str
    run_name: str
    path_text: str
    artifacts: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)


# The summary's numbers a tracker logs as analysis/<column>, and the ranks table's text columns it leaves out.
SUMMARY_FIGURES = ("mfu", "hfu", "step_time_ms", "tokens_per_s", "flop_coverage")
SUMMARY_TEXT = ("mfu_source", "mfu_lower_bound", "step_time_source", "straggler_ranks")
_RANK_KEYS = ("rank", "timeline", "device_name", "n_steps")


def finite(v: object) -> float | None:
    """``v`` as a float when it is a finite real number (numpy's included), else None (booleans, text, NaN)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
        return None
    return float(v)


def summary_figures(tables: dict[str, pd.DataFrame]) -> dict[str, float]:
    """The one-number figures a tracker logs at step 0: ``analysis/<figure>`` of the summary and
    ``rank<R>/<column>`` of each rank's numeric columns; missing and non-finite values left out."""
    summary = tables["summary"].iloc[0]
    out = {f"analysis/{col}": v for col in SUMMARY_FIGURES if (v := finite(summary.get(col))) is not None}
    ranks = tables.get("ranks")
    for row in ranks.to_dict("records") if ranks is not None else []:
        out.update(
            {
                f"rank{row['rank']}/{col}": v
                for col, value in row.items()
                if col not in _RANK_KEYS and (v := finite(value)) is not None
            }
        )
    return out


def summary_text(tables: dict[str, pd.DataFrame]) -> dict[str, str]:
    """The summary's text fields (MFU source, lower bound, step time source, straggler ranks) as text."""
    summary = tables["summary"].iloc[0]
    return {k: str(summary.get(k)) for k in SUMMARY_TEXT}


def export_tables(a: "RunAnalysis", top: int = 50) -> dict[str, pd.DataFrame]:
    """The tables of the module doc, by name."""
    from analyzer.metrics.curves import training_curves
    from analyzer.metrics.throughput import throughput
    from analyzer.verbs.report import top_kernels_table

    m, st = a.mfu, a.step_time
    summary = pd.DataFrame(
        [
            {
                "mfu": m.median,
                "mfu_source": m.source,
                "mfu_lower_bound": bool(m.lower_bound),
                "flop_coverage": m.flop_coverage,
                "hfu": m.hfu_median,
                "step_time_ms": st.ms,
                "step_time_source": st.label,
                "tokens_per_s": throughput(a.manifest, a.metrics).median,
                "straggler_ranks": ",".join(str(r) for r in a.stragglers.ranks),
            }
        ]
    )
    rank_rows = []
    for r in a.ranks:
        row = {
            "rank": r.rank,
            "timeline": r.source,
            "n_steps": r.n_steps,
            "step_time_ms": r.step_time_ms,
            "steady_step_time_ms": r.steady_step_time_ms,
            "profiled_step_time_ms": r.profiled_step_time_ms,
            "comm_comp_overlap_pct": r.comm_comp_overlap_pct,
            "exposed_comm_pct": r.exposed_comm_pct,
            "idle_pct": r.idle_pct,
            "compute_pct": r.compute_pct,
            "device_name": r.device_name,
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
        "ops": a.ops().reset_index(drop=True),
        "modules": a.modules().reset_index(drop=True),
        "roofline": a.roofline().ops.reset_index(drop=True),
        "collectives": a.collectives.reset_index(drop=True) if a.collectives is not None else pd.DataFrame(),
        "memory": a.memory.steps.reset_index(drop=True),
    }
    return {name: t for name, t in tables.items() if len(t) and len(t.columns)}


def export_run(a: "RunAnalysis", top: int = 50, with_report: bool = True, report_html: str | None = None) -> Export:
    """The :class:`Export` of an analysis: :func:`export_tables`, the run's id and name, and (``with_report``,
    for the trackers) the report documents: the JSON report, and ``report_html`` when the caller rendered
    it (the renderers sit above the verbs: analyzer.render.html.report_html)."""
    from analyzer.jsontext import dumps_json, path_text
    from analyzer.verbs.report import report_json

    paths = a.path if isinstance(a.path, list) else [a.path]
    folder = Path(paths[0]).absolute() if len(paths) == 1 else Path(paths[0]).absolute().parent
    man = a.run_manifest
    manifest_id = man.run_id
    if manifest_id:  # a run name is unique in its runs folder only; with its start time, anywhere
        run_id = f"{manifest_id}@{man.start_time}" if man.start_time else str(manifest_id)
    else:
        run_id = path_text(folder)
    artifacts: dict[str, str] = {}
    notes: list[str] = []
    if with_report:
        artifacts["report.json"] = dumps_json(report_json(a))
        if report_html is not None:
            artifacts["report.html"] = report_html
    return Export(
        export_tables(a, top),
        run_id,
        str(manifest_id) if manifest_id else folder.name,
        path_text(folder),
        artifacts,
        notes,
        dict(man.config or {}),
    )


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
