"""FLOPs of the FLOP table's host ops (GEMM, convolution, attention) from the shapes the profiler recorded.

Used for MFU and HFU on traces that come without a manifest
(docs/metrics.md, "Source `trace-shapes`"). The formulas, one per op, are
the FLOP table's (:mod:`analyzer.metrics.flop_table`), which the roofline
reads too.

Shapes are validated as the op itself would check them (inner dimensions
equal, batch dims and bias broadcastable, operands of the rank the op
needs): a trace has been seen recording ``aten::linear`` with x=[2048,160,606]
and w=[2048,3906], which an unvalidated count takes as 8.13e11 FLOPs where
the ``aten::addmm`` inside it (``[[3906],[2048,512],[512,3906]]``) does 8.19e9.

Each product is counted once, two ways (:func:`flop_kernels` says which
applies, see :mod:`analyzer.metrics.mfu`):

* **kernel attribution** (device traces whose kernels link to their
  launches): each GEMM/attention/convolution kernel is charged to the
  innermost table op around its launch that has usable shapes;
  an op counts once however many kernels it launched, and an op inside a
  charged op does not count again;
* **host ops only** (no linked kernels): the outermost ops with usable
  shapes count (``aten::linear`` covers the ``aten::addmm`` or
  ``aten::matmul`` inside it); an op with inconsistent shapes falls back to
  its children. Backward ops (the ``aten::mm`` calls under
  ``autograd::engine::evaluate_function: AddmmBackward0``,
  ``aten::convolution_backward``, an SDPA backward) are top-level ops of
  their own and count as recorded.

Each op is in one pass (:mod:`analyzer.metrics.passes`): forward, backward,
or recompute (a forward op run during backward by activation
checkpointing), so the MFU counts model FLOPs and the HFU adds recompute.

Shapes repeat every step, so formulas run once per distinct
``(name, Input Dims, Concrete Inputs)`` triple, not once per event.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from analyzer.metrics.dtypes import float_key
from analyzer.metrics.nesting import below_flagged, nest, thread_keys
from analyzer.metrics.passes import backward_ranges, in_backward, inside, recompute_ranges, stopped_recompute
from analyzer.metrics.text import is_in, text_map
from analyzer.metrics.flop_table import FLOP_TABLE, ShapeError, flops_of, op_flops
from analyzer.ingest.tables import FLOP_OPS, MATMUL_OPS  # noqa: F401 - MATMUL_OPS re-exported

__all__ = ["ShapeError", "flops_of", "matmul_ops", "flop_kernels", "charged_ops", "dominant_dtype"]


def _flops_or_error(name: str, dims_json: str | None, concrete_json: str | None = None) -> tuple[float, str | None]:
    """(FLOPs, None) for usable dims; (NaN, why) for missing or inconsistent ones (:func:`op_flops`)."""
    if dims_json is None:
        return float("nan"), "no recorded shapes"
    try:
        return float(op_flops(name, json.loads(dims_json), json.loads(concrete_json) if concrete_json else None)), None
    except ShapeError as e:
        return float("nan"), str(e)
    except (ValueError, TypeError, IndexError, KeyError) as e:  # json.JSONDecodeError is a ValueError
        return float("nan"), f"unreadable Input Dims ({type(e).__name__})"


def _dtype_of(types_json: str | None) -> str | None:
    """The dtype family of an op's tensor inputs (first recognised type)."""
    if types_json is None:
        return None
    try:
        types = json.loads(types_json)
    except (TypeError, json.JSONDecodeError):
        return None
    return float_key(types) if isinstance(types, list) else None


