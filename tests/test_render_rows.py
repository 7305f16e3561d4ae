"""analyzer.render.rows: typed rows read from a table's columns, the values itertuples() gave."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analyzer.render.rows import AnnotationRow, MemoryRankRow, table_rows


def _annotations() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "name": ["fwd", "bwd", "opt"],
            "extra": [1, 2, 3],  # a column no field names: not read
            "calls": [4, 2, 8],
            "device_ms": [1.5, 0.25, float("nan")],
            "host_ms": [2.0, 1.0, 0.5],
            "gpu_calls": [0, 3, 0],
            "gpu_ms": [0.0, 0.75, 0.0],
        },
        index=[10, 7, 3],  # not 0..n: rows come in table order whatever the index
    )


def test_fields_come_from_the_columns_of_their_names_in_row_order() -> None:
    rows = table_rows(_annotations(), AnnotationRow)
    assert [r.name for r in rows] == ["fwd", "bwd", "opt"]
    assert rows[1] == AnnotationRow(name="bwd", calls=2, device_ms=0.25, host_ms=1.0, gpu_calls=3, gpu_ms=0.75)
    assert math.isnan(rows[2].device_ms)  # NaN stays a float: the formatters draw it as missing


def test_cells_are_the_python_scalars_itertuples_gives() -> None:
    frame = _annotations()
    for row, tup in zip(table_rows(frame, AnnotationRow), frame.itertuples(index=False)):
        for field in ("name", "calls", "host_ms", "gpu_calls", "gpu_ms"):
            mine, theirs = getattr(row, field), getattr(tup, field)
            assert (mine, type(mine)) == (theirs, type(theirs))


def test_none_in_an_object_column_stays_none() -> None:
    frame = pd.DataFrame(
        {
            "rank": [0, 1],
            "peak_allocated_bytes": [2.0**20, 3.0 * 2**20],
            "peak_allocated_step": pd.Series([5, None], dtype=object),
            "peak_reserved_bytes": [None, None],
            "peak_reserved_step": [None, None],
            "n_steps": [9, 9],
        }
    )
    rows = table_rows(frame, MemoryRankRow)
    assert [(r.rank, r.peak_allocated_step, r.peak_reserved_bytes) for r in rows] == [(0, 5, None), (1, None, None)]


def test_an_empty_table_has_no_rows_and_a_missing_column_is_named() -> None:
    assert table_rows(_annotations().iloc[:0], AnnotationRow) == []
    with pytest.raises(KeyError, match="gpu_ms"):
        table_rows(_annotations().drop(columns="gpu_ms"), AnnotationRow)
