"""Jupyter summaries: RunAnalysis._repr_html_ and Comparison._repr_html_."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from analyzer.api import analyze
from analyzer.verbs.compare import compare

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("nb")
    out = {}
    for name in ("example-ddp-w2", "example-ddp-w2-slow-rank1"):
        shutil.copytree(REPO / "traces" / name, root / name, ignore=shutil.ignore_patterns(".analyzer-cache"))
        out[name] = analyze(root / name)
    return out


def test_run_summary_shows_the_headline_and_the_rank_table(runs):
    a = runs["example-ddp-w2"]
    page = a._repr_html_()
    assert f"MFU: {100 * a.mfu.median:.2f}% ({a.mfu.source})" in page
    assert f"step time: {a.step_time.ms:.2f} ms" in page
    assert "<th>exposed_comm_pct</th>" in page
    for r in a.ranks:  # the table's cells, as its float format writes them
        assert f"<td>{r.exposed_comm_pct:.4g}</td>" in page


def test_lower_bound_mfu_is_labelled(tmp_path):
    from dataclasses import replace

    sys.path.insert(0, str(Path(__file__).parent))
    from dashboard_support import write_gpu_traces

    write_gpu_traces(tmp_path / "gpu")
    a = analyze(tmp_path / "gpu", peak_flops=1e12)
    a = replace(a, mfu=replace(a.mfu, source="trace_shapes", median=0.1, lower_bound=True, flop_coverage=0.4))
    assert "&ge; 10.00% (lower bound, FLOP coverage 40.0%)" in a._repr_html_()


def test_comparison_summary(runs):
    c = compare(runs["example-ddp-w2"], runs["example-ddp-w2-slow-rank1"])
    page = c._repr_html_()
    assert f"{100 * c.mfu.base:.2f}%" in page and f"{100 * c.mfu.cand:.2f}%" in page
    names = [d.name for d in c.phases[:8]]
    found = [page.find(f"<td>{n}</td>") for n in names]
    assert all(i > 0 for i in found) and found == sorted(found)  # largest change first


def test_names_from_traces_are_escaped(runs):
    from dataclasses import replace

    c = compare(runs["example-ddp-w2"], runs["example-ddp-w2-slow-rank1"])
    evil = replace(c, base_path="<script>alert(1)</script>")
    assert "<script>" not in evil._repr_html_()


def test_the_docs_notebook_example_runs(tmp_path, monkeypatch, capsys):
    """docs/api.md "In a notebook": its code block, executed on copies of the example runs."""
    import re

    text = (REPO / "docs" / "api.md").read_text()
    section = text.split("## In a notebook", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    for name in ("example-ddp-w2", "example-ddp-w2-slow-rank1"):
        shutil.copytree(REPO / "traces" / name, tmp_path / "traces" / name, ignore=shutil.ignore_patterns(".analyzer-cache"))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/api.md", "exec"), scope)  # the documented example itself
    out = capsys.readouterr().out
    assert "exposes the most communication" in out and "MFU " in out
    assert "MFU:" in scope["run"]._repr_html_() and scope["delta"]._repr_html_().startswith("<div")
