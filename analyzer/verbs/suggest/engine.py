"""Suggestions: the records a rule returns, the rule registry, and the ranking.

A *rule* is a small function ``rule_<id>(facts: RunFacts) -> Suggestion | None``
(one per module section in ``analyzer/verbs/suggest/rules_*.py``), registered
with ``@rule(part=...)``. It fires when
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
gain, largest first. Each rule is registered once with :func:`rule`, which
records its id (the function's name), the part of the step it acts on and
whether it needs FLOPs. docs/suggestions.md is the reference of every rule.
"""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Literal, TypedDict

from analyzer.jsontext import jsonable

if TYPE_CHECKING:
    from analyzer.verbs.suggest.facts import RunFacts

SCHEMA = "analyzer.suggestions/1"


class SuggestionsDocument(TypedDict):
    """``analyzer suggest --json`` (schema :data:`SCHEMA`), written by
    :func:`analyzer.verbs.suggest.run.suggestions_document`: the run's identity and its ranked suggestions."""

    schema: str
    path: str | list[str]
    kind: str  # "reftrain" or "traces"
    run_id: str | None
    created_at: str  # ISO 8601, UTC, seconds
    suggestions: list[dict[str, Any]]  # Suggestion.to_json() each: the report's suggestions[] entries


Confidence = Literal["high", "medium", "low"]
CONFIDENCE_ORDER = {"high": 0, "medium": 1, "low": 2}


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
    on the whole run's wall time (the profiler window). ``model`` says which
    model predicted: ``closed-form`` (analyzer/verbs/suggest/whatif.py) or
    ``replay`` (the profiled steps' dependency graphs replayed with the
    change, analyzer/metrics/replay.py).
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
    model: Literal["closed-form", "replay"] = "closed-form"

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
            "tokens_per_step": {
                "before": jsonable(self.tokens_per_step_before),
                "after": jsonable(self.tokens_per_step_after),
            },
            "tokens_per_s": {"before": jsonable(self.tokens_per_s_before), "after": jsonable(self.tokens_per_s_after)},
            "mfu": {"before": jsonable(self.mfu_before), "after": jsonable(self.mfu_after)},
            "gain": jsonable(self.gain),
            "work_ratio": jsonable(self.work_ratio),
            "method": self.method,
            "scope": self.scope,
            "model": self.model,
        }


@dataclass(frozen=True)
class Suggestion:
    """One rule's finding. ``kind`` ``change`` proposes a change; ``diagnosis`` explains (no single change)."""

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
    # The id of the rule that returned it: set by the registry (Rule.__call__) from the rule's function name.
    rule: str = field(default="", kw_only=True)

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


# Parts no rule removes as such (overlapped comm is already hidden; collective waits are the straggler's).
NOT_ACTIONABLE = frozenset({"overlapped_comm", "collective_wait"})
# Exposed communication above this share of the step ranks the suggestions on it first: a collective
# holds every rank of the job, and one rank's other parts are measured on a step its peers set.
COMM_FIRST_SHARE = 0.20


class Rule:
    """A registered rule: the function, and what the registry knows of it.

    ``id`` is the function's name without ``rule_``; it is the ``rule`` of every
    :class:`Suggestion` the rule returns (set here, so the id is written once).
    ``part``: the breakdown part (a key of ``RunFacts.shares``) its what-if acts
    on, None for a rule that acts on none; ``also_parts``: parts its what-if
    also acts on; ``needs_flops``: its what-if rests on the FLOP count (MFU or
    compute time per FLOP), so its confidence is capped by the FLOP coverage.
    Calling it runs the rule.
    """

    def __init__(
        self,
        fn: Callable[["RunFacts"], "Suggestion | None"],
        part: str | None,
        also_parts: tuple[str, ...],
        needs_flops: bool,
    ) -> None:
        if not fn.__name__.startswith("rule_"):
            raise ValueError(f"{fn.__module__}.{fn.__name__}: a rule function's name starts with 'rule_'")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.id = fn.__name__.removeprefix("rule_")
        self.part = part
        self.also_parts = also_parts
        self.needs_flops = needs_flops

    @property
    def parts(self) -> tuple[str, ...]:
        """Every breakdown part the rule's what-if acts on (empty for a rule that acts on none)."""
        return ((self.part,) if self.part is not None else ()) + self.also_parts

    def __call__(self, facts: "RunFacts") -> "Suggestion | None":
        found = self.fn(facts)
        return None if found is None else replace(found, rule=self.id)

    def __repr__(self) -> str:
        return f"Rule({self.id!r}, part={self.part!r})"


RULES: list[Rule] = []
_BY_ID: dict[str, Rule] = {}


def rule(
    part: str | None = None, *, also: tuple[str, ...] = (), flops: bool = False
) -> Callable[[Callable[["RunFacts"], "Suggestion | None"]], Rule]:
    """Register a rule function: ``@rule(part="exposed_comm")`` above ``def rule_ddp_bucket_size(f)``.

    The rule id is the function's name without ``rule_``; registering the
    same id twice is an error (two rules would share one id in the report).
    """

    def register(fn: Callable[["RunFacts"], "Suggestion | None"]) -> Rule:
        registered = Rule(fn, part, also, flops)
        if registered.id in _BY_ID:
            raise ValueError(f"rule {registered.id!r} registered twice ({fn.__module__})")
        RULES.append(registered)
        _BY_ID[registered.id] = registered
        return registered

    return register


def part_of(rule_id: str) -> str | None:
    """The breakdown part a registered rule's what-if acts on; None for none (or an unknown id)."""
    found = _BY_ID.get(rule_id)
    return found.part if found is not None else None


def parts_of(rule_id: str) -> tuple[str, ...]:
    """Every breakdown part a registered rule's what-if acts on (empty for none, or an unknown id)."""
    found = _BY_ID.get(rule_id)
    return found.parts if found is not None else ()


def needs_flops(rule_id: str) -> bool:
    """Whether a registered rule's what-if rests on the FLOP count."""
    found = _BY_ID.get(rule_id)
    return found is not None and found.needs_flops


def rank(suggestions: list[Suggestion], comm_first: bool = False) -> list[Suggestion]:
    """Changes before diagnoses; then predicted steady-state gain (largest first), confidence, rule id.

    ``comm_first`` (exposed comm over :data:`COMM_FIRST_SHARE` of the step):
    the suggestions whose part is exposed communication come before all
    others, in the same order among themselves.
    """
    return sorted(
        suggestions,
        key=lambda s: (
            comm_first and part_of(s.rule) != "exposed_comm",
            s.kind != "change",
            -round(s.gain, 6),
            CONFIDENCE_ORDER[s.confidence],
            s.rule,
        ),
    )


def suggestions_json(
    suggestions: list[Suggestion], config_path: str | None = None, nproc: int | None = None
) -> list[dict[str, Any]]:
    """``suggestions[]`` of the report JSON, in rank order."""
    return [s.to_json(config_path, nproc) for s in suggestions]
