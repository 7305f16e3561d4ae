"""Every dashboard page under streamlit.testing.v1.AppTest.

Each test opens the real app (dashboard/app.py) on a runs folder with real
reftrain runs, synthetic GPU traces and broken runs, and checks the numbers
and labels shown against analyzer results computed here. Caches are
cleared between tests.
"""

from __future__ import annotations

import base64
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_support import (
    GOOD_RUN,
    GPU_RUN,
    MANY_RANKS_RUN,
    NO_MANIFEST_RUN,
    SLOW_RUN,
    TRUNCATED_RUN,
    build_runs_dir,
    fresh_caches,  # noqa: F401
    write_many_rank_traces,
)

from analyzer.api import analyze
from analyzer.errors import AnalyzerError
from analyzer.metrics.throughput import throughput
from analyzer.metrics.depgraph import BOUND_CATEGORIES
from analyzer.metrics.timeline import overview, select_window
from dashboard.cli import APP_PATH, RUNS_DIR_ENV
from dashboard.text import plain

# Cold analysis on a loaded 2-core machine: be generous.
TIMEOUT_S = 300
TELEMETRY_RUN = "with-telemetry"
EVIL_RUN = "evil-[x](javascript:alert(1))"


def _add_telemetry_run(runs: Path) -> None:
    """A copy of the good run with two GPUs' NVML samples (reftrain.telemetry/1)."""
    dst = runs / TELEMETRY_RUN
    shutil.copytree(runs / GOOD_RUN, dst, ignore=shutil.ignore_patterns(".analyzer-cache"))
    manifest = json.loads((dst / "run.json").read_text())
    files = []
    for rank in (0, 1):
        rel = f"telemetry/gpu{rank}.jsonl"
        lines = [
            orjson.dumps(
                {
                    "time_ns": 1_000_000_000 * (10 + i),
                    "gpu_util_pct": 50.0 + 10 * i + rank,
                    "mem_util_pct": 20.0,
                    "sm_clock_mhz": 1980.0 - i,
                    "power_w": 300.0 + i,
                    "mem_used_bytes": 2**30,
                    "temp_c": 60.0,
                    "throttle_reasons": ["sw_power_cap"] if (rank, i) == (1, 2) else [],
                }
            ).decode()
            for i in range(3)
        ]
        (dst / "telemetry").mkdir(exist_ok=True)
        (dst / rel).write_text("\n".join(lines) + "\n")
        files.append(rel)
    manifest["files"]["telemetry"] = files
    manifest["schemas"]["telemetry"] = "reftrain.telemetry/1"
    (dst / "run.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    runs = build_runs_dir(tmp_path_factory.mktemp("dashboard") / "runs")
    _add_telemetry_run(runs)
    shutil.copytree(runs / GPU_RUN, runs / EVIL_RUN)
    outside = runs.parent / "outside"
    shutil.copytree(runs / GPU_RUN, outside)
    (runs / "escape").symlink_to(outside)
    return runs


@pytest.fixture(scope="module")
def analyses(runs_dir) -> dict:
    # The Timeline page asks for the critical paths (of GPU_RUN here); the other pages do not.
    runs = (GOOD_RUN, SLOW_RUN, GPU_RUN, TRUNCATED_RUN)
    return {name: analyze(runs_dir / name, critical_path=name == GPU_RUN) for name in runs}


@pytest.fixture
def open_page(runs_dir, monkeypatch):
    return _opener(runs_dir, monkeypatch)


def _opener(runs_dir: Path, monkeypatch):
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs_dir))

    def _open(page: str, **params: str) -> AppTest:
        at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT_S)
        for key, value in params.items():
            at.query_params[key] = value
        if page != "runs":
            # url_path equals the file stem, so the page hash is known before a first run.
            at.switch_page(f"views/{page}.py")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    return _open


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _decode(value):
    """Plotly >= 6 writes numpy arrays as {"dtype", "bdata"[, "shape"]}; return lists."""
    if isinstance(value, dict) and "bdata" in value:
        data = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        if "shape" in value:
            data = data.reshape([int(n) for n in str(value["shape"]).split(",")])
        return data.tolist()
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def charts(at: AppTest) -> dict[str, dict]:
    """Plotly figures on the page by their element key, arrays as lists."""
    out = {}
    for el in at.get("plotly_chart"):
        out[el.proto.id.rsplit("-", 1)[-1]] = _decode(json.loads(el.proto.spec))
    return out


def vega_charts(at: AppTest) -> dict[str, tuple[dict, pd.DataFrame]]:
    """Vega-Lite charts on the page by their spec name: (spec, data table)."""
    out = {}
    for el in at.get("vega_lite_chart"):
        spec = json.loads(el.proto.spec)
        out[spec["name"]] = (spec, pa.ipc.open_stream(el.proto.data.data).read_pandas())
    return out


