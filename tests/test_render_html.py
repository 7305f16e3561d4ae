"""HTML pages without optional packages, and the SVG charts they hold (analyzer/render/html.py, svg.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from analyzer.render import svg

REPO = Path(__file__).resolve().parent.parent

# Runs in a fresh interpreter where plotly and streamlit cannot be imported (a None entry in
# sys.modules makes `import plotly` raise ImportError), as on `pip install .` without [dashboard].
BLOCKED = """
import sys
for name in ("plotly", "streamlit"):
    sys.modules[name] = None
from analyzer.cli import main
run, out = sys.argv[1], sys.argv[2]
codes = [main(["report", run, "--no-cache", "--html", out + "/report.html"]),
         main(["check", run, "--baseline", run, "--no-cache", "--html", out + "/check.html"])]
print("exit codes", codes, "plotly loaded", any(m.startswith("plotly.") for m in sys.modules))
"""


def test_report_and_check_html_without_plotly_or_streamlit(tmp_path):
    run = tmp_path / "example-ddp-w2"
    shutil.copytree(REPO / "traces" / "example-ddp-w2", run, ignore=shutil.ignore_patterns(".analyzer-cache"))
    out = subprocess.run(
        [sys.executable, "-c", BLOCKED, str(run), str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert "exit codes [0, 0] plotly loaded False" in out.stdout, out.stdout + out.stderr
    report = (tmp_path / "report.html").read_text()
    for section in ("Per rank", "Training curves", "Step breakdown", "Step time", "MFU", "Stragglers", "Suggestions"):
        assert f"<h2>{section}</h2>" in report, section
    # Charts: the stacked breakdown, step time, MFU, overlap, top ops, and one per training curve.
    assert report.count("<svg") >= 5 + 4 and "<script" not in report
    check = (tmp_path / "check.html").read_text()
    for section in ("Statistics", "Steps", "What changed", "Phases"):
        assert f"<h2>{section}</h2>" in check, section
    assert "PASS" in check and check.count("<svg") == 2  # per-step samples, phases


def test_nice_ticks_are_round_and_cover_the_range():
    assert svg.nice_ticks(0, 9.3) == [0, 2, 4, 6, 8, 10]
    assert svg.nice_ticks(41.2, 43.9) == [41, 42, 43, 44]  # step 0.54 rounds up to 1
    assert svg.nice_ticks(0.0012, 0.0049) == [0.001, 0.002, 0.003, 0.004, 0.005]
    assert svg.nice_ticks(5, 5) == [5, 6, 7, 8, 9, 10]  # a flat series still gets an axis


def test_stacked_bars_are_drawn_to_scale():
    # Two ranks, parts 3 + 1 ms and 2 + 2 ms: both stacks 4 ms tall on an axis from 0 to 4.
    chart = svg.bar_chart(
        "t", ["rank 0", "rank 1"], [svg.Bars("a", [3.0, 2.0]), svg.Bars("b", [1.0, 2.0])], y_title="ms", stacked=True
    )
    heights = [float(h) for h in re.findall(r'height="([^"]+)" fill="[^"]+"><title>', chart)]  # bars, not the legend
    plot = svg.HEIGHT - svg.BOTTOM - svg.TOP
    assert heights == [3 / 4 * plot, 1 / 4 * plot, 2 / 4 * plot, 2 / 4 * plot]


def test_line_chart_breaks_at_missing_values_and_escapes_names():
    chart = svg.line_chart(
        "<b>", [svg.Series("rank <0>", [0, 1, 2, 3], [1.0, None, 2.0, 3.0])], x_title="step", y_title="ms"
    )
    assert chart.count("<polyline") == 1  # 0 alone, then 2-3: one segment with two points or more
    assert chart.count("<circle") == 3 and "<b>" not in chart and "rank &lt;0&gt;" in chart
    assert svg.line_chart("empty", [svg.Series("s", [0], [None])], x_title="x", y_title="y") == ""
    # Marked points (change points, samples) are markers only, larger than a line's dots.
    marks = svg.line_chart("m", [svg.Series("change", [1, 3], [2.0, 3.0], lines=False)], x_title="x", y_title="y")
    assert "<polyline" not in marks and marks.count('r="5"') == 2
