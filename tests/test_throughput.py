"""analyzer.metrics.throughput: tokens per second over steady-state steps, exact answers."""

from __future__ import annotations

import pandas as pd
import pytest

from analyzer.metrics.mfu import mfu_from_manifest
from analyzer.metrics.throughput import throughput

MANIFEST = {
    "tokens_per_step": 2048,
    "warmup_steps": 1,
    "profiled_steps": [3],
    "world_size": 2,
    "flops": {"per_token": 1000, "per_token_hardware": 1000},
    "peak_flops": {"per_s": 1e9, "source": "table", "detail": "x", "dtype": "fp32"},
}


def _metrics():
    rows = []
    # step: (rank0 ms, rank1 ms). Step 0 is warmup, step 3 profiled.
    for step, (a, b) in enumerate([(900, 900), (100, 300), (400, 400), (5000, 5000), (250, 350)]):
        rows.append(dict(step=step, rank=0, step_time_ms=a, profiled=step == 3))
        rows.append(dict(step=step, rank=1, step_time_ms=b, profiled=step == 3))
    return pd.DataFrame(rows)


def test_tokens_per_s_is_the_mean_over_ranks_of_each_ranks_rate_on_steady_steps():
    tp = throughput(MANIFEST, _metrics())
    assert tp.source == "manifest"
    assert tp.steps["step"].tolist() == [1, 2, 4]
    assert tp.steps["step_time_ms"].tolist() == [200.0, 400.0, 300.0]  # mean over ranks
    # Step 1: ranks at 100 and 300 ms -> (20480 + 6826.67) / 2 tokens/s;
    # step 2: 5120; step 4: (2048/0.25 + 2048/0.35) / 2.
    expected = [(20480 + 2048 / 0.3) / 2, 5120.0, (2048 / 0.25 + 2048 / 0.35) / 2]
    assert tp.steps["tokens_per_s"].tolist() == pytest.approx(expected)
    assert tp.median == pytest.approx(sorted(expected)[1])
    # Sustained: rank 0 ran 3 steps in 100 + 400 + 250 ms, rank 1 in 300 + 400 + 350 ms.
    assert tp.overall == pytest.approx((3 * 2048 / 0.75 + 3 * 2048 / 1.05) / 2)


def test_overall_rate_counts_the_slow_steps_the_median_skips():
    """A bursty DataLoader: three steps of 90 ms, then one of 330 ms, on both ranks."""
    rows = [
        dict(step=s, rank=r, step_time_ms=330.0 if s % 4 == 3 else 90.0, profiled=False)
        for s in range(1, 13)
        for r in (0, 1)
    ]
    tp = throughput({"tokens_per_step": 1500, "warmup_steps": 0, "profiled_steps": []}, pd.DataFrame(rows))
    assert tp.median == pytest.approx(1500 / 0.09)
    assert tp.overall == pytest.approx(1500 / 0.15)  # mean step (3 x 90 + 330) / 4 = 150 ms


def test_throughput_is_proportional_to_manifest_mfu_step_by_step():
    tp = throughput(MANIFEST, _metrics())
    mfu = mfu_from_manifest(MANIFEST, _metrics())
    # MFU = tokens/s * flops_per_token / world_size / peak.
    expected = tp.steps["tokens_per_s"] * 1000 / 2 / 1e9
    assert mfu.steps["mfu"].tolist() == pytest.approx(expected.tolist())


@pytest.mark.parametrize(
    "manifest, metrics, reason",
    [
        (None, None, "traces do not record token counts"),
        ({"warmup_steps": 0}, _metrics(), "lacks tokens_per_step"),
        (MANIFEST, None, "no metrics records"),
        ({**MANIFEST, "warmup_steps": 10}, _metrics(), "no steady-state steps"),
    ],
)
def test_no_throughput_says_why(manifest, metrics, reason):
    tp = throughput(manifest, metrics)
    assert tp.source == "none" and tp.median is None
    assert reason in tp.reason
