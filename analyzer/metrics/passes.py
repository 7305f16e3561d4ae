"""Which pass a host op ran in: forward, backward, or forward recomputed during backward.

**Backward ranges** are the host events of autograd's backward pass, in
every era of the trace format:

* ``autograd::engine::evaluate_function: MmBackward0`` (PyTorch 1.10 on);
* the autograd node itself, ``MmBackward0`` / ``CheckpointFunctionBackward``
  (today nested in the range above), or ``AddmmBackward`` / ``MmBackward``
  alone on the backward thread (TensorBoard-plugin era, PyTorch 1.8-1.9).

An op is *inside backward* when it starts inside such a range on its own
thread (the backward thread is covered by its nodes' ranges).

**Recompute** (activation checkpointing): an op that records an autograd
node (a ``Sequence number`` and ``Fwd thread id`` 0, which PyTorch writes
on forward ops only; ops of a backward node carry neither) and starts
inside backward is a forward op run during backward. That holds for both of
``torch.utils.checkpoint``'s implementations (checked on torch 2.13 CPU
traces): the reentrant one runs it inside ``CheckpointFunctionBackward``,
the non-reentrant one (the default, and ``checkpoint_wrapper``'s) inside
whichever backward node first unpacks a saved tensor. Ops nested inside a
recompute op (``aten::addmm`` under a recomputed ``aten::linear``) are
recompute too: :func:`recompute_ranges` gives the union of their ranges.

**Stopped recompute**: the non-reentrant implementation stops recomputing
as soon as the last tensor backward needs has been saved again (PyTorch's
default, ``set_checkpoint_early_stop(True)``) by raising out of the op that
saves it. Autograd saves an op's inputs before it computes, so the last
op of a region that saves tensors starts, is recorded with its shapes, and
computes nothing: checked on torch 2.13 CPU traces, where counting it
overstated the hardware FLOPs of a checkpointed GPT by 1.2 % against
FlopCounterMode. :func:`stopped_recompute` gives, per non-reentrant
region (the recompute ops inside one backward range without a
``CheckpointFunctionBackward``), the range of its last outermost recompute
op when that op is one of ``flop_ops``; its FLOPs do not count.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from analyzer.metrics.intervals import union
from analyzer.metrics.text import is_in, text_mask

BACKWARD_PREFIX = "autograd::engine::evaluate_function"
# An autograd node's name: CamelCase ending in Backward and an optional overload number (MmBackward0,
# AddmmBackward, ScaledDotProductFlashAttentionForCpuBackward0, CheckpointFunctionBackward).
_NODE = re.compile(r"^[A-Z][A-Za-z0-9_]*Backward\d*$")
REENTRANT_NODE = "CheckpointFunctionBackward"

Ranges = dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]


def is_backward_range(name: str) -> bool:
    """The event is one of autograd's backward ranges (module docstring)."""
    return name.startswith(BACKWARD_PREFIX) or bool(_NODE.match(name))


def thread_ranges(frame: pd.DataFrame) -> Ranges:
    """Per (pid, tid): the union of the frame's ``[start_ns, end_ns)`` ranges, sorted and disjoint."""
    out: Ranges = {}
    for key, g in frame.groupby(["pid", "tid"], sort=False):
        p, q = np.asarray(key, dtype=np.int64)  # a two-column groupby's keys are (pid, tid) pairs
        out[(int(p), int(q))] = union(g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))
    return out


def inside(ranges: Ranges, pid: np.ndarray, tid: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per instant: inside one of its thread's disjoint ranges."""
    out = np.zeros(len(t), dtype=bool)
    for (p, q), (s, e) in ranges.items():
        rows = np.flatnonzero((pid == p) & (tid == q))
        if rows.size == 0 or s.size == 0:
            continue
        k = np.searchsorted(s, t[rows], side="right") - 1
        ok = k >= 0
        out[rows[ok]] = t[rows[ok]] < e[k[ok]]
    return out


def backward_ranges(events: pd.DataFrame) -> Ranges:
    """The union of the backward ranges (module docstring) per thread."""
    rows = text_mask(events["name"], is_backward_range) & is_in(events["kind"], ("cpu_op", "annotation", "other"))
    return thread_ranges(events.loc[rows, ["pid", "tid", "start_ns", "end_ns"]])


def in_backward(events: pd.DataFrame) -> np.ndarray:
    """Per event: it starts inside a backward range on its thread."""
    ranges = backward_ranges(events)
    if not ranges:
        return np.zeros(len(events), dtype=bool)
    return inside(
        ranges,
        events["pid"].to_numpy(np.int64),
        events["tid"].to_numpy(np.int64),
        events["start_ns"].to_numpy(np.int64),
    )


def recompute_ops(events: pd.DataFrame, backward: np.ndarray) -> np.ndarray:
    """Per event: a forward op run inside backward (module docstring); ``backward`` from :func:`in_backward`."""
    cpu_op = is_in(events["kind"], ("cpu_op",))
    fwd = (events["seq_num"].to_numpy(np.int64) >= 0) & (events["fwd_tid"].to_numpy(np.int64) == 0)
    mask: np.ndarray = cpu_op & fwd & backward & ~text_mask(events["name"], lambda s: s.startswith("autograd::"))
    return mask


def recompute_ranges(events: pd.DataFrame, backward: np.ndarray) -> Ranges:
    """Per thread, the union of the recompute ops' ranges (:func:`recompute_ops`)."""
    rec = recompute_ops(events, backward)
    return thread_ranges(events.loc[rec, ["pid", "tid", "start_ns", "end_ns"]]) if rec.any() else {}


def stopped_recompute(events: pd.DataFrame, backward: np.ndarray, flop_ops: frozenset[str]) -> Ranges:
    """Per thread, the ranges of the recompute ops that early stopping cut off (module docstring)."""
    rec = recompute_ops(events, backward)
    if not rec.any():
        return {}
    bw = backward_ranges(events)
    names = events["name"]
    reentrant = events.loc[text_mask(names, lambda n: n.endswith(REENTRANT_NODE)), ["pid", "tid", "start_ns"]]
    ops = events.loc[rec, ["name", "pid", "tid", "start_ns", "end_ns"]]
    out: Ranges = {}
    for pair, g in ops.groupby(["pid", "tid"], sort=False):
        p, q = np.asarray(pair, dtype=np.int64)  # a two-column groupby's keys are (pid, tid) pairs
        key = (int(p), int(q))
        if key not in bw:
            continue
        s, e = bw[key]
        g = g.sort_values(["start_ns", "end_ns"], ascending=[True, False], kind="stable")
        start, end = g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64)
        # Outermost: not inside an earlier op of the thread (ops nest like a call stack).
        outer = end > np.maximum.accumulate(np.r_[np.iinfo(np.int64).min, end[:-1]])
        region = np.searchsorted(s, start, side="right") - 1
        mine = reentrant.loc[(reentrant["pid"] == p) & (reentrant["tid"] == q), "start_ns"].to_numpy(np.int64)
        reentrant_regions = set((np.searchsorted(s, mine, side="right") - 1).tolist())
        stopped_s, stopped_e = [], []
        for r in np.unique(region[outer]):
            if r < 0 or int(r) in reentrant_regions:
                continue
            last = np.flatnonzero(outer & (region == r))[-1]
            if str(g["name"].iloc[last]) in flop_ops:
                stopped_s.append(start[last])
                stopped_e.append(end[last])
        if stopped_s:
            out[key] = (np.array(stopped_s, dtype=np.int64), np.array(stopped_e, dtype=np.int64))
    return out
