"""Suggestions with evidence and a predicted gain (docs/suggestions.md).

    from analyzer import analyze
    from analyzer.verbs.suggest import suggest

    run = analyze("runs/my-run")
    for s in suggest(run):                       # ranked, largest predicted gain first
        print(s.rule, s.change.set_args(), s.predicted.gain)

``emit_config`` writes a reftrain config with one suggestion applied;
``suggestions_document`` is ``analyzer suggest --json``'s document (the
command itself is in analyzer/cli.py).
"""

from __future__ import annotations

from analyzer.verbs.suggest.emit import emit_config, emitted_config_text
from analyzer.verbs.suggest.engine import RULES, Change, Prediction, Suggestion, suggestions_json


def __getattr__(name: str) -> object:
    # suggest() and report_suggestions() live in .run, which imports every rule module (and
    # pandas with them): loaded on first use, so `analyzer --help` and the CLI's start stay light.
    if name in ("suggest", "report_suggestions", "suggestions_document"):
        from analyzer.verbs.suggest import run

        return getattr(run, name)
    raise AttributeError(f"module 'analyzer.verbs.suggest' has no attribute {name!r}")


__all__ = [
    "suggest",
    "suggestions_json",
    "report_suggestions",
    "Suggestion",
    "Change",
    "Prediction",
    "RULES",
    "emit_config",
    "emitted_config_text",
    "suggestions_document",
]
