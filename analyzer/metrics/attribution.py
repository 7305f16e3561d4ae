"""Where device time goes: each kernel attributed to its op, op stack, nn.Module and user annotation.

The chain (docs/metrics.md, "Attribution"), for every device event (kernel,
memcpy, memset) in the rank's analysis window (the kernels table's,
:func:`analyzer.metrics.overlap.hta_window`):

1. **launch**: the host runtime call with the same correlation id
   (``cudaLaunchKernel``, ``hipLaunchKernel``, ``cudaMemcpyAsync``, ...;
   :func:`analyzer.metrics.launch.launches`). Every kernel of a CUDA-graph
   replay carries the correlation id of its ``cudaGraphLaunch``: such kernels
   are attributed to the graph launch (``graph`` True): the launch call is
   their op (``cudaGraphLaunch``, the ops around it its stack), since the
   ops that captured the graph ran long before; when capture traces sit
   beside the trace, the loader links them to the captured ops instead
   (:mod:`analyzer.ingest.graph_capture`), and they stay ``graph``.
2. **op**: the innermost host op (``cpu_op``/``cpu_comm``) containing the
   launch call's start *on the launch call's own thread* (kernels launched
   from other threads, e.g. the autograd engine's, are found on theirs);
   the op stack above it is the chain of enclosing ops.
3. **backward**: an op is backward when it or an enclosing op is an autograd
   node, i.e. carries a ``Sequence number`` with a non-zero ``Fwd thread
   id`` (PyTorch writes ``Fwd thread id`` 0 on forward ops), or is named
   ``autograd::engine::evaluate_function: ...``. A backward kernel is
   attributed to the *forward* op of its node: the forward ops
   (``Fwd thread id`` 0) carrying the node's sequence number, the last one
   started before the node and the enclosing ops sharing that number, the
   outermost of them (the call that created the node: ``aten::linear``
   around ``aten::t`` for ``TBackward0``, a custom ``autograd.Function``
   around the ops inside it); when none is in the trace, the node's own
   name without ``autograd::engine::evaluate_function: ``. A forward op
   run inside a node (``Fwd thread id`` 0: recomputed by activation
   checkpointing, :mod:`analyzer.metrics.passes`) and the ops under it are
   not backward: their kernels count to that op, reported as
   ``NAME (recompute)`` with its own shapes.
4. **module**: the innermost ``nn.Module: NAME`` range (``python_function``
   from ``with_stack``/``with_modules``, or a ``record_function`` range so
   named, as reftrain writes) containing the launch (backward: containing
   the forward op's start); its path is the chain of enclosing module
   ranges, names without the ``nn.Module: `` prefix, joined by ``/``.
5. **annotation**: the innermost ``user_annotation`` range (other than
   ``ProfilerStep#N``) containing the launch.

A device event with no launch call, or whose launch has no enclosing op,
is *unattributed* (it still has its module and annotation when a range
contains its launch). Attributed + unattributed = all device time in the
window, exactly (tests/test_metrics_attribution.py).

Everything is vectorized: the host ranges of one thread nest like a call
stack (analyzer.metrics.nesting).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analyzer.metrics.frames import empty_frame
from analyzer.ingest.tables import ATTENTION_OPS, DEVICE_KINDS
from analyzer.ingest.graph_capture import GRAPH_LAUNCHES, SPLICED_TID
from analyzer.metrics.nesting import climb_same_name, innermost, nearest, nest, subtree_sum
from analyzer.metrics.overlap import hta_window
from analyzer.metrics.taxonomy import row_classes
from analyzer.metrics.text import is_in, text_codes, text_mask

SCHEMA = "analyzer.attribution/1"
MODULE_PREFIX = "nn.Module: "
EVALUATE_PREFIX = "autograd::engine::evaluate_function: "
TOP_KERNELS_PER_OP = 5
UNATTRIBUTED = "(unattributed)"
RECOMPUTE_SUFFIX = " (recompute)"
# The convolution op every conv path dispatches through (aten::conv2d -> aten::convolution -> aten::_convolution
# -> the backend's op).
CONV_ENTRY = "aten::convolution"

KERNEL_COLUMNS = (
    "name",
    "kind",
    "cls",
    "stream",
    "start_ns",
    "dur_ns",
    "launch_tid",
    "graph",
    "op",
    "backward",
    "attributed_op",
    "module",
    "annotation",
    "shape_op",
    "input_dims",
    "input_types",
    "concrete_inputs",
)


# ---------------------------------------------------------------------------
# The per-kernel attribution


@dataclass
class _Host:
    """Host ranges of one rank as arrays, with their nesting (positions index these arrays)."""

    rows: np.ndarray  # positions in the events table
    names: np.ndarray  # object
    tkey: np.ndarray
    start: np.ndarray
    end: np.ndarray
    order: np.ndarray
    parent: np.ndarray
    depth: np.ndarray

    @classmethod
    def of(cls, ev: "_Events", mask: np.ndarray) -> _Host:
        rows = np.flatnonzero(mask)
        tkey, start, end = ev.tkey[rows], ev.start[rows], ev.end[rows]
        order, parent, depth = nest(tkey, start, end)
        return cls(rows, ev.names[rows], tkey, start, end, order, parent, depth)

    def at(self, q_tkey: np.ndarray, q_t: np.ndarray) -> np.ndarray:
        return innermost(self.tkey, self.start, self.end, self.order, self.parent, q_tkey, q_t)


@dataclass
class _Events:
    """The columns attribution reads, as numpy arrays (names as Python strings via the categories once)."""

    names: np.ndarray
    tkey: np.ndarray
    start: np.ndarray
    end: np.ndarray
    pids: pd.Index
    tids: pd.Index
    threads: pd.Index

    @classmethod
    def of(cls, events: pd.DataFrame) -> _Events:
        # A thread's key: its (pid, tid) pair numbered by factorizing each column, then the pair.
        pc, pids = pd.factorize(events["pid"].to_numpy(np.int64))
        tc, tids = pd.factorize(events["tid"].to_numpy(np.int64))
        tkey, threads = pd.factorize(pc.astype(np.int64) * (len(tids) + 1) + tc)
        return cls(
            _object_names(events["name"]),
            tkey.astype(np.int64),
            events["start_ns"].to_numpy(np.int64),
            events["end_ns"].to_numpy(np.int64),
            pd.Index(pids),
            pd.Index(tids),
            pd.Index(threads),
        )

    def key_of(self, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
        """Thread keys of (pid, tid) pairs; -1 for a thread with no event (never: launches are events)."""
        if len(pid) == 0:
            return np.zeros(0, dtype=np.int64)
        pc, tc = self.pids.get_indexer(pd.Index(pid)), self.tids.get_indexer(pd.Index(tid))
        key = self.threads.get_indexer(pd.Index(pc.astype(np.int64) * (len(self.tids) + 1) + tc))
        return np.where((pc >= 0) & (tc >= 0), key, -1).astype(np.int64)


def _object_names(column: pd.Series) -> np.ndarray:
    """A text column as an object array of str (None where missing), converting each distinct value once."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        cats = np.array([str(c) for c in column.cat.categories.tolist()] + [None], dtype=object)
        codes = column.cat.codes.to_numpy()
        return cats[np.where(codes >= 0, codes, len(cats) - 1)]
    return np.array([None if v is None or v != v else str(v) for v in column.tolist()], dtype=object)


