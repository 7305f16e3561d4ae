"""Format eras: the TensorBoard-plugin era's
categories and ``computeProperties``, and ``displayTimeUnit: "ns"``."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from analyzer.ingest.load import load_trace
from analyzer.metrics.matmul_flops import flops_of
from analyzer.ingest.schema import CATEGORY_ALIASES, canonical_category, classify
from synth import KinetoTrace

KINETO_SAMPLES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "kineto-samples"


@pytest.fixture
def tb_plugin_trace() -> Path:
    path = KINETO_SAMPLES / "gpu_metrics_input.json"
    if not path.is_file():
        pytest.skip(f"TensorBoard-plugin-era sample not found at {path} (only on the project's dev machines)")
    return path


def test_category_names_of_every_era() -> None:
    # Today's names are their own canonical form; the old era's map onto them.
    for cat in (
        "kernel",
        "gpu_memcpy",
        "gpu_memset",
        "cpu_op",
        "cuda_runtime",
        "cuda_driver",
        "user_annotation",
        "gpu_user_annotation",
        "python_function",
        "cuda_sync",
        "cpu_instant_event",
        "ac2g",
    ):
        assert canonical_category(cat) == cat
    assert {old: canonical_category(old.title()) for old in CATEGORY_ALIASES} == {
        "operator": "cpu_op",
        "runtime": "cuda_runtime",
        "memcpy": "gpu_memcpy",
        "memset": "gpu_memset",
        "python": "python_function",
    }
    assert classify("Kernel", "void gemmSN_TN_kernel") == "compute"
    assert classify("Kernel", "ncclKernel_AllReduce") == "comm"
    assert classify("Memcpy", "Memcpy HtoD (Pageable -> Device)") == "memcpy"
    assert classify("Memset", "Memset (Device)") == "memset"
    assert classify("Operator", "aten::mm") == "cpu_op"
    assert classify("Runtime", "cudaLaunchKernel") == "runtime"
    assert classify("Python", "torch/nn/modules/linear.py(96): forward") == "other"


def test_tensorboard_plugin_sample_is_read_as_todays_format(tb_plugin_trace: Path) -> None:
    """The V100 trace of the plugin's tests: memcpy was counted as idle
    ("other" events), ops were not cpu_ops, computeProperties was ignored."""
    rt = load_trace(tb_plugin_trace)
    ev = rt.events
    by_cat = ev.groupby(ev["cat"].astype(str), observed=True)["kind"].agg(lambda k: sorted(set(k.astype(str))))
    assert by_cat.to_dict() == {
        "cpu_op": ["cpu_op"],
        "cuda_runtime": ["runtime"],
        "gpu_memcpy": ["memcpy"],
        "kernel": ["compute"],
    }
    assert (ev["kind"] == "memcpy").sum() == 2
    assert (ev["kind"] == "compute").sum() == 30 and (ev["kind"] == "cpu_op").sum() == 179
    # Device events sit on their stream (tid "stream 7", args.stream 7).
    assert set(ev.loc[ev["kind"].isin(["compute", "memcpy"]), "stream"]) == {7}
    # The era's "external id" on kernels links them to their op.
    gemm = ev[ev["name"].astype(str).str.startswith("void gemmSN_TN_kernel")].iloc[0]
    assert gemm["correlation"] == 333 and gemm["external_id"] == 41
    assert ev.loc[(ev["external_id"] == 41) & (ev["kind"] == "cpu_op"), "name"].astype(str).tolist() == ["aten::mm"]
    # computeProperties is the device list.
    assert [p["name"] for p in rt.device_properties] == ["Tesla V100-DGXS-32GB"] * 4
    mm_ops = ev[(ev["kind"] == "cpu_op") & ev["name"].astype(str).isin(["aten::mm", "aten::linear"])]
    assert len(mm_ops) == 7  # this sample was recorded without shapes: input_dims stay None
    assert mm_ops["input_dims"].isna().all()


def _old_era_trace() -> dict:
    """A synthetic trace in the plugin era's spelling, with shapes."""
    op = {"ph": "X", "cat": "Operator", "pid": 100, "tid": "100"}
    return {
        "schemaVersion": 1,
        "computeProperties": [{"id": 0, "name": "Tesla V100-SXM2-16GB"}],
        "traceEvents": [
            {**op, "name": "ProfilerStep#3", "ts": 1000, "dur": 900, "args": {"External id": 1}},
            {
                **op,
                "name": "aten::linear",
                "ts": 1010,
                "dur": 300,
                "args": {
                    "External id": 2,
                    "Input Dims": [[64, 128], [256, 128], [256]],
                    "Input type": ["float", "float", "float"],
                },
            },
            {
                **op,
                "name": "aten::addmm",
                "ts": 1020,
                "dur": 200,
                "args": {"External id": 3, "Input dims": [[256], [64, 128], [128, 256]]},
            },
            {
                "ph": "X",
                "cat": "Runtime",
                "name": "cudaLaunchKernel",
                "pid": 100,
                "tid": "100",
                "ts": 1030,
                "dur": 10,
                "args": {"correlation": 7, "external id": 3},
            },
            {
                "ph": "X",
                "cat": "Kernel",
                "name": "volta_sgemm_128x64_tn",
                "pid": 0,
                "tid": "stream 7",
                "ts": 1050,
                "dur": 100,
                "args": {"stream": 7, "correlation": 7, "external id": 3},
            },
            {
                "ph": "X",
                "cat": "Memcpy",
                "name": "Memcpy DtoH (Device -> Pageable)",
                "pid": 0,
                "tid": "stream 7",
                "ts": 1200,
                "dur": 40,
                "args": {"stream": 7, "correlation": 8, "external id": 4},
            },
            {
                "ph": "X",
                "cat": "Memset",
                "name": "Memset (Device)",
                "pid": 0,
                "tid": "stream 7",
                "ts": 1300,
                "dur": 5,
                "args": {"stream": 7, "correlation": 9, "external id": 5},
            },
            {
                "ph": "X",
                "cat": "Trace",
                "name": "PyTorch Profiler (0)",
                "pid": "Traces",
                "tid": "PyTorch Profiler",
                "ts": 900,
                "dur": 1200,
            },
        ],
    }


