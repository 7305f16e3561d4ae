"""Graph replays mapped to the ops of the capture traces beside them
(analyzer/ingest/graph_capture.py), and left without FLOPs, named in a
note, when no capture matches."""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import pytest

from analyzer.ingest.graph_capture import SPLICED_THREAD_NAME, SPLICED_TID
from analyzer.ingest.load import load_trace
from analyzer.metrics.matmul_flops import charged_ops, flop_kernels, matmul_ops
from tests.synth import KinetoTrace

SGLANG = Path(__file__).resolve().parents[2] / "shared" / "traces" / "tracelens-samples" / "inference" / "sglang_decode"
GEMM = "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT64x32x256"
NORM = "aiter_add_rmsnorm_quant_kernel"
M, K, N = 32, 4096, 6144


def _replay(folder: Path) -> Path:
    """One graph replay of [norm, GEMM, norm] (10, 40, 10 µs) from one hipGraphLaunch, no ops around it."""
    t = KinetoTrace(rank=0, world_size=1)
    t.step(1, 0, 1_000)
    t.graph_launch(100, [(NORM, 10), (GEMM, 40), (NORM, 10)])
    for e in t.events:
        if e.get("name") == "cudaGraphLaunch":
            e["name"] = "hipGraphLaunch"
    return t.write(folder / "decode.json.gz")


def _capture(folder: Path, kernels: list[str], *, details: bool = True) -> None:
    """A capture trace: between hipStreamBeginCapture and hipStreamEndCapture, an aiter RMSNorm op, an aten::mm
    with shapes launching the GEMM, and another norm op; each launch names its kernel in args.kernel."""
    t = KinetoTrace(rank=0, world_size=1)
    t.step(7, 0, 900)
    corr = iter(range(500, 600))
    t.runtime("hipStreamBeginCapture", 10, 2, next(corr))

    def launch(start: float, kernel: str) -> None:
        ev = t.runtime("hipLaunchKernel", start, 3, next(corr))
        ev["args"]["kernel"] = kernel

    t.cpu_op("aiter::add_rmsnorm", 100, 50)
    launch(120, kernels[0])
    t.cpu_op("aten::mm", 200, 100, input_dims=[[M, K], [K, N]], input_types=["c10::BFloat16", "c10::BFloat16"])
    launch(250, kernels[1])
    t.cpu_op("aiter::add_rmsnorm", 400, 50)
    launch(420, kernels[2])
    t.runtime("hipStreamEndCapture", 800, 2, next(corr))
    captures = folder / "capture_traces"
    t.write(captures / "bs_32_rank0.json.gz")
    if details:
        (captures / "execution_details.json").write_text(
            json.dumps([{"file": "bs_32_rank0.json.gz", "batch_size": 32, "mode": "FULL"}])
        )


def _gemm_flops(path: Path) -> tuple[float, float, list[str]]:
    """(FLOPs charged, share of FLOP-kernel time covered, notes) of one trace."""
    rt = load_trace(path)
    ops = matmul_ops(rt.events)
    kernels = flop_kernels(rt.events, ops)
    covered = kernels.loc[kernels["account"] >= 0, "dur_ns"].sum() / kernels["dur_ns"].sum()
    return float(ops.loc[charged_ops(ops, kernels), "flops"].sum()), float(covered), rt.notes


def test_replayed_gemm_gets_the_captured_ops_shapes(tmp_path: Path) -> None:
    trace = _replay(tmp_path)
    _capture(tmp_path, [NORM, GEMM, NORM])
    flops, covered, notes = _gemm_flops(trace)
    assert flops == 2 * M * K * N and covered == 1.0
    assert notes == ["1 graph replays mapped to the ops captured in bs_32_rank0.json.gz (capture_traces/)"]
    rt = load_trace(trace)
    spliced = rt.events.loc[rt.events["tid"] == SPLICED_TID]
    launch = rt.events.loc[rt.events["name"] == "hipGraphLaunch"].iloc[0]
    # The captured ops sit inside the launch call, in capture order; no ProfilerStep is copied.
    call = "hipLaunchKernel (captured)"
    assert spliced["name"].astype(str).tolist() == [
        "aiter::add_rmsnorm",
        call,
        "aten::mm",
        call,
        "aiter::add_rmsnorm",
        call,
    ]
    assert spliced["start_ns"].min() > launch["start_ns"] and spliced["end_ns"].max() < launch["end_ns"]
    assert SPLICED_THREAD_NAME in rt.threads["name"].tolist()
    assert rt.steps["step"].tolist() == [1]


