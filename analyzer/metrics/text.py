"""Row masks over text columns, evaluated once per distinct value.

Event names and categories are categoricals (analyzer/tables.py): a trace
of 100k events has a few thousand distinct names. Converting the column to
Python strings row by row (``.astype(str)``) costs about a second per
100k rows under pandas 3; testing each distinct value once and indexing by
the categorical codes costs microseconds.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd


def text_mask(column: pd.Series, keep: Callable[[str], bool]) -> np.ndarray:
    """Boolean per row: ``keep(value)``; missing values are False."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes = column.cat.codes.to_numpy()
        values = column.cat.categories
    else:
        codes, values = pd.factorize(column)
    table = np.fromiter((keep(str(v)) for v in values), dtype=bool, count=len(values))
    if table.size == 0:
        return np.zeros(len(column), dtype=bool)
    return np.where(codes >= 0, table[np.clip(codes, 0, None)], False)


def is_in(column: pd.Series, names) -> np.ndarray:
    """Boolean per row: the value is one of ``names``."""
    wanted = frozenset(names)
    return text_mask(column, wanted.__contains__)


def text_map(column: pd.Series, fn: Callable[[str], object], missing: object = None) -> np.ndarray:
    """``fn(value)`` per row as an object array, computed once per distinct value."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes = column.cat.codes.to_numpy()
        values = column.cat.categories
    else:
        codes, values = pd.factorize(column)
    table = np.empty(len(values) + 1, dtype=object)
    table[:-1] = [fn(str(v)) for v in values]
    table[-1] = missing
    return table[np.where(codes >= 0, codes, len(values))]
