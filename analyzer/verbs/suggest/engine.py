"""Suggestions: the records a rule returns, the rule registry, and the ranking.

A *rule* is a small function ``rule(facts: RunFacts) -> Suggestion | None``
(one per module section in ``analyzer/verbs/suggest/rules_*.py``). It fires when
its trigger passes a named, documented threshold, and then returns a
:class:`Suggestion` with

* ``evidence``: the measured numbers that fired it (names carry units);
* ``change``: the exact reftrain override(s) (``--set train.micro_batch_size=16``)
  and the same advice in plain PyTorch terms for foreign traces;
* ``predicted``: a what-if estimate on the measured timeline (step time,
  tokens/s and MFU before and after, see ``analyzer/verbs/suggest/whatif.py``);
* ``confidence``: ``high``, ``medium`` or ``low`` (docs/suggestions.md says
  what each rule's confidence rests on).

:func:`suggest` runs every rule of :data:`RULES` and ranks the results
(:func:`rank`): when exposed communication is over :data:`COMM_FIRST_SHARE`
of the step, the suggestions on it first; then suggestions with a change to
make before diagnoses (which only explain), then by predicted throughput
gain, largest first. :data:`RULE_PART` names the part of the step each rule
acts on. docs/suggestions.md is the reference of every rule.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

from analyzer.jsontext import jsonable

if TYPE_CHECKING:
    from analyzer.verbs.suggest.facts import RunFacts

SCHEMA = "analyzer.suggestions/1"
Confidence = Literal["high", "medium", "low"]
_CONFIDENCE_ORDER = {"high": 0, "medium": 1, "low": 2}


def format_value(value: Any) -> str:
    """A config value as ``--set`` (YAML) text: true/false, null, numbers without a trailing .0."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


@dataclass(frozen=True)
class Change:
    """What to change. ``overrides`` maps reftrain config keys (``section.key``) to new values.

    ``overrides`` is empty when reftrain has no knob for it (or for foreign
    traces the rule could not name one); ``advice`` always says it in plain
    PyTorch terms.
    """

    overrides: dict[str, Any]
    advice: str

    def set_args(self) -> list[str]:
        """``["--set", "k=v", ...]`` for the reftrain command line."""
        out: list[str] = []
        for key, value in self.overrides.items():
            out += ["--set", f"{key}={format_value(value)}"]
        return out

    def command(self, config_path: str | None, nproc: int | None = None) -> str | None:
        """A copy-paste ``reftrain`` command applying the change to a run's saved config; None without overrides."""
        if not self.overrides or config_path is None:
            return None
        launch = ["--nproc", str(nproc)] if nproc and nproc > 1 else []
        return shlex.join(["reftrain", *launch, "--config", config_path, *self.set_args()])

    def to_json(self) -> dict[str, Any]:
        return {"overrides": dict(self.overrides), "set_args": self.set_args(), "advice": self.advice}


@dataclass(frozen=True)
class Prediction:
    """A what-if estimate: the step before and after the change, on the measured timeline.

    ``tokens_per_step`` is global (all ranks); it changes when the micro-batch
    or accumulation does. ``gain`` is the relative throughput gain,
    ``(tokens_after / step_after) / (tokens_before / step_before) - 1``; MFU
    (and tokens/s, when known) scale by ``1 + gain`` because the model FLOPs
    per token do not change. ``method`` states the what-if in one sentence.
    ``scope`` is ``steady-state step`` for all rules except those that act
    on the whole run's wall time (the profiler window).
    """

    step_time_ms_before: float
    step_time_ms_after: float
    tokens_per_step_before: float | None
    tokens_per_step_after: float | None
    mfu_before: float | None
    mfu_after: float | None
    tokens_per_s_before: float | None
    tokens_per_s_after: float | None
    method: str
    scope: str = "steady-state step"
    work_ratio: float = 1.0  # work per step after / before (batch growth) when tokens are unknown (traces)

    @property
    def gain(self) -> float:
        """Relative throughput gain (0.25 = 25 % more tokens, or work, per second)."""
        if self.step_time_ms_after <= 0 or self.step_time_ms_before <= 0:
            return 0.0
        if self.tokens_per_step_before and self.tokens_per_step_after:
            work = self.tokens_per_step_after / self.tokens_per_step_before
        else:
            work = self.work_ratio
        return work * self.step_time_ms_before / self.step_time_ms_after - 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "step_time_ms": {"before": jsonable(self.step_time_ms_before), "after": jsonable(self.step_time_ms_after)},
            "tokens_per_step": {"before": jsonable(self.tokens_per_step_before), "after": jsonable(self.tokens_per_step_after)},
            "tokens_per_s": {"before": jsonable(self.tokens_per_s_before), "after": jsonable(self.tokens_per_s_after)},
            "mfu": {"before": jsonable(self.mfu_before), "after": jsonable(self.mfu_after)},
            "gain": jsonable(self.gain),
            "work_ratio": jsonable(self.work_ratio),
            "method": self.method,
            "scope": self.scope,
        }