def _module_paths(mods: _Host) -> np.ndarray:
    """Path of each module range: the enclosing module ranges' names joined by ``/`` (object array)."""
    names = np.array([n[len(MODULE_PREFIX) :] for n in mods.names], dtype=object)
    paths = names.copy()
    for level in range(1, int(mods.depth.max()) + 1 if len(names) else 0):
        idx = np.flatnonzero(mods.depth == level)
        paths[idx] = paths[mods.parent[idx]] + "/" + names[idx]
    return paths


@dataclass
class KernelAttribution:
    """:func:`attribute`'s answer: one row per device event and the host tables it used.

    ``kernels`` (index: the events table's row labels) has the columns of
    :data:`KERNEL_COLUMNS`: ``launch_tid`` -1 without a launch call;
    ``graph`` True for a CUDA-graph replay; ``op`` the innermost op at the
    launch (None: unattributed); ``backward``; ``attributed_op`` the op the
    kernel counts to (the forward op for backward kernels); ``module`` path
    (None outside every module range), ``annotation`` (None outside every
    annotation); ``input_dims``/``input_types``/``concrete_inputs`` of the
    attributed op (only the ops whose shapes the loader keeps, and the scalar
    arguments of those it keeps them for: analyzer.ingest.tables).
    ``ops``: host op instances (``name, pid, tid, start_ns, end_ns``) with
    ``parent``, ``depth``, ``backward``, ``key`` (the name it is reported
    under), ``node`` (outermost autograd node around it, -1), ``module``.
    ``main_tid``: the thread holding most ops (for "launched from another thread").
    """

    kernels: pd.DataFrame
    ops: pd.DataFrame
    modules: pd.DataFrame
    annotations: pd.DataFrame
    main_tid: int | None


def attribute(events: pd.DataFrame, steps: pd.DataFrame | None = None) -> KernelAttribution:
    """Attribute every device event in the analysis window (module docstring)."""
    steps = steps if steps is not None else pd.DataFrame({"step": [], "start_ns": [], "end_ns": []})
    ev = _Events.of(events)
    kind, cat = events["kind"], events["cat"]
    # A graph launch is a host range of its own: the replayed kernels count to it (their ops ran at capture).
    is_op = is_in(kind, ("cpu_op", "cpu_comm")) | (is_in(kind, ("runtime",)) & is_in(events["name"], GRAPH_LAUNCHES))
    is_mod = _starts_with(events["name"], MODULE_PREFIX) & is_in(cat, ("python_function", "user_annotation"))
    is_anno = is_in(cat, ("user_annotation",)) & ~_starts_with(events["name"], "ProfilerStep#") & ~is_mod
    ops = _Host.of(ev, is_op & ~is_mod)
    mods = _Host.of(ev, is_mod)
    annos = _Host.of(ev, is_anno)

    tree = _op_tree(events, ops)
    # Module of each op: the innermost module range at its start; backward ops take their forward op's.
    mod_paths = _module_paths(mods)
    op_module = _take(mod_paths, mods.at(ops.tkey, ops.start))
    fwd_outer = _take(tree.fwd_of_node, tree.outer, -1).astype(np.int64)
    op_module_attr = np.where(tree.backward, _take(op_module, fwd_outer), op_module)
    kernels = _kernel_table(events, steps, ev, ops, mods, annos, tree, mod_paths, op_module_attr)
    ops_out, mods_out, annos_out = _host_tables(events, ops, mods, annos, tree, mod_paths, op_module_attr)
    tid_codes, tid_values = pd.factorize(ops_out["tid"].to_numpy(np.int64))
    main_tid = int(tid_values[np.bincount(tid_codes).argmax()]) if len(ops.rows) else None
    return KernelAttribution(kernels, ops_out, mods_out, annos_out, main_tid)


@dataclass(frozen=True)
class _OpTree:
    """Per host op (positions in ``ops``): where autograd's backward puts it and the name it counts under."""

    backward: np.ndarray  # bool: under an autograd node, and not recomputed forward work
    outer: np.ndarray  # int64: the outermost node around the op, -1 outside any
    fwd_of_node: np.ndarray  # int64: for a node, the forward op that created it, else -1
    is_outer_node: np.ndarray  # bool
    key: np.ndarray  # object: the op's name, its forward op's for an outer node, marked when recomputed


def _op_tree(events: pd.DataFrame, ops: _Host) -> _OpTree:
    """Backward: autograd nodes and what they enclose; each node's forward op by sequence number."""
    n_ops = len(ops.rows)
    op_names = ops.names
    seq = events["seq_num"].to_numpy(np.int64)[ops.rows]
    fwd_tid = events["fwd_tid"].to_numpy(np.int64)[ops.rows]
    node = ((seq >= 0) & (fwd_tid > 0)) | _starts_with(events["name"], EVALUATE_PREFIX)[ops.rows]
    nearest_node = nearest(ops.parent, node)
    # Recompute (activation checkpointing): a forward op (Fwd thread id 0) run inside a node, and the ops under
    # it, are forward work reported as their own op marked RECOMPUTE_SUFFIX, not as the node's backward.
    in_node = nearest_node >= 0
    recomputed = (
        nearest(
            ops.parent,
            in_node & (seq >= 0) & (fwd_tid == 0) & ~node & ~_starts_with(events["name"], "autograd::")[ops.rows],
        )
        >= 0
    )
    backward = in_node & ~recomputed
    # The outermost node around each op: each node's enclosing node, then the root of that forest.
    idx = np.arange(n_ops)
    par = ops.parent
    up = np.where(node & (par >= 0), nearest_node[np.clip(par, 0, None)], -1) if n_ops else idx
    root = np.where(node, idx, -1)
    while n_ops:
        u = np.where(root >= 0, up[np.clip(root, 0, None)], -1)
        move = u >= 0
        if not move.any():
            break
        root[move] = u[move]
    outer = np.where(nearest_node >= 0, root[np.clip(nearest_node, 0, None)], -1) if n_ops else idx
    fwd_of_node = _forward_ops(ops.start, seq, fwd_tid, node)  # per op: its forward op (nodes only), -1
    # The call that created the node is the outermost of the nested forward ops sharing its number
    # (aten::linear around aten::t for TBackward0; a custom autograd.Function around the ops inside it).
    while n_ops:
        f = np.flatnonzero(fwd_of_node >= 0)
        p = par[fwd_of_node[f]]
        same = (p >= 0) & (seq[np.clip(p, 0, None)] == seq[fwd_of_node[f]]) & ~node[np.clip(p, 0, None)]
        if not same.any():
            break
        fwd_of_node[f[same]] = p[same]
    is_outer_node = node & (outer == idx)
    # An outer node without a match (the evaluate_function wrapper carries no sequence number in some
    # traces) takes that of a node inside it.
    inner = np.flatnonzero(node & ~is_outer_node & (fwd_of_node >= 0) & (outer >= 0))
    if len(inner):
        first_outer, first = np.unique(outer[inner], return_index=True)
        lacking = fwd_of_node[first_outer] < 0
        fwd_of_node[first_outer[lacking]] = fwd_of_node[inner[first[lacking]]]
    key = op_names.copy()
    key[recomputed] = np.array([f"{n}{RECOMPUTE_SUFFIX}" for n in op_names[recomputed]], dtype=object)
    on = np.flatnonzero(is_outer_node)
    if len(on):
        f = fwd_of_node[on]
        key[on] = np.where(
            f >= 0,
            op_names[np.clip(f, 0, None)],
            np.array([n.removeprefix(EVALUATE_PREFIX) for n in op_names[on]], dtype=object),
        )
    return _OpTree(backward, outer, fwd_of_node, is_outer_node, key)


