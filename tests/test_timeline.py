"""analyzer.metrics.timeline: binned occupancy and event windows, exact answers."""

from __future__ import annotations

import pandas as pd
import pytest

from analyzer.ingest.tables import events_from_records
from analyzer.metrics.breakdown import step_breakdown
from analyzer.metrics.timeline import active_span, align_origins, occupancy, overview, select_window, states_of


def _ev(rank, cat, name, start_ns, end_ns, tid=7):
    return dict(rank=rank, cat=cat, name=name, start_ns=start_ns, end_ns=end_ns, tid=tid)


def _device_events():
    # One rank, origin 1000. Bin 0 = [0,100), bin 1 = [100,200) relative.
    # compute [0,60) on stream 7 and [150,200) on stream 8;
    # comm [40,140) (nccl): overlaps compute on [40,60), exposed [60,140);
    # memcpy [170,190) is hidden under compute; memset [140,150) is exposed.
    return events_from_records(
        [
            _ev(0, "user_annotation", "ProfilerStep#3", 900, 1300, tid=1),
            _ev(0, "kernel", "sm90_gemm", 1000, 1060, tid=7),
            _ev(0, "kernel", "ncclDevKernel_AllReduce_Sum_f32", 1040, 1140, tid=20),
            _ev(0, "gpu_memset", "Memset", 1140, 1150, tid=9),
            _ev(0, "kernel", "elementwise", 1150, 1200, tid=8),
            _ev(0, "gpu_memcpy", "Memcpy HtoD", 1170, 1190, tid=9),
        ]
    )


def test_occupancy_device_parts_partition_each_bin_exactly():
    occ = occupancy(_device_events(), origin_ns=1000, span_ns=(0, 200), n_bins=2)
    assert states_of("device") == (
        "compute",
        "overlapped_comm",
        "collective_wait",
        "exposed_comm",
        "exposed_memcpy",
        "idle",
    )
    assert occ["start_ns"].tolist() == [0, 100]
    assert occ["end_ns"].tolist() == [100, 200]
    # Bin 0: compute only [0,40) = 40; overlapped [40,60) = 20; exposed comm [60,100) = 40.
    assert occ.loc[0, "compute_frac"] == pytest.approx(0.40)
    assert occ.loc[0, "overlapped_comm_frac"] == pytest.approx(0.20)
    assert occ.loc[0, "exposed_comm_frac"] == pytest.approx(0.40)
    assert occ.loc[0, "exposed_memcpy_frac"] == pytest.approx(0.0)
    assert occ.loc[0, "idle_frac"] == pytest.approx(0.0)
    # Bin 1: exposed comm [100,140) = 40; exposed memset [140,150) = 10;
    # compute [150,200) = 50 (the memcpy under it is not exposed); idle 0.
    assert occ.loc[1, "exposed_comm_frac"] == pytest.approx(0.40)
    assert occ.loc[1, "exposed_memcpy_frac"] == pytest.approx(0.10)
    assert occ.loc[1, "compute_frac"] == pytest.approx(0.50)
    assert occ.loc[1, "idle_frac"] == pytest.approx(0.0)
    sums = occ[[f"{s}_frac" for s in states_of("device")]].sum(axis=1)
    assert sums.tolist() == pytest.approx([1.0, 1.0])


def test_occupancy_over_one_step_equals_the_step_breakdown():
    # One bin spanning the ProfilerStep window gives the breakdown's shares.
    events = _device_events()
    occ = occupancy(events, origin_ns=900, span_ns=(0, 400), n_bins=1)
    steps = pd.DataFrame({"step": [3], "start_ns": [900], "end_ns": [1300]})
    row = step_breakdown(events, steps).iloc[0]
    for state in states_of("device"):
        assert occ.loc[0, f"{state}_frac"] == pytest.approx(row[f"{state}_ms"] / row["step_time_ms"])
    # 100 idle before the first kernel and 100 after the last one, of 400.
    assert occ.loc[0, "idle_frac"] == pytest.approx(0.5)


def test_occupancy_host_source_uses_phase_annotations_and_collectives():
    # CPU-only trace: the trainer's phase ranges and gloo/c10d collectives.
    events = events_from_records(
        [
            _ev(0, "user_annotation", "ProfilerStep#0", 0, 1000, tid=1),
            _ev(0, "user_annotation", "forward", 0, 300, tid=1),
            _ev(0, "cpu_op", "aten::addmm", 100, 200, tid=1),  # inside forward: not a part of its own
            _ev(0, "user_annotation", "backward", 300, 600, tid=1),
            _ev(0, "user_annotation", "gloo:all_reduce", 500, 700, tid=3),
        ]
    )
    occ = occupancy(events, origin_ns=0, span_ns=(0, 1000), n_bins=2)
    # Bin 0 [0,500): forward 300, backward 200.
    assert occ.loc[0, "forward_frac"] == pytest.approx(0.6)
    assert occ.loc[0, "backward_frac"] == pytest.approx(0.4)
    # Bin 1 [500,1000): backward [500,600) = 100 (the collective inside it is
    # backward's), exposed comm [600,700) = 100, other [700,1000) = 300.
    assert occ.loc[1, "backward_frac"] == pytest.approx(0.2)
    assert occ.loc[1, "exposed_comm_frac"] == pytest.approx(0.2)
    assert occ.loc[1, "other_frac"] == pytest.approx(0.6)
    assert occ.loc[1, "data_frac"] == 0.0


def test_occupancy_rejects_empty_span():
    events = events_from_records([_ev(0, "kernel", "k", 0, 10)])
    with pytest.raises(ValueError, match="t1 > t0"):
        occupancy(events, origin_ns=0, span_ns=(5, 5), n_bins=4)


def _steps(pairs):
    return pd.DataFrame(
        {"step": [p[0] for p in pairs], "start_ns": [p[1] for p in pairs], "end_ns": [p[2] for p in pairs]}
    )


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


def test_overview_aligns_two_ranks_on_their_first_common_step():
    # Rank 1's clock is 1_000_000 ns ahead; both run the same kernel pattern
    # inside ProfilerStep#7, so after alignment their occupancy is identical.
    def rank_events(rank, shift):
        return events_from_records(
            [
                _ev(rank, "user_annotation", "ProfilerStep#7", shift + 0, shift + 400, tid=1),
                _ev(rank, "kernel", "gemm", shift + 0, shift + 200, tid=7),
                _ev(rank, "kernel", "ncclDevKernel_AllReduce", shift + 100, shift + 400, tid=20),
            ]
        )

    events = {0: rank_events(0, 0), 1: rank_events(1, 1_000_000)}
    steps = {0: _steps([(7, 0, 400)]), 1: _steps([(7, 1_000_000, 1_000_400)])}
    ov = overview(events, steps, n_bins=4)
    assert ov.source == "device"
    assert ov.origins == {0: 0, 1: 1_000_000}
    assert ov.span_ns == (0, 400)
    assert ov.steps[["rank", "step", "start_ns", "end_ns"]].values.tolist() == [[0, 7, 0, 400], [1, 7, 0, 400]]
    for rank in (0, 1):
        mine = ov.occupancy[ov.occupancy["rank"] == rank]
        # Bins of 100: compute only, overlapped, exposed comm, exposed comm.
        assert mine["compute_frac"].tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0])
        assert mine["overlapped_comm_frac"].tolist() == pytest.approx([0.0, 1.0, 0.0, 0.0])
        assert mine["exposed_comm_frac"].tolist() == pytest.approx([0.0, 0.0, 1.0, 1.0])
