"""dashboard.discover and dashboard.text: run discovery, path safety, escaping."""

from __future__ import annotations

import os

import pytest

from dashboard.discover import (
    RunLookupError,
    check_run_name,
    discover_runs,
    fingerprint,
    resolve_run,
    safe_file,
    trace_files,
)
from dashboard.text import html_text, plain


def _touch(path, text="{}"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def runs_dir(tmp_path):
    root = tmp_path / "runs"
    _touch(root / "good" / "run.json")
    _touch(root / "good" / "traces" / "rank0.step5.json.gz", "x")
    _touch(root / "nomanifest" / "metrics" / "rank0.jsonl", "")
    _touch(root / "hta" / "rank-0.json")
    _touch(root / "group" / "control" / "rank-1.pt.trace.json.gz", "x")
    _touch(root / "group" / "notes.txt", "")
    _touch(root / "empty" / "README.md", "")
    _touch(root / ".hidden" / "rank0.json")
    (tmp_path / "outside").mkdir()
    _touch(tmp_path / "outside" / "rank0.json")
    os.symlink(tmp_path / "outside", root / "escape")
    return root


def test_discover_finds_reftrain_runs_trace_folders_and_nested_folders(runs_dir):
    runs = discover_runs(runs_dir)
    assert [(r.name, r.kind) for r in runs] == [
        ("good", "reftrain"),
        ("group/control", "traces"),
        ("hta", "traces"),
        ("nomanifest", "reftrain"),
    ]
    # A run's own traces/ folder is not listed again; hidden folders, a
    # folder without traces and a symlink leaving RUNS_DIR are not runs.
    assert all(r.path.is_relative_to(runs_dir.resolve()) for r in runs)


def test_runs_dir_that_is_itself_a_trace_folder(tmp_path):
    _touch(tmp_path / "rank-0.json.gz", "x")
    runs = discover_runs(tmp_path)
    assert [(r.name, r.kind) for r in runs] == [(".", "traces")]


@pytest.mark.parametrize(
    "name",
    ["../../etc", "..", "good/../../x", "/etc/passwd", "", "a\x00b", "..\\x"],
)
def test_unsafe_run_names_are_refused(runs_dir, name):
    with pytest.raises(RunLookupError, match="refused"):
        check_run_name(name)
    with pytest.raises(RunLookupError, match="refused"):
        resolve_run(discover_runs(runs_dir), runs_dir, name)


def test_resolve_only_accepts_discovered_names(runs_dir):
    runs = discover_runs(runs_dir)
    assert resolve_run(runs, runs_dir, "group/control").path == (runs_dir / "group" / "control").resolve()
    with pytest.raises(RunLookupError, match="no run named 'empty'"):
        resolve_run(runs, runs_dir, "empty")
    with pytest.raises(RunLookupError, match="no run named 'escape'"):
        resolve_run(runs, runs_dir, "escape")


def test_safe_file_refuses_files_outside_root(runs_dir, tmp_path):
    inside = runs_dir / "hta" / "rank-0.json"
    assert safe_file(runs_dir, inside) == inside.resolve()
    with pytest.raises(RunLookupError, match="not a file below the runs directory"):
        safe_file(runs_dir, runs_dir / "escape" / "rank0.json")
    with pytest.raises(RunLookupError):
        safe_file(runs_dir, runs_dir / "hta")


def test_trace_files_of_each_kind(runs_dir):
    runs = {r.name: r for r in discover_runs(runs_dir)}
    assert [p.name for p in trace_files(runs["good"])] == ["rank0.step5.json.gz"]
    assert [p.name for p in trace_files(runs["hta"])] == ["rank-0.json"]
    assert trace_files(runs["nomanifest"]) == []


def test_fingerprint_changes_when_a_file_changes(runs_dir):
    run = {r.name: r for r in discover_runs(runs_dir)}["good"]
    before = fingerprint(run)
    assert [item[0] for item in before] == ["run.json", "traces/rank0.step5.json.gz"]
    assert fingerprint(run) == before
    trace = runs_dir / "good" / "traces" / "rank0.step5.json.gz"
    os.utime(trace, ns=(1, 1))
    assert fingerprint(run) != before
    touched = fingerprint(run)
    _touch(runs_dir / "good" / "checkpoints" / "step1" / "x.distcp", "x")
    _touch(runs_dir / "good" / ".cache" / "rank0.parquet", "x")
    assert fingerprint(run) == touched


def test_plain_escapes_markdown_links_images_math_and_directives():
    evil = "![x](http://evil/p.png) [a](javascript:alert(1)) $x$ :red[hi] <b>"
    escaped = plain(evil)
    for token in ("![", "](", "$x$", ":red[", "<b>"):
        assert token not in escaped
    # Every character is still there, in order, once the escapes are dropped.
    assert escaped.replace("\\", "") == evil
    assert plain("two\nlines") == "two lines"


def test_html_text_escapes_tags():
    assert html_text('<a href="x">k</a>') == "&lt;a href=&quot;x&quot;&gt;k&lt;/a&gt;"
