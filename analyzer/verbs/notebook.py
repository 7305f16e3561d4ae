"""Jupyter rendering: compact HTML summaries of a run and of a comparison.

``RunAnalysis._repr_html_`` and ``Comparison._repr_html_`` call these, so a
notebook cell that ends in ``analyze(path)`` or ``compare(a, b)`` shows the
headline and the main table instead of a dataclass repr. The tables are the
export tables (analyzer.export), plain DataFrames a user can also slice.
Everything shown is escaped (kernel and run names come from trace files).
"""
from __future__ import annotations

import html
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis
    from analyzer.verbs.compare import Comparison


def _pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}%"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} ms"


def _table(df: pd.DataFrame, max_rows: int = 20) -> str:
    # to_html escapes cell text by default; float_format keeps the summary compact.
    return df.head(max_rows).to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0)


def run_html(a: "RunAnalysis") -> str:
    """Headline (MFU with its source and lower-bound label, step time, stragglers) and the per-rank table."""
    from analyzer.verbs.export import export_tables

    m = a.mfu
    mfu = _pct(m.median, 2) if m.source != "none" else "none"
    if m.lower_bound:
        mfu = f"&ge; {mfu} (lower bound" + (f", FLOP coverage {_pct(m.flop_coverage)}" if m.flop_coverage is not None else "") + ")"
    flagged = ", ".join(str(r) for r in a.stragglers.ranks) or "none"
    tables = export_tables(a, top=10)
    parts = [
        f"<div><b>{html.escape(str(a.path))}</b> &middot; {html.escape(a.kind)} &middot; {len(a.ranks)} rank(s)</div>",
        "<ul>",
        f"<li>MFU: {mfu} ({html.escape(m.source)})</li>",
        f"<li>step time: {html.escape(_ms(a.step_time.ms))} ({html.escape(a.step_time.label)})</li>",
        f"<li>stragglers: {html.escape(flagged)}</li>",
        "</ul>",
    ]
    if "ranks" in tables:
        parts.append(_table(tables["ranks"].drop(columns=[c for c in tables["ranks"].columns if c.startswith("breakdown_")])))
    if a.errors or a.warnings:
        parts.append(f"<div>{len(a.errors)} input error(s), {len(a.warnings)} warning(s): see <code>.errors</code>, "
                     "<code>.warnings</code></div>")
    return "<div class=\"analyzer-run\">" + "".join(parts) + "</div>"


def compare_html(c: "Comparison") -> str:
    """MFU and step time of both runs, and the phases that changed the most."""
    rows = pd.DataFrame([
        {"figure": "MFU", "baseline": _pct(c.mfu.base, 2), "candidate": _pct(c.mfu.cand, 2),
         "change": "n/a" if c.mfu.delta is None else f"{100 * c.mfu.delta:+.2f} pts"},
        {"figure": "step time", "baseline": _ms(c.step_time_median.base), "candidate": _ms(c.step_time_median.cand),
         "change": "n/a" if c.step_time_median.base is None or c.step_time_median.cand is None
         else f"{c.step_time_median.delta:+.2f} ms"},
    ])
    phases = pd.DataFrame([{"phase": d.name, "baseline ms": d.base, "candidate ms": d.cand, "delta ms": d.delta}
                           for d in c.phases[:8]])
    parts = [f"<div><b>{html.escape(c.base_path)}</b> &rarr; <b>{html.escape(c.cand_path)}</b></div>", _table(rows)]
    if len(phases):
        parts.append(f"<div>per phase ({html.escape(c.phase_source)}), largest change first:</div>" + _table(phases))
    return "<div class=\"analyzer-compare\">" + "".join(parts) + "</div>"
