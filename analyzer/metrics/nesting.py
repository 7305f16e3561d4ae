"""Host ranges that nest like a call stack, per thread: parents, depths and the innermost range at an instant.

The ops of one thread (``cpu_op``, ``python_function`` and ``user_annotation``
ranges alike) nest: a range's parent is the innermost range of the same
thread open at its start (``start_p <= start < end_p``; a zero-length range
has no children). The kernels' attribution (:mod:`analyzer.metrics.attribution`),
the launch links (:mod:`analyzer.metrics.launch`) and the FLOP counter's
matmul ops (:mod:`analyzer.metrics.matmul_flops`) all need it; it is
vectorized with sorted arrays (:func:`nest`), and only a thread whose ranges
overlap without nesting falls back to the stack walk (:func:`stack_parents`),
whose rule (the later range is the inner one while both are open) the
vectorized path matches on properly nested ranges.

Pure functions over numpy arrays; positions index the caller's arrays.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def thread_keys(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """One integer per (pid, tid) pair, equal exactly where both are: the ``tkey`` of :func:`nest`."""
    pc, _ = pd.factorize(np.asarray(pid, dtype=np.int64))
    tc, tids = pd.factorize(np.asarray(tid, dtype=np.int64))
    key: np.ndarray = pc.astype(np.int64) * (len(tids) + 1) + tc
    return key


def stack_parents(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Parent index of each op of one thread, ops sorted by (start, longest first); -1 at the top."""
    parent = np.full(len(start), -1, dtype=np.int64)
    stack: list[int] = []
    for i in range(len(start)):
        s = start[i]
        while stack and end[stack[-1]] <= s:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def nest(tkey: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Order, parent and depth of host ranges that nest per thread.

    ``tkey`` identifies the thread (int), ``start``/``end`` in ns. Returns
    ``order`` (positions sorted by thread, start, longest first), and
    ``parent`` and ``depth`` indexed like the *inputs* (parent -1 at the top).
    A range's parent is the innermost range of the same thread that is open
    at its start (``start_p <= start < end_p``; a zero-length range has no
    children). Vectorized: depth is the number of ranges open at a start,
    the parent the last range before it one level up; a thread whose ranges
    overlap without nesting is walked with a stack instead (the later range
    is then the inner one while both are open).
    """
    n = len(start)
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    order = np.lexsort((-end, start, tkey))
    if n == 0:
        return order, parent, depth
    tk = tkey[order]
    bounds = np.flatnonzero(np.diff(tk)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, n]):
        rows = order[lo:hi]
        s, e = start[rows], end[rows]
        p, d = _nest_sorted(s, e)
        parent[rows] = np.where(p >= 0, rows[np.clip(p, 0, None)], -1)
        depth[rows] = d
    return order, parent, depth


def _nest_sorted(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parent (local positions) and depth of one thread's ranges, sorted by (start, -end)."""
    m = len(s)
    pos = e > s
    # Ranges open at s_i: earlier ranges (positive length) not yet ended. Zero-length ranges never contain a start.
    ends = np.sort(e[pos])
    starts_pos = np.flatnonzero(pos)
    n_started = np.searchsorted(starts_pos, np.arange(m), side="left")  # positive ranges before i in order
    n_ended = np.searchsorted(ends, s, side="right")
    d = n_started - n_ended
    parent = np.full(m, -1, dtype=np.int64)
    has = np.flatnonzero(d > 0)
    proper = True
    if len(has):
        # The parent: the last positive-length range before i one level up (keys sort by depth, then position).
        sorted_keys = np.sort(d[pos] * (m + 1) + starts_pos)
        k = np.searchsorted(sorted_keys, (d[has] - 1) * (m + 1) + has, side="left") - 1
        cand = sorted_keys[np.clip(k, 0, None)]
        ok = (k >= 0) & (cand // (m + 1) == d[has] - 1)
        par = cand % (m + 1)
        # Proper nesting: the parent is open at the child's start and ends no earlier than the child.
        proper = bool(ok.all()) and bool(np.all((e[par] > s[has]) & (e[par] >= e[has])))
        parent[has] = np.where(ok, par, -1)
    if not proper:
        # Overlapping, not nested: the stack walk of analyzer.metrics.launch (its pop rule: end <= start).
        parent = stack_parents(s, e)
        d = np.zeros(m, dtype=np.int64)
        for i in range(m):
            if parent[i] >= 0:
                d[i] = d[parent[i]] + 1
    return parent, d


def innermost(
    tkey: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    order: np.ndarray,
    parent: np.ndarray,
    q_tkey: np.ndarray,
    q_t: np.ndarray,
) -> np.ndarray:
    """Position of the innermost range (of :func:`nest`'s inputs) open at each query instant on its thread; -1 for none."""
    out = np.full(len(q_t), -1, dtype=np.int64)
    if len(order) == 0 or len(q_t) == 0:
        return out
    tk, st = tkey[order], start[order]
    # Sorted by (thread, start): one searchsorted over a combined key finds the last range started at or before t.
    lo = np.searchsorted(tk, q_tkey, side="left")
    hi = np.searchsorted(tk, q_tkey, side="right")
    k = np.full(len(q_t), -1, dtype=np.int64)
    have = hi > lo
    if not have.any():
        return out
    # Within a thread's block [lo, hi) the starts are sorted: one searchsorted per thread.
    for t_val in np.unique(q_tkey[have]):
        qi = np.flatnonzero(have & (q_tkey == t_val))
        a, b = lo[qi[0]], hi[qi[0]]
        k[qi] = a + np.searchsorted(st[a:b], q_t[qi], side="right") - 1
        k[qi[k[qi] < a]] = -1
    cur = np.where(k >= 0, order[np.clip(k, 0, None)], -1)
    # Walk up while the candidate has ended (nesting depth iterations at most).
    while True:
        open_ = cur >= 0
        ended = open_ & (end[np.clip(cur, 0, None)] <= q_t)
        if not ended.any():
            break
        cur[ended] = parent[cur[ended]]
    return cur


def climb_same_name(parent: np.ndarray, key: np.ndarray) -> np.ndarray:
    """True where some enclosing range has the same key (the range is nested in its own kind)."""
    nested = np.zeros(len(parent), dtype=bool)
    anc = parent.copy()
    live = anc >= 0
    while live.any():
        idx = np.flatnonzero(live)
        nested[idx] |= key[anc[idx]] == key[idx]
        anc[idx] = parent[anc[idx]]
        live = anc >= 0
    return nested


def nearest(parent: np.ndarray, flag: np.ndarray) -> np.ndarray:
    """Nearest ancestor-or-self with ``flag`` (position), -1 for none: pointer jumping, log(depth) rounds."""
    nxt = np.where(flag, np.arange(len(flag)), parent)
    done = flag | (nxt < 0)
    while not done.all():
        idx = np.flatnonzero(~done)
        nxt[idx] = nxt[nxt[idx]]
        done[idx] = (nxt[idx] < 0) | flag[np.clip(nxt[idx], 0, None)]
    return nxt


def subtree_sum(parent: np.ndarray, depth: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Sum of ``own`` over each range and every range nested in it (deepest level first)."""
    total = own.astype(np.float64).copy()
    if len(total) == 0:
        return total
    for level in range(int(depth.max()), 0, -1):
        idx = np.flatnonzero((depth == level) & (parent >= 0))
        np.add.at(total, parent[idx], total[idx])
    return total


def below_flagged(parent: np.ndarray, flag: np.ndarray) -> np.ndarray:
    """Per range: some enclosing range (a strict ancestor) has ``flag``."""
    if not len(parent):
        return np.zeros(0, dtype=bool)
    near = nearest(parent, flag)  # the nearest flagged ancestor-or-self
    below: np.ndarray = np.where(parent >= 0, near[np.clip(parent, 0, None)], -1) >= 0
    return below
