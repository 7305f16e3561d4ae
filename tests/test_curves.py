"""analyzer.metrics.curves: per-step training curves, exact answers on synthesized metrics records."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analyzer.metrics.curves import METRICS, overlay, smooth, training_curves

MANIFEST = {"tokens_per_step": 1000, "warmup_steps": 1, "profiled_steps": [2]}


def _records() -> pd.DataFrame:
    # Two ranks, three steps. Rank 1 is slower on step 1 and uses more memory.
    rows = []
    for step in range(3):
        for rank in range(2):
            rows.append(
                {
                    "step": step,
                    "rank": rank,
                    "loss": 4.0 - step + 0.5 * rank,  # mean over ranks: 4.25, 3.25, 2.25
                    "lr": 1e-3 * (step + 1),
                    "grad_norm": None,  # grad_clip 0: null everywhere
                    "step_time_ms": 100.0 if not (rank == 1 and step == 1) else 400.0,
                    "mfu": 0.2 if not (rank == 1 and step == 1) else 0.05,
                    "mem_bytes": 1000 + 500 * rank + step,
                }
            )
    return pd.DataFrame(rows)


def test_per_step_values_follow_the_definitions():
    c = training_curves(MANIFEST, _records())
    w = c.wide().set_index("step")
    assert list(w["loss"]) == [4.25, 3.25, 2.25]
    assert list(w["lr"]) == pytest.approx([1e-3, 2e-3, 3e-3])
    # tokens/s: mean over ranks of 1000 tokens / step time: step 1 is (10000 + 2500) / 2.
    assert list(w["tokens_per_s"]) == [10000.0, 6250.0, 10000.0]
    assert list(w["step_time_ms"]) == [100.0, 250.0, 100.0]
    assert list(w["mfu"]) == pytest.approx([0.2, 0.125, 0.2])
    assert list(w["mem_bytes"]) == [1500.0, 1501.0, 1502.0]  # max over ranks
    assert list(w["warmup"]) == [True, False, False]
    assert list(w["profiled"]) == [False, False, True]
    assert set(c.series("loss")["n_ranks"]) == {2}
    assert "grad_norm" not in c.metrics and "grad_clip" in c.missing["grad_norm"]
    assert c.metrics == [m for m in METRICS if m != "grad_norm"]


def test_folder_of_traces_has_no_curves_and_says_why():
    c = training_curves(None, None)
    assert c.table.empty and c.metrics == []
    assert set(c.missing) == set(METRICS)
    assert "folder of traces" in c.missing["loss"]


def test_no_tokens_per_step_withholds_only_throughput():
    c = training_curves({"warmup_steps": 0}, _records())
    assert "tokens_per_s" not in c.metrics and "tokens_per_step" in c.missing["tokens_per_s"]
    assert "loss" in c.metrics


def test_smoothing_is_a_trailing_mean_per_metric():
    c = training_curves(MANIFEST, _records())
    s = smooth(c.table, 2)
    loss = s[s["metric"] == "loss"]["value"].tolist()
    assert loss == [4.25, 3.75, 2.75]
    st = s[s["metric"] == "step_time_ms"]["value"].tolist()
    assert st == [100.0, 175.0, 175.0]
    assert smooth(c.table, 1)["value"].sum() == pytest.approx(c.table["value"].sum())
    with pytest.raises(ValueError):
        smooth(c.table, 0)


def test_overlay_of_two_runs_keeps_each_runs_values():
    a = training_curves(MANIFEST, _records())
    recs = _records()
    recs["loss"] = recs["loss"] * 2
    b = training_curves(MANIFEST, recs)
    o = overlay({"a": a, "b": b}, "loss")
    assert o.groupby("run")["value"].sum().to_dict() == {"a": 9.75, "b": 19.5}
    by_run = smooth(o, 3, by=("run",))
    assert math.isclose(by_run[by_run["run"] == "b"]["value"].iloc[-1], 6.5)


def test_html_report_has_the_training_curves_of_a_run(tmp_path):
    from pathlib import Path

    from analyzer.api import analyze
    from analyzer.render.html import report_html as render_html

    example = Path(__file__).resolve().parent.parent / "traces" / "example-ddp-w2"
    import shutil

    shutil.copytree(example, tmp_path / "run", ignore=shutil.ignore_patterns(".analyzer-cache"))
    a = analyze(tmp_path / "run")
    page = render_html(a)
    assert "<h2>Training curves</h2>" in page and 'id="training-curves"' in page
    c = training_curves(a.manifest, a.metrics)
    section = page.split('id="training-curves"', 1)[1].split("</div>", 1)[0]
    assert section.count("<svg") == len(c.metrics) >= 4  # one chart per recorded metric
    for m in c.metrics:
        assert f"<title>{METRICS[m][0]} per optimizer step, all ranks</title>" in section
    # Every step of the first curve is a point: its value in the point's tooltip.
    first = c.series(c.metrics[0])
    assert section.count("<circle") >= len(first) and f"{first['value'].iloc[-1]:.6g}</title>" in section


def test_html_report_section_is_empty_for_a_trace_folder(tmp_path):
    import sys
    from pathlib import Path

    from analyzer.api import analyze
    from analyzer.render.html import training_curves_html

    sys.path.insert(0, str(Path(__file__).parent))
    from dashboard_support import write_gpu_traces

    write_gpu_traces(tmp_path / "gpu")
    assert training_curves_html(analyze(tmp_path / "gpu", cache=False)) == ""
