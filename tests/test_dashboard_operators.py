"""The Operators and Modules pages under streamlit.testing.v1.AppTest.

A runs folder with the committed example runs (CPU: host time only, no
shapes) and a synthetic two-rank H100 trace with recorded shapes, modules
and a backward pass (``write_shaped_gpu_traces``), so the roofline has
points with exact figures. Every number on the pages is checked against
the analyzer's tables (``RunAnalysis.attribution``, ``RunAnalysis.roofline``).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_support import EXAMPLES, GOOD_RUN, fresh_caches  # noqa: F401
from synth import KinetoTrace

from analyzer.api import analyze
from dashboard.cli import APP_PATH, RUNS_DIR_ENV

TIMEOUT_S = 300  # cold analysis on a loaded 2-core machine
SHAPED_RUN = "gpu-shapes"
MAIN, AUTOGRAD = 100, 200
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
BIG, SMALL_M = 4096, 16
BIG_US = {0: 250, 1: 300}  # rank 1's forward GEMM is slower


def _on_thread(t: KinetoTrace, launch_us: float, tid: int) -> None:
    """Move the runtime call starting at ``launch_us`` onto ``tid`` (the builder puts launches on the main thread)."""
    for ev in t.events:
        if ev.get("cat") == "cuda_runtime" and ev["ts"] == t._t(launch_us):
            ev["tid"] = tid


def write_shaped_gpu_traces(folder: Path) -> None:
    """Two ranks, two 1000 us steps each, H100 (synthetic, exact).

    Per step, in ``nn.Module: model``: ``blocks.0`` runs aten::linear > aten::addmm
    [4096 x 4096] x [4096 x 4096] (bf16) launching one GEMM (250 us on rank 0,
    300 us on rank 1: compute-bound); ``head`` runs a [16 x 4096] x [4096 x 4096]
    addmm (a 20 us GEMM: memory-bound) and an aten::add (15 us, no shapes). The
    big addmm's backward node (autograd thread) launches two 250 us GEMMs.
    """
    folder.mkdir(parents=True, exist_ok=True)
    bf16 = "c10::BFloat16"
    for rank in (0, 1):
        t = KinetoTrace(rank=rank, world_size=2, tid=MAIN)
        for i in range(2):
            b = 100 + 1000 * i
            seq = 10 * i
            t.step(3 + i, b, 1000)
            t.annotation("nn.Module: model", b + 1, 300, tid=MAIN)
            t.annotation("nn.Module: blocks.0", b + 2, 200, tid=MAIN)
            t.cpu_op(
                "aten::linear",
                b + 10,
                50,
                tid=MAIN,
                args={"Sequence number": seq + 6, "Fwd thread id": 0},
                input_dims=[[BIG, BIG], [BIG, BIG], [BIG]],
                input_types=[bf16] * 3,
            )
            t.cpu_op(
                "aten::addmm",
                b + 20,
                30,
                tid=MAIN,
                args={"Sequence number": seq + 7, "Fwd thread id": 0},
                input_dims=[[BIG], [BIG, BIG], [BIG, BIG], [], []],
                input_types=[bf16] * 3 + ["Scalar", "Scalar"],
            )
            t.kernel(GEMM, b + 60, BIG_US[rank], launch_us=b + 25)
            t.annotation("nn.Module: head", b + 210, 80, tid=MAIN)
            t.cpu_op(
                "aten::linear",
                b + 212,
                40,
                tid=MAIN,
                args={"Sequence number": seq + 8, "Fwd thread id": 0},
                input_dims=[[SMALL_M, BIG], [BIG, BIG], [BIG]],
                input_types=[bf16] * 3,
            )
            t.cpu_op(
                "aten::addmm",
                b + 215,
                20,
                tid=MAIN,
                args={"Sequence number": seq + 9, "Fwd thread id": 0},
                input_dims=[[BIG], [SMALL_M, BIG], [BIG, BIG], [], []],
                input_types=[bf16] * 3 + ["Scalar", "Scalar"],
            )
            t.kernel(GEMM, b + 370, 20, launch_us=b + 220)
            t.cpu_op("aten::add", b + 260, 10, tid=MAIN)
            t.kernel("vectorized_elementwise_kernel<add>", b + 392, 15, launch_us=b + 262)
            # Backward of the big addmm (seq + 7) on the autograd thread: two GEMMs.
            t.cpu_op(
                "autograd::engine::evaluate_function: AddmmBackward0",
                b + 400,
                100,
                tid=AUTOGRAD,
                args={"Sequence number": seq + 7, "Fwd thread id": 1},
            )
            t.cpu_op("AddmmBackward0", b + 405, 90, tid=AUTOGRAD, args={"Sequence number": seq + 7, "Fwd thread id": 1})
            t.cpu_op("aten::mm", b + 410, 30, tid=AUTOGRAD)
            t.kernel(GEMM, b + 420, 250, launch_us=b + 415)
            t.cpu_op("aten::mm", b + 450, 30, tid=AUTOGRAD)
            t.kernel(GEMM, b + 680, 250, launch_us=b + 455)
            _on_thread(t, b + 415, AUTOGRAD)
            _on_thread(t, b + 455, AUTOGRAD)
        t.write(folder / f"rank{rank}.pt.trace.json.gz")


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("dashboard-ops") / "runs"
    runs.mkdir(parents=True)
    shutil.copytree(EXAMPLES / GOOD_RUN, runs / GOOD_RUN, ignore=shutil.ignore_patterns(".analyzer-cache"))
    write_shaped_gpu_traces(runs / SHAPED_RUN)
    return runs


@pytest.fixture(scope="module")
def analyses(runs_dir) -> dict:
    return {name: analyze(runs_dir / name) for name in (GOOD_RUN, SHAPED_RUN)}


@pytest.fixture
def open_page(runs_dir, monkeypatch):
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs_dir))

    def _open(page: str, **params: str) -> AppTest:
        at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT_S)
        for key, value in params.items():
            at.query_params[key] = value
        at.switch_page(f"views/{page}.py")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    return _open


def vega_charts(at: AppTest) -> dict[str, tuple[dict, object]]:
    out = {}
    for el in at.get("vega_lite_chart"):
        spec = json.loads(el.proto.spec)
        out[spec["name"]] = (spec, pa.ipc.open_stream(el.proto.data.data).read_pandas())
    return out


def table(at: AppTest, column: str):
    found = [d.value for d in at.dataframe if column in d.value.columns]
    assert len(found) == 1, f"{len(found)} tables with column {column!r}"
    return found[0]


def infos(at: AppTest) -> str:
    return " ".join(i.value for i in at.info)


# --------------------------------------------------------------------------- the analyzer's figures (exact)


def test_the_synthetic_trace_has_exact_roofline_figures(analyses):
    """The hand-worked answer the page tests rely on (rank 0 and both ranks summed)."""
    ra = analyses[SHAPED_RUN]
    rf = ra.roofline(0)
    pts = rf.points.set_index(["op", "backward", "input_dims"])
    big = pts.loc[("aten::addmm", False, json.dumps([[BIG], [BIG, BIG], [BIG, BIG], [], []], separators=(",", ":")))]
    assert big["calls"] == 2 and big["device_ms"] == pytest.approx(0.5)
    assert big["flops"] == 2 * (2 * BIG**3)
    assert big["bytes"] == 2 * 2 * (BIG + 3 * BIG * BIG)  # bias, A, B, out at 2 bytes each, per call
    assert big["achieved_flops_per_s"] == pytest.approx(2 * BIG**3 / 250e-6)
    assert big["bound"] == "compute"
    assert big["efficiency_pct"] == pytest.approx(100 * 2 * BIG**3 / 250e-6 / 989.4e12)
    small = pts.loc[
        ("aten::addmm", False, json.dumps([[BIG], [SMALL_M, BIG], [BIG, BIG], [], []], separators=(",", ":")))
    ]
    small_bytes = 2 * (BIG + SMALL_M * BIG + BIG * BIG + SMALL_M * BIG)
    assert small["bound"] == "memory"
    assert small["efficiency_pct"] == pytest.approx(100 * small_bytes / 20e-6 / 3.35e12)
    # Backward: the node's two GEMMs count to the forward addmm, 2x its FLOPs and bytes.
    bwd = pts.loc[("aten::addmm", True, json.dumps([[BIG], [BIG, BIG], [BIG, BIG], [], []], separators=(",", ":")))]
    assert bwd["calls"] == 2 and bwd["device_ms"] == pytest.approx(1.0) and bwd["flops"] == 2 * 2 * (2 * BIG**3)
    assert rf.roofs["ridge_flop_per_byte"].tolist() == pytest.approx([989.4e12 / 3.35e12])
    summed = ra.roofline().points.set_index(["op", "backward", "input_dims"])
    assert summed.loc[big.name, "device_ms"] == pytest.approx(0.5 + 0.6) and summed.loc[big.name, "calls"] == 4


# --------------------------------------------------------------------------- Operators


def test_operators_table_equals_the_analyzers(open_page, analyses):
    ra = analyses[SHAPED_RUN]
    at = open_page("operators", run=SHAPED_RUN)
    shown = table(at, "% of step")
    ops = ra.attribution.summed("ops")
    rf = ra.roofline().ops.set_index(["op", "backward"])
    assert shown["op"].tolist() == ops["op"].astype(str).tolist()
    assert shown["direction"].tolist() == ["backward" if b else "forward" for b in ops["backward"]]
    assert shown["device ms"].tolist() == pytest.approx(ops["device_ms"].tolist())
    assert shown["host ms"].tolist() == pytest.approx(ops["host_ms"].tolist())
    assert shown["calls"].tolist() == ops["calls"].tolist()
    assert shown["% of step"].tolist() == pytest.approx(ops["share_of_step_pct"].tolist())
    for row in shown.to_dict("records"):
        key = (row["op"], row["direction"] == "backward")
        if key in rf.index:
            assert row["achieved TFLOP/s"] == pytest.approx(rf.loc[key, "achieved_flops_per_s"] / 1e12)
            assert row["bound"] == rf.loc[key, "bound"] and row["roofline model"] == rf.loc[key, "family"]
            assert row["efficiency %"] == pytest.approx(rf.loc[key, "efficiency_pct"])
        else:
            assert row["bound"] is None or row["bound"] != row["bound"]  # no model: empty cell
    assert set(shown.loc[shown["bound"].notna(), "op"]) == {"aten::addmm"}
    # The shapes of the first op (the backward addmm has most device time), its kernels.
    shapes = table(at, "input dims")
    assert shapes["device ms"].sum() == pytest.approx(ops["device_ms"].iloc[0])
    kernels = table(at, "kernel")
    assert kernels["kernel"].tolist() == [GEMM]


def test_operators_per_rank_and_shape_drilldown(open_page, analyses):
    ra = analyses[SHAPED_RUN]
    at = open_page("operators", run=SHAPED_RUN)
    at.selectbox(key="operators_scope").select("rank 1").run()
    at.selectbox(key="operators_op").select(("aten::addmm", False)).run()
    assert not at.exception
    ops1 = ra.ops(1)
    shown = table(at, "% of step")
    assert shown["device ms"].tolist() == pytest.approx(ops1["device_ms"].tolist())
    shapes = table(at, "input dims")
    pts = ra.roofline(1).points
    fwd = pts.loc[(pts["op"] == "aten::addmm") & ~pts["backward"]].set_index("input_dims")
    assert sorted(shapes["input dims"]) == sorted(fwd.index)
    for row in shapes.itertuples(index=False):
        p = fwd.loc[row[0]]
        assert row[2] == p["calls"] and row[4] == pytest.approx(p["device_ms"])
        assert row[5] == pytest.approx(p["flops"] / p["calls"] / 1e9)  # GFLOP per call
        assert row[8] == pytest.approx(p["achieved_flops_per_s"] / 1e12)
        assert row[10] == p["bound"] and row[11] == pytest.approx(p["efficiency_pct"])
    # Rank 1's forward GEMM ran 300 us: its achieved rate is rank 1's, not the sum's.
    big = fwd.loc[json.dumps([[BIG], [BIG, BIG], [BIG, BIG], [], []], separators=(",", ":"))]
    assert big["achieved_flops_per_s"] == pytest.approx(2 * BIG**3 / 300e-6)


def test_roofline_chart_points_roofs_and_ridge(open_page, analyses):
    ra = analyses[SHAPED_RUN]
    at = open_page("operators", run=SHAPED_RUN)
    spec, data = vega_charts(at)["roofline"]
    pts = ra.roofline().points
    assert len(data) == len(pts) == 3  # big forward, small forward, big backward
    merged = data.set_index(["op", "direction", "input_dims"]).sort_index()
    for p in pts.itertuples(index=False):
        row = merged.loc[(p.op, "backward" if p.backward else "forward", p.input_dims)]
        assert row["flop_per_byte"] == pytest.approx(p.flop_per_byte)
        assert row["achieved_flops_per_s"] == pytest.approx(p.achieved_flops_per_s)
    assert spec["layer"][0]["encoding"]["x"]["scale"]["type"] == "log"
    assert spec["layer"][0]["encoding"]["y"]["scale"]["type"] == "log"
    roofs = spec["layer"][1]["data"]["values"]
    ridge = spec["layer"][2]["data"]["values"]
    assert [r["x"] for r in ridge] == pytest.approx([989.4e12 / 3.35e12]) and ridge[0]["y"] == pytest.approx(989.4e12)
    memory = [r for r in roofs if r["roof"].startswith("memory")]
    assert all(r["y"] == pytest.approx(r["x"] * 3.35e12) for r in memory)
    compute = [r for r in roofs if not r["roof"].startswith("memory")]
    assert all(r["y"] == pytest.approx(989.4e12) for r in compute)


def test_operators_of_a_cpu_run_say_what_is_missing(open_page, analyses):
    ra = analyses[GOOD_RUN]
    at = open_page("operators", run=GOOD_RUN)
    text = infos(at)
    assert "no device kernels" in text and "No op on the roofline" in text
    assert "roofline" not in vega_charts(at)
    # Host time, largest first; no column of device zeros that would read as measured.
    shown = table(at, "host ms")
    ops = ra.attribution.summed("ops").sort_values("host_ms", ascending=False, kind="stable")
    assert shown["host ms"].tolist() == pytest.approx(ops["host_ms"].tolist())
    assert not {"device ms", "device ms (inclusive)", "% of step", "bound"} & set(shown.columns)
    assert "shows each op's host time" in text
    assert "No recorded input shapes" in text


def test_unknown_device_draws_points_without_roofs(open_page, runs_dir, tmp_path, monkeypatch):
    """A GPU the peak table does not know: points, no roof layers, and the page says why."""
    runs = tmp_path / "runs"
    folder = runs / "unknown-gpu"
    folder.mkdir(parents=True)
    for src in sorted((runs_dir / SHAPED_RUN).glob("*.json.gz")):
        import gzip

        doc = json.loads(gzip.decompress(src.read_bytes()))
        for d in doc.get("deviceProperties", []):
            d["name"] = "Mystery Accelerator 9000"
        (folder / src.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs))
    at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT_S)
    at.query_params["run"] = "unknown-gpu"
    at.switch_page("views/operators.py")
    at.run()
    assert not at.exception
    spec, data = vega_charts(at)["roofline"]
    assert len(spec["layer"]) == 1 and len(data) == 3
    assert "peaks are unknown" in infos(at)


# --------------------------------------------------------------------------- Modules


def test_modules_icicle_and_table_equal_the_analyzers(open_page, analyses):
    ra = analyses[SHAPED_RUN]
    at = open_page("modules", run=SHAPED_RUN)
    charts = vega_charts(at)
    mods = ra.attribution.summed("modules")
    for direction, backward in (("forward", False), ("backward", True)):
        _, bars = charts[f"modules_{direction}"]
        mine = mods.loc[(mods["backward"] == backward) & (mods["device_ms"] > 0)].set_index("module")
        assert sorted(bars["module"]) == sorted(mine.index)
        for b in bars.itertuples(index=False):
            assert b.x1 - b.x0 == pytest.approx(mine.loc[b.module, "device_ms"])
            parent = b.module.rsplit("/", 1)[0] if "/" in b.module else None
            if parent:  # a child lies within its parent
                p = bars.set_index("module").loc[parent]
                assert p["x0"] - 1e-9 <= b.x0 and b.x1 <= p["x1"] + 1e-9
    # Forward: model > blocks.0 (the big GEMM: 0.25 + 0.3 ms) and head (20 us GEMM + 15 us add per step, x4).
    fwd = mods.loc[~mods["backward"]].set_index("module")["device_ms"]
    assert fwd["model/blocks.0"] == pytest.approx(1.1) and fwd["model/head"] == pytest.approx(4 * 0.035)
    bwd = mods.loc[mods["backward"]].set_index("module")["device_ms"]
    assert bwd["model/blocks.0"] == pytest.approx(2.0)
    shown = table(at, "device ms (inclusive)")
    assert len(shown) == len(mods)
    key = shown.set_index(["module", "direction"])
    for m in mods.itertuples(index=False):
        assert key.loc[(m.module, "backward" if m.backward else "forward"), "device ms (inclusive)"] == pytest.approx(
            m.device_ms
        )


def test_modules_depth_and_rank(open_page, analyses):
    ra = analyses[SHAPED_RUN]
    at = open_page("modules", run=SHAPED_RUN)
    at.selectbox(key="modules_scope").select("rank 0").run()
    at.slider(key="modules_depth").set_value(0).run()
    assert not at.exception
    _, bars = vega_charts(at)["modules_forward"]
    mods = ra.modules(0)
    assert bars["module"].tolist() == ["model"]
    root = mods.loc[(mods["module"] == "model") & ~mods["backward"], "device_ms"].item()
    assert bars["x1"].item() - bars["x0"].item() == pytest.approx(root) == pytest.approx(0.25 * 2 + 0.035 * 2)
    assert table(at, "device ms (inclusive)")["module"].tolist() == ["model", "model"]


def test_modules_of_a_run_without_module_ranges(open_page, analyses):
    at = open_page("modules", run=GOOD_RUN)
    if analyses[GOOD_RUN].modules().empty:
        assert "No nn.Module ranges" in infos(at)
    else:  # a CPU run: host time is the measure
        assert "host time (the wall time of the module's calls) is the only measure" in " ".join(
            c.value for c in at.caption
        )


def test_modules_of_a_cpu_trace_use_host_time(tmp_path, monkeypatch):
    """No device kernels: the icicle's widths are the module table's inclusive host time, and the page says so."""
    runs = tmp_path / "runs"
    t = KinetoTrace(rank=0, world_size=1, gpu=False, tid=MAIN)
    for i in range(2):
        b = 100 + 1000 * i
        t.step(1 + i, b, 1000)
        t.annotation("nn.Module: model", b + 1, 600, tid=MAIN)
        t.annotation("nn.Module: blocks.0", b + 2, 400, tid=MAIN)
        t.cpu_op("aten::mm", b + 10, 300, tid=MAIN)
        t.annotation("nn.Module: head", b + 410, 150, tid=MAIN)
        t.cpu_op("aten::add", b + 420, 100, tid=MAIN)
    t.write(runs / "cpu-modules" / "rank0.pt.trace.json.gz")
    mods = analyze(runs / "cpu-modules").attribution.summed("modules").set_index("module")
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs))
    at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT_S)
    at.query_params["run"] = "cpu-modules"
    at.switch_page("views/modules.py")
    at.run()
    assert not at.exception
    assert at.radio(key="modules_measure").value == "host time"
    assert "host time (the wall time of the module's calls) is the only measure" in " ".join(
        c.value for c in at.caption
    )
    shown = next(d.value for d in at.dataframe if "host ms" in d.value.columns)
    assert not {"device ms (inclusive)", "device ms (self)", "% of step"} & set(shown.columns)
    _, bars = vega_charts(at)["modules_forward"]
    assert sorted(bars["module"]) == ["model", "model/blocks.0", "model/head"]
    for b in bars.itertuples(index=False):
        assert b.x1 - b.x0 == pytest.approx(mods.loc[b.module, "host_ms"])
    assert mods.loc["model", "host_ms"] == pytest.approx(1.2) and mods.loc["model/head", "host_ms"] == pytest.approx(
        0.3
    )