@dataclass(frozen=True)
class Suggestion:
    """One rule's finding. ``kind`` ``change`` proposes a change; ``diagnosis`` explains (no single change)."""

    rule: str
    title: str
    trigger: str  # the threshold test that fired, with the measured value
    evidence: dict[str, Any]
    change: Change
    predicted: Prediction | None
    confidence: Confidence
    kind: Literal["change", "diagnosis"] = "change"
    notes: tuple[str, ...] = field(default_factory=tuple)
    # What the inputs cover (set by suggest: analyzer.verbs.suggest.run.coverage); the confidence is capped by it.
    coverage: dict[str, Any] = field(default_factory=dict)

    @property
    def gain(self) -> float:
        """Predicted relative throughput gain in the steady state (0 without a prediction)."""
        if self.predicted is None or self.predicted.scope != "steady-state step":
            return 0.0
        return self.predicted.gain

    def to_json(self, config_path: str | None = None, nproc: int | None = None) -> dict[str, Any]:
        """The report's ``suggestions[]`` entry: ``rule``, ``evidence``, ``change``, ``predicted``, ...

        ``change.command`` is the copy-paste reftrain command (``config_path``
        is the run's config.yaml, ``nproc`` its world size); None for advice.
        """
        change = self.change.to_json()
        change["command"] = self.change.command(config_path, nproc)
        return {
            "rule": self.rule,
            "title": self.title,
            "kind": self.kind,
            "trigger": self.trigger,
            "evidence": {k: jsonable(v) for k, v in self.evidence.items()},
            "change": change,
            "predicted": None if self.predicted is None else self.predicted.to_json(),
            "confidence": self.confidence,
            "coverage": {k: (list(v) if isinstance(v, tuple) else jsonable(v)) for k, v in self.coverage.items()},
            "notes": list(self.notes),
        }


# The part of the step (a breakdown part, RunFacts.shares) each rule's what-if acts on.
RULE_PART = {
    "ddp_bucket_size": "exposed_comm", "grad_accumulation": "exposed_comm", "fsdp_reshard": "exposed_comm",
    "fsdp_prefetch": "exposed_comm", "last_bucket_overlap": "exposed_comm",
    "comm_compression": "exposed_comm", "overlap_grad_sync": "grad_sync", "gradient_as_bucket_view": "exposed_comm",
    "launch_bound": "idle", "cuda_graphs": "idle", "data_wait": "data", "pin_memory": "exposed_memcpy",
    "exposed_memcpy": "exposed_memcpy", "fused_adamw": "optimizer", "torch_compile": "compute",
    "bf16_autocast": "compute", "tf32": "compute", "micro_batch": "other", "smaller_micro_batch": "other",
    "activation_checkpointing": "compute", "selective_checkpointing": "compute",
    "straggler": "exposed_comm", "comm_one_rank": "exposed_comm", "comm_waiting": "exposed_comm",
    "dependency_idle": "idle", "host_sync": "idle", "pageable_copies": "exposed_memcpy",
}
# Rules whose what-if also acts on a second part: launch_bound's larger batch fills idle time and spreads the
# fixed (non-batch-scaled) exposed comm over k times the work (rules_compute.rule_launch_bound).
ALSO_PARTS = {"launch_bound": ("exposed_comm",)}
# Parts no rule removes as such (overlapped comm is already hidden; collective waits are the straggler's).
NOT_ACTIONABLE = frozenset({"overlapped_comm", "collective_wait"})
# Exposed communication above this share of the step ranks the suggestions on it first (issue 18): a
# collective holds every rank of the job, and one rank's other parts are measured on a step its peers set.
COMM_FIRST_SHARE = 0.20


def parts_of(rule_id: str) -> tuple[str, ...]:
    """Every breakdown part a rule's what-if acts on (empty for a rule that acts on none)."""
    return ((RULE_PART[rule_id],) if rule_id in RULE_PART else ()) + ALSO_PARTS.get(rule_id, ())


Rule = Callable[["RunFacts"], "Suggestion | None"]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    """Register a rule function (its name, without ``rule_``, is the rule id)."""
    RULES.append(fn)
    return fn


def rank(suggestions: list[Suggestion], comm_first: bool = False) -> list[Suggestion]:
    """Changes before diagnoses; then predicted steady-state gain (largest first), confidence, rule id.

    ``comm_first`` (exposed comm over :data:`COMM_FIRST_SHARE` of the step):
    the suggestions whose part is exposed communication come before all
    others, in the same order among themselves.
    """
    return sorted(
        suggestions,
        key=lambda s: (comm_first and RULE_PART.get(s.rule) != "exposed_comm", s.kind != "change",
                       -round(s.gain, 6), _CONFIDENCE_ORDER[s.confidence], s.rule),
    )


def suggestions_json(suggestions: list[Suggestion], config_path: str | None = None,
                     nproc: int | None = None) -> list[dict[str, Any]]:
    """``suggestions[]`` of the report JSON, in rank order."""
    return [s.to_json(config_path, nproc) for s in suggestions]
