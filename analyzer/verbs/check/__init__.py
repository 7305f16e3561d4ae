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

The package, by concern: ``stats`` (the statistics), ``samples`` (the per-step
values read from the runs), ``result`` (the knobs and the step statistic's
result), ``verdict`` (the step-statistic verdict: wall clock, then CPU time),
``machine`` (the machine-speed canary), ``goodput`` and ``memory`` (the
one-number gates), ``compat`` (whether runs can be compared), ``outcome``
(the verdict on analyzed runs and its paragraph), ``run`` (:func:`check`).
"""

from __future__ import annotations

from analyzer.verbs.check.compat import check_compatible, injected_notes
from analyzer.verbs.check.goodput import GoodputGate, goodput_gate
from analyzer.verbs.check.machine import MachineSpeed, canary_cost_gate, machine_speed_gate
from analyzer.verbs.check.memory import MemoryGate, memory_gate
from analyzer.verbs.check.outcome import GateOutcome, explain
from analyzer.verbs.check.result import METRIC_LABELS, VERDICT_LABELS, CheckConfig, CheckResult, Verdict
from analyzer.verbs.check.run import check
from analyzer.verbs.check.samples import (
    Metric,
    Probes,
    StepSamples,
    cost_samples,
    cpu_samples,
    run_probes,
    run_samples,
    samples_from_metrics,
    samples_from_steps,
)
from analyzer.verbs.check.stats import fast_quantile, mann_whitney_less, min_one_sided_p, relative_drop, self_noise
from analyzer.verbs.check.verdict import check_samples, cpu_time_confirm, cpu_time_veto, gate_samples

__all__ = [
    "METRIC_LABELS",
    "VERDICT_LABELS",
    "CheckConfig",
    "CheckResult",
    "GateOutcome",
    "GoodputGate",
    "MachineSpeed",
    "MemoryGate",
    "Metric",
    "Probes",
    "StepSamples",
    "Verdict",
    "check",
    "check_compatible",
    "check_samples",
    "cost_samples",
    "cpu_samples",
    "cpu_time_confirm",
    "cpu_time_veto",
    "explain",
    "fast_quantile",
    "gate_samples",
    "goodput_gate",
    "injected_notes",
    "canary_cost_gate",
    "machine_speed_gate",
    "mann_whitney_less",
    "memory_gate",
    "min_one_sided_p",
    "relative_drop",
    "run_probes",
    "run_samples",
    "samples_from_metrics",
    "samples_from_steps",
    "self_noise",
]
