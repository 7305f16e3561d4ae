"""Per-op efficiency against the roofline, from the attributed op shapes.

For every row of the attribution's ``shapes`` table (an op, forward or
backward, with one set of ``Input Dims`` / ``Input type``: the device time
of the kernels attributed to it and the number of op calls that launched
them, :mod:`analyzer.metrics.attribution`) whose op has a model here:

* ``flops`` and ``bytes``: one forward call's FLOPs and bytes moved
  (:func:`analyzer.metrics.op_models.per_call`, whose docstring defines each
  family's model: GEMM, attention (causal counted in full), convolution,
  elementwise, reduction, softmax, normalization) times calls; ``family``
  names the model. Backward rows (the kernels of the op's autograd node):
  2x the forward FLOPs for a GEMM and a convolution (the input and weight
  gradients are one product each of the forward's size) and 2.5x for
  attention (five products against the forward's two, FlashAttention-2,
  Dao 2023, section 3.1); bytes 2x. The memory-bound families have no
  backward model (their gradient ops differ per op): their backward rows
  are left out, and ``notes`` says how many.
* ``flop_per_byte`` (arithmetic intensity), ``achieved_flops_per_s`` and
  ``achieved_bytes_per_s`` over the rows' device time (the sum of their
  kernels' durations, not the host op's wall time).
* against the device's datasheet peaks (:mod:`analyzer.metrics.hardware`:
  dense FLOP/s of the row's dtype, HBM bandwidth): ``ridge_flop_per_byte``
  = peak FLOP/s / HBM bytes/s; ``bound`` is ``memory`` below the ridge and
  ``compute`` at or above it, and always ``memory`` for the memory-bound
  families (:data:`analyzer.metrics.op_models.MEMORY_FAMILIES`: at most a few FLOPs per byte, and
  some, an int64 copy, have no FLOP peak at all); ``efficiency_pct`` is
  achieved FLOP/s over peak FLOP/s for a compute-bound row and achieved
  bytes/s over the HBM bandwidth for a memory-bound one (achieved FLOP/s
  over the attainable min(peak FLOP/s, intensity x HBM bytes/s)).
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

The models cover the ops the loader keeps shapes for
(:data:`analyzer.ingest.schema.SHAPE_OPS`: the GEMM family, convolution,
attention with its backends, whose rows hold every forward kernel launched
under them, and the memory-bound families); a kernel attributed to an op
without recorded shapes (an op outside those families, or a trace taken
without ``record_shapes=True``) is not on the roofline, and
:attr:`Roofline.modeled_device_ms` against :attr:`Roofline.shapes_device_ms`
says how much of the device time is.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analyzer.metrics.frames import empty_frame
from analyzer.metrics.hardware import MemoryPeak, datasheet_peak, hbm_peak
from analyzer.metrics.matmul_flops import ShapeError
from analyzer.metrics.op_models import BACKWARD_BYTES, BACKWARD_FLOPS, MEMORY_FAMILIES, CallCost, per_call
from analyzer.metrics.taxonomy import kernel_precision
from analyzer.metrics.text import text_map

POINT_COLUMNS = (
    "op",
    "family",
    "backward",
    "input_dims",
    "input_types",
    "concrete_inputs",
    "causal",
    "dtype",
    "calls",
    "device_ms",
    "flops",
    "bytes",
    "flop_per_byte",
    "achieved_flops_per_s",
    "achieved_bytes_per_s",
    "peak_flops_per_s",
    "ridge_flop_per_byte",
    "bound",
    "efficiency_pct",
)
OP_COLUMNS = (
    "op",
    "family",
    "backward",
    "dtype",
    "calls",
    "device_ms",
    "flops",
    "bytes",
    "flop_per_byte",
    "achieved_flops_per_s",
    "achieved_bytes_per_s",
    "peak_flops_per_s",
    "ridge_flop_per_byte",
    "bound",
    "efficiency_pct",
)
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
        return {
            "schema": "analyzer.roofline/1",
            "device_name": self.device_name,
            "hbm_bytes_per_s": self.hbm_bytes_per_s,
            "hbm_source": self.hbm_source,
            "shapes_device_ms": self.shapes_device_ms,
            "modeled_device_ms": self.modeled_device_ms,
            "ops": self.ops.to_dict("records"),
            "roofs": self.roofs.to_dict("records"),
            "notes": list(self.notes),
        }


def _rates(frame: pd.DataFrame, hbm: float | None) -> pd.DataFrame:
    seconds = frame["device_ms"].to_numpy(np.float64) / 1e3
    flops, nbytes = frame["flops"].to_numpy(np.float64), frame["bytes"].to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = np.where(nbytes > 0, flops / nbytes, np.nan)
        achieved_f = np.where(seconds > 0, flops / seconds, np.nan)
        achieved_b = np.where(seconds > 0, nbytes / seconds, np.nan)
        frame["flop_per_byte"] = intensity
        frame["achieved_flops_per_s"] = achieved_f
        frame["achieved_bytes_per_s"] = achieved_b
        peak = frame["peak_flops_per_s"].to_numpy(np.float64)
        if hbm:
            ridge = peak / hbm
            frame["ridge_flop_per_byte"] = ridge
            memory_family = frame["family"].isin(MEMORY_FAMILIES).to_numpy()
            compute = np.isfinite(ridge) & np.isfinite(intensity) & (intensity >= ridge) & ~memory_family
            # A memory-bound family is memory-bound without a compute peak too (an int64 copy, a bool mask):
            # its efficiency is the bytes/s against the HBM's, which needs no FLOP peak.
            memory = (np.isfinite(ridge) & np.isfinite(intensity) & ~compute) | (memory_family & (nbytes > 0))
            bound = np.full(len(frame), None, dtype=object)
            bound[compute] = "compute"
            bound[memory] = "memory"
            frame["bound"] = pd.Series(bound, index=frame.index)
            frame["efficiency_pct"] = np.where(
                compute, 100.0 * achieved_f / peak, np.where(memory, 100.0 * achieved_b / hbm, np.nan)
            )
        else:
            frame["ridge_flop_per_byte"] = np.nan
            frame["bound"] = pd.Series([None] * len(frame), index=frame.index, dtype=object)
            frame["efficiency_pct"] = np.nan
    return frame


def _per_op(points: pd.DataFrame) -> pd.DataFrame:
    """The points summed per (op, family, backward), in the points' order of first appearance: calls,
    device_ms, flops, bytes, and ``dtype``, the one with the most device time of the op's (op, backward)
    points (the first of equal ones; None for points without one).

    Plain Python over a few hundred points: two groupbys and a merge cost 6 ms of a cold report. Float
    sums are math.fsum's, correctly rounded (pandas' groupby adds with Kahan compensation instead,
    which can differ in the last bit)."""
    sums: dict[tuple[str, str, bool], tuple[list[int], list[float], list[float], list[float]]] = {}
    dtype_ms: dict[tuple[str, bool], dict[str | None, list[float]]] = {}
    for op, family, backward, dtype, calls, ms, flops, nbytes in zip(
        points["op"],
        points["family"],
        points["backward"],
        points["dtype"],
        points["calls"],
        points["device_ms"],
        points["flops"],
        points["bytes"],
    ):
        calls_, ms_, flops_, bytes_ = sums.setdefault((op, family, bool(backward)), ([], [], [], []))
        calls_.append(int(calls))
        ms_.append(ms)
        flops_.append(flops)
        bytes_.append(nbytes)
        # A point without a dtype holds NaN (pandas' missing text): None here, so the text shows "-".
        dtype_key = dtype if isinstance(dtype, str) and dtype else None
        dtype_ms.setdefault((op, bool(backward)), {}).setdefault(dtype_key, []).append(ms)
    main_dtype: dict[tuple[str, bool], str | None] = {}
    for key, by_dtype in dtype_ms.items():
        totals = {d: math.fsum(v) for d, v in by_dtype.items()}
        main_dtype[key] = max(totals, key=totals.__getitem__)  # max() keeps the first of equal totals
    keys = list(sums)
    return pd.DataFrame(
        {
            "op": [k[0] for k in keys],
            "family": [k[1] for k in keys],
            "backward": [k[2] for k in keys],
            "calls": np.array([sum(s[0]) for s in sums.values()], dtype=np.int64),
            "device_ms": np.array([math.fsum(s[1]) for s in sums.values()], dtype=np.float64),
            "flops": np.array([math.fsum(s[2]) for s in sums.values()], dtype=np.float64),
            "bytes": np.array([math.fsum(s[3]) for s in sums.values()], dtype=np.float64),
            "dtype": pd.Series([main_dtype[(k[0], k[2])] for k in keys], dtype=object),
        }
    )


def _tf32_ops(op_kernels: pd.DataFrame | None) -> set[tuple[str, bool]]:
    """The (op, backward) pairs with a kernel that ran on TF32 tensor cores (its name says so, as for the MFU's dtype:
    :func:`analyzer.metrics.taxonomy.kernel_precision`);
    ``op_kernels`` as :attr:`analyzer.metrics.attribution.RunAttribution.op_kernels` (None or empty: none)."""
    if op_kernels is None or not len(op_kernels):
        return set()
    hit = text_map(op_kernels["kernel"], kernel_precision) == "tf32"
    sub = op_kernels.loc[hit, ["op", "backward"]]
    return {(str(o), bool(b)) for o, b in sub.drop_duplicates().itertuples(index=False)}


def roofline(shapes: pd.DataFrame, device_name: str | None = None, op_kernels: pd.DataFrame | None = None) -> Roofline:
    """Each modeled shapes row on the device's roofline (module docstring); ``shapes`` as
    :attr:`analyzer.metrics.attribution.RunAttribution.shapes` (one rank's rows, or summed over ranks:
    calls and device time add, so the rates are those of the sums); ``op_kernels`` (the attribution's
    table of the same rows) decides the TF32 peak of fp32 rows, None: the fp32 peak."""
    notes: list[str] = []
    total_ms = float(shapes["device_ms"].sum()) if len(shapes) else 0.0
    hbm = hbm_peak(device_name) if device_name else None
    if not len(shapes):
        notes.append(
            "no device kernels attributed to ops with recorded input shapes (a CPU-only trace, "
            "or one taken without record_shapes=True)"
        )
        return Roofline(
            empty_frame(POINT_COLUMNS),
            empty_frame(OP_COLUMNS),
            empty_frame(ROOF_COLUMNS),
            device_name,
            None if hbm is None else hbm.bytes_per_s,
            None if hbm is None else hbm.source,
            0.0,
            0.0,
            notes,
        )
    rows, row_notes = _modeled_rows(shapes, _tf32_ops(op_kernels))
    notes += row_notes
    roofs, peaks, roof_notes = _roofs(rows, device_name, hbm)
    notes += roof_notes
    if not rows:
        return Roofline(
            empty_frame(POINT_COLUMNS),
            empty_frame(OP_COLUMNS),
            pd.DataFrame(roofs, columns=list(ROOF_COLUMNS)),
            device_name,
            None if hbm is None else hbm.bytes_per_s,
            None if hbm is None else hbm.source,
            total_ms,
            0.0,
            notes,
        )
    points = pd.DataFrame(rows)
    points["peak_flops_per_s"] = [peaks.get(d, np.nan) for d in points["dtype"]]
    hbm_bps = hbm.bytes_per_s if hbm else None
    points = _rates(points, hbm_bps)[list(POINT_COLUMNS)]
    points = points.sort_values(["device_ms", "op"], ascending=[False, True], kind="stable").reset_index(drop=True)
    ops = _per_op(points)
    ops["peak_flops_per_s"] = [peaks.get(d, np.nan) for d in ops["dtype"]]
    ops = _rates(ops, hbm_bps)[list(OP_COLUMNS)]
    ops = ops.sort_values(["device_ms", "op"], ascending=[False, True], kind="stable").reset_index(drop=True)
    over = ops.loc[ops["efficiency_pct"].to_numpy(np.float64) > 100.0]
    if len(over):
        notes.append(
            "efficiency over 100 % (the FLOPs model or the peak table is wrong for these rows): "
            + ", ".join(
                f"{o}{' bwd' if b else ''} {d} {e:.1f} %"
                for o, b, d, e in over[["op", "backward", "dtype", "efficiency_pct"]].itertuples(index=False)
            )
        )
    return Roofline(
        points,
        ops,
        pd.DataFrame(roofs, columns=list(ROOF_COLUMNS)),
        device_name,
        hbm_bps,
        None if hbm is None else hbm.source,
        total_ms,
        float(points["device_ms"].sum()),
        notes,
    )


def _modeled_rows(shapes: pd.DataFrame, tf32: set[tuple[str, bool]]) -> tuple[list[dict[str, Any]], list[str]]:
    """One point per shapes row its op model fits (FLOPs and bytes of all its calls, backward scaled), and
    notes on the rows left off (no model, no backward model) and on causal attention."""
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    unfit: dict[str, int] = {}
    cache: dict[tuple[str, str, str, str], CallCost | None] = {}
    no_backward: dict[str, int] = {}
    causal_calls: dict[str, int] = {}
    for op, backward, dims_json, types_json, concrete_json, calls, device_ms in zip(
        shapes["op"],
        shapes["backward"],
        shapes["input_dims"],
        shapes["input_types"],
        shapes["concrete_inputs"],
        shapes["calls"],
        shapes["device_ms"],
    ):
        key = (str(op), str(dims_json), str(types_json), str(concrete_json))
        if key not in cache:
            try:
                cache[key] = per_call(
                    str(op),
                    json.loads(dims_json),
                    json.loads(types_json) if types_json else [],
                    json.loads(concrete_json) if concrete_json else None,
                )
            except (ShapeError, ValueError, TypeError, IndexError, KeyError):
                cache[key] = None
        got = cache[key]
        if got is None:
            unfit[str(op)] = unfit.get(str(op), 0) + 1
            continue
        dtype = got.dtype
        if dtype == "fp32" and (str(op), bool(backward)) in tf32:
            dtype = "tf32"
        if got.family == "attention" and got.causal:
            causal_calls[str(op)] = causal_calls.get(str(op), 0) + int(calls)
        if backward and got.family not in BACKWARD_FLOPS:
            no_backward[str(op)] = no_backward.get(str(op), 0) + 1
            continue
        scale_f = BACKWARD_FLOPS[got.family] if backward else 1.0
        scale_b = BACKWARD_BYTES if backward else 1.0
        rows.append(
            {
                "op": str(op),
                "family": got.family,
                "backward": bool(backward),
                "input_dims": str(dims_json),
                "input_types": str(types_json) if types_json is not None else "",
                "concrete_inputs": str(concrete_json) if concrete_json is not None else "",
                "causal": got.causal,
                "dtype": dtype,
                "calls": int(calls),
                "device_ms": float(device_ms),
                "flops": got.flops * scale_f * int(calls),
                "bytes": got.bytes * scale_b * int(calls),
            }
        )
    if causal_calls:
        notes.append(
            "causal attention counted in full, as torch's FlopCounterMode and the MFU count it (TraceLens "
            "counts the unmasked half of a square score matrix): "
            + ", ".join(f"{op} ({n} call(s))" for op, n in sorted(causal_calls.items()))
        )
    if no_backward:
        notes.append(
            "backward of memory-bound ops not on the roofline (no backward model: their gradient ops "
            "differ per op): " + ", ".join(f"{op} ({n} shape(s))" for op, n in sorted(no_backward.items()))
        )
    if unfit:
        notes.append(
            "not on the roofline (no model, or shapes that do not fit the op): "
            + ", ".join(f"{op} ({n} shape(s))" for op, n in sorted(unfit.items()))
        )
    return rows, notes


def _roofs(
    rows: list[dict[str, Any]], device_name: str | None, hbm: MemoryPeak | None
) -> tuple[list[dict[str, Any]], dict[str | None, float], list[str]]:
    """The roofs of the rows' dtypes on ``device_name`` (datasheet peak, ridge point), the peaks by dtype,
    and a note when there are none."""
    notes: list[str] = []
    roofs = []
    peaks: dict[str | None, float] = {}
    for dtype in sorted({str(r["dtype"]) for r in rows if r["dtype"]}):
        tp = datasheet_peak(device_name, dtype) if device_name else None
        if tp is not None:
            peaks[dtype] = tp.per_s
            roofs.append(
                {
                    "dtype": dtype,
                    "peak_flops_per_s": tp.per_s,
                    "ridge_flop_per_byte": tp.per_s / hbm.bytes_per_s if hbm else np.nan,
                    "source": tp.detail,
                }
            )
    if not device_name:
        notes.append("device unknown (no deviceProperties in the trace): no peaks, so no bound or efficiency")
    elif hbm is None or not roofs:
        notes.append(
            f"no datasheet peaks for '{device_name}' in the peak table (analyzer.metrics.hardware): "
            "no bound or efficiency"
        )
    return roofs, peaks, notes
