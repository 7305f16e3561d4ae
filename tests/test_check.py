"""The CI gate's statistics on synthetic samples with known outcomes.

No wall clock anywhere: samples are exact arrays or come from seeded
generators, so every verdict here is the same on any machine under any load.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analyzer.verbs.check import (
    CheckConfig,
    StepSamples,
    check_samples,
    fast_quantile,
    mann_whitney_less,
    min_one_sided_p,
    samples_from_metrics,
    samples_from_steps,
    self_noise,
)
from analyzer.errors import AnalyzerError


def _samples(values, metric="mfu") -> StepSamples:
    values = np.asarray(values, dtype=float)
    return StepSamples(metric=metric, values=values, steps=np.arange(len(values)), source="synthetic", n_ranks=1)


def test_identical_distribution_passes_with_zero_drop():
    rng = np.random.default_rng(0)
    base = 0.40 * (1 + 0.01 * rng.standard_normal(30))
    cand = rng.permutation(base)
    result = check_samples(_samples(base), _samples(cand))
    assert result.verdict == "pass"
    assert result.drop == 0.0
    # Same values in another order: U is exactly n1*n2/2, so p is about one half.
    assert 0.4 < result.p_value < 0.6
    # 1 % noise per step: the halves of 15 steps move far less than the 5 % threshold.
    assert 0 < result.noise < 0.02 and result.min_detectable_drop == 0.05


def test_two_draws_of_the_same_distribution_pass():
    rng = np.random.default_rng(1)
    base = 0.40 * (1 + 0.02 * rng.standard_normal(40))
    cand = 0.40 * (1 + 0.02 * rng.standard_normal(40))
    result = check_samples(_samples(base), _samples(cand))
    assert result.verdict == "pass"
    assert abs(result.drop) < 0.02


def test_ten_percent_slower_with_low_noise_fails():
    rng = np.random.default_rng(2)
    base = 0.40 * (1 + 0.005 * rng.standard_normal(20))
    cand = 0.9 * rng.permutation(base)
    result = check_samples(_samples(base), _samples(cand))
    assert result.verdict == "regression"
    assert result.regression
    # Every value scaled by 0.9: the quantile too, so the drop is 10 % to rounding.
    assert result.drop == pytest.approx(0.10, abs=1e-12)
    # Every candidate value is below every baseline value; the normal
    # approximation (n > 8) then gives p of order 1e-8.
    assert result.p_value < 1e-6
    assert result.exceeds_threshold and result.significant and result.noise < 0.01


def test_ten_percent_slower_but_interleaved_is_inconclusive_not_pass():
    # A drop beyond the threshold that the test cannot confirm is
    # "inconclusive", never a PASS.
    base = [0.20, 0.30, 0.40, 0.50, 0.60]
    cand = [0.9 * v for v in (0.40, 0.20, 0.60, 0.30, 0.50)]
    result = check_samples(_samples(base), _samples(cand))
    assert result.drop == pytest.approx(0.10)  # fast quartile 0.50 -> 0.45
    assert result.exceeds_threshold
    assert not result.significant and result.p_value > 0.2
    assert result.verdict == "inconclusive" and result.inconclusive
    assert "not significant" in result.notes[0]


def test_runs_noisier_than_the_threshold_are_inconclusive_even_without_a_drop():
    # The baseline's second half is 10 % slower than its first: this run
    # cannot vouch for a 5 % threshold, whatever the candidate shows.
    base = [1.0] * 10 + [0.9] * 10
    result = check_samples(_samples(base), _samples(base))
    assert result.drop == 0.0
    assert result.noise == pytest.approx(0.10)
    assert result.noise_source == "baseline: first half vs second half"
    assert result.min_detectable_drop == pytest.approx(0.10)
    assert result.verdict == "inconclusive"
    assert "a regression of that size could have been missed" in result.notes[0]
    # With a 15 % threshold the same runs are good enough: pass.
    assert check_samples(_samples(base), _samples(base), CheckConfig(max_drop=0.15)).verdict == "pass"


def test_a_second_baseline_turns_a_run_to_run_difference_into_noise():
    # Against baseline A alone, a 15 % drop with full separation: regression.
    a = np.linspace(0.99, 1.01, 10)
    b = 0.80 * a  # the same code, trained at another time: 20 % slower
    cand = 0.85 * a
    alone = check_samples(_samples(a), _samples(cand))
    assert alone.verdict == "regression" and alone.drop == pytest.approx(0.15)
    # With B too, the baselines differ by 20 % among themselves: a 15 % drop
    # is within what the baseline moves against itself.
    both = check_samples([_samples(a), _samples(b)], _samples(cand))
    assert both.n_baselines == 2 and both.n_base == 20
    assert both.noise == pytest.approx(0.20) and both.noise_source == "baseline 1 vs baseline 2"
    assert both.verdict == "inconclusive"
    # A candidate slower than both baselines by far more than their spread is a regression.
    assert check_samples([_samples(a), _samples(b)], _samples(0.5 * a)).verdict == "regression"


def test_the_fast_quartile_ignores_steps_slowed_by_neighbours():
    # 6 of 20 candidate steps hit by interference (half speed), the rest the
    # baseline's speed: interference only adds time, so the fast steps say
    # the code did not change. The median of step time would see it too
    # (still fast at 30 %), but at 60 % slowed steps only the fast quartile does.
    base = np.linspace(0.99, 1.01, 20)
    cand = base.copy()
    cand[::5] *= 0.5
    cand[1::5] *= 0.5
    cand[2::5] *= 0.5  # 12 of 20 steps at half speed
    fast = check_samples(_samples(base), _samples(cand))
    assert fast.drop == pytest.approx(1 - fast_quantile(cand, 0.25) / fast_quantile(base, 0.25))
    assert abs(fast.drop) < 0.01 and fast.verdict != "regression"
    median = check_samples(_samples(base), _samples(cand), CheckConfig(quantile=0.5))
    assert median.drop > 0.4


def test_fast_quantile_is_the_step_time_quantile_of_the_values():
    values = np.array([4.0, 1.0, 3.0, 2.0, 5.0])
    assert fast_quantile(values, 0.25) == 4.0  # 75th percentile of the values (higher is better)
    assert fast_quantile(values, 0.5) == 3.0
    assert fast_quantile(2 * values, 0.25) == 8.0


def test_self_noise_split_halves_and_baseline_pairs():
    run = np.array([1.0] * 4 + [0.8] * 4)
    assert self_noise([("baseline", run)], 0.25) == (pytest.approx(0.2), "baseline: first half vs second half")
    # Runs too short to split (under 8 steps) give nothing to measure.
    assert self_noise([("candidate", run[:7])], 0.25) == (0.0, "no run long enough to split")
    # Two baselines: their difference counts (but a candidate's difference from them never does).
    flat = np.ones(8)
    noise, where = self_noise([("baseline 1", flat), ("baseline 2", 0.9 * flat), ("candidate", 0.5 * flat)], 0.25)
    assert noise == pytest.approx(0.1) and where == "baseline 1 vs baseline 2"


def test_drop_exactly_at_threshold_passes_and_just_beyond_fails():
    base = 100 + np.linspace(-2, 2, 11)
    at_edge = check_samples(_samples(base), _samples(0.95 * base))
    assert at_edge.drop == pytest.approx(0.05, abs=1e-12)
    assert at_edge.significant  # fully separated samples
    assert at_edge.verdict == "pass"  # "beyond the threshold" is strict
    beyond = check_samples(_samples(base), _samples(0.949 * base))
    assert beyond.drop == pytest.approx(0.051)
    assert beyond.noise < 0.051  # the halves of a 2 % linear ramp differ by about 2 %
    assert beyond.verdict == "regression"


def test_float_rounding_at_the_threshold_counts_as_at_it():
    result = check_samples(_samples(np.full(11, 1.0)), _samples(np.full(11, 0.95)))
    assert result.drop > 0.05  # 0.05000000000000004 in binary floating point
    assert not result.exceeds_threshold
    assert result.verdict == "pass"


def test_faster_candidate_passes_with_negative_drop():
    base = np.linspace(0.30, 0.31, 12)
    result = check_samples(_samples(base), _samples(base * 1.2))
    assert result.drop == pytest.approx(-0.2)
    assert result.p_value > 0.99
    assert result.verdict == "pass"


def test_custom_threshold_and_alpha():
    base = np.linspace(0.99, 1.01, 8)
    cand = base * 0.97  # 3% drop, fully separated
    assert check_samples(_samples(base), _samples(cand)).verdict == "pass"
    strict = check_samples(_samples(base), _samples(cand), CheckConfig(max_drop=0.02))
    assert strict.verdict == "regression"
    # Exact test (n = 8 each, no ties), total separation: p = 1/C(16, 8).
    assert strict.p_value == pytest.approx(1 / math.comb(16, 8))
    # One candidate value above the lowest baseline value: U = 1, p = 2/C(16, 8),
    # which a stricter alpha no longer accepts: a drop beyond the threshold
    # that is not significant is inconclusive.
    cand_overlap = cand.copy()
    cand_overlap[0] = 0.991
    loose = check_samples(_samples(base), _samples(cand_overlap), CheckConfig(max_drop=0.02))
    assert loose.p_value == pytest.approx(2 / math.comb(16, 8))
    assert loose.verdict == "regression"
    tight = check_samples(_samples(base), _samples(cand_overlap), CheckConfig(max_drop=0.02, alpha=1.5e-4))
    assert tight.verdict == "inconclusive" and tight.exceeds_threshold and not tight.significant


def test_too_few_steps_to_ever_be_significant_is_unusable():
    assert min_one_sided_p(3, 3) == pytest.approx(0.05)
    with pytest.raises(AnalyzerError, match="too few steady-state steps"):
        check_samples(_samples([1.0, 1.0, 1.0]), _samples([0.5, 0.5, 0.5]))
    # Four each reach p = 1/70 < 0.05: usable, and a clear drop fails.
    result = check_samples(_samples([1.0, 1.01, 1.02, 1.03]), _samples([0.5, 0.51, 0.52, 0.53]))
    assert result.p_value == pytest.approx(1 / 70)
    assert result.verdict == "regression"


def test_metric_mismatch_and_bad_values_are_unusable():
    with pytest.raises(AnalyzerError, match="incompatible runs"):
        check_samples(_samples([1.0] * 5), _samples([1.0] * 5, metric="tokens_per_s"))
    with pytest.raises(AnalyzerError, match="no steady-state steps"):
        check_samples(_samples([]), _samples([1.0] * 5))
    with pytest.raises(AnalyzerError, match="non-finite"):
        check_samples(_samples([1.0, np.nan, 1.0, 1.0, 1.0]), _samples([1.0] * 5))
    with pytest.raises(AnalyzerError, match="positive"):
        check_samples(_samples([0.0] * 5), _samples([1.0] * 5))
    with pytest.raises(AnalyzerError, match="baseline 2: no steady-state steps"):
        check_samples([_samples([1.0] * 5), _samples([])], _samples([1.0] * 5))


def test_constant_values_give_p_one():
    assert mann_whitney_less(np.full(10, 2.0), np.full(10, 2.0)) == 1.0


def test_config_rejects_out_of_range_values():
    with pytest.raises(AnalyzerError, match="max-mfu-drop"):
        CheckConfig(max_drop=1.5)
    with pytest.raises(AnalyzerError, match="alpha"):
        CheckConfig(alpha=0.0)
    with pytest.raises(AnalyzerError, match="quantile"):
        CheckConfig(quantile=1.0)


def _metrics_table() -> pd.DataFrame:
    rows = []
    for step in range(10):
        for rank in range(2):
            rows.append(
                {
                    "rank": rank,
                    "step": step,
                    "mfu": 0.1 * (step + 1) + 0.01 * rank,
                    "tokens_per_s": 1000.0 + step,
                    "profiled": step in (6, 7),
                }
            )
    return pd.DataFrame(rows)


def test_samples_from_metrics_exclude_warmup_and_profiled_steps_and_average_ranks():
    samples = samples_from_metrics(_metrics_table(), warmup_steps=3, profiled_steps=[6, 7], metric="mfu", label="run")
    assert samples.steps.tolist() == [3, 4, 5, 8, 9]
    # mean over ranks of 0.1*(step+1) and 0.1*(step+1)+0.01
    assert samples.values == pytest.approx([0.405, 0.505, 0.605, 0.905, 1.005])
    assert samples.n_ranks == 2
    # The `profiled` flag alone also excludes a step the manifest omits.
    flagged = samples_from_metrics(_metrics_table(), warmup_steps=3, profiled_steps=[], metric="mfu", label="run")
    assert flagged.steps.tolist() == [3, 4, 5, 8, 9]


def test_samples_from_metrics_without_the_metric_is_unusable():
    table = _metrics_table().assign(mfu=None)
    with pytest.raises(AnalyzerError, match="no steady-state steps with `mfu`"):
        samples_from_metrics(table, warmup_steps=0, profiled_steps=[], metric="mfu", label="run")
    with pytest.raises(AnalyzerError, match="no steady-state steps"):
        samples_from_metrics(_metrics_table(), warmup_steps=20, profiled_steps=[], metric="mfu", label="run")


def test_samples_from_trace_steps_are_steps_per_second():
    steps = pd.DataFrame({"rank": [0, 1, 0, 1], "step": [5, 5, 6, 6], "step_time_ms": [100.0, 100.0, 200.0, 250.0]})
    samples = samples_from_steps(steps, value_column="step_time_ms", metric="steps_per_s", label="t")
    assert samples.steps.tolist() == [5, 6]
    assert samples.values == pytest.approx([10.0, (5.0 + 4.0) / 2])


# ----------------------------------------------------------------- runs: compatibility and samples
def _run(
    *,
    kind: str = "reftrain",
    model: dict | None = None,
    params: int = 1000,
    peak: float = 1e10,
    peak_source: str = "measured",
    mfu: list[float] | None = None,
    mfu_source: str = "manifest",
    tokens_per_s: list[float] | None = None,
    cpu_model: str = "AMD EPYC",
    world_size: int = 2,
    flops_per_step: float | None = None,
    cpu_ms: list[float] | None = None,
    canary_ms: dict[int, float] | None = None,
):
    """A RunAnalysis with only what the gate reads: manifest, MFU steps, metrics."""
    from pathlib import Path

    from analyzer.api import RunAnalysis
    from analyzer.metrics.mfu import MfuResult
    from analyzer.metrics.stragglers import StragglerConfig, StragglerResult

    mfu = mfu if mfu is not None else [0.2] * 6
    tokens_per_s = tokens_per_s if tokens_per_s is not None else [1000.0] * len(mfu)
    steps = pd.DataFrame({"step": np.arange(len(mfu)), "n_ranks": 2, "mfu": mfu})
    mfu_result = (
        MfuResult(
            mfu_source,
            median=float(np.median(mfu)),
            steps=steps,
            peak_flops_per_s=peak,
            peak_source=peak_source,
            flops_per_step=flops_per_step,
        )
        if mfu_source != "none"
        else MfuResult("none", reason="run.json lacks peak_flops.per_s")
    )
    metrics = pd.DataFrame(
        [
            {
                "rank": r,
                "step": s,
                "step_time_ms": 100.0,
                "tokens_per_s": t,
                "profiled": False,
                **({"cpu_ms": cpu_ms[s] * (1.0 if r == 0 else 0.5)} if cpu_ms is not None else {}),
                # The canary on the steps given, rank 1's probe 20 % slower (the gate takes the mean over ranks).
                **(
                    {"canary_ms": canary_ms[s] * (1.0 if r == 0 else 1.2), "canary_cpu_ms": canary_ms[s] * 0.9}
                    if canary_ms and s in canary_ms
                    else {}
                ),
            }
            for s, t in enumerate(tokens_per_s)
            for r in range(2)
        ]
    )
    manifest = {
        "config": {"model": model or {"preset": "tiny", "n_layers": 2}},
        "params": {"total": params},
        "flops": {"per_token": 6 * params},
        "world_size": world_size,
        "warmup_steps": 0,
        "profiled_steps": [],
        "hardware": {"device_type": "cpu", "cpu_model": cpu_model, "device_names": [cpu_model] * world_size},
    }
    empty = pd.DataFrame({c: pd.Series(dtype="float64") for c in ["rank", "step", "step_time_ms", "source"]})
    return RunAnalysis(
        path=Path("run"),
        kind=kind,
        manifest=manifest if kind == "reftrain" else None,
        ranks=[],
        steps=empty,
        mfu=mfu_result,
        stragglers=StragglerResult([], [], "n/a", None, None, StragglerConfig(), pd.DataFrame()),
        kernels=pd.DataFrame(
            columns=["rank", "source", "kind", "name", "count", "total_ms", "mean_us", "max_us", "share_pct"]
        ),
        collectives=None,
        metrics=metrics if kind == "reftrain" else None,
    )


def test_runs_of_different_models_or_kinds_are_incompatible():
    from analyzer.verbs.check import check, check_compatible

    base = _run()
    with pytest.raises(
        AnalyzerError, match=r"different model \(baseline preset tiny, 1000 parameters; candidate preset small, 2000"
    ):
        check(base, _run(model={"preset": "small", "n_layers": 4}, params=2000))
    with pytest.raises(AnalyzerError, match="baseline is a reftrain run directory, the candidate a trace folder"):
        check(base, _run(kind="traces"))
    # Different world sizes are allowed, and said.
    assert check_compatible(base, _run(world_size=4)) == [
        "world sizes differ (baseline 2, candidate 4); MFU is per device",
        "hardware differs (baseline ['AMD EPYC', 'AMD EPYC'], candidate ['AMD EPYC', 'AMD EPYC', 'AMD EPYC', 'AMD EPYC'])",
    ]


def test_measured_peaks_put_the_candidate_on_the_baselines_peak():
    from analyzer.verbs.check import check

    base_mfu = [0.20, 0.21, 0.19, 0.20, 0.205, 0.195]
    # Same speed, but the candidate measured a 25% higher peak: its MFU reads 20% lower.
    cand = _run(peak=1.25e10, mfu=[m / 1.25 for m in base_mfu])
    outcome = check(_run(peak=1e10, mfu=base_mfu), cand)
    assert outcome.result.metric == "mfu"
    assert outcome.result.drop == pytest.approx(0.0, abs=1e-12)
    assert outcome.result.verdict == "pass"
    assert any(
        "recomputed with the baseline's measured peak (10.0 GFLOP/s; the candidate measured 12.5)" in n
        for n in outcome.notes
    )
    assert outcome.comparison.mfu.drop == pytest.approx(0.0, abs=1e-12)
    # Datasheet peaks are real differences (other hardware): used as they are.
    table = check(
        _run(peak=1e10, peak_source="table", mfu=base_mfu),
        _run(peak=1.25e10, peak_source="table", mfu=[m / 1.25 for m in base_mfu]),
    )
    assert table.result.drop == pytest.approx(0.2)
    assert table.result.verdict == "regression"
    # Measured on different CPUs: no rescale either.
    other_cpu = check(
        _run(peak=1e10, mfu=base_mfu), _run(peak=1.25e10, mfu=[m / 1.25 for m in base_mfu], cpu_model="Intel Xeon")
    )
    assert other_cpu.result.drop == pytest.approx(0.2)


def test_identical_runs_differ_by_nothing_however_many_baselines():
    """A candidate identical to its baselines has drop 0 with one, two or three copies pooled: the fast
    quantile reads the empirical distribution, which pooling copies does not change (linear interpolation
    read two copies of these 6 values 0.12 % off the values themselves)."""
    from analyzer.verbs.check import check

    values = [1000, 1010, 990, 1005, 995, 1050]
    run = _run(mfu_source="none", mfu=[0.2] * 6, tokens_per_s=values)
    for n in (1, 2, 3):
        outcome = check([run] * n, run)
        assert outcome.result.base_value == outcome.result.cand_value
        assert outcome.result.drop == 0.0


def test_without_mfu_the_gate_uses_tokens_per_second():
    from analyzer.verbs.check import check

    base = _run(mfu_source="none", mfu=[0.2] * 6, tokens_per_s=[1000, 1010, 990, 1005, 995, 1000])
    cand = _run(mfu_source="none", mfu=[0.2] * 6, tokens_per_s=[800, 810, 790, 805, 795, 800])
    outcome = check(base, cand)
    assert outcome.result.metric == "tokens_per_s"
    assert outcome.result.base_median == pytest.approx(1000.0)
    # Fast quartile (75th percentile of tokens/s, empirical: 6 x 0.75 = 4.5 -> the 5th value): 1005 and 805.
    assert outcome.result.base_value == pytest.approx(1005.0) and outcome.result.cand_value == pytest.approx(805.0)
    assert outcome.result.drop == pytest.approx(200 / 1005)
    assert outcome.result.verdict == "regression"
    assert outcome.notes == [
        "MFU unavailable (baseline: run.json lacks peak_flops.per_s): gating on throughput (tokens/s per rank) instead"
    ]
    assert (
        "throughput (tokens/s per rank) at the 25th percentile of step time 1,005 tokens/s -> 805 tokens/s (drop +19.9%"
    ) in outcome.explanation
    doc = outcome.to_json()
    assert (
        doc["schema"] == "analyzer.check/2"
        and doc["verdict"] == "regression"
        and doc["compare"]["schema"] == "analyzer.compare/1"
    )


def test_trace_folders_with_different_flops_per_step_are_noted():
    from analyzer.verbs.check import check_compatible

    a = _run(kind="traces", mfu_source="trace-shapes", flops_per_step=2e9)
    assert check_compatible(a, _run(kind="traces", mfu_source="trace-shapes", flops_per_step=2.01e9)) == []
    (note,) = check_compatible(a, _run(kind="traces", mfu_source="trace-shapes", flops_per_step=3e9))
    assert note.startswith("FLOPs per step differ (2e+09 vs 3e+09)")


def test_cpu_time_must_confirm_a_wall_clock_regression_on_cpu_runs():
    from analyzer.verbs.check import check, cpu_samples

    base_mfu = list(np.linspace(0.199, 0.201, 12))
    slow_mfu = [0.8 * m for m in base_mfu]  # steps 25 % longer on the wall clock
    cpu = list(np.linspace(9.9, 10.1, 12))  # ms per step on rank 0 (rank 1: half, so rank 0 is the busiest)
    base = _run(mfu=base_mfu, cpu_ms=cpu)
    samples = cpu_samples(base, "baseline")
    assert samples.metric == "cpu_steps_per_s" and samples.values == pytest.approx([1000 / c for c in cpu])
    # Same CPU work per step: the machine was busier, not the code slower. Inconclusive, said why.
    busier = check(base, _run(mfu=slow_mfu, cpu_ms=cpu))
    assert busier.cpu is not None and busier.cpu.drop == pytest.approx(0.0)
    assert busier.result.verdict == "inconclusive"
    assert "CPU time per step did not confirm it" in busier.result.notes[-1]
    assert busier.to_json()["cpu_time"]["drop"] == pytest.approx(0.0)
    # 25 % more CPU time per step as well: a regression.
    more_work = check(base, _run(mfu=slow_mfu, cpu_ms=[1.25 * c for c in cpu]))
    assert more_work.result.verdict == "regression" and more_work.cpu.drop == pytest.approx(0.2)
    # A crowded machine inflates CPU time a little: wall clock 2.5x slower (drop 60 %), CPU time
    # 1.25x (drop 20 %, under half the wall-clock drop): inconclusive, not a regression.
    crowded = check(base, _run(mfu=[0.4 * m for m in base_mfu], cpu_ms=[1.25 * c for c in cpu]))
    assert crowded.result.drop == pytest.approx(0.6) and crowded.cpu.drop == pytest.approx(0.2)
    assert crowded.result.verdict == "inconclusive"
    # Turned off, or runs without cpu_ms (older reftrain, GPU runs): wall clock alone.
    assert check(base, _run(mfu=slow_mfu, cpu_ms=cpu), cpu_time=False).result.verdict == "regression"
    older = check(_run(mfu=base_mfu), _run(mfu=slow_mfu))
    assert older.cpu is None and older.result.verdict == "regression"


def test_cpu_time_inside_its_own_noise_does_not_confirm_a_wall_clock_regression():
    """bench_gate's false alarm at 400 steps under load (docs/ci.md): a CPU-time drop past half the
    wall-clock drop, but no larger than CPU time moves against itself, confirms nothing."""
    from analyzer.verbs.check import check

    jitter = np.linspace(0.999, 1.001, 12)
    base = _run(mfu=list(0.2 * jitter), cpu_ms=list(10 * jitter))
    slow_wall = list(0.16 * jitter)  # steady 25 % longer steps: wall drop 20 %, no wall noise
    # CPU time: first half 15 % fewer steps per CPU-second, second half 50 % fewer. Fast quartile:
    # drop 15 % (past the 10 % half of the wall drop); split halves: (85 - 50) / 85 = 41 % noise.
    cpu = list(1000 / 85 * jitter[:6]) + list(20 * jitter[6:])
    outcome = check(base, _run(mfu=slow_wall, cpu_ms=cpu))
    assert outcome.cpu.drop == pytest.approx(0.15, abs=2e-3)
    assert outcome.cpu.noise == pytest.approx(35 / 85, abs=2e-3)
    assert outcome.result.drop == pytest.approx(0.2, abs=1e-3) and outcome.result.verdict == "inconclusive"
    assert "its own noise 41.2%" in outcome.result.notes[-1]
    # The same CPU drop, steady (no noise of its own): confirmed, a regression.
    steady = check(base, _run(mfu=slow_wall, cpu_ms=list(1000 / 85 * jitter)))
    assert steady.result.verdict == "regression"


def test_cpu_time_confirms_a_drop_that_only_wall_clock_noise_held_back():
    from analyzer.verbs.check import check

    jitter = np.linspace(0.999, 1.001, 12)
    base = _run(mfu=list(0.2 * jitter), cpu_ms=list(10 * jitter))
    # A 2x slower candidate whose second half a neighbour slowed 2.5x more on the wall clock:
    # fast-quartile wall drop 50 %, but the candidate moves 60 % against itself (split halves).
    wall = list(0.1 * jitter[:6]) + list(0.04 * jitter[6:])
    alone = check(base, _run(mfu=wall, cpu_ms=list(20 * jitter)), cpu_time=False).result
    assert alone.verdict == "inconclusive" and alone.exceeds_threshold and alone.significant
    assert alone.drop == pytest.approx(0.5, abs=1e-3) and alone.noise == pytest.approx(0.6, abs=1e-3)
    # CPU time per step doubled too, steadily (drop 50 %, noise ~0): the work grew, a regression.
    confirmed = check(base, _run(mfu=wall, cpu_ms=list(20 * jitter)))
    assert confirmed.cpu.verdict == "regression" and confirmed.cpu.drop == pytest.approx(0.5, abs=1e-3)
    assert confirmed.result.verdict == "regression"
    assert "CPU time per step confirms the drop" in confirmed.result.notes[-1]
    # CPU time grew 1.25x only (drop 20 %, under half the wall-clock drop): still inconclusive.
    weak = check(base, _run(mfu=wall, cpu_ms=list(12.5 * jitter)))
    assert weak.cpu.verdict == "regression" and weak.result.verdict == "inconclusive"
    # A wall clock that is inconclusive for noise alone (no drop beyond the threshold) is never promoted.
    quiet = list(0.2 * jitter[:6]) + list(0.15 * jitter[6:])
    assert check(base, _run(mfu=quiet, cpu_ms=list(20 * jitter))).result.verdict == "inconclusive"


def test_several_baselines_through_check():
    from analyzer.verbs.check import check

    a = list(np.linspace(0.199, 0.201, 10))
    outcome = check([_run(mfu=a), _run(mfu=[0.8 * m for m in a])], _run(mfu=[0.85 * m for m in a]))
    assert outcome.result.n_baselines == 2 and outcome.result.verdict == "inconclusive"
    assert "2 baselines" in outcome.explanation and "Inconclusive, too noisy" in outcome.explanation


def _probed(ms: float, n_steps: int = 12, every: int = 3) -> dict[int, float]:
    """Canary probes of ``ms`` on rank 0 (rank 1: 1.2 ms per ms, so a mean of 1.1 ms) on every 3rd step."""
    return {s: ms for s in range(0, n_steps, every)}


def test_run_probes_are_probes_per_second_of_the_mean_over_ranks():
    from analyzer.verbs.check import run_probes

    probes = run_probes(_run(mfu=[0.2] * 12, canary_ms=_probed(2.0)), "baseline")
    assert probes.wall.metric == probes.cpu.metric == "canary_probes_per_s"
    assert list(probes.wall.steps) == list(probes.cpu.steps) == [0, 3, 6, 9]
    assert probes.wall.values == pytest.approx([1000 / 2.2] * 4)  # mean of 2.0 and 2.4 ms
    assert probes.cpu.values == pytest.approx([1000 / 1.8] * 4)
    assert list(probes.through(6).wall.steps) == list(probes.through(7).cpu.steps) == [0, 3, 6]
    assert run_probes(_run(mfu=[0.2] * 12), "older run") is None


def test_a_slower_machine_that_explains_the_drop_makes_a_regression_inconclusive():
    from analyzer.verbs.check import check

    base_mfu = list(np.linspace(0.199, 0.201, 12))
    slow_mfu = [0.8 * m for m in base_mfu]  # steps 25 % longer: drop 20 %
    base = _run(mfu=base_mfu, canary_ms=_probed(2.0))
    # The candidate's machine ran the fixed probe 25 % slower too: all of the drop is the machine's.
    outcome = check(base, _run(mfu=slow_mfu, canary_ms=_probed(2.5)))
    ms = outcome.machine
    assert ms.base_probe_ms == pytest.approx(2.2) and ms.cand_probe_ms == pytest.approx(2.75)
    assert ms.slowdown == pytest.approx(0.25) and ms.adjusted_drop == pytest.approx(0.0, abs=1e-3)
    assert outcome.result.drop == pytest.approx(0.2, abs=1e-3) and outcome.verdict == "inconclusive"
    assert outcome.result.notes[-1].startswith("inconclusive: the machine was 25% slower during the candidate's run")
    assert outcome.to_json()["machine_speed"]["slowdown"] == pytest.approx(0.25)
    assert "the candidate's machine was 25.0% slower" in outcome.explanation
    # The machine 10 % slower: 1.25 / 1.10 = 13.6 % longer steps remain, a 12 % drop, still beyond 5 %.
    partly = check(base, _run(mfu=slow_mfu, canary_ms=_probed(2.2)))
    assert partly.machine.adjusted_drop == pytest.approx(1 - 1.1 * 0.8, abs=1e-3)
    assert partly.verdict == "regression"
    # Turned off, or any run without the canary (older runs, traces): gated as before.
    assert check(base, _run(mfu=slow_mfu, canary_ms=_probed(2.5)), machine_speed=False).verdict == "regression"
    older = check(base, _run(mfu=slow_mfu))
    assert older.machine is None and older.verdict == "regression" and older.to_json()["machine_speed"] is None


def test_a_faster_machine_that_may_hide_a_regression_makes_a_pass_inconclusive():
    from analyzer.verbs.check import check

    mfu = list(np.linspace(0.199, 0.201, 12))
    base = _run(mfu=mfu, canary_ms=_probed(2.0))
    # Same step times, but the probe ran 20 % faster: the code did 1 / 0.8 = 25 % more per step.
    hidden = check(base, _run(mfu=mfu, canary_ms=_probed(1.6)))
    assert hidden.machine.slowdown == pytest.approx(-0.2) and hidden.machine.adjusted_drop == pytest.approx(0.2)
    assert hidden.verdict == "inconclusive"
    assert "the machine was 20% faster during the candidate's run" in hidden.result.notes[-1]
    # The machine 4 % faster: the adjusted drop of 4 % is within 5 %; the pass stands.
    assert check(base, _run(mfu=mfu, canary_ms=_probed(1.92))).verdict == "pass"
    # A slower machine never turns a pass into anything else.
    assert check(base, _run(mfu=mfu, canary_ms=_probed(3.0))).verdict == "pass"


def test_machine_speed_needs_enough_probes_in_every_run():
    from analyzer.verbs.check import CheckConfig, Probes, machine_speed_gate

    base, slow = _samples(np.linspace(0.199, 0.201, 12)), _samples(0.8 * np.linspace(0.199, 0.201, 12))
    config = CheckConfig()

    def probes(ms: float, n: int) -> Probes:
        return Probes(*[_samples([1000 / ms] * n, metric="canary_probes_per_s")] * 2)

    result, _, machine = machine_speed_gate([base], slow, config)
    assert result.verdict == "regression" and machine is None
    # Two probes in the candidate: too few to say how fast its machine was; the verdict stands.
    assert machine_speed_gate([base], slow, config, (), None, [probes(2.0, 4)], probes(2.5, 2))[0] == result
    assert machine_speed_gate([base, base], slow, config, (), None, [probes(2.0, 4), None], probes(2.5, 4))[2] is None
    withdrawn, _, ms = machine_speed_gate(
        [base, base], slow, config, (), None, [probes(2.0, 3), probes(2.0, 5)], probes(2.5, 3)
    )
    assert withdrawn.verdict == "inconclusive" and ms.n_base == 8 and ms.n_cand == 3
    assert ms.cpu_slowdown == pytest.approx(0.25) and ms.adjusted_cpu_drop is None and ms.adjusted_verdict == "pass"


def test_the_canary_also_takes_the_machine_out_of_the_cpu_time_confirmation():
    """bench_gate's first false alarm beside two busy loops (2026-12-07, 200 steps): the wall clock too
    noisy, CPU time per step up, so CPU time confirmed a drop; the probe's CPU time had grown too."""
    from analyzer.verbs.check import CheckConfig, Probes, check_samples, machine_speed_gate

    jitter = np.linspace(0.999, 1.001, 12)
    base = _samples(0.2 * jitter)
    # Wall clock: steps 25 % longer in the candidate's first half, 150 % in its second: the fast
    # quartile drops 20 % (p tiny), but the candidate's halves differ by 50 %: too noisy alone.
    cand = _samples(np.concatenate([0.16 * jitter[:6], 0.08 * jitter[6:]]))
    cpu_base = _samples(100 * jitter, metric="cpu_steps_per_s")
    cpu_cand = _samples(80 * jitter, metric="cpu_steps_per_s")  # 25 % more CPU time per step, steadily
    config = CheckConfig()
    raw = check_samples([base], cand, config)
    assert raw.verdict == "inconclusive" and raw.exceeds_threshold and raw.significant
    assert raw.drop == pytest.approx(0.2, abs=2e-3) and raw.noise == pytest.approx(0.5, abs=2e-3)

    def probes(ms: float) -> Probes:
        return Probes(*[_samples([1000 / ms] * 4, metric="canary_probes_per_s")] * 2)

    # The probe's CPU time 25 % longer as well: the work per step did not grow, the machine slowed.
    result, cpu, ms = machine_speed_gate([base], cand, config, [cpu_base], cpu_cand, [probes(1.0)], probes(1.25))
    assert cpu.regression and ms.adjusted_cpu_drop == pytest.approx(0.0, abs=2e-3)
    assert ms.adjusted_verdict == "inconclusive" and result.verdict == "inconclusive"
    assert "the machine was 25% slower" in result.notes[-1]
    # The same steps with the probe unchanged: CPU time confirms, a regression.
    confirmed, _, ms = machine_speed_gate([base], cand, config, [cpu_base], cpu_cand, [probes(1.0)], probes(1.0))
    assert confirmed.verdict == "regression" and ms.adjusted_verdict == "regression"
    # An inconclusive verdict is never changed by the canary, whatever it says.
    noisy, _, _ = machine_speed_gate([base], cand, config, (), None, [probes(1.0)], probes(0.5))
    assert noisy.verdict == "inconclusive" and noisy.notes == raw.notes
