"""The whole-trace GPU timeline (TraceLens's window) beside the per-step breakdown, with exact answers.

The synthetic trace is built so that the two differ by a known amount: the
step window starts 100 us before the first kernel (host time inside the
step: idle in the breakdown, outside the GPU span), and one kernel runs
after the last step ends (in the GPU span, outside every step).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.api import analyze
from analyzer.render.html import report_html as render_html
from analyzer.render.text import NO_STEPS_LINE, report_text as render_text
from analyzer.verbs.report import report_json
from synth import KinetoTrace


def _trace(tmp_path: Path, with_step: bool = True) -> Path:
    t = KinetoTrace(rank=0, world_size=1, distributed=False)
    if with_step:
        t.step(1, 0, 1000)  # ProfilerStep#1: 0..1000 us
    t.kernel("sm90_xmma_gemm_f32f32", 100, 200, launch_us=90)  # 100..300: compute
    t.memcpy(400, 50, launch_us=395)  # 400..450: copy, nothing else runs
    t.kernel("elementwise_kernel", 1100, 100, launch_us=1050)  # 1100..1200: after the step
    return t.write(tmp_path / "rank0.json.gz")


def test_whole_trace_timeline_and_step_breakdown_differ_by_the_known_amount(tmp_path: Path) -> None:
    a = analyze(_trace(tmp_path), cache=False)
    r = a.rank(0)
    # GPU span 100..1200 us = 1100 us: busy 200 + 100 compute, 50 copy.
    assert r.gpu_span_ms == pytest.approx(1.1, abs=1e-12)
    assert r.gpu_timeline == pytest.approx(
        {
            "computation": 100 * 300 / 1100,
            "exposed_comm": 0.0,
            "exposed_memcpy": 100 * 50 / 1100,
            "idle": 100 * 750 / 1100,
        },
        abs=1e-9,
    )
    # The step 0..1000 us: 200 us compute, 50 us copy, 750 us idle (100 us of it before the first kernel).
    b = r.breakdown
    assert (b["compute"]["pct"], b["exposed_memcpy"]["pct"], b["idle"]["pct"]) == pytest.approx(
        (20.0, 5.0, 75.0), abs=1e-9
    )
    # Known difference: computation 27.27 % vs 20 %: +7.27 points (the kernel after the step and the host time before the first kernel).
    assert r.gpu_timeline["computation"] - b["compute"]["pct"] == pytest.approx(100 * 300 / 1100 - 20.0, abs=1e-9)
    doc = report_json(a)
    assert doc["ranks"][0]["gpu_timeline"]["computation"] == pytest.approx(100 * 300 / 1100)
    assert doc["ranks"][0]["gpu_span_ms"] == pytest.approx(1.1)
    text = render_text(a)
    assert "Whole-trace GPU timeline" in text and "Step breakdown over the profiled windows" in text
    line = next(ln for ln in text.splitlines() if ln.split()[:2] == ["0", "1.10"])
    assert line.split()[2:] == ["27.27", "0.00", "4.55", "68.18"]
    assert NO_STEPS_LINE not in text
    assert "Whole-trace GPU timeline" in render_html(a)


def test_without_step_windows_the_timeline_is_the_only_breakdown_and_says_so(tmp_path: Path) -> None:
    a = analyze(_trace(tmp_path, with_step=False), cache=False)
    r = a.rank(0)
    assert r.breakdown == {}
    assert r.gpu_timeline["computation"] == pytest.approx(100 * 300 / 1100, abs=1e-9)
    text = render_text(a)
    assert NO_STEPS_LINE in text and "Step breakdown" not in text
    assert NO_STEPS_LINE in render_html(a)
    json.dumps(report_json(a))  # serializable


def test_text_report_prints_each_warning_as_one_line(tmp_path: Path) -> None:
    t = KinetoTrace(rank=0, world_size=1, distributed=False)
    t.step(1, 0, 500)
    t.step(2, 500, 20_000)  # ends 19 ms after the last event: clipped, with a warning
    t.kernel("sm90_xmma_gemm_f32f32", 100, 200, launch_us=90)
    t.kernel("sm90_xmma_gemm_f32f32", 600, 200, launch_us=590)
    a = analyze(t.write(tmp_path / "rank0.json.gz"), cache=False)
    assert len(a.warnings) == 1 and "ProfilerStep#2 clipped" in a.warnings[0]
    # The GEMM kernels run inside no op with shapes: FLOP coverage 0 %, MFU withheld, and that is a warning too.
    assert a.mfu.flop_coverage == 0.0
    lines = render_text(a).splitlines()
    start = lines.index("Warnings (2)")
    assert lines[start + 1] == "  " + " ".join(a.warnings[0].split())
    assert lines[start + 2].startswith("  MFU ") and "FLOP coverage 0.0%" in lines[start + 2]
    assert lines[start + 3] == ""
