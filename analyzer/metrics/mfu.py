"""Model and hardware FLOPs utilization (MFU, HFU) per step and per run.

Definitions (docs/metrics.md, "MFU and HFU"):

``MFU = achieved model FLOP/s per device / peak FLOP/s per device`` (PaLM,
Chowdhery et al. 2022, appendix B), a fraction in 0..1. HFU is the same with
hardware FLOPs (model FLOPs plus activation recompute).

Two sources, tried in this order; the result names the one used:

``manifest`` (reftrain run directories). Per optimizer step ``s``:
    ``flops_per_device = tokens_per_step * flops.per_token / world_size``
    ``mfu_s = flops_per_device / (t_s * peak_flops.per_s)``
with ``t_s`` the mean over ranks of ``step_time_ms`` in
``metrics/rank*.jsonl``, over steady-state steps only (``step >=
warmup_steps``, not in ``profiled_steps``, not flagged ``profiled``); HFU uses
``flops.per_token_hardware``. The run value is the median over steps. The
metrics JSONL is used rather than the trace windows because the traced steps
are exactly the profiled ones, which the profiler slows down; the trainer's
own ``mfu`` field, summarized the same way, is reported beside it
(``logged_median``) as a check.

``trace-shapes`` (any Kineto trace with ``record_shapes=True``). Per rank and
ProfilerStep window, the FLOPs of the FLOP table's ops (GEMM, attention,
convolution; :mod:`analyzer.metrics.flop_table`) that start in the window,
validated and each product counted once (:mod:`analyzer.metrics.matmul_flops`:
kernels charged to the op that launched them, else outermost usable host
ops), over the window length and a peak from the ``peak_flops`` argument or
the datasheet table (:mod:`analyzer.metrics.hardware`) by the device name in
``deviceProperties`` and the dtype carrying most matmul FLOPs.

Each counted op is in one pass (:mod:`analyzer.metrics.passes`): forward,
backward, or recompute (a forward op run during backward: activation
checkpointing). Per family (gemm, attention, conv):

* the trace has backward (autograd ranges of any era, or the table's
  backward ops) and the family has recorded backward ops: counted as
  recorded (``aten::mm`` under ``AddmmBackward0``,
  ``aten::convolution_backward``, an SDPA backend's backward);
* backward but none of this family's: estimated as
  :data:`analyzer.metrics.flop_table.BACKWARD_RATIO` x its forward (2x
  GEMM and convolution, 2.5x attention), named per family in the notes
  (attention run as bmm ops, the math backend, is not estimated again: its
  bmm backward is recorded);
* no backward at all (inference, or forward-only profile): forward only,
  with a note.

Model FLOPs (MFU) are forward plus backward; hardware FLOPs (HFU) add the
recomputed forward (less the op that non-reentrant checkpointing's early
stop cuts off before it computes, :func:`analyzer.metrics.passes.stopped_recompute`).

FLOP coverage: the share of GEMM/attention/conv time whose FLOPs are known:
kernel time where kernels link to their launching ops, else the total time
of the outermost FLOP-table host ops (CPU traces); under ``COVERAGE_MIN``
(99 %) the result is a lower bound (``lower_bound``), labelled so, and no
suggestion rule reads it. A step's value is the mean over ranks; the run
value the median over steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import pandas as pd

from analyzer.jsontext import jsonable
from analyzer.metrics.flop_table import BACKWARD_RATIO
from analyzer.metrics.matmul_flops import charged_ops, dominant_dtype, flop_kernels, matmul_ops
from analyzer.metrics.passes import backward_ranges
from analyzer.metrics.text import is_in
from analyzer.metrics.hardware import datasheet_peak
from analyzer.ingest.formats import RunManifest
from analyzer.ingest.tables import DEVICE_KINDS

MfuSource = Literal["manifest", "trace-shapes", "none"]
STEP_COLUMNS = ("step", "n_ranks", "step_time_ms", "flops", "hardware_flops", "achieved_tflops_per_s", "mfu", "hfu")


@dataclass(frozen=True)
class Peak:
    """A peak rate (FLOP/s per device) and where it came from."""

    per_s: float
    dtype: str | None
    source: str  # "argument" | "table"
    detail: str


# Trace dtype -> the peak-table keys tried in order (analyzer.metrics.hardware).
# fp16 falls back to bf16 only where the table lacks fp16 (never: every
# device with one has the other); fp8 has its own tensor-core rate.
_PEAK_KEYS = {
    "bf16": ("bf16",),
    "fp16": ("fp16", "bf16"),
    "fp8": ("fp8",),
    "tf32": ("tf32", "fp32"),
    "fp32": ("fp32",),
    "fp64": (),
}


def lookup_peak(device_name: str, dtype: str | None) -> Peak | None:
    """Dense datasheet peak of a device for a trace dtype (analyzer/metrics/hardware.py)."""
    for key in _PEAK_KEYS.get(dtype or "bf16", ("bf16",)):
        found = datasheet_peak(device_name, key)
        if found is not None:
            return Peak(found.per_s, found.dtype, "table", found.detail)
    return None


@dataclass
class MfuResult:
    """MFU of a run. ``median``/``hfu_median`` are fractions (0..1) or None.

    ``steps`` has one row per step (:data:`STEP_COLUMNS`; ``flops`` are model
    FLOPs per device per step). ``reason`` says why when ``source`` is
    ``none``; ``step_time_source`` and ``peak_detail`` say where the
    denominator came from.
    """

    source: MfuSource
    median: float | None = None
    hfu_median: float | None = None
    reason: str | None = None
    steps: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame({c: pd.Series(dtype="float64") for c in STEP_COLUMNS})
    )
    step_time_source: str | None = None
    # Manifest source: where the model FLOPs came from (``measured: ...`` by
    # FlopCounterMode, ``formula: ...``), run.json's ``flops`` (docs/rundir.md).
    flops_source: str | None = None
    peak_flops_per_s: float | None = None
    peak_source: str | None = None
    peak_detail: str | None = None
    dtype: str | None = None
    flops_per_step: float | None = None
    logged_median: float | None = None
    # "recorded" | "estimated" | "partly-estimated" | "mixed" | "absent"; per family in backward_families
    backward: str | None = None
    notes: list[str] = field(default_factory=list)
    # Trace shapes only: share of GEMM/attention/conv kernel time whose FLOPs
    # are known (None when kernels do not link to their ops), whether that
    # makes ``median`` a lower bound (coverage < COVERAGE_MIN), the ops whose
    # shapes did not fit, and how FLOPs were attributed (kernels | host-ops).
    flop_coverage: float | None = None
    lower_bound: bool = False
    inconsistent_ops: list[dict[str, Any]] = field(default_factory=list)
    attribution: str | None = None
    # Trace shapes: each FLOP family's backward mode (recorded | estimated | absent | mixed) and the median
    # hardware FLOPs per device per step (model plus activation recompute).
    backward_families: dict[str, str] = field(default_factory=dict)
    hardware_flops_per_step: float | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (NaN becomes None); ``steps`` as a list of records."""
        return {
            "source": self.source,
            "median": jsonable(self.median),
            "hfu_median": jsonable(self.hfu_median),
            "reason": self.reason,
            "step_time_source": self.step_time_source,
            "flops_source": self.flops_source,
            "peak_flops_per_s": jsonable(self.peak_flops_per_s),
            "peak_source": self.peak_source,
            "peak_detail": self.peak_detail,
            "dtype": self.dtype,
            "flops_per_step": jsonable(self.flops_per_step),
            "logged_median": jsonable(self.logged_median),
            "backward": self.backward,
            "notes": list(self.notes),
            "flop_coverage": jsonable(self.flop_coverage),
            "lower_bound": self.lower_bound,
            "inconsistent_ops": list(self.inconsistent_ops),
            "attribution": self.attribution,
            "backward_families": dict(self.backward_families),
            "hardware_flops_per_step": jsonable(self.hardware_flops_per_step),
            "steps": [{k: jsonable(v) for k, v in row.items()} for row in self.steps.to_dict("records")],
        }


