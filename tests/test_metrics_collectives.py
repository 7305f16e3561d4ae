"""Per-collective sizes and bandwidths (nccl-tests formulas), alpha-beta fits and the comm diagnosis, with exact answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzer.ingest.load import load_trace
from analyzer.metrics.collectives import alpha_beta, collective_table, diagnose
from analyzer.metrics.hardware import link_peak
from tests.synth import KinetoTrace

NCCL_AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
NCCL_AG = "ncclDevKernel_AllGather_RING_LL"
NCCL_RS = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"


def _table(tmp_path, build) -> pd.DataFrame:
    t = KinetoTrace(rank=0, world_size=8)
    t.step(1, 0, 100_000)
    build(t)
    return collective_table(load_trace(t.write(tmp_path / "rank0.json.gz")).events)


def test_bandwidths_match_nccl_tests_formulas(tmp_path):
    def build(t):
        # all_reduce: S = 25e6 floats = 100e6 B in 1000 us -> algbw 100 GB/s, busbw 100 * 2*7/8 = 175.
        t.kernel(NCCL_AR, 1000, 1000, stream=20, args=t.comm_args("allreduce", 25_000_000))
        # all_gather: S = output = 8e6 bf16 = 16e6 B in 200 us -> 80 GB/s, busbw 80 * 7/8 = 70.
        t.kernel(
            NCCL_AG,
            3000,
            200,
            stream=20,
            args=t.comm_args("_allgather_base", 1_000_000, 8_000_000, dtype="c10::BFloat16"),
        )
        # reduce_scatter: S = input = 8e6 floats = 32e6 B in 400 us -> 80 GB/s, busbw 70.
        t.kernel(NCCL_RS, 4000, 400, stream=20, args=t.comm_args("_reduce_scatter_base", 8_000_000, 1_000_000))

    tab = _table(tmp_path, build)
    assert tab["kind"].tolist() == ["all_reduce", "all_gather", "reduce_scatter"]
    assert tab["size_bytes"].tolist() == [100e6, 16e6, 32e6]
    assert tab["group_size"].tolist() == [8, 8, 8]
    np.testing.assert_allclose(tab["algbw_gbps"], [100.0, 80.0, 80.0])
    np.testing.assert_allclose(tab["busbw_gbps"], [175.0, 70.0, 70.0])


def test_message_from_launching_record_param_comms(tmp_path):
    """Older PyTorch: the kernel has no message args; the record_param_comms op around its launch has them."""

    def build(t):
        t.record_param_comms(900, 50, args=t.comm_args("allreduce", 25_000_000))
        t.kernel(NCCL_AR, 1000, 1000, stream=20, launch_us=910)

    tab = _table(tmp_path, build)
    assert tab["size_bytes"].tolist() == [100e6]
    np.testing.assert_allclose(tab["busbw_gbps"], [175.0])


def test_alpha_beta_exact(tmp_path):
    def build(t):
        # 4e6 B in 30 us and 8e6 B in 50 us: 20 us per 4e6 B -> beta 200 GB/s, alpha 10 us.
        t.kernel(NCCL_AR, 1000, 30, stream=20, args=t.comm_args("allreduce", 1_000_000))
        t.kernel(NCCL_AR, 2000, 50, stream=20, args=t.comm_args("allreduce", 2_000_000))
        t.kernel(NCCL_AG, 3000, 50, stream=20, args=t.comm_args("_allgather_base", 1_000_000, 8_000_000))

    fits = alpha_beta(_table(tmp_path, build))
    assert set(fits) == {"all_reduce"}  # one all_gather size: no fit
    assert fits["all_reduce"].alpha_us == pytest.approx(10.0)
    assert fits["all_reduce"].beta_gbps == pytest.approx(200.0)
    assert fits["all_reduce"].count == 2


def _rows(sizes, durations_ns, busbw):
    return pd.DataFrame(
        {
            "kind": "all_reduce",
            "start_ns": np.arange(len(sizes)),
            "duration_ns": durations_ns,
            "size_bytes": np.asarray(sizes, np.float64),
            "group_size": 8,
            "dtype": "Float",
            "algbw_gbps": np.nan,
            "busbw_gbps": np.asarray(busbw, np.float64),
        }
    )


def test_diagnosis_latency_bound():
    d = diagnose(_rows([4096] * 3 + [1e8], [600, 600, 600, 1000], [1, 1, 1, 400]), 450.0)
    assert d.verdict == "latency_bound"
    assert d.evidence["small_time_share"] == pytest.approx(1800 / 2800)
    assert d.evidence["small_count"] == 3


def test_diagnosis_bandwidth_bound_and_waiting():
    big = [1e8] * 4
    d = diagnose(_rows(big, [1000] * 4, [300, 310, 320, 330]), 450.0)
    assert d.verdict == "bandwidth_bound"
    assert d.evidence["large_busbw_median_gbps"] == pytest.approx(315.0)
    # median 40 GB/s (9 % of 450) with p10..p90 over 1x the median: waiting.
    d = diagnose(_rows(big * 2, [1000] * 8, [5, 10, 20, 30, 50, 80, 150, 200]), 450.0)
    assert d.verdict == "waiting"
    assert d.evidence["large_busbw_median_gbps"] == pytest.approx(40.0)
    # Same figures, narrow spread: mixed, not waiting.
    assert diagnose(_rows(big, [1000] * 4, [40, 40, 40, 40]), 450.0).verdict == "mixed"
    assert diagnose(_rows([], [], []), 450.0) is None


def test_link_peaks():
    assert link_peak("NVIDIA H100 80GB HBM3").gbps == 450.0
    assert link_peak("NVIDIA A100-SXM4-80GB").gbps == 300.0
    assert link_peak("AMD Instinct MI300X").gbps == 448.0
    assert link_peak("Tesla T4") is None
