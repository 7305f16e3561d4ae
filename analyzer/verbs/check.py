"""The CI gate: did the candidate run get slower than the baseline(s)?

Pure functions over steady-state step samples; the CLI (``analyzer check``)
does the reading and printing.

Definitions (also in docs/ci.md, with the reasons for each choice):

* **Sample**: one value per steady-state optimizer step, higher is better:
  MFU when the runs have it, else throughput (tokens/s for run directories,
  steps/s for trace folders). A step's value is the mean over ranks of the
  per-rank value. Ranks are not pooled as separate samples: in a synchronous
  data-parallel step every rank waits for the others at the gradient
  collective, so the ranks of one step are one observation.
* **Statistic**: the ``quantile``-th quantile of *step time*, i.e. the
  ``1 - quantile`` quantile of the higher-is-better value (default
  ``quantile = 0.25``: the fast quarter of the steps). Interference from
  other work on the machine only ever adds time to a step, so the fast
  steps are the ones closest to what the code itself costs; the median
  moves with how busy the neighbours were. Several baselines are pooled.
* **Drop**: ``(Q(base) - Q(cand)) / Q(base)``, relative: 0.05 means the
  candidate is 5 % lower. Negative means faster.
* **p**: one-sided Mann-Whitney U (H1: candidate values stochastically
  smaller than the baseline's); it says the shift is not a few odd steps.
* **Noise**: how far the runs move against *themselves*: the largest
  ``|drop|`` between the first and second half of any one run (baselines
  and candidate; halves in step order, so drift within a run counts) and
  between any two baselines (run-to-run). A drop no larger than the noise
  is not evidence, whatever its p-value: p treats steps as independent,
  and consecutive steps on a busy machine are not.
* **Verdict**: ``regression`` iff drop > max_drop, p < alpha and drop >
  noise; else ``inconclusive`` (too noisy) iff noise > max_drop (the runs
  cannot vouch that a max_drop regression would have been seen) or drop >
  max_drop (a drop beyond the threshold that the noise cannot tell from
  chance); else ``pass``. The smallest drop the gate could flag on these
  runs, ``max(max_drop, noise)``, is reported as ``min_detectable_drop``.
* **Machine speed** (CPU runs with the canary that the recorder and reftrain
  write, a fixed compute probe timed between steps): the gate runs again with the candidate's values
  put on the baselines' machine speed; a regression or a pass that does
  not survive that becomes inconclusive (:func:`machine_speed_gate`). Each
  step's CPU time divided by the probe's next to it (the cost) is gated
  too, and decides where the wall clock is too noisy (:func:`canary_cost_gate`).

Deterministic (the same runs always give the same verdict): no resampling,
no seed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from itertools import combinations
from typing import TYPE_CHECKING, Literal, Sequence

import numpy as np
import pandas as pd

from analyzer.verbs.compare import candidate_peak_scale, labelled
from analyzer.errors import AnalyzerError
from analyzer.ingest.formats import Inject, RunManifest
from analyzer.metrics.machine_speed import WINDOW_STEPS, canary_cost_per_step
from analyzer.render.format import short_kernel_name, value_text

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis
    from analyzer.verbs.compare import Comparison, Delta

Metric = Literal["mfu", "tokens_per_s", "steps_per_s", "cpu_steps_per_s", "canary_probes_per_s", "steps_per_canary"]
Verdict = Literal["pass", "regression", "inconclusive"]
# The word ``analyzer check`` prints for each verdict (the step statistic's and the overall one alike).
VERDICT_LABELS: dict[str, str] = {
    "pass": "PASS",
    "regression": "REGRESSION",
    "inconclusive": "INCONCLUSIVE (too noisy)",
}
METRIC_LABELS: dict[str, str] = {
    "mfu": "MFU",
    "tokens_per_s": "throughput (tokens/s per rank)",
    "steps_per_s": "throughput (steps/s)",
    "cpu_steps_per_s": "steps per CPU-second (busiest rank)",
    "canary_probes_per_s": "machine-speed canary probes per second",
    "steps_per_canary": "steps per canary unit of CPU time (busiest rank)",
}
# A drop this close to the threshold counts as *at* the threshold: relative
# drops are computed in floating point ((1.0 - 0.95) / 1.0 is 0.0500000000000000444).
_DROP_ROUNDING = 1e-9
# Each half of a run needs this many steps for its quantile to mean anything.
_MIN_HALF = 4


@dataclass(frozen=True)
class CheckConfig:
    """Knobs of the gate (CLI: ``--max-mfu-drop``, ``--alpha``, ``--quantile``)."""

    max_drop: float = 0.05  # relative drop of the statistic allowed (0.05 = 5%)
    alpha: float = 0.05  # significance level of the one-sided Mann-Whitney U test
    quantile: float = 0.25  # quantile of step time compared (0.5 = median; lower = faster steps)

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_drop < 1.0:
            raise AnalyzerError(f"--max-mfu-drop must be in [0, 1), got {self.max_drop}")
        if not 0.0 < self.alpha < 1.0:
            raise AnalyzerError(f"--alpha must be in (0, 1), got {self.alpha}")
        if not 0.0 < self.quantile < 1.0:
            raise AnalyzerError(f"--quantile must be in (0, 1), got {self.quantile}")


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
class CheckResult:
    """Outcome of the gate; JSON-serializable through :meth:`to_json`."""

    verdict: Verdict
    metric: Metric
    base_median: float  # pooled baselines
    cand_median: float
    base_value: float  # the statistic: the (1 - quantile) quantile of the values
    cand_value: float
    quantile: float  # of step time
    drop: float  # relative, (base - cand) / base of the statistic
    max_drop: float
    p_value: float  # one-sided Mann-Whitney U, H1: cand < base
    alpha: float
    noise: float  # largest |drop| of the runs against themselves (split halves, baselines pairwise)
    noise_source: str  # which comparison gave it
    min_detectable_drop: float  # max(max_drop, noise)
    n_base: int  # steps, all baselines
    n_cand: int
    n_baselines: int
    exceeds_threshold: bool
    significant: bool
    base_source: str
    cand_source: str
    notes: list[str] = field(default_factory=list)

    @property
    def regression(self) -> bool:
        return self.verdict == "regression"

    @property
    def inconclusive(self) -> bool:
        return self.verdict == "inconclusive"

    @property
    def verdict_label(self) -> str:
        """The word ``analyzer check`` prints: PASS, REGRESSION or INCONCLUSIVE (too noisy)."""
        return VERDICT_LABELS[self.verdict]

    @property
    def metric_label(self) -> str:
        return METRIC_LABELS[self.metric]

    @property
    def statistic_label(self) -> str:
        """E.g. ``MFU at the 25th percentile of step time``."""
        if self.quantile == 0.5:
            return f"median {self.metric_label}"
        return f"{self.metric_label} at the {_ordinal(self.quantile)} percentile of step time"

    def to_json(self) -> dict:
        out = asdict(self)
        out["schema"] = "analyzer.check/2"
        out["metric_label"] = self.metric_label
        return out


def _ordinal(q: float) -> str:
    n = round(100 * q, 1)
    text = f"{n:g}"
    suffix = (
        "th" if 10 <= n % 100 < 20 or not float(n).is_integer() else {1: "st", 2: "nd", 3: "rd"}.get(int(n) % 10, "th")
    )
    return text + suffix


def min_one_sided_p(n_base: int, n_cand: int) -> float:
    """Smallest p-value the exact one-sided Mann-Whitney U test can reach.

    It is reached when every candidate value is below every baseline value:
    one ordering out of ``C(n_base + n_cand, n_cand)`` equally likely ones.
    ``scipy.special.comb`` in floating point: ``1 / math.comb`` overflows
    ``float()`` from about 1030 + 1030 steps.
    """
    from scipy.special import comb

    return float(1.0 / comb(n_base + n_cand, n_cand, exact=False))


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


def relative_drop(base_value: float, cand_value: float) -> float:
    """``(base - cand) / base``; 0.1 means the candidate is 10% lower."""
    return (base_value - cand_value) / base_value


def fast_quantile(values: np.ndarray, quantile: float) -> float:
    """The ``quantile`` of step time for higher-is-better ``values``: their ``1 - quantile`` quantile.

    Linear interpolation between order statistics (numpy's default), so a
    constant shift or scale of every value moves it exactly as much.
    """
    return float(np.quantile(values, 1.0 - quantile))


def self_noise(runs: Sequence[tuple[str, np.ndarray]], quantile: float) -> tuple[float, str]:
    """How far the runs' statistic moves against themselves; see the module docstring.

    ``runs`` are ``(label, values in step order)``. Returns the largest
    ``|relative drop|`` among: first half vs second half of each run with at
    least ``2 * _MIN_HALF`` steps, and every pair of runs labelled
    ``baseline...``; and a text naming where it came from. 0.0 with
    ``"no run long enough to split"`` when nothing could be measured.
    """
    found: list[tuple[float, str]] = []
    for label, values in runs:
        if len(values) >= 2 * _MIN_HALF:
            half = len(values) // 2
            first, second = fast_quantile(values[:half], quantile), fast_quantile(values[half:], quantile)
            found.append((abs(relative_drop(first, second)), f"{label}: first half vs second half"))
    bases = [(label, fast_quantile(v, quantile)) for label, v in runs if label.startswith("baseline")]
    for (la, qa), (lb, qb) in combinations(bases, 2):
        found.append((abs(relative_drop(qa, qb)), f"{la} vs {lb}"))
    if not found:
        return 0.0, "no run long enough to split"
    return max(found, key=lambda t: t[0])


def _validate(name: str, s: StepSamples) -> None:
    if len(s.values) == 0:
        raise AnalyzerError(f"{name}: no steady-state steps ({s.source})")
    if not np.all(np.isfinite(s.values)):
        raise AnalyzerError(f"{name}: non-finite {METRIC_LABELS[s.metric]} values ({s.source})")
    if np.any(s.values <= 0):
        raise AnalyzerError(f"{name}: {METRIC_LABELS[s.metric]} must be positive ({s.source})")


def check_samples(
    base: StepSamples | Sequence[StepSamples], cand: StepSamples, config: CheckConfig = CheckConfig()
) -> CheckResult:
    """Gate a candidate against one or more baselines; see the module docstring.

    Raises AnalyzerError (exit 2 in the CLI) when the samples cannot decide:
    different metrics, non-finite or non-positive values, or so few steps
    that even a total separation could not be significant at ``alpha``
    (a gate that cannot fail is no gate).
    """
    bases = [base] if isinstance(base, StepSamples) else list(base)
    if not bases:
        raise AnalyzerError("no baseline given")
    for b in bases:
        if b.metric != cand.metric:
            raise AnalyzerError(
                f"incompatible runs: baseline measures {METRIC_LABELS[b.metric]}, "
                f"candidate {METRIC_LABELS[cand.metric]}"
            )
    labels = ["baseline"] if len(bases) == 1 else [f"baseline {i + 1}" for i in range(len(bases))]
    for label, b in zip(labels, bases):
        _validate(label, b)
    _validate("candidate", cand)
    pooled = np.concatenate([b.values for b in bases])
    n_base, n_cand = len(pooled), len(cand.values)
    p_floor = min_one_sided_p(n_base, n_cand)
    if p_floor >= config.alpha:
        raise AnalyzerError(
            f"too few steady-state steps ({n_base} baseline, {n_cand} candidate): the test "
            f"cannot reach p < {config.alpha} (best possible p = {p_floor:.3g}); run more steps"
        )
    q = config.quantile
    base_value, cand_value = fast_quantile(pooled, q), fast_quantile(cand.values, q)
    drop = relative_drop(base_value, cand_value)
    p_value = mann_whitney_less(pooled, cand.values)
    noise, noise_source = self_noise([*zip(labels, (b.values for b in bases)), ("candidate", cand.values)], q)
    exceeds = drop - config.max_drop > _DROP_ROUNDING
    significant = p_value < config.alpha
    beyond_noise = drop > noise
    notes = []
    if exceeds and significant and beyond_noise:
        verdict: Verdict = "regression"
    elif exceeds or noise - config.max_drop > _DROP_ROUNDING:
        verdict = "inconclusive"
        if exceeds and not significant:
            notes.append(
                f"the drop {drop:.1%} is beyond {config.max_drop:.1%}, but the step-to-step noise "
                f"makes it not significant (p = {p_value:.3g} >= {config.alpha})"
            )
        elif exceeds:
            notes.append(
                f"the drop {drop:.1%} is beyond {config.max_drop:.1%}, but the runs move as much "
                f"against themselves ({noise:.1%}, {noise_source})"
            )
        else:
            notes.append(
                f"the runs move {noise:.1%} against themselves ({noise_source}), more than the "
                f"{config.max_drop:.1%} allowed: a regression of that size could have been missed"
            )
    else:
        verdict = "pass"
    return CheckResult(
        verdict=verdict,
        metric=cand.metric,
        base_median=float(np.median(pooled)),
        cand_median=cand.median,
        base_value=base_value,
        cand_value=cand_value,
        quantile=q,
        drop=drop,
        max_drop=config.max_drop,
        p_value=p_value,
        alpha=config.alpha,
        noise=noise,
        noise_source=noise_source,
        min_detectable_drop=max(config.max_drop, noise),
        n_base=n_base,
        n_cand=n_cand,
        n_baselines=len(bases),
        exceeds_threshold=exceeds,
        significant=significant,
        base_source="; ".join(b.source for b in bases),
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


# ----------------------------------------------------------------- goodput
@dataclass(frozen=True)
class GoodputGate:
    """``check --min-goodput G``: the candidate's goodput against a floor (docs/ci.md "Goodput").

    Goodput is one number per run (productive step time / wall time,
    :mod:`analyzer.metrics.goodput`), not a sample per step, so there is no
    test statistic: the gate fails iff ``goodput < min_goodput``. The
    first baseline's goodput is kept beside it for context only.
    """

    min_goodput: float
    goodput: float
    wall_s: float
    productive_s: float
    lost_s: dict[str, float]
    attempts: int
    base_goodput: float | None = None

    @property
    def failed(self) -> bool:
        return not self.goodput >= self.min_goodput  # a NaN goodput (zero wall time) fails too

    def lost_text(self, top: int = 3) -> str:
        """The largest losses, e.g. ``restarts 12.3 s, recomputed 4.0 s``."""
        parts = sorted(((v, k) for k, v in self.lost_s.items() if v > 0.005), reverse=True)[:top]
        return ", ".join(f"{k} {v:.2f} s" for v, k in parts) or "none"

    def text(self) -> str:
        base = f"; baseline {self.base_goodput:.1%}" if self.base_goodput is not None else ""
        state = "below the floor" if self.failed else "at or above the floor"
        return (
            f"goodput {self.goodput:.1%} ({state} {self.min_goodput:.1%}; productive {self.productive_s:.2f} s "
            f"of wall {self.wall_s:.2f} s, {self.attempts} attempt(s){base}); largest losses: {self.lost_text()}"
        )

    def to_json(self) -> dict:
        return asdict(self) | {"failed": self.failed}


def goodput_gate(candidate: "RunAnalysis", min_goodput: float, baseline: "RunAnalysis | None" = None) -> GoodputGate:
    """The goodput floor on the candidate; AnalyzerError (exit 2) when its goodput is withheld."""
    if not 0.0 <= min_goodput <= 1.0:
        raise AnalyzerError(f"--min-goodput must be between 0 and 1, got {min_goodput}")
    gp = candidate.goodput()
    if gp is None:
        raise AnalyzerError(
            f"--min-goodput: {candidate.path}: no goodput (it needs a reftrain run directory with run.json start "
            "times and per-step records; a folder of traces has neither)"
        )
    base = baseline.goodput() if baseline is not None else None
    return GoodputGate(
        min_goodput=min_goodput,
        goodput=gp.goodput,
        wall_s=gp.wall_s,
        productive_s=gp.productive_s,
        lost_s=dict(gp.lost_s),
        attempts=gp.attempts,
        base_goodput=None if base is None else base.goodput,
    )


# ----------------------------------------------------------------- memory
@dataclass(frozen=True)
class MemoryGate:
    """``check --max-memory-growth FRAC``: the candidate's peak memory against the baselines' (docs/ci.md "Memory").

    Peak memory is one number per run (``RunAnalysis.memory``: the max over
    ranks of each rank's peak allocated bytes, or resident set on CPU;
    docs/metrics.md "Memory"), nearly deterministic on a GPU, so there is no
    test statistic: the gate fails iff ``growth = (cand - base) / base``
    exceeds ``max_growth``, ``base`` being the largest of the baselines'
    peaks (several baselines: the candidate must outgrow all of them).
    ``reserved_growth``: the same on peak reserved bytes, for context.
    """

    max_growth: float
    growth: float
    base_bytes: float
    cand_bytes: float
    kind: str
    source: str
    reserved_growth: float | None = None

    @property
    def failed(self) -> bool:
        return self.growth > self.max_growth

    def text(self) -> str:
        what = "resident set" if self.kind == "cpu_rss" else "allocated"
        state = "over" if self.failed else "within"
        reserved = f"; reserved {self.reserved_growth:+.1%}" if self.reserved_growth is not None else ""
        return (
            f"peak memory {self.base_bytes / 2**20:,.1f} -> {self.cand_bytes / 2**20:,.1f} MiB {what} "
            f"({self.growth:+.1%}, {state} the allowed {self.max_growth:+.1%}{reserved}; {self.source} {self.kind}, "
            "max over ranks)"
        )

    def to_json(self) -> dict:
        return asdict(self) | {"failed": self.failed}


def memory_gate(bases: "Sequence[RunAnalysis]", candidate: "RunAnalysis", max_growth: float) -> MemoryGate:
    """The peak-memory gate (:class:`MemoryGate`); AnalyzerError (exit 2) when a run has no peak memory or
    the runs' figures are not of the same kind (GPU allocated against CPU resident set, records against traces)."""
    if not max_growth >= 0.0:
        raise AnalyzerError(f"--max-memory-growth must be >= 0 (a fraction: 0.05 allows +5%), got {max_growth}")
    runs = [("candidate", candidate)] + [
        ("baseline" if len(bases) == 1 else f"baseline {i + 1}", b) for i, b in enumerate(bases)
    ]
    for label, a in runs:
        if not a.memory.peak_allocated_bytes:
            raise AnalyzerError(
                f"--max-memory-growth: the {label} ({a.path}) has no peak memory (needs metrics records "
                "with mem_bytes, or traces taken with profile_memory=True)"
            )
    kinds = {(a.memory.source, a.memory.kind) for _, a in runs}
    if len(kinds) > 1:
        raise AnalyzerError(
            "--max-memory-growth: the runs' peak memory figures differ in kind ("
            + "; ".join(f"{label}: {a.memory.source} {a.memory.kind}" for label, a in runs)
            + "); they cannot be compared"
        )
    base = max(float(b.memory.peak_allocated_bytes or 0.0) for b in bases)
    cand = float(candidate.memory.peak_allocated_bytes or 0.0)
    reserved = [b.memory.peak_reserved_bytes for b in bases]
    rc = candidate.memory.peak_reserved_bytes
    rb = max(r for r in reserved) if all(r for r in reserved) else None
    return MemoryGate(
        max_growth=max_growth,
        growth=(cand - base) / base,
        base_bytes=base,
        cand_bytes=cand,
        kind=str(candidate.memory.kind),
        source=str(candidate.memory.source),
        reserved_growth=(rc - rb) / rb if rb and rc is not None else None,
    )


# ----------------------------------------------------------------- runs
@dataclass
class GateOutcome:
    """The gate's verdict on two analyzed runs plus what changed between them."""

    result: CheckResult
    comparison: "Comparison"
    notes: list[str] = field(default_factory=list)
    cpu: CheckResult | None = None  # the same gate on CPU time per step (CPU runs with ``cpu_ms``), else None
    # The gated per-step values (baselines, candidate) for the HTML page's chart (analyzer/render/html.py).
    samples: tuple[list[StepSamples], StepSamples] | None = None
    goodput: GoodputGate | None = None  # ``--min-goodput``, else None
    memory: MemoryGate | None = None  # ``--max-memory-growth``, else None
    machine: "MachineSpeed | None" = None  # the machine-speed canary of every run, else None

    def __repr__(self) -> str:
        # A console shows this; the generated repr printed both runs' comparison and samples (several KB).
        # A notebook shows the HTML view instead (analyzer/render/notebook.py).
        r = self.result
        return (
            f"<GateOutcome {self.verdict_label}: {self.comparison.base_path} -> {self.comparison.cand_path}"
            + f"\n  {r.statistic_label}: {value_text(r.metric, r.base_value)} -> {value_text(r.metric, r.cand_value)}"
            + f" (drop {r.drop:+.1%}, allowed {r.max_drop:.1%}, p = {r.p_value:.2g}, noise {r.noise:.1%})>"
        )

    @property
    def verdict(self) -> Verdict:
        """The gate's overall verdict (the exit code): a goodput below its floor, or peak memory grown beyond
        its allowance, is a regression whatever the step statistics say; otherwise the step-statistic verdict."""
        if self.goodput is not None and self.goodput.failed:
            return "regression"
        if self.memory is not None and self.memory.failed:
            return "regression"
        return self.result.verdict

    @property
    def regression(self) -> bool:
        return self.verdict == "regression"

    @property
    def inconclusive(self) -> bool:
        return self.verdict == "inconclusive"

    @property
    def verdict_label(self) -> str:
        return VERDICT_LABELS[self.verdict]

    @property
    def explanation(self) -> str:
        """The paragraph ``analyzer check`` prints (:func:`explain`)."""
        return explain(self)

    def to_json(self) -> dict:
        out = self.result.to_json()
        out["notes"] = list(self.result.notes) + list(self.notes)
        out["explanation"] = self.explanation
        out["cpu_time"] = (
            None
            if self.cpu is None
            else {k: v for k, v in self.cpu.to_json().items() if k not in ("schema", "base_source", "cand_source")}
        )
        out["compare"] = self.comparison.to_json()
        # ``verdict`` is the overall one (the exit code); ``step_verdict`` that of the step statistic alone.
        out["step_verdict"] = self.result.verdict
        out["verdict"] = self.verdict
        out["goodput"] = None if self.goodput is None else self.goodput.to_json()
        out["memory"] = None if self.memory is None else self.memory.to_json()
        out["machine_speed"] = None if self.machine is None else self.machine.to_json()
        return out


def _model_identity(manifest: RunManifest) -> dict:
    return {
        "model": (manifest.config or {}).get("model"),
        "params": manifest.params.total if manifest.params else None,
        "flops_per_token": manifest.model_flops.per_token,
    }


def _describe_model(manifest: RunManifest) -> str:
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
        raise AnalyzerError(f"incompatible runs: the baseline is {what[base.kind]}, the candidate {what[cand.kind]}")
    notes: list[str] = []
    if base.kind == "reftrain":
        bm, cm = base.run_manifest, cand.run_manifest
        if _model_identity(bm) != _model_identity(cm):
            raise AnalyzerError(
                f"incompatible runs: different model (baseline {_describe_model(bm)}; candidate {_describe_model(cm)})"
            )
        bw, cw = bm.world_size, cm.world_size
        if bw != cw:
            notes.append(f"world sizes differ (baseline {bw}, candidate {cw}); MFU is per device")
        bh, ch = bm.hw.device_names, cm.hw.device_names
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


def _steady_per_step(a: "RunAnalysis", column: str, reduce: str, sparse: bool = False) -> pd.Series | None:
    """``column`` of a CPU run directory's steady-state records, one value per step (``reduce`` over ranks).

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
    return per_step


def cpu_samples(a: "RunAnalysis", label: str) -> StepSamples | None:
    """Steps per CPU-second of a CPU run directory, or None when it has no CPU times.

    From the metrics records' ``cpu_ms`` (the rank process's CPU time over
    the step, all threads), steady-state steps as in
    :func:`samples_from_metrics`; a step's value is ``1000 / cpu_ms`` of its
    busiest rank (a straggler's extra work shows there, not in the mean).
    None for trace folders, GPU runs (their work is not host CPU time) and
    runs written before reftrain recorded ``cpu_ms``.
    """
    per_step = _steady_per_step(a, "cpu_ms", "max")
    if per_step is None:
        return None
    return StepSamples(
        metric="cpu_steps_per_s",
        values=1000.0 / per_step.to_numpy(dtype=np.float64),
        steps=per_step.index.to_numpy(dtype=np.int64),
        source=f"{label}: metrics cpu_ms, busiest rank, {len(per_step)} step(s)",
        n_ranks=int(a.metrics["rank"].nunique()),
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
        per_step = _steady_per_step(a, column, "mean", sparse=True)
        if per_step is None:
            return None
        found.append(
            StepSamples(
                metric="canary_probes_per_s",
                values=1000.0 / per_step.to_numpy(dtype=np.float64),
                steps=per_step.index.to_numpy(dtype=np.int64),
                source=f"{label}: metrics {column}, mean over ranks, {len(per_step)} probe(s)",
                n_ranks=int(a.metrics["rank"].nunique()),
            )
        )
    return Probes(wall=found[0], cpu=found[1])


def cpu_time_veto(result: CheckResult, cpu: CheckResult) -> CheckResult:
    """A wall-clock regression that CPU time does not confirm becomes inconclusive.

    Confirmed when the CPU-time statistic drops, with p < alpha, by more
    than half the threshold and by more than half the wall-clock drop.
    Extra work shows in CPU time at least as much as on the wall clock (a
    step's CPU time is smaller than its wall time, which also holds waits),
    so a real slowdown passes easily; a crowded machine inflates CPU time
    too (caches, memory bandwidth), but far less than wall time: one
    no-change pair on this machine at load average ~10 measured a 61 %
    wall-clock drop with 19.5 % in CPU time. Otherwise the steps took
    longer without doing that much more work: a busier machine during one
    of the runs, or a slowdown that waits outside this process's CPU (a
    sleep, I/O, another process). The gate cannot tell which, so it says
    so instead of failing.

    The CPU-time drop must also exceed CPU time's own noise (split halves
    and baselines, as for the wall clock): bench_gate's one false alarm in
    34 no-change checks at 400 steps (2026-12-06, 2 busy processes) had a
    wall-clock drop of 12.5 % over 6.6 % noise and a CPU-time drop of 9.4 %,
    past half the wall drop but inside CPU time's own 11.0 % noise; none of
    the 64 injected slowdowns caught there was confirmed by less.
    """
    need = max(result.max_drop, result.drop) / 2
    confirmed = cpu.drop - need > _DROP_ROUNDING and cpu.drop - cpu.noise > _DROP_ROUNDING and cpu.significant
    if not result.regression or confirmed:
        return result
    note = (
        f"the step time grew but the CPU time per step did not confirm it ({cpu.statistic_label}: drop "
        f"{cpu.drop:+.1%}, p = {cpu.p_value:.2g}, its own noise {cpu.noise:.1%}): the machine was busier during one of the runs, or the "
        "slowdown waits outside the CPU; rerun, or gate without CPU time (--no-cpu-time)"
    )
    return replace(result, verdict="inconclusive", notes=[*result.notes, note])


def cpu_time_confirm(result: CheckResult, cpu: CheckResult) -> CheckResult:
    """A wall-clock drop that only the wall clock's noise kept from failing, confirmed by CPU time, is a regression.

    Applies when the wall-clock verdict is inconclusive although the drop
    is beyond the threshold and significant (the runs' own wall-clock noise
    was larger: a busy neighbour slowed half of one run), and the CPU-time
    gate on the same steps is itself a regression (beyond its threshold,
    p < alpha, beyond *its* noise) by more than half the threshold and half
    the wall-clock drop: the same bar as :func:`cpu_time_veto`, from the
    other side. CPU time per step moves far less with the neighbours than
    wall time does (measured: a 6x slowdown under two busy suites gave a
    wall drop of 88.7 % with 107.7 % split-half noise, and a CPU-time drop
    of 83.8 % with 10.2 % noise), so the work itself grew.
    """
    need = max(result.max_drop, result.drop) / 2
    if not (result.inconclusive and result.exceeds_threshold and result.significant):
        return result
    if not (cpu.regression and cpu.drop - need > _DROP_ROUNDING):
        return result
    note = (
        f"the wall clock alone was too noisy ({result.noise:.1%}, {result.noise_source}), but the CPU time "
        f"per step confirms the drop ({cpu.statistic_label}: drop {cpu.drop:+.1%}, p = {cpu.p_value:.2g}, "
        f"its own noise {cpu.noise:.1%}): the work per step grew"
    )
    return replace(result, verdict="regression", notes=[*result.notes, note])


def gate_samples(
    base: Sequence[StepSamples],
    cand: StepSamples,
    config: CheckConfig,
    cpu_base: Sequence[StepSamples | None] = (),
    cpu_cand: StepSamples | None = None,
) -> tuple[CheckResult, CheckResult | None]:
    """The step-statistic verdict of :func:`check` from samples alone: wall clock, then CPU time's veto and confirmation.

    CPU time takes part only when every run has it (``cpu_cand`` and each
    of ``cpu_base`` not None). Returns the verdict and the CPU-time result
    (None without it). ``bench/bench_gate.py --reuse`` calls this on
    truncated samples to measure the gate at shorter run lengths.
    """
    result = check_samples(base, cand, config)
    if cpu_cand is None or not cpu_base or any(c is None for c in cpu_base):
        return result, None
    cpu_result = check_samples([c for c in cpu_base if c is not None], cpu_cand, config)
    return cpu_time_confirm(cpu_time_veto(result, cpu_result), cpu_result), cpu_result


# Each run needs this many canary probes for its machine-speed statistic to mean anything.
_MIN_PROBES = 3


@dataclass(frozen=True)
class Probes:
    """One run's machine-speed canary: probes per second of wall time and of the probing thread's CPU time."""

    wall: StepSamples
    cpu: StepSamples

    def through(self, step: int) -> "Probes":
        """The probes up to ``step`` (a run cut by :meth:`StepSamples.head`)."""
        return Probes(wall=self.wall.through(step), cpu=self.cpu.through(step))


@dataclass(frozen=True)
class MachineSpeed:
    """How fast the machine was during the candidate's run against the baselines', from the canary.

    ``*_probe_ms``: the gate's quantile (the fast ``quantile`` of the
    probes, as for steps) of the fixed probe's wall time, baselines pooled;
    ``*_probe_cpu_ms`` the same of its CPU time. ``slowdown = cand / base -
    1`` of the wall times (+0.2: the candidate's machine was 20 % slower),
    ``cpu_slowdown`` of the CPU times. ``adjusted_drop``,
    ``adjusted_cpu_drop``: the step statistic's and the CPU-time
    statistic's drops with the machine's change taken out (the candidate's
    values multiplied by ``1 + slowdown``, resp. ``1 + cpu_slowdown``);
    ``adjusted_verdict``: the gate's verdict on those values.
    """

    base_probe_ms: float
    cand_probe_ms: float
    slowdown: float
    base_probe_cpu_ms: float
    cand_probe_cpu_ms: float
    cpu_slowdown: float
    adjusted_drop: float
    adjusted_cpu_drop: float | None
    adjusted_verdict: Verdict
    n_base: int  # probes, all baselines
    n_cand: int
    # The CPU time per step in canary units, gated (canary_cost_gate); None where it could not be measured.
    cost: "CheckResult | None" = None

    def to_json(self) -> dict:
        return asdict(self)


def _probe_ms(base: Sequence[StepSamples], cand: StepSamples, quantile: float) -> tuple[float, float]:
    pooled = np.concatenate([b.values for b in base])
    return 1000.0 / fast_quantile(pooled, quantile), 1000.0 / fast_quantile(cand.values, quantile)


def _scaled(s: StepSamples, factor: float) -> StepSamples:
    return replace(s, values=s.values * factor, source=f"{s.source}, x{factor:.4g} for the machine's speed")


def machine_speed_gate(
    base: Sequence[StepSamples],
    cand: StepSamples,
    config: CheckConfig,
    cpu_base: Sequence[StepSamples | None] = (),
    cpu_cand: StepSamples | None = None,
    probes_base: Sequence[Probes | None] = (),
    probes_cand: Probes | None = None,
) -> tuple[CheckResult, CheckResult | None, MachineSpeed | None]:
    """:func:`gate_samples`, then the verdict checked against the machine's speed (docs/ci.md "Machine speed").

    ``probes_*``: :func:`run_probes` of each run. Applies only when every
    run has at least ``_MIN_PROBES`` probes; otherwise the verdict of
    :func:`gate_samples` is returned as it is, with None. The gate runs
    again with the candidate's values put on the baselines' machine speed
    (its wall-clock values multiplied by its probe's wall-time ratio, its
    CPU-time values by the probe's CPU-time ratio); then

    * a regression that is no regression there becomes inconclusive: the
      machine being slower explains it;
    * a pass that is no pass there becomes inconclusive: a faster machine
      may be hiding a regression.

    Never the other way: the canary can only withdraw a verdict, so it
    cannot add a false alarm, and a run without it is gated as before.

    CPU time's part goes through the same adjustment: a regression that
    CPU time confirms (:func:`cpu_time_veto` let it stand, or
    :func:`cpu_time_confirm` made it) is withdrawn when the probe's CPU
    time grew enough to explain the CPU-time drop, even when its wall time
    did not (contention raises the CPU time of the same work). The note
    names the larger of the two slowdowns.
    """
    result, cpu_result = gate_samples(base, cand, config, cpu_base, cpu_cand)
    runs = [*probes_base, probes_cand]
    if not probes_base or any(p is None or len(p.wall.values) < _MIN_PROBES for p in runs):
        return result, cpu_result, None
    known = [p for p in probes_base if p is not None]
    assert probes_cand is not None  # checked above with the others; for the type checker
    base_ms, cand_ms = _probe_ms([p.wall for p in known], probes_cand.wall, config.quantile)
    base_cpu, cand_cpu = _probe_ms([p.cpu for p in known], probes_cand.cpu, config.quantile)
    adjusted, adjusted_cpu = gate_samples(
        base,
        _scaled(cand, cand_ms / base_ms),
        config,
        cpu_base,
        None if cpu_cand is None else _scaled(cpu_cand, cand_cpu / base_cpu),
    )
    machine = MachineSpeed(
        base_probe_ms=base_ms,
        cand_probe_ms=cand_ms,
        slowdown=cand_ms / base_ms - 1.0,
        base_probe_cpu_ms=base_cpu,
        cand_probe_cpu_ms=cand_cpu,
        cpu_slowdown=cand_cpu / base_cpu - 1.0,
        adjusted_drop=adjusted.drop,
        adjusted_cpu_drop=None if adjusted_cpu is None else adjusted_cpu.drop,
        adjusted_verdict=adjusted.verdict,
        n_base=sum(len(p.wall.values) for p in known),
        n_cand=len(probes_cand.wall.values),
    )
    probe = f"canary probe {base_ms:.3f} -> {cand_ms:.3f} ms, CPU {base_cpu:.3f} -> {cand_cpu:.3f} ms"
    cpu_text = "" if adjusted_cpu is None else f", the CPU-time drop {adjusted_cpu.drop:+.1%}"
    taken_out = f"with that taken out the drop is {adjusted.drop:+.1%}{cpu_text}, and the gate says {adjusted.verdict}"
    if result.regression and not adjusted.regression:
        note = (
            f"inconclusive: the machine was {max(machine.slowdown, machine.cpu_slowdown):.0%} slower during the "
            f"candidate's run ({probe}); "
            f"{taken_out}: rerun"
        )
    elif result.verdict == "pass" and adjusted.verdict != "pass":
        note = (
            f"inconclusive: the machine was {-min(machine.slowdown, machine.cpu_slowdown):.0%} faster during the "
            f"candidate's run ({probe}); "
            f"{taken_out}: the faster machine may hide a regression; rerun"
        )
    else:
        return result, cpu_result, machine
    return replace(result, verdict="inconclusive", notes=[*result.notes, note]), cpu_result, machine


def cost_samples(a: "RunAnalysis", label: str, through_step: int | None = None) -> StepSamples | None:
    """Steps per canary unit of CPU time of a CPU run directory, or None where it cannot be measured.

    ``1 / cost`` per steady-state step, ``cost`` the step's CPU time divided
    by the canary probe's CPU time next to it, busiest rank
    (:func:`analyzer.metrics.machine_speed.canary_cost_per_step`; docs/ci.md
    "Machine speed"). ``through_step``: the run cut after that step
    (bench_gate's shorter lengths). None for trace folders, GPU runs, runs
    without ``cpu_ms`` or the canary, or with fewer than 3 probes on a rank.
    """
    manifest = a.run_manifest
    if a.kind != "reftrain" or manifest.hw.device_type != "cpu":
        return None
    cost = canary_cost_per_step(
        a.metrics,
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
        n_ranks=int(a.metrics["rank"].nunique()),
    )


def canary_cost_gate(
    base: Sequence[StepSamples],
    cand: StepSamples,
    config: CheckConfig,
    cpu_base: Sequence[StepSamples | None] = (),
    cpu_cand: StepSamples | None = None,
    probes_base: Sequence[Probes | None] = (),
    probes_cand: Probes | None = None,
    cost_base: Sequence[StepSamples | None] = (),
    cost_cand: StepSamples | None = None,
) -> tuple[CheckResult, CheckResult | None, MachineSpeed | None]:
    """:func:`machine_speed_gate`, then the CPU time per step in canary units decides where the wall clock cannot.

    ``cost_*``: :func:`cost_samples` of each run. Applies when the canary
    applied (``machine_speed_gate`` measured the machine's speed) and every
    run has cost samples; the cost is gated like the steps
    (:func:`check_samples`: its fast quantile, p, its own split-half and
    baseline-pair noise), and its result is stored in ``MachineSpeed.cost``.
    Then

    * an inconclusive verdict becomes a regression when the cost confirms
      it (a regression whose drop less its noise still exceeds the
      threshold) and the wall clock does not vouch against it (the wall
      clock's own verdict is not ``pass``, and it does not show the
      candidate faster by more than its noise): the work per step grew by
      more than the threshold, beyond what the runs show against
      themselves, with the machine's speed taken out step by step;
    * a regression becomes inconclusive when the cost does not confirm it:
      the steps got slower, but not the work with the machine's speed taken out.

    A pass stays a pass: the wall clock was quiet enough to vouch for the
    step time, whatever the CPU time did.
    """
    result, cpu_result, machine = machine_speed_gate(base, cand, config, cpu_base, cpu_cand, probes_base, probes_cand)
    if machine is None or cost_cand is None or not cost_base or any(c is None for c in cost_base):
        return result, cpu_result, machine
    cost = check_samples([c for c in cost_base if c is not None], cost_cand, config)
    machine = replace(machine, cost=cost)
    wall = check_samples(base, cand, config)
    wall_vouches = wall.verdict == "pass" or wall.drop < -wall.noise
    # The cost's drop less its own noise must still exceed the threshold: its runs drift against each other by
    # more than the split halves and one baseline pair show (bench_gate beside two busy loops, docs/ci.md).
    confirms = cost.regression and cost.drop - cost.noise - config.max_drop > _DROP_ROUNDING
    figures = f"{cost.statistic_label}: drop {cost.drop:+.1%}, p = {cost.p_value:.2g}, its own noise {cost.noise:.1%}"
    if result.inconclusive and confirms and not wall_vouches:
        note = (
            f"the CPU time per step with the machine's speed taken out step by step (the canary) confirms a "
            f"slowdown ({figures}) that the wall clock could not tell from its own noise ({wall.noise:.1%}): "
            "the work per step grew"
        )
        return replace(result, verdict="regression", notes=[*result.notes, note]), cpu_result, machine
    if result.regression and not confirms:
        note = (
            f"inconclusive: with the machine's speed taken out step by step (the canary), the CPU time per step "
            f"does not confirm the drop ({figures}): rerun"
        )
        return replace(result, verdict="inconclusive", notes=[*result.notes, note]), cpu_result, machine
    return result, cpu_result, machine


def injected_notes(label: str, manifest: RunManifest) -> list[str]:
    """What reftrain injected into a run on purpose (run.json ``inject``), as notes for the explanation."""
    inject = manifest.inject or Inject()
    measured = inject.measured or {}
    out = []
    if inject.slowdown:
        factors = measured.get("compute_factor") or []
        got = f" (measured {', '.join(f'{f:.2f}' for f in factors)} per rank)" if factors else ""
        out.append(f"{label}: forward and backward slowed {inject.slowdown:g}x on purpose (--inject-slowdown){got}")
    if inject.slow_rank is not None and inject.delay_ms:
        ms = measured.get("injected_ms") or []
        got = f" (measured median {max(ms):.1f} ms per step)" if ms else ""
        out.append(
            f"{label}: rank {inject.slow_rank} delayed {inject.delay_ms:g} ms per step on purpose "
            f"(--inject-slow-rank){got}"
        )
    return out


def check(
    baseline: "RunAnalysis | Sequence[RunAnalysis]",
    candidate: "RunAnalysis",
    *,
    max_drop: float = 0.05,
    alpha: float = 0.05,
    quantile: float = 0.25,
    cpu_time: bool = True,
    machine_speed: bool = True,
    min_goodput: float | None = None,
    max_memory_growth: float | None = None,
) -> GateOutcome:
    """The CI gate on analyzed runs (``analyzer check``): one baseline or several.

    Checks that every baseline can be compared with the candidate, takes
    the steady-state samples (:func:`run_samples`), applies
    :func:`check_samples`, and compares the first baseline with the
    candidate for the explanation. Raises AnalyzerError when the runs are
    incompatible or have too few steady-state steps.

    CPU run directories with per-step CPU times (``cpu_ms``) are gated on
    those too, and a wall-clock regression that CPU time does not confirm
    is inconclusive (:func:`cpu_time_veto`), while one that only the wall
    clock's own noise held back and CPU time confirms is a regression
    (:func:`cpu_time_confirm`); ``cpu_time=False`` turns both off.
    Runs that all carry the machine-speed canary (recorder/canary.py) then have the
    verdict checked against how fast the machine was during each, and
    their CPU time per step in canary units gated (:func:`canary_cost_gate`);
    ``machine_speed=False`` turns it off.

    ``min_goodput`` adds the goodput floor (:func:`goodput_gate`): a
    candidate below it is a regression (:attr:`GateOutcome.verdict`).
    ``max_memory_growth`` adds the peak-memory gate (:func:`memory_gate`):
    a candidate whose peak grew by more is a regression too.
    """
    from analyzer.verbs.compare import compare

    config = CheckConfig(max_drop=max_drop, alpha=alpha, quantile=quantile)
    bases = [baseline] if not isinstance(baseline, (list, tuple)) else list(baseline)
    if not bases:
        raise AnalyzerError("no baseline given")
    gp_gate = None if min_goodput is None else goodput_gate(candidate, min_goodput, bases[0])
    mem_gate = None if max_memory_growth is None else memory_gate(bases, candidate, max_memory_growth)
    notes: list[str] = []
    for b in bases:
        notes += [n for n in check_compatible(b, candidate) if n not in notes]
    base_samples, cand_samples, sample_notes = run_samples(bases[0], candidate, *bases[1:])
    cpu_base: list[StepSamples | None] = []
    cpu_cand = None
    if cpu_time:
        cpu_base = [cpu_samples(b, "baseline" if len(bases) == 1 else f"baseline {i + 1}") for i, b in enumerate(bases)]
        cpu_cand = cpu_samples(candidate, "candidate")
    probes_base: list[Probes | None] = []
    probes_cand = None
    labels = ["baseline"] if len(bases) == 1 else [f"baseline {i + 1}" for i in range(len(bases))]
    if machine_speed:
        probes_base = [run_probes(b, label) for b, label in zip(bases, labels)]
        probes_cand = run_probes(candidate, "candidate")
    result, cpu_result, machine = canary_cost_gate(
        base_samples,
        cand_samples,
        config,
        cpu_base,
        cpu_cand,
        probes_base,
        probes_cand,
        [cost_samples(b, label) for b, label in zip(bases, labels)] if machine_speed and cpu_time else [],
        cost_samples(candidate, "candidate") if machine_speed and cpu_time else None,
    )
    if candidate.kind == "reftrain":
        notes += injected_notes("candidate", candidate.run_manifest)
        for i, b in enumerate(bases):
            notes += injected_notes("baseline" if len(bases) == 1 else f"baseline {i + 1}", b.run_manifest)
    return GateOutcome(
        result=result,
        comparison=compare(bases[0], candidate),
        notes=notes + sample_notes,
        cpu=cpu_result,
        samples=(base_samples, cand_samples),
        goodput=gp_gate,
        memory=mem_gate,
        machine=machine,
    )


def _signed_ms(d: "Delta", kernel: bool = False, label: bool = False) -> str:
    """``name +4.1 ms, +22%``; ``label``: an op or module with its pass (``blocks.7/attn backward``)."""
    pct = f", {d.delta_pct:+.0f}%" if d.delta_pct is not None else ", new"
    name = short_kernel_name(d.name) if kernel else short_kernel_name(labelled(d)) if label else d.name
    return f"{name} {d.delta:+.1f} ms{pct}"


def explain(outcome: GateOutcome) -> str:
    """One paragraph: the verdict, the numbers behind it, and what got slower."""
    r, c = outcome.result, outcome.comparison
    runs = f"{r.n_base} vs {r.n_cand} steady-state steps" + (
        f", {r.n_baselines} baselines" if r.n_baselines > 1 else ""
    )
    head = (
        f"{r.statistic_label} {value_text(r.metric, r.base_value)} -> {value_text(r.metric, r.cand_value)} "
        f"(drop {r.drop:+.1%}, allowed {r.max_drop:.1%}; one-sided Mann-Whitney p = {r.p_value:.2g}, "
        f"alpha {r.alpha}; runs' own noise {r.noise:.1%}; {runs})"
    )
    if r.regression:
        text = f"Regression: {head}."
    elif r.inconclusive:
        text = f"Inconclusive, too noisy: {head}."
        if r.exceeds_threshold:
            text += " The drop exceeds the threshold but cannot be told from the runs' noise."
        text += (
            f" The smallest drop these runs could show is {r.min_detectable_drop:.1%} ({r.noise_source});"
            " train more steps, or pass more baselines."
        )
    elif r.drop > 0 and r.significant:
        text = f"Within bounds: {head}; a significant but allowed slowdown."
    else:
        text = f"Within bounds: {head}."
    if outcome.cpu is not None:
        k = outcome.cpu
        text += f" CPU time: {k.statistic_label} drop {k.drop:+.1%} (p = {k.p_value:.2g}, noise {k.noise:.1%})."
    if outcome.machine is not None:
        ms = outcome.machine
        text += (
            f" Machine speed (canary probe {ms.base_probe_ms:.3f} -> {ms.cand_probe_ms:.3f} ms): the candidate's "
            f"machine was {abs(ms.slowdown):.1%} {'slower' if ms.slowdown >= 0 else 'faster'}; with that taken "
            f"out the drop is {ms.adjusted_drop:+.1%} ({ms.adjusted_verdict})."
        )
        if ms.cost is not None:
            k = ms.cost
            text += (
                f" Cost per step (CPU time in canary units, busiest rank): drop {k.drop:+.1%} "
                f"(p = {k.p_value:.2g}, noise {k.noise:.1%}; {k.verdict})."
            )
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
            text += " By kernel (per profiled step): " + "; ".join(_signed_ms(d, kernel=True) for d in kernels) + "."
        ops = c.growing_ops(3)
        if ops:
            text += " By op: " + "; ".join(_signed_ms(d, label=True) for d in ops) + "."
        modules = c.growing_modules(3)
        if modules:
            text += " By module: " + "; ".join(_signed_ms(d, label=True) for d in modules) + "."
    if outcome.goodput is not None:
        g = outcome.goodput
        line = g.text()
        text = (
            (f"Regression: {line}. Step statistic: " + text) if g.failed else (text + f" {line[0].upper()}{line[1:]}.")
        )
    if outcome.memory is not None:
        line = outcome.memory.text()
        step = "" if outcome.goodput is not None and outcome.goodput.failed else "Step statistic: "
        text = (
            (f"Regression: {line}. {step}" + text)
            if outcome.memory.failed
            else (text + f" {line[0].upper()}{line[1:]}.")
        )
    for note in outcome.notes:
        text += f" Note: {note}."
    return text
