"""The CPU time per step in canary units (analyzer/metrics/machine_speed.py) and how the gate uses it
(analyzer.verbs.check.canary_cost_gate; docs/ci.md "Machine speed").

Synthetic samples and metrics tables with exact answers: nothing here depends on the machine's speed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzer.metrics.machine_speed import canary_cost_per_step, local_probe
from analyzer.verbs.check import CheckConfig, Probes, StepSamples, canary_cost_gate, machine_speed_gate


def test_local_probe_is_the_median_of_the_probes_within_the_window_else_the_nearest():
    probe_steps, probe_ms = np.array([3, 8, 13]), np.array([1.0, 2.0, 4.0])
    steps = np.arange(3, 15)
    # Window 5: steps 3-7 see the probes at 3 and 8, step 8 all three, steps 9-13 those at 8 and 13, 14 the one at 13.
    assert local_probe(probe_steps, probe_ms, steps, 5).tolist() == [1.5] * 5 + [2.0] + [3.0] * 5 + [4.0]
    # Window 1: the probe on the step itself, else the nearest one (the earlier on a tie: step 10.5 has none).
    assert local_probe(probe_steps, probe_ms, np.array([3, 5, 6, 11, 14, 20]), 1).tolist() == [
        1.0,
        1.0,
        2.0,
        4.0,
        4.0,
        4.0,
    ]


def _metrics(n_steps: int = 24, slower_from: int = 11, probes=(0, 3, 8, 13, 18, 23)) -> pd.DataFrame:
    """Two ranks; the machine twice as slow from ``slower_from``: rank 0's step 10 (20) ms of CPU time, rank 1's 8
    (16), the probe 1 (2) ms on both ranks; rank 1 spends 30 ms at step 5."""
    rows = []
    for s in range(n_steps):
        f = 1.0 if s < slower_from else 2.0
        for r in range(2):
            cpu = (10.0 if r == 0 else 8.0) * f * (3.75 if (r, s) == (1, 5) else 1.0)
            rows.append({"rank": r, "step": s, "cpu_ms": cpu, "canary_cpu_ms": f if s in probes else None})
    return pd.DataFrame(rows)


def test_the_cost_takes_the_machine_out_step_by_step():
    cost = canary_cost_per_step(_metrics(), warmup_steps=3, profiled_steps=[])
    assert cost is not None and cost.index.tolist() == list(range(3, 24))  # steps 0-2 are warm-up
    # Steady probes at 3, 8 (1 ms), 13, 18, 23 (2 ms). Steps 3-8: their probes are all 1 ms -> 10 probe units;
    # 9 and 10 (10 ms of CPU time) and 11 and 12 (20 ms) see the probes at 8 and 13 -> a median of 1.5 ms;
    # from 13 on the probes are 2 ms -> 10 again. Step 5: rank 1, the busiest, 30 ms / 1 ms.
    expected = [10.0, 10.0, 30.0, 10.0, 10.0, 10.0, 10 / 1.5, 10 / 1.5, 20 / 1.5, 20 / 1.5] + [10.0] * 11
    assert cost.tolist() == pytest.approx(expected)
    # The machine slower from step 16 (probes at 18 and 23: 2 ms). Whole run: steps 14 and 15 see the probes
    # at 13 and 18, a median of 1.5 ms. Cut after step 15: the probe at 18 is not seen, the one at 13 (1 ms) is.
    later = _metrics(slower_from=16)
    whole = canary_cost_per_step(later, warmup_steps=3, profiled_steps=[])
    assert whole.loc[[13, 14, 15]].tolist() == pytest.approx([10.0, 10 / 1.5, 10 / 1.5])
    cut = canary_cost_per_step(later, warmup_steps=3, profiled_steps=[], through_step=15)
    assert cut.index.tolist() == list(range(3, 16)) and cut.loc[[13, 14, 15]].tolist() == [10.0, 10.0, 10.0]
    # Profiled steps are not steady: listed in the manifest or flagged on the record.
    flagged = _metrics().assign(profiled=lambda m: m["step"] == 4)
    assert 4 not in canary_cost_per_step(flagged, warmup_steps=3, profiled_steps=[20]).index
    assert 20 not in canary_cost_per_step(flagged, warmup_steps=3, profiled_steps=[20]).index


def test_no_cost_without_enough_probes_or_cpu_time():
    assert canary_cost_per_step(_metrics(), warmup_steps=3, profiled_steps=[], through_step=10) is None  # 2 probes
    assert canary_cost_per_step(_metrics().drop(columns="canary_cpu_ms"), warmup_steps=3, profiled_steps=[]) is None
    assert canary_cost_per_step(_metrics().drop(columns="cpu_ms"), warmup_steps=3, profiled_steps=[]) is None
    # One rank with two probes only: no machine speed for it, so none for the run.
    sparse = _metrics()
    sparse.loc[(sparse["rank"] == 1) & (sparse["step"] > 8), "canary_cpu_ms"] = None
    assert canary_cost_per_step(sparse, warmup_steps=3, profiled_steps=[]) is None
    zero = _metrics()
    zero.loc[zero["step"] == 6, "cpu_ms"] = 0.0
    assert canary_cost_per_step(zero, warmup_steps=3, profiled_steps=[]) is None
    assert canary_cost_per_step(_metrics().iloc[:0], warmup_steps=0, profiled_steps=[]) is None


JITTER = np.linspace(0.999, 1.001, 12)


def _samples(values, metric: str = "mfu") -> StepSamples:
    values = np.asarray(values, dtype=np.float64)
    return StepSamples(metric, values, np.arange(len(values), dtype=np.int64), "synthetic", 2)


def _probes() -> Probes:
    return Probes(*[_samples([1000.0] * 4, metric="canary_probes_per_s")] * 2)


def _cost(scale: float) -> StepSamples:
    return _samples(0.1 * scale * JITTER, metric="steps_per_canary")


BASE = _samples(0.2 * JITTER)
# The wall clock too noisy to say: the candidate's fast quartile 3 % lower (within the 5 % allowed), but its
# second half twice as slow as its first (noise 48 %).
NOISY = _samples(np.concatenate([0.194 * JITTER[:6], 0.1 * JITTER[6:]]))


def test_the_cost_makes_a_regression_that_the_wall_clock_could_not_tell_from_its_noise():
    config = CheckConfig()
    before, _, _ = machine_speed_gate([BASE], NOISY, config, (), None, [_probes()], _probes())
    assert before.verdict == "inconclusive" and before.drop == pytest.approx(0.03, abs=2e-3)
    # Each step 25 % more work in canary units: a 20 % drop of steps per canary unit, no noise.
    result, _, machine = canary_cost_gate(
        [BASE], NOISY, config, (), None, [_probes()], _probes(), [_cost(1.0)], _cost(0.8)
    )
    assert machine.cost.regression and machine.cost.drop == pytest.approx(0.2, abs=2e-3)
    assert result.verdict == "regression"
    assert result.notes[-1].startswith("the CPU time per step with the machine's speed taken out step by step")
    assert machine.to_json()["cost"]["drop"] == pytest.approx(0.2, abs=2e-3)
    # 4 % more work: within the threshold, the verdict stays inconclusive.
    kept, _, machine = canary_cost_gate(
        [BASE], NOISY, config, (), None, [_probes()], _probes(), [_cost(1.0)], _cost(1 / 1.04)
    )
    assert machine.cost.verdict == "pass" and kept == before
    # 25 % more work, but the candidate's cost moves 17.5 % between its halves: the cost is a regression on its
    # own (20 % > 17.5 %), yet its drop less its noise, 2.5 %, is within the 5 % allowed: not confirmed.
    drifting = _samples(0.1 * np.concatenate([0.8 * JITTER[:6], 0.66 * JITTER[6:]]), metric="steps_per_canary")
    unsure, _, machine = canary_cost_gate(
        [BASE], NOISY, config, (), None, [_probes()], _probes(), [_cost(1.0)], drifting
    )
    assert machine.cost.regression and machine.cost.noise == pytest.approx(0.175, abs=2e-3)
    assert unsure == before


def test_the_wall_clock_vouching_against_it_keeps_the_verdict():
    config = CheckConfig()
    cost = ([_cost(1.0)], _cost(0.8))
    # The wall clock quiet and unchanged: a pass stays a pass, whatever the CPU time did.
    passed, _, machine = canary_cost_gate([BASE], BASE, config, (), None, [_probes()], _probes(), *cost)
    assert passed.verdict == "pass" and machine.cost.regression
    # The candidate faster by 30 %, more than its own 13 % noise: no regression, though too noisy to pass.
    faster = _samples(np.concatenate([0.3 * JITTER[:6], 0.26 * JITTER[6:]]))
    wall, _, _ = machine_speed_gate([BASE], faster, config, (), None, [_probes()], _probes())
    assert wall.verdict == "inconclusive" and wall.drop < -wall.noise
    assert canary_cost_gate([BASE], faster, config, (), None, [_probes()], _probes(), *cost)[0] == wall


def test_a_regression_that_the_cost_does_not_confirm_is_withdrawn():
    config = CheckConfig()
    slow = _samples(0.16 * JITTER)  # steps 25 % longer, every one of them: a 20 % drop, no noise
    before, _, _ = machine_speed_gate([BASE], slow, config, (), None, [_probes()], _probes())
    assert before.verdict == "regression"
    result, _, machine = canary_cost_gate(
        [BASE], slow, config, (), None, [_probes()], _probes(), [_cost(1.0)], _cost(1.0)
    )
    assert machine.cost.drop == pytest.approx(0.0) and result.verdict == "inconclusive"
    assert result.notes[-1].startswith("inconclusive: with the machine's speed taken out step by step")
    confirmed, _, _ = canary_cost_gate([BASE], slow, config, (), None, [_probes()], _probes(), [_cost(1.0)], _cost(0.8))
    assert confirmed.verdict == "regression"
    # A cost drop of 20 % with 17.5 % of its own noise does not confirm it either.
    drifting = _samples(0.1 * np.concatenate([0.8 * JITTER[:6], 0.66 * JITTER[6:]]), metric="steps_per_canary")
    unsure = canary_cost_gate([BASE], slow, config, (), None, [_probes()], _probes(), [_cost(1.0)], drifting)[0]
    assert unsure.verdict == "inconclusive" and "drop +20.1%" in unsure.notes[-1]


def test_without_the_canary_or_a_cost_in_every_run_the_verdict_is_machine_speed_gates():
    config = CheckConfig()
    slow = _samples(0.16 * JITTER)
    plain = machine_speed_gate([BASE], slow, config)
    assert canary_cost_gate([BASE], slow, config, (), None, (), None, [_cost(1.0)], _cost(1.0)) == plain
    with_probes = machine_speed_gate([BASE], slow, config, (), None, [_probes()], _probes())
    assert canary_cost_gate([BASE], slow, config, (), None, [_probes()], _probes(), [None], _cost(1.0)) == with_probes
    assert canary_cost_gate([BASE], slow, config, (), None, [_probes()], _probes(), [_cost(1.0)], None) == with_probes


def test_check_gates_run_directories_on_their_cost():
    """The wiring: `check` takes each run's cost from its metrics records (cpu_ms, canary_cpu_ms)."""
    from test_check import _probed, _run

    from analyzer.verbs.check import check

    base_mfu = list(0.2 * JITTER)
    noisy_mfu = list(NOISY.values)
    # Probes of 2.0 ms (CPU time 1.8 ms) on steps 0, 3, 6, 9 of both runs; the candidate's busiest rank spends
    # 12.5 ms of CPU time per step against the baseline's 10: 25 % more work, a 20 % drop.
    base = _run(mfu=base_mfu, cpu_ms=[10.0] * 12, canary_ms=_probed(2.0))
    cand = _run(mfu=noisy_mfu, cpu_ms=[12.5] * 12, canary_ms=_probed(2.0))
    outcome = check(base, cand)
    assert outcome.machine.cost.drop == pytest.approx(0.2) and outcome.verdict == "regression"
    assert outcome.machine.cost.cand_value == pytest.approx(1.8 / 12.5)  # steps per canary unit
    assert outcome.to_json()["machine_speed"]["cost"]["metric"] == "steps_per_canary"
    assert "Cost per step (CPU time in canary units, busiest rank): drop +20.0% (p = " in outcome.explanation
    assert "; regression)." in outcome.explanation
    # Without the canary, or without CPU time, there is no cost, and the wall clock alone cannot say.
    assert check(base, cand, machine_speed=False).verdict == "inconclusive"
    assert check(base, cand, cpu_time=False).machine.cost is None