def _median_or_none(values: pd.Series) -> float | None:
    values = values.dropna()
    return float(values.median()) if len(values) else None


def steady_state(metrics: pd.DataFrame, warmup_steps: int, profiled_steps: Sequence[int]) -> pd.DataFrame:
    """Rows of the metrics table outside warmup and profiler windows."""
    keep = (metrics["step"] >= warmup_steps) & ~metrics["step"].isin(list(profiled_steps))
    if "profiled" in metrics.columns:
        keep &= ~metrics["profiled"].fillna(False).astype(bool)
    return metrics.loc[keep]


def mfu_from_manifest(
    manifest: RunManifest | Mapping[str, Any], metrics: pd.DataFrame | None, peak_flops: float | None = None
) -> MfuResult:
    """MFU of a reftrain run from its manifest and metrics records (see module doc).

    ``peak_flops`` (FLOP/s per device) replaces the manifest's peak. Returns
    source ``none`` with the reason when a needed manifest field or every
    steady-state step is missing.
    """
    man = RunManifest.read(manifest)
    per_token = man.model_flops.per_token
    per_token_hw = man.model_flops.per_token_hardware or per_token
    tokens_per_step = man.tokens_per_step
    peak = peak_flops if peak_flops is not None else man.peak.per_s
    world_size = man.world_size
    missing = [
        name
        for name, value in (
            ("flops.per_token", per_token),
            ("tokens_per_step", tokens_per_step),
            ("peak_flops.per_s", peak),
            ("world_size", world_size),
        )
        if not value
    ]
    if missing:
        return MfuResult("none", reason=f"run.json lacks {', '.join(missing)}")
    if metrics is None or metrics.empty or "step_time_ms" not in metrics.columns:
        return MfuResult("none", reason="no metrics records (metrics/rank*.jsonl) to time the steps")
    warmup, profiled = man.warmup_steps or 0, man.profiled_steps
    steady = steady_state(metrics, warmup, profiled)
    if steady.empty:
        return MfuResult(
            "none",
            reason=f"no steady-state steps: all {metrics['step'].nunique()} step(s) are warmup (< {warmup}) or profiled",
        )
    # each is in `missing` above otherwise
    assert per_token is not None and per_token_hw is not None and tokens_per_step is not None and world_size is not None
    assert peak is not None
    flops = float(tokens_per_step) * float(per_token) / float(world_size)
    hw_flops = float(tokens_per_step) * float(per_token_hw) / float(world_size)
    steps = _manifest_steps(steady, flops, hw_flops, float(peak))
    logged = None
    if "mfu" in steady.columns:
        logged = _median_or_none(pd.to_numeric(steady["mfu"], errors="coerce").groupby(steady["step"]).mean())
    notes = []
    if logged and peak_flops is None:
        rel = (float(steps["mfu"].median()) - logged) / logged
        notes.append(f"reftrain's logged MFU over the same steps: {logged:.4f} ({rel:+.2%} relative)")
    hfu_median = float(steps["hfu"].median())
    if hfu_median > 1.0:
        # No device runs above its peak: the peak is what is wrong (a CPU peak
        # measured while other processes held the cores reads far low).
        notes.append(
            f"HFU {hfu_median:.1%} is above 100 %: the peak ({float(peak):.4g} FLOP/s, "
            f"{man.peak.detail or man.peak.source or 'run.json'}) is below the rate the steps achieved, so MFU and HFU "
            "here are not fractions of the hardware's peak (pass the real peak with --peak-flops)"
        )
    return MfuResult(
        "manifest",
        median=float(steps["mfu"].median()),
        hfu_median=hfu_median,
        steps=steps,
        step_time_source=(
            f"metrics JSONL: per-rank step_time_ms, mean over ranks of per-rank MFU, {len(steps)} steady-state step(s) "
            f"(warmup < {warmup} and {len(set(profiled))} profiled step(s) excluded)"
        ),
        flops_source=man.model_flops.source_text,
        peak_flops_per_s=float(peak),
        peak_source="argument" if peak_flops is not None else str(man.peak.source or "manifest"),
        peak_detail="peak_flops argument" if peak_flops is not None else man.peak.detail,
        dtype=man.peak.dtype,
        flops_per_step=flops,
        hardware_flops_per_step=hw_flops,
        logged_median=logged,
        backward="recorded",
        notes=notes,
    )


