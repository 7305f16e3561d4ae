"""Per-op efficiency against the roofline (analyzer.metrics.roofline).

Exact answers on hand-made shapes tables, and a cross-check against
TraceLens's GEMM.csv on the shared samples (skipped where ../shared is absent):
FLOPs per call equal (TraceLens adds the bias, m x n FLOPs, to addmm's),
bytes moved per call equal, calls equal, and TFLOP/s within 2 % of
TraceLens's FLOPs over its mean kernel time.
"""

from __future__ import annotations

import ast
import functools
import gzip
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from analyzer.api import analyze
from analyzer.ingest.schema import CONV_OPS, MEMORY_BOUND_OPS
from analyzer.metrics.hardware import hbm_peak
from analyzer.metrics.op_models import causal_fraction, per_call
from analyzer.metrics.roofline import roofline

H100 = "NVIDIA H100 80GB HBM3"
BF16 = "c10::BFloat16"


def _dims(d) -> str:
    return json.dumps(d, separators=(",", ":"))


def _shapes(rows, concrete: bool = False) -> pd.DataFrame:
    """A shapes table as the attribution's (``concrete``: rows carry a concrete_inputs value; else
    they leave it out and get "", the value of an op recorded without concrete inputs)."""
    if not concrete:
        rows = [(*row[:4], "", *row[4:]) for row in rows]
    keys = ["op", "backward", "input_dims", "input_types", "concrete_inputs"]
    return pd.DataFrame(rows, columns=keys + ["calls", "n_kernels", "device_ms"])


def test_gemm_forward_and_backward_exact():
    m, k, n = 1024, 2048, 512
    dims = _dims([[n], [m, k], [k, n], [], []])
    types = json.dumps([BF16] * 3 + ["Scalar", "Scalar"])
    rf = roofline(
        _shapes([("aten::addmm", False, dims, types, 3, 3, 0.3), ("aten::addmm", True, dims, types, 3, 6, 0.6)]), H100
    )
    fwd, bwd = rf.points.set_index("backward").loc[False], rf.points.set_index("backward").loc[True]
    per_call_bytes = 2 * (n + m * k + k * n + m * n)
    assert fwd["flops"] == 3 * 2 * m * k * n and fwd["bytes"] == 3 * per_call_bytes
    assert fwd["achieved_flops_per_s"] == pytest.approx(3 * 2 * m * k * n / 0.3e-3)
    assert bwd["flops"] == 2 * fwd["flops"] and bwd["bytes"] == 2 * fwd["bytes"]
    ridge = 989.4e12 / 3.35e12
    assert fwd["ridge_flop_per_byte"] == pytest.approx(ridge)
    intensity = 2 * m * k * n / per_call_bytes  # 256 FLOP/byte: under the H100 ridge (295)
    assert fwd["flop_per_byte"] == pytest.approx(intensity) and fwd["bound"] == "memory"
    assert fwd["efficiency_pct"] == pytest.approx(100 * (3 * per_call_bytes / 0.3e-3) / 3.35e12)
    ops = rf.ops.set_index("backward")
    assert ops.loc[False, "flops"] == fwd["flops"] and ops.loc[True, "calls"] == 3
    assert rf.modeled_device_ms == pytest.approx(0.9) == pytest.approx(rf.shapes_device_ms)


def test_attention_and_out_variant_bytes():
    b, h, L, S, E = 2, 8, 128, 256, 64
    f, nbytes, dtype, causal, _ = per_call(
        "aten::scaled_dot_product_attention", [[b, h, L, E], [b, h, S, E], [b, h, S, E]], [BF16] * 3
    )
    assert f == 2 * b * h * L * S * E * 2 and dtype == "bf16" and causal is None
    assert nbytes == 2 * (b * h * L * E + 2 * b * h * S * E + b * h * L * E)
    # mm(a, b, out=c): the output is one of the inputs, counted once.
    f, nbytes, _, _, _ = per_call("aten::mm", [[64, 32], [32, 16], [64, 16]], [BF16] * 3)
    assert f == 2 * 64 * 32 * 16 and nbytes == 2 * (64 * 32 + 32 * 16 + 64 * 16)
    rf = roofline(
        _shapes(
            [
                (
                    "aten::scaled_dot_product_attention",
                    True,
                    _dims([[b, h, L, E], [b, h, S, E], [b, h, S, E]]),
                    json.dumps([BF16] * 3),
                    1,
                    3,
                    0.1,
                )
            ]
        ),
        H100,
    )
    assert rf.points["flops"].item() == 2.5 * 2 * b * h * L * S * E * 2  # FlashAttention-2's 5 products against 2


