"""HTA-style overlap, idle and exposed communication on hand-built timelines."""

from __future__ import annotations

import pandas as pd
import pytest

from analyzer.metrics.breakdown import step_breakdown
from analyzer.metrics.overlap import exposed_comm_pct, hta_window, overlap
from analyzer.ingest.tables import events_from_records

US = 1000


def ev(name: str, start_us: float, end_us: float, cat: str = "kernel", tid: int = 7, correlation: int = -1) -> dict:
    return {
        "rank": 0,
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": tid,
        "start_ns": int(start_us * US),
        "end_ns": int(end_us * US),
        "correlation": correlation,
    }


def steps_table(*windows_us) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step": [w[0] for w in windows_us],
            "start_ns": [w[1] * US for w in windows_us],
            "end_ns": [w[2] * US for w in windows_us],
        }
    )


def test_forty_of_hundred_us_comm_overlapped_is_forty_percent() -> None:
    events = events_from_records(
        [
            ev("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 100, 200, tid=20),  # 100 us comm
            ev("sm90_xmma_gemm", 60, 120),  # covers 20 us of it
            ev("elementwise_kernel", 180, 200, tid=8),  # covers another 20 us
        ]
    )
    result = overlap(events, steps_table())
    assert result.comm_ns == 100 * US
    assert result.comm_overlapped_ns == 40 * US
    assert result.comm_comp_overlap_pct == pytest.approx(40.0)
    # Span 60..200 us, busy the whole time.
    assert result.idle_pct == pytest.approx(0.0)


def test_idle_is_gaps_over_first_to_last_device_event() -> None:
    events = events_from_records(
        [
            ev("gemm", 0, 10),
            ev("Memcpy DtoH (Device -> Pinned)", 30, 40, cat="gpu_memcpy", tid=9),
            ev("gemm", 35, 50, tid=8),
            ev("ProfilerStep#1", -500, 500, cat="user_annotation", tid=1),  # host: not device activity
            ev("Stream Sync", 50, 100, cat="cuda_sync"),  # waiting, not device work
        ]
    )
    result = overlap(events, steps_table())
    # Span [0, 50), busy [0,10) + [30,50) = 30 us, idle 20 us.
    assert result.span_ns == 50 * US
    assert result.idle_pct == pytest.approx(40.0)
    assert result.compute_pct == pytest.approx(100 * 25 / 50)
    assert result.comm_comp_overlap_pct is None  # no communication at all


def test_hta_window_keeps_kernels_launched_before_the_last_step_ends() -> None:
    events = events_from_records(
        [
            ev("ProfilerStep#1", 0, 100, cat="user_annotation", tid=1),
            ev("ProfilerStep#2", 100, 200, cat="user_annotation", tid=1),
            ev("cudaLaunchKernel", 10, 12, cat="cuda_runtime", tid=1, correlation=1),
            ev("cudaLaunchKernel", 190, 195, cat="cuda_runtime", tid=1, correlation=2),
            ev("cudaLaunchKernel", 210, 215, cat="cuda_runtime", tid=1, correlation=3),  # after the last step
            ev("gemm", 20, 60, correlation=1),
            ev("gemm", 196, 230, correlation=2),  # launched inside step 2, runs past its end: kept
            ev("gemm", 240, 300, correlation=3),  # launched after step 2: dropped
            ev("gemm", 310, 320, correlation=-1),  # no launch event: dropped
        ]
    )
    steps = steps_table((1, 0, 100), (2, 100, 200))
    keep = hta_window(events, steps)
    assert events.loc[keep, "correlation"].tolist() == [1, 2]
    result = overlap(events, steps)
    assert result.span_ns == (230 - 20) * US
    assert result.busy_ns == (40 + 34) * US
    # With a single ProfilerStep HTA keeps everything (and so do we).
    one = steps.iloc[:1]
    assert int(hta_window(events, one).sum()) == 4


def test_exposed_comm_pct_is_share_of_step_time() -> None:
    events = events_from_records(
        [ev("ncclKernel_AllReduce", 0, 50, tid=20), ev("gemm", 0, 30), ev("ncclKernel_AllReduce", 150, 170, tid=20)]
    )
    table = step_breakdown(events, steps_table((0, 0, 100), (1, 100, 200)))
    # Exposed: 20 us in step 0 and 20 us in step 1 over 200 us of steps.
    assert exposed_comm_pct(table) == pytest.approx(20.0)
    assert exposed_comm_pct(table.iloc[0:0]) is None
