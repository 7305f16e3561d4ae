"""The step statistic's verdict from samples: the wall-clock gate (:func:`check_samples`), then CPU time's
veto and confirmation (:func:`gate_samples`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from analyzer.errors import AnalyzerError
from analyzer.verbs.check.result import CheckConfig, CheckResult, Verdict
from analyzer.verbs.check.samples import METRIC_LABELS, StepSamples
from analyzer.verbs.check.stats import fast_quantile, mann_whitney_less, min_one_sided_p, relative_drop, self_noise

# A drop this close to the threshold counts as *at* the threshold: relative
# drops are computed in floating point ((1.0 - 0.95) / 1.0 is 0.0500000000000000444).
DROP_ROUNDING = 1e-9


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
    """Gate a candidate against one or more baselines; see the package docstring (:mod:`analyzer.verbs.check`).

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
    exceeds = drop - config.max_drop > DROP_ROUNDING
    significant = p_value < config.alpha
    beyond_noise = drop > noise
    notes = []
    if exceeds and significant and beyond_noise:
        verdict: Verdict = "regression"
    elif exceeds or noise - config.max_drop > DROP_ROUNDING:
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
    confirmed = cpu.drop - need > DROP_ROUNDING and cpu.drop - cpu.noise > DROP_ROUNDING and cpu.significant
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
    if not (cpu.regression and cpu.drop - need > DROP_ROUNDING):
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
