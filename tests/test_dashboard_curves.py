"""Training curves on the dashboard (Overview and Compare) under AppTest.

The charts must draw exactly analyzer.curves' values for the chosen metric,
smoothing window and runs; the page computes nothing itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_support import GOOD_RUN, GPU_RUN, SLOW_RUN, build_runs_dir, fresh_caches  # noqa: F401 (fresh_caches: autouse fixture)

from analyzer.metrics.curves import overlay, smooth, training_curves
from analyzer.ingest.rundir import read_run_dir
from dashboard.cli import APP_PATH, RUNS_DIR_ENV
from dashboard.text import plain

TIMEOUT_S = 300  # cold analysis on a loaded 2-core machine


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    return build_runs_dir(tmp_path_factory.mktemp("curves") / "runs")


def _open(runs_dir: Path, monkeypatch, page: str, **params: str) -> AppTest:
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs_dir))
    at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT_S)
    for k, v in params.items():
        at.query_params[k] = v
    at.switch_page(f"views/{page}.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _vega(at: AppTest, name: str):
    for el in at.get("vega_lite_chart"):
        spec = json.loads(el.proto.spec)
        if spec["name"] == name:
            return spec, pa.ipc.open_stream(el.proto.data.data).read_pandas()
    raise AssertionError(f"no chart {name!r}")


def _curves(runs_dir: Path, name: str):
    rd = read_run_dir(runs_dir / name)
    return training_curves(rd.manifest, rd.metrics)


def test_overview_draws_the_selected_curve_smoothed_with_profiled_steps(runs_dir, monkeypatch):
    c = _curves(runs_dir, GOOD_RUN)
    at = _open(runs_dir, monkeypatch, "overview", run=GOOD_RUN)
    spec, data = _vega(at, "training_curve")
    loss = c.series("loss")
    assert data["step"].tolist() == loss["step"].tolist()  # loss is the first metric: the default
    assert data["value"].tolist() == pytest.approx(loss["value"].tolist())
    assert set(data.loc[data["profiled"], "step"]) == set(c.profiled_steps) and c.profiled_steps
    assert spec["layer"][0]["mark"]["type"] == "rule"  # profiled steps marked
    assert set(data.loc[data["step"] < c.warmup_steps, "phase"]) == {"warmup"}

    at.selectbox(key="curve_metric").set_value("step_time_ms")
    at.number_input(key="curve_smooth").set_value(3)
    at.run()
    _, data = _vega(at, "training_curve")
    want = smooth(c.series("step_time_ms"), 3)
    assert data["value"].tolist() == pytest.approx(want["value"].tolist())
    assert any("trailing mean over 3 steps" in x.value for x in at.caption)


def test_overview_of_a_trace_folder_says_there_are_no_curves(runs_dir, monkeypatch):
    at = _open(runs_dir, monkeypatch, "overview", run=GPU_RUN)
    assert any(i.value.startswith(plain("No training curves: a folder of traces")) for i in at.info)


def test_compare_overlays_both_runs(runs_dir, monkeypatch):
    at = _open(runs_dir, monkeypatch, "compare", run=SLOW_RUN, base=GOOD_RUN)
    at.selectbox(key="compare_overlay_metric").set_value("tokens_per_s")
    at.run()
    spec, data = _vega(at, "compare_curves")
    want = overlay({GOOD_RUN: _curves(runs_dir, GOOD_RUN), SLOW_RUN: _curves(runs_dir, SLOW_RUN)}, "tokens_per_s")
    for run in (GOOD_RUN, SLOW_RUN):
        got = data[data["run"] == run].sort_values("step")
        exp = want[want["run"] == run].sort_values("step")
        assert got["value"].tolist() == pytest.approx(exp["value"].tolist())
    # The slowed rank drags the slow run's throughput below the good one's.
    assert data[data["run"] == SLOW_RUN]["value"].median() < data[data["run"] == GOOD_RUN]["value"].median()
