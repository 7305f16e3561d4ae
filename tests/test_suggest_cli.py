"""`analyzer suggest` end to end on a real 2-rank CPU reftrain run: ranked suggestions, their JSON,
and an emitted config that reftrain accepts and runs (docs/suggestions.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TIMEOUT_S = 900  # a 2-rank CPU run on a busy 2-core machine


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, **kw)


@pytest.fixture(scope="module")
def micro_batch_1_run(tmp_path_factory) -> Path:
    """tiny preset, micro-batch 1: a step made of fixed costs."""
    runs = tmp_path_factory.mktemp("runs")
    proc = _run(
        [
            str(BIN / "reftrain"),
            "--nproc",
            "2",
            "--runs-dir",
            str(runs),
            "--run-name",
            "mb1",
            "--preset",
            "tiny",
            "--steps",
            "12",
            "--device",
            "cpu",
            "--set",
            "train.micro_batch_size=1",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return runs / "mb1"


def test_suggest_json_and_emitted_config_run(micro_batch_1_run, tmp_path):
    out_json, out_cfg = tmp_path / "s.json", tmp_path / "next.yaml"
    proc = _run(
        [
            str(BIN / "analyzer"),
            "suggest",
            str(micro_batch_1_run),
            "--json",
            str(out_json),
            "--emit-config",
            str(out_cfg),
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert "1. [micro_batch]" in proc.stdout
    doc = json.loads(out_json.read_text())
    assert doc["schema"] == "analyzer.suggestions/1" and doc["run_id"] == "mb1"
    top = doc["suggestions"][0]
    assert {"rule", "evidence", "change", "predicted", "confidence", "trigger"} <= set(top)
    assert top["rule"] == "micro_batch"
    assert top["evidence"]["micro_batch_size"] == 1
    new_mb = top["change"]["overrides"]["train.micro_batch_size"]
    assert new_mb in (2, 4, 8)
    pred = top["predicted"]
    assert pred["tokens_per_step"]["after"] == pred["tokens_per_step"]["before"] * new_mb
    assert pred["mfu"]["after"] == pytest.approx(pred["mfu"]["before"] * (1 + pred["gain"]))
    assert top["change"]["command"] == (
        f"reftrain --nproc 2 --config {micro_batch_1_run / 'config.yaml'} --set train.micro_batch_size={new_mb}"
    )

    # The emitted config: the run's config with the change, a new run name, valid for reftrain as is.
    emitted = yaml.safe_load(out_cfg.read_text())
    original = yaml.safe_load((micro_batch_1_run / "config.yaml").read_text())
    assert emitted["train"]["micro_batch_size"] == new_mb
    assert emitted["run"]["name"] == "mb1-micro-batch"
    emitted["train"]["micro_batch_size"], emitted["run"]["name"] = 1, None
    assert emitted == original  # nothing else changed
    runs = tmp_path / "runs"
    proc = _run([str(BIN / "reftrain"), "--config", str(out_cfg), "--runs-dir", str(runs), "--steps", "2"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((runs / "mb1-micro-batch" / "run.json").read_text())
    assert manifest["status"] == "completed" and manifest["config"]["train"]["micro_batch_size"] == new_mb


def test_pick_beyond_the_list_and_advice_only_picks_are_one_line_errors(micro_batch_1_run, tmp_path, capsys):
    from analyzer.cli import main

    assert main(["suggest", str(micro_batch_1_run), "--emit-config", str(tmp_path / "x.yaml"), "--pick", "99"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "--pick 99" in err
    assert main(["suggest", str(micro_batch_1_run), "--json", str(tmp_path / "s.json")]) == 0
    capsys.readouterr()
    rules = [s["rule"] for s in json.loads((tmp_path / "s.json").read_text())["suggestions"]]
    assert "mfu_gap" in rules  # micro-batch 1 of tiny runs far under its reference MFU
    pick = str(rules.index("mfu_gap") + 1)  # a diagnosis: no reftrain override to apply
    assert main(["suggest", str(micro_batch_1_run), "--emit-config", str(tmp_path / "y.yaml"), "--pick", pick]) == 2
    assert "no reftrain override" in capsys.readouterr().err
    assert not (tmp_path / "y.yaml").exists()


def test_emit_config_refuses_a_non_yaml_name(micro_batch_1_run, tmp_path, capsys):
    from analyzer.cli import main

    assert main(["suggest", str(micro_batch_1_run), "--emit-config", str(tmp_path / "x.json")]) == 2
    assert "YAML" in capsys.readouterr().err


def test_report_carries_the_suggestions(micro_batch_1_run, tmp_path, capsys):
    """`analyzer report` shows the same ranked suggestions in its text, JSON (suggestions[]) and HTML."""
    from analyzer.cli import main

    assert main(["suggest", str(micro_batch_1_run), "--json", str(tmp_path / "s.json")]) == 0
    capsys.readouterr()
    expected = json.loads((tmp_path / "s.json").read_text())["suggestions"]
    report, page = tmp_path / "r.json", tmp_path / "r.html"
    assert main(["report", str(micro_batch_1_run), "--json", str(report), "--html", str(page)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(report.read_text())
    assert [s["rule"] for s in doc["suggestions"]] == [s["rule"] for s in expected]
    top = doc["suggestions"][0]
    assert top["rule"] == "micro_batch" and {"rule", "evidence", "change", "predicted"} <= set(top)
    assert top["predicted"] == expected[0]["predicted"]
    assert "1. [micro_batch]" in text
    assert "micro_batch" in page.read_text()


def test_emitted_config_overlays_the_runs_own_file_and_refuses_unknown_keys(micro_batch_1_run):
    """The overlay is plain YAML over the run's config.yaml (the analyzer never imports reftrain): the keys
    it sets change, comments and everything else of the run's file stay, and a key the file lacks is an error."""
    import dataclasses

    from analyzer.api import analyze
    from analyzer.errors import AnalyzerError
    from analyzer.verbs.suggest import emitted_config_text, suggest

    ra = analyze(micro_batch_1_run)
    top = suggest(ra)[0]
    two = dataclasses.replace(
        top, change=dataclasses.replace(top.change, overrides={"train.micro_batch_size": 2, "data.num_workers": 0})
    )
    emitted = yaml.safe_load(emitted_config_text(ra, two, run_name="next"))
    original = yaml.safe_load((micro_batch_1_run / "config.yaml").read_text())
    assert (emitted["train"]["micro_batch_size"], emitted["data"]["num_workers"], emitted["run"]["name"]) == (
        2,
        0,
        "next",
    )
    for section, key in (("train", "micro_batch_size"), ("data", "num_workers"), ("run", "name")):
        emitted[section][key] = original[section][key]
    assert emitted == original
    bad = dataclasses.replace(top, change=dataclasses.replace(top.change, overrides={"train.no_such_knob": 1}))
    with pytest.raises(AnalyzerError, match="sets train.no_such_knob, which the run's config does not have"):
        emitted_config_text(ra, bad)
