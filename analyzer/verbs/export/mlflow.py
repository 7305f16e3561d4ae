"""Export to MLflow (``analyzer export RUN --to mlflow URI``), extra ``trackers``.

One MLflow run per analyzed run in experiment ``analyzer`` of the tracking
URI (a file store such as ``file:///tmp/mlruns`` needs no server), through
``mlflow.tracking.MlflowClient``: the training curves as metrics
``run/<metric>`` at their step, the summary as ``analysis/<figure>`` and
each rank's numeric columns as ``rank<R>/<column>`` (step 0), the text
fields (MFU source, lower bound, step time source, straggler ranks) as tags
``analysis.<field>``, the report as artifacts ``report.json`` (and
``report.html``), every table as ``tables/<name>.csv``; tags
``analyzer.run_id`` (the run's stable id, :class:`analyzer.verbs.export.Export`)
and ``analyzer.path``.

Re-export updates that run instead of creating another: the run is found by
its ``analyzer.run_id`` tag, and only the points it does not hold yet (or
holds with another value) are logged, so exporting an unchanged analysis
twice leaves the run as it was; the tags and artifacts are overwritten.

``--run-id RUN_ID`` attaches the analysis to that MLflow run instead (the
live run the trainer logged, in whatever experiment): the same metrics,
tags and artifacts, beside the trainer's ``train/*`` and ``summary/*``, the
run's status and end time left as the trainer set them. A run whose
``analyzer.run_id`` names another analyzed run, or whose ``reftrain.run_id``
names another reftrain run, is refused: its points would mix with this
run's. Re-export into it is idempotent as above.

MLflow 3 refuses a file store unless ``MLFLOW_ALLOW_FILE_STORE`` is true
(it is in maintenance mode, not removed); a ``file:`` URI or a plain folder
is what a user asking for a file store means, so the export opts in for
this process when the variable is unset.
"""

from __future__ import annotations

import io
import os
import time

from analyzer.errors import AnalyzerError
from analyzer.verbs.export import Export, curve_points, finite, summary_figures, summary_text

EXTRA_LINE = "export to mlflow needs the mlflow package: pip install 'trainperf[trackers]'"
EXPERIMENT = "analyzer"
RUN_ID_TAG = "analyzer.run_id"
_BATCH = 1000  # MLflow's log_batch limit on metrics per call


def write_mlflow(export: Export, uri: str, run_id: str | None = None) -> str:
    """Log the export into its MLflow run (``run_id``, else found by its ``analyzer.run_id`` tag, else created);
    the MLflow run id."""
    try:
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise AnalyzerError(EXTRA_LINE) from None
    if "://" not in uri or uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        client = MlflowClient(tracking_uri=uri)
        live = run_id is not None
        if run_id is not None:
            _check_live_run(client, uri, run_id, export)
            existing = True
        else:
            exp = client.get_experiment_by_name(EXPERIMENT)
            exp_id = exp.experiment_id if exp is not None else client.create_experiment(EXPERIMENT)
            found = client.search_runs(
                [exp_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{_quoted(export.run_id)}'", max_results=1
            )
            existing = bool(found)
            if found:
                run_id = found[0].info.run_id
                client.update_run(run_id, status="RUNNING")
            else:
                run_id = client.create_run(
                    exp_id, run_name=export.run_name, tags={RUN_ID_TAG: export.run_id}
                ).info.run_id
    except AnalyzerError:
        raise
    except Exception as exc:  # noqa: BLE001 - any store error is the URI's problem, one line
        raise AnalyzerError(f"{uri}: cannot open the MLflow tracking store ({type(exc).__name__}: {exc})") from None
    now = int(time.time() * 1000)
    curves = [(tag, step, v) for tag, step, value in curve_points(export.tables) if (v := finite(value)) is not None]
    wanted = curves + [(tag, 0, v) for tag, v in summary_figures(export.tables).items()]
    held = _held(client, run_id, {tag for tag, _, _ in curves}) if existing else {}
    metrics = [Metric(tag, v, now, step) for tag, step, v in wanted if held.get((tag, step)) != v]
    for i in range(0, len(metrics), _BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + _BATCH])
    client.set_tag(run_id, RUN_ID_TAG, export.run_id)
    client.set_tag(run_id, "analyzer.path", export.path_text)
    for key, text in summary_text(export.tables).items():
        client.set_tag(run_id, f"analysis.{key}", text)
    for name, text in export.artifacts.items():
        client.log_text(run_id, text, name)
    for name, table in export.tables.items():
        buf = io.StringIO()
        table.to_csv(buf, index=False)
        client.log_text(run_id, buf.getvalue(), f"tables/{name}.csv")
    if not live:  # the live run's status is the trainer's
        client.set_terminated(run_id)
    return run_id


def _check_live_run(client, uri: str, run_id: str, export: Export) -> None:
    """The MLflow run ``run_id`` to attach the export to; AnalyzerError when it is absent or holds another run."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise AnalyzerError(
                f"{uri}: no MLflow run {run_id!r} (--run-id: the id of a run this store holds)"
            ) from None
        raise
    tags = run.data.tags
    if tags.get(RUN_ID_TAG, export.run_id) != export.run_id:
        raise AnalyzerError(
            f"{uri}: MLflow run {run_id} holds the analysis of {tags[RUN_ID_TAG]}, not of {export.run_id}"
        )
    trainer_run = tags.get("reftrain.run_id")
    if trainer_run is not None and export.run_name != trainer_run:
        raise AnalyzerError(
            f"{uri}: MLflow run {run_id} was logged by reftrain run {trainer_run!r}, not by {export.run_name!r}"
        )


def _quoted(text: str) -> str:
    """``text`` inside a single-quoted MLflow search string (a quote doubled, SQL style)."""
    return text.replace("'", "''")


def _held(client, run_id: str, curve_tags: set[str]) -> dict[tuple[str, int], float]:
    """``(tag, step) -> value`` of the metrics the run already holds: every step of the curves' tags (their
    histories), step 0 of the others (their latest value; the one-number figures are logged at step 0 only)."""
    latest = client.get_run(run_id).data.metrics
    held = {(tag, 0): value for tag, value in latest.items() if tag not in curve_tags}
    for tag in sorted(curve_tags & set(latest)):
        for m in sorted(client.get_metric_history(run_id, tag), key=lambda m: m.timestamp):
            held[(tag, m.step)] = m.value
    return held
