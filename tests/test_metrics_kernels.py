"""Top kernels (device) and host ops (CPU-only traces) with exact totals and shares."""
from __future__ import annotations

import pandas as pd
import pytest

from analyzer.metrics.kernels import top_kernels
from analyzer.tables import events_from_records

US = 1000


def ev(name: str, start_us: float, dur_us: float, cat: str = "kernel", tid: int = 7) -> dict:
    return {"rank": 3, "cat": cat, "name": name, "tid": tid, "start_ns": int(start_us * US), "end_ns": int((start_us + dur_us) * US)}


def test_device_kernels_ranked_with_shares_of_kernel_time() -> None:
    events = events_from_records(
        [
            ev("gemm", 0, 30),
            ev("gemm", 40, 50),
            ev("ncclDevKernel_AllReduce", 0, 60, tid=20),
            ev("Memcpy HtoD (Pageable -> Device)", 100, 20, cat="gpu_memcpy"),
            ev("aten::mm", 0, 500, cat="cpu_op", tid=1),  # host op: not in a device table
        ]
    )
    out = top_kernels(events, pd.DataFrame(columns=["step", "start_ns", "end_ns"]), rank=3)
    assert out["name"].tolist() == ["gemm", "ncclDevKernel_AllReduce", "Memcpy HtoD (Pageable -> Device)"]
    assert out["kind"].tolist() == ["compute", "comm", "memcpy"]
    assert out["count"].tolist() == [2, 1, 1]
    assert out["total_ms"].tolist() == pytest.approx([0.080, 0.060, 0.020])
    assert out["mean_us"].tolist() == pytest.approx([40.0, 60.0, 20.0])
    assert out["max_us"].tolist() == pytest.approx([50.0, 60.0, 20.0])
    assert out["share_pct"].tolist() == pytest.approx([50.0, 37.5, 12.5])
    assert set(out["source"]) == {"device"} and set(out["rank"]) == {3}
    assert top_kernels(events, pd.DataFrame(columns=["step", "start_ns", "end_ns"]), rank=3, limit=1)["name"].tolist() == ["gemm"]


def test_host_ops_on_cpu_trace_share_of_step_time() -> None:
    events = events_from_records(
        [
            ev("ProfilerStep#0", 0, 1000, cat="user_annotation", tid=1),
            ev("aten::linear", 0, 300, cat="cpu_op", tid=1),
            ev("aten::addmm", 10, 280, cat="cpu_op", tid=1),  # nested: inclusive times
            ev("c10d::allreduce_", 400, 10, cat="cpu_op", tid=1),
            ev("gloo:all_reduce", 405, 200, cat="user_annotation", tid=9),
        ]
    )
    steps = pd.DataFrame({"step": [0], "start_ns": [0], "end_ns": [1000 * US]})
    out = top_kernels(events, steps, rank=3)
    assert out["name"].tolist() == ["aten::linear", "aten::addmm", "gloo:all_reduce", "c10d::allreduce_"]
    assert out["share_pct"].tolist() == pytest.approx([30.0, 28.0, 20.0, 1.0])
    assert set(out["source"]) == {"host"}
    assert out.loc[out["name"] == "gloo:all_reduce", "kind"].item() == "cpu_comm"