# FLOP coverage under this share of GEMM/attention/convolution time: MFU from
# shapes is a lower bound (compiled regions, CUDA graphs, no record_shapes,
# ops outside the FLOP table) and no suggestion is built on it.
COVERAGE_MIN = 0.99
FAMILIES = ("gemm", "attention", "conv")


@dataclass(frozen=True)
class RankFlops:
    """Per-step FLOPs of one rank from trace shapes.

    ``attribution``: ``kernels`` (each GEMM/attention/conv kernel charged to
    the op that launched it) or ``host-ops`` (no kernel links to a launch:
    outermost matmul ops with usable shapes). ``flop_kernel_ns`` is the
    GEMM/attention/conv kernel time of the rank, ``covered_kernel_ns`` the
    part of it whose FLOPs are known; ``inconsistent`` lists the ops whose
    shapes do not fit the op (name, dims, reason, count).
    """

    rank: int
    # step, step_time_ms, flops (model), hardware_flops (model + recompute), recorded_fwd_flops,
    # recorded_bwd_flops, estimated_bwd_flops, recompute_flops
    steps: pd.DataFrame
    backward: str  # "recorded" | "estimated" | "partly-estimated" | "mixed" | "absent"
    n_ops: int  # matmul-like ops in the trace
    n_unknown_shapes: int  # of those, ops whose shapes are missing or inconsistent
    dtype: str | None
    n_counted: int = 0  # ops whose FLOPs were added up (each product once)
    attribution: str = "host-ops"
    flop_kernel_ns: int = 0
    covered_kernel_ns: int = 0
    inconsistent: tuple[dict[str, Any], ...] = ()
    families: tuple[tuple[str, str], ...] = ()  # (family, backward mode) per family with FLOPs
    flop_host_ns: int = 0  # total time of the outermost FLOP-table host ops
    covered_host_ns: int = 0  # of it, the ops whose FLOPs count

    @property
    def coverage(self) -> float | None:
        """Share of GEMM/attention/conv time whose FLOPs are known: kernel time when kernels link to their
        ops, else host op time; None when the rank has no such time."""
        if self.attribution == "kernels":
            return self.covered_kernel_ns / self.flop_kernel_ns if self.flop_kernel_ns > 0 else None
        return self.covered_host_ns / self.flop_host_ns if self.flop_host_ns > 0 else None


