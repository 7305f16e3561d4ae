"""analyzer export --to wandb DIR: an offline W&B run, read back through wandb's own reader, equals the analysis."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analyzer.api import analyze
from analyzer.errors import AnalyzerError
from analyzer.metrics.curves import training_curves
from analyzer.verbs.export import export_run
from analyzer.verbs.export.wandb import run_path, wandb_id, write_wandb

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "traces" / "example-ddp-w2"


@pytest.fixture
def run(tmp_path, monkeypatch) -> Path:
    """A copy of the example run, and no W&B settings from the environment (offline, no login)."""
    pytest.importorskip("wandb", reason="extra trackers (wandb) not installed")
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    dst = tmp_path / "example-ddp-w2"
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns(".analyzer-cache"))
    return dst


def _inspect(folder: Path, *flags: str) -> str:
    """`wandb leet inspect --json`: wandb-core's reader of the run's .wandb transaction log."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("wandb")), "leet", "inspect", "--json", *flags, str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _records(folder: Path) -> tuple[dict, list[dict]]:
    """The run record and the history items of a run's transaction log."""
    records = [json.loads(line) for line in _inspect(folder).splitlines()]
    (run,) = [r["run"] for r in records if r.get("type") == "run"]
    return run, [r["history"]["item"] for r in records if r.get("type") == "history"]


def _assert_export(folder: Path, a, project: str, run_id: str) -> None:
    """The export's run: its id and project, the summary figures, the curves at their optimizer step ``run/step``
    (each step once), the report and tables in its files."""
    record, history = _records(folder)
    assert (record["run_id"], record["project"]) == (run_id, project)
    want = training_curves(a.manifest, a.metrics)
    for metric in ("loss", "lr", "tokens_per_s", "step_time_ms", "mfu"):
        s = want.series(metric)
        got = [(h["run/step"], h[f"run/{metric}"]) for h in history if f"run/{metric}" in h]
        assert got == list(zip(s["step"].tolist(), s["value"].tolist())), metric
    doc = json.loads(_inspect(folder, "--summary"))
    assert doc["state"] == "finished"
    assert doc["config"]["mfu_source"] == a.mfu.source and doc["config"]["analyzer.path"] == str(a.path)
    summary = doc["summary"]
    assert summary["analysis/mfu"] == a.mfu.median
    assert summary["analysis/step_time_ms"] == a.step_time.ms
    for r in a.ranks:
        assert summary[f"rank{r.rank}/exposed_comm_pct"] == r.exposed_comm_pct
    report = json.loads((folder / "files" / "report.json").read_text())
    assert report["run"]["step_time_ms"] == a.step_time.ms
    assert (folder / "files" / "tables" / "summary.csv").is_file()


def test_wandb_export_reads_back_through_wandb(run, tmp_path):
    a = analyze(run)
    out = tmp_path / "wb"
    folder = write_wandb(export_run(a), out)
    assert folder.name.startswith("offline-run-") and folder.parent == out / "wandb"  # no login, no network
    man = a.run_manifest
    _assert_export(folder, a, "analyzer", wandb_id(f"{man.run_id}@{man.start_time}"))
    assert json.loads(_inspect(folder, "--summary"))["name"] == man.run_id


def test_wandb_run_id_resumes_the_live_run_offline(run, tmp_path):
    from reftrain.config import LogConfig
    from reftrain.trackers import OPENERS, step_metrics

    a = analyze(run)
    out = tmp_path / "wb"  # the trainer's W&B dir: the export lands beside its offline run
    live = OPENERS["wandb"](LogConfig(wandb_dir=str(out), wandb_mode="offline"), run, a.run_manifest.run_id, {}, 0)
    for step in range(3):
        live.log_step(step, step_metrics({"step": step, "loss": 5.0 - step}), 0)
    live.finish({"step_time_ms": 301.0}, "completed", 2)
    (live_folder,) = (out / "wandb").glob("offline-run-*")
    done = subprocess.run(
        [sys.executable, "-m", "analyzer.cli", "export", str(run), "--to", "wandb", str(out)]
        + ["--run-id", "reftrain/example-ddp-w2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    first = next(f for f in (out / "wandb").glob("offline-run-*") if f != live_folder)
    assert f"wrote the W&B run {first} (wandb sync uploads it)" in done.stderr
    folder = write_wandb(export_run(a), out, "reftrain/example-ddp-w2")  # replaces the unsynced first export
    assert sorted((out / "wandb").glob("offline-run-*")) == sorted([live_folder, folder])
    # One W&B run: the live run's id and project, which wandb sync joins; the trainer's names stay its own.
    _assert_export(folder, a, "reftrain", "example-ddp-w2")
    # Once wandb sync has uploaded an export (its mark), a re-export of the same curves logs them no more.
    (folder / "run-example-ddp-w2.wandb.synced").touch()
    # W&B names an offline folder by the second the run started: start the next one in a later second.
    time.sleep(1.01 - time.time() % 1.0)
    again = write_wandb(export_run(a), out, "reftrain/example-ddp-w2")
    assert sorted((out / "wandb").glob("offline-run-*")) == sorted([live_folder, folder, again])
    assert not any(k.startswith("run/") for h in _records(again)[1] for k in h)
    record, history = _records(live_folder)
    assert (record["run_id"], record["project"]) == ("example-ddp-w2", "reftrain")
    assert [h["train/loss"] for h in history if "train/loss" in h] == [5.0, 4.0, 3.0]
    assert not any(k.startswith(("train/", "summary/")) for k in json.loads(_inspect(folder, "--summary"))["summary"])
    # The project defaults to the one the trainer's config logged to; a malformed path is one line.
    assert run_path(export_run(a), "example-ddp-w2")[1] == "analyzer"  # this run's config has no log section
    with_log = dataclasses.replace(export_run(a), config={"log": {"wandb_project": "mine"}})
    assert run_path(with_log, "example-ddp-w2") == (None, "mine", "example-ddp-w2")
    assert run_path(with_log, "team/p/x") == ("team", "p", "x")
    with pytest.raises(AnalyzerError, match=r"^--run-id 'a/b/c/d': a W&B run is \[\[ENTITY/\]PROJECT/\]ID"):
        run_path(with_log, "a/b/c/d")


def test_wandb_missing_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    from analyzer import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(Exception) as exc:
        cli.cmd_export(cli.build_parser().parse_args(["export", str(EXAMPLE), "--to", "wandb", str(tmp_path / "w")]))
    assert str(exc.value) == "export to wandb needs the wandb package: pip install 'trainperf[trackers]'"
    assert not (tmp_path / "w").exists()
