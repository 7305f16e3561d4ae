"""Interval-union arithmetic on one rank's timeline, vectorized with numpy.

Every breakdown and overlap figure in :mod:`analyzer.metrics` is built from
three steps, none of which loops over events in Python:

1. :func:`union` merges the intervals of one *layer* (say, all compute
   kernels on all streams) into sorted, disjoint ``[start, end)`` intervals
   (sort by start, running maximum of the ends, a new interval wherever a
   start lies beyond every earlier end; touching intervals merge, as in
   HTA's ``merge_kernel_intervals``).
2. :func:`sweep` lays several merged layers on one axis. Layer ``i``
   contributes ``+2**i`` at each start and ``-2**i`` at each end; because a
   merged layer never has two of its own boundaries at one instant, the
   cumulative sum is, between consecutive boundaries, exactly the bitmask
   of the layers active there. The result is a partition of the covered
   span into elementary segments, each with one mask.
3. :meth:`Timeline.length_in` sums the lengths of the segments whose mask
   satisfies a predicate, clipped to any number of windows at once, through
   a cumulative-length array and ``searchsorted``.

All times are integer nanoseconds (int64), so sums are exact and parts that
partition a window add up to it to the nanosecond.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]


def union(start_ns: np.ndarray, end_ns: np.ndarray) -> Intervals:
    """Union of half-open intervals as sorted, disjoint ``(start, end)`` arrays.

    Empty or negative-length intervals are dropped; touching ones merge.
    """
    start = np.asarray(start_ns, dtype=np.int64)
    end = np.asarray(end_ns, dtype=np.int64)
    keep = end > start
    start, end = start[keep], end[keep]
    if start.size == 0:
        return start, end
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    run_end = np.maximum.accumulate(end)
    new = np.empty(start.size, dtype=bool)
    new[0] = True
    new[1:] = start[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, start.size - 1)
    return start[first], run_end[last]


def total_ns(intervals: Intervals) -> int:
    """Total length of disjoint intervals."""
    start, end = intervals
    return int((end - start).sum())


@dataclass(frozen=True)
class Timeline:
    """Elementary segments ``[seg_start_ns[i], seg_end_ns[i])`` with a layer bitmask.

    Segments are contiguous from the first boundary to the last (gaps where
    no layer is active are segments with mask 0).
    """

    seg_start_ns: np.ndarray
    seg_end_ns: np.ndarray
    mask: np.ndarray

    def length_in(self, select: np.ndarray, win_start_ns: np.ndarray, win_end_ns: np.ndarray) -> np.ndarray:
        """Length (ns) of the selected segments inside each window.

        ``select`` is a boolean per segment (for example ``(mask & 1) > 0``);
        windows are ``[win_start, win_end)`` and may extend beyond the
        timeline. Returns one int64 per window.
        """
        win_start = np.asarray(win_start_ns, dtype=np.int64)
        win_end = np.asarray(win_end_ns, dtype=np.int64)
        if self.seg_start_ns.size == 0:
            return np.zeros(win_start.shape, dtype=np.int64)
        covered: np.ndarray = self._covered_before(select, win_end) - self._covered_before(select, win_start)
        return covered

    def _covered_before(self, select: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Selected length in ``(-inf, t)`` for each ``t``."""
        seg_len = np.where(select, self.seg_end_ns - self.seg_start_ns, 0)
        cum = np.concatenate(([0], np.cumsum(seg_len)))
        k = np.searchsorted(self.seg_start_ns, t, side="right") - 1
        inside = k >= 0
        kk = np.where(inside, k, 0)
        partial = np.clip(t - self.seg_start_ns[kk], 0, seg_len[kk])
        return np.where(inside, cum[kk] + partial, 0)

    def total(self, select: np.ndarray) -> int:
        """Selected length over the whole timeline."""
        return int(np.where(select, self.seg_end_ns - self.seg_start_ns, 0).sum())


def sweep(layers: Sequence[Intervals]) -> Timeline:
    """Overlay merged layers (each from :func:`union`); layer ``i`` is bit ``2**i``."""
    if len(layers) > 62:
        raise ValueError("at most 62 layers fit an int64 mask")
    times = [np.asarray(s, dtype=np.int64) for s, _ in layers] + [np.asarray(e, dtype=np.int64) for _, e in layers]
    deltas = [np.full(len(s), 1 << i, dtype=np.int64) for i, (s, _) in enumerate(layers)]
    deltas += [np.full(len(e), -(1 << i), dtype=np.int64) for i, (_, e) in enumerate(layers)]
    t = np.concatenate(times) if times else np.empty(0, dtype=np.int64)
    if t.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return Timeline(empty, empty, empty)
    d = np.concatenate(deltas)
    order = np.argsort(t, kind="stable")
    t, d = t[order], d[order]
    mask = np.cumsum(d)
    seg_start, seg_end, seg_mask = t[:-1], t[1:], mask[:-1]
    # Ties between layers create zero-length segments (with a transient
    # mask); they carry no time, so drop them.
    keep = seg_end > seg_start
    return Timeline(seg_start[keep], seg_end[keep], seg_mask[keep])
