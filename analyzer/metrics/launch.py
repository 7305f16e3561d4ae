"""Which host op launched each device event.

A device event (kernel, memcpy, memset) is linked to the host call that
enqueued it (``cudaLaunchKernel``, ``hipExtModuleLaunchKernel``,
``cudaMemcpyAsync``, ``cudaGraphLaunch``, ...) by Kineto's correlation id;
the launching op is then the innermost of the chosen host ops that contains
that call's start on the same thread (host ops on one thread nest like a
call stack). This is how TraceLens and HTA tie kernels to ``aten::*`` ops,
and it is the only link that survives multiple streams and asynchronous
launches: time containment of the kernel itself would attribute it to
whatever the host was doing when the GPU got round to it.

Everything here is vectorized per thread; the only Python loop is the
stack walk that finds each host op's parent, over the candidate ops (a few
thousand at most), not over events.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.metrics.memo import per_table
from analyzer.metrics.text import is_in
from analyzer.ingest.tables import DEVICE_KINDS


def _parents(start: np.ndarray, end: np.ndarray) -> np.ndarray:
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


def innermost_containing(ops: pd.DataFrame, q_pid: np.ndarray, q_tid: np.ndarray, q_t: np.ndarray) -> np.ndarray:
    """Row position in ``ops`` of the innermost op containing each query instant on its thread; -1 for none.

    ``ops`` needs ``pid, tid, start_ns, end_ns``; an op contains ``t`` when
    ``start <= t < end``. Partially overlapping ops on one thread (not a
    proper nesting, seen in merged profiler windows) are treated as the stack
    would see them: the later op is the inner one while both are open.
    """
    out = np.full(len(q_t), -1, dtype=np.int64)
    if ops.empty or len(q_t) == 0:
        return out
    o_pid = ops["pid"].to_numpy(np.int64)
    o_tid = ops["tid"].to_numpy(np.int64)
    o_start = ops["start_ns"].to_numpy(np.int64)
    o_end = ops["end_ns"].to_numpy(np.int64)
    q_pid = np.asarray(q_pid, dtype=np.int64)
    q_tid = np.asarray(q_tid, dtype=np.int64)
    q_t = np.asarray(q_t, dtype=np.int64)
    threads = pd.DataFrame({"pid": o_pid, "tid": o_tid}).drop_duplicates().to_numpy()
    for pid, tid in threads:
        rows = np.flatnonzero((o_pid == pid) & (o_tid == tid))
        order = rows[np.lexsort((-o_end[rows], o_start[rows]))]
        start, end = o_start[order], o_end[order]
        parent = _parents(start, end)
        queries = np.flatnonzero((q_pid == pid) & (q_tid == tid))
        if queries.size == 0:
            continue
        t = q_t[queries]
        k = np.searchsorted(start, t, side="right") - 1
        # Walk up the stack while the candidate has already ended; depth is the nesting depth (small).
        while True:
            open_ = k >= 0
            ended = open_ & (end[np.clip(k, 0, None)] <= t)
            if not ended.any():
                break
            k[ended] = parent[k[ended]]
        found = k >= 0
        out[queries[found]] = order[k[found]]
    return out


@per_table  # five metrics of a rank ask for it (analyzer.metrics.memo)
def launches(events: pd.DataFrame) -> pd.DataFrame:
    """Per device event row (by index label), its launch call on the host: ``pid, tid, start_ns``.

    Index: the device rows of ``events`` that have a host event with the same
    correlation id (the first such host event when several carry it).
    """
    device = is_in(events["kind"], DEVICE_KINDS)
    corr = events["correlation"].to_numpy(np.int64)
    # The launch call: a runtime event (cuda_runtime, hip_runtime, old-era "Runtime"), never an annotation.
    host = is_in(events["kind"], ("runtime", "other")) & (corr >= 0)
    launch = events.loc[host, ["correlation", "pid", "tid", "start_ns"]].drop_duplicates("correlation")
    dev = events.loc[device & (corr >= 0), ["correlation"]]
    joined = dev.reset_index().merge(launch, on="correlation", how="inner").set_index("index")
    joined.index.name = None
    return joined[["pid", "tid", "start_ns"]]


def launching_op(events: pd.DataFrame, device_rows: pd.Index, ops: pd.DataFrame) -> np.ndarray:
    """For each device row label in ``device_rows``: the position in ``ops`` of the op that launched it, -1 when none.

    ``ops`` are the candidate host ops (say, matmul-like ``cpu_op`` rows);
    the launch is found by correlation id, then the innermost candidate op
    around the launch call. -1 also when the device event has no launch.
    """
    out = np.full(len(device_rows), -1, dtype=np.int64)
    if len(device_rows) == 0 or ops.empty:
        return out
    link = launches(events)
    pos = link.index.get_indexer(device_rows)
    have = pos >= 0
    if not have.any():
        return out
    sel = link.iloc[pos[have]]
    out[have] = innermost_containing(ops, sel["pid"].to_numpy(), sel["tid"].to_numpy(), sel["start_ns"].to_numpy())
    return out
