"""analyzer export --to csv|parquet: tables read back equal the analysis's own values."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from analyzer.api import analyze
from analyzer.metrics.curves import training_curves
from analyzer.verbs.export import export_tables

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "traces" / "example-ddp-w2"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("export") / "run"
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns(".analyzer-cache"))
    return dst


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analyzer.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_round_trips_through_the_formats_reader(run, tmp_path, fmt):
    out = tmp_path / fmt
    done = _cli("export", str(run), "--to", fmt, str(out))
    assert done.returncode == 0, done.stderr
    a = analyze(run)
    read = (lambda p: pd.read_csv(p)) if fmt == "csv" else (lambda p: pq.read_table(p).to_pandas())
    summary = read(out / f"summary.{fmt}").iloc[0]
    assert summary["mfu"] == pytest.approx(a.mfu.median, rel=1e-12)
    assert summary["mfu_source"] == a.mfu.source
    assert summary["step_time_ms"] == pytest.approx(a.step_time.ms, rel=1e-12)
    curves = read(out / f"curves.{fmt}")
    want = training_curves(a.manifest, a.metrics).wide()
    for col in ("loss", "lr", "tokens_per_s", "mfu", "step_time_ms", "mem_bytes"):
        assert curves[col].tolist() == pytest.approx(want[col].tolist(), rel=1e-12)
    assert curves["profiled"].tolist() == want["profiled"].tolist()
    ranks = read(out / f"ranks.{fmt}")
    assert ranks["rank"].tolist() == [r.rank for r in a.ranks]
    assert ranks["exposed_comm_pct"].tolist() == pytest.approx([r.exposed_comm_pct for r in a.ranks])
    kernels = read(out / f"kernels.{fmt}")
    assert len(kernels) and kernels["ms_per_rank"].is_monotonic_decreasing
    assert "wrote 6" in done.stderr


def test_trace_folder_has_no_curves_table(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from dashboard_support import write_gpu_traces

    write_gpu_traces(tmp_path / "gpu")
    tables = export_tables(analyze(tmp_path / "gpu"))
    assert "curves" not in tables and {"summary", "ranks", "kernels"} <= set(tables)


def test_unknown_format_is_one_line(run, tmp_path):
    done = _cli("export", str(run), "--to", "excel", str(tmp_path / "x"))
    assert done.returncode == 2
    assert done.stderr.strip() == "analyzer: error: export: unknown format 'excel' (one of csv, parquet, tensorboard, wandb, mlflow)"
    assert not (tmp_path / "x").exists()


def test_tensorboard_export_reads_back_through_tbparse(run, tmp_path):
    tbparse = pytest.importorskip("tbparse", reason="extra trackers (tensorboard, tbparse) not installed")
    out = tmp_path / "tb"
    done = _cli("export", str(run), "--to", "tensorboard", str(out))
    assert done.returncode == 0, done.stderr
    a = analyze(run)
    df = tbparse.SummaryReader(str(out)).scalars
    by_tag = {tag: g.sort_values("step") for tag, g in df.groupby("tag")}
    # Event scalars are float32: compare at float32 precision.
    assert by_tag["analysis/mfu"]["value"].iloc[0] == pytest.approx(a.mfu.median, rel=1e-6)
    assert by_tag["analysis/step_time_ms"]["value"].iloc[0] == pytest.approx(a.step_time.ms, rel=1e-6)
    want = training_curves(a.manifest, a.metrics)
    for metric in ("loss", "lr", "tokens_per_s", "step_time_ms"):
        got = by_tag[f"train/{metric}"]
        s = want.series(metric)
        assert got["step"].tolist() == s["step"].tolist()
        assert got["value"].tolist() == pytest.approx(s["value"].tolist(), rel=1e-6)
    for r in a.ranks:
        assert by_tag[f"rank{r.rank}/exposed_comm_pct"]["value"].iloc[0] == pytest.approx(r.exposed_comm_pct, rel=1e-6)


def test_tensorboard_missing_names_the_extra(run, tmp_path, monkeypatch):
    import importlib.util

    from analyzer import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(Exception) as exc:
        cli.cmd_export(cli.build_parser().parse_args(["export", str(run), "--to", "tensorboard", str(tmp_path / "t")]))
    assert str(exc.value) == "export to tensorboard needs the tensorboard package: pip install 'trainperf[trackers]'"


def test_mlflow_export_reads_back_through_mlflowclient(run, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="extra trackers (mlflow) not installed")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store only when opted in
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()  # a file store: no server, no network
    done = _cli("export", str(run), "--to", "mlflow", uri)
    assert done.returncode == 0, done.stderr
    a = analyze(run)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("analyzer")
    (logged,) = client.search_runs([exp.experiment_id])
    assert logged.info.run_name == run.name and logged.data.tags["analyzer.path"] == str(run)
    assert logged.data.metrics["analysis/mfu"] == pytest.approx(a.mfu.median, rel=1e-12)
    assert logged.data.params["mfu_source"] == a.mfu.source
    history = sorted(client.get_metric_history(logged.info.run_id, "train/loss"), key=lambda m: m.step)
    want = training_curves(a.manifest, a.metrics).series("loss")
    assert [m.step for m in history] == want["step"].tolist()
    assert [m.value for m in history] == pytest.approx(want["value"].tolist(), rel=1e-12)