def test_causal_attention_backends_count_in_full_and_convert_to_the_kept_scores():
    # One convention with the MFU and torch's FlopCounterMode: is_causal (each backend's own argument position)
    # is read and reported, the FLOPs count the whole L x S score matrix. PyTorch's causal mask is top-left
    # aligned, so TraceLens's count (the kept share) is L / 2S (L <= S) or 1 - S / 2L of ours, 1/2 when square.
    b, h, E = 2, 4, 64
    full = lambda L, S: 2 * b * h * L * S * E * 2  # noqa: E731 - Q K^T and P V
    sq = [[b, h, 512, E]] * 3
    flash = ["", "", "", "0.", "True", "False", "0.125"]
    f, nbytes, dtype, causal, _ = per_call(
        "aten::_scaled_dot_product_flash_attention", sq + [[]] * 4, [BF16] * 3 + ["Scalar"] * 4, flash
    )
    assert causal is True and f == full(512, 512) and nbytes == 2 * 4 * b * h * 512 * E
    assert causal_fraction(512, 512) == 0.5
    # The efficient backend's attn_bias (a tensor at position 3) is not counted in bytes; is_causal is argument 6.
    eff = ["", "", "", "", "True", "0.", "False", ""]
    f, nbytes, _, causal, _ = per_call(
        "aten::_scaled_dot_product_efficient_attention", sq + [[b, h, 512, 512]], [BF16] * 4, eff
    )
    assert causal is False and f == full(512, 512) and nbytes == 2 * 4 * b * h * 512 * E
    short_q = [[b, h, 128, E], [b, h, 512, E], [b, h, 512, E]]
    sdpa = ["", "", "", "", "0.", "True", "", "False"]
    f, _, _, causal, _ = per_call("aten::scaled_dot_product_attention", short_q + [[]] * 5, [BF16] * 3, sdpa)
    assert causal is True and f == full(128, 512) and causal_fraction(128, 512) == 128 / (2 * 512)
    long_q = [[b, h, 512, E], [b, h, 128, E], [b, h, 128, E]]
    f, _, _, causal, _ = per_call(
        "aten::_scaled_dot_product_flash_attention_for_cpu", long_q, ["float"] * 3, ["", "", "", "0.", "True", ""]
    )
    assert causal is True and f == full(512, 128) and causal_fraction(512, 128) == 1 - 128 / (2 * 512)
    # Backward rows: 2.5x the forward; a note names the causal calls counted in full.
    rf = roofline(
        _shapes(
            [
                (
                    "aten::_scaled_dot_product_flash_attention",
                    True,
                    _dims(sq + [[]] * 4),
                    json.dumps([BF16] * 3 + ["Scalar"] * 4),
                    json.dumps(flash),
                    3,
                    6,
                    0.2,
                ),
                (
                    "aten::_scaled_dot_product_flash_attention",
                    False,
                    _dims(sq + [[]] * 4),
                    json.dumps([BF16] * 3 + ["Scalar"] * 4),
                    "",
                    3,
                    3,
                    0.1,
                ),
            ],
            concrete=True,
        ),
        H100,
    )
    pts = rf.points.set_index("backward")
    assert pts.loc[True, "flops"] == 3 * 2.5 * full(512, 512) and bool(pts.loc[True, "causal"]) is True
    assert pts.loc[False, "flops"] == 3 * full(512, 512) and pts.loc[False, "causal"] is None
    assert any("causal attention counted in full" in n and "(3 call(s))" in n for n in rf.notes)


