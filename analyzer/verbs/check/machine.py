"""The machine-speed canary's check on the verdict (docs/ci.md "Machine speed"): :func:`machine_speed_gate`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Sequence, TypedDict, cast

import numpy as np

from analyzer.verbs.check.result import CheckConfig, CheckResult, CheckResultDocument, Verdict
from analyzer.verbs.check.samples import Probes, StepSamples
from analyzer.verbs.check.stats import fast_quantile
from analyzer.verbs.check.verdict import DROP_ROUNDING, check_samples, gate_samples

# Each run needs this many canary probes for its machine-speed statistic to mean anything.
_MIN_PROBES = 3


class MachineSpeedDocument(TypedDict):
    """The check document's ``machine_speed``: :class:`MachineSpeed`'s fields."""

    base_probe_ms: float
    cand_probe_ms: float
    slowdown: float
    base_probe_cpu_ms: float
    cand_probe_cpu_ms: float
    cpu_slowdown: float
    adjusted_drop: float
    adjusted_cpu_drop: float | None
    adjusted_verdict: Verdict
    n_base: int
    n_cand: int
    cost: CheckResultDocument | None


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
    cost: CheckResult | None = None

    def to_json(self) -> MachineSpeedDocument:
        out = cast(MachineSpeedDocument, asdict(self))
        out["cost"] = None if self.cost is None else self.cost.to_json()  # with its schema and label, as the gate's
        return out


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
    confirms = cost.regression and cost.drop - cost.noise - config.max_drop > DROP_ROUNDING
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