def _manifest_steps(steady: pd.DataFrame, flops: float, hw_flops: float, peak: float) -> pd.DataFrame:
    """Per steady-state step: the mean over ranks of each rank's MFU, HFU and achieved FLOP/s, from
    ``flops`` (model) and ``hw_flops`` (hardware) per step per device and ``peak`` FLOP/s."""
    # Each rank's MFU over its own step time, then the mean over ranks: the
    # same order as reftrain's logged value. Dividing a mean step time instead
    # differs by Jensen's gap, which reached 4% on a loaded 2-core machine
    # where ranks' step times within one step differ by up to 2x.
    rank_seconds = pd.to_numeric(steady["step_time_ms"], errors="coerce").to_numpy(np.float64) / 1e3
    per_rank = pd.DataFrame(
        {
            "step": steady["step"].to_numpy(),
            "rank": steady["rank"].to_numpy(),
            "step_time_ms": rank_seconds * 1e3,
            "mfu": flops / (rank_seconds * peak),
            "hfu": hw_flops / (rank_seconds * peak),
            "tflops": flops / rank_seconds / 1e12,
        }
    )
    per_step = per_rank.groupby("step", sort=True).agg(
        n_ranks=("rank", "nunique"),
        step_time_ms=("step_time_ms", "mean"),
        mfu=("mfu", "mean"),
        hfu=("hfu", "mean"),
        tflops=("tflops", "mean"),
    )
    return pd.DataFrame(
        {
            "step": per_step.index.to_numpy(np.int64),
            "n_ranks": per_step["n_ranks"].to_numpy(np.int64),
            "step_time_ms": per_step["step_time_ms"].to_numpy(),
            "flops": flops,
            "hardware_flops": hw_flops,
            "achieved_tflops_per_s": per_step["tflops"].to_numpy(),
            "mfu": per_step["mfu"].to_numpy(),
            "hfu": per_step["hfu"].to_numpy(),
        }
    )