def _passes(events: pd.DataFrame, ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of ``ops``: (backward, recompute, stopped) from :mod:`analyzer.metrics.passes`.

    Backward: a backward op of the table (``convolution_backward``, an SDPA
    backward) or an op inside a backward range that is not recompute.
    Recompute: an op inside a recomputed forward op's range (itself included).
    Stopped: a recompute op that early stopping cut off before it computed.
    """
    pid, tid = ops["pid"].to_numpy(np.int64), ops["tid"].to_numpy(np.int64)
    start = ops["start_ns"].to_numpy(np.int64)
    table_bw = np.array([FLOP_TABLE[n].backward for n in ops["name"]], dtype=bool)
    none = np.zeros(len(ops), dtype=bool)
    if not backward_ranges(events):
        return table_bw, none, none
    bw_rows = in_backward(events)
    inside_bw = inside(backward_ranges(events), pid, tid, start)
    rec_ranges = recompute_ranges(events, bw_rows)
    rec = inside(rec_ranges, pid, tid, start) if rec_ranges else none
    stop_ranges = stopped_recompute(events, bw_rows, FLOP_OPS) if rec_ranges else {}
    stopped = inside(stop_ranges, pid, tid, start) if stop_ranges else none
    return (table_bw | inside_bw) & ~rec, rec, stopped


def _parent_positions(ops: pd.DataFrame) -> np.ndarray:
    """Position of each op's innermost enclosing matmul op on its thread (-1 at top level)."""
    _, parent, _ = nest(
        thread_keys(ops["pid"].to_numpy(np.int64), ops["tid"].to_numpy(np.int64)),
        ops["start_ns"].to_numpy(np.int64),
        ops["end_ns"].to_numpy(np.int64),
    )
    return parent


def matmul_ops(events: pd.DataFrame) -> pd.DataFrame:
    """Matmul-like host ops of one rank with their FLOPs and role.

    Columns: ``name, pid, tid, start_ns, end_ns, input_dims, flops`` (float,
    NaN when the shapes are missing or inconsistent), ``shape_error`` (why
    the FLOPs are unknown, else None), ``parent`` (position of the enclosing
    matmul-like op on the thread, -1 at top level), ``top_level``, ``leaf``
    (contains no other matmul-like op), ``counted`` (usable shapes and no
    enclosing op with usable shapes: the ops whose FLOPs a host-only count
    adds up; an op with inconsistent shapes falls back to its children),
    ``family`` (the FLOP table's: gemm, conv, attention), ``backward`` (a
    backward op of the table, or inside an autograd backward range and not
    recompute), ``recompute`` (a forward op run during backward, or inside
    one: activation checkpointing), ``stopped`` (a recompute op that
    checkpointing's early stop cut off before it computed: no FLOPs),
    ``dtype`` (bf16, fp16,
    fp32, fp64, fp8 or None).
    """
    rows = is_in(events["name"], FLOP_OPS) & (events["kind"] == "cpu_op").to_numpy()
    cols = ["name", "pid", "tid", "start_ns", "end_ns", "input_dims", "input_types"]
    ops = events.loc[rows, cols + ["concrete_inputs"] if "concrete_inputs" in events.columns else cols]
    if "concrete_inputs" not in ops.columns:
        ops = ops.assign(concrete_inputs=None)
    ops = ops.assign(name=[str(n) for n in ops["name"]]).reset_index(drop=True)
    if ops.empty:
        return ops.assign(
            flops=np.float64(0),
            shape_error=None,
            parent=np.int64(-1),
            top_level=True,
            leaf=True,
            counted=True,
            family=None,
            backward=False,
            recompute=False,
            stopped=False,
            dtype=None,
        ).drop(columns=["input_types", "concrete_inputs"])
    # Formulas once per distinct (name, dims, scalar arguments) triple.
    keys = ops[["name", "input_dims", "concrete_inputs"]].astype(object).fillna("")
    uniq = keys.drop_duplicates()
    lookup = {
        (n, d, c): _flops_or_error(n, d or None, c or None)
        for n, d, c in zip(uniq["name"], uniq["input_dims"], uniq["concrete_inputs"])
    }
    found = [lookup[k] for k in zip(keys["name"], keys["input_dims"], keys["concrete_inputs"])]
    flops = np.array([f for f, _ in found], dtype=np.float64)
    errors = np.array([e for _, e in found], dtype=object)
    types = ops["input_types"].astype(object)
    type_lookup = {t: _dtype_of(t) for t in types.dropna().unique()}
    dtype = types.map(lambda t: type_lookup.get(t) if t is not None else None)
    parent = _parent_positions(ops)
    backward, recompute, stopped = _passes(events, ops)
    valid = ~np.isnan(flops)
    has_child = np.zeros(len(ops), dtype=bool)
    has_child[parent[parent >= 0]] = True
    return pd.DataFrame(
        {
            "name": ops["name"],
            "pid": ops["pid"].to_numpy(),
            "tid": ops["tid"].to_numpy(),
            "start_ns": ops["start_ns"].to_numpy(np.int64),
            "end_ns": ops["end_ns"].to_numpy(np.int64),
            "input_dims": ops["input_dims"].astype(object).to_numpy(),
            "flops": flops,
            "shape_error": errors,
            "parent": parent,
            "top_level": parent < 0,
            "leaf": ~has_child,
            "counted": valid & ~below_flagged(parent, valid),
            "family": [FLOP_TABLE[n].family for n in ops["name"]],
            "backward": backward,
            "recompute": recompute,
            "stopped": stopped,
            "dtype": dtype.to_numpy(dtype=object),
        }
    )


def flop_kernels(events: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """The GEMM, attention and convolution kernels of one rank and the matmul op each is charged to.

    Each kernel (:data:`analyzer.metrics.taxonomy.FLOP_CLASSES`) is linked to
    the innermost matmul-like op around its launch call (correlation id, then
    the host op stack; :mod:`analyzer.metrics.launch`). It is charged to the
    innermost op with usable shapes on the way up from there (``account``):
    when ``aten::linear``'s recorded shapes are inconsistent but the
    ``aten::addmm`` that launched the kernel has good ones, the addmm; when
    the launching op's own shapes are missing, the enclosing op whose
    formula covers it. -1 when no op with usable shapes encloses the launch
    (compiled regions, CUDA-graph replays, ``record_shapes`` off).

    Columns: ``name, cls, start_ns, dur_ns, op`` (launching matmul op,
    position in ``ops``, or -1), ``account`` (-1 when the FLOPs are unknown),
    ``linked`` (the kernel has a launch call in the trace), ``precision``
    (``fp8``/``tf32`` when the kernel name says so, else None).
    """
    from analyzer.metrics.launch import launches, innermost_containing
    from analyzer.metrics.taxonomy import FLOP_CLASSES, kernel_precision, row_classes

    # The device rows' classes: every row's, classified once per table (taxonomy.row_classes).
    rows = is_in(events["kind"], ("compute", "comm"))
    device = events.loc[rows, ["name", "kind", "start_ns", "end_ns"]]
    cls = row_classes(events)[rows]
    sel = is_in(pd.Series(cls, dtype=object), FLOP_CLASSES)
    k = device.loc[sel]
    link = launches(events)
    pos = link.index.get_indexer(k.index)
    linked = pos >= 0
    op = np.full(len(k), -1, dtype=np.int64)
    if linked.any() and not ops.empty:
        ln = link.iloc[pos[linked]]
        op[linked] = innermost_containing(ops, ln["pid"].to_numpy(), ln["tid"].to_numpy(), ln["start_ns"].to_numpy())
    account = op.copy()
    if not ops.empty:
        valid = ~np.isnan(ops["flops"].to_numpy(np.float64))
        parent = ops["parent"].to_numpy(np.int64)
        # Walk up from the launching op to the first op with usable shapes.
        pending = (account >= 0) & ~valid[np.clip(account, 0, None)]
        while pending.any():
            account[pending] = parent[account[pending]]
            pending = (account >= 0) & ~valid[np.clip(account, 0, None)]
    return pd.DataFrame(
        {
            "name": text_map(k["name"], str),
            "cls": cls[sel],
            "start_ns": k["start_ns"].to_numpy(np.int64),
            "dur_ns": (k["end_ns"] - k["start_ns"]).to_numpy(np.int64),
            "op": op,
            "account": account,
            "linked": linked,
            "precision": text_map(k["name"], kernel_precision),
        },
        index=k.index,
    )


def charged_ops(ops: pd.DataFrame, kernels: pd.DataFrame) -> np.ndarray:
    """Boolean per op: its FLOPs count, each product once (kernel attribution).

    The ops kernels are charged to, minus those inside another charged op
    (whose formula already covers their product).
    """
    charged = np.zeros(len(ops), dtype=bool)
    acc = kernels["account"].to_numpy(np.int64)
    charged[acc[acc >= 0]] = True
    counted: np.ndarray = charged & ~below_flagged(ops["parent"].to_numpy(np.int64), charged)
    return counted


def dominant_dtype(ops: pd.DataFrame) -> str | None:
    """The dtype carrying most FLOPs among leaf matmul ops (the ones that run).

    Leaves, not top-level ops: under autocast ``aten::linear`` is recorded
    with fp32 inputs while the ``aten::addmm`` inside it runs in bf16.
    """
    leaves = ops.loc[ops["leaf"] & ops["dtype"].notna() & ops["flops"].notna()]
    if leaves.empty:
        return None
    weights = leaves.groupby("dtype")["flops"].sum()
    return str(weights.idxmax())
