"""MFU: FLOPs from recorded shapes (hand-computed and against torch's counter) and from the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer.metrics.matmul_flops import flops_of, matmul_ops
from analyzer.metrics.mfu import (
    device_name_of,
    lookup_peak,
    mfu_from_manifest,
    mfu_from_trace_shapes,
    rank_flops_from_shapes,
)
from analyzer.ingest.tables import events_from_records

US = 1000


def op(name: str, start_us: float, end_us: float, dims=None, types=None, tid: int = 1, cat: str = "cpu_op") -> dict:
    return {
        "rank": 0,
        "cat": cat,
        "name": name,
        "pid": 10,
        "tid": tid,
        "start_ns": int(start_us * US),
        "end_ns": int(end_us * US),
        "input_dims": json.dumps(dims) if dims is not None else None,
        "input_types": json.dumps(types) if types is not None else None,
    }


def steps_table(*windows_us) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step": [w[0] for w in windows_us],
            "start_ns": [w[1] * US for w in windows_us],
            "end_ns": [w[2] * US for w in windows_us],
        }
    )


@pytest.mark.parametrize(
    ("name", "dims", "flops"),
    [
        ("aten::mm", [[64, 256], [256, 512]], 2 * 64 * 256 * 512),
        ("aten::addmm", [[512], [64, 256], [256, 512], [], []], 2 * 64 * 256 * 512),
        ("aten::bmm", [[8, 32, 16], [8, 16, 4]], 2 * 8 * 32 * 16 * 4),
        ("aten::baddbmm", [[8, 32, 4], [8, 32, 16], [8, 16, 4], [], []], 2 * 8 * 32 * 16 * 4),
        ("aten::linear", [[4, 128, 768], [3072, 768], [3072]], 2 * 4 * 128 * 768 * 3072),
        ("aten::matmul", [[2, 1, 5, 6], [3, 6, 7]], 2 * (2 * 3) * 5 * 6 * 7),  # broadcast batch
        ("aten::matmul", [[6], [6]], 2 * 6),
        ("aten::matmul", [[4, 5, 6], [6]], 2 * 4 * 5 * 6),
        (
            "aten::scaled_dot_product_attention",
            [[2, 8, 128, 64], [2, 8, 256, 64], [2, 8, 256, 32], [], []],
            2 * 16 * 128 * 256 * 64 + 2 * 16 * 128 * 256 * 32,
        ),
    ],
)
def test_flops_formulas(name: str, dims, flops: int) -> None:
    assert flops_of(name, dims) == flops


def test_linear_nesting_counts_each_product_once_and_backward_as_recorded() -> None:
    fwd = 2 * 64 * 256 * 512
    events = events_from_records(
        [
            op("ProfilerStep#3", 0, 1000, cat="user_annotation"),
            op("aten::linear", 10, 100, [[64, 256], [512, 256], [512]], ["float", "float", "float"]),
            op("aten::addmm", 20, 90, [[512], [64, 256], [256, 512], [], []], ["c10::BFloat16"] * 3 + ["Scalar"] * 2),
            op("aten::matmul", 110, 200, [[64, 256], [256, 512]], ["float", "float"]),
            op("aten::mm", 120, 190, [[64, 256], [256, 512]], ["float", "float"]),
            # Backward on the autograd thread: two mm under AddmmBackward0, each top level.
            op("autograd::engine::evaluate_function: AddmmBackward0", 300, 600, tid=2),
            op("AddmmBackward0", 305, 595, tid=2),
            op("aten::mm", 310, 400, [[64, 512], [512, 256]], ["float", "float"], tid=2),
            op("aten::mm", 410, 500, [[256, 64], [64, 512]], ["float", "float"], tid=2),
            # An mm on another thread at the same time as the linear: not nested in it.
            op("aten::mm", 30, 40, [[2, 3], [3, 4]], ["float", "float"], tid=3),
        ]
    )
    ops = matmul_ops(events)
    top = ops.loc[ops["top_level"]]
    assert sorted(top["name"]) == ["aten::linear", "aten::matmul", "aten::mm", "aten::mm", "aten::mm"]
    assert int(top["backward"].sum()) == 2
    rf = rank_flops_from_shapes(0, events, steps_table((3, 0, 1000)))
    assert rf.backward == "recorded"
    assert rf.steps["recorded_fwd_flops"].tolist() == [2 * fwd + 2 * 2 * 3 * 4]
    assert rf.steps["recorded_bwd_flops"].tolist() == [2 * fwd]
    assert rf.steps["flops"].tolist() == [4 * fwd + 2 * 2 * 3 * 4]
    # Autocast: the linear is recorded with fp32 inputs, the addmm inside runs in bf16. Leaves
    # decide: 3 fp32 mm leaves outweigh the one bf16 addmm here.
    assert rf.dtype == "fp32"


def test_backward_estimated_as_twice_forward_when_backward_has_no_shapes() -> None:
    events = events_from_records(
        [
            op("aten::linear", 10, 100, [[8, 16], [32, 16], [32]], ["c10::BFloat16"] * 3),
            op("aten::addmm", 20, 90, [[32], [8, 16], [16, 32], [], []], ["c10::BFloat16"] * 3),
            op("autograd::engine::evaluate_function: AddmmBackward0", 300, 600, tid=2),
        ]
    )
    rf = rank_flops_from_shapes(0, events, steps_table((0, 0, 1000)))
    assert rf.backward == "estimated" and rf.families == (("gemm", "estimated"),)
    assert rf.steps["flops"].tolist() == [3 * 2 * 8 * 16 * 32]
    assert rf.steps["estimated_bwd_flops"].tolist() == [2 * 2 * 8 * 16 * 32]
    assert rf.dtype == "bf16"


def test_forward_only_trace_counts_forward() -> None:
    events = events_from_records([op("aten::bmm", 10, 100, [[4, 8, 16], [4, 16, 2]], ["c10::Half", "c10::Half"])])
    rf = rank_flops_from_shapes(0, events, steps_table((0, 0, 50), (1, 50, 1000)))
    assert rf.backward == "absent"
    # Assigned to the step the op starts in.
    assert rf.steps["flops"].tolist() == [2 * 4 * 8 * 16 * 2, 0]


def test_trace_shapes_mfu_with_table_peak_and_argument() -> None:
    flops = 2 * 4096 * 4096 * 4096
    events = events_from_records(
        [
            op("aten::mm", 10, 100, [[4096, 4096], [4096, 4096]], ["c10::BFloat16"] * 2),
            {
                "rank": 0,
                "cat": "kernel",
                "name": "sm90_gemm_bf16",
                "pid": 0,
                "tid": 7,
                "start_ns": 20 * US,
                "end_ns": 900 * US,
            },
        ]
    )
    steps = steps_table((0, 0, 1000))  # 1 ms
    rf = rank_flops_from_shapes(0, events, steps)
    name = device_name_of(events, [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}])
    assert name == "NVIDIA H100 80GB HBM3"
    result = mfu_from_trace_shapes([rf], {0: name})
    assert result.source == "trace-shapes"
    assert result.peak_flops_per_s == pytest.approx(989.4e12)
    assert result.median == pytest.approx(flops / 1e-3 / 989.4e12)
    assert result.hfu_median == result.median
    assert result.backward == "absent"
    forced = mfu_from_trace_shapes([rf], {0: name}, peak_flops=1e15)
    assert forced.median == pytest.approx(flops / 1e-3 / 1e15)
    assert forced.peak_source == "argument"
    unknown = mfu_from_trace_shapes([rf], {0: "Imaginary GPU 9000"})
    assert unknown.source == "none"
    assert "Imaginary GPU 9000" in unknown.reason
    assert unknown.steps["achieved_tflops_per_s"].iloc[0] == pytest.approx(flops / 1e-3 / 1e12)
    cpu = mfu_from_trace_shapes([rf], {0: None})
    assert cpu.source == "none" and "peak_flops" in cpu.reason


def test_no_shapes_gives_none_with_reason() -> None:
    events = events_from_records([op("aten::mm", 10, 100)])
    rf = rank_flops_from_shapes(0, events, steps_table((0, 0, 1000)))
    result = mfu_from_trace_shapes([rf], {0: "NVIDIA A100-SXM4-80GB"})
    assert result.source == "none"
    assert "record_shapes" in result.reason


def test_peak_lookup_uses_the_trainer_table() -> None:
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "bf16").per_s == pytest.approx(312e12)
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "fp16").per_s == pytest.approx(312e12)
    assert lookup_peak("NVIDIA H100 PCIe", "tf32").per_s == pytest.approx(378e12)
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "fp64") is None


def test_fp8_has_its_own_peak_and_none_where_no_fp8_units() -> None:
    # Before the move fp8 was rated against the bf16 peak (989.4e12 on an H100): half the true MFU denominator.
    assert lookup_peak("NVIDIA H100 80GB HBM3", "fp8").per_s == pytest.approx(1978.9e12)
    assert lookup_peak("AMD Instinct MI300X", "fp8").per_s == pytest.approx(2614.9e12)
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert lookup_peak("Tesla V100-SXM2-16GB", "fp16").per_s == pytest.approx(125e12)


def test_analyzer_never_imports_reftrain() -> None:
    """The peak table lives in the analyzer; reftrain imports it: one import direction."""
    import subprocess
    import sys

    code = (
        "import sys, analyzer.metrics.mfu, analyzer.verbs.suggest.rules_compute, analyzer.verbs.suggest.facts, analyzer.api;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'reftrain'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
    from reftrain import flops

    assert flops.GPU_PEAKS is __import__("analyzer.metrics.hardware", fromlist=["GPU_PEAKS"]).GPU_PEAKS


def manifest(**over) -> dict:
    m = {
        "world_size": 2,
        "tokens_per_step": 8192,
        "flops": {"per_token": 1.5e9, "per_token_hardware": 2.0e9},
        "peak_flops": {"per_s": 1e14, "source": "table", "detail": "test part bf16 dense", "dtype": "bf16"},
        "warmup_steps": 2,
        "profiled_steps": [4],
    }
    m.update(over)
    return m


def metrics_table(step_ms: dict[int, tuple[float, float]]) -> pd.DataFrame:
    rows = []
    for step, times in step_ms.items():
        for rank, t in enumerate(times):
            mfu = 4096 * 1.5e9 / (t / 1e3 * 1e14)
            rows.append({"rank": rank, "step": step, "step_time_ms": t, "mfu": mfu, "profiled": step == 4})
    return pd.DataFrame(rows)


def test_manifest_mfu_steady_state_and_logged_agreement() -> None:
    metrics = metrics_table({0: (900, 900), 1: (500, 500), 2: (100, 110), 3: (120, 120), 4: (300, 300), 5: (100, 100)})
    result = mfu_from_manifest(manifest(), metrics)
    assert result.source == "manifest"
    assert result.steps["step"].tolist() == [2, 3, 5]  # warmup 0-1 and profiled 4 excluded
    per_device = 8192 * 1.5e9 / 2
    # Step 2 is uneven (100 and 110 ms): each rank's MFU over its own time, then the mean.
    step2 = np.mean([per_device / (0.100 * 1e14), per_device / (0.110 * 1e14)])
    expected = [step2, per_device / (0.120 * 1e14), per_device / (0.100 * 1e14)]
    assert result.steps["mfu"].to_numpy() == pytest.approx(expected)
    assert result.steps["step_time_ms"].tolist() == pytest.approx([105.0, 120.0, 100.0])
    assert result.median == pytest.approx(step2)
    hw_per_device = 8192 * 2.0e9 / 2
    assert result.hfu_median == pytest.approx(np.mean([hw_per_device / (0.100 * 1e14), hw_per_device / (0.110 * 1e14)]))
    # The trainer's own per-rank values, averaged per step the same way: identical.
    assert result.logged_median == pytest.approx(step2)
    assert result.median == pytest.approx(result.logged_median, rel=1e-12)
    assert "metrics JSONL" in result.step_time_source
    assert result.peak_detail == "test part bf16 dense"


def test_manifest_mfu_none_reasons() -> None:
    metrics = metrics_table({0: (100, 100), 1: (100, 100)})
    missing = mfu_from_manifest(manifest(tokens_per_step=None), metrics)
    assert missing.source == "none" and "tokens_per_step" in missing.reason
    all_warmup = mfu_from_manifest(manifest(warmup_steps=5), metrics)
    assert all_warmup.source == "none" and "steady-state" in all_warmup.reason
    assert mfu_from_manifest(manifest(), None).source == "none"
    override = mfu_from_manifest(manifest(warmup_steps=0, profiled_steps=[]), metrics, peak_flops=2e14)
    assert override.median == pytest.approx(8192 * 1.5e9 / 2 / (0.1 * 2e14))
    assert override.peak_source == "argument"


def test_hfu_above_the_peak_says_the_peak_is_wrong() -> None:
    """8192 tokens x 2.0e9 hardware FLOPs / 2 ranks in 100 ms is 8.2e13 FLOP/s:
    a peak of 1e13 (a CPU peak measured on a loaded machine) gives HFU 819 %,
    which no device achieves; the result says so instead of passing it as a
    fraction of the hardware's peak. At the true peak (1e14): 81.9 %, no note."""
    metrics = metrics_table({0: (100, 100), 1: (100, 100)})
    low = mfu_from_manifest(
        manifest(
            warmup_steps=0,
            profiled_steps=[],
            peak_flops={"per_s": 1e13, "source": "measured", "detail": "cpu matmul", "dtype": "fp32"},
        ),
        metrics,
    )
    assert low.hfu_median == pytest.approx(8.192)
    assert [n for n in low.notes if "above 100 %" in n] == [
        "HFU 819.2% is above 100 %: the peak (1e+13 FLOP/s, cpu matmul) is below the rate the steps achieved, so MFU "
        "and HFU here are not fractions of the hardware's peak (pass the real peak with --peak-flops)"
    ]
    right = mfu_from_manifest(manifest(warmup_steps=0, profiled_steps=[]), metrics)
    assert right.hfu_median == pytest.approx(0.8192) and not [n for n in right.notes if "above 100 %" in n]


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
def test_trace_shape_flops_match_torch_flop_counter(tmp_path: Path) -> None:
    """A real profiled forward+backward: our count from the trace equals torch's FlopCounterMode."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function, schedule
    from torch.utils.flop_counter import FlopCounterMode

    from analyzer.ingest.load import load_trace

    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(32, 64)
            self.down = torch.nn.Linear(64, 32, bias=False)

        def forward(self, x):  # x [B, T, 32]: 3-D linear goes through aten::matmul
            h = torch.relu(self.up(x))
            scores = torch.bmm(h, h.transpose(1, 2))  # [B, T, T]
            return self.down(torch.bmm(scores, h)).sum()

    model = Block()
    x = torch.randn(4, 16, 32)

    def train_step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).backward()

    with FlopCounterMode(display=False) as counter:
        train_step()
    expected = counter.get_total_flops()

    path = tmp_path / "trace.json"
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=0, warmup=1, active=2),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for _ in range(3):
            with record_function("forward"):
                train_step()
            prof.step()
    rt = load_trace(path)
    rf = rank_flops_from_shapes(0, rt.events, rt.steps)
    assert rf.backward == "recorded"
    assert len(rf.steps) == 2
    assert rf.steps["flops"].tolist() == [expected, expected]


# ---------------------------------------------------------------------------
# FLOPs counted once, validated, with coverage
# ---------------------------------------------------------------------------

# The shapes an NCCL training trace recorded: an aten::linear whose input and
# weight do not fit (606 != 3906), around an aten::addmm that is consistent.
BAD_LINEAR = [[2048, 160, 606], [2048, 3906]]
GOOD_ADDMM = [[3906], [2048, 512], [512, 3906], [], []]
ADDMM_FLOPS = 2 * 2048 * 512 * 3906  # 8.19e9


def launch(corr: int, at_us: float, tid: int = 1) -> dict:
    return {
        "rank": 0,
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 10,
        "tid": tid,
        "start_ns": int(at_us * US),
        "end_ns": int(at_us * US) + 2 * US,
        "correlation": corr,
    }


def kernel(name: str, corr: int, start_us: float, end_us: float) -> dict:
    return {
        "rank": 0,
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": 7,
        "start_ns": int(start_us * US),
        "end_ns": int(end_us * US),
        "correlation": corr,
    }


def test_inconsistent_linear_is_not_counted_its_addmm_is_and_it_is_listed() -> None:
    with pytest.raises(ValueError, match="inner dimensions disagree"):
        flops_of("aten::linear", BAD_LINEAR)
    assert flops_of("aten::addmm", GOOD_ADDMM) == ADDMM_FLOPS
    bf16 = ["c10::BFloat16"] * 2
    records = [
        op("aten::linear", 10, 100, BAD_LINEAR, bf16),
        op("aten::addmm", 20, 90, GOOD_ADDMM, ["c10::BFloat16"] * 3 + ["Scalar"] * 2),
    ]
    # Host-only (no kernels): the linear falls back to its child.
    rf = rank_flops_from_shapes(0, events_from_records(records), steps_table((0, 0, 1000)))
    assert rf.attribution == "host-ops"
    assert rf.steps["flops"].tolist() == [
        ADDMM_FLOPS
    ]  # the inconsistent linear, counted from its shapes, would give 2*2048*160*606*2048 = 8.13e11
    assert [(i["name"], i["count"]) for i in rf.inconsistent] == [("aten::linear", 1)]
    # Kernel attribution: the GEMM launched inside the addmm is charged to it, once.
    records += [
        launch(5, 30),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 5, 200, 400),
        launch(6, 40),
        kernel("void cublasLt::splitKreduce_kernel<32, 16, int, float>", 6, 400, 410),
    ]
    rf = rank_flops_from_shapes(0, events_from_records(records), steps_table((0, 0, 1000)))
    assert rf.attribution == "kernels"
    assert rf.steps["flops"].tolist() == [ADDMM_FLOPS]
    assert rf.coverage == 1.0
    assert rf.dtype == "bf16"


def test_nested_consistent_linear_matmul_mm_count_the_product_once() -> None:
    fwd = 2 * 4 * 64 * 256 * 512
    records = [
        op("aten::linear", 10, 100, [[4, 64, 256], [512, 256], []], ["float"] * 2),
        op("aten::matmul", 15, 95, [[4, 64, 256], [256, 512]], ["float"] * 2),
        op("aten::mm", 20, 90, [[256, 256], [256, 512]], ["float"] * 2),
        launch(1, 30),
        kernel("ampere_sgemm_128x64_nn", 1, 120, 300),
    ]
    events = events_from_records(records)
    rf = rank_flops_from_shapes(0, events, steps_table((0, 0, 1000)))
    assert rf.steps["flops"].tolist() == [fwd]  # charged to mm (2*256*256*512 == fwd), not summed thrice
    host = rank_flops_from_shapes(0, events_from_records(records[:3]), steps_table((0, 0, 1000)))
    assert host.steps["flops"].tolist() == [fwd]  # the outermost usable op (linear) only


def test_compiled_region_lowers_coverage_and_labels_mfu_a_lower_bound() -> None:
    mm = [[4096, 4096], [4096, 4096]]
    records = [
        op("aten::mm", 10, 100, mm, ["c10::BFloat16"] * 2),
        launch(1, 20),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 1, 100, 200),  # 100 us, known
        # A compiled region: its GEMMs and Triton kernels are launched with no aten op (no shapes).
        op("CompiledFunction", 300, 900),
        launch(2, 310),
        kernel("triton_tem_fused_mm_0", 2, 300, 600),  # 300 us, unknown
        launch(3, 320),
        kernel("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", 3, 600, 900),  # 300 us, unknown
        launch(4, 330),
        kernel("triton_poi_fused_add_0", 4, 900, 950),  # elementwise: not a FLOP kernel
    ]
    rf = rank_flops_from_shapes(0, events_from_records(records), steps_table((0, 0, 1000)))
    assert rf.coverage == pytest.approx(100 / 700)
    result = mfu_from_trace_shapes([rf], {0: "NVIDIA H100 80GB HBM3"})
    assert result.source == "trace-shapes"
    assert result.lower_bound is True
    assert result.flop_coverage == pytest.approx(100 / 700)
    assert result.notes[0].startswith("lower bound: FLOPs known for only 14.3%")
    assert result.to_json()["lower_bound"] is True


def test_tf32_and_fp8_kernels_pick_their_peaks() -> None:
    mm = [[1024, 1024], [1024, 1024]]
    tf32 = events_from_records(
        [
            op("aten::mm", 10, 100, mm, ["float", "float"]),
            launch(1, 20),
            kernel("sm80_xmma_gemm_tf32f32_tf32f32_f32_nn_n_tilesize128x128x16", 1, 100, 200),
        ]
    )
    rf = rank_flops_from_shapes(0, tf32, steps_table((0, 0, 1000)))
    assert rf.dtype == "tf32"
    assert mfu_from_trace_shapes([rf], {0: "NVIDIA H100 80GB HBM3"}).peak_flops_per_s == pytest.approx(494.7e12)
    fp8 = events_from_records(
        [
            op("aten::mm", 10, 100, mm, ["c10::BFloat16"] * 2),
            launch(1, 20),
            kernel("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n", 1, 100, 200),
        ]
    )
    rf = rank_flops_from_shapes(0, fp8, steps_table((0, 0, 1000)))
    assert rf.dtype == "fp8"
    assert mfu_from_trace_shapes([rf], {0: "NVIDIA H100 80GB HBM3"}).peak_flops_per_s == pytest.approx(1978.9e12)


def _conv_fwd(start: float, end: float, tid: int = 1) -> dict:
    # conv2d(x[2,4,8,8], w[6,4,3,3], bias None, stride 1, padding 1, dilation 1, groups 1): 2*2*64*6*9*4 FLOPs
    return dict(
        op("aten::conv2d", start, end, [[2, 4, 8, 8], [6, 4, 3, 3], []], ["float"] * 2, tid=tid),
        concrete_inputs=json.dumps(["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "1"]),
    )


CONV_FWD = 2 * 2 * 64 * 6 * 9 * 4


def test_each_family_without_recorded_backward_is_estimated_alone() -> None:
    # The fc layer's backward matmul is recorded; the convolution's backward is not (no shapes): the
    # convolution's backward is estimated from its own forward, the GEMM's counted as recorded.
    fc = 2 * 2 * 6 * 10
    events = events_from_records(
        [
            _conv_fwd(10, 50),
            op("aten::linear", 60, 80, [[2, 6], [10, 6], [10]], ["float"] * 3),
            op("autograd::engine::evaluate_function: AddmmBackward0", 300, 400, tid=2),
            op("aten::mm", 310, 390, [[2, 10], [10, 6]], ["float"] * 2, tid=2),
            op("autograd::engine::evaluate_function: ConvolutionBackward0", 400, 600, tid=2),
            op("aten::convolution_backward", 410, 590, None, None, tid=2),
        ]
    )
    rf = rank_flops_from_shapes(0, events, steps_table((0, 0, 1000)))
    assert dict(rf.families) == {"gemm": "recorded", "conv": "estimated"} and rf.backward == "partly-estimated"
    assert rf.steps["flops"].tolist() == [CONV_FWD + fc + 2 * 2 * 10 * 6 + 2 * CONV_FWD]
    result = mfu_from_trace_shapes([rf], {0: None}, peak_flops=1e12)
    assert result.backward_families == {"gemm": "recorded", "conv": "estimated"}
    assert any("conv (backward estimated as 2x its forward)" in n for n in result.notes)


def test_recorded_convolution_backward_counts_its_output_mask() -> None:
    mask_both = ["", "", "", "None", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[True, True, False]"]
    events = events_from_records(
        [
            _conv_fwd(10, 50),
            op("autograd::engine::evaluate_function: ConvolutionBackward0", 400, 600, tid=2),
            dict(
                op(
                    "aten::convolution_backward",
                    410,
                    590,
                    [[2, 6, 8, 8], [2, 4, 8, 8], [6, 4, 3, 3]],
                    ["float"] * 3,
                    tid=2,
                ),
                concrete_inputs=json.dumps(mask_both),
            ),
        ]
    )
    rf = rank_flops_from_shapes(0, events, steps_table((0, 0, 1000)))
    assert dict(rf.families) == {"conv": "recorded"}
    assert rf.steps["flops"].tolist() == [3 * CONV_FWD]


def test_tensorboard_era_backward_nodes_are_backward() -> None:
    # PyTorch 1.8-1.9: autograd nodes (AddmmBackward, MmBackward) on the backward thread, no evaluate_function.
    events = events_from_records(
        [
            op("aten::addmm", 10, 50, [[32], [8, 16], [16, 32]], ["float"] * 3),
            op("AddmmBackward", 300, 500, tid=2),
            op("aten::mm", 310, 390, [[8, 32], [32, 16]], ["float"] * 2, tid=2),
            op("aten::mm", 400, 490, [[16, 8], [8, 32]], ["float"] * 2, tid=2),
        ]
    )
    rf = rank_flops_from_shapes(0, events, steps_table((0, 0, 1000)))
    assert rf.backward == "recorded"
    assert rf.steps["recorded_bwd_flops"].tolist() == [2 * 2 * 8 * 16 * 32]
    # No shapes on the backward thread: estimated, never "forward only".
    bare = events_from_records(
        [op("aten::addmm", 10, 50, [[32], [8, 16], [16, 32]], ["float"] * 3), op("MmBackward", 300, 500, tid=2)]
    )
    assert rank_flops_from_shapes(0, bare, steps_table((0, 0, 1000))).backward == "estimated"


def _recompute_linear(start: float, end: float, out: int = 32) -> dict:
    # A forward op run inside backward: it records an autograd node (Sequence number, Fwd thread id 0).
    return dict(
        op("aten::linear", start, end, [[8, 16], [out, 16], [out]], ["float"] * 3, tid=2), seq_num=90, fwd_tid=0
    )


def test_recompute_is_hardware_flops_not_model_flops() -> None:
    lin = 2 * 8 * 16 * 32
    events = events_from_records(
        [
            op("aten::linear", 10, 50, [[8, 16], [32, 16], [32]], ["float"] * 3),
            # Reentrant checkpointing: the forward runs again inside CheckpointFunctionBackward, then its backward.
            op("autograd::engine::evaluate_function: CheckpointFunctionBackward", 300, 700, tid=2),
            op("CheckpointFunctionBackward", 305, 695, tid=2),
            _recompute_linear(310, 350),
            op("aten::addmm", 312, 348, [[32], [8, 16], [16, 32]], ["float"] * 3, tid=2),
            op("autograd::engine::evaluate_function: AddmmBackward0", 400, 600, tid=2),
            op("aten::mm", 410, 490, [[8, 32], [32, 16]], ["float"] * 2, tid=2),
            op("aten::mm", 500, 590, [[16, 8], [8, 32]], ["float"] * 2, tid=2),
        ]
    )
    ops = matmul_ops(events)
    assert ops["recompute"].tolist() == [False, True, True, False, False]
    rf = rank_flops_from_shapes(0, events, steps_table((0, 0, 1000)))
    assert rf.steps["flops"].tolist() == [3 * lin]  # forward + recorded backward
    assert rf.steps["hardware_flops"].tolist() == [4 * lin]  # + the recomputed forward
    result = mfu_from_trace_shapes([rf], {0: None}, peak_flops=1e12)
    assert result.hfu_median == pytest.approx(4 * lin / 1e-3 / 1e12) and result.median == pytest.approx(
        3 * lin / 1e-3 / 1e12
    )


def test_non_reentrant_early_stop_leaves_the_last_recomputed_op_uncounted() -> None:
    # Non-reentrant checkpointing stops by raising out of the op that saves the last needed tensor, before it
    # computes; the trace still records it (shapes included). Reentrant recompute runs to the end.
    lin, small = 2 * 8 * 16 * 32, 2 * 8 * 16 * 4
    region = [
        op("autograd::engine::evaluate_function: AddmmBackward0", 300, 700, tid=2),
        op("AddmmBackward0", 305, 695, tid=2),
        _recompute_linear(310, 350),
        _recompute_linear(360, 370, out=4),
        op("aten::mm", 410, 490, [[8, 32], [32, 16]], ["float"] * 2, tid=2),
    ]
    rf = rank_flops_from_shapes(0, events_from_records(region), steps_table((0, 0, 1000)))
    assert (rf.steps["hardware_flops"] - rf.steps["flops"]).tolist() == [lin]
    reentrant = region + [op("CheckpointFunctionBackward", 306, 694, tid=2)]
    rf = rank_flops_from_shapes(0, events_from_records(reentrant), steps_table((0, 0, 1000)))
    assert (rf.steps["hardware_flops"] - rf.steps["flops"]).tolist() == [lin + small]


def test_attention_run_as_bmm_ops_is_not_estimated_twice() -> None:
    # The math SDPA backend: bmm ops inside it, whose backward is recorded as bmm (GEMM) backward.
    q = [[2, 16, 8], [2, 8, 16]]
    events = events_from_records(
        [
            op("aten::_scaled_dot_product_attention_math", 10, 100, [[1, 2, 16, 8]] * 3, ["float"] * 3),
            op("aten::bmm", 20, 40, q, ["float"] * 2),
            op("aten::bmm", 50, 70, [[2, 16, 16], [2, 16, 8]], ["float"] * 2),
            op("autograd::engine::evaluate_function: BmmBackward0", 300, 500, tid=2),
            op("aten::bmm", 310, 390, [[2, 16, 8], [2, 8, 16]], ["float"] * 2, tid=2),
            op("aten::bmm", 400, 490, [[2, 8, 16], [2, 16, 16]], ["float"] * 2, tid=2),
        ]
    )
    rf = rank_flops_from_shapes(0, events, steps_table((0, 0, 1000)))
    fwd = 2 * 2 * 16 * 16 * (8 + 8)
    assert rf.steps["estimated_bwd_flops"].tolist() == [0]
    assert rf.steps["flops"].tolist() == [fwd + 2 * 2 * 16 * 8 * 16 + 2 * 2 * 8 * 16 * 16]


def test_cpu_flash_attention_without_the_outer_op_and_its_backward() -> None:
    # Compiled graphs call the backend op directly (no aten::scaled_dot_product_attention around it).
    qkv = [[1, 2, 64, 8]] * 3
    events = events_from_records(
        [
            op("aten::_scaled_dot_product_flash_attention_for_cpu", 10, 100, qkv, ["float"] * 3),
            op("autograd::engine::evaluate_function: ScaledDotProductFlashAttentionForCpuBackward0", 300, 500, tid=2),
            op(
                "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                310,
                490,
                [[1, 2, 64, 8]] + qkv + [[1, 2, 64, 8], [1, 2, 64]],
                ["float"] * 6,
                tid=2,
            ),
        ]
    )
    rf = rank_flops_from_shapes(0, events, steps_table((0, 0, 1000)))
    fwd = 2 * 2 * 64 * 64 * 16
    assert dict(rf.families) == {"attention": "recorded"}
    assert rf.steps["flops"].tolist() == [fwd + fwd // 2 * 5]


def test_host_op_coverage_labels_a_lower_bound() -> None:
    # One linear with shapes that do not fit (its addmm child has none): 40 of the 100 us of top-level
    # FLOP-op time have known FLOPs.
    events = events_from_records(
        [
            op("aten::mm", 0, 40, [[8, 16], [16, 32]], ["float"] * 2),
            op("aten::linear", 50, 110, [[8, 16], [32, 99]], ["float"] * 2),
            op("aten::addmm", 55, 105, None, None),
        ]
    )
    rf = rank_flops_from_shapes(0, events, steps_table((0, 0, 1000)))
    assert rf.attribution == "host-ops" and rf.coverage == pytest.approx(40 / 100)
    result = mfu_from_trace_shapes([rf], {0: None}, peak_flops=1e12)
    assert result.flop_coverage == pytest.approx(0.4) and result.lower_bound
    assert result.notes[0].startswith("lower bound: FLOPs known for only 40.0% of GEMM/attention/conv host op time")


def test_example_run_trace_shapes_count_attention_backward() -> None:
    """The committed example run (4 layers, d 256, d_ff 1024, vocab 4096 tied, 4 x 128 tokens per rank): its CPU
    traces record SDPA's CPU flash forward and backward. Trace shapes give 6 N T for the matmuls plus attention
    forward 4 T S d per layer at 1 + 2.5 (torch's backward convention): 13,824,425,984 FLOPs per device per step,
    exactly. Without the CPU flash backward the count was 13.15 GFLOP, 4 % under the manifest's 13.70 (PaLM's
    12 L H Q T counts attention backward 2x: the 0.9 % left between them)."""
    repo = Path(__file__).resolve().parents[1]
    from analyzer.api import analyze

    run = analyze(sorted((repo / "traces" / "example-ddp-w2" / "traces").glob("rank*.json.gz")), cache=False)
    n, t, d, seq, layers = 4 * (4 * 256 * 256 + 2 * 256 * 1024) + 256 * 4096, 4 * 128, 256, 128, 4
    expected = 6 * n * t + layers * 4 * t * seq * d * 3.5
    assert run.mfu.backward_families == {"gemm": "recorded", "attention": "recorded"}
    assert run.mfu.flops_per_step == expected == 13_824_425_984
    assert run.mfu.hardware_flops_per_step == expected and run.mfu.flop_coverage == 1.0
