"""Steady-state per-step samples of a run: the values the gate compares (MFU, throughput, CPU time per step)
and the machine-speed canary's probes, read from the analyzed runs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from analyzer.errors import AnalyzerError
from analyzer.metrics.machine_speed import WINDOW_STEPS, canary_cost_per_step
from analyzer.verbs.compare import candidate_peak_scale

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis

Metric = Literal["mfu", "tokens_per_s", "steps_per_s", "cpu_steps_per_s", "canary_probes_per_s", "steps_per_canary"]
METRIC_LABELS: dict[str, str] = {
    "mfu": "MFU",
    "tokens_per_s": "throughput (tokens/s per rank)",
    "steps_per_s": "throughput (steps/s)",
    "cpu_steps_per_s": "steps per CPU-second (busiest rank)",
    "canary_probes_per_s": "machine-speed canary probes per second",
    "steps_per_canary": "steps per canary unit of CPU time (busiest rank)",
}


@dataclass(frozen=True)
class StepSamples:
    """Steady-state per-step values of one run (higher is better).

    ``values[i]`` belongs to optimizer step ``steps[i]`` (steps ascending);
    ``source`` says in words where they came from and what was excluded.
    """

    metric: Metric
    values: np.ndarray
    steps: np.ndarray
    source: str
    n_ranks: int

    @property
    def median(self) -> float:
        return float(np.median(self.values))

    def head(self, n: int) -> "StepSamples":
        """The first ``n`` steady steps, as a run of that length would have given them (bench_gate's run lengths)."""
        if n >= len(self.values):
            return self
        return replace(self, values=self.values[:n], steps=self.steps[:n], source=f"{self.source}, first {n} steps")

    def through(self, step: int) -> "StepSamples":
        """The values of steps up to ``step`` (the canary's probes of a run cut by :meth:`head`)."""
        keep = self.steps <= step
        if keep.all():
            return self
        return replace(
            self, values=self.values[keep], steps=self.steps[keep], source=f"{self.source}, through step {step}"
        )


@dataclass(frozen=True)
class Probes:
    """One run's machine-speed canary: probes per second of wall time and of the probing thread's CPU time."""

    wall: StepSamples
    cpu: StepSamples

    def through(self, step: int) -> "Probes":
        """The probes up to ``step`` (a run cut by :meth:`StepSamples.head`)."""
        return Probes(wall=self.wall.through(step), cpu=self.cpu.through(step))


def samples_from_metrics(
    metrics: pd.DataFrame | None,
    *,
    warmup_steps: int,
    profiled_steps: list[int] | tuple[int, ...],
    metric: Metric,
    label: str,
) -> StepSamples:
    """Steady-state samples from a run directory's metrics table.

    ``metrics`` has one row per (rank, step) with the ``reftrain.metrics/1``
    fields. Steps ``< warmup_steps``, steps listed in ``profiled_steps`` and
    rows flagged ``profiled`` are excluded (the profiler slows them). A
    step's value is the mean over ranks of ``metric`` (``mfu`` or
    ``tokens_per_s``); steps missing the metric on a rank are dropped.
    """
    if metrics is None or len(metrics) == 0:
        raise AnalyzerError(f"{label}: no metrics records")
    for col in ("rank", "step", metric):
        if col not in metrics.columns:
            raise AnalyzerError(f"{label}: metrics records lack the `{col}` field")
    frame = metrics[["rank", "step", metric] + (["profiled"] if "profiled" in metrics.columns else [])]
    keep = (frame["step"] >= warmup_steps) & ~frame["step"].isin(list(profiled_steps))
    if "profiled" in frame.columns:
        keep &= ~frame["profiled"].fillna(False).astype(bool)
    steady = frame.loc[keep]
    values = pd.to_numeric(steady[metric], errors="coerce")
    steady = steady.assign(value=values).dropna(subset=["value"])
    n_ranks = int(frame["rank"].nunique())
    source = (
        f"metrics JSONL, {n_ranks} rank(s), steps >= {warmup_steps} "
        f"excluding {len(set(profiled_steps))} profiled step(s)"
    )
    if steady.empty:
        raise AnalyzerError(f"{label}: no steady-state steps with `{metric}` ({source})")
    per_step = steady.groupby("step", sort=True)["value"].mean()
    return StepSamples(
        metric=metric,
        values=per_step.to_numpy(dtype=np.float64),
        steps=per_step.index.to_numpy(dtype=np.int64),
        source=f"{source}: {len(per_step)} step(s)",
        n_ranks=n_ranks,
    )


def samples_from_steps(steps: pd.DataFrame, *, value_column: str, metric: Metric, label: str) -> StepSamples:
    """Samples from a per-(rank, step) table of trace steps (ProfilerStep windows).

    ``value_column`` is ``step_time_ms`` (converted to steps/s, so higher is
    better) or a per-step MFU column; a step's value is the mean over ranks.
    """
    if steps is None or len(steps) == 0:
        raise AnalyzerError(f"{label}: no ProfilerStep windows in the traces")
    values = pd.to_numeric(steps[value_column], errors="coerce")
    if value_column == "step_time_ms":
        values = 1000.0 / values
    frame = pd.DataFrame(
        {"rank": steps["rank"].to_numpy(), "step": steps["step"].to_numpy(), "value": values.to_numpy()}
    )
    frame = frame.replace([np.inf, -np.inf], np.nan).dropna(subset=["value"])
    if frame.empty:
        raise AnalyzerError(f"{label}: no usable ProfilerStep durations")
    per_step = frame.groupby("step", sort=True)["value"].mean()
    n_ranks = int(frame["rank"].nunique())
    return StepSamples(
        metric=metric,
        values=per_step.to_numpy(dtype=np.float64),
        steps=per_step.index.to_numpy(dtype=np.int64),
        source=f"ProfilerStep windows, {n_ranks} rank(s): {len(per_step)} step(s)",
        n_ranks=n_ranks,
    )


def _mfu_samples(a: "RunAnalysis", label: str, scale: float = 1.0) -> StepSamples:
    steps = a.mfu.steps.sort_values("step")  # step order: the noise estimate splits runs into halves
    values = pd.to_numeric(steps["mfu"], errors="coerce").to_numpy(np.float64) * scale
    ok = np.isfinite(values)
    n_ranks = int(steps["n_ranks"].max()) if "n_ranks" in steps.columns and len(steps) else len(a.ranks)
    where = a.mfu.step_time_source or a.mfu.source
    if not ok.any():
        raise AnalyzerError(f"{label}: no steady-state steps with an MFU ({where})")
    return StepSamples("mfu", values[ok], steps["step"].to_numpy(np.int64)[ok], f"MFU per step, {where}", n_ranks)


def run_samples(
    base: "RunAnalysis", cand: "RunAnalysis", *more_bases: "RunAnalysis"
) -> tuple[list[StepSamples], StepSamples, list[str]]:
    """Steady-state samples of the baseline(s) and the candidate on a common metric, and notes on the choice.

    MFU when all runs have it from the same source (run directories: the
    manifest's FLOPs over the metrics records' step times; trace folders:
    shape FLOPs over ProfilerStep windows); otherwise throughput: tokens/s
    per rank from the metrics records, or steps/s from ProfilerStep windows.

    When the runs' peaks were *measured* by reftrain on the same hardware
    (CPU runs), every other run's MFU is recomputed with the first
    baseline's peak: a measured peak differs a little from run to run, and
    that difference is one constant factor on every step, which the test
    would take for a real change.
    """
    notes: list[str] = []
    others = [*more_bases, cand]
    sources = {base.mfu.source, *(o.mfu.source for o in others)}
    if base.mfu.source != "none" and len(sources) == 1:
        out = []
        for i, other in enumerate(others):
            scale, scale_note = candidate_peak_scale(base, other)
            if scale_note:
                notes.append(scale_note if other is cand else scale_note.replace("candidate", f"baseline {i + 2}"))
            label = "candidate" if other is cand else f"baseline {i + 2}"
            out.append(_mfu_samples(other, label, scale))
        return [_mfu_samples(base, "baseline"), *out[:-1]], out[-1], notes
    everyone = [("baseline", base), *((f"baseline {i + 2}", b) for i, b in enumerate(more_bases)), ("candidate", cand)]
    lacking = next(((label, a) for label, a in everyone if a.mfu.source == "none"), None)
    why = (
        f"MFU unavailable ({lacking[0]}: {lacking[1].mfu.reason})"
        if lacking
        else f"MFU sources differ ({', '.join(a.mfu.source for _, a in everyone)})"
    )
    if base.kind == "reftrain":
        notes.append(f"{why}: gating on throughput (tokens/s per rank) instead")

        def tokens(a: "RunAnalysis", label: str) -> StepSamples:
            manifest = a.run_manifest
            return samples_from_metrics(
                a.metrics,
                warmup_steps=manifest.warmup_steps or 0,
                profiled_steps=manifest.profiled_steps,
                metric="tokens_per_s",
                label=label,
            )

        samples = [tokens(a, label) for label, a in everyone]
    else:
        notes.append(f"{why}: gating on throughput (steps/s from ProfilerStep durations) instead")
        samples = [
            samples_from_steps(a.steps, value_column="step_time_ms", metric="steps_per_s", label=label)
            for label, a in everyone
        ]
    return samples[:-1], samples[-1], notes


def _steady_per_step(a: "RunAnalysis", column: str, reduce: str, sparse: bool = False) -> tuple[pd.Series, int] | None:
    """``column`` of a CPU run directory's steady-state records, one value per step (``reduce`` over ranks),
    and the number of ranks in the records.

    Steady as in :func:`samples_from_metrics` (steps >= warmup, outside
    profiler windows). ``sparse``: the field is on some steps only, and the
    steps without it are dropped; otherwise a step without it means the run
    has none. None for trace folders, GPU runs and runs whose records lack
    the field, or when a value is not a positive finite number.
    """
    manifest = a.run_manifest
    if a.kind != "reftrain" or manifest.hw.device_type != "cpu":
        return None
    m = a.metrics
    if m is None or column not in m.columns or len(m) == 0:
        return None
    warmup, profiled = manifest.warmup_steps or 0, manifest.profiled_steps
    keep = (m["step"] >= warmup) & ~m["step"].isin(profiled)
    if "profiled" in m.columns:
        keep &= ~m["profiled"].fillna(False).astype(bool)
    values = pd.to_numeric(m.loc[keep, column], errors="coerce")
    per_step = values.groupby(m.loc[keep, "step"], sort=True).agg(reduce)
    if sparse:
        per_step = per_step.dropna()
    if per_step.empty or not np.all(np.isfinite(per_step.to_numpy())) or (per_step <= 0).any():
        return None
    return per_step, int(m["rank"].nunique())


def cpu_samples(a: "RunAnalysis", label: str) -> StepSamples | None:
    """Steps per CPU-second of a CPU run directory, or None when it has no CPU times.

    From the metrics records' ``cpu_ms`` (the rank process's CPU time over
    the step, all threads), steady-state steps as in
    :func:`samples_from_metrics`; a step's value is ``1000 / cpu_ms`` of its
    busiest rank (a straggler's extra work shows there, not in the mean).
    None for trace folders, GPU runs (their work is not host CPU time) and
    runs written before reftrain recorded ``cpu_ms``.
    """
    found = _steady_per_step(a, "cpu_ms", "max")
    if found is None:
        return None
    per_step, n_ranks = found
    return StepSamples(
        metric="cpu_steps_per_s",
        values=1000.0 / per_step.to_numpy(dtype=np.float64),
        steps=per_step.index.to_numpy(dtype=np.int64),
        source=f"{label}: metrics cpu_ms, busiest rank, {len(per_step)} step(s)",
        n_ranks=n_ranks,
    )


def run_probes(a: "RunAnalysis", label: str) -> Probes | None:
    """The machine-speed canary of a CPU run directory as probes per second, or None without it.

    From the metrics records' ``canary_ms`` and ``canary_cpu_ms`` (the wall
    and CPU time of the fixed compute probe that the recorder and reftrain
    run before the step on the first, every 5th and the last step;
    recorder/canary.py),
    steady-state steps as in :func:`samples_from_metrics`; one value per
    probed step, ``1000 / ms`` of the mean over ranks (the ranks probe at
    the same moment). None for trace folders, GPU runs and runs recorded
    without the canary.
    """
    found = []
    for column in ("canary_ms", "canary_cpu_ms"):
        steady = _steady_per_step(a, column, "mean", sparse=True)
        if steady is None:
            return None
        per_step, n_ranks = steady
        found.append(
            StepSamples(
                metric="canary_probes_per_s",
                values=1000.0 / per_step.to_numpy(dtype=np.float64),
                steps=per_step.index.to_numpy(dtype=np.int64),
                source=f"{label}: metrics {column}, mean over ranks, {len(per_step)} probe(s)",
                n_ranks=n_ranks,
            )
        )
    return Probes(wall=found[0], cpu=found[1])


def cost_samples(a: "RunAnalysis", label: str, through_step: int | None = None) -> StepSamples | None:
    """Steps per canary unit of CPU time of a CPU run directory, or None where it cannot be measured.

    ``1 / cost`` per steady-state step, ``cost`` the step's CPU time divided
    by the canary probe's CPU time next to it, busiest rank
    (:func:`analyzer.metrics.machine_speed.canary_cost_per_step`; docs/ci.md
    "Machine speed"). ``through_step``: the run cut after that step
    (bench_gate's shorter lengths). None for trace folders, GPU runs, runs
    without ``cpu_ms`` or the canary, or with fewer than 3 probes on a rank.
    """
    manifest, metrics = a.run_manifest, a.metrics
    if a.kind != "reftrain" or manifest.hw.device_type != "cpu" or metrics is None:
        return None
    cost = canary_cost_per_step(
        metrics,
        warmup_steps=manifest.warmup_steps or 0,
        profiled_steps=manifest.profiled_steps,
        through_step=through_step,
    )
    if cost is None:
        return None
    return StepSamples(
        metric="steps_per_canary",
        values=1.0 / cost.to_numpy(dtype=np.float64),
        steps=cost.index.to_numpy(dtype=np.int64),
        source=f"{label}: metrics cpu_ms / canary_cpu_ms within {WINDOW_STEPS} steps, busiest rank, {len(cost)} step(s)",
        n_ranks=int(metrics["rank"].nunique()),
    )
