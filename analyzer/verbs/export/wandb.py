"""Export to Weights & Biases, offline (``analyzer export RUN --to wandb DIR``), extra ``trackers``.

One W&B run per export, project ``analyzer``, named after the analyzed
folder, written offline into ``DIR/wandb/offline-run-<time>-<id>/`` (no login,
no network; ``wandb sync`` uploads it later; ``WANDB_MODE=online`` logs it
live instead): the training curves as history ``train/<metric>`` at their
step (``run.log(..., step=)``), the summary figures as
``run.summary["analysis/<figure>"]`` and each rank's numeric columns as
``run.summary["rank<R>/<column>"]``; the text fields (MFU source, lower
bound, step time source, straggler ranks) and the analyzed path go in the
run's ``config``. Values are float64, as the tables hold them.
"""
from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Literal

import pandas as pd

from analyzer.errors import AnalyzerError
from analyzer.verbs.export import curve_points

EXTRA_LINE = "export to wandb needs the wandb package: pip install 'trainperf[trackers]'"
PROJECT = "analyzer"


def _num(v: object) -> float | None:
    if v is None or isinstance(v, (bool, str)) or pd.isna(v):  # type: ignore[call-overload]
        return None
    f = float(v)  # type: ignore[arg-type]
    return f if math.isfinite(f) else None


def write_wandb(tables: dict[str, pd.DataFrame], out_dir: Path, run_name: str, path_text: str) -> Path:
    """Log the tables as one offline W&B run under ``out_dir``; the run's folder."""
    try:
        import wandb
    except ImportError:
        raise AnalyzerError(EXTRA_LINE) from None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AnalyzerError(f"{out_dir}: cannot create the export folder ({exc.strerror or exc})") from None
    summary = tables["summary"].iloc[0]
    config = {k: str(summary.get(k)) for k in ("mfu_source", "mfu_lower_bound", "step_time_source", "straggler_ranks")}
    config["analyzer.path"] = path_text
    mode: Literal["online", "offline"] = "online" if os.environ.get("WANDB_MODE") == "online" else "offline"
    settings = wandb.Settings(silent=True, console="off", disable_git=True, save_code=False, x_disable_stats=True)
    try:
        run = wandb.init(project=PROJECT, name=run_name, dir=str(out_dir), mode=mode, config=config, settings=settings)
    except Exception as exc:  # noqa: BLE001 - wandb's own errors (mode, folder): one line
        raise AnalyzerError(f"{out_dir}: cannot start a W&B run ({type(exc).__name__}: {exc})") from None
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for tag, step, value in curve_points(tables):
        v = _num(value)
        if v is not None:
            by_step[step][tag] = v
    for step in sorted(by_step):  # W&B steps only go forward
        run.log(by_step[step], step=step)
    for col in ("mfu", "hfu", "step_time_ms", "flop_coverage"):
        v = _num(summary.get(col))
        if v is not None:
            run.summary[f"analysis/{col}"] = v
    ranks = tables.get("ranks")
    if ranks is not None:
        for row in ranks.to_dict("records"):
            for key, value in row.items():
                v = _num(value) if key not in ("rank", "n_steps") else None
                if v is not None:
                    run.summary[f"rank{row['rank']}/{key}"] = v
    folder = Path(run.settings.sync_dir)
    run.finish()
    wandb.teardown()
    return folder
