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

Everything here is vectorized (the nesting of host ops: analyzer.metrics.nesting).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.metrics.memo import per_table
from analyzer.metrics.nesting import innermost, nest, thread_keys
from analyzer.metrics.text import is_in
from analyzer.ingest.tables import DEVICE_KINDS


def innermost_containing(ops: pd.DataFrame, q_pid: np.ndarray, q_tid: np.ndarray, q_t: np.ndarray) -> np.ndarray:
    """Row position in ``ops`` of the innermost op containing each query instant on its thread; -1 for none.

    ``ops`` needs ``pid, tid, start_ns, end_ns``; an op contains ``t`` when
    ``start <= t < end``. Partially overlapping ops on one thread (not a
    proper nesting, seen in merged profiler windows) are treated as the stack
    would see them: the later op is the inner one while both are open
    (analyzer.metrics.nesting).
    """
    out = np.full(len(q_t), -1, dtype=np.int64)
    if ops.empty or len(q_t) == 0:
        return out
    n = len(ops)
    # One thread key over the ops' and the queries' (pid, tid) pairs together.
    key = thread_keys(
        np.concatenate([ops["pid"].to_numpy(np.int64), np.asarray(q_pid, dtype=np.int64)]),
        np.concatenate([ops["tid"].to_numpy(np.int64), np.asarray(q_tid, dtype=np.int64)]),
    )
    start, end = ops["start_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64)
    order, parent, _ = nest(key[:n], start, end)
    return innermost(key[:n], start, end, order, parent, key[n:], np.asarray(q_t, dtype=np.int64))


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
