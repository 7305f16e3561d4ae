"""Per-op efficiency against the roofline, from the attributed op shapes.

For every row of the attribution's ``shapes`` table (an op, forward or
backward, with one set of ``Input Dims`` / ``Input type``: the device time
of the kernels attributed to it and the number of op calls that launched
them, :mod:`analyzer.metrics.attribution`) whose op has a model here:

* ``flops``: FLOPs per call times calls. Forward: the matmul formulas of
  :func:`analyzer.metrics.matmul_flops.flops_of` (``torch.utils.flop_counter``'s:
  2 m k n per product; attention's Q K^T and P V), attention's discounted by
  :func:`causal_fraction` when its Concrete Inputs say ``is_causal`` (the
  row's ``causal``; unrecorded: unmasked, and a note says so). Backward rows (the kernels of
  the op's autograd node): 2x the forward FLOPs for a GEMM (the input and
  weight gradients are one product each of the forward's size) and 2.5x for
  attention (five products against the forward's two, FlashAttention-2,
  Dao 2023, section 3.1).
* ``bytes``: bytes moved per call times calls, each tensor read or written
  once (TraceLens's GEMM model, ``TraceLens/PerfModel/perf_model.py``):
  every tensor input (its element count times its dtype's size, bias
  included) plus the output (GEMM: the product's m x n per batch, counted
  once when ``mm``/``bmm`` record it as a third input, their ``out=`` form);
  attention: query, key, value and the output (the query's shape with the
  value's last dimension), no mask (TraceLens's SDPA model). Backward rows: 2x the
  forward's (the gradient of every tensor read and written once more).
* ``flop_per_byte`` (arithmetic intensity), ``achieved_flops_per_s`` and
  ``achieved_bytes_per_s`` over the rows' device time (the sum of their
  kernels' durations, not the host op's wall time).
* against the device's datasheet peaks (:mod:`analyzer.metrics.hardware`:
  dense FLOP/s of the row's dtype, HBM bandwidth): ``ridge_flop_per_byte``
  = peak FLOP/s / HBM bytes/s; ``bound`` is ``memory`` below the ridge and
  ``compute`` at or above it; ``efficiency_pct`` = achieved FLOP/s over the
  attainable min(peak FLOP/s, intensity x HBM bytes/s), which is achieved
  FLOP/s over peak FLOP/s for a compute-bound row and achieved bytes/s over
  the HBM bandwidth for a memory-bound one.
* TF32: an fp32 row's peak is the ``tf32`` one when any of its op's kernels
  (the attribution's ``op_kernels``, same op and direction) ran on TF32 tensor
  cores, which the kernel name says: ``tf32`` in it (cuBLAS/cuDNN ``xmma``
  kernels) or CUTLASS's fp32-in tensor-op instruction shapes
  ``tensorop_s1688``/``s16816``, as the MFU's dtype reads it
  (:func:`analyzer.metrics.taxonomy.kernel_precision`). Such a row's
  ``dtype`` is ``tf32``. Against the fp32 (SIMT) peak an A100's TF32 addmm
  showed 120.9 %; any efficiency still above 100 % is named in ``notes``
  (the model's FLOPs or the peak table is wrong for that row), never passed
  silently.

The models cover the ops the loader keeps shapes for (GEMM family,
:data:`analyzer.ingest.tables.MATMUL_OPS`, and attention with its backends,
``ATTENTION_OPS``, whose rows hold every forward kernel launched under them);
a kernel attributed to an op without recorded shapes (elementwise ops, or a trace taken without ``record_shapes=True``)
is not on the roofline, and :attr:`Roofline.modeled_device_ms` against
:attr:`Roofline.shapes_device_ms` says how much of the device time is.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analyzer.ingest.schema import ATTENTION_OPS
from analyzer.metrics.hardware import datasheet_peak, hbm_peak
from analyzer.metrics.matmul_flops import ShapeError, flops_of
from analyzer.metrics.taxonomy import kernel_precision
from analyzer.metrics.text import text_map

# Element size and the peak table's dtype key of each Kineto "Input type" spelling.
_TYPES: dict[str, tuple[int, str | None]] = {
    "c10::BFloat16": (2, "bf16"),
    "c10::Half": (2, "fp16"),
    "float": (4, "fp32"),
    "double": (8, None),
    "c10::Float8_e4m3fn": (1, "fp8"),
    "c10::Float8_e5m2": (1, "fp8"),
    "c10::Float8_e4m3fnuz": (1, "fp8"),
    "c10::Float8_e5m2fnuz": (1, "fp8"),
    "long int": (8, None),
    "int": (4, None),
    "short int": (2, None),
    "signed char": (1, None),
    "unsigned char": (1, None),
    "bool": (1, None),
}
# Backward over forward (module docstring).
_BACKWARD_FLOPS = {"gemm": 2.0, "attention": 2.5}
_BACKWARD_BYTES = 2.0
_ATTENTION = "aten::scaled_dot_product_attention"
# Position of ``is_causal`` among each attention op's arguments (its ``Concrete Inputs``), from the ATen schemas:
# scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
# _scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, return_debug_mask, *, scale) and
# its _for_cpu twin (query, key, value, dropout_p, is_causal, *, attn_mask, scale);
# _scaled_dot_product_efficient_attention / _cudnn_attention(query, key, value, attn_bias, compute_log_sumexp,
# dropout_p, is_causal, ...).
_CAUSAL_ARG = {
    "aten::scaled_dot_product_attention": 5,
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_flash_attention_for_cpu": 4,
    "aten::_scaled_dot_product_efficient_attention": 6,
    "aten::_scaled_dot_product_cudnn_attention": 6,
}
# Where the first matrix operand sits (its last dimension is the product's inner dimension).
_FIRST_MATRIX = {"aten::mm": 0, "aten::addmm": 1, "aten::bmm": 0, "aten::baddbmm": 1, "aten::matmul": 0, "aten::linear": 0}

POINT_COLUMNS = ("op", "backward", "input_dims", "input_types", "concrete_inputs", "causal", "dtype", "calls", "device_ms", "flops", "bytes",
                 "flop_per_byte", "achieved_flops_per_s", "achieved_bytes_per_s", "peak_flops_per_s",
                 "ridge_flop_per_byte", "bound", "efficiency_pct")
OP_COLUMNS = ("op", "backward", "dtype", "calls", "device_ms", "flops", "bytes", "flop_per_byte",
              "achieved_flops_per_s", "achieved_bytes_per_s", "peak_flops_per_s", "ridge_flop_per_byte",
              "bound", "efficiency_pct")
ROOF_COLUMNS = ("dtype", "peak_flops_per_s", "ridge_flop_per_byte", "source")


@dataclass
class Roofline:
    """:func:`roofline`'s answer (module docstring for every definition).

    ``points``: one row per modeled (op, backward, input_dims, input_types, concrete_inputs)
    (:data:`POINT_COLUMNS`); ``ops``: the points summed per (op, backward)
    (FLOPs, bytes, calls and device time added, then the rates and the bound
    of the sums; ``dtype`` the one of most device time); ``roofs``: one row
    per dtype of the points whose peak is known (compute roof and ridge).
    ``hbm_bytes_per_s`` and ``hbm_source``: the memory roof (None: device
    unknown). ``shapes_device_ms``: device time of every shapes row;
    ``modeled_device_ms``: of the points. ``notes``: why something is
    missing (no shapes, no peaks, rows whose shapes did not fit the op).
    """

    points: pd.DataFrame
    ops: pd.DataFrame
    roofs: pd.DataFrame
    device_name: str | None = None
    hbm_bytes_per_s: float | None = None
    hbm_source: str | None = None
    shapes_device_ms: float = 0.0
    modeled_device_ms: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The report's ``roofline`` block (schema ``analyzer.roofline/1``): the per-op rows and the roofs;
        the per-shape points stay in the API (``RunAnalysis.roofline().points``)."""
        return {"schema": "analyzer.roofline/1", "device_name": self.device_name,
                "hbm_bytes_per_s": self.hbm_bytes_per_s, "hbm_source": self.hbm_source,
                "shapes_device_ms": self.shapes_device_ms, "modeled_device_ms": self.modeled_device_ms,
                "ops": self.ops.to_dict("records"), "roofs": self.roofs.to_dict("records"), "notes": list(self.notes)}


