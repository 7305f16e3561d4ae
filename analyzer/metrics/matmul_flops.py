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

Only *top-level* matmul-like ops count: ``aten::linear`` calls
``aten::addmm`` or ``aten::matmul`` underneath, ``aten::matmul`` calls
``aten::mm``/``aten::bmm``; an op nested (by time containment on the same
thread) inside another matmul-like op is skipped, so each product is
counted once. Backward matmuls (the ``aten::mm`` calls under
``autograd::engine::evaluate_function: AddmmBackward0``) are top-level
matmul ops of their own and count as recorded.

Shapes repeat every step, so formulas run once per distinct
``(name, Input Dims)`` pair, not once per event.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from analyzer.metrics.intervals import union
from analyzer.metrics.text import is_in, text_mask
from analyzer.tables import MATMUL_OPS

# Backward regions: every autograd node runs inside one of these ranges.
BACKWARD_PREFIX = "autograd::engine::evaluate_function"

# Input-type spellings in Kineto's "Input type" -> dtype family of the peak table.
_DTYPES = {
    "c10::BFloat16": "bf16",
    "c10::Half": "fp16",
    "float": "fp32",
    "double": "fp64",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
}


def _prod(dims: list[int]) -> int:
    return math.prod(int(d) for d in dims)


def _matmul(a: list[int], b: list[int]) -> int:
    """FLOPs of torch.matmul(a, b) for the shapes it accepts (broadcast batch dims)."""
    if len(a) == 0 or len(b) == 0:
        raise ValueError("scalar operand")
    if len(a) == 1 and len(b) == 1:
        return 2 * a[0]
    if len(b) == 1:  # [..., m, k] @ [k]
        return 2 * _prod(a[:-1]) * a[-1]
    if len(a) == 1:  # [k] @ [..., k, n]
        return 2 * _prod(b[:-2]) * b[-2] * b[-1]
    m, k, n = a[-2], a[-1], b[-1]
    batch_a, batch_b = a[:-2], b[:-2]
    width = max(len(batch_a), len(batch_b))
    batch_a = [1] * (width - len(batch_a)) + list(batch_a)
    batch_b = [1] * (width - len(batch_b)) + list(batch_b)
    batch = math.prod(max(x, y) for x, y in zip(batch_a, batch_b))
    return 2 * batch * m * k * n


def flops_of(name: str, dims: list[list[int]]) -> int:
    """FLOPs of one matmul-like op from its recorded input dims (see module table).

    Raises ValueError when the dims do not fit the op (missing or malformed
    shapes); callers count such ops as unknown.
    """
    if name == "aten::mm":
        (m, k), (_, n) = dims[0], dims[1]
        return 2 * m * k * n
    if name == "aten::addmm":
        (m, k), (_, n) = dims[1], dims[2]
        return 2 * m * k * n
    if name == "aten::bmm":
        (b, m, k), (_, _, n) = dims[0], dims[1]
        return 2 * b * m * k * n
    if name == "aten::baddbmm":
        (b, m, k), (_, _, n) = dims[1], dims[2]
        return 2 * b * m * k * n
    if name == "aten::matmul":
        return _matmul(dims[0], dims[1])
    if name == "aten::linear":
        x, w = dims[0], dims[1]
        if len(x) == 0 or len(w) != 2:
            raise ValueError("linear needs input [..., k] and weight [n, k]")
        return 2 * _prod(x[:-1]) * x[-1] * w[0]
    if name == "aten::scaled_dot_product_attention":
        q, k, v = dims[0], dims[1], dims[2]
        if len(q) < 2 or len(k) < 2 or len(v) < 2:
            raise ValueError("attention needs [..., L, E] operands")
        batch, seq_q, seq_k = _prod(q[:-2]), q[-2], k[-2]
        return 2 * batch * seq_q * seq_k * q[-1] + 2 * batch * seq_q * seq_k * v[-1]
    raise ValueError(f"not a matmul-like op: {name}")


def _flops_or_nan(name: str, dims_json: str | None) -> float:
    if dims_json is None:
        return float("nan")
    try:
        return float(flops_of(name, json.loads(dims_json)))
    except (ValueError, TypeError, IndexError, KeyError, json.JSONDecodeError):
        return float("nan")


