"""The gate's verdict on analyzed runs (:class:`GateOutcome`) and the paragraph that explains it (:func:`explain`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from analyzer.render.format import short_kernel_name, value_text
from analyzer.verbs.check.goodput import GoodputDocument, GoodputGate
from analyzer.verbs.check.machine import MachineSpeed, MachineSpeedDocument
from analyzer.verbs.check.memory import MemoryDocument, MemoryGate
from analyzer.verbs.check.result import (
    VERDICT_LABELS,
    CheckResult,
    CheckResultDocument,
    CheckStatisticDocument,
    Verdict,
)
from analyzer.verbs.check.samples import StepSamples
from analyzer.verbs.compare import ComparisonDocument, labelled

if TYPE_CHECKING:
    from analyzer.verbs.compare import Comparison, Delta


class CheckDocument(CheckResultDocument):
    """``analyzer check --json`` (schema ``analyzer.check/2``): :meth:`GateOutcome.to_json`. The step
    statistic's fields (:class:`CheckResultDocument`; ``notes`` the gate's and the runs'), then these.
    ``verdict`` is the overall one (the exit code), ``step_verdict`` the step statistic's alone."""

    explanation: str
    cpu_time: CheckStatisticDocument | None
    compare: ComparisonDocument
    step_verdict: Verdict
    goodput: GoodputDocument | None
    memory: MemoryDocument | None
    machine_speed: MachineSpeedDocument | None


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

    def to_json(self) -> CheckDocument:
        out = cast(CheckDocument, self.result.to_json())
        out["notes"] = list(self.result.notes) + list(self.notes)
        out["explanation"] = self.explanation
        out["cpu_time"] = (
            None
            if self.cpu is None
            else cast(
                CheckStatisticDocument,
                {k: v for k, v in self.cpu.to_json().items() if k not in ("schema", "base_source", "cand_source")},
            )
        )
        out["compare"] = self.comparison.to_json()
        # ``verdict`` is the overall one (the exit code); ``step_verdict`` that of the step statistic alone.
        out["step_verdict"] = self.result.verdict
        out["verdict"] = self.verdict
        out["goodput"] = None if self.goodput is None else self.goodput.to_json()
        out["memory"] = None if self.memory is None else self.memory.to_json()
        out["machine_speed"] = None if self.machine is None else self.machine.to_json()
        return out


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
