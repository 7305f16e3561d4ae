"""Attribution of device time to ops, modules and annotations (analyzer.metrics.attribution).

Synthetic traces with exact answers (tests/synth.py), an invariant of the
vectorized nesting against the stack walk, and the sums on every shared
real trace (skipped when ../shared is absent), with the annotation
breakdown cross-checked against HTA's get_gpu_user_annotation_breakdown.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer.ingest.load import load_trace
from analyzer.metrics.attribution import (
    RunAttribution,
    attribute,
    rank_attribution,
    run_attribution,
    _sum_over_ranks,
    _sum_over_ranks_grouped,
)
from analyzer.metrics.launch import innermost_containing
from analyzer.metrics.nesting import nest, stack_parents
from synth import KinetoTrace

MAIN, AUTOGRAD = 100, 200
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"


def _load(t: KinetoTrace, tmp_path: Path, name: str = "rank0.json.gz"):
    rt = load_trace(t.write(tmp_path / name))
    return rt.events, rt.steps


def training_step(t: KinetoTrace) -> None:
    """One step (0..1000 us): a forward linear inside modules and an annotation, its backward on
    the autograd thread, a graph replay, a kernel launched outside any op and one with no launch."""
    t.step(1, 0, 1000)
    t.annotation("## forward ##", 0, 300, tid=MAIN)
    t.annotation("nn.Module: blocks.0", 1, 200, tid=MAIN)
    t.annotation("nn.Module: attn", 2, 100, tid=MAIN)
    # aten::linear 10..60 (seq 6, as PyTorch numbers it: the TBackward0 of its aten::t) > aten::addmm 20..50
    # (seq 7, forward) launching a 40 us GEMM at 25.
    t.cpu_op(
        "aten::linear",
        10,
        50,
        tid=MAIN,
        args={"Sequence number": 6, "Fwd thread id": 0},
        input_dims=[[8, 16], [32, 16], [32]],
        input_types=["float"] * 3,
    )
    t.cpu_op(
        "aten::addmm",
        20,
        30,
        tid=MAIN,
        args={"Sequence number": 7, "Fwd thread id": 0},
        input_dims=[[32], [8, 16], [16, 32], [], []],
        input_types=["float"] * 3 + ["Scalar", "Scalar"],
    )
    t.kernel(GEMM, 100, 40, launch_us=25)
    # An elementwise op in blocks.0 but outside attn: 20 us kernel.
    t.cpu_op("aten::gelu", 150, 20, tid=MAIN)
    t.kernel("vectorized_elementwise_kernel<gelu>", 160, 20, launch_us=155)
    # Backward on the autograd thread: the node of seq 7 (evaluate_function > AddmmBackward0 > aten::mm x2).
    t.cpu_op(
        "autograd::engine::evaluate_function: AddmmBackward0",
        400,
        100,
        tid=AUTOGRAD,
        args={"Sequence number": 7, "Fwd thread id": 1},
    )
    t.cpu_op("AddmmBackward0", 405, 90, tid=AUTOGRAD, args={"Sequence number": 7, "Fwd thread id": 1})
    t.cpu_op("aten::mm", 410, 30, tid=AUTOGRAD)
    t.kernel(GEMM, 450, 30, launch_us=415, args={})
    t.cpu_op("aten::mm", 450, 30, tid=AUTOGRAD)
    t.kernel(GEMM, 480, 50, launch_us=455)
    # A custom autograd.Function (seq 9) with an op inside sharing its number: its node counts to the Function.
    t.cpu_op("MyFunction", 60, 20, tid=MAIN, args={"Sequence number": 9, "Fwd thread id": 0})
    t.cpu_op("aten::zero_", 62, 5, tid=MAIN, args={"Sequence number": 9, "Fwd thread id": 0})
    t.cpu_op(
        "autograd::engine::evaluate_function: MyFunctionBackward",
        540,
        20,
        tid=AUTOGRAD,
        args={"Sequence number": 9, "Fwd thread id": 1},
    )
    t.cpu_op("aten::fill_", 545, 5, tid=AUTOGRAD)
    t.kernel("fill_kernel", 560, 5, launch_us=546)
    # A CUDA-graph replay of two kernels (8 + 12 us) inside an op: attributed to the graph launch.
    t.cpu_op("CUDAGraph::replay", 600, 20, tid=MAIN)
    t.graph_launch(605, [("triton_poi_fused_add_0", 8), ("triton_red_fused_sum_1", 12)])
    # Launched outside any op (6 us), and a memset with no launch call at all (4 us).
    t.kernel("fill_kernel", 700, 6, launch_us=690)
    t.memset(720, 4)


def _runtime_tid(t: KinetoTrace, launch_us: float, tid: int) -> None:
    """Move the runtime call that starts at ``launch_us`` onto ``tid`` (the builder puts launches on the main thread)."""
    for ev in t.events:
        if ev.get("cat") == "cuda_runtime" and ev["ts"] == t._t(launch_us):
            ev["tid"] = tid


@pytest.fixture
def step_trace(tmp_path):
    t = KinetoTrace(rank=0, world_size=1, tid=MAIN)
    training_step(t)
    _runtime_tid(t, 415, AUTOGRAD)
    _runtime_tid(t, 455, AUTOGRAD)
    _runtime_tid(t, 546, AUTOGRAD)
    return _load(t, tmp_path)


def test_each_kernel_attributed_to_op_module_annotation(step_trace):
    events, steps = step_trace
    k = attribute(events, steps).kernels.sort_values("start_ns")
    rows = {(r.name[:12], r.start_ns // 1000): r for r in k.itertuples()}
    fwd = rows[(GEMM[:12], 100)]
    assert (fwd.op, fwd.attributed_op, fwd.backward, fwd.module, fwd.annotation) == (
        "aten::addmm",
        "aten::addmm",
        False,
        "blocks.0/attn",
        "## forward ##",
    )
    assert fwd.input_dims == "[[32],[8,16],[16,32],[],[]]"
    gelu = rows[("vectorized_e", 160)]
    assert (gelu.op, gelu.module) == ("aten::gelu", "blocks.0")
    # Backward kernels: launched from the autograd thread, inner op aten::mm, counted to the forward op of
    # node 7 (the innermost forward op with that sequence number: aten::addmm), in its forward module.
    for start in (450, 480):
        b = rows[(GEMM[:12], start)]
        assert (b.op, b.attributed_op, b.backward, b.launch_tid, b.module) == (
            "aten::mm",
            "aten::addmm",
            True,
            AUTOGRAD,
            "blocks.0/attn",
        )
        assert b.annotation is None  # no annotation around the backward launch
        assert b.input_dims == fwd.input_dims  # the forward op's shapes
    for name in ("triton_poi_f", "triton_red_f"):
        g = [r for key, r in rows.items() if key[0] == name][0]
        assert (g.graph, g.op, g.attributed_op) == (True, "cudaGraphLaunch", "cudaGraphLaunch")
    custom = rows[("fill_kernel", 560)]
    assert (custom.op, custom.attributed_op, custom.backward, custom.module) == (
        "aten::fill_",
        "MyFunction",
        True,
        "blocks.0/attn",
    )
    fill = rows[("fill_kernel", 700)]
    assert fill.op is None and fill.attributed_op is None and fill.launch_tid == MAIN
    memset = [r for r in k.itertuples() if r.kind == "memset"][0]
    assert memset.op is None and memset.launch_tid == -1


def test_rank_tables_exact(step_trace):
    events, steps = step_trace
    at = rank_attribution(events, steps)
    us = 1000
    assert at.totals == {
        "device_ns": (40 + 20 + 30 + 50 + 5 + 8 + 12 + 6 + 4) * us,
        "attributed_ns": (40 + 20 + 30 + 50 + 5 + 8 + 12) * us,
        "unattributed_ns": 10 * us,
        "graph_ns": 20 * us,
        "backward_ns": 85 * us,
        "other_thread_ns": 85 * us,
        "module_ns": 145 * us,
        "annotated_ns": 60 * us,
        "step_ns": 1000 * us,
        "n_device": 9,
        "n_unattributed": 2,
    }
    assert at.totals["attributed_ns"] + at.totals["unattributed_ns"] == at.totals["device_ns"]
    ops = at.ops.set_index(["op", "backward"])
    assert ops["device_ms"].sum() == pytest.approx(at.totals["attributed_ns"] / 1e6)
    addmm = ops.loc[("aten::addmm", False)]
    assert (addmm.calls, addmm.host_ms, addmm.device_ms, addmm.device_inclusive_ms, addmm.n_kernels) == (
        1,
        0.03,
        0.04,
        0.04,
        1,
    )
    linear = ops.loc[("aten::linear", False)]
    assert (linear.device_ms, linear.device_inclusive_ms, linear.host_ms) == (0.0, 0.04, 0.05)
    # The backward node is reported under its forward op: one call, the node's 100 us, both kernels.
    node = ops.loc[("aten::addmm", True)]
    assert (node.calls, node.host_ms, node.device_ms, node.n_kernels) == (1, 0.1, 0.08, 2)
    mm = ops.loc[("aten::mm", True)]  # the inner ops: their own calls and host time, the kernels inclusive
    assert (mm.calls, mm.host_ms, mm.device_ms, mm.device_inclusive_ms) == (2, 0.06, 0.0, 0.08)
    assert ops.loc[("MyFunction", True)][["calls", "host_ms", "device_ms"]].tolist() == [1, 0.02, 0.005]
    assert ops.loc[("aten::zero_", False), "device_inclusive_ms"] == 0.0
    graph = ops.loc[("cudaGraphLaunch", False)]
    assert (graph.device_ms, graph.graph_ms) == (0.02, 0.02)
    assert ops.loc[("CUDAGraph::replay", False)].device_inclusive_ms == 0.02
    # Module tree: self and inclusive, forward and backward.
    mods = at.modules.set_index(["module", "backward"])
    assert mods.loc[("blocks.0/attn", False)][["device_self_ms", "device_ms", "host_ms", "calls"]].tolist() == [
        0.04,
        0.04,
        0.1,
        1,
    ]
    assert mods.loc[("blocks.0", False)][["device_self_ms", "device_ms", "host_ms", "depth"]].tolist() == [
        0.02,
        0.06,
        0.2,
        0,
    ]
    # Backward: the two nodes of forward ops inside attn (addmm's 100 us, MyFunction's 20 us).
    assert mods.loc[("blocks.0/attn", True)][["device_ms", "host_ms", "calls"]].tolist() == [0.085, 0.12, 2]
    assert mods.loc[("blocks.0", True)][["device_self_ms", "device_ms", "host_ms", "calls"]].tolist() == [
        0.0,
        0.085,
        0.12,
        2,
    ]
    annos = at.annotations.set_index("name")
    assert annos.loc["## forward ##", ["calls", "host_ms", "device_ms"]].tolist() == [1, 0.3, 0.06]
    assert "ProfilerStep#1" not in annos.index and "nn.Module: attn" not in annos.index
    shapes = at.shapes.set_index(["op", "backward"])
    assert shapes.loc[("aten::addmm", True), "device_ms"] == 0.08
    top = at.op_kernels.set_index(["op", "backward"])
    assert top.loc[("aten::addmm", True)][["kernel", "count", "device_ms"]].tolist() == [GEMM, 2, 0.08]


def test_gpu_annotation_time_and_run_tables(tmp_path):
    t = KinetoTrace(rank=0, world_size=1, tid=MAIN)
    t.step(1, 0, 1000)
    t.annotation("## opt ##", 10, 100, tid=MAIN)
    t.annotation("## opt ##", 20, 30, tid=MAIN)  # nested in itself: host and device time counted once
    t.cpu_op("aten::add_", 25, 10, tid=MAIN)
    t.kernel("vectorized_elementwise_kernel<add>", 200, 25, launch_us=26)
    t.annotation("## opt ##", 200, 25, gpu=True)
    t.annotation("## opt ##", 300, 15, gpu=True)
    events, steps = _load(t, tmp_path)
    at = rank_attribution(events, steps)
    row = at.annotations.set_index("name").loc["## opt ##"]
    assert row[["calls", "host_ms", "device_self_ms", "device_ms", "gpu_calls", "gpu_ms"]].tolist() == [
        2,
        0.1,
        0.025,
        0.025,
        2,
        0.04,
    ]
    run = run_attribution({0: at, 1: at})
    assert run.ops["rank"].tolist() == [0, 1]
    assert run.ops["share_of_step_pct"].tolist() == [2.5, 2.5]  # 25 us of a 1000 us step
    js = run.to_json()
    assert js["schema"] == "analyzer.attribution/1"
    assert js["ops"][0]["device_ms"] == 0.05 and js["ops"][0]["n_ranks"] == 2
    assert js["ops"][0]["share_of_step_pct"] == 2.5
    # summed() is computed once per table, but each caller gets its own copy: an edit never reaches the next.
    first = run.summed("ops")
    first.loc[:, "device_ms"] = -1.0
    assert run.summed("ops")["device_ms"].tolist() == [0.05]


def test_no_kernels_cpu_only_still_has_host_tables(tmp_path):
    t = KinetoTrace(rank=0, world_size=1, gpu=False, tid=MAIN)
    t.step(1, 0, 100)
    t.annotation("nn.Module: blocks.0", 0, 50, tid=MAIN)
    t.cpu_op("aten::mm", 5, 20, tid=MAIN, args={"Sequence number": 3, "Fwd thread id": 0})
    t.cpu_op(
        "autograd::engine::evaluate_function: MmBackward0",
        60,
        30,
        tid=AUTOGRAD,
        args={"Sequence number": 3, "Fwd thread id": 1},
    )
    events, steps = _load(t, tmp_path)
    at = rank_attribution(events, steps)
    assert at.totals["device_ns"] == 0 and at.totals["attributed_ns"] == 0
    mods = at.modules.set_index(["module", "backward"])
    assert mods.loc[("blocks.0", False), "host_ms"] == 0.05
    assert mods.loc[("blocks.0", True), "host_ms"] == 0.03  # the backward node of the module's aten::mm
    assert at.ops.set_index(["op", "backward"]).loc[("aten::mm", True), "calls"] == 1


def test_empty_events_give_empty_tables(tmp_path):
    from analyzer.ingest.tables import empty_events, empty_steps

    at = rank_attribution(empty_events(), empty_steps())
    assert at.ops.empty and at.modules.empty and at.annotations.empty and at.totals["device_ns"] == 0
    assert run_attribution({}).ops.empty


def test_vectorized_nesting_equals_stack_walk(monkeypatch):
    """Random properly nested ranges on three threads (zero-length ones and equal starts included):
    the vectorized parents equal the stack walk's, without falling back to it."""
    import analyzer.metrics.nesting as nesting_module

    def no_fallback(*_a):
        raise AssertionError("fell back to the stack walk on properly nested ranges")

    monkeypatch.setattr(nesting_module, "stack_parents", no_fallback)
    rng = np.random.default_rng(7)
    starts, ends, keys = [], [], []

    def grow(lo, hi, depth, key):
        t = lo
        while t < hi and depth < 6:
            s = t + int(rng.integers(0, 3))
            if s >= hi:
                break
            e = s + int(rng.integers(1, max(2, (hi - s) // 3))) if rng.random() > 0.1 else s
            e = min(e, hi)
            starts.append(s), ends.append(e), keys.append(key)
            if e > s:
                grow(s, e, depth + 1, key)
            t = e + int(rng.integers(0, 3))

    for key in range(3):
        grow(0, 10_000, 0, key)
    tkey, start, end = np.array(keys), np.array(starts), np.array(ends)
    order, parent, depth = nest(tkey, start, end)
    for key in range(3):
        rows = order[tkey[order] == key]
        expected = stack_parents(start[rows], end[rows])
        got = parent[rows]
        assert np.array_equal(np.where(expected >= 0, rows[np.clip(expected, 0, None)], -1), got)
    assert len(start) > 500 and depth.max() >= 4 and (start == end).sum() > 20


def test_overlapping_ranges_fall_back_to_the_stack_walk():
    tkey = np.zeros(3, dtype=np.int64)
    start, end = np.array([0, 5, 6]), np.array([10, 15, 7])  # 0..10 and 5..15 overlap without nesting
    _, parent, _ = nest(tkey, start, end)
    assert parent.tolist() == [-1, 0, 1]  # the stack's view: the later range is the inner one


def test_innermost_containing_per_thread():
    """The launch link's lookup: the innermost op open at each instant on the query's own thread (start
    inclusive, end exclusive), the stack's view where ops overlap, -1 off every op and on a thread without ops."""
    ops = pd.DataFrame(
        {"pid": [1, 1, 1, 1, 2], "tid": [7, 7, 7, 7, 7], "start_ns": [0, 2, 5, 20, 0], "end_ns": [10, 4, 15, 30, 100]}
    )
    q_pid = np.array([1, 1, 1, 1, 1, 1, 2, 1, 3])
    q_tid = np.array([7, 7, 7, 7, 7, 7, 7, 8, 7])
    q_t = np.array([0, 3, 4, 6, 12, 17, 50, 3, 3])
    got = innermost_containing(ops, q_pid, q_tid, q_t)
    # t=4: op 1 ended (end exclusive) -> op 0; t=6: 0..10 and 5..15 overlap, the later is inner; t=12: only op 2;
    # t=17: between ops; pid 2 has its own op; tid 8 and pid 3 have none.
    assert got.tolist() == [0, 1, 0, 2, 2, -1, 4, -1, -1]


# ---------------------------------------------------------------------------
# Real traces


def _real_traces(shared: Path) -> list[Path]:
    return sorted(p for p in (shared / "traces").rglob("*.json.gz") if "capture_traces" not in str(p))


@pytest.fixture
def shared_dir() -> Path:
    shared = Path(__file__).resolve().parents[2] / "shared"
    if not (shared / "traces").is_dir():
        pytest.skip("../shared/traces is absent: the real-trace checks need it")
    return shared


def _real_ranks(shared: Path):
    """(path, rank trace, checked step windows) of every shared trace the loader reads."""
    from analyzer.metrics.windows import check_windows

    for path in _real_traces(shared):
        try:
            rt = load_trace(path)
        except Exception:  # noqa: BLE001 - unreadable samples are the loader tests' business
            continue
        yield path, rt, check_windows(rt.events, rt.steps, rt.rank).steps[["step", "start_ns", "end_ns"]]


def test_one_rank_sum_equals_the_groupby(shared_dir):
    """summed()'s one-rank shortcut (the rows as they are) equals the groupby over ranks, table by table:
    same rows, order, values and dtypes, on every shared trace that has ops."""
    checked = 0
    for path, rt, steps in _real_ranks(shared_dir):
        run = run_attribution({rt.rank: rank_attribution(rt.events, steps)})
        for name, keys in RunAttribution.KEYS.items():
            frame = getattr(run, name)
            if frame.empty:
                continue
            fast, grouped = _sum_over_ranks(frame, keys), _sum_over_ranks_grouped(frame, keys)
            # Text may come back as pandas' str dtype from the groupby's index and as object from the rows:
            # the values must be equal, and every non-text column's dtype too.
            pd.testing.assert_frame_equal(fast, grouped, check_exact=True, check_dtype=False, obj=f"{path.name} {name}")
            for c in fast.columns:
                if not pd.api.types.is_string_dtype(grouped[c]) and not isinstance(
                    grouped[c].dtype, pd.CategoricalDtype
                ):
                    assert fast[c].dtype == grouped[c].dtype, (path.name, name, c)
            checked += 1
    assert checked >= 20


def test_real_traces_sum_to_the_kernel_time(shared_dir):
    """On every shared trace: op device times sum to the attributed time, attributed + unattributed to
    all device time in the window, the modules' self time to the time inside modules."""
    from analyzer.metrics.overlap import hta_window
    from analyzer.ingest.tables import DEVICE_KINDS

    checked = 0
    for path, rt, steps in _real_ranks(shared_dir):
        at = rank_attribution(rt.events, steps)
        t = at.totals
        window = hta_window(rt.events, steps) & rt.events["kind"].isin(DEVICE_KINDS).to_numpy()
        sel = rt.events.loc[window]
        assert t["device_ns"] == int((sel["end_ns"] - sel["start_ns"]).sum()), path.name
        assert t["attributed_ns"] + t["unattributed_ns"] == t["device_ns"], path.name
        assert at.ops["device_ms"].sum() * 1e6 == pytest.approx(t["attributed_ns"], abs=1), path.name
        if len(at.modules):
            roots = at.modules.loc[at.modules["depth"] == 0]
            assert roots["device_ms"].sum() * 1e6 == pytest.approx(t["module_ns"], abs=1), path.name
        checked += 1
    assert checked >= 15


def test_real_traces_attribution_found(shared_dir):
    """Most kernel time is attributed on the GPU samples; backward on the training trace with autograd
    sequence numbers; module paths on the TraceLens samples recorded with the python tracer."""
    control = rank_attribution(*_rank(shared_dir / "traces/hta-samples/trace_diff/control/control.json.gz"))
    assert control.totals["attributed_ns"] / control.totals["device_ns"] > 0.98
    assert control.totals["backward_ns"] / control.totals["device_ns"] > 0.4
    bert = rank_attribution(
        *_rank(next((shared_dir / "traces/tracelens-samples/h100").glob("gaunernst_bert*.json.gz")))
    )
    assert bert.totals["module_ns"] / bert.totals["device_ns"] > 0.9
    assert bert.modules["module"].str.contains("/").any()
    sglang = rank_attribution(
        *_rank(shared_dir / "traces/tracelens-samples/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz")
    )
    # The HIP graph replay is mapped to the ops of capture_traces/ (analyzer/ingest/graph_capture.py): aten::mm
    # leads with 145 calls and 5.782 ms, TraceLens's ops_summary.csv's aten::mm rows (2417.66 + 2064.24 + 903.52
    # + 396.83 us).
    top = sglang.ops.iloc[0]
    assert sglang.totals["graph_ns"] / sglang.totals["device_ns"] > 0.98  # still marked as replayed
    assert (top["op"], int(top["calls"])) == ("aten::mm", 145)
    assert top["device_ms"] == pytest.approx(5.78225, abs=1e-5)


def _rank(path: Path):
    from analyzer.metrics.windows import check_windows

    rt = load_trace(path)
    return rt.events, check_windows(rt.events, rt.steps, rt.rank).steps[["step", "start_ns", "end_ns"]]


HTA_GROUPS = {
    "nccl_data": "hta-samples/nccl_parser_config/nccl_data.json.gz",
    "normalization": "tracelens-samples/perf_model/normalization/normalization_layer_test.json.gz",
    "rocm": "hta-samples/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("group", sorted(HTA_GROUPS))
def test_gpu_annotation_breakdown_matches_hta(shared_dir, tmp_path, group):
    """Our ``gpu_ms`` per annotation equals HTA's ``sum (us)`` of get_gpu_user_annotation_breakdown:
    the same events summed (HTA with include_last_profiler_step=True: every step, as the report), to
    HTA's whole-microsecond rounding (start up, end down: under 2 us per event)."""
    hta = pytest.importorskip("hta.trace_analysis")
    src = shared_dir / "traces" / HTA_GROUPS[group]
    os.symlink(src, tmp_path / src.name)
    logging.disable(logging.WARNING)
    try:
        theirs = hta.TraceAnalysis(
            trace_dir=str(tmp_path), include_last_profiler_step=True
        ).get_gpu_user_annotation_breakdown(visualize=False, num_kernels=10_000)
    finally:
        logging.disable(logging.NOTSET)
    ours = rank_attribution(*_rank(src)).annotations.set_index("name")
    theirs = theirs.loc[~theirs["name"].str.startswith("ProfilerStep#")].set_index("name")
    assert len(theirs) > 0
    assert set(theirs.index) == set(ours.index[ours["gpu_calls"] > 0])
    for name, row in theirs.iterrows():
        n = int(ours.loc[name, "gpu_calls"])
        assert ours.loc[name, "gpu_ms"] * 1e3 == pytest.approx(row["sum (us)"], abs=2 * n), name


def test_report_json_and_text(tmp_path):
    """analyze() carries the tables to the report: the JSON's ops sum to the attributed time, and the text
    report's section names the backward of the forward op and the module tree."""
    from analyzer.api import analyze
    from analyzer.render.text import report_text as render_text

    t = KinetoTrace(rank=0, world_size=1, tid=MAIN)
    training_step(t)
    _runtime_tid(t, 415, AUTOGRAD)
    _runtime_tid(t, 455, AUTOGRAD)
    _runtime_tid(t, 546, AUTOGRAD)
    run = analyze(t.write(tmp_path / "rank0.json.gz"), cache=False)
    js = run.to_json()["attribution"]
    assert js["schema"] == "analyzer.attribution/1"
    (totals,) = js["totals"]
    assert sum(r["device_ms"] for r in js["ops"]) == pytest.approx(totals["attributed_ms"])
    assert totals["attributed_ms"] + totals["unattributed_ms"] == pytest.approx(totals["device_ms"])
    assert run.ops(0).equals(run.ops()) and run.ops(1).empty
    text = render_text(run)
    section = text[text.index("Where device time goes") : text.index("Top kernels")]
    assert "unattributed 5.7%" in section  # 10 of 175 us
    line = next(x for x in section.splitlines() if x.startswith("aten::addmm") and " bwd " in x)
    assert line.split()[2:5] == ["1", "0.080", "0.080"]  # calls, device ms, incl ms
    assert "  attn" in section and "blocks.0" in section


def test_report_html_has_the_op_and_module_tables(tmp_path):
    from analyzer.api import analyze
    from analyzer.render.html import report_html as render_html

    t = KinetoTrace(rank=0, world_size=1, tid=MAIN)
    training_step(t)
    page = render_html(analyze(t.write(tmp_path / "rank0.json.gz"), cache=False))
    section = page[page.index("<h2>Where device time goes</h2>") :]
    assert '<td class="l">aten::addmm</td>' in section and '<td class="l">blocks.0/attn</td>' in section


def test_attention_kernels_take_the_backend_ops_shapes(tmp_path):
    """A forward kernel anywhere under an attention op counts, in the shapes table, to the innermost one
    (TraceLens's SDPA rows): the flash kernel of aten::_flash_attention_forward and the fill launched by
    aten::fill_ both land on aten::_scaled_dot_product_flash_attention, one call; the ops table still counts
    each kernel to its innermost op. The roofline counts the causal call in full (the FLOP table's convention)."""
    from analyzer.metrics.roofline import roofline

    t = KinetoTrace(rank=0, world_size=1, tid=MAIN)
    t.step(1, 0, 1000)
    q = [2, 4, 256, 64]
    bf16 = "c10::BFloat16"
    t.cpu_op(
        "aten::scaled_dot_product_attention",
        10,
        200,
        tid=MAIN,
        input_dims=[q, q, q, [], [], [], [], []],
        input_types=[bf16] * 3 + ["Scalar"] * 5,
    )
    flash = t.cpu_op(
        "aten::_scaled_dot_product_flash_attention",
        20,
        180,
        tid=MAIN,
        input_dims=[q, q, q, [], [], [], []],
        input_types=[bf16] * 3 + ["Scalar"] * 4,
    )
    flash["args"]["Concrete Inputs"] = ["", "", "", "0.", "True", "False", "0.125"]
    t.cpu_op("aten::fill_", 30, 10, tid=MAIN)
    t.kernel("vectorized_elementwise_kernel<FillFunctor<int>>", 300, 4, launch_us=32)
    t.cpu_op("aten::_flash_attention_forward", 50, 100, tid=MAIN)
    t.kernel("flash_fwd_kernel", 310, 60, launch_us=60)
    events, steps = _load(t, tmp_path)
    at = rank_attribution(events, steps)
    ops = at.ops.set_index(["op", "backward"])
    assert ops.loc[("aten::_flash_attention_forward", False), "device_ms"] == 0.06
    assert ops.loc[("aten::fill_", False), "device_ms"] == 0.004
    assert ops.loc[("aten::_scaled_dot_product_flash_attention", False), "device_ms"] == 0.0
    (row,) = at.shapes.itertuples(index=False)
    assert (row.op, row.backward, row.calls, row.n_kernels, row.device_ms) == (
        "aten::_scaled_dot_product_flash_attention",
        False,
        1,
        2,
        pytest.approx(0.064),
    )
    assert row.concrete_inputs == '["","","","0.","True","False","0.125"]'
    p = roofline(at.shapes, "NVIDIA H100 80GB HBM3").points.iloc[0]
    assert bool(p["causal"]) is True and p["flops"] == 2 * (2 * 4) * 256 * 256 * (64 + 64)  # 2 B H L S (E + Ev)
    assert p["achieved_flops_per_s"] == pytest.approx(p["flops"] / 64e-6)


def test_recomputed_forward_kernels_count_to_their_forward_op_marked_recompute(tmp_path):
    """Activation checkpointing runs forward ops inside a backward node: their kernels count to those ops,
    named "(recompute)", with their shapes; the node's backward keeps only its own kernels."""
    t = KinetoTrace(rank=0, world_size=1, tid=MAIN)
    t.step(1, 0, 1000)
    t.cpu_op("aten::relu_", 10, 20, tid=MAIN, args={"Sequence number": 3, "Fwd thread id": 0})
    t.kernel("vectorized_elementwise_kernel<threshold>", 40, 5, launch_us=12)
    t.cpu_op(
        "autograd::engine::evaluate_function: ReluBackward0",
        400,
        200,
        tid=AUTOGRAD,
        args={"Sequence number": 3, "Fwd thread id": 1},
    )
    t.cpu_op("ReluBackward0", 405, 190, tid=AUTOGRAD, args={"Sequence number": 3, "Fwd thread id": 1})
    # The recomputed convolution: a forward op (Fwd thread id 0, a new sequence number) inside the node.
    t.cpu_op(
        "aten::convolution",
        410,
        100,
        tid=AUTOGRAD,
        args={"Sequence number": 11, "Fwd thread id": 0},
        input_dims=[[2, 4, 8, 8], [6, 4, 3, 3], [], [], [], [], [], [], []],
        input_types=["float"] * 2,
    )
    t.kernel("implicit_convolve_sgemm", 420, 300, launch_us=415)
    _runtime_tid(t, 415, AUTOGRAD)
    t.cpu_op("aten::threshold_backward", 520, 50, tid=AUTOGRAD)
    t.kernel("vectorized_elementwise_kernel<threshold_backward>", 730, 7, launch_us=525)
    _runtime_tid(t, 525, AUTOGRAD)
    events, steps = _load(t, tmp_path)
    ops = rank_attribution(events, steps).ops.set_index(["op", "backward"])
    assert ops.loc[("aten::convolution (recompute)", False), "device_ms"] == pytest.approx(0.3)
    assert ops.loc[("aten::relu_", True), "device_ms"] == pytest.approx(0.007)
    assert ops.loc[("aten::relu_", False), "device_ms"] == pytest.approx(0.005)