def _dtype_of(types_json: str | None) -> str | None:
    """The dtype family of an op's tensor inputs (first recognised type)."""
    if types_json is None:
        return None
    try:
        types = json.loads(types_json)
    except (TypeError, json.JSONDecodeError):
        return None
    for t in types:
        if isinstance(t, str) and t in _DTYPES:
            return _DTYPES[t]
    return None


def _nesting(ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(nested, has_child) per row of ``ops`` (matmul ops, any order), by containment per thread.

    Host ops on one thread nest like a call stack, so after sorting by
    (thread, start, longest first) an op is nested in an earlier matmul op
    iff the running maximum of earlier ends lies beyond its start, and it has a
    matmul child iff the next op on its thread starts before it ends.
    """
    order = np.lexsort((-ops["end_ns"].to_numpy(), ops["start_ns"].to_numpy(), ops["tid"].to_numpy(), ops["pid"].to_numpy()))
    pid = ops["pid"].to_numpy()[order]
    tid = ops["tid"].to_numpy()[order]
    start = ops["start_ns"].to_numpy(np.int64)[order]
    end = ops["end_ns"].to_numpy(np.int64)[order]
    n = len(order)
    new_thread = np.ones(n, dtype=bool)
    new_thread[1:] = (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])
    thread_id = np.cumsum(new_thread)
    run_max = pd.Series(end).groupby(thread_id).cummax().to_numpy(np.int64)
    prev_max = np.empty(n, dtype=np.int64)
    prev_max[:1] = np.iinfo(np.int64).min
    prev_max[1:] = run_max[:-1]
    nested_sorted = ~new_thread & (prev_max > start)
    last_in_thread = np.ones(n, dtype=bool)
    last_in_thread[:-1] = new_thread[1:]
    has_child_sorted = np.zeros(n, dtype=bool)
    has_child_sorted[:-1] = ~last_in_thread[:-1] & (start[1:] < end[:-1])
    nested = np.empty(n, dtype=bool)
    has_child = np.empty(n, dtype=bool)
    nested[order] = nested_sorted
    has_child[order] = has_child_sorted
    return nested, has_child


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


def matmul_ops(events: pd.DataFrame) -> pd.DataFrame:
    """Matmul-like host ops of one rank with their FLOPs and role.

    Columns: ``name, pid, tid, start_ns, end_ns, flops`` (float, NaN when the
    shapes are missing or malformed), ``top_level`` (not nested in another
    matmul-like op), ``leaf`` (contains no other matmul-like op),
    ``backward`` (inside an autograd backward range), ``dtype`` (bf16, fp16,
    fp32, fp64, fp8 or None).
    """
    rows = is_in(events["name"], MATMUL_OPS) & (events["kind"] == "cpu_op").to_numpy()
    ops = events.loc[rows, ["name", "pid", "tid", "start_ns", "end_ns", "input_dims", "input_types"]]
    ops = ops.assign(name=[str(n) for n in ops["name"]]).reset_index(drop=True)
    if ops.empty:
        return ops.assign(flops=np.float64(0), top_level=True, leaf=True, backward=False, dtype=None).drop(columns=["input_dims", "input_types"])
    # Formulas once per distinct (name, dims) pair.
    keys = ops[["name", "input_dims"]].astype(object).fillna("")
    uniq = keys.drop_duplicates()
    uniq_flops = [_flops_or_nan(n, d or None) for n, d in zip(uniq["name"], uniq["input_dims"])]
    lookup = dict(zip(zip(uniq["name"], uniq["input_dims"]), uniq_flops))
    flops = np.array([lookup[k] for k in zip(keys["name"], keys["input_dims"])], dtype=np.float64)
    types = ops["input_types"].astype(object)
    type_lookup = {t: _dtype_of(t) for t in types.dropna().unique()}
    dtype = types.map(lambda t: type_lookup.get(t) if t is not None else None)
    nested, has_child = _nesting(ops)
    return pd.DataFrame(
        {
            "name": ops["name"],
            "pid": ops["pid"].to_numpy(),
            "tid": ops["tid"].to_numpy(),
            "start_ns": ops["start_ns"].to_numpy(np.int64),
            "end_ns": ops["end_ns"].to_numpy(np.int64),
            "flops": flops,
            "top_level": ~nested,
            "leaf": ~has_child,
            "backward": _inside_backward(events, ops),
            "dtype": dtype.to_numpy(dtype=object),
        }
    )


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
