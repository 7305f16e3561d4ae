"""analyzer.timeline: binned occupancy and event windows, exact answers."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzer.tables import events_from_records
from analyzer.timeline import (
    STATES,
    active_span,
    align_origins,
    covered_ns,
    merge_intervals,
    occupancy,
    select_window,
    source_of,
)


def _ev(rank, cat, name, start_ns, end_ns, tid=7):
    return dict(rank=rank, cat=cat, name=name, start_ns=start_ns, end_ns=end_ns, tid=tid)


def test_merge_intervals_unions_nested_overlapping_and_touching():
    s, e = merge_intervals(np.array([50, 0, 10, 100, 200, 300]), np.array([60, 40, 20, 200, 250, 300]))
    # [0,40) absorbs [10,20); [50,60) alone; [100,200) touches [200,250); [300,300) is empty.
    assert s.tolist() == [0, 50, 100]
    assert e.tolist() == [40, 60, 250]


def test_covered_ns_splits_intervals_across_bins():
    edges = np.array([0, 100, 200, 300])
    # [50,150) and [120,260): union [50,260) -> 50 in bin 0, 100 in bin 1, 60 in bin 2.
    assert covered_ns(np.array([50, 120]), np.array([150, 260]), edges).tolist() == [50, 100, 60]
    # Interval entirely before and after the edges contributes nothing.
    assert covered_ns(np.array([-50, 400]), np.array([-10, 500]), edges).tolist() == [0, 0, 0]
    assert covered_ns(np.array([], dtype=np.int64), np.array([], dtype=np.int64), edges).tolist() == [0, 0, 0]


def test_occupancy_device_states_partition_each_bin_exactly():
    # One rank, origin 1000. Bin 0 = [0,100), bin 1 = [100,200) relative.
    # compute [0,60) on stream 7 and [150,200) on stream 8;
    # comm [40,140) (nccl): overlaps compute on [40,60), exposed [60,140);
    # memcpy [170,190) is hidden under compute; memcpy [140,150) is exposed.
    events = events_from_records(
        [
            _ev(0, "kernel", "sm90_gemm", 1000, 1060, tid=7),
            _ev(0, "kernel", "elementwise", 1150, 1200, tid=8),
            _ev(0, "kernel", "ncclDevKernel_AllReduce_Sum_f32", 1040, 1140, tid=20),
            _ev(0, "gpu_memcpy", "Memcpy HtoD", 1170, 1190, tid=9),
            _ev(0, "gpu_memset", "Memset", 1140, 1150, tid=9),
            _ev(0, "user_annotation", "ProfilerStep#3", 900, 1300, tid=1),
        ]
    )
    occ = occupancy(events, origin_ns=1000, span_ns=(0, 200), n_bins=2)
    assert occ["start_ns"].tolist() == [0, 100]
    assert occ["end_ns"].tolist() == [100, 200]
    # Bin 0: compute only [0,40) = 40; overlapped [40,60) = 20; exposed comm [60,100) = 40.
    assert occ.loc[0, "compute_frac"] == pytest.approx(0.40)
    assert occ.loc[0, "comm_overlapped_frac"] == pytest.approx(0.20)
    assert occ.loc[0, "comm_exposed_frac"] == pytest.approx(0.40)
    assert occ.loc[0, "memcpy_exposed_frac"] == pytest.approx(0.0)
    assert occ.loc[0, "idle_frac"] == pytest.approx(0.0)
    # Bin 1: exposed comm [100,140) = 40; exposed memset [140,150) = 10;
    # compute [150,200) = 50 (memcpy under it is not exposed); idle 0.
    assert occ.loc[1, "comm_exposed_frac"] == pytest.approx(0.40)
    assert occ.loc[1, "memcpy_exposed_frac"] == pytest.approx(0.10)
    assert occ.loc[1, "compute_frac"] == pytest.approx(0.50)
    assert occ.loc[1, "idle_frac"] == pytest.approx(0.0)
    sums = occ[[f"{s}_frac" for s in STATES]].sum(axis=1)
    assert sums.tolist() == pytest.approx([1.0, 1.0])


def test_occupancy_host_source_uses_cpu_ops_and_ignores_annotations():
    # CPU-only trace: aten ops are compute, gloo/c10d ops communication.
    events = events_from_records(
        [
            _ev(0, "user_annotation", "ProfilerStep#0", 0, 1000, tid=1),
            _ev(0, "cpu_op", "aten::addmm", 0, 300, tid=1),
            _ev(0, "cpu_op", "aten::mm", 100, 200, tid=1),  # nested: counted once
            _ev(0, "cpu_op", "c10d::allreduce_", 250, 600, tid=1),
            _ev(0, "user_annotation", "gloo:all_reduce", 500, 700, tid=3),
        ]
    )
    assert source_of(events) == "host"
    occ = occupancy(events, origin_ns=0, span_ns=(0, 1000), n_bins=1)
    # compute [0,300); comm [250,700); overlapped [250,300) = 50;
    # compute only 250; exposed comm [300,700) = 400; idle [700,1000) = 300.
    row = occ.iloc[0]
    assert row["compute_frac"] == pytest.approx(0.25)
    assert row["comm_overlapped_frac"] == pytest.approx(0.05)
    assert row["comm_exposed_frac"] == pytest.approx(0.40)
    assert row["idle_frac"] == pytest.approx(0.30)
    assert row["memcpy_exposed_frac"] == 0.0


def test_occupancy_rejects_empty_span():
    events = events_from_records([_ev(0, "kernel", "k", 0, 10)])
    with pytest.raises(ValueError, match="t1 > t0"):
        occupancy(events, origin_ns=0, span_ns=(5, 5), n_bins=4)


def _steps(pairs):
    return pd.DataFrame({"step": [p[0] for p in pairs], "start_ns": [p[1] for p in pairs], "end_ns": [p[2] for p in pairs]})


def test_align_origins_uses_first_common_profiler_step():
    ev0 = events_from_records([_ev(0, "kernel", "k", 5, 10)])
    ev1 = events_from_records([_ev(1, "kernel", "k", 7_000, 7_010)])
    # Rank 0 recorded steps 3,4,5; rank 1 steps 4,5: the first common is 4.
    origins = align_origins(
        {0: _steps([(3, 0, 100), (4, 100, 200), (5, 200, 300)]), 1: _steps([(4, 7_050, 7_150), (5, 7_150, 7_250)])},
        {0: ev0, 1: ev1},
    )
    assert origins == {0: 100, 1: 7_050}
    # Without shared steps: each rank's first event.
    assert align_origins({0: _steps([]), 1: _steps([])}, {0: ev0, 1: ev1}) == {0: 5, 1: 7_000}


def test_active_span_covers_all_ranks_relative_to_origins():
    ev0 = events_from_records([_ev(0, "kernel", "k", 100, 400)])
    ev1 = events_from_records([_ev(1, "kernel", "k", 1_050, 1_200), _ev(1, "cpu_op", "aten::mm", 0, 5_000, tid=1)])
    # Relative: rank 0 [0,300); rank 1 [50,200) (the cpu_op is not a device event).
    assert active_span({0: ev0, 1: ev1}, {0: 100, 1: 1_000}, "device") == (0, 300)
    assert active_span({0: ev0.iloc[:0]}, {0: 0}, "device") == (0, 1)


def test_select_window_keeps_longest_events_and_counts_dropped():
    ev = events_from_records(
        [
            _ev(0, "kernel", "short", 10, 12, tid=7),
            _ev(0, "kernel", "long", 0, 90, tid=7),
            _ev(0, "kernel", "ncclDevKernel_AllGather", 20, 60, tid=20),
            _ev(0, "kernel", "outside", 200, 300, tid=7),
            _ev(0, "cpu_op", "aten::mm", 0, 100, tid=1),  # host op: not a device event
        ]
    )
    ev1 = events_from_records([_ev(1, "kernel", "mid", 1_030, 1_050, tid=7)])
    win = select_window({0: ev, 1: ev1}, {0: 0, 1: 1_000}, (0, 100), max_events=3, source="device")
    assert win.n_total == 4
    assert win.n_dropped == 1
    # "short" (2 ns) is dropped; sorted by rank, lane, start.
    assert win.events["name"].tolist() == ["long", "ncclDevKernel_AllGather", "mid"]
    assert win.events["lane"].tolist() == [7, 20, 7]
    assert win.events["kind"].tolist() == ["compute", "comm", "compute"]
    assert win.events["start_ns"].tolist() == [0, 20, 30]
    assert win.events["end_ns"].tolist() == [90, 60, 50]


def test_select_window_empty_range():
    ev = events_from_records([_ev(0, "kernel", "k", 0, 10)])
    win = select_window({0: ev}, {0: 0}, (500, 600), max_events=10, source="device")
    assert win.n_total == 0 and len(win.events) == 0
    assert list(win.events.columns) == ["rank", "lane", "kind", "name", "start_ns", "end_ns"]
