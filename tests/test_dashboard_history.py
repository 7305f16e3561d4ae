"""The dashboard History page under AppTest: analyzer.history's points, verdicts
and change points, and the link to Compare for two picked runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

sys.path.insert(0, str(Path(__file__).parent))
from test_history import GOOD, SLOW, _copy

from analyzer.verbs.history import history
from dashboard.cli import APP_PATH, RUNS_DIR_ENV


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dash-history")
    _copy(GOOD, root / "r1", "2026-01-01T00:00:00+00:00", "aaa")
    _copy(SLOW, root / "r2", "2026-01-02T00:00:00+00:00", "bbb")
    _copy(GOOD, root / "r3", "2026-01-03T00:00:00+00:00", "ccc")
    return root


@pytest.fixture(autouse=True)
def fresh_caches():
    st.cache_data.clear()
    st.cache_resource.clear()
    yield
    st.cache_resource.clear()


def test_history_page_marks_the_change_points_and_links_compare(runs, monkeypatch):
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs))
    at = AppTest.from_file(str(APP_PATH), default_timeout=300)
    at.switch_page("views/history.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    el = next(e for e in at.get("vega_lite_chart") if json.loads(e.proto.spec)["name"] == "history_chart")
    data = pa.ipc.open_stream(el.proto.data.data).read_pandas()
    h = history(runs, "time")
    assert data["run"].tolist() == [p.run for p in h.points] == ["r1", "r2", "r3"]
    assert data["mfu"].tolist() == pytest.approx([p.mfu for p in h.points])
    assert data["change"].tolist() == ["", "slower", "faster"]
    assert data["verdict"].tolist()[1] == "regression"
    spec = json.loads(el.proto.spec)
    assert all(layer["encoding"]["x"]["field"] == "run" for layer in spec["layer"])  # the axis names the runs
    # The table in the chart's unit: MFU in percent, not the fraction.
    shown = next(d.value for d in at.dataframe if "verdict" in d.value.columns)
    assert shown["MFU %"].tolist() == pytest.approx([100 * p.mfu for p in h.points])
    at.selectbox(key="history_base").set_value("r1")
    at.selectbox(key="history_cand").set_value("r2")
    at.run()
    links = at.get("page_link")
    assert links and "r1" in links[0].proto.label and "r2" in links[0].proto.label