def _kernel_table(
    events: pd.DataFrame,
    steps: pd.DataFrame,
    ev: _Events,
    ops: _Host,
    mods: _Host,
    annos: _Host,
    tree: _OpTree,
    mod_paths: np.ndarray,
    op_module_attr: np.ndarray,
) -> pd.DataFrame:
    """One row per device event in the analysis window: its launch call, the op, module and annotation
    around that call, and the op whose shapes it is timed by (:attr:`KernelAttribution.kernels`)."""
    from analyzer.metrics.launch import launches

    kind = events["kind"]
    n_ops, op_names = len(ops.rows), ops.names
    backward, outer, fwd_of_node, key = tree.backward, tree.outer, tree.fwd_of_node, tree.key
    win = hta_window(events, steps) & is_in(kind, DEVICE_KINDS)
    dev_rows = np.flatnonzero(win)
    dev_index = events.index[dev_rows]
    link = launches(events)
    lk = link.reindex(dev_index)
    has_launch = lk["pid"].notna().to_numpy()
    l_pid = lk["pid"].fillna(-1).to_numpy(np.int64)
    l_tid = lk["tid"].fillna(-1).to_numpy(np.int64)
    l_t = lk["start_ns"].fillna(-1).to_numpy(np.int64)
    graph = has_launch & (
        np.isin(_launch_names(events, dev_rows, ev.names), list(GRAPH_LAUNCHES)) | (l_tid == SPLICED_TID)
    )
    q_tkey = np.full(len(dev_rows), -1, dtype=np.int64)
    q_tkey[has_launch] = ev.key_of(l_pid[has_launch], l_tid[has_launch])
    op_pos = np.where(has_launch, ops.at(q_tkey, l_t), -1)
    mod_pos = np.where(has_launch, mods.at(q_tkey, l_t), -1)
    anno_pos = np.where(has_launch, annos.at(q_tkey, l_t), -1)
    found = op_pos >= 0
    k_back = found & _take(backward, op_pos, False).astype(bool)
    k_outer = np.where(k_back, _take(outer, op_pos, -1), -1).astype(np.int64)
    attr_pos = np.where(k_back, k_outer, op_pos)  # the op the kernel counts to
    # The shapes of the attributed op: forward, the op itself; backward, the node's forward op.
    shape_pos = np.where(k_back, _take(fwd_of_node, k_outer, -1), op_pos).astype(np.int64)
    # A forward kernel launched anywhere under an attention op (its backend's inner ops: the flash kernel under
    # aten::_flash_attention_forward, a fill of its buffers) takes the innermost attention op's shapes: the
    # roofline times attention by its whole subtree, as TraceLens's SDPA rows do.
    # Likewise a forward kernel under aten::convolution (the entry every conv1d/2d/3d and transposed path
    # passes) takes its shapes, bias included: the backend's layout transforms and the bias add (an aten::add_
    # under aten::_convolution) are the convolution's cost, as in TraceLens's CONV rows.
    if n_ops:  # tested once per distinct name (the categorical), not once per op
        in_attention = nearest(ops.parent, is_in(events["name"], ATTENTION_OPS)[ops.rows])
        in_conv = nearest(ops.parent, is_in(events["name"], (CONV_ENTRY,))[ops.rows])
    else:
        in_attention = in_conv = np.zeros(0, np.int64)
    lift = (shape_pos >= 0) & ~k_back
    att = np.where(lift, _take(in_attention, shape_pos, -1), -1).astype(np.int64)
    conv = np.where(lift, _take(in_conv, shape_pos, -1), -1).astype(np.int64)
    shape_pos = np.where(att >= 0, att, np.where(conv >= 0, conv, shape_pos))
    shape_rows = np.where(shape_pos >= 0, _take(ops.rows, shape_pos, -1), -1).astype(np.int64)
    k_module = np.where(k_back, _take(op_module_attr, op_pos), _take(mod_paths, mod_pos))
    dur = ev.end[dev_rows] - ev.start[dev_rows]
    kernels = pd.DataFrame(
        {
            "name": _obj(ev.names[dev_rows], dev_index),
            "name_code": text_codes(events["name"])[dev_rows],  # the same name, as an integer (grouping)
            "kind": _obj(_object_names(events["kind"])[dev_rows], dev_index),
            "cls": row_classes(events)[dev_rows],
            "stream": events["stream"].to_numpy(np.int64)[dev_rows],
            "start_ns": ev.start[dev_rows],
            "dur_ns": dur,
            "launch_tid": np.where(has_launch, l_tid, -1),
            "graph": graph,
            "op": _obj(_take(op_names, op_pos), dev_index),
            "backward": k_back,
            "attributed_op": _obj(_take(key, attr_pos), dev_index),
            "attr_pos": attr_pos,
            "op_pos": op_pos,
            "module": _obj(k_module, dev_index),
            "annotation": _obj(_take(annos.names, anno_pos), dev_index),
            "anno_pos": anno_pos,
            "shape_op": _obj(_take(op_names, shape_pos), dev_index),
            # The call a kernel's shapes row counts: the autograd node (backward), else the op the shapes are of.
            "shape_call": np.where(k_back, attr_pos, shape_pos),
            "input_dims": _obj(_column_at(events, "input_dims", shape_rows), dev_index),
            "input_types": _obj(_column_at(events, "input_types", shape_rows), dev_index),
            "concrete_inputs": _obj(_column_at(events, "concrete_inputs", shape_rows), dev_index),
        },
        index=dev_index,
    )
    return kernels


