"""Export to MLflow (``analyzer export RUN --to mlflow URI``), extra ``trackers``.

One MLflow run per export in experiment ``analyzer`` of the tracking URI
(a file store such as ``file:///tmp/mlruns`` needs no server), through
``mlflow.tracking.MlflowClient``: the training curves as metrics
``train/<metric>`` at their step, the summary as ``analysis/<figure>``, each
rank's numeric columns as ``rank<R>/<column>`` (step 0), and the text
fields (MFU source, lower bound, step time source, straggler ranks) as
params; the run is tagged ``analyzer.path`` with the analyzed path.

MLflow 3 refuses a file store unless ``MLFLOW_ALLOW_FILE_STORE`` is true
(it is in maintenance mode, not removed); a ``file:`` URI or a plain folder
is what a user asking for a file store means, so the export opts in for
this process when the variable is unset.
"""
from __future__ import annotations

import math
import os
import time

import pandas as pd

from analyzer.errors import AnalyzerError
from analyzer.verbs.export import curve_points

EXTRA_LINE = "export to mlflow needs the mlflow package: pip install 'trainperf[trackers]'"
EXPERIMENT = "analyzer"
_BATCH = 1000  # MLflow's log_batch limit on metrics per call


def _num(v) -> float | None:
    if v is None or isinstance(v, (bool, str)) or pd.isna(v):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def write_mlflow(tables: dict[str, pd.DataFrame], uri: str, run_name: str, path_text: str) -> str:
    """Log the tables as one MLflow run; its run id."""
    try:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise AnalyzerError(EXTRA_LINE) from None
    if "://" not in uri or uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(EXPERIMENT)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(EXPERIMENT)
        run = client.create_run(exp_id, run_name=run_name, tags={"analyzer.path": path_text})
    except Exception as exc:  # noqa: BLE001 - any store error is the URI's problem, one line
        raise AnalyzerError(f"{uri}: cannot open the MLflow tracking store ({type(exc).__name__}: {exc})") from None
    now = int(time.time() * 1000)
    metrics: list = []
    for tag, step, value in curve_points(tables):
        v = _num(value)
        if v is not None:
            metrics.append(Metric(tag, v, now, step))
    summary = tables["summary"].iloc[0]
    for col in ("mfu", "hfu", "step_time_ms", "flop_coverage"):
        v = _num(summary.get(col))
        if v is not None:
            metrics.append(Metric(f"analysis/{col}", v, now, 0))
    ranks = tables.get("ranks")
    if ranks is not None:
        for row in ranks.to_dict("records"):
            for col, value in row.items():
                v = _num(value) if col not in ("rank", "n_steps") else None
                if v is not None:
                    metrics.append(Metric(f"rank{row['rank']}/{col}", v, now, 0))
    params = [Param(k, str(summary.get(k))) for k in ("mfu_source", "mfu_lower_bound", "step_time_source", "straggler_ranks")]
    for i in range(0, len(metrics), _BATCH):
        client.log_batch(run.info.run_id, metrics=metrics[i:i + _BATCH], params=params if i == 0 else [])
    if not metrics:
        client.log_batch(run.info.run_id, params=params)
    client.set_terminated(run.info.run_id)
    return run.info.run_id
