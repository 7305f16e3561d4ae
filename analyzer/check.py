"""The CI gate: did the candidate run get slower than the baseline?

Pure functions over steady-state step samples; the CLI (``analyzer check``)
does the reading and printing.

Definitions (also in docs/ci.md):

* **Sample**: one value per steady-state optimizer step, higher is better:
  MFU when both runs have it, else throughput (tokens/s for run directories,
  steps/s for trace folders). A step's value is the mean over ranks of the
  per-rank value. Ranks are not pooled as separate samples: in a synchronous
  data-parallel step every rank waits for the others at the gradient
  collective, so the ranks of one step are one observation, not world_size
  independent ones, and pooling them would overstate significance.
* **Drop**: ``(median(base) - median(cand)) / median(base)``, relative, so
  0.05 means the candidate's median is 5% lower. Negative means faster.
* **Regression** iff ``drop > max_drop`` AND the one-sided Mann-Whitney U
  test (H1: candidate values are stochastically smaller than baseline
  values) gives ``p < alpha``. Both are needed: the threshold says the
  slowdown matters, the test says it is not noise.

Why Mann-Whitney U rather than a bootstrap interval of the median ratio: it
is deterministic (a CI gate must give the same answer twice on the same
data; a bootstrap needs a seed and its interval moves with it), it makes no
distributional assumption, one slow outlier step (a GC pause, a busy CI
neighbour) moves it by one rank position only, and its exact null
distribution is correct for the small samples CI jobs have (10 to 50 steps),
where percentile bootstrap intervals of a median undercover. Its assumption
is that steps are exchangeable within a run; consecutive steps on a busy
machine are mildly autocorrelated, which makes p slightly optimistic. The
relative-drop threshold is the guard against that.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from analyzer.compare import candidate_peak_scale
from analyzer.errors import AnalyzerError

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis
    from analyzer.compare import Comparison, Delta

Metric = Literal["mfu", "tokens_per_s", "steps_per_s"]
METRIC_LABELS: dict[str, str] = {
    "mfu": "MFU",
    "tokens_per_s": "throughput (tokens/s per rank)",
    "steps_per_s": "throughput (steps/s)",
}
# A drop this close to the threshold counts as *at* the threshold: relative
# drops are computed in floating point ((1.0 - 0.95) / 1.0 is 0.0500000000000000444).
_DROP_ROUNDING = 1e-9


@dataclass(frozen=True)
class CheckConfig:
    """Knobs of the gate (CLI: ``--max-mfu-drop``, ``--alpha``)."""

    max_drop: float = 0.05  # relative drop of the median allowed (0.05 = 5%)
    alpha: float = 0.05  # significance level of the one-sided Mann-Whitney U test

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_drop < 1.0:
            raise AnalyzerError(f"--max-mfu-drop must be in [0, 1), got {self.max_drop}")
        if not 0.0 < self.alpha < 1.0:
            raise AnalyzerError(f"--alpha must be in (0, 1), got {self.alpha}")


@dataclass(frozen=True)
class StepSamples:
    """Steady-state per-step values of one run (higher is better).

    ``values[i]`` belongs to optimizer step ``steps[i]``; ``source`` says in
    words where they came from and what was excluded.
    """

    metric: Metric
    values: np.ndarray
    steps: np.ndarray
    source: str
    n_ranks: int

    @property
    def median(self) -> float:
        return float(np.median(self.values))


@dataclass(frozen=True)
class CheckResult:
    """Outcome of the gate; JSON-serializable through :meth:`to_json`."""

    verdict: Literal["pass", "regression"]
    metric: Metric
    base_median: float
    cand_median: float
    drop: float  # relative, (base - cand) / base of the medians
    max_drop: float
    p_value: float  # one-sided Mann-Whitney U, H1: cand < base
    alpha: float
    n_base: int
    n_cand: int
    exceeds_threshold: bool
    significant: bool
    base_source: str
    cand_source: str
    notes: list[str] = field(default_factory=list)

    @property
    def regression(self) -> bool:
        return self.verdict == "regression"

    @property
    def metric_label(self) -> str:
        return METRIC_LABELS[self.metric]

    def to_json(self) -> dict:
        out = asdict(self)
        out["schema"] = "analyzer.check/1"
        out["metric_label"] = self.metric_label
        return out


def min_one_sided_p(n_base: int, n_cand: int) -> float:
    """Smallest p-value the exact one-sided Mann-Whitney U test can reach.

    It is reached when every candidate value is below every baseline value:
    one ordering out of ``C(n_base + n_cand, n_cand)`` equally likely ones.
    """
    from scipy.special import comb  # a float (inf when huge): 1 / math.comb overflowed float() past ~1030 steps

    return float(1.0 / comb(n_base + n_cand, n_cand))


def mann_whitney_less(base: np.ndarray, cand: np.ndarray) -> float:
    """One-sided p-value of H1 "cand is stochastically smaller than base".

    scipy picks the exact distribution for small samples without ties and
    the tie-corrected normal approximation otherwise. When every value is
    identical the statistic has zero variance and scipy returns NaN: there
    is no evidence of a difference, so the p-value is 1.
    """
    from scipy import stats  # here, not at module level: `analyzer report` never needs scipy

    result = stats.mannwhitneyu(cand, base, alternative="less", method="auto")
    p = float(result.pvalue)
    return 1.0 if math.isnan(p) else p


def relative_drop(base_median: float, cand_median: float) -> float:
    """``(base - cand) / base``; 0.1 means the candidate is 10% lower."""
    return (base_median - cand_median) / base_median


def check_samples(base: StepSamples, cand: StepSamples, config: CheckConfig = CheckConfig()) -> CheckResult:
    """Gate a candidate against a baseline; see the module docstring.

    Raises AnalyzerError (exit 2 in the CLI) when the samples cannot decide:
    different metrics, non-finite or non-positive values, or so few steps
    that even a total separation could not be significant at ``alpha``
    (a gate that cannot fail is no gate).
    """
    if base.metric != cand.metric:
        raise AnalyzerError(
            f"incompatible runs: baseline measures {METRIC_LABELS[base.metric]}, "
            f"candidate {METRIC_LABELS[cand.metric]}"
        )
    for name, s in (("baseline", base), ("candidate", cand)):
        if len(s.values) == 0:
            raise AnalyzerError(f"{name}: no steady-state steps ({s.source})")
        if not np.all(np.isfinite(s.values)):
            raise AnalyzerError(f"{name}: non-finite {METRIC_LABELS[s.metric]} values ({s.source})")
        if np.any(s.values <= 0):
            raise AnalyzerError(f"{name}: {METRIC_LABELS[s.metric]} must be positive ({s.source})")
    n_base, n_cand = len(base.values), len(cand.values)
    p_floor = min_one_sided_p(n_base, n_cand)
    if p_floor >= config.alpha:
        raise AnalyzerError(
            f"too few steady-state steps ({n_base} baseline, {n_cand} candidate): the test "
            f"cannot reach p < {config.alpha} (best possible p = {p_floor:.3g}); run more steps"
        )
    base_median, cand_median = base.median, cand.median
    drop = relative_drop(base_median, cand_median)
    p_value = mann_whitney_less(base.values, cand.values)
    exceeds = drop - config.max_drop > _DROP_ROUNDING
    significant = p_value < config.alpha
    notes = []
    if exceeds and not significant:
        notes.append(
            f"the median dropped {drop:.1%}, beyond {config.max_drop:.1%}, but the step-to-step "
            f"noise makes it not significant (p = {p_value:.3g} >= {config.alpha})"
        )
    return CheckResult(
        verdict="regression" if exceeds and significant else "pass",
        metric=base.metric,
        base_median=base_median,
        cand_median=cand_median,
        drop=drop,
        max_drop=config.max_drop,
        p_value=p_value,
        alpha=config.alpha,
        n_base=n_base,
        n_cand=n_cand,
        exceeds_threshold=exceeds,
        significant=significant,
        base_source=base.source,
        cand_source=cand.source,
        notes=notes,
    )


def samples_from_metrics(
    metrics: pd.DataFrame,
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
    frame = pd.DataFrame({"rank": steps["rank"].to_numpy(), "step": steps["step"].to_numpy(), "value": values.to_numpy()})
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


# ----------------------------------------------------------------- runs
@dataclass
class GateOutcome:
    """The gate's verdict on two analyzed runs plus what changed between them."""

    result: CheckResult
    comparison: "Comparison"
    notes: list[str] = field(default_factory=list)

    @property
    def explanation(self) -> str:
        """The paragraph ``analyzer check`` prints (:func:`explain`)."""
        return explain(self)

    def to_json(self) -> dict:
        out = self.result.to_json()
        out["notes"] = list(self.result.notes) + list(self.notes)
        out["explanation"] = self.explanation
        out["compare"] = self.comparison.to_json()
        return out


