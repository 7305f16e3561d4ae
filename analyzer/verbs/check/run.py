"""``analyzer check`` on analyzed runs: :func:`check` gathers the samples, runs the gates and returns the
:class:`GateOutcome`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from analyzer.errors import AnalyzerError
from analyzer.verbs.check.compat import check_compatible, injected_notes
from analyzer.verbs.check.goodput import goodput_gate
from analyzer.verbs.check.machine import canary_cost_gate
from analyzer.verbs.check.memory import memory_gate
from analyzer.verbs.check.outcome import GateOutcome
from analyzer.verbs.check.result import CheckConfig
from analyzer.verbs.check.samples import Probes, StepSamples, cost_samples, cpu_samples, run_probes, run_samples

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis


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
    bases = list(baseline) if isinstance(baseline, Sequence) else [baseline]
    if not bases:
        raise AnalyzerError("no baseline given")
    gp_gate = None if min_goodput is None else goodput_gate(candidate, min_goodput, bases[0])
    mem_gate = None if max_memory_growth is None else memory_gate(bases, candidate, max_memory_growth)
    notes: list[str] = []
    for b in bases:
        notes += [n for n in check_compatible(b, candidate) if n not in notes]
    base_samples, cand_samples, sample_notes = run_samples(bases[0], candidate, *bases[1:])
    labels = ["baseline"] if len(bases) == 1 else [f"baseline {i + 1}" for i in range(len(bases))]
    cpu_base: list[StepSamples | None] = []
    cpu_cand = None
    if cpu_time:
        cpu_base = [cpu_samples(b, label) for b, label in zip(bases, labels)]
        cpu_cand = cpu_samples(candidate, "candidate")
    probes_base: list[Probes | None] = []
    probes_cand = None
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
        for b, label in zip(bases, labels):
            notes += injected_notes(label, b.run_manifest)
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