def frame(at: AppTest, column: str):
    """The (only) table on the page that has `column` (tables carry no key in AppTest)."""
    found = [d.value for d in at.dataframe if column in d.value.columns]
    assert len(found) == 1, f"{len(found)} tables with column {column!r}"
    return found[0]


def frame_named(at: AppTest, names: list[str]):
    """The table whose ``name`` column lists exactly `names`."""
    found = [d.value for d in at.dataframe if "name" in d.value.columns and d.value["name"].tolist() == names]
    assert found, f"no table listing {names}"
    return found[0]


def captions(at: AppTest) -> list[str]:
    return [c.value for c in at.caption]


# --------------------------------------------------------------------------- runs page


def test_runs_page_rows_show_analyzer_numbers_and_errors(open_page, runs_dir, analyses):
    at = open_page("runs")
    table = at.dataframe[0].value.set_index("run")
    assert sorted(table.index) == sorted(
        [GOOD_RUN, SLOW_RUN, GPU_RUN, TRUNCATED_RUN, NO_MANIFEST_RUN, TELEMETRY_RUN, EVIL_RUN]
    )
    good = analyses[GOOD_RUN]
    row = table.loc[GOOD_RUN]
    assert row["MFU"] == good.mfu.median
    assert row["HFU"] == good.mfu.hfu_median  # the analyzer's, as the overview shows it
    assert row["MFU source"] == "manifest"
    assert row["tokens/s"] == throughput(good.manifest, good.metrics).median
    assert row["world size"] == 2 and row["steps"] == 12 and row["status"] == "completed"
    assert row["git sha"] == good.manifest["git"]["sha"][:10]
    assert row["params"] == good.manifest["params"]["total"]
    assert row["open"] == f"./overview?run={GOOD_RUN}"
    assert table.loc[SLOW_RUN, "MFU"] == analyses[SLOW_RUN].mfu.median

    bad = table.loc[TRUNCATED_RUN]
    assert bad["status"] == "partial" and bad["world size"] == 1
    assert bad["error"] == "; ".join(analyses[TRUNCATED_RUN].errors)
    assert "rank1.json.gz" in bad["error"] and "truncated" in bad["error"]
    with pytest.raises(AnalyzerError) as missing:
        analyze(runs_dir / NO_MANIFEST_RUN)
    assert table.loc[NO_MANIFEST_RUN, "status"] == "error"
    assert table.loc[NO_MANIFEST_RUN, "error"] == str(missing.value)
    assert "2 run(s) have errors" in " ".join(captions(at))


def test_runs_page_filters(open_page):
    at = open_page("runs")
    at.text_input(key="runs_filter").input("slow").run()
    assert at.dataframe[0].value["run"].tolist() == [SLOW_RUN]
    at.text_input(key="runs_filter").input("").run()
    at.multiselect(key="runs_kinds").set_value(["traces"]).run()
    assert sorted(at.dataframe[0].value["run"]) == sorted([EVIL_RUN, GPU_RUN, TRUNCATED_RUN])


def test_empty_runs_folder_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path))
    at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT_S).run()
    assert not at.exception
    assert "No runs here yet" in at.info[0].value


# --------------------------------------------------------------------------- overview