def _kernel_dtype(ops: pd.DataFrame, kernels: pd.DataFrame) -> str | None:
    """Dtype carrying most covered FLOP-kernel time: the kernel's own name (fp8, tf32) first, else its launching op's inputs.

    The launching op is the innermost (under autocast the ``aten::addmm``
    recorded in bf16, not the fp32 ``aten::linear`` around it); an fp32 op
    whose kernel is a TF32 tensor-core kernel ran in TF32.
    """
    cov = kernels.loc[kernels["account"].to_numpy() >= 0]
    if cov.empty:
        return None
    op_dtype = ops["dtype"].to_numpy(object)
    launched = cov["op"].to_numpy(np.int64)
    account = cov["account"].to_numpy(np.int64)
    from_op = [op_dtype[o] if o >= 0 and op_dtype[o] else op_dtype[a] for o, a in zip(launched, account)]
    precision = cov["precision"].to_numpy(object)
    dtype = [p if p == "fp8" or (p == "tf32" and d in (None, "fp32")) else d for p, d in zip(precision, from_op)]
    weights = pd.Series(cov["dur_ns"].to_numpy(np.float64)).groupby(pd.Series(dtype, dtype=object)).sum()
    return str(weights.idxmax()) if len(weights) else None


def _inconsistent(ops: pd.DataFrame) -> tuple[dict[str, Any], ...]:
    """(name, input_dims, reason, count) for ops whose recorded shapes do not fit the op."""
    bad = ops.loc[ops["shape_error"].notna() & (ops["shape_error"] != "no recorded shapes")]
    if bad.empty:
        return ()
    grouped = bad.groupby(["name", "input_dims", "shape_error"], sort=True).size()
    return tuple(
        {"name": n, "input_dims": d, "reason": e, "count": int(c)}
        for (n, d, e), c in zip(grouped.index.tolist(), grouped.to_numpy())
    )


def _fused_backward(ops: pd.DataFrame) -> np.ndarray:
    """Per op: no GEMM op runs inside it, so its backward is one op of its own family (an SDPA backend's).

    The math SDPA backend runs as bmm/matmul ops whose backward is recorded
    as GEMM backward; estimating attention backward for it would count that
    work twice.
    """
    parent = ops["parent"].to_numpy(np.int64)
    has_gemm = np.zeros(len(ops), dtype=bool)
    up = parent[(ops["family"] == "gemm").to_numpy(bool)]
    while up.size:
        up = up[up >= 0]
        has_gemm[up] = True
        up = parent[up]
    return ~has_gemm


