"""Export to Weights & Biases, offline (``analyzer export RUN --to wandb DIR``), extra ``trackers``.

One W&B run per analyzed run, project ``analyzer``, named after the run,
with a stable id derived from the run's id (:func:`wandb_id`), written
offline into ``DIR/wandb/offline-run-<time>-<id>/`` (no login, no network;
``wandb sync`` uploads it later; ``WANDB_MODE=online`` logs it live
instead): the training curves as history ``run/<metric>`` at their step
(``run.log(..., step=)``), the summary figures as
``run.summary["analysis/<figure>"]`` and each rank's numeric columns as
``run.summary["rank<R>/<column>"]``; the text fields (MFU source, lower
bound, step time source, straggler ranks), the analyzed path and the run's
id go in the run's ``config``; the report (``report.json``, and
``report.html`` where rendered) and every table (``tables/<name>.csv``) are
written into the run's files folder (``run.dir``, uploaded with the run). Values are float64, as the
tables hold them.

Re-export updates the same W&B run: the id is the same, and the run is
resumed (``resume="allow"``); each offline export is its own folder, which
``wandb sync`` uploads into that one run. The summary, config and files are
replaced; history points at steps the run already holds keep their values
(W&B steps only go forward).
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from pathlib import Path
from typing import Literal

from analyzer.errors import AnalyzerError
from analyzer.verbs.export import Export, curve_points, finite, summary_figures, summary_text

EXTRA_LINE = "export to wandb needs the wandb package: pip install 'trainperf[trackers]'"
PROJECT = "analyzer"


def wandb_id(run_id: str) -> str:
    """The W&B run id of a run: ``analyzer-`` and 16 hex digits of the SHA-1 of its id (W&B ids may not hold
    ``/ \\ # ? % :`` and are at most 64 characters; an id that is a path holds most of them)."""
    return "analyzer-" + hashlib.sha1(run_id.encode()).hexdigest()[:16]


def write_wandb(export: Export, out_dir: Path) -> Path:
    """Log the export as its W&B run (offline under ``out_dir``); the folder of this export."""
    try:
        import wandb
    except ImportError:
        raise AnalyzerError(EXTRA_LINE) from None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AnalyzerError(f"{out_dir}: cannot create the export folder ({exc.strerror or exc})") from None
    config: dict[str, str] = {
        **summary_text(export.tables),
        "analyzer.path": export.path_text,
        "analyzer.run_id": export.run_id,
    }
    mode: Literal["online", "offline"] = "online" if os.environ.get("WANDB_MODE") == "online" else "offline"
    settings = wandb.Settings(silent=True, console="off", disable_git=True, save_code=False, x_disable_stats=True)
    try:
        run = wandb.init(
            project=PROJECT,
            name=export.run_name,
            id=wandb_id(export.run_id),
            resume="allow",
            dir=str(out_dir),
            mode=mode,
            config=config,
            settings=settings,
            allow_val_change=True,
        )
    except Exception as exc:  # noqa: BLE001 - wandb's own errors (mode, folder): one line
        raise AnalyzerError(f"{out_dir}: cannot start a W&B run ({type(exc).__name__}: {exc})") from None
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for tag, step, value in curve_points(export.tables):
        v = finite(value)
        if v is not None:
            by_step[step][tag] = v
    for step in sorted(by_step):  # W&B steps only go forward
        run.log(by_step[step], step=step)
    for tag, v in summary_figures(export.tables).items():
        run.summary[tag] = v
    files = Path(run.dir)
    for name, text in export.artifacts.items():
        (files / name).write_text(text)
    (files / "tables").mkdir(exist_ok=True)
    for name, table in export.tables.items():
        table.to_csv(files / "tables" / f"{name}.csv", index=False)
    folder = Path(run.settings.sync_dir)
    run.finish()
    wandb.teardown()
    return folder