def test_overview_of_a_reftrain_run(open_page, analyses):
    ra = analyses[GOOD_RUN]
    at = open_page("overview", run=GOOD_RUN)
    assert at.title[0].value == plain(GOOD_RUN)
    shown = metrics(at)
    assert shown["MFU"] == f"{100 * ra.mfu.median:.1f}%"
    tp = throughput(ra.manifest, ra.metrics).median
    assert shown["Tokens/s"] == f"{tp / 1e3:.3g}k tok/s"
    assert ra.step_time.source == "steady_state"
    assert shown["Step time"] == f"{ra.step_time.ms:.0f} ms"  # the run's headline, as in its reports
    assert plain(
        f"steady-state steps (metrics records); profiled windows {ra.step_time.profiled_ms:.0f} ms"
    ) in captions(at)
    # A CPU run: the HTA overlap needs GPU communication kernels.
    assert shown["Comm/compute overlap"] == "n/a"
    assert any(c.startswith(plain("source: manifest; peak")) for c in captions(at))

    figs = vega_charts(at)
    spec, bars = figs["breakdown"]
    parts = list(ra.ranks[0].breakdown)
    assert spec["encoding"]["color"]["scale"]["domain"] == parts  # stacked in the analyzer's order
    assert spec["encoding"]["y"]["stack"] == "zero"
    for r in ra.ranks:
        mine = bars[bars["rank"] == f"rank {r.rank}"].sort_values("order")
        assert mine["part"].tolist() == parts
        assert mine["ms"].tolist() == pytest.approx([r.breakdown[p]["mean_ms"] for p in parts])
    # Memory per step: the trainer's records (CPU RSS here), one line per rank, in MiB.
    mem = ra.memory.steps
    mem = mem[mem["source"] == "metrics"].sort_values(["rank", "step"])
    assert len(mem)
    _, shown_mem = figs["memory_steps"]
    assert shown_mem["step"].tolist() == mem["step"].tolist()
    assert shown_mem["peak_allocated_mib"].tolist() == pytest.approx((mem["peak_allocated_bytes"] / 2**20).tolist())
    assert "idle_causes" not in figs  # a CPU run: no device to be idle
    gp = ra.goodput()
    assert shown["Goodput"] == f"{100 * gp.goodput:.1f}%"
    _, wall = figs["goodput"]  # productive + each lost part: one bar that adds up to the wall time
    assert wall["part"].tolist() == ["productive", *gp.lost_s]
    assert wall["s"].sum() == pytest.approx(gp.wall_s)
    _, mfu = figs["mfu_steps"]
    assert mfu["step"].tolist() == ra.mfu.steps["step"].tolist()
    assert mfu["mfu"].tolist() == pytest.approx(ra.mfu.steps["mfu"].tolist())
    _, per_rank = figs["step_times"]
    assert sorted(set(per_rank["rank"])) == ["rank 0", "rank 1"]
    rank1 = ra.metrics[ra.metrics["rank"] == 1].sort_values("step")
    shown1 = per_rank[per_rank["rank"] == "rank 1"]
    assert shown1["step"].tolist() == rank1["step"].tolist()
    assert shown1["step_time_ms"].tolist() == pytest.approx(rank1["step_time_ms"].tolist())

    facts = frame(at, "field").set_index("field")["value"]
    assert facts["run_id"] == GOOD_RUN and facts["world_size"] == "2" and facts["backend"] == "gloo"
    config = frame(at, "key").set_index("key")["value"]
    assert config["model.n_layers"] == str(ra.manifest["config"]["model"]["n_layers"])
    assert config["optim.lr"] == str(ra.manifest["config"]["optim"]["lr"])
    shares = frame(at, "rank 1")
    assert shares["rank 1"].tolist() == pytest.approx([round(ra.ranks[1].breakdown[p]["pct"], 2) for p in parts])
    downloads = [b.proto.label for b in at.get("download_button")]
    assert downloads[0].startswith(plain("rank0.step7.json.gz") + " (") and len(downloads) == 2
    assert [b.proto.url for b in at.get("link_button")] == ["https://ui.perfetto.dev"]
    assert any(plain('choose "Open trace file"') in c for c in captions(at))
    assert plain("step 7") in [m.value.strip("*") for m in at.markdown]  # grouped by profiler window
    # A missing value (a CPU rank has no device) reads "n/a", not Streamlit's default literal "None".
    ranks_table = next(d for d in at.dataframe if "device events" in d.value.columns)
    assert ranks_table.value["device"].isna().all()
    assert {d.proto.placeholder for d in at.dataframe} == {"n/a"}


def test_overview_shows_the_analyzers_suggestions(open_page, analyses):
    from analyzer.verbs.suggest import report_suggestions

    entries = report_suggestions(analyses[SLOW_RUN])
    assert entries and entries[0]["rule"] == "straggler"
    at = open_page("overview", run=SLOW_RUN)
    labels = [e.label for e in at.expander if not e.label.startswith("Resolved config")]
    assert len(labels) == len(entries)
    assert labels[0].startswith(f"1. {plain(entries[0]['title'])} (confidence {entries[0]['confidence']})")
    commands = [e["change"]["command"] for e in entries if e["change"]["command"]]
    assert [c.value for c in at.code] == commands
    gain = entries[0]["predicted"]["gain"]
    assert any(f"{100 * gain:+.0f}% throughput" in m.value for m in at.markdown)


def test_overview_of_gpu_traces_shows_hta_overlap_and_exposed_comm(open_page, analyses):
    ra = analyses[GPU_RUN]
    at = open_page("overview", run=GPU_RUN)
    shown = metrics(at)
    # Exact by construction (tests/dashboard_support.py): 50% and 200/350.
    assert [r.comm_comp_overlap_pct for r in ra.ranks] == pytest.approx([50.0, 100 * 200 / 350])
    assert shown["Comm/compute overlap"] == "50.0–57.1%"
    assert shown["Exposed communication"] == "15.0–20.0%"
    assert shown["Step time"] == "1.0 ms"
    assert shown["MFU"] == "n/a"
    assert any(plain(ra.mfu.reason) in c for c in captions(at))
    assert ra.goodput() is None and "Goodput" not in shown and "goodput" not in vega_charts(at)  # traces only
    _, bars = vega_charts(at)["breakdown"]
    ms = {part: rows.sort_values("rank")["ms"].tolist() for part, rows in bars.groupby("part")}
    assert ms["compute"] == pytest.approx([0.4, 0.45])
    assert ms["overlapped_comm"] == pytest.approx([0.2, 0.2])
    assert ms["idle"] == pytest.approx([0.2, 0.2])
    # Why the GPU is idle: the analyzer's causes per rank, stacked; they add up to its idle.
    causes = ra.idle_causes().sort_values("rank")
    assert len(causes) == 2
    _, idle = vega_charts(at)["idle_causes"]
    for row in causes.itertuples(index=False):
        mine = idle[idle["rank"] == f"rank {row.rank}"].sort_values("order")
        assert mine["cause"].tolist() == ["host wait", "kernel wait", "other"]
        assert mine["ms"].tolist() == pytest.approx([row.host_wait_ms, row.kernel_wait_ms, row.other_ms])
        assert mine["ms"].sum() == pytest.approx(row.idle_ms)


