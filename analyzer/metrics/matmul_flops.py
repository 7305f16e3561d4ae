"""FLOPs of matmul-like host ops from the shapes the profiler recorded.

Used for MFU on traces that come without a manifest (docs/metrics.md,
"MFU from trace shapes"). One multiply-accumulate is 2 FLOPs; the formulas
follow ``torch.utils.flop_counter`` (bias additions and softmax are not
counted):

==================================== ==========================================
op (``args["Input Dims"]``)          FLOPs
==================================== ==========================================
mm(A[m,k], B[k,n])                   2 m k n
addmm(bias, A[m,k], B[k,n])          2 m k n
bmm(A[b,m,k], B[b,k,n])              2 b m k n
baddbmm(C, A[b,m,k], B[b,k,n])       2 b m k n
matmul(A[...,m,k], B[...,k,n])       2 prod(broadcast batch) m k n (1-D operands
                                     as in ``torch.matmul``)
linear(X[...,k], W[n,k], bias)       2 prod(X[:-1]) k n
scaled_dot_product_attention(        2 prod(Q[:-2]) L S E + 2 prod(Q[:-2]) L S Ev
  Q[...,L,E], K[...,S,E], V[...,S,Ev])  (Q K^T and P V; a causal mask is not
                                     discounted, as in torch's counter)
==================================== ==========================================

Shapes are validated as the op itself would check them (inner dimensions
equal, batch dims and bias broadcastable, operands of the rank the op
needs): a trace has been seen recording ``aten::linear`` with x=[2048,160,606]
and w=[2048,3906], which the old count took as 8.13e11 FLOPs where the
``aten::addmm`` inside it (``[[3906],[2048,512],[512,3906]]``) does 8.19e9.

Each product is counted once, two ways (:func:`flop_kernels` says which
applies, see :mod:`analyzer.metrics.mfu`):

* **kernel attribution** (device traces whose kernels link to their
  launches): each GEMM/attention/convolution kernel is charged to the
  innermost matmul-like op around its launch that has usable shapes;
  an op counts once however many kernels it launched, and an op inside a
  charged op does not count again;
* **host ops only** (no linked kernels): the outermost ops with usable
  shapes count (``aten::linear`` covers the ``aten::addmm`` or
  ``aten::matmul`` inside it); an op with inconsistent shapes falls back to
  its children. Backward matmuls (the ``aten::mm`` calls under
  ``autograd::engine::evaluate_function: AddmmBackward0``) are top-level
  matmul ops of their own and count as recorded.

Shapes repeat every step, so formulas run once per distinct
``(name, Input Dims)`` pair, not once per event.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from analyzer.metrics.dtypes import float_key
from analyzer.metrics.intervals import union
from analyzer.metrics.nesting import below_flagged, nest, thread_keys
from analyzer.metrics.text import is_in, text_map, text_mask
from analyzer.ingest.tables import CONV_OPS, FLOP_OPS, MATMUL_OPS  # noqa: F401 - MATMUL_OPS re-exported

# Backward regions: every autograd node runs inside one of these ranges.
BACKWARD_PREFIX = "autograd::engine::evaluate_function"


class ShapeError(ValueError):
    """The recorded dims do not fit the op (wrong rank, inner dimensions disagree, batch not broadcastable)."""


def _prod(dims: list[int]) -> int:
    return math.prod(int(d) for d in dims)


def _shape(dims: object, ndim: int | None = None, what: str = "operand") -> list[int]:
    """A recorded shape as a list of non-negative ints, optionally of exactly ``ndim`` dims."""
    if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise ShapeError(f"{what} is not a shape: {dims!r}")
    if ndim is not None and len(dims) != ndim:
        raise ShapeError(f"{what} has {len(dims)} dims, needs {ndim}: {dims}")
    return dims


def _inner(k1: int, k2: int, a: list[int], b: list[int]) -> None:
    if k1 != k2:
        raise ShapeError(f"inner dimensions disagree: {a} x {b}")


def _broadcast(a: list[int], b: list[int]) -> list[int]:
    """Broadcast shape of two batch shapes (torch/numpy rules: right-aligned, equal or 1)."""
    width = max(len(a), len(b))
    a = [1] * (width - len(a)) + list(a)
    b = [1] * (width - len(b)) + list(b)
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise ShapeError(f"batch dims do not broadcast: {a} vs {b}")
        out.append(max(x, y))
    return out


def _bias_fits(bias: object, out: list[int]) -> None:
    """An additive operand (bias, baddbmm's input) must broadcast to the output shape."""
    if bias is None or bias == []:
        return  # absent (None) or a scalar / undefined optional
    shape = _shape(bias, what="bias")
    if len(shape) > len(out) or _broadcast(shape, out) != list(out):
        raise ShapeError(f"bias {shape} does not broadcast to the output {out}")


def _matmul(a: object, b: object) -> int:
    """FLOPs of torch.matmul(a, b) for the shapes it accepts (broadcast batch dims)."""
    a, b = _shape(a, what="input"), _shape(b, what="other")
    if len(a) == 0 or len(b) == 0:
        raise ShapeError("scalar operand")
    if len(a) == 1 and len(b) == 1:
        _inner(a[0], b[0], a, b)
        return 2 * a[0]
    if len(b) == 1:  # [..., m, k] @ [k]
        _inner(a[-1], b[0], a, b)
        return 2 * _prod(a[:-1]) * a[-1]
    if len(a) == 1:  # [k] @ [..., k, n]
        _inner(a[0], b[-2], a, b)
        return 2 * _prod(b[:-2]) * b[-2] * b[-1]
    m, k, n = a[-2], a[-1], b[-1]
    _inner(k, b[-2], a, b)
    batch = _prod(_broadcast(a[:-2], b[:-2]))
    return 2 * batch * m * k * n


def _arg(dims: Sequence[object], i: int) -> object:
    return dims[i] if i < len(dims) else None


def flops_of(name: str, dims: list[list[int]]) -> int:
    """FLOPs of one matmul-like op from its recorded input dims (see module table).

    Validates the shapes as the op itself would: 2-D/3-D operands where the
    op needs them, inner dimensions equal, batch dims and bias broadcastable.
    Raises :class:`ShapeError` (a ValueError) when the dims do not fit the op;
    callers then count the op's children instead, or the op as unknown.
    """
    if not isinstance(dims, list):
        raise ShapeError(f"Input Dims is not a list: {dims!r}")
    if name == "aten::mm":
        (m, k), (k2, n) = _shape(_arg(dims, 0), 2, "self"), _shape(_arg(dims, 1), 2, "mat2")
        _inner(k, k2, dims[0], dims[1])
        return 2 * m * k * n
    if name == "aten::addmm":
        (m, k), (k2, n) = _shape(_arg(dims, 1), 2, "mat1"), _shape(_arg(dims, 2), 2, "mat2")
        _inner(k, k2, dims[1], dims[2])
        _bias_fits(dims[0], [m, n])
        return 2 * m * k * n
    if name == "aten::bmm":
        (b, m, k), (b2, k2, n) = _shape(_arg(dims, 0), 3, "self"), _shape(_arg(dims, 1), 3, "mat2")
        _inner(k, k2, dims[0], dims[1])
        if b != b2:
            raise ShapeError(f"bmm batch sizes disagree: {dims[0]} x {dims[1]}")
        return 2 * b * m * k * n
    if name == "aten::baddbmm":
        (b, m, k), (b2, k2, n) = _shape(_arg(dims, 1), 3, "batch1"), _shape(_arg(dims, 2), 3, "batch2")
        _inner(k, k2, dims[1], dims[2])
        if b != b2:
            raise ShapeError(f"baddbmm batch sizes disagree: {dims[1]} x {dims[2]}")
        _bias_fits(dims[0], [b, m, n])
        return 2 * b * m * k * n
    if name == "aten::matmul":
        return _matmul(_arg(dims, 0), _arg(dims, 1))
    if name == "aten::linear":
        x, w = _shape(_arg(dims, 0), what="input"), _shape(_arg(dims, 1), 2, "weight")
        if len(x) == 0:
            raise ShapeError("linear input is a scalar")
        n, k = w
        _inner(x[-1], k, x, w)
        _bias_fits(_arg(dims, 2), [*x[:-1], n])
        return 2 * _prod(x[:-1]) * k * n
    if name == "aten::scaled_dot_product_attention":
        q, key, v = (_shape(_arg(dims, i), what=w) for i, w in enumerate(("query", "key", "value")))
        if len(q) < 2 or len(key) < 2 or len(v) < 2:
            raise ShapeError("attention needs [..., L, E] operands")
        _inner(q[-1], key[-1], q, key)
        if key[-2] != v[-2]:
            raise ShapeError(f"key and value lengths disagree: {key} vs {v}")
        # Query's batch and heads: with grouped-query attention (enable_gqa) keys
        # and values have fewer heads than the query, so they are not broadcast.
        batch = _prod(q[:-2])
        seq_q, seq_k = q[-2], key[-2]
        return 2 * batch * seq_q * seq_k * q[-1] + 2 * batch * seq_q * seq_k * v[-1]
    raise ShapeError(f"not a matmul-like op: {name}")


def _flops_or_error(name: str, dims_json: str | None, concrete_json: str | None = None) -> tuple[float, str | None]:
    """(FLOPs, None) for usable dims; (NaN, why) for missing or inconsistent ones.

    Convolution ops (CONV_OPS) also need their ``Concrete Inputs``
    (:func:`analyzer.metrics.conv_flops.conv_flops`).
    """
    if dims_json is None:
        return float("nan"), "no recorded shapes"
    try:
        if name in CONV_OPS:
            from analyzer.metrics.conv_flops import conv_flops

            if concrete_json is None:
                return float("nan"), "no recorded Concrete Inputs (stride, padding, dilation, groups)"
            return float(conv_flops(name, json.loads(dims_json), json.loads(concrete_json))), None
        return float(flops_of(name, json.loads(dims_json))), None
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


def _inside_backward(events: pd.DataFrame, ops: pd.DataFrame) -> np.ndarray:
    """Per row of ``ops``: its start lies inside a backward range on the same thread."""
    bw = events.loc[text_mask(events["name"], lambda n: n.startswith(BACKWARD_PREFIX)), ["pid", "tid", "start_ns", "end_ns"]]
    inside = np.zeros(len(ops), dtype=bool)
    if bw.empty:
        return inside
    op_keys = ops[["pid", "tid"]].to_numpy()
    op_start = ops["start_ns"].to_numpy(np.int64)
    # One pass per thread that ran backward code (a handful), not per event.
    for (pid, tid), ranges in bw.groupby(["pid", "tid"], sort=False):
        s, e = union(ranges["start_ns"].to_numpy(np.int64), ranges["end_ns"].to_numpy(np.int64))
        rows = np.flatnonzero((op_keys[:, 0] == pid) & (op_keys[:, 1] == tid))
        if rows.size == 0:
            continue
        k = np.searchsorted(s, op_start[rows], side="right") - 1
        ok = k >= 0
        inside[rows[ok]] = op_start[rows[ok]] < e[k[ok]]
    return inside


def _parent_positions(ops: pd.DataFrame) -> np.ndarray:
    """Position of each op's innermost enclosing matmul op on its thread (-1 at top level)."""
    _, parent, _ = nest(thread_keys(ops["pid"].to_numpy(np.int64), ops["tid"].to_numpy(np.int64)),
                        ops["start_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64))
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
    ``backward`` (inside an autograd backward range), ``dtype`` (bf16, fp16,
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
            flops=np.float64(0), shape_error=None, parent=np.int64(-1), top_level=True, leaf=True, counted=True,
            backward=False, dtype=None,
        ).drop(columns=["input_types", "concrete_inputs"])
    # Formulas once per distinct (name, dims, scalar arguments) triple.
    keys = ops[["name", "input_dims", "concrete_inputs"]].astype(object).fillna("")
    uniq = keys.drop_duplicates()
    lookup = {(n, d, c): _flops_or_error(n, d or None, c or None)
              for n, d, c in zip(uniq["name"], uniq["input_dims"], uniq["concrete_inputs"])}
    found = [lookup[k] for k in zip(keys["name"], keys["input_dims"], keys["concrete_inputs"])]
    flops = np.array([f for f, _ in found], dtype=np.float64)
    errors = np.array([e for _, e in found], dtype=object)
    types = ops["input_types"].astype(object)
    type_lookup = {t: _dtype_of(t) for t in types.dropna().unique()}
    dtype = types.map(lambda t: type_lookup.get(t) if t is not None else None)
    parent = _parent_positions(ops)
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
            "backward": _inside_backward(events, ops),
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
