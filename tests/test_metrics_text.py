"""analyzer.metrics.text: per-row results of a function evaluated once per distinct value."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from analyzer.metrics.text import is_in, text_map, text_mask


def _names() -> pd.Series:
    values = ["ncclKernel_AllReduce", None, "aten::mm", "ncclKernel_AllReduce", "c10d::broadcast_", "aten::mm"]
    return pd.Series(values, dtype="category")


def test_mask_and_map_equal_a_row_by_row_evaluation_with_missing_values() -> None:
    col = _names()
    assert text_mask(col, lambda n: n.startswith("nccl")).tolist() == [True, False, False, True, False, False]
    assert is_in(col, {"aten::mm", "other"}).tolist() == [False, False, True, False, False, True]
    assert text_map(col, len, missing=-1).tolist() == [20, -1, 8, 20, 16, 8]
    # Plain (non-categorical) text columns give the same answers.
    plain = col.astype(object)
    assert text_map(plain, len, missing=-1).tolist() == [20, -1, 8, 20, 16, 8]


def test_a_selection_evaluates_only_the_names_it_uses() -> None:
    """A few rows picked from a column with many names (communication kernels
    among every kernel name, say) call the function once per name they use."""
    names = [f"kernel_{i}" for i in range(500)]
    col = pd.Series(pd.Categorical(names * 2, categories=names))
    seen: list[str] = []

    def kind(name: str) -> str:
        seen.append(name)
        return name.upper()

    rows = col.iloc[[7, 507, 42]]
    assert text_map(rows, kind).tolist() == ["KERNEL_7", "KERNEL_7", "KERNEL_42"]
    assert sorted(seen) == ["kernel_42", "kernel_7"]
    seen.clear()
    full = text_map(col, kind)
    assert len(seen) == 500 and full[999] == "KERNEL_499"
    assert text_mask(col.iloc[[3]], lambda n: n.endswith("3")).dtype == np.bool_