def rank_flops_from_shapes(rank: int, events: pd.DataFrame, steps: pd.DataFrame) -> RankFlops:
    """Model and hardware FLOPs per ProfilerStep window of one rank from op shapes (see module doc)."""
    ops = matmul_ops(events)
    kernels = flop_kernels(events, ops)
    linked = bool(kernels["linked"].any())
    counted = charged_ops(ops, kernels) if linked else ops["counted"].to_numpy(bool)
    top = ops.loc[counted]
    has_backward = bool(backward_ranges(events)) or bool(ops["backward"].any())
    lo = steps["start_ns"].to_numpy(np.int64)
    hi = steps["end_ns"].to_numpy(np.int64)
    start = top["start_ns"].to_numpy(np.int64)
    k = np.searchsorted(lo, start, side="right") - 1
    in_step = (k >= 0) & (start < hi[np.clip(k, 0, None)]) if len(lo) else np.zeros(len(top), dtype=bool)
    flops = top["flops"].to_numpy(np.float64)
    bwd = top["backward"].to_numpy(bool)
    rec = top["recompute"].to_numpy(bool)
    flops = np.where(top["stopped"].to_numpy(bool), 0.0, flops)  # cut off by checkpointing's early stop
    fam = top["family"].to_numpy(object)
    # GEMM ops nest (linear > addmm): only another family's op with GEMMs inside has its backward among the GEMMs'.
    fused = _fused_backward(ops)[counted] | (fam == "gemm")

    def per_step(rows: np.ndarray) -> np.ndarray:
        return np.bincount(k[in_step & rows], weights=flops[in_step & rows], minlength=len(lo))

    n = len(lo)
    fwd_total, bwd_total, est_total, rec_total = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    modes: list[tuple[str, str]] = []
    for family in FAMILIES:
        mine = fam == family
        fwd, back, again = per_step(mine & ~bwd & ~rec), per_step(mine & bwd), per_step(mine & rec)
        fwd_total += fwd
        bwd_total += back
        rec_total += again
        if not (fwd.any() or back.any()):
            continue
        if not has_backward:
            modes.append((family, "absent"))
        elif back.any():
            modes.append((family, "recorded"))
        else:
            modes.append((family, "estimated"))
            est_total += BACKWARD_RATIO[family] * per_step(mine & ~bwd & ~rec & fused)
    model = fwd_total + bwd_total + est_total
    table = pd.DataFrame(
        {
            "step": steps["step"].to_numpy(np.int64),
            "step_time_ms": (hi - lo) / 1e6,
            "flops": model,
            "hardware_flops": model + rec_total,
            "recorded_fwd_flops": fwd_total,
            "recorded_bwd_flops": bwd_total,
            "estimated_bwd_flops": est_total,
            "recompute_flops": rec_total,
        }
    )
    if linked:
        dtype = _kernel_dtype(ops, kernels)
    else:
        dtype = dominant_dtype(ops)
        precisions = kernels["precision"].to_numpy(object)
        if dtype == "fp32" and (precisions == "tf32").any():
            dtype = "tf32"
        if len(precisions) and (precisions == "fp8").mean() > 0.5:
            dtype = "fp8"
    dur = kernels["dur_ns"].to_numpy(np.int64)
    covered = int(dur[kernels["account"].to_numpy(np.int64) >= 0].sum())
    # Host time: the outermost table ops (their total time) against the counted ones inside them.
    host_dur = (ops["end_ns"] - ops["start_ns"]).to_numpy(np.int64)
    return RankFlops(
        rank,
        table,
        _overall_mode(modes),
        int(len(ops)),
        int(ops["flops"].isna().sum()),
        dtype,
        n_counted=int(counted.sum()),
        attribution="kernels" if linked else "host-ops",
        flop_kernel_ns=int(dur.sum()),
        covered_kernel_ns=covered,
        inconsistent=_inconsistent(ops),
        families=tuple(modes),
        flop_host_ns=int(host_dur[ops["top_level"].to_numpy(bool)].sum()),
        covered_host_ns=int(host_dur[ops["counted"].to_numpy(bool)].sum()),
    )


def _overall_mode(modes: Sequence[tuple[str, str]]) -> str:
    """One word for the families' backward modes: all alike, or ``partly-estimated``."""
    kinds = {m for _, m in modes}
    if not kinds:
        return "absent"
    if len(kinds) == 1:
        return kinds.pop()
    return "partly-estimated" if "estimated" in kinds else "mixed"


def device_name_of(events: pd.DataFrame, device_properties: Sequence[Mapping[str, Any]]) -> str | None:
    """Name of the device a rank ran on: the ``deviceProperties`` entry whose id is the GPU events' pid."""
    if not device_properties:
        return None
    device_pids = events.loc[is_in(events["kind"], DEVICE_KINDS), "pid"]
    if len(device_pids):
        pid = int(device_pids.mode().iloc[0])
        for prop in device_properties:
            if prop.get("id") == pid and prop.get("name"):
                return str(prop["name"])
    first = device_properties[0].get("name")
    return str(first) if first else None