def test_overview_of_bad_runs_shows_errors_not_tracebacks(open_page, runs_dir, analyses):
    at = open_page("overview", run=TRUNCATED_RUN)
    assert plain(analyses[TRUNCATED_RUN].errors[0]) in [e.value for e in at.error]
    assert metrics(at)["Step time"] != "n/a"  # rank 0 is still analyzed
    at = open_page("overview", run=NO_MANIFEST_RUN)
    with pytest.raises(AnalyzerError) as missing:
        analyze(runs_dir / NO_MANIFEST_RUN)
    assert [e.value for e in at.error] == [plain(str(missing.value))]
    assert metrics(at) == {}


@pytest.mark.parametrize("name", ["../../etc", "/etc", f"{GOOD_RUN}/../{SLOW_RUN}"])
def test_unsafe_run_names_are_refused(open_page, name):
    at = open_page("overview", run=name)
    assert len(at.error) == 1 and "refused" in at.error[0].value
    assert metrics(at) == {} and len(at.title) == 0


def test_symlink_out_of_runs_dir_is_not_a_run(open_page):
    at = open_page("overview", run="escape")
    assert "no run named" in at.error[0].value
    assert metrics(at) == {}


def test_trace_derived_names_are_escaped(open_page):
    at = open_page("overview", run=EVIL_RUN)
    title = at.title[0].value
    assert title == plain(EVIL_RUN)
    assert "](" not in title and "[x]" not in title


def test_sidebar_selection_updates_the_url(open_page):
    at = open_page("overview")
    assert "Choose a run" in at.info[0].value
    at.selectbox(key="selected_run").set_value(SLOW_RUN).run()
    assert at.query_params["run"] == SLOW_RUN
    assert at.title[0].value == plain(SLOW_RUN)


# --------------------------------------------------------------------------- timeline


def _load(runs_dir, name):
    from analyzer.ingest.load import load_traces

    files = sorted((runs_dir / name).glob("*.json.gz")) or sorted((runs_dir / name / "traces").glob("*.json.gz"))
    return load_traces(files)


def test_timeline_heatmap_and_window_of_gpu_traces(open_page, runs_dir, analyses):
    # The heatmap comes from the rank summaries' grids (equal to binning the events over the
    # same edges: tests/test_timeline_grids.py), with the events' alignment.
    ts = _load(runs_dir, GPU_RUN)
    by_events = overview({r: t.events for r, t in ts.ranks.items()}, {r: t.steps for r, t in ts.ranks.items()}, 200)
    ov, _ = analyses[GPU_RUN].timeline_overview(None, 200)
    assert ov.origins == by_events.origins
    at = open_page("timeline", run=GPU_RUN)
    figs = charts(at)
    heat = figs["timeline_heatmap"]["data"][0]
    assert heat["y"] == ["rank 0", "rank 1"]
    expected = ov.occupancy.pivot(index="rank", columns="bin", values="exposed_comm_frac").to_numpy()
    assert np.array_equal(np.array(heat["z"], dtype=float), expected)
    # Rank 0, first step: communication runs alone from 600 to 800 us, and
    # never before 400 us.
    centers_us = np.array(heat["x"]) * 1e3
    rank0 = np.array(heat["z"][0])
    assert (rank0[(centers_us > 610) & (centers_us < 790)] == 1.0).all()
    assert (rank0[centers_us < 590] == 0.0).all()
    # Default zoom: the first profiler step, 4 kernels (2 per rank), all drawn.
    assert at.slider(key="timeline_range").value == (0.0, 1.0)
    assert "4 of 4 events in this range" in captions(at)
    lines = figs["timeline_window_chart"]["data"]
    assert sorted(t["name"] for t in lines) == ["comm", "compute"]
    comm = next(t for t in lines if t["name"] == "comm")
    assert comm["type"] == "scattergl"
    # start, end, gap (null) per event, in ms, on the lane of each rank's stream 20.
    assert comm["x"] == pytest.approx([0.4, 0.8, None, 0.45, 0.8, None])
    yaxis = figs["timeline_window_chart"]["layout"]["yaxis"]
    lane_y = dict(zip(yaxis["ticktext"], yaxis["tickvals"]))
    # Four lanes, rank 0's first stream on top.
    assert lane_y == {"rank 0 · stream 7": 3, "rank 0 · stream 20": 2, "rank 1 · stream 7": 1, "rank 1 · stream 20": 0}
    assert comm["y"] == [2, 2, None, 0, 0, None]

    at.radio(key="timeline_state").set_value("compute").run()
    heat = charts(at)["timeline_heatmap"]["data"][0]
    expected = ov.occupancy.pivot(index="rank", columns="bin", values="compute_frac").to_numpy()
    assert np.array_equal(np.array(heat["z"], dtype=float), expected)
    # The critical path as RunAnalysis.critical_path holds it: one stacked bar series per HTA category,
    # one bar per profiled step of the picked rank (rank 0 first), values the analyzer's percentages.
    table = analyses[GPU_RUN].critical_path.table()
    mine = table.loc[table["rank"] == 0]
    assert len(mine) == 2
    bars = figs["critical_path_bounds"]["data"]
    assert [b["name"] for b in bars] == list(BOUND_CATEGORIES)
    for b in bars:
        assert b["x"] == [f"step {s}" for s in mine["step"]]
        assert b["y"] == pytest.approx(mine[b["name"]].tolist())
    assert at.selectbox(key="critical_path_rank").options == ["0", "1"]


