"""`reftrain --log tensorboard,wandb,mlflow`: what rank 0 logged, read back through each tracker's own reader.

One real 2-rank CPU run (gloo, tiny model, 4 steps, no profiler, a given
peak so no matmul is measured) logs to all three trackers at their default
places inside the run directory; the values read back must equal rank 0's
metrics/rank0.jsonl (TensorBoard scalars are float32 in the event format:
equal to the record's value rounded to float32), the config must equal
config.yaml, and the summary must equal the figures recomputed from the
metrics lines. The start-up errors and the failure handling run in-process.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reftrain import cli
from reftrain.config import LogConfig
from reftrain.errors import ReftrainError
from reftrain import trackers as trk

STEPS = 4
WARMUP = 1
RECORD_FIELDS = (
    "loss",
    "lr",
    "grad_norm",
    "step_time_ms",
    "tokens_per_s",
    "mfu",
    "hfu",
    "mem_bytes",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "data_wait_ms",
    "comm_ms",
    "cpu_ms",
    "tokens",
)


def _have(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory) -> Path:
    if not _have("tensorboard", "tbparse", "wandb", "mlflow"):
        pytest.skip("extra trackers (tensorboard, tbparse, wandb, mlflow) not installed")
    runs = tmp_path_factory.mktemp("runs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["NETRC"] = str(runs / "no-netrc")  # no W&B login here, whatever the machine has: offline mode
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "reftrain",
            "--nproc",
            "2",
            "--runs-dir",
            str(runs),
            "--run-name",
            "logged",
            "--preset",
            "tiny",
            "--steps",
            str(STEPS),
            "--peak-flops",
            "1e12",
            "--log",
            "tensorboard,wandb,mlflow",
            "--set",
            "profile.enabled=false",
            "--set",
            "data.num_workers=0",
            "--set",
            f"train.warmup_steps={WARMUP}",
        ],
        cwd=runs,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, f"reftrain failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "reftrain: warning:" not in proc.stderr, proc.stderr  # no tracker failed
    return runs / "logged"


def _rank0(run: Path) -> list[dict]:
    return read_jsonl(run / "metrics" / "rank0.jsonl")


def _expected_summary(run: Path) -> dict:
    """run_summary()'s figures: the report's (docs/metrics.md), step time and tokens/s recomputed here from
    the metrics lines and run.json (steady: step >= warm-up, no profiler; per step the mean over ranks, then
    the median over steps), MFU and HFU as the analyzer's report gives them."""
    from analyzer import analyze

    per_rank = [read_jsonl(run / "metrics" / f"rank{r}.jsonl") for r in (0, 1)]
    steady = [[x for x in recs if x["step"] >= WARMUP and not x["profiled"]] for recs in per_rank]
    steps = sorted({x["step"] for recs in steady for x in recs})
    times = {s: [x["step_time_ms"] for recs in steady for x in recs if x["step"] == s] for s in steps}
    tokens_per_step = json.loads((run / "run.json").read_text())["tokens_per_step"]
    report = analyze(run)
    return {
        "steps_run": STEPS,
        "steady_steps": STEPS - WARMUP,
        "step_time_ms": statistics.median(statistics.fmean(t) for t in times.values()),
        "tokens_per_s": statistics.median(
            statistics.fmean(tokens_per_step / (ms / 1e3) for ms in t) for t in times.values()
        ),
        "mfu": report.mfu.median,
        "hfu": report.mfu.hfu_median,
        "final_loss": per_rank[0][-1]["loss"],
    }


def _f32(x: float) -> float:
    import numpy as np

    return float(np.float32(x))


@pytest.mark.slow
def test_tensorboard_scalars_hparams_and_summary(logged_run: Path) -> None:
    import tbparse

    reader = tbparse.SummaryReader(str(logged_run / "tb"))
    scalars = reader.scalars
    records = _rank0(logged_run)
    for field in RECORD_FIELDS:
        got = scalars[scalars["tag"] == f"train/{field}"].sort_values("step")
        assert got["step"].tolist() == [r["step"] for r in records], field
        assert got["value"].tolist() == [_f32(r[field]) for r in records], field
    assert not (scalars["tag"] == "train/rank").any() and not (scalars["tag"] == "train/time_ns").any()
    summary = {
        tag.removeprefix("summary/"): v
        for tag, v in scalars[scalars["tag"].str.startswith("summary/")][["tag", "value"]].itertuples(index=False)
    }
    for key, want in _expected_summary(logged_run).items():
        assert summary[key] == _f32(want), key
    # hparams plugin: the flattened config.yaml (nulls left out), bools as bools
    config = yaml.safe_load((logged_run / "config.yaml").read_text())
    hp = dict(zip(reader.hparams["tag"], reader.hparams["value"]))
    want = {k: v for k, v in trk.flat_config(config).items() if v is not None}
    assert hp.keys() == want.keys()
    for key, value in want.items():
        assert hp[key] == value and type(hp[key]) is (bool if isinstance(value, bool) else type(hp[key])), key
    assert hp["log.trackers"] == "tensorboard,wandb,mlflow" and hp["model.n_layers"] == 2