def test_replay_without_capture_traces_stays_uncovered(tmp_path: Path) -> None:
    trace = _replay(tmp_path)
    _capture(tmp_path, [NORM, GEMM, NORM], details=False)  # no execution_details.json: not TraceLens's layout
    flops, covered, notes = _gemm_flops(trace)
    assert flops == 0 and covered == 0.0
    assert notes == [
        "CUDA-graph replays: 0.060 ms of kernels (100.0 % of the GPU kernel time) from 1 graph launches and "
        "no capture traces beside the trace (capture_traces/ with execution_details.json): no ops, shapes "
        "or FLOPs for them"
    ]


def test_replay_matching_no_capture_is_named_and_stays_uncovered(tmp_path: Path) -> None:
    trace = _replay(tmp_path)
    _capture(tmp_path, [NORM, "other_gemm", NORM])
    flops, covered, notes = _gemm_flops(trace)
    assert flops == 0 and covered == 0.0
    assert notes == [
        "CUDA-graph replays: 0.060 ms of kernels (100.0 % of the GPU kernel time) from 1 graph launches whose "
        "kernels match no captured graph (kernel names in order; 3 kernels launched at ts 0.000100 s): no "
        "ops, shapes or FLOPs for them"
    ]


def test_unreadable_execution_details_is_one_note(tmp_path: Path) -> None:
    trace = _replay(tmp_path)
    _capture(tmp_path, [NORM, GEMM, NORM])
    (tmp_path / "capture_traces" / "execution_details.json").write_text("{not json")
    flops, _, notes = _gemm_flops(trace)
    assert flops == 0
    details, unmapped = notes
    assert details.startswith("execution_details.json: cannot be read as JSON")
    assert unmapped.startswith(
        "CUDA-graph replays: 0.060 ms of kernels (100.0 % of the GPU kernel time) from 1 graph launches whose"
    )


@pytest.mark.skipif(not SGLANG.is_dir(), reason=f"shared SGLang sample not found at {SGLANG}")
def test_sglang_decode_replay_charges_every_gemm_as_tracelens() -> None:
    """TraceLens's GEMM.csv for the decode trace: 4 aten::mm shapes x 36 layers in the graph, and the
    logits GEMM outside it. Its aiter::gemm_a16w16 rows are the same products again (the wrapper's
    aten::mm is inside it), so only the aten::mm rows are summed."""
    rt = load_trace(SGLANG / "sglang_Qwen3-8B_decode.json.gz")
    ops = matmul_ops(rt.events)
    kernels = flop_kernels(rt.events, ops)
    charged = ops.loc[charged_ops(ops, kernels)]
    ours = {(n, json.dumps(json.loads(d))): c for (n, d), c in charged.groupby(["name", "input_dims"]).size().items()}
    reference = {
        (r["name"], json.dumps(ast.literal_eval(r["Input Dims_first"]))): int(r["name_count"])
        for r in csv.DictReader(open(SGLANG / "perf_csvs" / "GEMM.csv"))
        if r["name"].startswith("aten::")
    }
    assert ours == reference and sum(reference.values()) == 145
    tl_gflops = sum(
        float(r["GFLOPS_first"]) * int(r["name_count"])
        for r in csv.DictReader(open(SGLANG / "perf_csvs" / "GEMM.csv"))
        if r["name"].startswith("aten::")
    )
    assert charged["flops"].sum() / 1e9 == pytest.approx(tl_gflops, rel=1e-12)


def test_cached_analysis_sees_capture_traces_added_later(tmp_path: Path) -> None:
    """Rank summaries are cached per trace; capture traces added beside it afterwards change the result."""
    from analyzer.api import analyze

    _replay(tmp_path)
    before = analyze(tmp_path / "decode.json.gz").attribution.ops
    assert before["op"].iloc[0] == "hipGraphLaunch"
    _capture(tmp_path, [NORM, GEMM, NORM])
    after = analyze(tmp_path / "decode.json.gz").attribution.ops
    assert after.set_index("op").loc["aten::mm", "device_ms"] == pytest.approx(0.040)


def test_cached_report_sees_capture_traces_added_later(tmp_path: Path) -> None:
    """`analyzer report` reuses a finished report while its inputs are unchanged; capture traces count as inputs."""
    from analyzer.cli import main

    trace = _replay(tmp_path)

    def top_op(name: str) -> str:
        out = tmp_path / name
        assert main(["report", str(trace), "--json", str(out)]) == 0
        return json.loads(out.read_text())["attribution"]["ops"][0]["op"]

    assert top_op("before.json") == "hipGraphLaunch"
    _capture(tmp_path, [NORM, GEMM, NORM])
    assert top_op("after.json") == "aten::mm"
