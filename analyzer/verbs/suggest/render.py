"""Suggestions as readable text (``analyzer suggest``, the report's text section) and Markdown."""
from __future__ import annotations

import math
from typing import Any, Sequence

from analyzer.verbs.suggest.engine import Suggestion
from analyzer.verbs.printable import printable


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.3f}".rstrip("0").rstrip(".") if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def prediction_text(s: Suggestion) -> str:
    """``step 76.4 -> 28.1 ms, tokens/s 1.68k -> 4.56k, MFU 5.4% -> 14.6% (+172%)``."""
    p = s.predicted
    if p is None:
        return "no prediction"
    parts = [f"step {p.step_time_ms_before:.1f} -> {p.step_time_ms_after:.1f} ms"]
    if p.tokens_per_step_before and p.tokens_per_step_after and p.tokens_per_step_after != p.tokens_per_step_before:
        parts.append(f"tokens/step {p.tokens_per_step_before:.0f} -> {p.tokens_per_step_after:.0f}")
    elif not p.tokens_per_step_before and p.work_ratio != 1.0:
        parts.append(f"{p.work_ratio:g}x the work per step")
    if p.tokens_per_s_before is not None and p.tokens_per_s_after is not None:
        parts.append(f"tokens/s {p.tokens_per_s_before:,.0f} -> {p.tokens_per_s_after:,.0f}")
    if p.mfu_before is not None and p.mfu_after is not None:
        parts.append(f"MFU {100 * p.mfu_before:.1f}% -> {100 * p.mfu_after:.1f}%")
    text = ", ".join(parts) + f" ({p.gain:+.0%} throughput"
    return text + (", run wall time)" if p.scope != "steady-state step" else ")")


def coverage_text(cov: dict[str, Any]) -> str:
    """``windows 5/5, ranks 1/8, FLOPs 97%; capped: 1 of 8 ranks traced ...``."""
    parts = []
    if cov.get("windows_total"):
        parts.append(f"windows {cov['windows_used']}/{cov['windows_total']}")
    if cov.get("ranks_in_job"):
        parts.append(f"ranks {cov.get('ranks_traced', 0)}/{cov['ranks_in_job']}")
    if cov.get("flop_coverage") is not None:
        parts.append(f"FLOPs known for {cov['flop_coverage']:.0%} of compute")
    text = ", ".join(parts) or "-"
    if cov.get("limits"):
        text += "; confidence capped: " + "; ".join(cov["limits"])
    return text


def render_text(suggestions: Sequence[Suggestion], config_path: str | None = None, *, nproc: int | None = None,
                evidence: bool = True) -> str:
    """Ranked suggestions, one block each: why, evidence, change, command, prediction."""
    if not suggestions:
        return "Suggestions: none: no rule fired (docs/suggestions.md lists the rules and their thresholds)\n"
    out = [f"Suggestions ({len(suggestions)}, ranked: on traces exposed comm over 20% first, then changes by predicted gain; "
           "docs/suggestions.md)"]
    for i, s in enumerate(suggestions, 1):
        tag = "diagnosis" if s.kind == "diagnosis" else f"confidence {s.confidence}"
        out.append(f"{i:>2}. [{s.rule}] {s.title}  ({tag})")
        out.append(f"    why: {s.trigger}")
        if evidence:
            ev = ", ".join(f"{k} {_fmt(v)}" for k, v in s.evidence.items() if v is not None and k != "verdict")
            out.append(f"    evidence: {ev}")
            if "verdict" in s.evidence:
                out.append(f"    verdict: {s.evidence['verdict']}")
        if s.change.overrides:
            out.append(f"    change: {' '.join(s.change.set_args())}")
            cmd = s.change.command(config_path, nproc)
            if cmd:
                out.append(f"    run: {cmd}")
        out.append(f"    {'advice' if not s.change.overrides else 'plain PyTorch'}: {s.change.advice}")
        if s.predicted is not None:
            out.append(f"    predicted: {prediction_text(s)}")
            out.append(f"      how: {s.predicted.method}")
        if s.coverage:
            out.append(f"    coverage: {coverage_text(s.coverage)}")
        for note in s.notes:
            out.append(f"    note: {note}")
    return printable("\n".join(out) + "\n")


def render_markdown(suggestions: Sequence[Suggestion], config_path: str | None = None) -> str:
    """A Markdown table of the suggestions (rank, rule, change, predicted, confidence)."""
    if not suggestions:
        return "No suggestions: no rule fired.\n"
    rows = ["| # | rule | change | predicted | confidence |", "| --- | --- | --- | --- | --- |"]
    for i, s in enumerate(suggestions, 1):
        change = " ".join(s.change.set_args()) or s.change.advice
        change = change.replace("|", "\\|")
        rows.append(f"| {i} | `{s.rule}` | `{change}` | {prediction_text(s)} | {s.confidence} |")
    return printable("\n".join(rows) + "\n")


def suggestions_text(ra) -> str:
    """The text section of ``analyzer report`` for a run: its ranked suggestions (one call for report.render_text)."""
    from analyzer.verbs.suggest.run import suggest
    from analyzer.verbs.suggest.facts import run_facts

    facts = run_facts(ra)
    return render_text(suggest(ra), facts.config_path, nproc=facts.world_size)
