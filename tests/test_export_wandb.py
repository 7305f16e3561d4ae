"""analyzer export --to wandb DIR: an offline W&B run, read back through wandb's own reader, equals the analysis."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.api import analyze
from analyzer.metrics.curves import training_curves
from analyzer.verbs.export.wandb import wandb_id

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "traces" / "example-ddp-w2"


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "analyzer.cli", *args], capture_output=True, text=True, timeout=600, env=env
    )


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


def test_wandb_export_reads_back_through_wandb(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="extra trackers (wandb) not installed")
    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run, ignore=shutil.ignore_patterns(".analyzer-cache"))
    out = tmp_path / "wb"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("WANDB_")}
    for _ in range(2):  # a re-export is the same W&B run (same id), in a folder of its own
        done = _cli("export", str(run), "--to", "wandb", str(out), env=env)
        assert done.returncode == 0, done.stderr
    folders = sorted((out / "wandb").glob("*-run-*"))
    assert len(folders) == 2 and all(f.name.startswith("offline-run-") for f in folders)  # no login, no network
    folder = folders[-1]
    assert f"wrote the W&B run {folder}" in done.stderr
    a = analyze(run)
    man = a.run_manifest
    docs = [json.loads(_inspect(f, "--summary")) for f in folders]
    assert docs[0]["run_id"] == docs[1]["run_id"] == wandb_id(f"{man.run_id}@{man.start_time}")
    doc = docs[1]
    assert doc["name"] == man.run_id and doc["project"] == "analyzer" and doc["state"] == "finished"
    assert doc["config"]["mfu_source"] == a.mfu.source and doc["config"]["analyzer.path"] == str(run)
    summary = doc["summary"]
    assert summary["analysis/mfu"] == a.mfu.median
    assert summary["analysis/step_time_ms"] == a.step_time.ms
    for r in a.ranks:
        assert summary[f"rank{r.rank}/exposed_comm_pct"] == r.exposed_comm_pct
    history = [
        json.loads(line)["history"]["item"]
        for line in _inspect(folder).splitlines()
        if json.loads(line).get("type") == "history"
    ]
    want = training_curves(a.manifest, a.metrics)
    for metric in ("loss", "lr", "tokens_per_s", "step_time_ms", "mfu"):
        s = want.series(metric)
        got = [(h["_step"], h[f"run/{metric}"]) for h in history if f"run/{metric}" in h]
        assert got == list(zip(s["step"].tolist(), s["value"].tolist())), metric
    # The report and every table in the run's files.
    report = json.loads((folder / "files" / "report.json").read_text())
    assert report["run"]["step_time_ms"] == a.step_time.ms
    assert (folder / "files" / "tables" / "summary.csv").is_file()


def test_wandb_missing_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    from analyzer import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(Exception) as exc:
        cli.cmd_export(cli.build_parser().parse_args(["export", str(EXAMPLE), "--to", "wandb", str(tmp_path / "w")]))
    assert str(exc.value) == "export to wandb needs the wandb package: pip install 'trainperf[trackers]'"
    assert not (tmp_path / "w").exists()
