"""analyzer export --run-id: the analysis lands in the live run the trainer logged, one run per tracker.

The live runs are logged through reftrain's tracker classes directly (no training: a few steps of
train/* are what the trainer would log), into the example run's own name, as reftrain does.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.api import analyze
from analyzer.errors import AnalyzerError
from analyzer.metrics.curves import training_curves
from analyzer.verbs.export import export_run

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "traces" / "example-ddp-w2"
LIVE_STEPS = [{"step": s, "rank": 0, "loss": 5.0 - s, "step_time_ms": 300.0 + s} for s in range(3)]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("live") / "example-ddp-w2"
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns(".analyzer-cache"))
    return dst


@pytest.fixture(scope="module")
def analysis(run):
    return analyze(run)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analyzer.cli", *args], capture_output=True, text=True, timeout=600)


def _live(name: str, log, run_dir: Path, run_name: str):
    """Open reftrain's live tracker ``name`` as rank 0 of run ``run_name`` and log LIVE_STEPS and a summary."""
    from reftrain.trackers import OPENERS, step_metrics

    tracker = OPENERS[name](log, run_dir, run_name, {"log": {"trackers": name}}, 0)
    for record in LIVE_STEPS:
        tracker.log_step(record["step"], step_metrics(record), 1_700_000_000_000_000_000 + record["step"])
    tracker.finish({"step_time_ms": 301.0}, "completed", LIVE_STEPS[-1]["step"])
    return tracker


def test_mlflow_run_id_attaches_to_the_live_run_once(run, analysis, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="extra trackers (mlflow) not installed")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store only when opted in
    from mlflow.tracking import MlflowClient

    from analyzer.verbs.export.mlflow import write_mlflow
    from reftrain.config import LogConfig

    store = tmp_path / "mlruns"
    uri = store.as_uri()
    live = _live("mlflow", LogConfig(mlflow_uri=str(store)), run, analysis.run_manifest.run_id)
    done = _cli("export", str(run), "--to", "mlflow", uri, "--run-id", live.run_id)
    assert done.returncode == 0, done.stderr
    assert f"logged the analysis into MLflow run {live.run_id}" in done.stderr
    write_mlflow(export_run(analysis), uri, live.run_id)  # a re-export into the live run: nothing new
    client = MlflowClient(tracking_uri=uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    (logged,) = client.search_runs(exps)  # one run: the live one, no run of the analyzer's own
    assert logged.info.run_id == live.run_id and logged.info.status == "FINISHED"
    assert client.get_experiment(logged.info.experiment_id).name == "reftrain"
    rid = logged.info.run_id
    # The trainer's rank 0 record and the analysis's all-ranks curve, side by side under their own names.
    assert [m.value for m in sorted(client.get_metric_history(rid, "train/loss"), key=lambda m: m.step)] == [
        5.0,
        4.0,
        3.0,
    ]
    assert logged.data.metrics["summary/step_time_ms"] == 301.0
    history = sorted(client.get_metric_history(rid, "run/loss"), key=lambda m: m.step)
    want = training_curves(analysis.manifest, analysis.metrics).series("loss")
    assert [m.step for m in history] == want["step"].tolist()  # each step once: the re-export logged nothing
    assert [m.value for m in history] == pytest.approx(want["value"].tolist(), rel=1e-12)
    assert logged.data.metrics["analysis/step_time_ms"] == pytest.approx(analysis.step_time.ms, rel=1e-12)
    assert logged.data.tags["reftrain.run_id"] == analysis.run_manifest.run_id
    assert logged.data.tags["analyzer.run_id"].startswith(analysis.run_manifest.run_id + "@")
    assert {"report.json", "tables"} <= {a.path for a in client.list_artifacts(rid)}
    # A run id the store does not hold, and the live run of another reftrain run: refused (one line on the CLI).
    with pytest.raises(AnalyzerError) as exc:
        write_mlflow(export_run(analysis), uri, "0" * 32)
    assert str(exc.value) == f"{uri}: no MLflow run '{'0' * 32}' (--run-id: the id of a run this store holds)"
    other = _live("mlflow", LogConfig(mlflow_uri=str(store)), run, "another-run")
    with pytest.raises(AnalyzerError, match="was logged by reftrain run 'another-run', not by 'example-ddp-w2'"):
        write_mlflow(export_run(analysis), uri, other.run_id)


def test_tensorboard_run_id_writes_beside_the_live_scalars(run, analysis, tmp_path):
    tbparse = pytest.importorskip("tbparse", reason="extra trackers (tensorboard, tbparse) not installed")
    from analyzer.verbs.export.tensorboard import write_tensorboard
    from reftrain.config import LogConfig

    live_dir = tmp_path / "live-run"  # reftrain's default: RUN_DIR/tb, no run id folder
    _live("tensorboard", LogConfig(), live_dir, analysis.run_manifest.run_id)
    done = _cli("export", str(run), "--to", "tensorboard", str(live_dir), "--run-id", "tb")
    assert done.returncode == 0, done.stderr
    write_tensorboard(export_run(analysis), live_dir, "tb")  # a re-export replaces its own events
    scalars = tbparse.SummaryReader(str(live_dir), extra_columns={"dir_name"}).scalars
    assert scalars["dir_name"].unique().tolist() == ["tb"]  # one TensorBoard run
    tags = set(scalars["tag"])
    assert {"train/loss", "summary/step_time_ms", "run/loss", "analysis/step_time_ms"} <= tags
    live_loss = scalars[scalars["tag"] == "train/loss"].sort_values("step")["value"].tolist()
    assert live_loss == [5.0, 4.0, 3.0]
    mine = scalars[scalars["tag"] == "analysis/step_time_ms"]["value"].tolist()
    assert mine == [pytest.approx(analysis.step_time.ms, rel=1e-6)]  # once: the re-export replaced the first
    # A folder with no live events is not a live run: refused, nothing written.
    with pytest.raises(AnalyzerError) as exc:
        write_tensorboard(export_run(analysis), live_dir, "typo")
    assert str(exc.value) == (
        f"{live_dir / 'typo'}: no TensorBoard event files of a live run there (--run-id names its folder)"
    )
    assert not (live_dir / "typo").exists()