def _empty(columns: tuple[str, ...]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


def _numel(dims: object) -> int:
    if not isinstance(dims, list) or not all(isinstance(d, int) for d in dims):
        return 0
    return math.prod(dims)


def causal_fraction(seq_q: int, seq_k: int) -> float:
    """Share of the ``seq_q x seq_k`` score matrix a causal mask keeps, as an area: PyTorch's ``is_causal``
    mask is top-left aligned (query i sees keys 0..i), so ``seq_q / (2 seq_k)`` when ``seq_q <= seq_k``
    and ``1 - seq_k / (2 seq_q)`` otherwise; 1/2 for a square matrix, the convention of FlashAttention's
    and TraceLens's FLOP counts (module docstring)."""
    if seq_q <= 0 or seq_k <= 0:
        raise ShapeError(f"attention: empty sequence ({seq_q} x {seq_k})")
    return seq_q / (2 * seq_k) if seq_q <= seq_k else 1.0 - seq_k / (2 * seq_q)


def is_causal(op: str, concrete: list[Any] | None) -> bool | None:
    """The ``is_causal`` argument of an attention op from its ``Concrete Inputs``; None: not recorded."""
    i = _CAUSAL_ARG.get(op)
    if i is None or not concrete or i >= len(concrete):
        return None
    text = str(concrete[i]).strip()
    return True if text == "True" else False if text == "False" else None


def _attention_per_call(op: str, dims: list[Any], types: list[Any],
                        concrete: list[Any] | None) -> tuple[float, float, str | None, bool | None]:
    if len(dims) < 3 or not all(isinstance(d, list) and d and all(isinstance(x, int) for x in d) for d in dims[:3]):
        raise ShapeError(f"{op}: query, key and value shapes not recorded")
    q, k, v = dims[0], dims[1], dims[2]
    causal = is_causal(op, concrete)
    flops = float(flops_of(_ATTENTION, [q, k, v]))  # ShapeError for shapes that do not fit
    if causal:
        flops *= causal_fraction(int(q[-2]), int(k[-2]))
    elem, dtype = _TYPES.get(types[0], (0, None)) if types and isinstance(types[0], str) else (0, None)
    if elem == 0:
        raise ShapeError(f"{op}: unknown element type {types[0] if types else None!r}")
    # Query, key, value read and the output (the query's shape with the value's last dimension) written once;
    # a mask or bias tensor is not counted (TraceLens's SDPA model).
    numel = _numel(q) + _numel(k) + _numel(v) + _numel(q[:-1]) * int(v[-1])
    return flops, float(numel * elem), dtype, causal


def per_call(op: str, dims: list[Any], types: list[Any],
             concrete: list[Any] | None = None) -> tuple[float, float, str | None, bool | None]:
    """(FLOPs, bytes, dtype key, causal) of one forward call of a modeled op; ShapeError when the dims do not fit.

    GEMMs: every tensor input once at its dtype's size, plus the output at the
    first input's size; attention (ATTENTION_OPS): query, key, value and
    output, FLOPs discounted by :func:`causal_fraction` where ``concrete``
    (the op's ``Concrete Inputs``) says ``is_causal`` (module docstring).
    ``causal``: None for GEMMs and for attention without a recorded
    ``is_causal``. Ops without a model raise ShapeError.
    """
    if op in ATTENTION_OPS:
        return _attention_per_call(op, dims, types, concrete)
    if op not in _FIRST_MATRIX:
        raise ShapeError(f"{op}: no roofline model")
    flops = float(flops_of(op, dims))  # raises ShapeError for shapes it cannot count
    sizes = [_TYPES.get(t, (0, None)) if isinstance(t, str) else (0, None) for t in types]
    tensors = [i for i, d in enumerate(dims) if isinstance(d, list) and d]
    if not tensors:
        raise ShapeError(f"{op}: no tensor inputs")
    first = _FIRST_MATRIX[op]
    a = dims[first]
    k = int(a[-1])
    out_numel = int(flops // (2 * k)) if k else 0
    elem = sizes[first][0] if first < len(sizes) else 0
    if elem == 0:
        raise ShapeError(f"{op}: unknown element type {types[first] if first < len(types) else None!r}")
    in_bytes = sum(_numel(dims[i]) * (sizes[i][0] if i < len(sizes) and sizes[i][0] else elem) for i in tensors)
    # mm(a, b, out=c) / bmm(..., out=c) record the output as a third input: it is written once, not twice.
    out_given = op in ("aten::mm", "aten::bmm") and len(dims) > 2 and _numel(dims[2]) == out_numel
    dtype = sizes[first][1] if first < len(sizes) else None
    return flops, float(in_bytes + (0 if out_given else out_numel * elem)), dtype, None


def _rates(frame: pd.DataFrame, hbm: float | None) -> pd.DataFrame:
    seconds = frame["device_ms"].to_numpy(np.float64) / 1e3
    flops, nbytes = frame["flops"].to_numpy(np.float64), frame["bytes"].to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        frame["flop_per_byte"] = np.where(nbytes > 0, flops / nbytes, np.nan)
        frame["achieved_flops_per_s"] = np.where(seconds > 0, flops / seconds, np.nan)
        frame["achieved_bytes_per_s"] = np.where(seconds > 0, nbytes / seconds, np.nan)
        peak = frame["peak_flops_per_s"].to_numpy(np.float64)
        if hbm:
            ridge = peak / hbm
            intensity = frame["flop_per_byte"].to_numpy(np.float64)
            attainable = np.minimum(peak, intensity * hbm)
            frame["ridge_flop_per_byte"] = ridge
            known = np.isfinite(ridge) & np.isfinite(intensity)
            bound = np.where(intensity >= ridge, "compute", "memory").astype(object)
            bound[~known] = None
            frame["bound"] = pd.Series(bound, index=frame.index)
            frame["efficiency_pct"] = np.where(known & (attainable > 0),
                                               100.0 * frame["achieved_flops_per_s"].to_numpy(np.float64) / attainable, np.nan)
        else:
            frame["ridge_flop_per_byte"] = np.nan
            frame["bound"] = pd.Series([None] * len(frame), index=frame.index, dtype=object)
            frame["efficiency_pct"] = np.nan
    return frame


def _tf32_ops(op_kernels: pd.DataFrame | None) -> set[tuple[str, bool]]:
    """The (op, backward) pairs with a kernel that ran on TF32 tensor cores (its name says so, as for the MFU's dtype:
    :func:`analyzer.metrics.taxonomy.kernel_precision`);
    ``op_kernels`` as :attr:`analyzer.metrics.attribution.RunAttribution.op_kernels` (None or empty: none)."""
    if op_kernels is None or not len(op_kernels):
        return set()
    hit = text_map(op_kernels["kernel"], kernel_precision) == "tf32"
    sub = op_kernels.loc[hit, ["op", "backward"]]
    return {(str(o), bool(b)) for o, b in sub.drop_duplicates().itertuples(index=False)}


def roofline(shapes: pd.DataFrame, device_name: str | None = None,
             op_kernels: pd.DataFrame | None = None) -> Roofline:
    """Each modeled shapes row on the device's roofline (module docstring); ``shapes`` as
    :attr:`analyzer.metrics.attribution.RunAttribution.shapes` (one rank's rows, or summed over ranks:
    calls and device time add, so the rates are those of the sums); ``op_kernels`` (the attribution's
    table of the same rows) decides the TF32 peak of fp32 rows, None: the fp32 peak."""
    notes: list[str] = []
    total_ms = float(shapes["device_ms"].sum()) if len(shapes) else 0.0
    hbm = hbm_peak(device_name) if device_name else None
    if not len(shapes):
        notes.append("no device kernels attributed to ops with recorded input shapes (a CPU-only trace, "
                     "or one taken without record_shapes=True)")
        return Roofline(_empty(POINT_COLUMNS), _empty(OP_COLUMNS), _empty(ROOF_COLUMNS), device_name,
                        None if hbm is None else hbm.bytes_per_s, None if hbm is None else hbm.source, 0.0, 0.0, notes)
    if "calls" not in shapes.columns:
        raise ValueError("the shapes table has no calls column (a rank summary from before MAP_VERSION 7)")
    rows = []
    tf32 = _tf32_ops(op_kernels)
    unfit: dict[str, int] = {}
    cache: dict[tuple[str, str, str, str], tuple[float, float, str | None, bool | None] | None] = {}
    # Summaries from before MAP_VERSION 10 have no concrete_inputs column: no is_causal known.
    concrete_col = shapes["concrete_inputs"] if "concrete_inputs" in shapes.columns else pd.Series("", index=shapes.index)
    uncausal: dict[str, int] = {}
    for op, backward, dims_json, types_json, concrete_json, calls, device_ms in zip(
            shapes["op"], shapes["backward"], shapes["input_dims"], shapes["input_types"], concrete_col,
            shapes["calls"], shapes["device_ms"]):
        key = (str(op), str(dims_json), str(types_json), str(concrete_json))
        if key not in cache:
            try:
                cache[key] = per_call(str(op), json.loads(dims_json), json.loads(types_json) if types_json else [],
                                      json.loads(concrete_json) if concrete_json else None)
            except (ShapeError, ValueError, TypeError, IndexError, KeyError):
                cache[key] = None
        got = cache[key]
        if got is None:
            unfit[str(op)] = unfit.get(str(op), 0) + 1
            continue
        f, b, dtype, causal = got
        if dtype == "fp32" and (str(op), bool(backward)) in tf32:
            dtype = "tf32"
        attention = str(op) in ATTENTION_OPS
        if attention and causal is None:
            uncausal[str(op)] = uncausal.get(str(op), 0) + 1
        scale_f = _BACKWARD_FLOPS["attention" if attention else "gemm"] if backward else 1.0
        scale_b = _BACKWARD_BYTES if backward else 1.0
        rows.append({"op": str(op), "backward": bool(backward), "input_dims": str(dims_json),
                     "input_types": str(types_json) if types_json is not None else "",
                     "concrete_inputs": str(concrete_json) if concrete_json is not None else "", "causal": causal,
                     "dtype": dtype,
                     "calls": int(calls), "device_ms": float(device_ms),
                     "flops": f * scale_f * int(calls), "bytes": b * scale_b * int(calls)})
    if uncausal:
        notes.append("attention without a recorded is_causal (no Concrete Inputs) counted unmasked, an upper bound "
                     "on its FLOPs: " + ", ".join(f"{op} ({n} shape(s))" for op, n in sorted(uncausal.items())))
    if unfit:
        notes.append("not on the roofline (no model, or shapes that do not fit the op): "
                     + ", ".join(f"{op} ({n} shape(s))" for op, n in sorted(unfit.items())))
    roofs = []
    peaks: dict[str | None, float] = {}
    for dtype in sorted({str(r["dtype"]) for r in rows if r["dtype"]}):
        tp = datasheet_peak(device_name, dtype) if device_name else None
        if tp is not None:
            peaks[dtype] = tp.per_s
            roofs.append({"dtype": dtype, "peak_flops_per_s": tp.per_s,
                          "ridge_flop_per_byte": tp.per_s / hbm.bytes_per_s if hbm else np.nan, "source": tp.detail})
    if not device_name:
        notes.append("device unknown (no deviceProperties in the trace): no peaks, so no bound or efficiency")
    elif hbm is None or not roofs:
        notes.append(f"no datasheet peaks for '{device_name}' in the peak table (analyzer.metrics.hardware): "
                     "no bound or efficiency")
    if not rows:
        return Roofline(_empty(POINT_COLUMNS), _empty(OP_COLUMNS), pd.DataFrame(roofs, columns=list(ROOF_COLUMNS)),
                        device_name, None if hbm is None else hbm.bytes_per_s, None if hbm is None else hbm.source,
                        total_ms, 0.0, notes)
    points = pd.DataFrame(rows)
    points["peak_flops_per_s"] = [peaks.get(d, np.nan) for d in points["dtype"]]
    hbm_bps = hbm.bytes_per_s if hbm else None
    points = _rates(points, hbm_bps)[list(POINT_COLUMNS)]
    points = points.sort_values(["device_ms", "op"], ascending=[False, True], kind="stable").reset_index(drop=True)
    # Per op: sums, the dtype with the most device time, then the same rates over the sums.
    grouped = points.groupby(["op", "backward"], sort=False)
    ops = grouped[["calls", "device_ms", "flops", "bytes"]].sum().reset_index()
    main_dtype = (points.assign(d=points["dtype"].fillna(""))
                  .groupby(["op", "backward", "d"], sort=False)["device_ms"].sum().reset_index()
                  .sort_values("device_ms", ascending=False, kind="stable").drop_duplicates(["op", "backward"]))
    ops = ops.merge(main_dtype[["op", "backward", "d"]], on=["op", "backward"], how="left")
    ops["dtype"] = ops.pop("d").replace("", None)
    ops["peak_flops_per_s"] = [peaks.get(d, np.nan) for d in ops["dtype"]]
    ops = _rates(ops, hbm_bps)[list(OP_COLUMNS)]
    ops = ops.sort_values(["device_ms", "op"], ascending=[False, True], kind="stable").reset_index(drop=True)
    over = ops.loc[ops["efficiency_pct"].to_numpy(np.float64) > 100.0]
    if len(over):
        notes.append("efficiency over 100 % (the FLOPs model or the peak table is wrong for these rows): "
                     + ", ".join(f"{o}{' bwd' if b else ''} {d} {e:.1f} %" for o, b, d, e in
                                 over[["op", "backward", "dtype", "efficiency_pct"]].itertuples(index=False)))
    return Roofline(points, ops, pd.DataFrame(roofs, columns=list(ROOF_COLUMNS)), device_name, hbm_bps,
                    None if hbm is None else hbm.source, total_ms, float(points["device_ms"].sum()), notes)
