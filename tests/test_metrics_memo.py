"""analyzer.metrics.memo.per_table: one computation per live table, never an answer for another table."""

from __future__ import annotations

import gc

import pandas as pd

from analyzer.metrics.memo import per_table


def test_computed_once_per_table_and_forgotten_with_it() -> None:
    calls: list[int] = []

    @per_table
    def total(events: pd.DataFrame) -> int:
        calls.append(1)
        return int(events["x"].sum())

    a = pd.DataFrame({"x": [1, 2, 3]})
    assert total(a) == 6 and total(a) == 6 and len(calls) == 1
    b = pd.DataFrame({"x": [1, 2, 3]})  # equal, but another table: computed afresh
    assert total(b) == 6 and len(calls) == 2
    assert total.cache_size() == 2
    del a, b
    gc.collect()
    assert total.cache_size() == 0  # entries leave with their tables
    c = pd.DataFrame({"x": [10]})  # may reuse a freed id: must not see the old answer
    assert total(c) == 10 and len(calls) == 3


def test_the_metrics_that_share_launches_get_the_same_answer_as_uncached() -> None:
    from analyzer.metrics.launch import launches

    uncached = launches.__wrapped__  # functools.wraps keeps the pure function
    events = pd.DataFrame(
        {
            "kind": ["runtime", "compute", "runtime", "compute", "compute"],
            "correlation": [7, 7, 9, 9, -1],
            "pid": [1, 0, 1, 0, 0],
            "tid": [5, 7, 5, 7, 7],
            "start_ns": [100, 150, 300, 320, 400],
        }
    )
    first = launches(events)
    assert launches(events) is first  # the second caller gets the same table
    pd.testing.assert_frame_equal(first, uncached(events))
    assert first.index.tolist() == [1, 3] and first["start_ns"].tolist() == [100, 300]
