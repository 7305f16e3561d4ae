"""Export to Weights & Biases, offline (``analyzer export RUN --to wandb DIR``), extra ``trackers``.

One W&B run per analyzed run, project ``analyzer``, named after the run,
with a stable id derived from the run's id (:func:`wandb_id`), written
offline into ``DIR/wandb/offline-run-<time>-<id>/`` (no login, no network;
``wandb sync`` uploads it later; ``WANDB_MODE=online`` logs it live
instead): the training curves as history ``run/<metric>`` against their own x axis
``run/step``, the optimizer step (``run.define_metric``, W&B's way to plot
against another step: W&B's own ``_step`` only goes forward, and a live
run is already past the curves' steps), the summary figures as
``run.summary["analysis/<figure>"]`` and each rank's numeric columns as
``run.summary["rank<R>/<column>"]``; the text fields (MFU source, lower
bound, step time source, straggler ranks), the analyzed path and the run's
id go in the run's ``config``; the report (``report.json``, and
``report.html`` where rendered) and every table (``tables/<name>.csv``) are
written into the run's files folder (``run.dir``, uploaded with the run). Values are float64, as the
tables hold them.

Re-export updates the same W&B run: the id is the same, and the run is
resumed (``resume="allow"``). The summary, config and files are replaced;
the curves are logged once: the summary holds ``analysis/curves_digest``
(SHA-1 of the curves' points), and a resumed online run whose summary holds
this export's digest gets no curves again; offline, an earlier export of the
same run id in ``DIR/wandb/`` that ``wandb sync`` has not uploaded yet (no
``.wandb.synced`` mark) is replaced by this one, and when one it has
uploaded holds the same curves (``tables/curves.csv``) they are not logged
again.

``--run-id [[ENTITY/]PROJECT/]ID`` attaches the analysis to that W&B run
instead, the live run the trainer logged (reftrain's id is its run name,
project ``log.wandb_project`` of its config, the default PROJECT here):
resumed with ``resume="must"`` online (W&B fails when the run does not
exist) and ``resume="allow"`` offline (no server to ask; ``wandb sync``
uploads the export into that run id). The trainer's history is
``train/*``, its summary ``summary/*``: the export's names never meet them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Literal

from analyzer.errors import AnalyzerError
from analyzer.verbs.export import CURVE_PREFIX, Export, curve_points, finite, summary_figures, summary_text

EXTRA_LINE = "export to wandb needs the wandb package: pip install 'trainperf[trackers]'"
PROJECT = "analyzer"
STEP = f"{CURVE_PREFIX}step"  # the curves' x axis: the optimizer step
DIGEST = "analysis/curves_digest"


def wandb_id(run_id: str) -> str:
    """The W&B run id of a run: ``analyzer-`` and 16 hex digits of the SHA-1 of its id (W&B ids may not hold
    ``/ \\ # ? % :`` and are at most 64 characters; an id that is a path holds most of them)."""
    return "analyzer-" + hashlib.sha1(run_id.encode()).hexdigest()[:16]


def run_path(export: Export, run_id: str | None) -> tuple[str | None, str, str]:
    """``(entity, project, id)`` of the W&B run the export logs into: its own (:func:`wandb_id`, project
    ``analyzer``), or ``run_id`` = ``[[ENTITY/]PROJECT/]ID`` (project by default the trainer's configured one)."""
    if run_id is None:
        return None, PROJECT, wandb_id(export.run_id)
    parts = run_id.split("/")
    if len(parts) > 3 or not all(parts) or any(c in parts[-1] for c in "\\#?%:"):
        raise AnalyzerError(f"--run-id {run_id!r}: a W&B run is [[ENTITY/]PROJECT/]ID (an id holds none of \\ # ? % :)")
    live_project = (export.config.get("log") or {}).get("wandb_project") or PROJECT
    entity = parts[0] if len(parts) == 3 else None
    project = parts[-2] if len(parts) >= 2 else str(live_project)
    return entity, project, parts[-1]


def curves_digest(by_step: dict[int, dict[str, float]]) -> str:
    """SHA-1 of the curves' points (step, tag, float64 value), the mark of one export's curves in a run's summary."""
    h = hashlib.sha1()
    for step in sorted(by_step):
        for tag, v in sorted(by_step[step].items()):
            h.update(f"{step} {tag} {v!r}\n".encode())
    return h.hexdigest()


def write_wandb(export: Export, out_dir: Path, run_id: str | None = None) -> Path:
    """Log the export as its W&B run, or into the live run ``run_id`` (offline under ``out_dir``); the folder
    of this export."""
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
    entity, project, wid = run_path(export, run_id)
    settings = wandb.Settings(silent=True, console="off", disable_git=True, save_code=False, x_disable_stats=True)
    curves = export.tables.get("curves")
    curves_csv = curves.to_csv(index=False) if curves is not None else None
    uploaded = mode == "offline" and _earlier_exports(out_dir / "wandb", wid, curves_csv)
    try:
        run = wandb.init(
            entity=entity,
            project=project,
            name=export.run_name if run_id is None else None,
            id=wid,
            resume="must" if run_id is not None and mode == "online" else "allow",
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
    digest = curves_digest(by_step)
    if by_step and not uploaded and run.summary.get(DIGEST) != digest:
        run.define_metric(STEP)
        run.define_metric(f"{CURVE_PREFIX}*", step_metric=STEP)
        for step in sorted(by_step):
            run.log({STEP: step, **by_step[step]})
    for tag, v in summary_figures(export.tables).items():
        run.summary[tag] = v
    run.summary[DIGEST] = digest
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


def _earlier_exports(root: Path, wid: str, curves_csv: str | None) -> bool:
    """Remove the earlier offline exports of run ``wid`` under ``root`` that ``wandb sync`` has not uploaded (this
    export replaces them); whether an uploaded one holds these curves (its ``tables/curves.csv``), so that they are
    in the run already. An export's folder holds ``files/report.json``; the trainer's own folders are kept."""
    uploaded = False
    for folder in root.glob(f"offline-run-*-{wid}"):
        if not (folder / "files" / "report.json").is_file():
            continue
        if any(folder.glob("*.wandb.synced")):  # the mark wandb sync leaves beside the log it uploaded
            held = folder / "files" / "tables" / "curves.csv"
            uploaded = uploaded or (curves_csv is not None and held.is_file() and held.read_text() == curves_csv)
            continue
        try:
            shutil.rmtree(folder)
        except OSError as exc:
            raise AnalyzerError(f"{folder}: cannot replace the earlier export ({exc.strerror or exc})") from None
    return uploaded