def _model_identity(manifest: dict | None) -> dict:
    manifest = manifest or {}
    config = manifest.get("config") or {}
    return {
        "model": config.get("model"),
        "params": (manifest.get("params") or {}).get("total"),
        "flops_per_token": (manifest.get("flops") or {}).get("per_token"),
    }


def _describe_model(manifest: dict | None) -> str:
    ident = _model_identity(manifest)
    model = ident["model"] or {}
    preset = model.get("preset", "?") if isinstance(model, dict) else "?"
    return f"preset {preset}, {ident['params']} parameters"


def check_compatible(base: "RunAnalysis", cand: "RunAnalysis") -> list[str]:
    """Raise AnalyzerError when the runs cannot be compared; return notes otherwise.

    Incompatible: one is a reftrain run directory and the other a trace
    folder (their step samples measure different things), or two run
    directories of different models (model config, parameter count or
    FLOPs per token differ). Differing world sizes or hardware are allowed
    (MFU is per device) and noted, as are trace folders whose FLOPs per
    step (from matmul shapes) differ by more than 1%.
    """
    if base.kind != cand.kind:
        what = {"reftrain": "a reftrain run directory", "traces": "a trace folder"}
        raise AnalyzerError(
            f"incompatible runs: the baseline is {what[base.kind]}, the candidate {what[cand.kind]}"
        )
    notes: list[str] = []
    if base.kind == "reftrain":
        if _model_identity(base.manifest) != _model_identity(cand.manifest):
            raise AnalyzerError(
                f"incompatible runs: different model (baseline {_describe_model(base.manifest)}; "
                f"candidate {_describe_model(cand.manifest)})"
            )
        bw, cw = (base.manifest or {}).get("world_size"), (cand.manifest or {}).get("world_size")
        if bw != cw:
            notes.append(f"world sizes differ (baseline {bw}, candidate {cw}); MFU is per device")
        bh = ((base.manifest or {}).get("hardware") or {}).get("device_names")
        ch = ((cand.manifest or {}).get("hardware") or {}).get("device_names")
        if bh != ch:
            notes.append(f"hardware differs (baseline {bh}, candidate {ch})")
    else:
        # Trace folders carry no model identity; the FLOPs per step from the
        # matmul shapes are the closest thing to one.
        bf, cf = base.mfu.flops_per_step, cand.mfu.flops_per_step
        if bf and cf and abs(cf - bf) > 0.01 * bf:
            notes.append(
                f"FLOPs per step differ ({bf:.3g} vs {cf:.3g}): different workloads? MFU stays comparable, "
                "throughput would not"
            )
    return notes