def test_timeline_caps_the_events_drawn(open_page, runs_dir):
    ts = _load(runs_dir, GOOD_RUN)
    ov = overview({r: t.events for r, t in ts.ranks.items()}, {r: t.steps for r, t in ts.ranks.items()}, 200)
    at = open_page("timeline", run=GOOD_RUN)
    assert at.radio(key="timeline_state").options[:3] == ["data", "forward", "backward"]
    at.number_input(key="timeline_max_events").set_value(100).run()
    t0_ms, t1_ms = at.slider(key="timeline_range").value
    win = select_window(
        {r: t.events for r, t in ts.ranks.items()}, ov.origins, (round(t0_ms * 1e6), round(t1_ms * 1e6)), 100, ov.source
    )
    assert win.n_total > 100
    expected = (
        f"100 of {win.n_total:,} events in this range; the {win.n_total - 100:,} shortest are not drawn "
        "(narrow the range to see them)"
    )
    assert expected in captions(at)
    drawn = sum(len(t["x"][0::3]) for t in charts(at)["timeline_window_chart"]["data"])
    assert drawn == 100


# --------------------------------------------------------------------------- communication


def test_communication_page(open_page, analyses):
    ra = analyses[GPU_RUN]
    at = open_page("communication", run=GPU_RUN)
    table = frame(at, "comm/compute overlap % (HTA)")
    assert table["comm/compute overlap % (HTA)"].tolist() == pytest.approx([r.comm_comp_overlap_pct for r in ra.ranks])
    assert table["exposed comm % of step"].tolist() == pytest.approx([20.0, 15.0])
    assert table["exposed comm ms/step"].tolist() == pytest.approx([0.2, 0.15])
    assert table["waiting at collectives ms/step"].tolist() == pytest.approx(
        [r.breakdown["collective_wait"]["mean_ms"] for r in ra.ranks]
    )
    coll = frame(at, "arrival skew (ms)")
    assert len(coll) == len(ra.collectives) == 2
    assert coll["arrival skew (ms)"].tolist() == pytest.approx(ra.collectives["skew_ms"].tolist())
    assert coll["bytes"].tolist() == ra.collectives["bytes"].tolist()
    bars = charts(at)["comm_ranks"]["data"]
    assert bars[0]["y"] == pytest.approx([50.0, 100 * 200 / 350])


# --------------------------------------------------------------------------- stragglers


def test_stragglers_page_names_the_slow_rank(open_page, analyses):
    result = analyses[SLOW_RUN].stragglers
    assert result.ranks == [1]
    at = open_page("stragglers", run=SLOW_RUN)
    assert [w.value for w in at.warning] == [plain(result.verdict)]
    heat = charts(at)["straggler_ratio"]["data"][0]
    expected = result.per_step.pivot_table(index="rank", columns="step", values="step_time_ratio").to_numpy()
    assert np.allclose(np.array(heat["z"], dtype=float), expected, equal_nan=True)
    evidence = frame(at, "flagged").set_index("rank")
    assert bool(evidence.loc[1, "flagged"]) and not bool(evidence.loc[0, "flagged"])
    assert evidence.loc[1, "last_arrivals"] == result.per_rank[1].last_arrivals


