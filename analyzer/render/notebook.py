"""Jupyter views: compact HTML summaries of a run, a comparison and a gate verdict.

A notebook cell that ends in ``analyze(path)``, ``compare(a, b)`` or
``check(a, b)`` shows the headline and the main table instead of the short
text repr. The views are registered with IPython's HTML formatter for the
three types by name
(:func:`register`, IPython's documented hook for types a library does not
own), so the result types in ``analyzer.api`` and ``analyzer.verbs`` carry no
rendering and import no renderer: ``import analyzer`` inside a running
IPython registers them. The tables are the export tables
(analyzer.verbs.export), plain DataFrames a user can also slice. Everything
shown is escaped (kernel and run names come from trace files).
"""

from __future__ import annotations

import html
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from analyzer.api import RunAnalysis
    from analyzer.verbs.check import GateOutcome
    from analyzer.verbs.compare import Comparison

# (module, class) -> the function that draws it; registered by name, so that registering imports none of them.
VIEWS = {
    ("analyzer.api", "RunAnalysis"): "run_html",
    ("analyzer.verbs.compare", "Comparison"): "compare_html",
    ("analyzer.verbs.check.outcome", "GateOutcome"): "gate_html",
}


def _ms(x: float | None) -> str:
    from analyzer.render.format import num

    return num(x, ".2f") + ("" if x is None else " ms")


def _table(df: "pd.DataFrame", max_rows: int = 20) -> str:
    # to_html escapes cell text by default; float_format keeps the summary compact.
    return df.head(max_rows).to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0)


def run_html(a: "RunAnalysis") -> str:
    """Headline (MFU with its source and lower-bound label, step time, stragglers) and the per-rank table."""
    from analyzer.render.format import pct
    from analyzer.verbs.export import export_tables

    m = a.mfu
    mfu = pct(m.median, 2) if m.source != "none" else "none"
    if m.lower_bound:
        mfu = (
            f"&ge; {mfu} (lower bound"
            + (f", FLOP coverage {pct(m.flop_coverage)}" if m.flop_coverage is not None else "")
            + ")"
        )
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
        parts.append(
            _table(tables["ranks"].drop(columns=[c for c in tables["ranks"].columns if c.startswith("breakdown_")]))
        )
    if a.errors or a.warnings:
        parts.append(
            f"<div>{len(a.errors)} input error(s), {len(a.warnings)} warning(s): see <code>.errors</code>, "
            "<code>.warnings</code></div>"
        )
    return '<div class="analyzer-run">' + "".join(parts) + "</div>"


def compare_html(c: "Comparison") -> str:
    """MFU and step time of both runs (the change from the figures shown), and the phases that changed the most."""
    import pandas as pd

    from analyzer.render.format import num, pct, points_change

    sm = c.step_time_median
    mfu_change = points_change(c.mfu.base, c.mfu.cand)
    rows = pd.DataFrame(
        [
            {
                "figure": "MFU",
                "baseline": pct(c.mfu.base, 2),
                "candidate": pct(c.mfu.cand, 2),
                "change": mfu_change if mfu_change == "-" else f"{mfu_change} pts",
            },
            {
                "figure": "step time",
                "baseline": _ms(sm.base),
                "candidate": _ms(sm.cand),
                "change": "-" if sm.base is None or sm.cand is None else f"{num(sm.delta, '+.2f')} ms",
            },
        ]
    )
    phases = pd.DataFrame(
        [{"phase": d.name, "baseline ms": d.base, "candidate ms": d.cand, "delta ms": d.delta} for d in c.phases[:8]]
    )
    parts = [f"<div><b>{html.escape(c.base_path)}</b> &rarr; <b>{html.escape(c.cand_path)}</b></div>", _table(rows)]
    if len(phases):
        parts.append(f"<div>per phase ({html.escape(c.phase_source)}), largest change first:</div>" + _table(phases))
    return '<div class="analyzer-compare">' + "".join(parts) + "</div>"


def gate_html(g: "GateOutcome") -> str:
    """The verdict, the paragraph ``analyzer check`` prints, the gated statistic of both runs (with the goodput
    and memory gates when set), then the comparison's view."""
    import pandas as pd

    from analyzer.render.format import num, value_text

    r = g.result
    rows = [
        {
            "figure": r.statistic_label,
            "baseline": value_text(r.metric, r.base_value),
            "candidate": value_text(r.metric, r.cand_value),
            "change": f"drop {r.drop:+.1%} (allowed {r.max_drop:.1%}, p = {r.p_value:.3g}, noise {r.noise:.1%})",
        },
        {"figure": "steady-state steps", "baseline": str(r.n_base), "candidate": str(r.n_cand), "change": ""},
    ]
    if g.goodput is not None:
        gp = g.goodput
        rows.append(
            {
                "figure": f"goodput (floor {gp.min_goodput:.1%})",
                "baseline": "-" if gp.base_goodput is None else f"{gp.base_goodput:.1%}",
                "candidate": f"{gp.goodput:.1%}",
                "change": "below the floor" if gp.failed else "ok",
            }
        )
    if g.memory is not None:
        mg = g.memory
        rows.append(
            {
                "figure": f"peak memory, MiB (allowed {mg.max_growth:+.1%})",
                "baseline": num(mg.base_bytes / 2**20, ",.1f"),
                "candidate": num(mg.cand_bytes / 2**20, ",.1f"),
                "change": f"{mg.growth:+.1%}" + (", over" if mg.failed else ""),
            }
        )
    parts = [
        f"<div><b>analyzer check: {html.escape(g.verdict_label)}</b></div>",
        f"<p>{html.escape(g.explanation)}</p>",
        _table(pd.DataFrame(rows)),
        compare_html(g.comparison),
    ]
    return f'<div class="analyzer-check analyzer-{html.escape(g.verdict)}">' + "".join(parts) + "</div>"


def register(formatter: Any) -> None:
    """Register the views with an IPython HTML formatter (``shell.display_formatter.formatters["text/html"]``)."""
    this = sys.modules[__name__]
    for (module, name), view in VIEWS.items():
        formatter.for_type_by_name(module, name, getattr(this, view))


def register_in_running_ipython() -> None:
    """:func:`register` with the running IPython shell's HTML formatter; nothing outside IPython
    (IPython is not imported here: only a process that already runs it has a shell)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        register(shell.display_formatter.formatters["text/html"])