def _mfu_samples(a: "RunAnalysis", label: str, scale: float = 1.0) -> StepSamples:
    steps = a.mfu.steps
    values = pd.to_numeric(steps["mfu"], errors="coerce").to_numpy(np.float64) * scale
    ok = np.isfinite(values)
    n_ranks = int(steps["n_ranks"].max()) if "n_ranks" in steps.columns and len(steps) else len(a.ranks)
    where = a.mfu.step_time_source or a.mfu.source
    if not ok.any():
        raise AnalyzerError(f"{label}: no steady-state steps with an MFU ({where})")
    return StepSamples("mfu", values[ok], steps["step"].to_numpy(np.int64)[ok], f"MFU per step, {where}", n_ranks)


def run_samples(base: "RunAnalysis", cand: "RunAnalysis") -> tuple[StepSamples, StepSamples, list[str]]:
    """Steady-state samples of both runs on a common metric, and notes on the choice.

    MFU when both runs have it from the same source (run directories: the
    manifest's FLOPs over the metrics records' step times; trace folders:
    shape FLOPs over ProfilerStep windows); otherwise throughput: tokens/s
    per rank from the metrics records, or steps/s from ProfilerStep windows.

    When both runs' peaks were *measured* by reftrain on the same hardware
    (CPU runs), the candidate's MFU is recomputed with the baseline's peak:
    a measured peak differs a little from run to run, and that difference
    is one constant factor on every step, which the test would take for
    a real change.
    """
    notes: list[str] = []
    if base.mfu.source != "none" and base.mfu.source == cand.mfu.source:
        scale, scale_note = candidate_peak_scale(base, cand)
        if scale_note:
            notes.append(scale_note)
        return _mfu_samples(base, "baseline"), _mfu_samples(cand, "candidate", scale), notes
    why = (
        f"MFU unavailable ({'baseline' if base.mfu.source == 'none' else 'candidate'}: "
        f"{(base.mfu if base.mfu.source == 'none' else cand.mfu).reason})"
        if "none" in (base.mfu.source, cand.mfu.source)
        else f"MFU sources differ ({base.mfu.source} vs {cand.mfu.source})"
    )
    if base.kind == "reftrain":
        notes.append(f"{why}: gating on throughput (tokens/s per rank) instead")

        def tokens(a: "RunAnalysis", label: str) -> StepSamples:
            manifest = a.manifest or {}
            return samples_from_metrics(
                a.metrics,
                warmup_steps=int(manifest.get("warmup_steps") or 0),
                profiled_steps=list(manifest.get("profiled_steps") or []),
                metric="tokens_per_s",
                label=label,
            )

        return tokens(base, "baseline"), tokens(cand, "candidate"), notes
    notes.append(f"{why}: gating on throughput (steps/s from ProfilerStep durations) instead")
    return (
        samples_from_steps(base.steps, value_column="step_time_ms", metric="steps_per_s", label="baseline"),
        samples_from_steps(cand.steps, value_column="step_time_ms", metric="steps_per_s", label="candidate"),
        notes,
    )


