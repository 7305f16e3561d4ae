"""Running every suggestion rule on a run (``suggest``), and the report's list of them.

The rule modules register their rules with :func:`analyzer.verbs.suggest.engine.rule`
when imported; this module imports them all, so the engine never imports a rule (no
circle; a contract in pyproject.toml holds it). A new rule module goes in the import
line below.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from analyzer.verbs.suggest import rules_comm, rules_compute, rules_data, rules_health, rules_memory  # noqa: F401
from analyzer.verbs.suggest.engine import RULES, Suggestion, rank, suggestions_json

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis


def suggest(ra: "RunAnalysis") -> list[Suggestion]:
    """Every rule that fires on this run, ranked (see :func:`rank`). Pure: reads only ``ra``."""
    from analyzer.verbs.suggest.facts import run_facts

    memo = getattr(ra, "derived", None)
    if memo is not None and "suggestions" in memo:
        return list(memo["suggestions"])
    facts = run_facts(ra)
    ranked = rank([s for s in (r(facts) for r in RULES) if s is not None])
    if memo is not None:
        memo["suggestions"] = list(ranked)
    return ranked


def report_suggestions(ra: "RunAnalysis") -> list[dict[str, Any]]:
    """The report's ``suggestions[]`` for a run: ranked, with copy-paste commands (one call for api/report/dashboard)."""
    from analyzer.verbs.suggest.facts import run_facts

    facts = run_facts(ra)
    return suggestions_json(suggest(ra), facts.config_path, facts.world_size)