def test_unknown_device_no_shapes_and_unfit_shapes():
    dims, types = _dims([[64, 32], [32, 16]]), json.dumps([BF16] * 2)
    rf = roofline(_shapes([("aten::mm", False, dims, types, 1, 1, 0.01)]), "Mystery Accelerator")
    assert len(rf.points) == 1 and rf.roofs.empty and rf.hbm_bytes_per_s is None
    assert rf.points["bound"].isna().all() and rf.points["efficiency_pct"].isna().all()
    assert any("no datasheet peaks" in n for n in rf.notes)
    assert (
        roofline(_shapes([("aten::mm", False, dims, types, 1, 1, 0.01)]), None).notes[-1].startswith("device unknown")
    )
    empty = roofline(_shapes([]), H100)
    assert empty.points.empty and "record_shapes=True" in empty.notes[0] and empty.hbm_bytes_per_s == 3.35e12
    bad = roofline(
        _shapes(
            [
                ("aten::mm", False, _dims([[64, 32], [31, 16]]), types, 1, 1, 0.01),
                ("aten::cudnn_convolution", False, _dims([[1, 3, 8, 8]]), types, 1, 1, 0.01),
            ]
        ),
        H100,
    )
    assert bad.points.empty and bad.modeled_device_ms == 0 and bad.shapes_device_ms == pytest.approx(0.02)
    assert "aten::cudnn_convolution (1 shape(s))" in bad.notes[0] and "aten::mm (1 shape(s))" in bad.notes[0]


def test_hbm_table_matches_device_names():
    assert hbm_peak("NVIDIA H100 80GB HBM3").bytes_per_s == 3.35e12
    assert hbm_peak("NVIDIA A100-SXM4-80GB").bytes_per_s == 2039e9
    assert hbm_peak("NVIDIA A100-PCIE-40GB").bytes_per_s == 1555e9
    assert hbm_peak("NVIDIA GH200 480GB").label == "GH200"
    assert hbm_peak("AMD Instinct MI300X VF").bytes_per_s == 5.3e12
    assert hbm_peak("cpu") is None


# --------------------------------------------------------------------------- TraceLens GEMM.csv

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces" / "tracelens-samples"
SAMPLES = [
    "h100/Qwen_Qwen1.5-0.5B-Chat__1016005",
    "h100/facebook_timesformer-base-finetuned-k400__1016002",
    "h100/gaunernst_bert-small-uncased__1016001",
    "mi300/Qwen_Qwen1.5-0.5B-Chat__1016005",
    "mi300/gaunernst_bert-small-uncased__1016001",
    "torch_compile_triton/trace",
]


@pytest.mark.parametrize("sample", SAMPLES)
def test_gemm_rows_match_tracelens(sample):
    trace = SHARED / f"{sample}.json.gz"
    csv = SHARED / f"{sample}_perf_report_csvs" / "GEMM.csv"
    if not trace.exists() or not csv.exists():
        pytest.skip(f"{trace} absent (../shared/traces)")
    rf = analyze(trace, cache=False).roofline()
    ours = rf.points.loc[~rf.points["backward"]].set_index(["op", "input_dims"])
    theirs = pd.read_csv(csv)
    matched = 0
    for _, row in theirs.iterrows():
        dims = ast.literal_eval(row["Input Dims_first"])
        p = ours.loc[(row["name"], _dims(dims))]
        matched += 1
        calls = int(p["calls"])
        assert calls == row["name_count"]
        flops = p["flops"] / calls
        # TraceLens counts addmm's bias addition (m x n FLOPs); torch's counter, which we follow, does not.
        bias = math.prod(dims[1][:-1]) * dims[2][-1] if row["name"] == "aten::addmm" else 0
        assert flops + bias == pytest.approx(row["GFLOPS_first"] * 1e9, rel=1e-9)
        assert p["bytes"] / calls == pytest.approx(row["Data Moved (MB)_first"] * 2**20, rel=1e-9)
        # Rate of the sums (ours) against TraceLens's FLOPs over its mean kernel time (its per-call mean of
        # rates weighs fast calls more: up to 5 % apart on a row whose 4 calls vary).
        theirs_rate = row["GFLOPS_first"] * 1e9 / (row["Kernel Time (µs)_mean"] * 1e-6)
        assert p["achieved_flops_per_s"] == pytest.approx(theirs_rate, rel=0.02)
    assert matched == len(theirs) > 0