def test_stragglers_page_without_a_straggler(open_page, analyses):
    at = open_page("stragglers", run=GOOD_RUN)
    assert [s.value for s in at.success] == [plain(analyses[GOOD_RUN].stragglers.verdict)]
    # A healthy run's few percent of noise is not painted saturated: the colour scale spans at least
    # 0.95-1.05 (fitted to the data it spanned the noise itself), and wider where a ratio is further off.
    heat = charts(at)["straggler_ratio"]["data"][0]
    z = np.array(heat["z"], dtype=float)
    far = float(np.nanmax(np.abs(z - 1.0)))
    assert (heat["zmin"], heat["zmax"]) == pytest.approx((1 - max(0.05, far), 1 + max(0.05, far)))
    assert any("spans at least 0.95-1.05" in c for c in captions(at))
    assert "no persistent straggler among 2 ranks" in analyses[GOOD_RUN].stragglers.verdict


# --------------------------------------------------------------------------- telemetry


def test_telemetry_page_plots_nvml_series(open_page):
    at = open_page("telemetry", run=TELEMETRY_RUN)
    util = charts(at)["telemetry_gpu_util_pct"]["data"]
    assert [t["name"] for t in util] == ["rank 0", "rank 1"]
    assert util[1]["y"] == pytest.approx([51.0, 61.0, 71.0])
    assert util[0]["x"] == pytest.approx([0.0, 1.0, 2.0])
    throttled = frame(at, "throttle_reasons")
    assert throttled["rank"].tolist() == [1]


@pytest.mark.parametrize("name", [GOOD_RUN, GPU_RUN])
def test_telemetry_page_without_samples(open_page, name):
    at = open_page("telemetry", run=name)
    assert at.info[0].value.startswith("This run had no GPU telemetry.")
    assert charts(at) == {}


# --------------------------------------------------------------------------- compare


def test_compare_page_shows_gate_and_deltas(open_page, analyses):
    from analyzer.verbs.check import check, explain
    from analyzer.verbs.compare import compare

    base, cand = analyses[GOOD_RUN], analyses[SLOW_RUN]
    outcome = check(base, cand)
    comparison = compare(base, cand)
    at = open_page("compare", run=SLOW_RUN, base=GOOD_RUN)
    # One box per verdict colour: an inconclusive gate is a warning, never a green pass.
    boxes = {"regression": at.error, "inconclusive": at.warning, "pass": at.success}
    for verdict, shown_boxes in boxes.items():
        texts = [g.value for g in shown_boxes]
        if verdict == outcome.result.verdict:
            assert texts == [plain(explain(outcome))]
        else:
            assert plain(explain(outcome)) not in texts
    shown = metrics(at)
    # Each run's own MFU, the figure of its overview and the runs table; the drop uses the comparable one.
    assert shown["MFU baseline"] == f"{100 * base.mfu.median:.1f}%"
    assert shown["MFU candidate"] == f"{100 * cand.mfu.median:.1f}%"
    assert shown["MFU drop"] == f"{100 * comparison.mfu.drop:.1f}%"
    # The badge's change is the difference of the two figures shown (not of the candidate on another peak).
    badge = next(m for m in at.metric if m.label == "MFU candidate")
    want = float(shown["MFU candidate"].rstrip("%")) - float(shown["MFU baseline"].rstrip("%"))
    assert badge.delta == f"{want:+.1f} pts"
    if comparison.mfu.cand_on_base_peak is not None:
        assert f"{100 * comparison.mfu.cand_on_base_peak:.1f}% on the baseline's measured peak" in " ".join(
            captions(at)
        )
    assert shown["Step time"] == f"{cand.step_time.ms:.0f} ms"
    phases = frame_named(at, [d.name for d in comparison.phases])
    assert phases["name"].tolist() == [d.name for d in comparison.phases]
    assert phases["delta (ms)"].tolist() == pytest.approx([d.delta for d in comparison.phases])


def test_compare_with_an_unreadable_baseline(open_page):
    at = open_page("compare", run=GOOD_RUN, base=NO_MANIFEST_RUN)
    assert at.error[0].value.startswith(plain("baseline: "))
    assert metrics(at) == {}


# --------------------------------------------------------------------------- one number per figure


