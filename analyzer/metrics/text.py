"""Row masks over text columns, evaluated once per distinct value.

Event names and categories are categoricals (analyzer/ingest/tables.py): a trace
of 100k events has a few thousand distinct names. Converting the column to
Python strings row by row (``.astype(str)``) costs about a second per
100k rows under pandas 3; testing each distinct value once and indexing by
the categorical codes costs microseconds.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import pandas as pd


def text_codes(column: pd.Series) -> np.ndarray:
    """Per row an integer (int64) that is equal exactly where the text is, -1 where missing: the
    categorical's codes, else a factorization (for grouping rows by text without the strings)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy().astype(np.int64)
    codes, _ = pd.factorize(column)
    return codes.astype(np.int64)


def _codes_values(column: pd.Series) -> tuple[np.ndarray, list[object]]:
    """Per-row codes (-1: missing) and the distinct values as Python objects."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy(), column.cat.categories.tolist()
    codes, values = pd.factorize(column)
    return codes, list(values)


def _per_value(
    codes: np.ndarray,
    values: list[object],
    fn: Callable[[str], object],
    dtype: type,
    missing: object,
    sparse: bool = False,
) -> np.ndarray:
    """``fn`` per row, evaluated once per distinct value, with ``missing``
    where the code is -1. A selection of a few rows from a column with
    thousands of names (the communication kernels, say) only evaluates the
    names it uses."""
    table: np.ndarray = np.full(len(values) + 1, missing, dtype=dtype)
    # A whole column uses (nearly) all its values: evaluate them all rather than
    # find the ones in use (counting 400k codes 280 times cost 0.13 s on 8 ranks).
    # `sparse`: a costly ``fn`` over a selection that uses few of the column's
    # values (the device rows' names among all names): find them by counting.
    used: Iterable[int]
    if sparse:
        used = np.flatnonzero(np.bincount(codes[codes >= 0], minlength=len(values)))
    else:
        used = np.unique(codes[codes >= 0]) if len(codes) < len(values) else range(len(values))
    for i in used:
        table[i] = fn(str(values[i]))
    # A missing value's code is -1, which indexes the table's last entry: ``missing``.
    per_row: np.ndarray = table[codes]
    return per_row


def text_mask(column: pd.Series, keep: Callable[[str], bool]) -> np.ndarray:
    """Boolean per row: ``keep(value)``; missing values are False."""
    codes, values = _codes_values(column)
    return _per_value(codes, values, keep, bool, False)


def is_in(column: pd.Series, names: Iterable[str]) -> np.ndarray:
    """Boolean per row: the value is one of ``names``."""
    wanted = frozenset(names)
    return text_mask(column, wanted.__contains__)


def text_map(
    column: pd.Series, fn: Callable[[str], object], missing: object = None, *, sparse: bool = False
) -> np.ndarray:
    """``fn(value)`` per row as an object array, computed once per distinct value
    (only the values the rows use when ``sparse``)."""
    codes, values = _codes_values(column)
    return _per_value(codes, values, fn, object, missing, sparse)