SDPA_SAMPLES = [
    "h100/Qwen_Qwen1.5-0.5B-Chat__1016005",
    "h100/gaunernst_bert-small-uncased__1016001",
    "mi300/Qwen_Qwen1.5-0.5B-Chat__1016005",
    "mi300/gaunernst_bert-small-uncased__1016001",
    "torch_compile_triton/trace",
]


@pytest.mark.parametrize("sample", SDPA_SAMPLES)
def test_attention_rows_match_tracelens(sample):
    """SDPA_fwd.csv: FLOPs (ours count causal attention in full; times causal_fraction, TraceLens's), bytes and
    calls equal; TFLOP/s within 2 %."""
    trace = SHARED / f"{sample}.json.gz"
    csv = SHARED / f"{sample}_perf_report_csvs" / "SDPA_fwd.csv"
    if not trace.exists() or not csv.exists():
        pytest.skip(f"{trace} absent (../shared/traces)")
    rf = analyze(trace, cache=False).roofline()
    ours = rf.points.loc[~rf.points["backward"]].set_index(["op", "input_dims"])
    theirs = pd.read_csv(csv)
    for _, row in theirs.iterrows():
        p = ours.loc[(row["name"], _dims(ast.literal_eval(row["Input Dims_first"])))]
        calls = int(p["calls"])
        assert calls == row["name_count"]
        assert bool(p["causal"]) is bool(row["param: causal"])
        q, k = ast.literal_eval(row["Input Dims_first"])[:2]
        kept = causal_fraction(q[-2], k[-2]) if p["causal"] else 1.0
        assert p["flops"] * kept / calls == pytest.approx(row["GFLOPS_first"] * 1e9, rel=1e-9)
        assert p["bytes"] / calls == pytest.approx(row["Data Moved (MB)_first"] * 2**20, rel=1e-9)
        theirs_rate = row["GFLOPS_first"] * 1e9 / (row["Kernel Time (µs)_mean"] * 1e-6)
        assert p["achieved_flops_per_s"] * kept == pytest.approx(theirs_rate, rel=0.02)
    assert len(theirs) > 0


def test_the_report_carries_the_roofline_per_op():
    """The report's `roofline` block and text section are RunAnalysis.roofline()'s per-op rows."""
    from analyzer.render.text import report_text as render_text
    from analyzer.verbs.report import report_json

    trace = SHARED / "h100/gaunernst_bert-small-uncased__1016001.json.gz"
    if not trace.exists():
        pytest.skip(f"{trace} absent (../shared/traces)")
    a = analyze(trace, cache=False)
    rf = a.roofline()
    block = report_json(a)["roofline"]
    assert block["schema"] == "analyzer.roofline/1" and block["device_name"] == rf.device_name
    assert block["hbm_bytes_per_s"] == rf.hbm_bytes_per_s == 3.35e12  # H100 SXM datasheet
    assert [(o["op"], o["backward"], o["calls"]) for o in block["ops"]] == list(
        zip(rf.ops["op"], rf.ops["backward"], rf.ops["calls"])
    )
    assert [o["flops"] for o in block["ops"]] == pytest.approx(rf.ops["flops"].tolist())
    text = render_text(a)
    assert "Roofline per op (all ranks; NVIDIA H100" in text
    top = rf.ops.sort_values("device_ms", ascending=False).iloc[0]
    section = text.split("Roofline per op", 1)[1].split("\n\n", 1)[0]
    line = next(line for line in section.splitlines() if line.startswith(top["op"]))
    assert f"{top['achieved_flops_per_s'] / 1e12:.2f}" in line and top["bound"] in line
    # No modeled op (a CPU run's traces have no shapes of GEMMs on a device): no section, an empty block.
    cpu = analyze(Path(__file__).resolve().parents[1] / "traces" / "example-ddp-w2", cache=False)
    assert "Roofline per op" not in render_text(cpu) and report_json(cpu)["roofline"]["ops"] == []