def test_old_era_ops_keep_shapes_and_device_copies_their_kind(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_bytes(orjson.dumps(_old_era_trace()))
    rt = load_trace(path)
    ev = rt.events.set_index(rt.events["name"].astype(str))
    assert ev.loc["Memcpy DtoH (Device -> Pageable)", "kind"] == "memcpy"
    assert ev.loc["Memset (Device)", "kind"] == "memset"
    assert ev.loc["volta_sgemm_128x64_tn", "kind"] == "compute"
    assert ev.loc["volta_sgemm_128x64_tn", "external_id"] == 3
    assert ev.loc["aten::linear", "kind"] == "cpu_op" and ev.loc["aten::addmm", "kind"] == "cpu_op"
    # Shapes kept (both spellings of the key), so FLOPs can be counted.
    linear = orjson.loads(ev.loc["aten::linear", "input_dims"])
    addmm = orjson.loads(ev.loc["aten::addmm", "input_dims"])
    assert flops_of("aten::linear", linear) == 2 * 64 * 128 * 256
    assert flops_of("aten::addmm", addmm) == 2 * 64 * 128 * 256
    assert rt.steps["step"].tolist() == [3]
    assert [p["name"] for p in rt.device_properties] == ["Tesla V100-SXM2-16GB"]
    assert "Trace" not in set(ev["cat"].astype(str)) and "trace" not in set(ev["cat"].astype(str))


# --------------------------------------------------------------------------
# displayTimeUnit


def _us_trace() -> KinetoTrace:
    t = KinetoTrace(rank=0, world_size=1, time_format="int")
    t.step(1, 1_000, 5_000)
    t.kernel("sgemm", 1_100, 2_000)
    t.memcpy(3_200, 300)
    t.step(2, 6_000, 5_000)
    t.kernel("sgemm", 6_100, 2_500)
    return t


def _ns_twin(doc: dict, where: str) -> dict:
    twin = copy.deepcopy(doc)
    for e in twin["traceEvents"]:
        for key in ("ts", "dur"):
            if isinstance(e.get(key), (int, float)):
                e[key] = int(round(e[key] * 1000))
    twin.pop("displayTimeUnit", None)
    if where == "head":
        return {"displayTimeUnit": "ns", **twin}
    return {**twin, "displayTimeUnit": "ns"}  # after traceEvents: known only at the end of the stream


@pytest.mark.parametrize("where", ["head", "tail"])
def test_ns_trace_equals_its_us_twin(tmp_path: Path, where: str) -> None:
    doc = _us_trace().to_dict()
    us = tmp_path / "us.json"
    us.write_bytes(orjson.dumps(doc))
    ns = tmp_path / "ns.json"
    ns.write_bytes(orjson.dumps(_ns_twin(doc, where)))
    a, b = load_trace(us), load_trace(ns)
    pd.testing.assert_frame_equal(a.events, b.events)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert b.steps["end_ns"].tolist() == [6_000_000, 11_000_000]
    assert b.notes == ['timestamps read as nanoseconds (the trace says "displayTimeUnit": "ns")'] and a.notes == []


def test_ns_epoch_timestamps_fit_and_float_ns_round(tmp_path: Path) -> None:
    base = 1_700_000_000_123_456_789  # epoch ns: beyond int64 if read as µs and scaled
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": base, "dur": 5_000},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.6e3, "dur": 2.4},
    ]
    path = tmp_path / "ns.json"
    path.write_bytes(orjson.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
    rt = load_trace(path)
    assert rt.notes == ['timestamps read as nanoseconds (the trace says "displayTimeUnit": "ns")']
    assert rt.steps["start_ns"].tolist() == [base] and rt.steps["end_ns"].tolist() == [base + 5_000]
    k = rt.events[rt.events["name"] == "k"]
    assert k["start_ns"].tolist() == [1600] and (k["end_ns"] - k["start_ns"]).tolist() == [2]
    assert np.issubdtype(rt.events["start_ns"].dtype, np.int64)
