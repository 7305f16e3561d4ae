"""Running every suggestion rule on a run (``suggest``), and the report's list of them.

The rule modules register their rules with :func:`analyzer.verbs.suggest.engine.rule`
when imported; this module imports them all, so the engine never imports a rule (no
circle; a contract in pyproject.toml holds it, and tests/test_suggest_registry.py
requires every ``rules_*.py`` module in it). A new rule module goes in the import
line below and in that contract.

After the rules, :func:`suggest` states each suggestion's coverage of its
inputs and caps its confidence by it (:func:`coverage`), ranks them
(:func:`analyzer.verbs.suggest.engine.rank`), and when the first suggestion
does not act on the largest part of the step a rule can act on, says why in
its notes (:func:`first_note`). docs/suggestions.md, "Ranking and confidence".
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from analyzer.verbs.suggest import (  # noqa: F401
    rules_comm,
    rules_compute,
    rules_data,
    rules_health,
    rules_host,
    rules_memory,
    rules_recompute,
)
from analyzer.verbs.suggest.engine import (
    CONFIDENCE_ORDER,
    COMM_FIRST_SHARE,
    SCHEMA,
    Confidence,
    NOT_ACTIONABLE,
    RULES,
    Suggestion,
    SuggestionsDocument,
    needs_flops,
    part_of,
    parts_of,
    rank,
    suggestions_json,
)
from analyzer.verbs.suggest.memo import memo_of

if TYPE_CHECKING:
    from collections.abc import Sequence

    from analyzer.api import RunAnalysis
    from analyzer.ingest.tables import RankTrace
    from analyzer.verbs.suggest.facts import RunFacts

# FLOP coverage under this leaves the trace-shape MFU a lower bound (analyzer.metrics.mfu.COVERAGE_MIN's figure).
FLOP_COVERAGE_MIN = 0.90
_BY_ORDER: dict[int, Confidence] = {CONFIDENCE_ORDER[c]: c for c in get_args(Confidence)}


def coverage(f: "RunFacts", s: Suggestion) -> tuple[dict[str, Any], Confidence]:
    """What a suggestion's inputs cover, and its confidence capped by that coverage.

    ``flop_coverage``: share of the device compute time whose FLOPs the
    trace's shapes give (rules on compute only); ``windows_used`` of
    ``windows_total`` step windows (flagged ones are not read: at most
    medium); ``ranks_traced`` of ``ranks_in_job`` (the world size, or the
    collectives' group size when traces say more): a communication
    suggestion from fewer ranks than the job has is at most low, since one
    rank cannot tell waiting for a peer from the transfer. ``limits`` says
    each cap that applied. ``tokens_source``: where a trace's tokens per step
    come from (its input shapes), on suggestions whose prediction uses them.
    """
    cap = 0
    limits: list[str] = []
    in_job = max(f.world_size or 1, f.comm_group_size or 1)
    cov: dict[str, Any] = {
        "windows_used": f.windows_used,
        "windows_total": f.windows_total,
        "ranks_traced": f.ranks_traced,
        "ranks_in_job": in_job,
    }
    if f.kind == "traces" and f.tokens_source and s.predicted is not None and s.predicted.tokens_per_step_before:
        cov["tokens_source"] = f.tokens_source  # tokens per step estimated from the trace's input shapes
    if f.windows_total and f.windows_used < f.windows_total:
        cap = max(cap, 1)
        limits.append(f"{f.windows_total - f.windows_used} of {f.windows_total} step windows flagged and not read")
    # Compute time is what the FLOP coverage is measured on: a rule acting on it rests on that coverage too.
    if needs_flops(s.rule) or part_of(s.rule) == "compute":
        cov["flop_coverage"] = f.flop_coverage
        if f.flop_coverage is not None and f.flop_coverage < FLOP_COVERAGE_MIN:
            cap = max(cap, 2)
            limits.append(f"FLOPs known for {f.flop_coverage:.0%} of compute time")
    if part_of(s.rule) == "exposed_comm" and f.kind == "traces" and f.ranks_traced < in_job:
        cap = max(cap, 2)
        limits.append(f"{f.ranks_traced} of {in_job} ranks traced: waiting for a peer and transfer look the same")
    cov["limits"] = tuple(limits)
    return cov, _BY_ORDER[max(CONFIDENCE_ORDER[s.confidence], cap)]


def largest_actionable(f: "RunFacts") -> tuple[str, float] | None:
    """The largest breakdown part some rule acts on, with its share of the step; None without a breakdown."""
    acted = {p for r in RULES for p in r.parts}
    parts = {k: v for k, v in f.shares.items() if v > 0 and k in acted and k not in NOT_ACTIONABLE}
    if not parts:
        return None
    part = max(parts, key=lambda k: (parts[k], k))
    return part, parts[part]


def first_note(f: "RunFacts", ranked: list[Suggestion], comm_first: bool) -> str | None:
    """Why the first suggestion does not act on the largest actionable part; None when it does (or no breakdown)."""
    top = largest_actionable(f)
    if not ranked or top is None:
        return None
    part, share = top
    first = ranked[0]
    if part in parts_of(first.rule):
        return None
    head = f"ranked first although {part} ({share:.0%} of the step) is the largest part a rule acts on"
    if comm_first and part_of(first.rule) == "exposed_comm":
        return (
            f"{head}: exposed comm is {f.shares.get('exposed_comm', 0):.0%} of the step (> {COMM_FIRST_SHARE:.0%}), "
            "and a collective holds every rank of the job, so it is settled first"
        )
    on_part = [s for s in ranked if part in parts_of(s.rule)]
    if not on_part:
        return f"{head}: no rule acting on {part} fired (docs/suggestions.md lists their thresholds)"
    best = on_part[0]
    return (
        f"{head}: its predicted gain ({first.gain:+.0%}) is above that of {best.rule} on {part} "
        f"({best.gain:+.0%})" + (" (a diagnosis ranks after changes)" if best.kind == "diagnosis" else "")
    )


def suggest(ra: "RunAnalysis") -> list[Suggestion]:
    """Every rule that fires on this run, ranked (see :func:`rank`). Pure: reads only ``ra``."""
    from analyzer.verbs.suggest.facts import run_facts

    memo = memo_of(ra)  # computed once per analysis: the text report, the JSON and the dashboard ask
    if memo.suggestions is not None:
        return list(memo.suggestions)
    facts = run_facts(ra)
    fired = []
    for s in (r(facts) for r in RULES):
        if s is None:
            continue
        cov, confidence = coverage(facts, s)
        fired.append(dataclasses.replace(s, coverage=cov, confidence=confidence))
    # On reftrain runs every rank's phases are measured and the closed loop (bench/bench_suggest.py) checks
    # the gain order; on traces exposed comm over COMM_FIRST_SHARE goes first (engine.COMM_FIRST_SHARE).
    comm_first = facts.kind == "traces" and facts.shares.get("exposed_comm", 0.0) > COMM_FIRST_SHARE
    ranked = rank(fired, comm_first=comm_first)
    note = first_note(facts, ranked, comm_first)
    if note is not None:
        ranked[0] = dataclasses.replace(ranked[0], notes=(note, *ranked[0].notes))
    memo.suggestions = tuple(ranked)
    return ranked


def replay_predictions(ra: "RunAnalysis", traces: "Sequence[RankTrace]") -> list[Suggestion]:
    """:func:`suggest` with each prediction the replay can make made by it (``predicted.model == "replay"``,
    :func:`analyzer.verbs.suggest.whatif.replayed`), the others kept; the ranking stays. Stored in the
    analysis' memo: :func:`suggest`, :func:`report_suggestions` and :func:`suggestions_document` of ``ra``
    return these from then on. ``traces``: the run's profiled traces (rank, step windows)."""
    from analyzer.verbs.suggest.facts import run_facts
    from analyzer.verbs.suggest.whatif import replayed
    from analyzer.verbs.whatif import step_graphs

    ranked = suggest(ra)
    facts = run_facts(ra)
    graphs = step_graphs(traces)
    out = [replayed(s, facts, graphs) for s in ranked]
    memo_of(ra).suggestions = tuple(out)
    return out


# `analyzer suggest` replays runs of at most this many trace files (a graph per rank and profiled step, about
# 0.1 to 0.5 s each on the development machine); larger runs keep the closed form.
REPLAY_MAX_TRACES = 64


def suggest_with_replay(ra: "RunAnalysis", path: Path, cache: bool = True) -> list[Suggestion]:
    """``analyzer suggest --replay``'s suggestions: :func:`replay_predictions` over the run's traces at ``path``
    when a suggestion's change is one the replay simulates and the run has at most :data:`REPLAY_MAX_TRACES`
    trace files, else (or without a usable trace) :func:`suggest`."""
    from analyzer.errors import AnalyzerError
    from analyzer.verbs.suggest.facts import run_facts
    from analyzer.verbs.suggest.whatif import replay_request
    from analyzer.verbs.whatif import run_traces

    facts = run_facts(ra)
    if not any(replay_request(s, facts) for s in suggest(ra)):
        return suggest(ra)  # no change the replay simulates: the traces are not read
    try:
        traces, _ = run_traces(path, cache=cache)
    except AnalyzerError:
        return suggest(ra)  # the analysis has said why no trace could be used
    if len(traces) > REPLAY_MAX_TRACES:
        return suggest(ra)
    try:
        return replay_predictions(ra, traces)
    except AnalyzerError:
        return suggest(ra)  # a step without a usable graph (a cycle): the closed form, which needs none


def report_suggestions(ra: "RunAnalysis") -> list[dict[str, Any]]:
    """The report's ``suggestions[]`` for a run: ranked, with copy-paste commands (one call for api/report/dashboard)."""
    from analyzer.verbs.suggest.facts import run_facts

    facts = run_facts(ra)
    return suggestions_json(suggest(ra), facts.config_path, facts.world_size)


def suggestions_document(ra: "RunAnalysis") -> SuggestionsDocument:
    """``analyzer suggest --json``'s document (schema :data:`~analyzer.verbs.suggest.engine.SCHEMA`):
    the run's identity and :func:`report_suggestions`."""
    return SuggestionsDocument(
        schema=SCHEMA,
        path=[str(p) for p in ra.path] if isinstance(ra.path, list) else str(ra.path),
        kind=ra.kind,
        run_id=ra.run_manifest.run_id,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        suggestions=report_suggestions(ra),
    )