def test_one_step_time_and_one_mfu_on_every_surface(open_page, analyses, runs_dir, tmp_path):
    """The issue's case: one run showed 60.5 ms and ~83 ms, and MFU 43.7 % vs 23.5 %, by surface.

    The text report, the JSON report, the HTML page, the runs table, the
    overview and the compare page all show the run's headline step time and
    MFU (the dashboard rounds for display).
    """
    from analyzer.verbs.compare import compare
    from analyzer.render.html import report_html as render_html
    from analyzer.render.text import report_text as render_text
    from analyzer.verbs.report import report_json

    ra = analyses[SLOW_RUN]
    step_ms, mfu = ra.step_time.ms, ra.mfu.median
    # Profiled windows are a different figure (slower under the profiler), shown beside the headline, labelled.
    assert ra.step_time.profiled_ms is not None and abs(ra.step_time.profiled_ms - step_ms) > 1.0
    doc = report_json(ra)
    assert doc["run"]["step_time_ms"] == step_ms and doc["run"]["mfu"]["median"] == mfu
    assert doc["run"]["step_time"]["label"] == "steady-state steps (metrics records)"
    text = render_text(ra)
    assert f"Step time: {step_ms:.2f} ms, steady-state steps (metrics records)" in text
    assert f"profiled windows {ra.step_time.profiled_ms:.2f} ms" in text
    assert f"MFU: {100 * mfu:.2f}% median" in text
    page = render_html(ra)
    assert f"<div>step time<b>{step_ms:.2f} ms</b>steady-state steps (metrics records)" in page
    assert f"<div>MFU<b>{100 * mfu:.2f}%</b>" in page
    # Each rank's headline follows the run's choice; both kinds sit side by side.
    for r in ra.ranks:
        assert r.step_time_ms == r.steady_step_time_ms and r.profiled_step_time_ms is not None
        assert doc["ranks"][r.rank]["step_time_ms"] == r.steady_step_time_ms

    runs = open_page("runs").dataframe[0].value.set_index("run")
    assert runs.loc[SLOW_RUN, "step time (ms)"] == step_ms and runs.loc[SLOW_RUN, "MFU"] == mfu
    shown = metrics(open_page("overview", run=SLOW_RUN))
    assert shown["Step time"] == f"{step_ms:.0f} ms" and shown["MFU"] == f"{100 * mfu:.1f}%"
    c = compare(analyses[GOOD_RUN], ra)
    assert c.step_time_median.cand == step_ms and c.mfu.cand == mfu
    shown = metrics(open_page("compare", run=SLOW_RUN, base=GOOD_RUN))
    assert shown["Step time"] == f"{step_ms:.0f} ms" and shown["MFU candidate"] == f"{100 * mfu:.1f}%"


def test_breakdown_chart_shows_waiting_at_the_collective_as_its_own_part(open_page, analyses):
    """The slow-rank run: fast rank 0 waits for rank 1 at the all-reduce; the chart has a collective_wait bar."""
    ra = analyses[SLOW_RUN]
    at = open_page("overview", run=SLOW_RUN)
    spec, bars = vega_charts(at)["breakdown"]
    assert "collective_wait" in spec["encoding"]["color"]["scale"]["domain"]
    wait = bars[bars["part"] == "collective_wait"].set_index("rank")["ms"]
    assert wait["rank 0"] == pytest.approx(ra.rank(0).breakdown["collective_wait"]["mean_ms"])
    assert wait["rank 0"] > 100.0  # about 335 ms in step 6, 0 in step 7: mean 168 ms
    assert any("collective_wait is time spent waiting at a collective" in c for c in captions(at))


# --------------------------------------------------------------------------- many ranks

# Moderate on purpose (a 1,024-rank folder is bench/bench_dashboard.py's); above dashboard.ui.FEW_RANKS,
# so every page takes its many-rank form: rank axes, the slowest TOP_K, pickers.
MANY = 64
MANY_SLOW = 21


