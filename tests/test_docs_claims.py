"""README and docs claims a user can check from a clone: the analyzer benchmark without ``../shared``,
``reftrain --help``'s defaults, and the exit codes docs/cli.md gives for runs of different kinds."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _bench_analyzer(monkeypatch):
    """bench/bench_analyzer.py as a module (it puts bench/ on sys.path; restored after the test)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location("bench_analyzer", REPO / "bench" / "bench_analyzer.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_analyzer", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_bench_analyzer_falls_back_to_the_repository_runs(tmp_path, monkeypatch, capsys):
    bench = _bench_analyzer(monkeypatch)
    folders, with_hta = bench.choose_folders(tmp_path / "out", quick=False, shared=tmp_path / "absent")
    assert not with_hta  # HTA's breakdown fails on CPU traces
    assert folders == {name: tmp_path / "out" / "repo-runs" / name for name in bench.REPO_RUNS}
    for name, path in folders.items():  # copies: the analyzer's caches must not land in the working tree
        assert sorted(p.name for p in (path / "traces").glob("*.json.gz")) == sorted(
            p.name for p in (REPO / "traces" / name / "traces").glob("*.json.gz")
        )
    err = capsys.readouterr().err
    assert f"{tmp_path / 'absent'}: not found" in err
    assert "https://github.com/facebookresearch/HolisticTraceAnalysis" in err


def test_bench_analyzer_quick_runs_without_shared(tmp_path):
    """``--quick``: the first example run, one repeat, cold, warm and tables, no HTA (a few seconds)."""
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_analyzer.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    (row,) = json.loads((out / "bench_analyzer.json").read_text())["summary"]
    assert row["folder"] == "example-ddp-w2" and "hta" not in row
    for tool in ("analyzer-cold", "analyzer-warm", "analyzer-tables"):
        assert row[tool]["failed_runs"] == 0
    # The replay imports no pandas and reads no trace: over 10x less CPU than the cold analysis on any load.
    assert row["analyzer-warm"]["cpu_s"] < row["analyzer-cold"]["cpu_s"]
    report = json.loads((out / "example-ddp-w2.report.json").read_text())
    assert report["schema"].startswith("analyzer.report/") and len(report["ranks"]) == 2


def test_reftrain_help_shows_the_config_defaults():
    from reftrain.cli import _FLAG_KEYS, build_parser
    from reftrain.config import Config

    text = " ".join(build_parser().format_help().split())  # argparse wraps lines
    config = Config()
    assert "--steps N optimizer steps (train.steps) (default: 20)" in text
    assert f"(model.preset) (default: {config.model.preset})" in text
    assert "(default: deterministic synthetic stream)" in text  # data.path's null, as its config help says
    assert "checkpoint (default: 0)" in text  # --max-restarts, an argparse default
    shown = 0
    for dest, key in _FLAG_KEYS.items():
        section, name = key.split(".")
        value = getattr(getattr(config, section), name)
        if value not in (None, "", False):
            assert f"({key}) (default: {value})" in text or f"{key} (default: {value})" in text, key
            shown += 1
    assert shown >= 5
    # the flags themselves stay unset, so a config file's values are kept
    args = build_parser().parse_args([])
    assert all(getattr(args, dest) is None for dest in _FLAG_KEYS)


def test_cli_doc_gives_the_exit_code_of_runs_of_different_kinds():
    """docs/cli.md: ``compare`` shows the deltas of a run directory and a trace folder (exit 0); only ``check``
    refuses the pair (exit 2). tests/test_cli.py's end-to-end gate runs both commands on such a pair."""
    row = next(x for x in (REPO / "docs" / "cli.md").read_text().splitlines() if x.startswith("| 2 |"))
    assert "`check` only: runs it cannot gate (a run directory against a trace folder" in row
    assert "`compare` shows their deltas and exits 0" in row
    cli_test = (REPO / "tests" / "test_cli.py").read_text()
    assert '_analyzer("compare", str(base), str(base / "traces"))' in cli_test