def test_tf32_kernels_take_the_tf32_peak_and_over_100_pct_is_named():
    # An fp32 addmm of 2 m k n = 2*1024*1024*1024 = 2.147483648e9 FLOPs per call, 10 calls in 1 ms:
    # 2.147483648e13 FLOP/s. Bytes per call (4 B each): bias 1024 + A 1024*1024 + B 1024*1024 + out 1024*1024
    # = 3146752 elements = 12587008 B, so 170.6 FLOP/B: compute-bound on an A100 (ridge 156e12/1.555e12 = 100.3
    # at tf32). Its CUTLASS s1688 kernel ran on TF32 tensor cores: efficiency 2.147483648e13 / 156e12 = 13.766 %,
    # where the fp32 (SIMT) peak of 19.5e12 would give 110.1 %.
    a100 = "NVIDIA A100-SXM4-80GB"
    m = 1024
    dims = _dims([[m], [m, m], [m, m], [], []])
    types = json.dumps(["float"] * 3 + ["Scalar", "Scalar"])
    shapes = _shapes([("aten::addmm", False, dims, types, 10, 10, 1.0)])
    kernels = pd.DataFrame(
        {
            "op": ["aten::addmm"],
            "backward": [False],
            "cls": ["gemm"],
            "count": [10],
            "device_ms": [1.0],
            "kernel": ["void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>"],
        }
    )
    tf = roofline(shapes, a100, kernels).ops.iloc[0]
    assert tf["dtype"] == "tf32" and tf["peak_flops_per_s"] == pytest.approx(156e12)
    assert tf["efficiency_pct"] == pytest.approx(100 * 2.147483648e13 / 156e12)
    # A SIMT sgemm kernel is not evidence of TF32: the fp32 peak, and the 110.1 % is named in the notes.
    simt = roofline(shapes, a100, kernels.assign(kernel="ampere_sgemm_128x64_nn"))
    assert simt.ops.iloc[0]["dtype"] == "fp32"
    assert simt.ops.iloc[0]["efficiency_pct"] == pytest.approx(100 * 2.147483648e13 / 19.5e12)
    assert any("over 100 %" in n and "aten::addmm fp32 110.1 %" in n for n in simt.notes)


