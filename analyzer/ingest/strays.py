"""Events whose times lie far outside the rest of their rank's events.

A clock glitch or a corrupt record (one kernel stamped days away from the
others, still a valid number) would stretch the rank's timeline: its
window grows by the gap, and the rank reads as idle for all of it. Such
events are dropped with a warning instead.

"Far": the middle 90 % of the rank's start times span ``W``; an event is
stray when it starts more than ``max(10 W, 60 s)`` before the 5th
percentile start or ends that far after the 95th. A profiler records
continuously over its window, so the window outside the middle 90 % is
about a tenth of ``W`` wide, never ten times it; the 60 s floor keeps a
trace whose events crowd into a short burst (small ``W``) from losing
its legitimately sparse remainder. Percentiles need a few events on each
side: ranks with fewer than 20 events are left alone.
"""

from __future__ import annotations

import numpy as np

MIN_EVENTS = 20
SPAN_FACTOR = 10
FLOOR_NS = 60 * 1_000_000_000


def stray_mask(start_sorted_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray | None:
    """Which events are stray (module docstring), or None when none is.

    ``start_sorted_ns``: start times in ascending order; ``end_ns`` the
    matching ends. O(n): two order statistics of a sorted array and two
    comparisons."""
    n = len(start_sorted_ns)
    if n < MIN_EVENTS:
        return None
    lo = int(start_sorted_ns[(n - 1) // 20])
    hi = int(start_sorted_ns[(n - 1) * 19 // 20])
    far = max(SPAN_FACTOR * (hi - lo), FLOOR_NS)
    # The sorted starts bound the check for early strays without a pass.
    if start_sorted_ns[0] >= lo - far and end_ns.max() <= hi + far:
        return None
    return (start_sorted_ns < lo - far) | (end_ns > hi + far)
