"""Why the GPU is idle (analyzer.metrics.idle) on a synthetic two-step trace with exact answers.

Step 1 (0-1000 us) and step 2 (1000-2000 us); launch calls are 5 us. Stream 7:
K1 20-120 (launched 10), K2 130-230 (launched 100: before K1 ended, gap 10 us
-> kernel wait), K3 310-410 (launched 300, after K2 ended -> host wait 80),
K4 500-600 (launched 320, gap 90 >= 30 -> other), a pageable HtoD copy
1020-1070 (launched 1010 -> host wait 420). Stream 8: K5 340-700 (launched
330), K6 1060-1100 (launched 1016 -> host wait 360), K7 1200-1202 (2 us,
launched 1190 -> host wait 100). aten::item 235-302 > _local_scalar_dense >
cudaStreamSynchronize 240-300: one sync point whose end lies in the device
gap 230-310.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer.ingest.load import load_trace
from analyzer.ingest.tables import empty_events, empty_steps
from analyzer.metrics.idle import (
    CATEGORIES,
    KERNEL_WAIT_NS,
    LaunchSummary,
    device_gaps,
    launch_stats,
    rank_idle,
    run_idle,
    stream_idle,
    window_device,
)
from synth import KinetoTrace


def _trace() -> KinetoTrace:
    t = KinetoTrace()
    t.step(1, 0, 1000)
    t.step(2, 1000, 1000)
    t.kernel("K1", 20, 100, stream=7, launch_us=10)
    t.kernel("K2", 130, 100, stream=7, launch_us=100)
    t.kernel("K3", 310, 100, stream=7, launch_us=300)
    t.kernel("K4", 500, 100, stream=7, launch_us=320)
    t.kernel("K5", 340, 360, stream=8, launch_us=330)
    t.cpu_op("aten::item", 235, 67)
    t.cpu_op("aten::_local_scalar_dense", 236, 65)
    t.runtime("cudaStreamSynchronize", 240, 60, t.next_correlation())
    t.memcpy(1020, 50, stream=7, kind="HtoD", launch_us=1010)
    t.kernel("K6", 1060, 40, stream=8, launch_us=1016)
    t.kernel("K7", 1200, 2, stream=8, launch_us=1190)
    return t


@pytest.fixture
def rt(tmp_path: Path):
    return load_trace(_trace().write(tmp_path / "rank0.json.gz"))


def _us(table: pd.DataFrame, stream: int, category: str) -> float:
    return float(table.loc[(table["stream"] == stream) & (table["idle_category"] == category), "idle_ns"].item()) / 1e3


def test_stream_breakdown_is_htas_rule(rt) -> None:
    table = stream_idle(window_device(rt.events, rt.steps))
    assert (_us(table, 7, "host_wait"), _us(table, 7, "kernel_wait"), _us(table, 7, "other")) == (500.0, 10.0, 90.0)
    assert (_us(table, 8, "host_wait"), _us(table, 8, "kernel_wait"), _us(table, 8, "other")) == (460.0, 0.0, 0.0)
    s7 = table.loc[table["stream"] == 7].set_index("idle_category")
    assert s7.loc["other", "idle_ratio"] == pytest.approx(90 / 600)
    assert list(s7["n_gaps"]) == [2, 1, 1]


def test_device_idle_by_cause_sums_to_the_idle_time(rt) -> None:
    gaps = device_gaps(window_device(rt.events, rt.steps))
    # Union [20,120] [130,230] [310,700] [1020,1100] [1200,1202]: gaps 10 (kernel wait), 80, 320, 100 (host wait).
    assert gaps.idle_ns("host_wait") == 500_000 and gaps.idle_ns("kernel_wait") == 10_000 and gaps.idle_ns("other") == 0
    assert gaps.idle_ns() == 510_000 and gaps.span_ns == 1_182_000


def test_launch_stats_pairs_and_delays(rt) -> None:
    stats = launch_stats(rt.events, rt.steps)
    assert len(stats) == 8
    assert sorted(stats["launch_delay_ns"] // 1000) == [5, 5, 5, 5, 5, 25, 39, 175]
    assert set(stats["cpu_duration_ns"]) == {5000}
    s = LaunchSummary.of(stats)
    assert s.n_short == 1 and s.short_share == pytest.approx(1 / 8)  # K7: 2 us under its 5 us launch
    assert s.n_delay_outliers == 1 and s.n_runtime_outliers == 0  # K4's 175 us delay
    assert s.launch_delay_us_max == pytest.approx(175.0)


def test_rank_figures_syncs_and_pageable_copies(rt) -> None:
    t = rank_idle(rt.events, rt.steps)
    assert list(t.syncs["name"]) == ["aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize"]
    assert list(t.syncs["host_ns"]) == [67_000, 65_000, 60_000]
    assert t.sync_points.n == 1 and t.sync_points.host_ns == 67_000  # the nest is one sync point
    assert t.sync_points.idle_ns == 80_000  # the gap 230-310 holds the sync's end (300)
    assert (t.pageable.n, t.pageable.time_ns, t.pageable.exposed_ns) == (1, 50_000, 40_000)  # K6 covers 1060-1070
    row = run_idle({0: t}).ranks.iloc[0]
    assert row["idle_pct"] == pytest.approx(100 * 510 / 1182)
    assert row["host_wait_pct"] == pytest.approx(100 * 500 / 510)
    assert row["syncs_per_step"] == 0.5 and row["sync_idle_ms"] == pytest.approx(0.08)
    assert row["pageable_htod_per_step"] == 0.5 and row["pageable_htod_exposed_ms"] == pytest.approx(0.04)


def test_kernel_wait_threshold_and_overlap_on_a_stream(tmp_path: Path) -> None:
    """A gap of exactly 30 us is 'other' (HTA: gap < threshold); an overlap on one stream counts 0, not negative."""
    t = KinetoTrace()
    t.kernel("A", 0, 10, stream=7, launch_us=-10)
    t.kernel("B", 40, 10, stream=7, launch_us=-5)  # gap 30: other
    t.kernel("C", 79.999, 10, stream=7, launch_us=-4)  # gap 29.999: kernel wait
    t.kernel("D", 85, 10, stream=7, launch_us=-3)  # starts before C ends: 0
    rt = load_trace(t.write(tmp_path / "r.json.gz"))
    table = stream_idle(window_device(rt.events, rt.steps))
    assert KERNEL_WAIT_NS == 30_000
    assert _us(table, 7, "other") == 30.0 and _us(table, 7, "kernel_wait") == pytest.approx(29.999)
    assert int(table["n_gaps"].sum()) == 3


def test_empty_tables_give_the_typed_empty_result() -> None:
    t = rank_idle(empty_events(), empty_steps())
    assert t.launch == LaunchSummary() and t.device["idle_ns"] == 0 and t.syncs.empty and t.streams.empty
    run = run_idle({0: t})
    assert run.ranks["idle_pct"].isna().all() and run.streams.empty
    empty = run_idle({})
    assert empty.ranks.empty and list(empty.streams.columns)[:3] == ["rank", "stream", "idle_category"]
    assert set(CATEGORIES) == {"host_wait", "kernel_wait", "other"}
    assert np.isnan(run.ranks["syncs_per_step"].astype(float)).all()
