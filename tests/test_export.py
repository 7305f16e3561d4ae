"""analyzer export --to csv|parquet: tables read back equal the analysis's own values."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from analyzer.api import analyze
from analyzer.errors import AnalyzerError
from analyzer.metrics.curves import training_curves
from analyzer.metrics.throughput import throughput
from analyzer.verbs.export import export_tables, write_tables

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
    # The attribution and memory tables too (a CPU run: no roofline, no module tree in these traces).
    ops = read(out / f"ops.{fmt}")
    assert ops["device_ms"].tolist() == pytest.approx(a.ops()["device_ms"].tolist())
    assert ops["host_ms"].tolist() == pytest.approx(a.ops()["host_ms"].tolist())
    assert read(out / f"collectives.{fmt}").shape[0] == len(a.collectives)
    memory = read(out / f"memory.{fmt}")
    assert memory["peak_allocated_bytes"].tolist() == a.memory.steps["peak_allocated_bytes"].tolist()
    names = "summary, ranks, curves, mfu_steps, stragglers, kernels, ops, collectives, memory"
    assert f"wrote 9 {fmt} table(s) to {out}: " + ", ".join(f"{n}.{fmt}" for n in names.split(", ")) in done.stderr
    assert summary["tokens_per_s"] == pytest.approx(throughput(a.manifest, a.metrics).median, rel=1e-12)


def test_trace_folder_has_no_curves_table(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from dashboard_support import write_gpu_traces

    write_gpu_traces(tmp_path / "gpu")
    tables = export_tables(analyze(tmp_path / "gpu"))
    assert "curves" not in tables and {"summary", "ranks", "kernels"} <= set(tables)


GPU_TRACE = (
    REPO.parent / "shared" / "traces" / "tracelens-samples" / "h100" / "gaunernst_bert-small-uncased__1016001.json.gz"
)


def test_gpu_trace_exports_its_ops_modules_and_roofline(tmp_path):
    if not GPU_TRACE.exists():
        pytest.skip(f"{GPU_TRACE} absent (../shared/traces)")
    a = analyze(GPU_TRACE, cache=False)
    written = write_tables(export_tables(a), "parquet", tmp_path)
    assert {"ops", "modules", "roofline", "memory"} <= {p.stem for p in written}
    for name, want in (("ops", a.ops()), ("modules", a.modules()), ("roofline", a.roofline().ops)):
        got = pq.read_table(tmp_path / f"{name}.parquet").to_pandas()
        assert len(got) == len(want) > 0, name
        assert got["device_ms"].tolist() == pytest.approx(want["device_ms"].tolist()), name


def test_unknown_format_is_one_line(run, tmp_path):
    done = _cli("export", str(run), "--to", "excel", str(tmp_path / "x"))
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == "analyzer: error: export: unknown format 'excel' (one of csv, parquet, tensorboard, wandb, mlflow)"
    )
    assert not (tmp_path / "x").exists()
    # --run-id attaches to a tracker's run: a table export has none (refused before the analysis).
    from analyzer import cli

    with pytest.raises(AnalyzerError) as exc:
        cli.cmd_export(
            cli.build_parser().parse_args(["export", str(run), "--to", "csv", str(tmp_path / "x")] + ["--run-id", "r"])
        )
    assert str(exc.value) == "export: --run-id attaches to a tracker's run (tensorboard, mlflow, wandb), not to csv"
    assert not (tmp_path / "x").exists()


def test_tensorboard_export_reads_back_through_tbparse(run, tmp_path):
    tbparse = pytest.importorskip("tbparse", reason="extra trackers (tensorboard, tbparse) not installed")
    out = tmp_path / "tb"
    done = _cli("export", str(run), "--to", "tensorboard", str(out))
    assert done.returncode == 0, done.stderr
    a = analyze(run)
    name = a.run_manifest.run_id
    assert f"wrote TensorBoard events to {out / name}" in done.stderr
    df = tbparse.SummaryReader(str(out / name)).scalars
    by_tag = {tag: g.sort_values("step") for tag, g in df.groupby("tag")}
    # Event scalars are float32: compare at float32 precision.
    assert by_tag["analysis/mfu"]["value"].iloc[0] == pytest.approx(a.mfu.median, rel=1e-6)
    assert by_tag["analysis/step_time_ms"]["value"].iloc[0] == pytest.approx(a.step_time.ms, rel=1e-6)
    assert by_tag["analysis/tokens_per_s"]["value"].iloc[0] == pytest.approx(
        throughput(a.manifest, a.metrics).median, rel=1e-6
    )
    want = training_curves(a.manifest, a.metrics)
    for metric in ("loss", "lr", "tokens_per_s", "step_time_ms"):
        got = by_tag[f"run/{metric}"]  # over all ranks; train/<field> is the trainer's rank 0 record
        s = want.series(metric)
        assert got["step"].tolist() == s["step"].tolist()
        assert got["value"].tolist() == pytest.approx(s["value"].tolist(), rel=1e-6)
    assert not any(tag.startswith("train/") for tag in by_tag)
    for r in a.ranks:
        assert by_tag[f"rank{r.rank}/exposed_comm_pct"]["value"].iloc[0] == pytest.approx(r.exposed_comm_pct, rel=1e-6)


def test_tensorboard_exports_of_two_runs_are_two_runs_and_a_reexport_replaces_its_own(tmp_path):
    tbparse = pytest.importorskip("tbparse", reason="extra trackers (tensorboard, tbparse) not installed")
    from analyzer.verbs.export import export_run
    from analyzer.verbs.export.tensorboard import write_tensorboard

    out = tmp_path / "tb"
    first, second = analyze(EXAMPLE), analyze(EXAMPLE.with_name("example-ddp-w2-slow-rank1"))
    for a in (first, second, first):  # the first run twice: its second export replaces the first
        write_tensorboard(export_run(a), out)
    scalars = tbparse.SummaryReader(str(out), extra_columns={"dir_name"}).scalars
    assert sorted(scalars["dir_name"].unique()) == ["example-ddp-w2", "example-ddp-w2-slow-rank1"]
    for a in (first, second):
        mine = scalars[(scalars["dir_name"] == a.run_manifest.run_id) & (scalars["tag"] == "analysis/step_time_ms")]
        assert mine["value"].tolist() == [pytest.approx(a.step_time.ms, rel=1e-6)]  # one point: not two exports
    assert len(list((out / "example-ddp-w2").iterdir())) == 1


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
    from analyzer.verbs.export import export_run
    from analyzer.verbs.export.mlflow import write_mlflow

    done = _cli("export", str(run), "--to", "mlflow", uri)
    assert done.returncode == 0, done.stderr
    a = analyze(run)
    write_mlflow(export_run(a), uri)  # the second export updates the run the first created
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("analyzer")
    (logged,) = client.search_runs([exp.experiment_id])
    man = a.run_manifest
    assert logged.info.run_name == man.run_id and logged.data.tags["analyzer.path"] == str(run)
    assert logged.data.tags["analyzer.run_id"] == f"{man.run_id}@{man.start_time}"
    assert logged.data.metrics["analysis/mfu"] == pytest.approx(a.mfu.median, rel=1e-12)
    assert logged.data.tags["analysis.mfu_source"] == a.mfu.source
    history = sorted(client.get_metric_history(logged.info.run_id, "run/loss"), key=lambda m: m.step)
    want = training_curves(a.manifest, a.metrics).series("loss")
    assert [m.step for m in history] == want["step"].tolist()  # each step once: nothing logged twice
    assert [m.value for m in history] == pytest.approx(want["value"].tolist(), rel=1e-12)
    assert len(client.get_metric_history(logged.info.run_id, "analysis/step_time_ms")) == 1
    # The report and every table as artifacts.
    folder = Path(client.download_artifacts(logged.info.run_id, "", str(tmp_path / "artifacts")))
    report = json.loads((folder / "report.json").read_text())
    assert report["run"]["step_time_ms"] == pytest.approx(a.step_time.ms, rel=1e-12)
    assert pd.read_csv(folder / "tables" / "ops.csv")["device_ms"].tolist() == pytest.approx(
        a.ops()["device_ms"].tolist()
    )
