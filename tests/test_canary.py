"""The machine-speed canary (recorder/canary.py): its schedule, its probe, and where the recorder runs it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from analyzer.ingest.formats import MetricsLine, RunManifest
from recorder import ProfileSchedule
from recorder.canary import Canary
from tests.recorder_loops import BATCH, DATA_SLEEP_S, SEQ, VOCAB, WIDTH, train

STEPS = 12
# The stand-in probe's sleep: far longer than a step of the tiny loop plus any timer noise, so a
# probe inside the step's clocks could not go unseen, however busy the machine is.
PROBE_SLEEP_S = 0.3
PROBE_MS = (7.25, 6.5)  # what the stand-in probe reports: written to the record as they are


def _records(run_dir: Path) -> list[MetricsLine]:
    return [
        MetricsLine.from_json(json.loads(line)) for line in (run_dir / "metrics/rank0.jsonl").read_text().splitlines()
    ]


def test_schedule_and_probe():
    # Before the first step, every 5th from it, and before the last when it is known.
    assert [s for s in range(12) if Canary(0, 11).due(s)] == [0, 5, 10, 11]
    assert [s for s in range(3, 21) if Canary(3, 20).due(s)] == [3, 8, 13, 18, 20]
    assert [s for s in range(3, 21) if Canary(3, None).due(s)] == [3, 8, 13, 18]
    canary = Canary(0, 9)
    threads = torch.get_num_threads()
    wall_ms, cpu_ms = canary.probe()
    # Real work took real time (40 turns of a 64x64 matmul: > 0.2 MFLOP each), and the probe
    # leaves the thread count as it found it.
    assert wall_ms > 0 and cpu_ms > 0 and torch.get_num_threads() == threads


@pytest.mark.parametrize(
    "options, probed",
    [
        # The last step known (steps=12) and a profiler window over steps 4-5 (warm-up 4, traced 5):
        # the probe due before step 5 is skipped, the last step's is not.
        ({"steps": STEPS, "profile": ProfileSchedule(wait=4, warmup=1, active=1)}, [0, 10, 11]),
        # The loop did not say how many steps it runs: the first and every 5th only.
        ({"profile": ProfileSchedule(enabled=False)}, [0, 5, 10]),
    ],
)
def test_the_recorder_probes_on_the_schedule_outside_the_step_clocks(tmp_path, monkeypatch, options, probed):
    def stand_in(self: Canary) -> tuple[float, float]:
        time.sleep(PROBE_SLEEP_S)
        return PROBE_MS

    monkeypatch.setattr(Canary, "probe", stand_in)
    records = _records(train(tmp_path, STEPS, **options).run_dir)
    assert [r.step for r in records if r.canary_ms is not None] == probed
    for r in records:
        if r.step in probed:
            assert (r.canary_ms, r.canary_cpu_ms) == PROBE_MS
            # Outside the step's time and its data wait: the step is far shorter than the probe's sleep...
            assert r.step_time_ms < PROBE_SLEEP_S * 1e3
            assert r.data_wait_ms < PROBE_SLEEP_S * 1e3
        else:
            assert r.canary_ms is None and r.canary_cpu_ms is None
    # ...while the loop's own wait before the step (its "data") is still counted there.
    assert all(r.data_wait_ms >= DATA_SLEEP_S * 1e3 for r in records[1:])


def test_the_real_probe_is_written_and_not_counted_as_model_flops(tmp_path):
    # FLOPs measured on the first step, which the canary probes first: its matmuls (40 x 2 x 64^3 FLOPs)
    # must not reach the count, which is the tiny model's linear layer alone.
    run_dir = train(tmp_path, 6, steps=6, flops=None, profile=ProfileSchedule(enabled=False)).run_dir
    records = _records(run_dir)
    assert [r.step for r in records if r.canary_ms is not None] == [0, 5]
    for r in records:
        if r.canary_ms is not None:
            # A probe of about a millisecond; its thread's CPU time cannot exceed its wall time.
            assert r.canary_cpu_ms is not None and 0 < r.canary_cpu_ms <= r.canary_ms + 0.05 and r.canary_ms < 1000
    man = RunManifest.from_json(json.loads((run_dir / "run.json").read_text()))
    assert man.flops is not None and man.flops.measured is not None
    # Forward, input gradient and weight gradient of the (BATCH x SEQ) x WIDTH x VOCAB linear layer.
    assert man.flops.measured.model == 3 * 2 * BATCH * SEQ * WIDTH * VOCAB


def _samples(values, metric: str = "mfu"):
    import numpy as np

    from analyzer.verbs.check import StepSamples

    values = np.asarray(values, dtype=np.float64)
    return StepSamples(metric, values, np.arange(len(values), dtype=np.int64), "synthetic", 1)


def _probes(wall_ms: float, cpu_ms: float):
    from analyzer.verbs.check import Probes

    return Probes(
        wall=_samples([1000 / wall_ms] * 4, metric="canary_probes_per_s"),
        cpu=_samples([1000 / cpu_ms] * 4, metric="canary_probes_per_s"),
    )


def test_a_cpu_time_confirmed_regression_is_withdrawn_when_the_probes_cpu_time_explains_it():
    """Contention raised the candidate's CPU time per step by 25 % and the probe's CPU time by 25 % too,
    while the probe's fast wall time stayed put: the CPU-time drop that let the wall-clock regression
    stand is the machine's, so the regression is withdrawn. Exact samples: every answer is a ratio."""
    import numpy as np

    from analyzer.verbs.check import CheckConfig, machine_speed_gate

    jitter = np.linspace(0.999, 1.001, 12)
    base, cand = _samples(0.2 * jitter), _samples(0.16 * jitter)  # steps 25 % longer: a 20 % drop, no noise
    cpu_base = _samples(100 * jitter, metric="cpu_steps_per_s")
    cpu_cand = _samples(80 * jitter, metric="cpu_steps_per_s")  # 25 % more CPU time per step
    config = CheckConfig()
    result, cpu, ms = machine_speed_gate(
        [base], cand, config, [cpu_base], cpu_cand, [_probes(1.0, 1.0)], _probes(1.0, 1.25)
    )
    assert cpu.regression and cpu.drop == pytest.approx(0.2, abs=1e-3)  # CPU time alone confirms the drop
    assert ms.slowdown == pytest.approx(0.0) and ms.cpu_slowdown == pytest.approx(0.25)
    assert ms.adjusted_drop == pytest.approx(0.2, abs=1e-3) and ms.adjusted_cpu_drop == pytest.approx(0.0, abs=1e-3)
    assert ms.adjusted_verdict == "inconclusive" and result.verdict == "inconclusive"
    assert result.notes[-1].startswith("inconclusive: the machine was 25% slower during the candidate's run")
    # The probe's CPU time up 10 % only: 1.25 / 1.10 = 13.6 % more CPU time per step remains, a 12 % drop,
    # past half the 20 % wall drop: the regression stands.
    kept, _, ms = machine_speed_gate([base], cand, config, [cpu_base], cpu_cand, [_probes(1.0, 1.0)], _probes(1.0, 1.1))
    assert ms.adjusted_cpu_drop == pytest.approx(1 - 1.1 * 0.8, abs=1e-3) and kept.verdict == "regression"
