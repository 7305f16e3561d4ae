"""One computation per events table: memoize a pure function of a rank's table on that table's identity.

Several metrics of one rank need the same derived table (the launch call
of every device event, the collective kind of every communication kernel):
the breakdown, the overlap window, FLOPs from shapes, the attribution, the
collective table and the straggler arrivals each asked for it again, five
times per rank for the launches (docs/loading.md, "Rank summaries": about
0.1 s per rank of df_index_resolver's size). The metrics stay pure
functions of the table; :func:`per_table` only remembers the answer for as
long as that same table object lives.

The key is the table's identity, checked through a weak reference (an id
can be reused once a table is freed; the entry goes with the table), so a
different table, even an equal one, is computed afresh. Tables are not
modified in place after they are built (analyzer.ingest.load), which is
what makes the identity a sound key; callers must not modify the cached
result either (none does: they index, reindex and read it).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, TypeVar

import pandas as pd

T = TypeVar("T")


def per_table(fn: Callable[[pd.DataFrame], T]) -> Callable[[pd.DataFrame], T]:
    """``fn(events)`` computed once per live ``events`` object."""
    memo: dict[int, tuple[weakref.ref[Any], T]] = {}

    def forgetter(key: int) -> Callable[[weakref.ref[Any]], None]:
        def forget(_ref: weakref.ref[Any]) -> None:
            memo.pop(key, None)  # the table is gone: so is its entry

        return forget

    @functools.wraps(fn)
    def cached(events: pd.DataFrame) -> T:
        key = id(events)
        hit = memo.get(key)
        if hit is not None and hit[0]() is events:
            return hit[1]
        value = fn(events)
        memo[key] = (weakref.ref(events, forgetter(key)), value)
        return value

    cached.cache_size = lambda: len(memo)  # type: ignore[attr-defined]  # for tests
    return cached