def mfu_from_trace_shapes(
    ranks: Sequence[RankFlops],
    device_names: Mapping[int, str | None],
    peak_flops: float | None = None,
) -> MfuResult:
    """MFU from per-rank shape FLOPs (see module doc); ``peak_flops`` overrides the table."""
    if not ranks or all(r.steps.empty for r in ranks):
        return MfuResult("none", reason="no ProfilerStep windows to time the FLOPs against")
    n_ops = sum(r.n_ops for r in ranks)
    n_known = sum(r.n_counted for r in ranks)
    coverage = flop_coverage(ranks)
    lower_bound = coverage is not None and coverage < COVERAGE_MIN
    inconsistent = [dict(item, rank=r.rank) for r in ranks for item in r.inconsistent]
    coverage_fields: dict[str, Any] = dict(
        flop_coverage=coverage,
        lower_bound=lower_bound,
        inconsistent_ops=inconsistent,
        attribution="+".join(sorted({r.attribution for r in ranks})),
    )
    if n_known == 0:
        why = "no matmul-like ops in the trace" if n_ops == 0 else "matmul-like ops lack usable shapes"
        if coverage is not None:
            why += f" (FLOP coverage {coverage:.1%} of GEMM/attention/conv {_time_kind(ranks)})"
        return MfuResult(
            "none", reason=f"{why} (profile with record_shapes=True, or give a run directory)", **coverage_fields
        )
    dtypes = [r.dtype for r in ranks if r.dtype]
    dtype = max(set(dtypes), key=dtypes.count) if dtypes else None
    peak, reason, notes = _trace_peak(device_names, dtype, peak_flops)
    steps = _trace_steps(ranks, peak)
    backward, families, shape_notes = _trace_backward_notes(ranks, n_ops, coverage, inconsistent)
    notes += shape_notes
    if lower_bound:
        notes.insert(
            0,
            f"lower bound: FLOPs known for only {coverage:.1%} of GEMM/attention/conv {_time_kind(ranks)} "
            f"(< {COVERAGE_MIN:.0%}: compiled regions, CUDA graphs or record_shapes off); no suggestion uses it",
        )
    recompute = float(np.nansum(steps["hardware_flops"] - steps["flops"]))
    if recompute > 0:
        notes.append(
            f"activation recompute: forward ops run again in backward add "
            f"{float((steps['hardware_flops'] / steps['flops']).median()) - 1:.1%} to the model FLOPs "
            "(counted in the HFU, not the MFU)"
        )
    common: dict[str, Any] = dict(
        backward_families=families,
        hardware_flops_per_step=float(steps["hardware_flops"].median()),
        **coverage_fields,
        steps=steps,
        step_time_source="ProfilerStep windows (mean over ranks)",
        dtype=dtype,
        flops_per_step=float(steps["flops"].median()),
        backward=backward,
        notes=notes,
    )
    if peak is None:
        return MfuResult("none", reason=reason, **common)
    return MfuResult(
        "trace-shapes",
        median=_median_or_none(steps["mfu"]),
        hfu_median=_median_or_none(steps["hfu"]),
        peak_flops_per_s=peak.per_s,
        peak_source=peak.source,
        peak_detail=peak.detail,
        **common,
    )


def _trace_peak(
    device_names: Mapping[int, str | None], dtype: str | None, peak_flops: float | None
) -> tuple[Peak | None, str | None, list[str]]:
    """The peak of a trace's MFU: ``peak_flops`` if given, else the datasheet peak of the ranks' device in
    ``dtype``; the reason when there is none, and a note when the ranks name different devices."""
    notes: list[str] = []
    peak: Peak | None = None
    reason = None
    if peak_flops is not None:
        peak = Peak(float(peak_flops), dtype, "argument", "peak_flops argument")
    else:
        names = {n for n in device_names.values() if n}
        if not names:
            reason = "no GPU in the trace (deviceProperties empty) and no peak_flops given"
        else:
            name = sorted(names)[0]
            peak = lookup_peak(name, dtype)
            if peak is None:
                reason = f"no datasheet peak for device {name!r} in {dtype or 'bf16'}; pass peak_flops (--peak-flops)"
            if len(names) > 1:
                notes.append(f"ranks report different devices {sorted(names)}; peak of {name!r} used")
    return peak, reason, notes