def check(
    baseline: "RunAnalysis", candidate: "RunAnalysis", *, max_drop: float = 0.05, alpha: float = 0.05
) -> GateOutcome:
    """The CI gate on two analyzed runs (``analyzer check``).

    Checks that the runs can be compared, takes their steady-state samples
    (:func:`run_samples`), applies :func:`check_samples` with ``max_drop``
    and ``alpha``, and compares the runs for the explanation. Raises
    AnalyzerError when the runs are incompatible or have too few
    steady-state steps.
    """
    from analyzer.compare import compare

    config = CheckConfig(max_drop=max_drop, alpha=alpha)
    notes = check_compatible(baseline, candidate)
    base_samples, cand_samples, sample_notes = run_samples(baseline, candidate)
    result = check_samples(base_samples, cand_samples, config)
    return GateOutcome(result=result, comparison=compare(baseline, candidate), notes=notes + sample_notes)


def _value_text(metric: str, value: float) -> str:
    if metric == "mfu":
        return f"{100 * value:.2f}%"
    if metric == "tokens_per_s":
        return f"{value:,.0f} tokens/s"
    return f"{value:.3f} steps/s"


def _signed_ms(d: "Delta") -> str:
    pct = f", {d.delta_pct:+.0f}%" if d.delta_pct is not None else ", new"
    return f"{d.name} {d.delta:+.1f} ms{pct}"


def explain(outcome: GateOutcome) -> str:
    """One paragraph: the verdict, the numbers behind it, and what got slower."""
    r, c = outcome.result, outcome.comparison
    label = r.metric_label
    head = (
        f"median {label} {_value_text(r.metric, r.base_median)} -> {_value_text(r.metric, r.cand_median)} "
        f"(drop {r.drop:+.1%}, allowed {r.max_drop:.1%}; one-sided Mann-Whitney p = {r.p_value:.2g}, "
        f"alpha {r.alpha}; {r.n_base} vs {r.n_cand} steady-state steps)"
    )
    if r.regression:
        text = f"Regression: {head}."
    elif r.exceeds_threshold:
        text = f"Within bounds: {head}; the drop exceeds the threshold but is not significant given the step-to-step noise."
    elif r.drop > 0 and r.significant:
        text = f"Within bounds: {head}; a significant but allowed slowdown."
    else:
        text = f"Within bounds: {head}."
    st = c.step_time
    if st.base is not None and st.cand is not None:
        text += f" Mean step time {st.base:.1f} -> {st.cand:.1f} ms ({st.delta:+.1f} ms"
        text += f", {st.delta_pct:+.1f}%)." if st.delta_pct is not None else ")."
    if r.regression or r.drop > 0:
        grew = c.growing_phases(3)
        if grew:
            text += " Largest growth by phase: " + "; ".join(_signed_ms(d) for d in grew) + "."
        kernels = c.growing_kernels(3)
        if kernels:
            text += " By kernel (per profiled step): " + "; ".join(_signed_ms(d) for d in kernels) + "."
    for note in outcome.notes:
        text += f" Note: {note}."
    return text
