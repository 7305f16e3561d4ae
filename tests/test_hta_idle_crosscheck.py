"""Cross-check the idle-time breakdown and the kernel launch statistics against HTA.

HTA (traceinsight) runs here on the shared real GPU traces with
``include_last_profiler_step=True``, the window of our figures
(analyzer.metrics.overlap.hta_window). Per rank and stream, two assertions
(docs/metrics.md, "Why the GPU is idle"):

1. On HTA's whole-microsecond timestamps (start rounded up, end down, as its
   parser does) our idle time per (stream, category) equals HTA's ``idle_time``
   to the microsecond, except where two events overlap on one stream (a
   negative gap: HTA adds it to kernel wait, we count 0); there the
   difference is exactly the overlapped time.
2. On exact nanoseconds each category's share of the stream's idle time is
   within 0.5 percentage points of HTA's (computed from its ``idle_time``
   column: its ``idle_time_ratio`` is rounded to 0.01, a whole point).

Launch statistics: with HTA's launch calls, the same number of (launch,
device event) pairs, and on HTA's timestamps the same summed CPU duration,
GPU duration and launch delay; with ours (HIP and driver-API names added)
the ROCm trace gets the pairs HTA's CUDA-only names miss.

The 54 MB ``df_index_resolver`` trace is left out (HTA needs ~25 s on it here).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer.ingest.load import load_trace
from analyzer.metrics.idle import CATEGORIES, HTA_LAUNCH_CALLS, launch_stats, stream_idle, window_device
from test_hta_crosscheck import hta_rounded  # HTA's microsecond rounding, as the overlap cross-check applies it

pytestmark = pytest.mark.filterwarnings("ignore")  # HTA's own pandas deprecation and NaN warnings

AGREEMENT_PP = 0.5

GROUPS = {
    "nccl_data": "nccl_parser_config/nccl_data.json.gz",
    "control": "trace_diff/control/control.json.gz",
    "test": "trace_diff/test/test.json.gz",
    "alexnet": "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "rocm": "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
}


_CACHE: dict[str, tuple[pd.DataFrame, pd.DataFrame, object]] = {}


@pytest.fixture
def hta_idle(hta_samples: Path, tmp_path_factory) -> dict[str, tuple[pd.DataFrame, pd.DataFrame, object]]:
    """Per group: HTA's idle breakdown, its launch stats, and our loaded trace; HTA runs once per session."""
    hta = pytest.importorskip("hta.trace_analysis")
    for group, rel in GROUPS.items():
        if group in _CACHE:
            continue
        folder = tmp_path_factory.mktemp(f"idle_{group}")
        src = hta_samples / rel
        os.symlink(src, folder / src.name)  # HTA wants a folder holding only traces
        rt = load_trace(src)
        logging.disable(logging.WARNING)  # HTA logs a warning per rounding and per rank
        try:
            analysis = hta.TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
            idle, _ = analysis.get_idle_time_breakdown(ranks=[rt.rank], visualize=False)
            stats = analysis.get_cuda_kernel_launch_stats(ranks=[rt.rank], visualize=False)[rt.rank]
        finally:
            logging.disable(logging.NOTSET)
        _CACHE[group] = (idle, stats, rt)
    return _CACHE


def _overlap_on_stream_us(events: pd.DataFrame, steps: pd.DataFrame, stream: int) -> float:
    """Summed negative gaps (us) between consecutive device events of one stream (HTA adds them, we count 0)."""
    dev = window_device(events, steps)
    dev = dev.loc[dev["stream"] == stream].sort_values("start_ns", kind="stable")
    gap = dev["start_ns"].to_numpy()[1:] - dev["end_ns"].to_numpy()[:-1]
    return float(-gap[gap < 0].sum()) / 1e3


@pytest.mark.parametrize("group", list(GROUPS))
def test_idle_breakdown_agrees_with_hta(hta_idle, group: str) -> None:
    hta, _, rt = hta_idle[group]
    name = rt.path.name
    exact = stream_idle(window_device(rt.events, rt.steps))
    as_hta = stream_idle(window_device(hta_rounded(rt.events), hta_rounded(rt.steps)))
    assert sorted(hta["stream"].unique()) == sorted(exact["stream"].unique()), name
    for stream, theirs in hta.groupby("stream"):
        theirs_us = {c: float(theirs.loc[theirs["idle_category"] == c, "idle_time"].sum()) for c in CATEGORIES}
        total_us = sum(theirs_us.values())
        mine_r = as_hta.loc[as_hta["stream"] == stream].set_index("idle_category")["idle_ns"] / 1e3
        mine = exact.loc[exact["stream"] == stream].set_index("idle_category")["idle_ratio"]
        overlapped = _overlap_on_stream_us(hta_rounded(rt.events), hta_rounded(rt.steps), int(stream))
        for c in CATEGORIES:
            # 1. Same definition on HTA's timestamps (kernel wait: less HTA's negative gaps).
            expected = theirs_us[c] + (overlapped if c == "kernel_wait" else 0.0)
            assert mine_r[c] == pytest.approx(expected, abs=1e-6), f"{name} stream {stream} {c}"
            # 2. Exact timestamps: each cause's share of the stream's idle time within 0.5 pp.
            assert 100 * mine[c] == pytest.approx(100 * theirs_us[c] / total_us, abs=AGREEMENT_PP), (
                f"{name} stream {stream} {c}"
            )


def test_negative_gaps_are_the_only_difference(hta_idle) -> None:
    """trace_diff/test overlaps events on stream 7 (CUDA-graph replays): 115 us HTA puts as negative kernel wait."""
    hta, _, rt = hta_idle["test"]
    overlapped = _overlap_on_stream_us(hta_rounded(rt.events), hta_rounded(rt.steps), 7)
    assert overlapped == pytest.approx(115.0)
    theirs = float(hta.loc[(hta["stream"] == 7) & (hta["idle_category"] == "kernel_wait"), "idle_time"].item())
    assert theirs == pytest.approx(51853.0)


@pytest.mark.parametrize("group", list(GROUPS))
def test_launch_stats_agree_with_hta(hta_idle, group: str) -> None:
    _, theirs, rt = hta_idle[group]
    name = rt.path.name
    exact = launch_stats(rt.events, rt.steps, HTA_LAUNCH_CALLS)
    as_hta = launch_stats(hta_rounded(rt.events), hta_rounded(rt.steps), HTA_LAUNCH_CALLS)
    assert len(exact) == len(theirs), name
    assert sorted(exact["correlation"]) == sorted(theirs["correlation"].astype(np.int64)), name
    for ours_col, hta_col in (
        ("cpu_duration_ns", "cpu_duration"),
        ("gpu_duration_ns", "gpu_duration"),
        ("launch_delay_ns", "launch_delay"),
    ):
        assert as_hta[ours_col].sum() / 1e3 == pytest.approx(float(theirs[hta_col].sum())), f"{name} {hta_col}"


def test_hip_launches_that_hta_misses(hta_idle) -> None:
    """HTA's launch names are CUDA's: the ROCm trace has no pairs there, 14 with ours (hipLaunchKernel, hipExt...)."""
    _, theirs, rt = hta_idle["rocm"]
    assert len(theirs) == 0
    assert len(launch_stats(rt.events, rt.steps)) == 14
