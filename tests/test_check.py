"""The CI gate's statistics on synthetic samples with known outcomes."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analyzer.check import (
    CheckConfig,
    StepSamples,
    check_samples,
    mann_whitney_less,
    min_one_sided_p,
    samples_from_metrics,
    samples_from_steps,
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
    cand = 0.36 * (1 + 0.005 * rng.standard_normal(20))
    result = check_samples(_samples(base), _samples(cand))
    assert result.verdict == "regression"
    assert result.regression
    assert result.drop == pytest.approx(0.10, abs=0.01)
    # Every candidate value is below every baseline value; the normal
    # approximation (n > 8) then gives p of order 1e-8.
    assert result.p_value < 1e-6
    assert result.exceeds_threshold and result.significant


def test_ten_percent_slower_but_noisy_and_few_samples_is_not_significant():
    # Medians 0.40 and 0.36 (a 10% drop), but the values interleave.
    base = [0.20, 0.30, 0.40, 0.50, 0.60]
    cand = [0.16, 0.28, 0.36, 0.52, 0.64]
    result = check_samples(_samples(base), _samples(cand))
    assert result.drop == pytest.approx(0.10)
    assert result.exceeds_threshold
    assert not result.significant
    assert result.p_value > 0.3
    assert result.verdict == "pass"
    assert "not significant" in result.notes[0]


def test_drop_exactly_at_threshold_passes_and_just_beyond_fails():
    offsets = np.linspace(-2, 2, 11)  # medians are exactly the centre values
    base = 100 + offsets
    at_edge = check_samples(_samples(base), _samples(95 + offsets))
    assert at_edge.drop == 0.05
    assert at_edge.significant  # fully separated samples
    assert at_edge.verdict == "pass"  # "beyond the threshold" is strict
    beyond = check_samples(_samples(base), _samples(94.9 + offsets))
    assert beyond.drop == pytest.approx(0.051)
    assert beyond.verdict == "regression"


def test_float_rounding_at_the_threshold_counts_as_at_it():
    offsets = np.linspace(-0.01, 0.01, 11)
    result = check_samples(_samples(1.0 + offsets), _samples(0.95 + offsets))
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
    # which a stricter alpha no longer accepts.
    cand_overlap = cand.copy()
    cand_overlap[-1] = 0.991
    loose = check_samples(_samples(base), _samples(cand_overlap), CheckConfig(max_drop=0.02))
    assert loose.p_value == pytest.approx(2 / math.comb(16, 8))
    assert loose.verdict == "regression"
    tight = check_samples(_samples(base), _samples(cand_overlap), CheckConfig(max_drop=0.02, alpha=1.5e-4))
    assert tight.verdict == "pass" and tight.exceeds_threshold and not tight.significant


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


def test_constant_values_give_p_one():
    assert mann_whitney_less(np.full(10, 2.0), np.full(10, 2.0)) == 1.0


def test_config_rejects_out_of_range_values():
    with pytest.raises(AnalyzerError, match="max-mfu-drop"):
        CheckConfig(max_drop=1.5)
    with pytest.raises(AnalyzerError, match="alpha"):
        CheckConfig(alpha=0.0)


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
    samples = samples_from_metrics(
        _metrics_table(), warmup_steps=3, profiled_steps=[6, 7], metric="mfu", label="run"
    )
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
):
    """A RunAnalysis with only what the gate reads: manifest, MFU steps, metrics."""
    from pathlib import Path

    from analyzer.api import RunAnalysis
    from analyzer.metrics.mfu import MfuResult
    from analyzer.stragglers import StragglerConfig, StragglerResult

    mfu = mfu if mfu is not None else [0.2] * 6
    tokens_per_s = tokens_per_s if tokens_per_s is not None else [1000.0] * len(mfu)
    steps = pd.DataFrame({"step": np.arange(len(mfu)), "n_ranks": 2, "mfu": mfu})
    mfu_result = (
        MfuResult(mfu_source, median=float(np.median(mfu)), steps=steps, peak_flops_per_s=peak, peak_source=peak_source,
                  flops_per_step=flops_per_step)
        if mfu_source != "none"
        else MfuResult("none", reason="run.json lacks peak_flops.per_s")
    )
    metrics = pd.DataFrame(
        [{"rank": r, "step": s, "step_time_ms": 100.0, "tokens_per_s": t, "profiled": False}
         for s, t in enumerate(tokens_per_s) for r in range(2)]
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
        path=Path("run"), kind=kind, manifest=manifest if kind == "reftrain" else None, ranks=[], steps=empty,
        mfu=mfu_result, stragglers=StragglerResult([], [], "n/a", None, None, StragglerConfig(), pd.DataFrame()),
        kernels=pd.DataFrame(columns=["rank", "source", "kind", "name", "count", "total_ms", "mean_us", "max_us", "share_pct"]),
        collectives=None, metrics=metrics if kind == "reftrain" else None,
    )


def test_runs_of_different_models_or_kinds_are_incompatible():
    from analyzer.check import check, check_compatible

    base = _run()
    with pytest.raises(AnalyzerError, match=r"different model \(baseline preset tiny, 1000 parameters; candidate preset small, 2000"):
        check(base, _run(model={"preset": "small", "n_layers": 4}, params=2000))
    with pytest.raises(AnalyzerError, match="baseline is a reftrain run directory, the candidate a trace folder"):
        check(base, _run(kind="traces"))
    # Different world sizes are allowed, and said.
    assert check_compatible(base, _run(world_size=4)) == [
        "world sizes differ (baseline 2, candidate 4); MFU is per device",
        "hardware differs (baseline ['AMD EPYC', 'AMD EPYC'], candidate ['AMD EPYC', 'AMD EPYC', 'AMD EPYC', 'AMD EPYC'])",
    ]


def test_measured_peaks_put_the_candidate_on_the_baselines_peak():
    from analyzer.check import check

    base_mfu = [0.20, 0.21, 0.19, 0.20, 0.205, 0.195]
    # Same speed, but the candidate measured a 25% higher peak: its MFU reads 20% lower.
    cand = _run(peak=1.25e10, mfu=[m / 1.25 for m in base_mfu])
    outcome = check(_run(peak=1e10, mfu=base_mfu), cand)
    assert outcome.result.metric == "mfu"
    assert outcome.result.drop == pytest.approx(0.0, abs=1e-12)
    assert outcome.result.verdict == "pass"
    assert any("recomputed with the baseline's measured peak (10.0 GFLOP/s; the candidate measured 12.5)" in n for n in outcome.notes)
    assert outcome.comparison.mfu.drop == pytest.approx(0.0, abs=1e-12)
    # Datasheet peaks are real differences (other hardware): used as they are.
    table = check(_run(peak=1e10, peak_source="table", mfu=base_mfu), _run(peak=1.25e10, peak_source="table", mfu=[m / 1.25 for m in base_mfu]))
    assert table.result.drop == pytest.approx(0.2)
    assert table.result.verdict == "regression"
    # Measured on different CPUs: no rescale either.
    other_cpu = check(_run(peak=1e10, mfu=base_mfu), _run(peak=1.25e10, mfu=[m / 1.25 for m in base_mfu], cpu_model="Intel Xeon"))
    assert other_cpu.result.drop == pytest.approx(0.2)


def test_without_mfu_the_gate_uses_tokens_per_second():
    from analyzer.check import check

    base = _run(mfu_source="none", mfu=[0.2] * 6, tokens_per_s=[1000, 1010, 990, 1005, 995, 1000])
    cand = _run(mfu_source="none", mfu=[0.2] * 6, tokens_per_s=[800, 810, 790, 805, 795, 800])
    outcome = check(base, cand)
    assert outcome.result.metric == "tokens_per_s"
    assert outcome.result.base_median == pytest.approx(1000.0)
    assert outcome.result.drop == pytest.approx(0.2)
    assert outcome.result.verdict == "regression"
    assert outcome.notes == [
        "MFU unavailable (baseline: run.json lacks peak_flops.per_s): gating on throughput (tokens/s per rank) instead"
    ]
    assert "median throughput (tokens/s per rank) 1,000 tokens/s -> 800 tokens/s (drop +20.0%" in outcome.explanation
    doc = outcome.to_json()
    assert doc["schema"] == "analyzer.check/1" and doc["verdict"] == "regression" and doc["compare"]["schema"] == "analyzer.compare/1"


def test_trace_folders_with_different_flops_per_step_are_noted():
    from analyzer.check import check_compatible

    a = _run(kind="traces", mfu_source="trace-shapes", flops_per_step=2e9)
    assert check_compatible(a, _run(kind="traces", mfu_source="trace-shapes", flops_per_step=2.01e9)) == []
    (note,) = check_compatible(a, _run(kind="traces", mfu_source="trace-shapes", flops_per_step=3e9))
    assert note.startswith("FLOPs per step differ (2e+09 vs 3e+09)")
