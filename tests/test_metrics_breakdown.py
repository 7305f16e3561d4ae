"""Step breakdown on hand-built timelines with exact answers (times in us, tables in ns)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzer.metrics.breakdown import DEVICE_PARTS, HOST_PARTS, step_breakdown, summarize_breakdown
from analyzer.metrics.intervals import sweep, total_ns, union
from analyzer.ingest.tables import events_from_records

US = 1000


def kernel(name: str, start_us: float, end_us: float, stream: int = 7, cat: str = "kernel") -> dict:
    return {
        "rank": 0,
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": stream,
        "start_ns": int(start_us * US),
        "end_ns": int(end_us * US),
    }


def host(name: str, start_us: float, end_us: float, tid: int = 1, cat: str = "user_annotation") -> dict:
    return {
        "rank": 0,
        "cat": cat,
        "name": name,
        "pid": 100,
        "tid": tid,
        "start_ns": int(start_us * US),
        "end_ns": int(end_us * US),
    }


def steps_table(*windows_us: tuple[int, float, float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step": [w[0] for w in windows_us],
            "start_ns": [int(w[1] * US) for w in windows_us],
            "end_ns": [int(w[2] * US) for w in windows_us],
        }
    )


def as_us(table: pd.DataFrame, columns) -> list[dict]:
    """Rows of ms columns as exact integer microseconds."""
    return [{c: round(row[c] * 1000) for c in columns} for _, row in table.iterrows()]


def test_union_merges_overlapping_touching_and_drops_empty() -> None:
    s, e = union(np.array([50, 0, 10, 30, 70, 90]), np.array([60, 10, 20, 40, 70, 95]))
    # [0,10) and [10,20) touch -> one; [70,70) is empty and dropped.
    assert s.tolist() == [0, 30, 50, 90]
    assert e.tolist() == [20, 40, 60, 95]
    assert total_ns((s, e)) == 20 + 10 + 10 + 5


def test_sweep_masks_partition_the_span() -> None:
    tl = sweep([union(np.array([0]), np.array([10])), union(np.array([5]), np.array([20]))])
    assert tl.seg_start_ns.tolist() == [0, 5, 10]
    assert tl.seg_end_ns.tolist() == [5, 10, 20]
    assert tl.mask.tolist() == [1, 3, 2]
    # Windows beyond the timeline and inside a segment.
    got = tl.length_in(tl.mask == 3, np.array([-100, 7, 12]), np.array([100, 9, 30]))
    assert got.tolist() == [5, 2, 0]


def test_two_streams_union_and_comm_overlap_exact() -> None:
    events = events_from_records(
        [
            kernel("gemm_a", 0, 60, stream=7),
            kernel("gemm_b", 40, 100, stream=8),  # overlaps gemm_a on another stream
            kernel("ncclDevKernel_AllReduce_Sum_f32", 60, 160, stream=20),  # 100 us of comm
        ]
    )
    out = step_breakdown(events, steps_table((1, 0, 200)))
    assert out["source"].tolist() == ["device"]
    # compute union [0,100); comm [60,160): 40 us hidden, 60 us exposed, 40 us idle at the end.
    assert as_us(out, DEVICE_PARTS) == [
        {
            "compute_ms": 60,
            "overlapped_comm_ms": 40,
            "collective_wait_ms": 0,
            "exposed_comm_ms": 60,
            "exposed_memcpy_ms": 0,
            "idle_ms": 40,
        }
    ]
    assert round(out["comm_ms"].iloc[0] * 1000) == 100
    assert out["step_time_ms"].iloc[0] == pytest.approx(0.2)


def test_step_windows_clip_device_events() -> None:
    events = events_from_records([kernel("gemm", 90, 130), kernel("ncclKernel_AllGather", 180, 230, stream=9)])
    out = step_breakdown(events, steps_table((0, 0, 100), (1, 100, 200), (2, 200, 300)))
    assert as_us(out, ("compute_ms", "exposed_comm_ms", "idle_ms")) == [
        {"compute_ms": 10, "exposed_comm_ms": 0, "idle_ms": 90},
        {"compute_ms": 30, "exposed_comm_ms": 20, "idle_ms": 50},
        {"compute_ms": 0, "exposed_comm_ms": 30, "idle_ms": 70},
    ]


def test_memcpy_is_exposed_only_outside_compute_and_comm() -> None:
    events = events_from_records(
        [
            kernel("gemm", 0, 50),
            kernel("Memcpy HtoD (Pageable -> Device)", 30, 80, stream=11, cat="gpu_memcpy"),  # 30 us exposed
            kernel("ncclKernel_AllReduce", 60, 70, stream=12),  # covers 10 us of the memcpy
            kernel("Memset (Device)", 90, 95, stream=11, cat="gpu_memset"),  # 5 us exposed
        ]
    )
    out = step_breakdown(events, steps_table((3, 0, 100)))
    assert as_us(out, DEVICE_PARTS) == [
        {
            "compute_ms": 50,
            "overlapped_comm_ms": 0,
            "collective_wait_ms": 0,
            "exposed_comm_ms": 10,
            "exposed_memcpy_ms": 25,
            "idle_ms": 15,
        }
    ]


def test_parts_sum_exactly_to_step_on_random_timelines() -> None:
    rng = np.random.default_rng(7)
    records = []
    names = ["gemm", "ncclDevKernel_ReduceScatter", "Memcpy DtoD"]
    cats = ["kernel", "kernel", "gpu_memcpy"]
    for _ in range(400):
        k = int(rng.integers(0, 3))
        start = int(rng.integers(0, 10_000_000))
        records.append(
            {
                "rank": 0,
                "cat": cats[k],
                "name": names[k],
                "tid": int(rng.integers(0, 4)),
                "start_ns": start,
                "end_ns": start + int(rng.integers(1, 300_000)),
            }
        )
    events = events_from_records(records)
    edges = np.sort(rng.choice(np.arange(1, 10_500_000), size=11, replace=False))
    steps = pd.DataFrame({"step": np.arange(10), "start_ns": edges[:-1], "end_ns": edges[1:]})
    out = step_breakdown(events, steps)
    parts_ns = sum(np.round(out[p].to_numpy() * 1e6).astype(np.int64) for p in DEVICE_PARTS)
    assert parts_ns.tolist() == (edges[1:] - edges[:-1]).tolist()
    # Brute force on a 1 ns grid for one step: busy = union of everything.
    lo, hi = int(edges[0]), int(edges[1])
    grid = np.zeros(hi - lo, dtype=bool)
    for r in records:
        a, b = max(r["start_ns"], lo), min(r["end_ns"], hi)
        if b > a:
            grid[a - lo : b - lo] = True
    assert round(out["idle_ms"].iloc[0] * 1e6) == int((~grid).sum())


def test_host_breakdown_phases_comm_and_other() -> None:
    events = events_from_records(
        [
            host("ProfilerStep#5", 0, 1000),
            host("data", 0, 100),
            host("forward", 100, 300),
            host("backward", 300, 700),
            host("aten::mm", 310, 400, cat="cpu_op"),  # ops are inside phases: not parts of their own
            host("c10d::allreduce_", 500, 510, cat="cpu_op"),
            host("gloo:all_reduce", 505, 690, tid=9),  # on gloo's thread, inside backward
            host("optimizer", 720, 800),
            host("c10d::allgather_", 850, 900, cat="cpu_op"),  # outside every phase: exposed
        ]
    )
    steps = steps_table((5, 0, 1000))
    out = step_breakdown(events, steps)
    assert out["source"].tolist() == ["host"]
    assert as_us(out, HOST_PARTS) == [
        {
            "data_ms": 100,
            "forward_ms": 200,
            "backward_ms": 400,
            "optimizer_ms": 80,
            "grad_sync_ms": 0,
            "collective_wait_ms": 0,  # no waits given: one rank
            "exposed_comm_ms": 50,
            "other_ms": 170,
        }
    ]
    # comm_ms is the union of collective time (505..690 merges with 500..510), not a part.
    assert round(out["comm_ms"].iloc[0] * 1000) == 190 + 50


def test_host_nested_phase_goes_to_the_more_specific_one() -> None:
    events = events_from_records([host("backward", 0, 100), host("grad_sync", 60, 100)])
    out = step_breakdown(events, steps_table((0, 0, 100)), source="host")
    assert as_us(out, ("backward_ms", "grad_sync_ms", "other_ms")) == [
        {"backward_ms": 60, "grad_sync_ms": 40, "other_ms": 0}
    ]


def test_summary_pct_sums_to_100_and_medians() -> None:
    events = events_from_records([kernel("gemm", 0, 30), kernel("gemm", 100, 180)])
    out = step_breakdown(events, steps_table((0, 0, 100), (1, 100, 300), (2, 300, 400)))
    summary = summarize_breakdown(out, "device")
    assert sum(v["pct"] for v in summary.values()) == pytest.approx(100.0)
    assert summary["compute"]["pct"] == pytest.approx(100 * 110 / 400)
    assert summary["compute"]["median_ms"] == pytest.approx(0.030)
    assert summary["idle"]["median_ms"] == pytest.approx(0.100)
    assert summary["idle"]["mean_ms"] == pytest.approx((0.070 + 0.120 + 0.100) / 3)


def test_no_steps_gives_empty_table() -> None:
    events = events_from_records([kernel("gemm", 0, 30)])
    out = step_breakdown(events, steps_table())
    assert out.empty and "idle_ms" in out.columns


# ------------------------------------------------ waiting at a collective is its own part
def test_host_wait_at_the_collective_is_not_backward() -> None:
    """The fast rank of DDP: it issues its all-reduce at 500 us, the last rank arrives at 800 us.

    Its training thread blocks at the end of backward() until the transfer
    is done (900 us). Without waits all 400 us after its last op read as
    backward; with them 300 - 10 us (the issue op itself runs until 510)
    are collective_wait, and only the rest stays backward.
    """
    events = events_from_records(
        [
            host("ProfilerStep#5", 0, 1000),
            host("forward", 0, 300),
            host("backward", 300, 950),
            host("aten::mm", 310, 490, cat="cpu_op"),
            host("c10d::allreduce_", 500, 510, cat="cpu_op"),  # arrival (host issue) on the training thread
            host("gloo:all_reduce", 510, 900, tid=9),  # gloo's thread: waits, then transfers
            host("aten::copy_", 900, 950, cat="cpu_op"),  # the thread resumes
        ]
    )
    steps = steps_table((5, 0, 1000))
    alone = step_breakdown(events, steps)
    waits = (np.array([500 * US]), np.array([800 * US]))  # [own arrival, last arrival)
    out = step_breakdown(events, steps, waits=waits)
    assert as_us(alone, ("backward_ms", "collective_wait_ms")) == [{"backward_ms": 650, "collective_wait_ms": 0}]
    assert as_us(out, HOST_PARTS) == [
        {
            "data_ms": 0,
            "forward_ms": 300,
            "backward_ms": 360,
            "optimizer_ms": 0,
            "grad_sync_ms": 0,
            "collective_wait_ms": 290,
            "exposed_comm_ms": 0,
            "other_ms": 50,
        }
    ]


def test_device_wait_is_carved_out_of_the_communication_kernel() -> None:
    """An all-reduce kernel starts at 60 us and spins until the last rank arrives at 130 us; compute runs until 100."""
    events = events_from_records(
        [
            kernel("gemm", 0, 100),
            kernel("ncclDevKernel_AllReduce_Sum_f32", 60, 160, stream=20),
        ]
    )
    out = step_breakdown(events, steps_table((1, 0, 200)), waits=(np.array([60 * US]), np.array([130 * US])))
    # 60..100 is hidden behind compute (overlapped, whatever the wait); 100..130 is the wait; 130..160 the transfer.
    assert as_us(out, DEVICE_PARTS) == [
        {
            "compute_ms": 60,
            "overlapped_comm_ms": 40,
            "collective_wait_ms": 30,
            "exposed_comm_ms": 30,
            "exposed_memcpy_ms": 0,
            "idle_ms": 40,
        }
    ]
    assert round(out["comm_ms"].iloc[0] * 1000) == 100  # the kernel's whole time, wait included


def test_waits_from_collective_durations_need_no_common_clock() -> None:
    from analyzer.metrics.stragglers import collective_spans, wait_intervals

    # Two ranks, clocks 1 s apart. Collective 0: rank 0 arrives 30 us before rank 1 (its kernel
    # runs 130 us, rank 1's 100 us). Collective 1: both arrive together (equal durations).
    def rank_events(rank: int, shift_us: float, k0: tuple, k1: tuple) -> pd.DataFrame:
        return events_from_records(
            [
                {
                    **kernel("ncclDevKernel_AllReduce_Sum_f32", shift_us + k0[0], shift_us + k0[1], stream=20),
                    "rank": rank,
                },
                {
                    **kernel("ncclDevKernel_AllReduce_Sum_f32", shift_us + k1[0], shift_us + k1[1], stream=20),
                    "rank": rank,
                },
            ]
        )

    spans = collective_spans(
        {0: rank_events(0, 0, (100, 230), (500, 600)), 1: rank_events(1, 1_000_000, (130, 230), (500, 600))}
    )
    assert spans["key"].tolist() == ["0:0", "0:1", "0:0", "0:1"]
    waits = wait_intervals(spans)
    assert list(waits) == [0]  # nobody waits at collective 1; rank 1 arrived last at collective 0
    assert waits[0][0].tolist() == [100 * US] and waits[0][1].tolist() == [130 * US]
