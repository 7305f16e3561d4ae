"""Suggestions with evidence and a predicted gain (docs/suggestions.md).

    from analyzer import analyze
    from analyzer.verbs.suggest import suggest

    run = analyze("runs/my-run")
    for s in suggest(run):                       # ranked, largest predicted gain first
        print(s.rule, s.change.set_args(), s.predicted.gain)

``emit_config`` writes a reftrain config with one suggestion applied;
``add_suggest_subcommand`` / ``run_suggest`` are the ``analyzer suggest`` command.
"""
from __future__ import annotations

from analyzer.verbs.suggest.cli import add_suggest_subcommand, run_suggest
from analyzer.verbs.suggest.emit import emit_config, emitted_config_text
from analyzer.verbs.suggest.engine import RULES, Change, Prediction, Suggestion, report_suggestions, suggest, suggestions_json
from analyzer.verbs.suggest.render import render_markdown, render_text, suggestions_text

# The rules register themselves with engine.rule when imported; the package imports them
# here (Python imports a package before any of its modules), so engine never imports a rule
# and every user of the engine sees every rule. A new rule module goes in this line.
from analyzer.verbs.suggest import rules_comm, rules_compute, rules_data, rules_health, rules_memory  # noqa: F401

__all__ = [
    "suggest", "suggestions_json", "report_suggestions", "Suggestion", "Change", "Prediction", "RULES",
    "emit_config", "emitted_config_text", "render_text", "render_markdown", "suggestions_text",
    "add_suggest_subcommand", "run_suggest",
]