def _wandb_inspect(folder: Path, *flags: str):
    """wandb's own reader of a .wandb transaction log (`wandb leet inspect --json`, wandb-core)."""
    wandb_cli = Path(sys.executable).with_name("wandb")
    done = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--json", *flags, str(folder)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_wandb_offline_run_history_config_and_summary(logged_run: Path) -> None:
    (folder,) = (logged_run / "wandb").glob("*-run-*")
    assert folder.name.startswith("offline-run-") and folder.name.endswith("-logged")  # offline, id = run name
    summary_doc = json.loads(_wandb_inspect(folder, "--summary"))
    assert summary_doc["run_id"] == "logged" and summary_doc["project"] == "reftrain"
    assert summary_doc["state"] == "finished" and summary_doc["exit_code"] == 0
    assert summary_doc["config"] == yaml.safe_load((logged_run / "config.yaml").read_text())
    summary = summary_doc["summary"]
    for key, want in _expected_summary(logged_run).items():
        assert summary[f"summary/{key}"] == want, key
    assert summary["summary/status"] == "completed"
    history = [
        json.loads(line)["history"]["item"]
        for line in _wandb_inspect(folder).splitlines()
        if json.loads(line).get("type") == "history"
    ]
    records = _rank0(logged_run)
    assert [h["_step"] for h in history] == [r["step"] for r in records]
    for h, r in zip(history, records):
        for field in RECORD_FIELDS:
            assert h[f"train/{field}"] == r[field], (r["step"], field)


@pytest.mark.slow
def test_mlflow_params_metrics_and_summary(logged_run: Path, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store only when opted in
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(logged_run / "mlruns").as_uri())
    exp = client.get_experiment_by_name("reftrain")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "logged" and run.info.status == "FINISHED"
    assert run.data.tags["reftrain.run_id"] == "logged" and run.data.tags["reftrain.status"] == "completed"
    config = yaml.safe_load((logged_run / "config.yaml").read_text())
    assert run.data.params == {k: trk.param_text(v) for k, v in trk.flat_config(config).items()}
    assert run.data.params["optim.lr"] == "0.001" and run.data.params["inject.slow_rank"] == "null"
    records = _rank0(logged_run)
    for field in RECORD_FIELDS:
        history = sorted(client.get_metric_history(run.info.run_id, f"train/{field}"), key=lambda m: m.step)
        assert [m.step for m in history] == [r["step"] for r in records], field
        assert [m.value for m in history] == [float(r[field]) for r in records], field
        assert [m.timestamp for m in history] == [r["time_ns"] // 1_000_000 for r in records]
    for key, want in _expected_summary(logged_run).items():
        assert run.data.metrics[f"summary/{key}"] == want, key


# ---------------------------------------------------------------------------
# Start-up errors, failures, modes: in-process, no training
# ---------------------------------------------------------------------------


def _main_stderr(capsys, *argv: str) -> tuple[int, list[str]]:
    rc = cli.main(list(argv))
    return rc, capsys.readouterr().err.splitlines()


def test_unknown_tracker_is_one_line(tmp_path, capsys) -> None:
    rc, err = _main_stderr(capsys, "--log", "tensorboard,foo", "--runs-dir", str(tmp_path / "runs"))
    assert rc == 1
    assert err == ["reftrain: error: --log tensorboard,foo: unknown tracker 'foo' (known: tensorboard, wandb, mlflow)"]
    rc, err = _main_stderr(capsys, "--set", "log.trackers=bar", "--runs-dir", str(tmp_path / "runs"))
    assert rc == 1 and err == [
        "reftrain: error: config: log.trackers: unknown tracker 'bar' (known: tensorboard, wandb, mlflow)"
    ]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["tensorboard", "wandb", "mlflow"])
def test_absent_library_names_the_extra(tmp_path, capsys, monkeypatch, name) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda mod, *a: None if mod == name else real(mod, *a))
    rc, err = _main_stderr(capsys, "--nproc", "2", "--log", f"mlflow,{name}", "--runs-dir", str(tmp_path / "runs"))
    assert rc == 1
    assert err == [f"reftrain: error: --log {name} needs the {name} package: pip install 'trainperf[trackers]'"]
    assert not (tmp_path / "runs").exists()  # before the run directory and any rank


