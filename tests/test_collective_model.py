"""The collectives' timing model (analyzer/metrics/collective_model.py; docs/metrics.md, "Collective timing
model") on synthesized matched-collective tables whose answers are worked out by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzer.metrics.collective_model import (
    collective_tail_ms,
    collective_times,
    fit_alpha_beta,
    service_times_ms,
    sync_delay_ms,
)

MS = 1_000_000
EPOCH_NS = 1_765_000_000_000_000_000  # an epoch timestamp: float64 cannot hold it to the nanosecond


def matched(rows: list[tuple[int, str, int, float, float, float, int]]) -> pd.DataFrame:
    """A matched collective table: (step, kind, bytes, first arrival ms after EPOCH_NS, skew ms, duration ms, last_rank)."""
    step, kind, nbytes, first, skew, dur, last = zip(*rows)
    return pd.DataFrame(
        {
            "step": step,
            "kind": pd.Categorical(kind),
            "bytes": nbytes,
            "first_arrival_ns": [EPOCH_NS + int(f * MS) for f in first],
            "skew_ms": skew,
            "duration_ms": dur,
            "last_rank": last,
        }
    )


def test_times_are_on_the_last_arriver_relative_to_the_first_arrival_and_sorted():
    t = collective_times(
        matched(
            [
                (0, "all_reduce", 100, 7.0, 0.0, 1.0, -1),
                (0, "all_gather", 200, 0.0, 2.5, 3.0, 1),  # the last arriver starts 2.5 ms after the first arrival
            ]
        )
    )
    assert t["kind"].tolist() == ["all_gather", "all_reduce"]  # sorted by start
    # The 1 ns steps survive: times are relative to the first arrival, not epoch ns in float64.
    assert t["start_ns"].tolist() == [2.5 * MS, 7.0 * MS] and t["end_ns"].tolist() == [5.5 * MS, 8.0 * MS]
    assert t["bytes"].tolist() == [200.0, 100.0] and t["step"].tolist() == [0, 0]
    one_ns = collective_times(matched([(0, "x", 1, 0.0, 0.0, 1.0, -1), (0, "x", 1, 0.000001, 0.0, 1.0, -1)]))
    assert one_ns["start_ns"].tolist() == [0.0, 1.0]


def test_service_times_remove_queueing_and_the_tail_is_after_the_last_issue():
    times = pd.DataFrame(
        {
            "step": [0, 0, 0, 1],
            "start_ns": [10 * MS, 20 * MS, 30 * MS, 100 * MS],
            "end_ns": [25 * MS, 40 * MS, 60 * MS, 104 * MS],
        }
    )
    # The 2nd starts at 20 but the 1st runs until 25: 15 ms; the 3rd waits until 40: 20 ms; step 1 alone: 4 ms.
    assert service_times_ms(times).tolist() == pytest.approx([15.0, 15.0, 20.0, 4.0])
    # Step 0: last issue at 30, last end at 60; step 1: 104 - 100.
    assert collective_tail_ms(times).to_dict() == pytest.approx({0: 30.0, 1: 4.0})
    # A collective wholly inside an earlier one's run has no service time of its own (clipped at 0).
    nested = pd.DataFrame({"step": [0, 0], "start_ns": [0.0, 1 * MS], "end_ns": [10 * MS, 5 * MS]})
    assert service_times_ms(nested).tolist() == [10.0, 0.0]
    assert collective_tail_ms(nested).tolist() == [9.0]  # the last end (10), not the last-issued one's (5), minus 1


def test_alpha_beta_fit_exact_through_the_origin_and_all_fixed():
    b = np.array([1e6, 2e6, 4e6])
    alpha, per_byte = fit_alpha_beta(b, 3.0 + b * 2e-6)
    assert alpha == pytest.approx(3.0) and per_byte == pytest.approx(2e-6)
    # A negative intercept: no measurable fixed cost, the fit through the origin sum(xy)/sum(x^2).
    y = np.array([1.0, 3.0, 7.0])
    assert fit_alpha_beta(b, y) == pytest.approx((0.0, float((b * y).sum() / (b * b).sum())))
    # Larger messages no slower: all fixed cost, the median service time.
    assert fit_alpha_beta(b, np.array([5.0, 4.0, 3.0])) == (4.0, 0.0)
    # One size (or non-finite pairs dropped down to one) cannot separate the two costs.
    assert fit_alpha_beta(np.array([1e6, 1e6]), np.array([1.0, 2.0])) == (None, None)
    assert fit_alpha_beta(np.array([1e6, np.nan, 2e6]), np.array([1.0, 2.0, np.inf])) == (None, None)


def test_sync_delay_is_the_median_over_steps_of_the_largest_skew_the_rank_caused():
    table = matched(
        [
            (0, "all_reduce", 1, 0.0, 4.0, 1.0, 1),
            (0, "all_reduce", 1, 10.0, 6.0, 1.0, 1),  # step 0: rank 1, max 6
            (1, "all_reduce", 1, 20.0, 2.0, 1.0, 1),
            (1, "all_reduce", 1, 30.0, 3.0, 1.0, 0),  # step 1: rank 1 2, rank 0 3
            (2, "all_reduce", 1, 40.0, 0.0, 1.0, -1),  # step 2: all at once
        ]
    )
    # Rank 1: [6, 2, 0] -> 2; rank 0: [0, 3, 0] -> 0.
    assert sync_delay_ms(table) == {0: 0.0, 1: 2.0}
    assert sync_delay_ms(table.iloc[:0]) == {}
