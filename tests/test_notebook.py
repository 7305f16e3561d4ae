"""Jupyter summaries of a RunAnalysis, a Comparison and a GateOutcome (analyzer/render/notebook.py), as
IPython's HTML formatter shows them once the views are registered; and their short text reprs."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.api import analyze
from analyzer.verbs.check import check
from analyzer.verbs.compare import compare

REPO = Path(__file__).resolve().parent.parent


def _html(obj: object) -> str:
    """What a notebook cell ending in ``obj`` shows as HTML: a standalone IPython HTML formatter
    with the analyzer's views registered (a shell's formatter is the same class)."""
    formatters = pytest.importorskip("IPython.core.formatters", reason="IPython renders notebook cells")
    from analyzer.render.notebook import register

    formatter = formatters.HTMLFormatter()
    register(formatter)
    return formatter(obj)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("nb")
    out = {}
    for name in ("example-ddp-w2", "example-ddp-w2-slow-rank1"):
        shutil.copytree(REPO / "traces" / name, root / name, ignore=shutil.ignore_patterns(".analyzer-cache"))
        out[name] = analyze(root / name)
    return out


@pytest.fixture(scope="module")
def gate(runs):
    return check(runs["example-ddp-w2"], runs["example-ddp-w2-slow-rank1"])


def test_run_summary_shows_the_headline_and_the_rank_table(runs):
    a = runs["example-ddp-w2"]
    page = _html(a)
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
    assert "&ge; 10.00% (lower bound, FLOP coverage 40.0%)" in _html(a)


def test_comparison_summary(runs):
    c = compare(runs["example-ddp-w2"], runs["example-ddp-w2-slow-rank1"])
    page = _html(c)
    assert f"{100 * c.mfu.base:.2f}%" in page and f"{100 * c.mfu.cand:.2f}%" in page
    names = [d.name for d in c.phases[:8]]
    found = [page.find(f"<td>{n}</td>") for n in names]
    assert all(i > 0 for i in found) and found == sorted(found)  # largest change first


def test_names_from_traces_are_escaped(runs):
    from dataclasses import replace

    c = compare(runs["example-ddp-w2"], runs["example-ddp-w2-slow-rank1"])
    evil = replace(c, base_path="<script>alert(1)</script>")
    assert "<script>" not in _html(evil)


def test_the_docs_notebook_example_runs(tmp_path, monkeypatch, capsys):
    """docs/api.md "In a notebook": its code block, executed on copies of the example runs."""
    text = (REPO / "docs" / "api.md").read_text()
    section = text.split("## In a notebook", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    for name in ("example-ddp-w2", "example-ddp-w2-slow-rank1"):
        shutil.copytree(
            REPO / "traces" / name, tmp_path / "traces" / name, ignore=shutil.ignore_patterns(".analyzer-cache")
        )
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/api.md", "exec"), scope)  # the documented example itself
    out = capsys.readouterr().out
    assert "exposes the most communication" in out and "MFU " in out
    assert "MFU:" in _html(scope["run"]) and _html(scope["delta"]).startswith("<div")


def test_mfu_change_is_the_difference_of_the_figures_shown(runs):
    """The candidate is rescaled to the baseline's peak for the drop, but the change printed beside
    two MFU figures is their difference: 62.90% -> 52.23% is -10.67 pts (not the rescaled -21.42)."""
    from analyzer.render.text import compare_text

    c = compare(runs["example-ddp-w2"], runs["example-ddp-w2-slow-rank1"])
    assert c.mfu.cand_on_base_peak is not None  # the case where the two differ
    base, cand = (float(f"{100 * v:.2f}") for v in (c.mfu.base, c.mfu.cand))
    shown = f"{cand - base:+.2f}"
    assert f"<td>{shown} pts</td>" in _html(c)
    line = next(x for x in compare_text(c).splitlines() if x.startswith("MFU:"))
    assert line.startswith(f"MFU: {base:.2f}% -> {cand:.2f}% ({shown} points, drop ")
    assert shown != f"{100 * c.mfu.delta:+.2f}"


def test_import_in_a_running_ipython_registers_the_views(tmp_path):
    """``import analyzer`` inside IPython registers both views with the shell (a fresh process: the
    shell is a process-wide singleton); outside IPython it imports no renderer."""
    pytest.importorskip("IPython", reason="IPython renders notebook cells")
    code = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "import analyzer.api\n"
        "print(sorted(shell.display_formatter.formatters['text/html'].deferred_printers))\n"
    )
    env = {**os.environ, "IPYTHONDIR": str(tmp_path)}  # the shell's history database goes there, not to ~
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr
    for view in ("('analyzer.api', 'RunAnalysis')", "('analyzer.verbs.compare', 'Comparison')"):
        assert view in out.stdout
    assert "('analyzer.verbs.check.outcome', 'GateOutcome')" in out.stdout
    plain = subprocess.run(
        [sys.executable, "-c", "import sys, analyzer.api; print('analyzer.render.notebook' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert plain.stdout.strip() == "False", plain.stderr


def test_gate_summary_shows_the_verdict_the_statistic_and_the_comparison(gate):
    g = gate
    r = g.result
    page = _html(g)
    assert page.startswith('<div class="analyzer-check analyzer-regression">')
    assert f"<b>analyzer check: {g.verdict_label}</b>" in page and g.verdict_label == "REGRESSION"
    assert html.escape(g.explanation) in page  # the paragraph `analyzer check` prints, escaped
    assert f"<td>{r.statistic_label}</td>" in page
    assert f"<td>{100 * r.base_value:.2f}%</td>" in page and f"<td>{100 * r.cand_value:.2f}%</td>" in page
    assert f"drop {r.drop:+.1%} (allowed {r.max_drop:.1%}, p = {r.p_value:.3g}" in page
    assert f"<td>{r.n_base}</td>" in page
    assert _html(g.comparison) in page  # the comparison's own view follows


def test_reprs_are_a_few_lines(runs, gate):
    """A console shows a result's repr: the generated dataclass repr printed every table (17 KB for this
    run, 31-45 KB for larger ones); the short one names the run and its headline figures."""
    a = runs["example-ddp-w2"]
    text = repr(a)
    assert len(text) < 600 and len(text.splitlines()) <= 6, text
    assert text.startswith(f"<RunAnalysis {a.path}: reftrain, 2 rank(s) 0..1")
    assert f"steps: {a.step_time.n_steady_steps} steady-state, {a.step_time.n_profiled_steps} profiled" in text
    assert f"MFU: {100 * a.mfu.median:.2f}% ({a.mfu.source})" in text
    assert f"step time: {a.step_time.ms:.2f} ms ({a.step_time.label})" in text

    c = compare(runs["example-ddp-w2"], runs["example-ddp-w2-slow-rank1"])
    text = repr(c)
    assert len(text) < 600 and len(text.splitlines()) <= 6, text
    assert text.startswith(f"<Comparison {c.base_path} -> {c.cand_path}")
    # the two figures as shown; no change computed on the rescaled candidate
    assert f"MFU: {100 * c.mfu.base:.2f}% -> {100 * c.mfu.cand:.2f}%\n" in text
    assert f"step time: {c.step_time_median.base:.2f} ms -> {c.step_time_median.cand:.2f} ms" in text
    assert f"largest phase change: {c.phases[0].name} {c.phases[0].delta:+.2f} ms per step" in text

    text = repr(gate)
    assert len(text) < 600 and len(text.splitlines()) <= 3, text
    assert text.startswith(f"<GateOutcome REGRESSION: {c.base_path} -> {c.cand_path}")
    assert f"drop {gate.result.drop:+.1%}, allowed 5.0%" in text


def test_gate_summary_shows_the_goodput_and_memory_gates(gate):
    from dataclasses import replace

    from analyzer.verbs.check import GoodputGate, MemoryGate

    g = replace(
        gate,
        goodput=GoodputGate(0.9, 0.85, 100.0, 85.0, {"restarts": 15.0}, 2, base_goodput=0.95),
        memory=MemoryGate(0.05, 0.25, 2 * 2**30, 2.5 * 2**30, "allocated", "trace"),
    )
    page = _html(g)
    assert (
        "<td>goodput (floor 90.0%)</td>\n      <td>95.0%</td>\n      <td>85.0%</td>\n      <td>below the floor</td>"
        in page
    )
    assert "<td>peak memory, MiB (allowed +5.0%)</td>\n      <td>2,048.0</td>\n      <td>2,560.0</td>" in page
    assert "<td>+25.0%, over</td>" in page