def _trace_steps(ranks: Sequence[RankFlops], peak: Peak | None) -> pd.DataFrame:
    """Per ProfilerStep window, the mean over ranks of step time, FLOPs, achieved FLOP/s, MFU and HFU
    (NaN without a peak); columns ``STEP_COLUMNS``."""
    per_rank = []
    for r in ranks:
        t = r.steps.assign(rank=r.rank)
        per_rank.append(t)
    table = pd.concat(per_rank, ignore_index=True)
    seconds = table["step_time_ms"].to_numpy() / 1e3
    table["achieved_tflops_per_s"] = table["flops"].to_numpy() / seconds / 1e12
    table["mfu"] = table["flops"] / (seconds * peak.per_s) if peak else np.nan
    table["hfu"] = table["hardware_flops"] / (seconds * peak.per_s) if peak else np.nan
    averaged = ["step_time_ms", "flops", "hardware_flops", "achieved_tflops_per_s", "mfu", "hfu"]
    if len(ranks) == 1 and table["step"].is_unique:
        # One rank, one row per step: the mean over ranks is the row (the groupby cost 4 ms of a one-file report).
        steps = table.sort_values("step", kind="stable")[["step", *averaged]].reset_index(drop=True)
        steps.insert(1, "n_ranks", 1)
    else:
        per_step = table.groupby("step", sort=True).agg(
            n_ranks=("rank", "nunique"), **{c: (c, "mean") for c in averaged}
        )
        steps = per_step.reset_index()
    return steps[list(STEP_COLUMNS)]


def _trace_backward_notes(
    ranks: Sequence[RankFlops], n_ops: int, coverage: float | None, inconsistent: list[dict[str, Any]]
) -> tuple[str, dict[str, str], list[str]]:
    """How the backward FLOPs were counted (over all ranks, and per op family: ``recorded``, ``estimated``,
    ``absent`` or ``mixed``) and the notes on backward, unusable shapes and FLOP coverage."""
    notes: list[str] = []
    modes = sorted({r.backward for r in ranks})
    backward = modes[0] if len(modes) == 1 else "mixed"
    families: dict[str, str] = {}
    for r in ranks:
        for family, mode in r.families:
            families[family] = mode if families.get(family, mode) == mode else "mixed"
    estimated = [f for f, m in families.items() if m == "estimated"]
    if estimated:
        notes.append(
            "no recorded backward op for "
            + ", ".join(f"{f} (backward estimated as {BACKWARD_RATIO[f]:g}x its forward)" for f in estimated)
        )
    if backward == "absent":
        notes.append("no autograd backward in the trace: forward FLOPs only (inference or forward-only profile)")
    unknown = sum(r.n_unknown_shapes for r in ranks)
    if unknown:
        notes.append(
            f"{unknown} of {n_ops} matmul-like ops lack usable shapes (their children or enclosing op count instead, where usable)"
        )
    if inconsistent:
        notes.append(
            f"{sum(i['count'] for i in inconsistent)} matmul-like op(s) recorded shapes that do not fit the op "
            f"(e.g. {inconsistent[0]['name']} {inconsistent[0]['input_dims']}: {inconsistent[0]['reason']}); listed in inconsistent_ops"
        )
    if coverage is not None:
        notes.append(
            f"FLOP coverage {coverage:.1%}: share of GEMM/attention/conv {_time_kind(ranks)} whose FLOPs are known"
        )
    return backward, families, notes


def _time_kind(ranks: Sequence[RankFlops]) -> str:
    kinds = sorted({"kernel time" if r.attribution == "kernels" else "host op time" for r in ranks})
    return " and ".join(kinds)


def flop_coverage(ranks: Sequence[RankFlops]) -> float | None:
    """Covered over all GEMM/attention/conv time of the ranks (kernel time where kernels link to their ops, host
    op time elsewhere; :attr:`RankFlops.coverage`); None when no rank has any."""
    total = covered = 0
    for r in ranks:
        if r.attribution == "kernels":
            total, covered = total + r.flop_kernel_ns, covered + r.covered_kernel_ns
        else:
            total, covered = total + r.flop_host_ns, covered + r.covered_host_ns
    return covered / total if total > 0 else None


def rank_step_mfu(step_table: pd.DataFrame, flops_per_step: float, peak_flops_per_s: float) -> np.ndarray:
    """Per-(rank, step) MFU of trace windows given FLOPs per device per step."""
    return flops_per_step / (step_table["step_time_ms"].to_numpy() / 1e3 * peak_flops_per_s)
