"""Markdown: the CI job summary of ``analyzer check`` and the suggestions table.

Text from trace files is escaped for Markdown (:func:`md_escape`) and for the
terminal (:func:`~analyzer.verbs.printable.printable`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

from analyzer.render.format import delta_rows, growth_text, num, prediction_text
from analyzer.verbs.printable import printable

if TYPE_CHECKING:
    from analyzer.verbs.check import GateOutcome
    from analyzer.verbs.suggest.engine import Suggestion


def md_escape(text: str) -> str:
    return re.sub(r"([\\`*_{}\[\]<>|#])", r"\\\1", text)


def check_markdown(outcome: "GateOutcome", explanation: str, *, top: int = 5) -> str:
    """A Markdown summary for a CI job summary (e.g. ``$GITHUB_STEP_SUMMARY``)."""
    r, c = outcome.result, outcome.comparison
    icon = {"regression": ":x:", "inconclusive": ":warning:"}.get(outcome.verdict, ":white_check_mark:")
    verdict = {"regression": "regression", "inconclusive": "inconclusive, too noisy"}.get(
        outcome.verdict, "within bounds"
    )
    fmt = (lambda v: f"{100 * v:.2f}%") if r.metric == "mfu" else (lambda v: f"{v:,.3f}")
    lines = [
        f"## {icon} analyzer check: {verdict}",
        "",
        md_escape(explanation),
        "",
        "| | baseline | candidate | change |",
        "|---|---:|---:|---:|",
        f"| {r.statistic_label} | {fmt(r.base_value)} | {fmt(r.cand_value)} | {-r.drop:+.1%} |",
    ]
    st = c.step_time
    if st.base is not None and st.cand is not None:
        lines.append(f"| mean step time | {st.base:.1f} ms | {st.cand:.1f} ms | {num(st.delta_pct, '+.1f')}% |")
    g = outcome.goodput
    if g is not None:
        base = f"{g.base_goodput:.1%}" if g.base_goodput is not None else "n/a"
        lines.append(
            f"| goodput (floor {g.min_goodput:.1%}) | {base} | {g.goodput:.1%} | "
            f"{'below the floor' if g.failed else 'ok'} |"
        )
    mg = outcome.memory
    if mg is not None:
        lines.append(
            f"| peak memory, MiB (allowed {mg.max_growth:+.1%}) | {mg.base_bytes / 2**20:,.1f} | "
            f"{mg.cand_bytes / 2**20:,.1f} | {mg.growth:+.1%}{', over' if mg.failed else ''} |"
        )
    lines += [
        f"| steady-state steps | {r.n_base} | {r.n_cand} | |",
        "",
        f"Gate: regression when the {md_escape(r.statistic_label)} drops by more than {r.max_drop:.1%}, the one-sided "
        f"Mann-Whitney U test gives p < {r.alpha} (here p = {r.p_value:.3g}) **and** the drop exceeds the runs' own "
        f"noise (here {r.noise:.1%}); inconclusive when that noise exceeds {r.max_drop:.1%}.",
    ]
    if c.phases:
        lines += [
            "",
            f"**Phases** ({md_escape(c.phase_source)})",
            "",
            "| phase | base ms | cand ms | delta ms | delta % |",
            "|---|---:|---:|---:|---:|",
        ]
        lines += [f"| {md_escape(row[0])} | " + " | ".join(row[1:]) + " |" for row in delta_rows(c.phases[:top])]
    if c.kernels:
        lines += [
            "",
            f"**Kernels** ({md_escape(c.kernel_source)})",
            "",
            "| kernel | kind | base ms | cand ms | delta ms | delta % |",
            "|---|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| `{row[0].replace('`', '')}` | " + " | ".join(row[1:]) + " |"
            for row in delta_rows(c.kernels[:top], ".3f", kernel=True)
        ]
    for title, deltas, what in (("Ops", c.ops, "op"), ("Modules", c.modules, "module")):
        if deltas:
            lines += [
                "",
                f"**{title}** ({md_escape(c.op_source)})",
                "",
                f"| {what} | pass | base ms | cand ms | delta ms | delta % |",
                "|---|---|---:|---:|---:|---:|",
            ]
            lines += [
                f"| `{row[0].replace('`', '')}` | " + " | ".join(row[1:]) + " |"
                for row in delta_rows(deltas[:top], ".3f", kernel=True)
            ]
    if c.memory:
        lines += [
            "",
            f"**Peak memory** ({md_escape(c.memory_source + growth_text(c))})",
            "",
            "| | base MiB | cand MiB | delta MiB | delta % |",
            "|---|---:|---:|---:|---:|",
        ]
        lines += [f"| {md_escape(row[0])} | " + " | ".join(row[1:]) + " |" for row in delta_rows(c.memory, ".1f")]
    return printable("\n".join(lines) + "\n")


def suggestions_markdown(suggestions: Sequence["Suggestion"], config_path: str | None = None) -> str:
    """A Markdown table of the suggestions (rank, rule, change, predicted, confidence)."""
    if not suggestions:
        return "No suggestions: no rule fired.\n"
    rows = ["| # | rule | change | predicted | confidence |", "| --- | --- | --- | --- | --- |"]
    for i, s in enumerate(suggestions, 1):
        change = " ".join(s.change.set_args()) or s.change.advice
        change = change.replace("|", "\\|")
        rows.append(f"| {i} | `{s.rule}` | `{change}` | {prediction_text(s)} | {s.confidence} |")
    return printable("\n".join(rows) + "\n")