def test_memory_bound_families_are_timed_against_the_hbm():
    # A bf16 gelu over 2^20 elements, 4 calls in 0.01 ms: 4 * 4 MiB = 16777216 B in 1e-5 s = 1.6777e12 B/s,
    # 50.08 % of the H100's 3.35e12. Its intensity (1 FLOP per 4 B) is far under the ridge: memory-bound.
    n = 1 << 20
    gelu = ("aten::gelu", False, _dims([[n], []]), json.dumps([BF16, ""]), "", 4, 4, 0.01)
    # An int64 copy has no FLOP peak, and is memory-bound all the same: 2 calls of 8 MiB in 0.01 ms.
    icopy = ("aten::copy_", False, _dims([[n // 2], [n // 2]]), json.dumps(["long int"] * 2), "", 2, 2, 0.01)
    # The gelu's backward has no model: left out, and the notes say so.
    gelu_bwd = ("aten::gelu", True, _dims([[n], []]), json.dumps([BF16, ""]), "", 4, 4, 0.02)
    rf = roofline(_shapes([gelu, icopy, gelu_bwd], concrete=True), H100)
    pts = rf.points.set_index("op")
    g = pts.loc["aten::gelu"]
    assert g["family"] == "elementwise" and g["flops"] == 4 * n and g["bytes"] == 4 * 4 * n
    assert g["bound"] == "memory" and g["efficiency_pct"] == pytest.approx(100 * 16 * n / 1e-5 / 3.35e12)
    c = pts.loc["aten::copy_"]
    assert pd.isna(c["dtype"]) and math.isnan(c["peak_flops_per_s"]) and c["bound"] == "memory"
    assert c["efficiency_pct"] == pytest.approx(100 * 2 * 8 * n / 1e-5 / 3.35e12)
    assert len(rf.points) == 2 and rf.modeled_device_ms == pytest.approx(0.02)
    assert rf.shapes_device_ms == pytest.approx(0.04)
    assert any("backward of memory-bound ops" in note and "aten::gelu (1 shape(s))" in note for note in rf.notes)
    assert set(rf.ops["family"]) == {"elementwise"}


# TraceLens's memory-bound and convolution tables (TraceLens/PerfModel/perf_model.py's models).
ROOFLINE_OPS = MEMORY_BOUND_OPS | CONV_OPS
FAMILY_CSVS = ("UnaryElementwise", "BinaryElementwise", "Reduce_fwd", "Normalization", "CONV_fwd")
# TraceLens lists these wrappers beside the native op that launches their kernels (ours: the native op's row).
WRAPPERS = {
    "aten::layer_norm",
    "aten::batch_norm",
    "aten::_batch_norm_impl_index",
    "aten::instance_norm",
    "aten::group_norm",
}
ELEM = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "long int": 8, "int": 4, "bool": 1}


@functools.lru_cache(maxsize=2)
def _raw_events(trace: Path) -> tuple[list, list]:
    """A trace's raw events and its autograd nodes (tid, start, end), read once per trace."""
    with gzip.open(trace) as f:
        events = json.load(f)["traceEvents"]
    nodes = [
        (e["tid"], e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("name", "").startswith("autograd::engine::evaluate_function:") and "dur" in e
    ]
    return events, nodes


def _all_inside_backward(trace: Path, name: str, dims: list) -> bool:
    """Whether every call of ``name`` with ``dims`` runs inside an autograd node (an
    ``autograd::engine::evaluate_function:`` range on its thread): read from the raw trace, apart from ours."""
    events, nodes = _raw_events(trace)
    calls = [
        e
        for e in events
        if e.get("cat") == "cpu_op" and e.get("name") == name and e.get("args", {}).get("Input Dims") == dims
    ]
    return bool(calls) and all(
        any(t == c["tid"] and s <= c["ts"] and c["ts"] + c["dur"] <= f for t, s, f in nodes) for c in calls
    )


@pytest.mark.parametrize("sample", SAMPLES + ["perf_model/normalization/normalization_layer_test"])
def test_memory_bound_and_conv_rows_match_tracelens(sample):
    """Unary and binary elementwise: FLOPs and bytes equal. Reductions: FLOPs equal; TraceLens's bytes are the
    input plus one output element whatever the reduced dims, ours the whole reduced output. Convolution: FLOPs
    equal, bytes theirs plus the bias (TraceLens leaves it out). Normalization: TraceLens's FLOPs are 5 per
    element plus 6 per channel and its bytes input plus output plus 6 channels; our input and output traffic
    is theirs, plus weight, bias and running statistics once each. Kernel time per call within 2 % where both
    rows group the same calls, ours up to the op's memsets more (TraceLens leaves some out)."""
    trace = SHARED / f"{sample}.json.gz"
    csvs = [SHARED / f"{sample}_perf_report_csvs" / f"{f}.csv" for f in FAMILY_CSVS]
    csvs = [c for c in csvs if c.exists()]
    if not trace.exists() or not csvs:
        pytest.skip(f"{trace} or its TraceLens tables absent (../shared/traces)")
    a = analyze(trace, cache=False)
    rf = a.roofline()
    ours = (
        rf.points.loc[~rf.points["backward"]]
        .groupby(["op", "input_dims", "input_types"])[["calls", "flops", "bytes", "device_ms"]]
        .sum()
    )
    ok = a.attribution.op_kernels
    not_kernel = ok.loc[~ok["backward"] & ok["cls"].isin(["memset", "memcpy"])].groupby("op")["device_ms"].sum()
    conv_channels = {json.loads(d)[1][0] for op, d in zip(rf.points["op"], rf.points["input_dims"]) if op in CONV_OPS}
    compared = 0
    for csv in csvs:
        family = csv.stem
        for _, row in pd.read_csv(csv).iterrows():
            name, dims = row["name"], ast.literal_eval(row["Input Dims_first"])
            types = ast.literal_eval(row["Input type_first"])
            key = (name, _dims(dims), _dims(types))
            if key not in ours.index:
                # Not a row of ours: wrappers, ops without a model (upsample), calls without kernel time (a
                # host-side copy), a convolution's bias add (counted in its aten::convolution row; TraceLens
                # counts it in both) and calls inside autograd nodes (AccumulateGrad's add_, a norm's backward
                # sum): backward kernels, which count to their node.
                bias_add = (
                    name == "aten::add_"
                    and len(dims) > 1
                    and len(dims[1]) >= 2
                    and dims[1][1] in conv_channels
                    and math.prod(dims[1]) == dims[1][1]
                )
                assert (
                    name in WRAPPERS
                    or name not in ROOFLINE_OPS
                    or row["Kernel Time (µs)_sum"] == 0
                    or bias_add
                    or _all_inside_backward(trace, name, dims)
                ), (family, key)
                continue
            p = ours.loc[key]
            calls = int(p["calls"])
            flops, nbytes = p["flops"] / calls, p["bytes"] / calls
            t_flops, t_bytes = row["GFLOPS_first"] * 1e9, row["Data Moved (MB)_first"] * 2**20
            elem = ELEM[types[0]]
            if family in ("UnaryElementwise", "BinaryElementwise"):
                assert (flops, nbytes) == (pytest.approx(t_flops, rel=1e-9), pytest.approx(t_bytes, rel=1e-9)), key
            elif family == "Reduce_fwd":
                in_bytes = math.prod(dims[0]) * elem
                assert flops == pytest.approx(t_flops, rel=1e-9)
                assert t_bytes == pytest.approx(in_bytes + elem, rel=1e-9)
                assert nbytes > in_bytes and (nbytes - in_bytes) % elem == 0  # the reduced output, whole elements
            elif family == "CONV_fwd":
                assert flops == pytest.approx(t_flops, rel=1e-9)
                assert nbytes == pytest.approx(t_bytes + math.prod(dims[2] or [0]) * elem, rel=1e-9)
            else:
                n, channels = math.prod(dims[0]), int(row["param: num_channels"])
                if "rms" not in name:
                    assert t_flops == pytest.approx(5 * n + 6 * channels, rel=1e-9)
                # Input and output traffic alike, the rest per channel (theirs 6 or 1 channels' worth, ours
                # weight, bias and running statistics).
                for b in (nbytes, t_bytes):
                    assert 2 * n * elem <= b <= 2 * n * elem + 6 * channels * 4, key
            if calls == row["name_count"]:
                ours_us = p["device_ms"] * 1e3 / calls
                extra = float(not_kernel.get(name, 0.0)) * 1e3 / calls
                theirs_us = row["Kernel Time (µs)_mean"]
                assert theirs_us * 0.98 <= ours_us <= theirs_us * 1.02 + extra, key
            compared += 1
    assert compared > 0


def test_per_op_rows_sum_the_shapes_and_take_the_dtype_of_most_device_time():
    # aten::mm in bf16 at two shapes (0.3 + 0.2 ms) and in fp32 at one (0.4 ms): the op's row has the three
    # shapes' sums and dtype bf16 (0.5 ms against 0.4). mm of (m, k) x (k, n) is 2 m k n FLOPs a call and
    # (m k + k n + m n) elements moved: 2, 3 and 1 calls.
    def mm(m, k, n, dtype, calls, ms):
        return ("aten::mm", False, _dims([[m, k], [k, n]]), json.dumps([dtype, dtype]), calls, calls, ms)

    rows = [mm(64, 128, 256, BF16, 2, 0.3), mm(32, 64, 128, BF16, 3, 0.2), mm(128, 128, 128, "float", 1, 0.4)]
    rf = roofline(_shapes(rows), H100)
    assert len(rf.points) == 3 and len(rf.ops) == 1
    op = rf.ops.iloc[0]
    assert op["dtype"] == "bf16" and op["calls"] == 6
    assert op["device_ms"] == math.fsum([0.4, 0.3, 0.2])
    assert op["flops"] == 2 * (2 * 64 * 128 * 256) + 3 * (2 * 32 * 64 * 128) + 2 * 128**3
    assert op["bytes"] == (
        2 * 2 * (64 * 128 + 128 * 256 + 64 * 256) + 3 * 2 * (32 * 64 + 64 * 128 + 32 * 128) + 4 * 3 * 128**2
    )
    # Equal device time in either dtype: the dtype of the op's first point (points by device time, then
    # op, then the shapes table's order).
    pair = [mm(64, 128, 256, BF16, 1, 0.5), mm(128, 128, 128, "float", 1, 0.5)]
    assert roofline(_shapes(pair), H100).ops.iloc[0]["dtype"] == "bf16"
    assert roofline(_shapes(pair[::-1]), H100).ops.iloc[0]["dtype"] == "fp32"


def test_double_rows_say_fp64_and_rows_without_a_type_show_a_dash():
    # A double add over 2^10 elements: dtype fp64 (the one element-type table, analyzer.metrics.dtypes), no
    # fp64 peak in the table, memory-bound against the HBM all the same. A row whose types are unknown to the
    # table (an int64 copy) has no dtype: None in the per-op row, "-" in the text, never "nan".
    from analyzer.render.text import roofline_lines

    n = 1 << 10
    add = ("aten::add", False, _dims([[n], [n], []]), json.dumps(["double", "double", "Scalar"]), "", 3, 3, 0.01)
    icopy = ("aten::copy_", False, _dims([[n], [n]]), json.dumps(["long int"] * 2), "", 2, 2, 0.02)
    rf = roofline(_shapes([add, icopy], concrete=True), H100)
    ops = rf.ops.set_index("op")
    assert ops.loc["aten::add", "dtype"] == "fp64" and math.isnan(ops.loc["aten::add", "peak_flops_per_s"])
    assert ops.loc["aten::add", "bound"] == "memory"
    assert ops.loc["aten::copy_", "dtype"] is None

    class Run:  # what roofline_lines reads of a RunAnalysis
        def roofline(self):
            return rf

    text = "\n".join(roofline_lines(Run()))  # type: ignore[arg-type]
    copy_line = next(line for line in text.splitlines() if line.startswith("aten::copy_"))
    assert copy_line.split()[2] == "-"


@pytest.mark.parametrize("sample", SAMPLES)
def test_the_mfu_and_the_roofline_count_the_same_flops(sample):
    """One FLOP table: the MFU's FLOPs per step and the roofline's GEMM/attention/conv FLOPs are one count (causal
    attention in full in both), exactly, on every TraceLens sample with a ProfilerStep window. Before the table the
    roofline halved the Qwen samples' causal attention while the MFU did not (4.27 % apart)."""
    trace = SHARED / f"{sample}.json.gz"
    if not trace.exists():
        pytest.skip(f"{trace} absent (../shared/traces)")
    a = analyze(trace, cache=False)
    if a.mfu.flops_per_step is None:
        pytest.skip(f"{sample}: no ProfilerStep window, no MFU to compare ({a.mfu.reason})")
    points = a.roofline().points
    ours = points.loc[points["family"].isin(["gemm", "attention", "conv"]), "flops"].sum()
    assert float(a.mfu.steps["flops"].sum()) == ours > 0