def _host_tables(
    events: pd.DataFrame,
    ops: _Host,
    mods: _Host,
    annos: _Host,
    tree: _OpTree,
    mod_paths: np.ndarray,
    op_module_attr: np.ndarray,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The ops, modules and annotations tables of :class:`KernelAttribution`."""
    n_ops, op_names = len(ops.rows), ops.names
    backward, outer, is_outer_node, key = tree.backward, tree.outer, tree.is_outer_node, tree.key
    at = pd.RangeIndex(n_ops)
    ops_out = pd.DataFrame(
        {
            "name": _obj(op_names, at),
            "tid": events["tid"].to_numpy(np.int64)[ops.rows],
            "start_ns": ops.start,
            "end_ns": ops.end,
            "parent": ops.parent,
            "depth": ops.depth,
            "backward": backward,
            "key": _obj(key, at),
            "node": outer,
            "module": _obj(op_module_attr, at),
            "is_outer_node": is_outer_node,
        },
        index=at,
    )
    at = pd.RangeIndex(len(mods.rows))
    mods_out = pd.DataFrame(
        {
            "name": _obj(mods.names, at),
            "start_ns": mods.start,
            "end_ns": mods.end,
            "parent": mods.parent,
            "depth": mods.depth,
            "path": _obj(mod_paths, at),
        },
        index=at,
    )
    at = pd.RangeIndex(len(annos.rows))
    annos_out = pd.DataFrame(
        {
            "name": _obj(annos.names, at),
            "start_ns": annos.start,
            "end_ns": annos.end,
            "parent": annos.parent,
            "depth": annos.depth,
        },
        index=at,
    )
    return ops_out, mods_out, annos_out


def _obj(values: np.ndarray, index: pd.Index) -> pd.Series:
    """Text as an object column (pandas 3 would infer its Arrow string dtype: slower to build, NaN for None)."""
    return pd.Series(values, index=index, dtype=object)


def _take(values: np.ndarray, pos: np.ndarray, missing: object = None) -> np.ndarray:
    """``values[pos]`` with ``missing`` where ``pos`` is -1 (object result unless ``missing`` is numeric)."""
    pos = np.asarray(pos, dtype=np.int64)
    if len(values) == 0:
        return np.full(len(pos), missing, dtype=object if missing is None else type(missing))
    out = values[np.clip(pos, 0, None)]
    if missing is None:
        out = out.astype(object)
    result: np.ndarray = np.where(
        pos >= 0, out, np.asarray(missing, dtype=out.dtype if missing is not None else object)
    )
    return result


def _column_at(events: pd.DataFrame, column: str, rows: np.ndarray) -> np.ndarray:
    """An object column's values at ``rows`` (positions; -1: None), missing values as None."""
    out = np.full(len(rows), None, dtype=object)
    have = rows >= 0
    if have.any():
        values = events[column].to_numpy(object)[rows[have]]
        out[have] = np.where(pd.isna(values), None, values)
    return out


def _renumber(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense codes 0..n-1 for integer ``codes`` in order of first appearance (as ``pd.factorize`` numbers
    them, so ties later broken by code fall as before) and the position of each value's first row."""
    _, first, dense = np.unique(codes, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")
    rank = np.empty(len(first), dtype=np.int64)
    rank[by_first] = np.arange(len(first))
    return rank[dense.reshape(-1)], first[by_first]


def _starts_with(names: pd.Series, prefix: str) -> np.ndarray:
    """Boolean per row: the name starts with ``prefix`` (each distinct name tested once)."""
    return text_mask(names, lambda n: n.startswith(prefix))


def _launch_names(events: pd.DataFrame, dev_rows: np.ndarray, names: np.ndarray) -> np.ndarray:
    """Name of each device event's launch call (None without one)."""
    corr = events["correlation"].to_numpy(np.int64)
    host = np.flatnonzero(is_in(events["kind"], ("runtime", "other")) & (corr >= 0))
    ucorr, first = np.unique(corr[host], return_index=True)
    q = corr[dev_rows]
    k = np.clip(np.searchsorted(ucorr, q), 0, max(len(ucorr) - 1, 0))
    hit = (len(ucorr) > 0) & (ucorr[k] == q) if len(ucorr) else np.zeros(len(q), bool)
    if not len(ucorr):
        return np.full(len(q), None, dtype=object)
    found: np.ndarray = names[host[first[k]]].astype(object)
    found[~hit] = None
    return found


def _forward_ops(start: np.ndarray, seq: np.ndarray, fwd_tid: np.ndarray, node: np.ndarray) -> np.ndarray:
    """Per op position: for autograd nodes with a sequence number, the innermost forward op with
    that number started before the node (merge_asof on start); -1 elsewhere."""
    out = np.full(len(seq), -1, dtype=np.int64)
    fwd = np.flatnonzero((seq >= 0) & (fwd_tid <= 0))
    nodes = np.flatnonzero(node & (seq >= 0))
    if len(fwd) == 0 or len(nodes) == 0:
        return out
    left = pd.DataFrame({"start": start[nodes], "seq": seq[nodes], "pos": nodes}).sort_values("start", kind="stable")
    right = pd.DataFrame({"start": start[fwd], "seq": seq[fwd], "fpos": fwd}).sort_values("start", kind="stable")
    m = pd.merge_asof(left, right, on="start", by="seq", direction="backward", allow_exact_matches=True)
    ok = m["fpos"].notna().to_numpy()
    out[m["pos"].to_numpy(np.int64)[ok]] = m["fpos"].to_numpy()[ok].astype(np.int64)
    return out


# ---------------------------------------------------------------------------
# The per-rank tables (what the rank summary stores)


@dataclass
class AttributionTables:
    """One rank's attribution tables (docs/metrics.md, "Attribution"); times in ms.

    ``ops``: one row per (``op``, ``backward``): ``calls``, ``host_ms``,
    ``device_ms`` (kernels attributed to the op: summed over ops, the
    attributed device time), ``device_inclusive_ms`` (kernels launched
    anywhere under the op's outermost instances), ``graph_ms``,
    ``n_kernels``. ``shapes``: (``op``, ``backward``, ``input_dims``,
    ``input_types``, ``concrete_inputs``: "" where the loader keeps none) -> ``calls`` (op instances with kernels in the window;
    backward: autograd nodes), ``n_kernels``, ``device_ms``. ``modules``: (``module``
    path, ``backward``) -> ``depth``, ``calls``, ``host_ms``, ``device_self_ms``,
    ``device_ms`` (inclusive of nested modules). ``annotations``: ``name`` ->
    ``calls``, ``host_ms``, ``device_self_ms``, ``device_ms`` (kernels launched
    under its outermost instances), ``gpu_calls``, ``gpu_ms`` (its
    ``gpu_user_annotation`` copies: HTA's ``get_gpu_user_annotation_breakdown``
    sum). ``op_kernels``: the :data:`TOP_KERNELS_PER_OP` kernels of each op
    row: ``op, backward, kernel, cls, count, device_ms``. ``totals``
    (ns): ``device_ns`` (all device events in the window), ``attributed_ns``,
    ``unattributed_ns``, ``graph_ns``, ``backward_ns``, ``other_thread_ns``
    (launched off the main thread), ``module_ns`` (inside some module),
    ``annotated_ns``, ``step_ns`` (sum of the step windows), ``n_device``,
    ``n_unattributed``.
    """

    ops: pd.DataFrame
    shapes: pd.DataFrame
    modules: pd.DataFrame
    annotations: pd.DataFrame
    op_kernels: pd.DataFrame
    totals: dict[str, int] = field(default_factory=dict)


OPS_COLUMNS = ("op", "backward", "calls", "host_ms", "device_ms", "device_inclusive_ms", "graph_ms", "n_kernels")
SHAPES_COLUMNS = ("op", "backward", "input_dims", "input_types", "concrete_inputs", "calls", "n_kernels", "device_ms")
MODULES_COLUMNS = ("module", "backward", "depth", "calls", "host_ms", "device_self_ms", "device_ms")
ANNOTATIONS_COLUMNS = ("name", "calls", "host_ms", "device_self_ms", "device_ms", "gpu_calls", "gpu_ms")
OP_KERNELS_COLUMNS = ("op", "backward", "kernel", "cls", "count", "device_ms")


def rank_attribution(events: pd.DataFrame, steps: pd.DataFrame) -> AttributionTables:
    """The per-rank tables of :class:`AttributionTables` from one rank's events and step windows."""
    ka = attribute(events, steps)
    k, o = ka.kernels, ka.ops
    dur = k["dur_ns"].to_numpy(np.float64)
    found = k["attr_pos"].to_numpy(np.int64) >= 0
    n_ops = len(o)
    # --- ops
    attr_ns = np.bincount(k["attr_pos"].to_numpy(np.int64)[found], weights=dur[found], minlength=n_ops)
    graph_ns = np.bincount(
        k["attr_pos"].to_numpy(np.int64)[found & k["graph"].to_numpy(bool)],
        weights=dur[found & k["graph"].to_numpy(bool)],
        minlength=n_ops,
    )
    n_k = np.bincount(k["attr_pos"].to_numpy(np.int64)[found], minlength=n_ops)
    launched = k["op_pos"].to_numpy(np.int64)
    own_ns = np.bincount(launched[launched >= 0], weights=dur[launched >= 0], minlength=n_ops)
    parent = o["parent"].to_numpy(np.int64)
    depth = o["depth"].to_numpy(np.int64)
    incl_ns = subtree_sum(parent, depth, own_ns)
    key = o["key"].to_numpy(object)
    bwd = o["backward"].to_numpy(bool)
    # Rows: (key, backward). Instances inside a node other than the node itself keep their own name.
    key_codes, key_names = pd.factorize(key)
    codes, uniq_codes = pd.factorize(key_codes * 2 + bwd)
    nested = climb_same_name(parent, codes) if n_ops else np.zeros(0, bool)
    host_ns = (o["end_ns"] - o["start_ns"]).to_numpy(np.float64)
    top = ~nested
    m = len(uniq_codes)
    if m:
        ops_t = pd.DataFrame(
            {
                "op": np.asarray(key_names, dtype=object)[uniq_codes // 2],
                "backward": (uniq_codes % 2).astype(bool),
                "calls": np.bincount(codes, minlength=m).astype(np.int64),
                "host_ms": np.bincount(codes[top], weights=host_ns[top], minlength=m) / 1e6,
                "device_ms": np.bincount(codes, weights=attr_ns, minlength=m) / 1e6,
                "device_inclusive_ms": np.bincount(codes[top], weights=incl_ns[top], minlength=m) / 1e6,
                "graph_ms": np.bincount(codes, weights=graph_ns, minlength=m) / 1e6,
                "n_kernels": np.bincount(codes, weights=n_k, minlength=m).astype(np.int64),
            }
        )
        ops_t = ops_t.sort_values(
            ["device_ms", "device_inclusive_ms", "op"], ascending=[False, False, True], kind="stable"
        ).reset_index(drop=True)
    else:
        ops_t = empty_frame(OPS_COLUMNS)
    # --- shapes (only ops whose shapes the loader keeps)
    with_shapes = np.flatnonzero(found & k["input_dims"].notna().to_numpy())
    shapes = _shape_table(k, with_shapes) if len(with_shapes) else empty_frame(SHAPES_COLUMNS)
    op_kernels = _op_kernels(k, found, dur, codes, uniq_codes, np.asarray(key_names, dtype=object))
    modules = _module_table(ka)
    annotations = _annotation_table(ka, events)
    totals = _rank_totals(k, ka.main_tid, steps, dur, found)
    # Text as categoricals: a rank summary stores each distinct name once (kernel names repeat across ops).
    for frame, cols in (
        (ops_t, ("op",)),
        (shapes, ("op", "input_dims", "input_types", "concrete_inputs")),
        (op_kernels, ("op", "kernel", "cls")),
    ):
        for c in cols:
            if len(frame):
                frame[c] = frame[c].astype("category")
    return AttributionTables(ops_t, shapes, modules, annotations, op_kernels, totals)


def _op_kernels(
    k: pd.DataFrame,
    found: np.ndarray,
    dur: np.ndarray,
    codes: np.ndarray,
    uniq_codes: np.ndarray,
    key_names: np.ndarray,
) -> pd.DataFrame:
    """The op-kernels table: for each op row, its ``TOP_KERNELS_PER_OP`` largest kernels by device time.

    ``codes``: each host op's row; ``uniq_codes``: each row's ``key code * 2 + backward``; ``key_names``: the
    keys. (op row, kernel name) groups by integer codes and bincount, then the largest per op row.
    """
    m = len(uniq_codes)
    if found.any() and m:
        row = codes[k["attr_pos"].to_numpy(np.int64)[found]]
        kname_codes, kname_first = _renumber(k["name_code"].to_numpy(np.int64)[found])
        kname_values = k["name"].to_numpy(object)[found][kname_first]
        group, inv = np.unique(row.astype(np.int64) * (len(kname_values) + 1) + kname_codes, return_inverse=True)
        g_ms = np.bincount(inv, weights=dur[found], minlength=len(group)) / 1e6
        g_n = np.bincount(inv, minlength=len(group))
        g_row, g_name = group // (len(kname_values) + 1), group % (len(kname_values) + 1)
        first = np.zeros(len(group), dtype=np.int64)
        first[inv[::-1]] = np.arange(len(inv))[::-1]  # a kernel of the group (its class)
        order = np.lexsort((-g_ms, g_row))
        g_row_sorted = g_row[order]
        rank_in_row = np.arange(len(order)) - np.searchsorted(g_row_sorted, g_row_sorted, side="left")
        keep = order[rank_in_row < TOP_KERNELS_PER_OP]
        cls = k["cls"].to_numpy(object)[found]
        return pd.DataFrame(
            {
                "op": pd.Series(key_names[uniq_codes[g_row[keep]] // 2], dtype=object),
                "backward": (uniq_codes[g_row[keep]] % 2).astype(bool),
                "kernel": pd.Series(np.asarray(kname_values, dtype=object)[g_name[keep]], dtype=object),
                "cls": pd.Series(cls[first[keep]], dtype=object),
                "count": g_n[keep].astype(np.int64),
                "device_ms": g_ms[keep],
            }
        )
    return empty_frame(OP_KERNELS_COLUMNS)


def _rank_totals(
    k: pd.DataFrame, main_tid: int | None, steps: pd.DataFrame, dur: np.ndarray, found: np.ndarray
) -> dict[str, int]:
    """:attr:`AttributionTables.totals` of one rank: device time in total, attributed or not, in graphs, in
    backward, launched from a thread other than the main one, under a module, under an annotation (ns)."""
    kb = k["backward"].to_numpy(bool)
    graph = k["graph"].to_numpy(bool)
    other = (k["launch_tid"].to_numpy(np.int64) >= 0) & (
        k["launch_tid"].to_numpy(np.int64) != (main_tid if main_tid is not None else -2)
    )
    step_ns = int((steps["end_ns"] - steps["start_ns"]).sum()) if len(steps) else 0
    return {
        "device_ns": int(dur.sum()),
        "attributed_ns": int(dur[found].sum()),
        "unattributed_ns": int(dur[~found].sum()),
        "graph_ns": int(dur[graph].sum()),
        "backward_ns": int(dur[kb].sum()),
        "other_thread_ns": int(dur[other].sum()),
        "module_ns": int(dur[k["module"].notna().to_numpy()].sum()),
        "annotated_ns": int(dur[k["annotation"].notna().to_numpy()].sum()),
        "step_ns": step_ns,
        "n_device": int(len(k)),
        "n_unattributed": int((~found).sum()),
    }


def _shape_table(k: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """(op, backward, input dims, types, concrete inputs) rows of the kernels at positions ``rows``
    (AttributionTables.shapes), groups in order of first appearance, then by device time.

    Grouped by integer codes (one factorize per key column) rather than a five-key groupby: a few
    thousand kernels, where pandas' groupby machinery cost more than the arithmetic. Device time is
    summed in integer ns, then scaled: exact.
    """

    def text(column: str) -> np.ndarray:  # the rows' values, "" where missing
        values = k[column].to_numpy(object)[rows]
        return np.where(pd.isna(values), "", values)

    keys = [
        k["shape_op"].to_numpy(object)[rows],
        k["backward"].to_numpy(bool)[rows],
        k["input_dims"].to_numpy(object)[rows],
        text("input_types"),
        text("concrete_inputs"),
    ]
    group = np.zeros(len(rows), dtype=np.int64)
    for values in keys:  # (group so far, next key) pairs renumbered: the codes stay below len(rows)
        codes, uniq = pd.factorize(values)
        group, _ = _renumber(group * (len(uniq) + 1) + codes)
    n = int(group.max()) + 1
    first = np.full(n, len(rows), dtype=np.int64)
    np.minimum.at(first, group, np.arange(len(rows)))
    dur_ns = k["dur_ns"].to_numpy(np.int64)[rows]
    device_ns = np.zeros(n, dtype=np.int64)
    np.add.at(device_ns, group, dur_ns)
    # calls: distinct op instances (autograd nodes, backward) per group
    call = k["shape_call"].to_numpy(np.int64)[rows] + 1  # op positions, -1 for none
    width = int(call.max()) + 1
    pairs = np.unique(group * width + call)
    table = pd.DataFrame(
        {
            "op": keys[0][first],
            "backward": keys[1][first],
            "input_dims": keys[2][first],
            "input_types": keys[3][first],
            "concrete_inputs": keys[4][first],
            "calls": np.bincount(pairs // width, minlength=n).astype(np.int64),
            "n_kernels": np.bincount(group, minlength=n).astype(np.int64),
            "device_ms": device_ns / 1e6,
        }
    )
    return table.sort_values(["device_ms", "op"], ascending=[False, True], kind="stable").reset_index(drop=True)


def _module_table(ka: KernelAttribution) -> pd.DataFrame:
    """(module path, backward) rows: self and inclusive device and host time (AttributionTables)."""
    k, o, md = ka.kernels, ka.ops, ka.modules
    # Self device time per (path, backward).
    km = k.loc[k["module"].notna()]
    selfd = km.groupby(["module", "backward"])["dur_ns"].sum() if len(km) else pd.Series(dtype=np.float64)
    # Forward host time and calls: module range instances, outermost of their path.
    frames = []
    if len(md):
        paths = md["path"].to_numpy(object)
        codes, _ = pd.factorize(paths)
        top = ~climb_same_name(md["parent"].to_numpy(np.int64), codes)
        d = (md["end_ns"] - md["start_ns"]).to_numpy(np.float64)
        fwd = pd.DataFrame({"module": paths, "backward": False, "calls": 1, "host_ns": np.where(top, d, 0.0)})
        frames.append(fwd)
    # Backward host time and calls: the outermost autograd nodes, under their forward op's module (self).
    nodes = o.loc[o["is_outer_node"].to_numpy(bool) & o["module"].notna().to_numpy()]
    if len(nodes):
        frames.append(
            pd.DataFrame(
                {
                    "module": nodes["module"].to_numpy(object),
                    "backward": True,
                    "calls": 1,
                    "host_ns": (nodes["end_ns"] - nodes["start_ns"]).to_numpy(np.float64),
                    "self_host": True,
                }
            )
        )
    if not frames and selfd.empty:
        return empty_frame(MODULES_COLUMNS)
    rows = (
        pd.concat(frames, ignore_index=True)
        if frames
        else pd.DataFrame(columns=["module", "backward", "calls", "host_ns"])
    )
    if "self_host" not in rows.columns:
        rows["self_host"] = False
    rows["self_host"] = rows["self_host"].fillna(False).astype(bool)
    keys = set(zip(rows["module"], rows["backward"].astype(bool))) | set(selfd.index)
    # Every prefix of a path is a row too (a module with nothing of its own still has a place in the tree).
    allkeys = set()
    for path, b in keys:
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            allkeys.add(("/".join(parts[:i]), bool(b)))
    table = pd.DataFrame(sorted(allkeys), columns=["module", "backward"])
    table["depth"] = table["module"].str.count("/").astype(np.int64)
    idx = pd.MultiIndex.from_frame(table[["module", "backward"]])
    self_ns = selfd.reindex(idx).fillna(0.0).to_numpy(np.float64) if len(selfd) else np.zeros(len(table))
    fwd_rows = rows.loc[~rows["self_host"]]
    calls = fwd_rows.groupby(["module", "backward"])["calls"].sum()
    host_fwd = fwd_rows.groupby(["module", "backward"])["host_ns"].sum()
    bwd_rows = rows.loc[rows["self_host"]]
    calls_b = bwd_rows.groupby(["module", "backward"])["calls"].sum()
    host_b = bwd_rows.groupby(["module", "backward"])["host_ns"].sum()
    # Inclusive: a row's own plus every row whose path extends it (same direction).
    pos = {key: i for i, key in enumerate(zip(table["module"], table["backward"]))}
    parent = np.array(
        [
            pos.get(("/".join(m.split("/")[:-1]), b), -1) if "/" in m else -1
            for m, b in zip(table["module"], table["backward"])
        ],
        dtype=np.int64,
    )
    depth = table["depth"].to_numpy(np.int64)
    incl = subtree_sum(parent, depth, self_ns)
    # Backward host time is known per node's module (self); forward per module range (already inclusive).
    host_b_self = host_b.reindex(idx).fillna(0.0).to_numpy(np.float64) if len(host_b) else np.zeros(len(table))
    calls_b_self = calls_b.reindex(idx).fillna(0).to_numpy(np.float64) if len(calls_b) else np.zeros(len(table))
    host = host_fwd.reindex(idx).fillna(0.0).to_numpy(np.float64) if len(host_fwd) else np.zeros(len(table))
    host = np.where(table["backward"].to_numpy(bool), subtree_sum(parent, depth, host_b_self), host)
    ncalls = calls.reindex(idx).fillna(0).to_numpy(np.float64) if len(calls) else np.zeros(len(table))
    ncalls = np.where(table["backward"].to_numpy(bool), subtree_sum(parent, depth, calls_b_self), ncalls)
    table["calls"] = ncalls.astype(np.int64)
    table["host_ms"] = host / 1e6
    table["device_self_ms"] = self_ns / 1e6
    table["device_ms"] = incl / 1e6
    return table.sort_values(["module", "backward"], kind="stable").reset_index(drop=True)[list(MODULES_COLUMNS)]


def _annotation_table(ka: KernelAttribution, events: pd.DataFrame) -> pd.DataFrame:
    """Per user annotation name: host ranges, the device time launched under them, and their GPU copies.

    Numpy over codes (a rank has a few hundred annotation ranges; pandas' groupby and outer merge
    cost more than the sums); GPU copies' time summed in integer ns, then scaled.
    """
    k, an = ka.kernels, ka.annotations
    gpu_rows = np.flatnonzero(
        is_in(events["cat"], ("gpu_user_annotation",)) & ~_starts_with(events["name"], "ProfilerStep#")
    )
    if an.empty and not len(gpu_rows):
        return empty_frame(ANNOTATIONS_COLUMNS)
    n = len(an)
    names = an["name"].to_numpy(object)
    codes, uniq = pd.factorize(names) if n else (np.zeros(0, np.int64), np.array([], dtype=object))
    pos = k["anno_pos"].to_numpy(np.int64)
    dur = k["dur_ns"].to_numpy(np.float64)
    own = np.bincount(pos[pos >= 0], weights=dur[pos >= 0], minlength=n)
    parent = an["parent"].to_numpy(np.int64)
    incl = subtree_sum(parent, an["depth"].to_numpy(np.int64), own)
    top = ~climb_same_name(parent, codes) if n else np.zeros(0, bool)
    hd = (an["end_ns"] - an["start_ns"]).to_numpy(np.float64)
    # Rows: the host ranges' names, then names only GPU copies carry.
    g_names = _object_names(events["name"])[gpu_rows]
    row_of = {name: i for i, name in enumerate(uniq)}
    for name in g_names:
        row_of.setdefault(name, len(row_of))
    m = len(row_of)
    g_code = np.fromiter((row_of[name] for name in g_names), dtype=np.int64, count=len(g_names))
    g_ns = events["end_ns"].to_numpy(np.int64)[gpu_rows] - events["start_ns"].to_numpy(np.int64)[gpu_rows]
    g_sum = np.zeros(m, dtype=np.int64)
    np.add.at(g_sum, g_code, g_ns)
    table = pd.DataFrame(
        {
            "name": pd.Series(list(row_of), dtype=object),
            "calls": np.bincount(codes, minlength=m).astype(np.int64),
            "host_ms": np.bincount(codes[top], weights=hd[top], minlength=m) / 1e6,
            "device_self_ms": np.bincount(codes, weights=own, minlength=m) / 1e6,
            "device_ms": np.bincount(codes[top], weights=incl[top], minlength=m) / 1e6,
            "gpu_calls": np.bincount(g_code, minlength=m).astype(np.int64),
            "gpu_ms": g_sum / 1e6,
        }
    )
    return table.sort_values(
        ["device_ms", "gpu_ms", "name"], ascending=[False, False, True], kind="stable"
    ).reset_index(drop=True)[list(ANNOTATIONS_COLUMNS)]


# ---------------------------------------------------------------------------
# The run's tables (the reduce): every rank's, with shares, and the report's aggregate over ranks


@dataclass
class RunAttribution:
    """The attribution tables of every rank (docs/metrics.md, "Attribution").

    Each table is :class:`AttributionTables`'s with a ``rank`` column first;
    ``ops``, ``modules`` and ``annotations`` add ``share_of_step_pct``
    (device ms / the rank's summed step windows; NaN without steps) and
    ``share_of_device_pct`` (of all its device time in the window).
    ``totals``: one row per rank with the totals in ms and
    ``attributed_pct``, ``unattributed_pct``, ``graph_pct``, ``backward_pct``,
    ``other_thread_pct`` of the rank's device time.
    """

    ops: pd.DataFrame
    shapes: pd.DataFrame
    modules: pd.DataFrame
    annotations: pd.DataFrame
    op_kernels: pd.DataFrame
    totals: pd.DataFrame

    KEYS = {
        "ops": ["op", "backward"],
        "shapes": ["op", "backward", "input_dims", "input_types", "concrete_inputs"],
        "modules": ["module", "backward"],
        "annotations": ["name"],
        "op_kernels": ["op", "backward", "kernel", "cls"],
    }

    def summed(self, name: str) -> pd.DataFrame:
        """Table ``name`` summed over ranks: rows keyed as per rank, ``n_ranks`` ranks having the row, and for
        ops, modules and annotations the shares of the summed totals; ops sorted by device time.

        Computed once per table (the text report, the JSON and the roofline each ask; 10 calls were
        about 20 ms of a cold report) and kept outside the dataclass fields, so the caches that store a
        RunAttribution field by field never hold it; a copy is returned, so a caller's edits stay its own.
        """
        done: dict[str, pd.DataFrame] = self.__dict__.setdefault("_summed_tables", {})
        if name not in done:
            done[name] = self._summed(name)
        return done[name].copy()

    def _summed(self, name: str) -> pd.DataFrame:
        frame, keys = getattr(self, name), self.KEYS[name]
        if frame.empty:
            empty: pd.DataFrame = frame.drop(
                columns=[c for c in ("rank", "share_of_step_pct", "share_of_device_pct") if c in frame.columns]
            )
            return empty
        out = _sum_over_ranks(frame, keys)
        if name == "modules":
            out.insert(2, "depth", out["module"].str.count("/").astype(np.int64))
            out = out.sort_values(["module", "backward"], kind="stable")
        if name in ("ops", "modules", "annotations"):
            t = self.totals
            step_ms = float(t["step_ms"].sum()) if len(t) else 0.0
            device_ms = float(t["device_ms"].sum()) if len(t) else 0.0
            out["share_of_step_pct"] = 100.0 * out["device_ms"] / step_ms if step_ms > 0 else np.nan
            out["share_of_device_pct"] = 100.0 * out["device_ms"] / device_ms if device_ms > 0 else np.nan
        if name == "ops":
            out = out.sort_values(
                ["device_ms", "device_inclusive_ms", "host_ms", "op"],
                ascending=[False, False, False, True],
                kind="stable",
            )
        result: pd.DataFrame = out.reset_index(drop=True)
        return result

    def to_json(self) -> dict[str, Any]:
        """The report's ``attribution`` block: per-rank totals, and each table summed over ranks (:meth:`summed`)."""
        return {
            "schema": SCHEMA,
            "totals": self.totals.to_dict("records"),
            "ops": self.summed("ops").to_dict("records"),
            "op_shapes": self.summed("shapes").to_dict("records"),
            "modules": self.summed("modules").to_dict("records"),
            "annotations": self.summed("annotations").to_dict("records"),
            "op_kernels": self.summed("op_kernels").to_dict("records"),
        }


def _value_columns(frame: pd.DataFrame, keys: list[str]) -> list[str]:
    return [c for c in frame.columns if c not in keys and c not in ("rank", "depth") and not c.endswith("_pct")]


def _sum_over_ranks(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The per-rank rows of ``frame`` summed per key (keys first, then the values, then ``n_ranks``).

    One rank's rows are already one per key (rank_attribution groups them), so with a single rank the
    sum is the rows themselves: no groupby (each was 1-3 ms of a one-file report; equal to
    :func:`_sum_over_ranks_grouped`, tests/test_metrics_attribution.py).
    """
    if frame["rank"].nunique() != 1:
        return _sum_over_ranks_grouped(frame, keys)
    out = frame[[*keys, *_value_columns(frame, keys)]].reset_index(drop=True)
    out["n_ranks"] = 1
    return out


def _sum_over_ranks_grouped(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """:func:`_sum_over_ranks` by a groupby, for any number of ranks (rows in order of first appearance)."""
    grouped = frame.groupby(keys, sort=False, dropna=False)
    out = grouped[_value_columns(frame, keys)].sum()
    out["n_ranks"] = grouped["rank"].nunique()
    return out.reset_index()


_TOTAL_PCTS = (
    ("attributed", "attributed_ns"),
    ("unattributed", "unattributed_ns"),
    ("graph", "graph_ns"),
    ("backward", "backward_ns"),
    ("other_thread", "other_thread_ns"),
    ("module", "module_ns"),
    ("annotated", "annotated_ns"),
)
# RunAttribution.totals: one row per rank (the same columns when no rank has tables).
TOTALS_COLUMNS = (
    "rank",
    "device_ms",
    "step_ms",
    "n_device",
    "n_unattributed",
    *(f"{label}_{unit}" for label, _ in _TOTAL_PCTS for unit in ("ms", "pct")),
)


def run_attribution(parts: dict[int, AttributionTables | None]) -> RunAttribution:
    """Every rank's tables with a ``rank`` column and shares (ranks without tables are left out)."""
    have = {r: a for r, a in sorted(parts.items()) if a is not None}

    def cat(name: str, columns: tuple[str, ...], share: bool) -> pd.DataFrame:
        frames = []
        for rank, a in have.items():
            f = getattr(a, name)
            if f.empty:
                continue
            f = f.copy()
            f.insert(0, "rank", rank)
            if share:
                step_ns, device_ns = a.totals.get("step_ns", 0), a.totals.get("device_ns", 0)
                f["share_of_step_pct"] = 100.0 * f["device_ms"] * 1e6 / step_ns if step_ns else np.nan
                f["share_of_device_pct"] = 100.0 * f["device_ms"] * 1e6 / device_ns if device_ns else np.nan
            frames.append(f)
        cols = ["rank", *columns] + (["share_of_step_pct", "share_of_device_pct"] if share else [])
        return pd.concat(frames, ignore_index=True) if frames else empty_frame(cols)

    rows = []
    for rank, a in have.items():
        t = a.totals
        dev = t.get("device_ns", 0)
        row: dict[str, float | int | None] = {
            "rank": rank,
            "device_ms": dev / 1e6,
            "step_ms": t.get("step_ns", 0) / 1e6,
            "n_device": t.get("n_device", 0),
            "n_unattributed": t.get("n_unattributed", 0),
        }
        for label, key in _TOTAL_PCTS:
            row[f"{label}_ms"] = t.get(key, 0) / 1e6
            row[f"{label}_pct"] = 100.0 * t.get(key, 0) / dev if dev else None
        rows.append(row)
    totals = pd.DataFrame(rows, columns=list(TOTALS_COLUMNS)) if rows else empty_frame(TOTALS_COLUMNS)
    return RunAttribution(
        ops=cat("ops", OPS_COLUMNS, True),
        shapes=cat("shapes", SHAPES_COLUMNS, False),
        modules=cat("modules", MODULES_COLUMNS, True),
        annotations=cat("annotations", ANNOTATIONS_COLUMNS, True),
        op_kernels=cat("op_kernels", OP_KERNELS_COLUMNS, False),
        totals=totals,
    )