class _Broken:
    """A tracker whose every step write raises (a full disk, a server gone)."""

    def __init__(self, *args) -> None:
        self.steps: list[int] = []
        self.finished: list[str] = []

    def log_step(self, step, metrics, time_ns) -> None:
        self.steps.append(step)
        raise OSError(28, "No space left on device")

    def finish(self, summary, status, step) -> None:
        self.finished.append(status)


def test_failing_tracker_warns_once_and_training_goes_on(tmp_path, capsys, monkeypatch) -> None:
    pytest.importorskip("mlflow", reason="extra trackers (mlflow) not installed")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    broken = _Broken()
    good = _Broken()
    good.log_step = lambda step, metrics, time_ns: good.steps.append(step)  # type: ignore[method-assign]
    monkeypatch.setattr(trk, "OPENERS", {**trk.OPENERS, "tensorboard": lambda *a: broken, "wandb": lambda *a: good})
    log = LogConfig(trackers="mlflow,tensorboard,wandb", mlflow_uri=str(blocker / "mlruns"))
    t = trk.Trackers(log, tmp_path, rank=0)
    t.start({"train": {"steps": 2}}, "r", attempt=0)  # MLflow cannot create its store under a file
    for step in range(3):
        t.log_step({"step": step, "rank": 0, "loss": 1.5, "profiled": False, "mem_kind": "rss", "time_ns": 1})
    t.finish({"status": "completed", "mfu": 0.5}, "completed")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err == t.warnings
    assert err[0].startswith("reftrain: warning: mlflow: could not start (") and err[0].endswith(
        "); not logging to mlflow, training continues"
    )
    assert err[1] == (
        "reftrain: warning: tensorboard: logging step 0 failed (OSError: [Errno 28] No space left on "
        "device); not logging to tensorboard, training continues"
    )
    assert broken.steps == [0] and broken.finished == ["failed"]  # dropped after its first failure, closed
    assert good.steps == [0, 1, 2] and good.finished == ["completed"]  # the others went on


def test_other_ranks_log_nothing(tmp_path) -> None:
    t = trk.Trackers(LogConfig(trackers="tensorboard,wandb,mlflow"), tmp_path, rank=1)
    t.start({}, "r", 0)
    t.log_step({"step": 0, "loss": 1.0})
    t.finish(None, "completed")
    assert t.names == [] and list(tmp_path.iterdir()) == []


def test_step_metrics_are_the_numeric_fields() -> None:
    record = {
        "step": 3,
        "rank": 0,
        "loss": 2.5,
        "tokens": 256,
        "grad_norm": None,
        "profiled": True,
        "mem_kind": "rss",
        "time_ns": 10,
        "attempt": 0,
        "mfu": math.nan,
    }
    assert trk.step_metrics(record) == {"train/loss": 2.5, "train/tokens": 256.0}


def test_wandb_mode(tmp_path) -> None:
    auto = LogConfig()
    none = {"NETRC": str(tmp_path / "absent")}
    assert trk.wandb_mode(auto, none) == "offline"  # no login: offline, nothing needs the network
    assert trk.wandb_mode(auto, {**none, "WANDB_API_KEY": "k"}) == "online"
    assert trk.wandb_mode(auto, {**none, "WANDB_API_KEY": "k", "WANDB_MODE": "offline"}) == "offline"
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    assert trk.wandb_mode(auto, {"NETRC": str(netrc_file)}) == "online"
    assert trk.wandb_mode(auto, {"NETRC": str(netrc_file), "WANDB_BASE_URL": "https://wandb.example.com"}) == "offline"
    assert trk.wandb_mode(LogConfig(wandb_mode="offline"), {"WANDB_API_KEY": "k"}) == "offline"
    assert trk.wandb_run_id("a:b/c#d") == "a-b-c-d"


def test_wandb_mode_from_the_environment_is_one_wandb_knows(tmp_path) -> None:
    none = {"NETRC": str(tmp_path / "absent")}
    # W&B's older names for offline and online.
    assert trk.wandb_mode(LogConfig(), {**none, "WANDB_MODE": "dryrun"}) == "offline"
    assert trk.wandb_mode(LogConfig(), {**none, "WANDB_MODE": "run"}) == "online"
    with pytest.raises(ReftrainError, match=r"W&B mode 'offlne' .*expected one of online, offline, disabled, shared"):
        trk.wandb_mode(LogConfig(), {**none, "WANDB_MODE": "offlne"})


def test_mlflow_uri(tmp_path) -> None:
    assert trk.mlflow_uri(LogConfig(), tmp_path) == (tmp_path / "mlruns").resolve().as_uri()
    assert trk.mlflow_uri(LogConfig(mlflow_uri="http://mlflow:5000"), tmp_path) == "http://mlflow:5000"
    assert trk.mlflow_uri(LogConfig(mlflow_uri=str(tmp_path / "store")), tmp_path) == (tmp_path / "store").as_uri()