@pytest.fixture(scope="module")
def many_dir(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("many") / "runs"
    write_many_rank_traces(runs / MANY_RANKS_RUN, world=MANY, straggler=MANY_SLOW)
    analyze(runs / MANY_RANKS_RUN)  # parse cache and rank summaries, once: the pages open the run from them
    return runs


@pytest.fixture
def open_many(many_dir, monkeypatch):
    return _opener(many_dir, monkeypatch)


@pytest.fixture
def many(many_dir):
    return analyze(many_dir / MANY_RANKS_RUN)


def test_many_ranks_analysis_names_the_straggler(many):
    from dashboard.ui import FEW_RANKS, TOP_K

    assert MANY > FEW_RANKS and TOP_K < MANY
    assert many.stragglers.ranks == [MANY_SLOW]
    assert [r.rank for r in many.stragglers.slowest(3)][0] == MANY_SLOW


def test_many_ranks_runs_table(open_many):
    at = open_many("runs")
    row = at.dataframe[0].value.set_index("run").loc[MANY_RANKS_RUN]
    assert row["world size"] == MANY and row["status"] == "ok"


def test_many_ranks_stragglers_page_heatmap_top_k_and_picker(open_many, many):
    from dashboard.ui import TOP_K

    at = open_many("stragglers", run=MANY_RANKS_RUN)
    assert [w.value for w in at.warning] == [plain(many.stragglers.verdict)]
    fig = charts(at)["straggler_ratio"]
    heat = fig["data"][0]
    assert heat["y"] == list(range(MANY))  # ranks on a numeric axis, not 64 labelled rows
    z = np.array(heat["z"], dtype=float)
    assert z.shape == (MANY, 6)
    assert z[MANY_SLOW] == pytest.approx([1.3] * 6) and z[0] == pytest.approx([1.0] * 6)
    assert fig["layout"]["height"] < 140 + 40 * MANY
    tables = [d.value for d in at.dataframe if "flagged" in d.value.columns]
    assert sorted(len(t) for t in tables) == [TOP_K, MANY]
    top = next(t for t in tables if len(t) == TOP_K)
    assert top["rank"].iloc[0] == MANY_SLOW and bool(top["flagged"].iloc[0])
    picker = at.selectbox(key="straggler_rank")
    assert picker.value == MANY_SLOW and len(picker.options) == MANY and picker.options[0] == "rank 21"
    picker.set_value(5).run()
    assert not at.exception
    steps = frame(at, "step")
    assert len(steps) == 6 and steps["step_time_ratio"].tolist() == pytest.approx([1.0] * 6)
    parts = frame(at, "% of step").set_index("part")
    assert parts.loc["compute", "mean ms per step"] == pytest.approx(many.rank(5).breakdown["compute"]["mean_ms"])


def test_many_ranks_overview_draws_the_slowest_ranks(open_many, many):
    from dashboard.ui import TOP_K

    at = open_many("overview", run=MANY_RANKS_RUN)
    assert metrics(at)["Step time"] == f"{many.step_time.ms:.1f} ms"
    _, bars = vega_charts(at)["breakdown"]
    shown = list(dict.fromkeys(bars["rank"]))
    assert len(shown) == TOP_K and shown[0] == f"rank {MANY_SLOW}"
    assert shown == [f"rank {r.rank}" for r in many.stragglers.slowest(TOP_K)]
    assert any(f"The {TOP_K} slowest of {MANY} ranks" in c for c in captions(at))
    shares = frame(at, "idle")
    assert len(shares) == MANY and shares["rank"].tolist() == list(range(MANY))
    _, lines = vega_charts(at)["step_times"]
    assert set(lines["rank"]) == set(shown)
    assert len(at.get("download_button")) == 1
    assert len(at.selectbox(key="download_pick").options) == MANY


def test_many_ranks_communication_page(open_many, many):
    at = open_many("communication", run=MANY_RANKS_RUN)
    traces = charts(at)["comm_ranks"]["data"]
    assert [t["type"] for t in traces] == ["scattergl", "scattergl"]
    assert traces[0]["x"] == list(range(MANY))
    assert traces[1]["y"] == pytest.approx([r.exposed_comm_pct for r in many.ranks])
    assert len(frame(at, "exposed comm % of step")) == MANY


def test_many_ranks_timeline_bins_from_summaries_and_reads_only_the_zoomed_ranks(open_many, many, monkeypatch):
    import analyzer.ingest.load as load

    read: list[list[str]] = []
    real = load.load_traces

    def recording(files, *args, **kwargs):
        read.append(sorted(Path(f).name for f in files))
        return real(files, *args, **kwargs)

    monkeypatch.setattr(load, "load_traces", recording)
    at = open_many("timeline", run=MANY_RANKS_RUN)
    heat = charts(at)["timeline_heatmap"]["data"][0]
    assert heat["y"] == list(range(MANY))
    ov, _ = many.timeline_overview(None, 200)
    expected = ov.occupancy.pivot(index="rank", columns="bin", values="exposed_comm_frac").to_numpy()
    assert np.array_equal(np.array(heat["z"], dtype=float), expected)
    # Rank 0, first step (ms since its start): GEMM 0-6, all-reduce 4-8, the straggler arrives at 7:
    # waiting at the collective from 6 to 7, exposed communication from 7 to 8.
    centers_ms = np.array(heat["x"])
    rank0 = ov.occupancy[ov.occupancy["rank"] == 0]
    assert (np.array(heat["z"][0])[(centers_ms > 7.3) & (centers_ms < 7.7)] == 1.0).all()
    inside = (centers_ms > 6.3) & (centers_ms < 6.7)
    assert inside.any() and (rank0["collective_wait_frac"].to_numpy()[inside] == 1.0).all()
    # The zoom reads two ranks' traces: the slowest and rank 0, nothing else.
    assert at.multiselect(key="timeline_ranks").value == [MANY_SLOW, 0]
    assert read == [["rank0.pt.trace.json.gz", f"rank{MANY_SLOW}.pt.trace.json.gz"]]
    lanes = charts(at)["timeline_window_chart"]["layout"]["yaxis"]["ticktext"]
    assert {t.split(" · ")[0] for t in lanes} == {"rank 0", f"rank {MANY_SLOW}"}
