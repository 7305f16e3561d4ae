"""Self-contained HTML pages: the run report, ``check --html``, ``compare --html``, ``history --html``.

Every page is one file with its style sheet and SVG charts inline
(:mod:`analyzer.render.svg`): no script, no URL fetched, so a CI artifact
opens offline and the core install writes it without a charting library.
Text from trace files is escaped. Nothing here computes a metric.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import pandas as pd

from analyzer.ingest.formats import package_version
from analyzer.jsontext import path_text
from analyzer.metrics.curves import METRICS, training_curves
from analyzer.metrics.depgraph import BOUND_CATEGORIES
from analyzer.render import critical_path as cp_rows
from analyzer.render import svg
from analyzer.render.format import (
    delta_rows,
    growth_text,
    num,
    pct,
    points_change,
    prediction_text,
    short_kernel_name,
    value_text,
)
from analyzer.render.rows import KernelRow, ModuleRow, OpRow, table_rows
from analyzer.render.text import (
    BREAKDOWN_TITLE,
    NO_STEPS_LINE,
    TIMELINE_HEADERS,
    TIMELINE_NOTE,
    TIMELINE_TITLE,
    attribution_lines,
    breakdown_parts,
    goodput_lines,
    has_steady,
    has_timeline,
    host_ops,
    kind_text,
    mfu_lines,
    rank_rows,
    rank_step_headers,
    step_time_text,
    timeline_rows,
    warning_lines,
)
from analyzer.verbs.printable import printable
from analyzer.verbs.report import top_kernels_table

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis
    from analyzer.verbs.check import CheckResult, GateOutcome
    from analyzer.verbs.compare import Comparison
    from analyzer.verbs.history import History


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1200px;color:#222;padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9rem;margin:.5rem 0}td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}td.l{overflow-wrap:anywhere}.note{color:#555;font-size:.85rem}.warn{color:#a40}
.headline{display:flex;gap:2rem;flex-wrap:wrap}.headline div{background:#f7f7f9;padding:.5rem 1rem;border-radius:6px}
.headline b{display:block;font-size:1.4rem}
figure.chart{margin:.5rem 0;max-width:960px}
table.wrap td{white-space:pre-wrap;overflow-wrap:anywhere;max-width:32rem}
"""
# td.l wraps anywhere: a kernel or op name (C++ templates, 120 characters shown) has no spaces to break
# at, and unbroken it widened the Top kernels table of a TraceLens H100 trace to 1,408 px.


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], left: Sequence[int] = ()) -> str:
    head = "".join(
        f'<th class="l">{html.escape(h)}</th>' if i in left else f"<th>{html.escape(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="l">{html.escape(str(c))}</td>' if i in left else f"<td>{html.escape(str(c))}</td>"
            for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _step_bands(warmup: int, profiled: Sequence[int]) -> list[svg.Band]:
    """Shaded x spans of a per-step chart: the warmup steps grey, each profiled step orange."""
    bands = [svg.Band(-0.5, warmup - 0.5, "#808080", "warmup")] if warmup else []
    return bands + [svg.Band(s - 0.5, s + 0.5, "#ff7f0e", "profiled") for s in sorted(set(profiled))]


def _by_rank(frame: pd.DataFrame, column: str) -> list[svg.Series]:
    return [
        svg.Series(f"rank {rank}", grp["step"].tolist(), grp[column].tolist())
        for rank, grp in frame.sort_values("step").groupby("rank", sort=True)
    ]


def charts(a: "RunAnalysis", top: int) -> dict[str, str]:
    """The SVG of each chart the run has data for, by section: breakdown, step_time, mfu, overlap, kernels."""
    out: dict[str, str] = {}
    labels = [f"rank {r.rank}" for r in a.ranks]
    parts = breakdown_parts(a)
    if parts:
        out["breakdown"] = svg.bar_chart(
            "Step breakdown per rank (profiled windows, mean ms per step)",
            labels,
            [svg.Bars(p, [(r.breakdown.get(p) or {}).get("mean_ms") for r in a.ranks]) for p in parts],
            y_title="ms",
            stacked=True,
        )
    metrics = a.metrics
    if metrics is not None and not metrics.empty and {"rank", "step", "step_time_ms"} <= set(metrics.columns):
        # Run directories: every optimizer step from the metrics records, with
        # the steps that steady-state statistics leave out shaded.
        manifest = a.run_manifest
        out["step_time"] = svg.line_chart(
            "Step time per optimizer step (metrics records; shaded: warmup, profiled)",
            _by_rank(metrics, "step_time_ms"),
            x_title="step",
            y_title="ms",
            bands=_step_bands(manifest.warmup_steps or 0, manifest.profiled_steps),
        )
    elif a.steps is not None and not a.steps.empty:
        out["step_time"] = svg.line_chart(
            "Step time per ProfilerStep", _by_rank(a.steps, "step_time_ms"), x_title="step", y_title="ms"
        )
    if a.mfu.source != "none" and len(a.mfu.steps):
        steps = a.mfu.steps
        out["mfu"] = svg.line_chart(
            f"MFU and HFU per step ({a.mfu.source})",
            [
                svg.Series("MFU", steps["step"].tolist(), (100 * steps["mfu"]).tolist()),
                svg.Series("HFU (with recompute)", steps["step"].tolist(), (100 * steps["hfu"]).tolist()),
            ],
            x_title="step",
            y_title="% of peak",
        )
    if any(r.comm_comp_overlap_pct is not None or r.idle_pct is not None for r in a.ranks):
        out["overlap"] = svg.bar_chart(
            "Overlap and idle per rank",
            labels,
            [
                svg.Bars("overlap % (HTA)", [r.comm_comp_overlap_pct for r in a.ranks]),
                svg.Bars("exposed comm % of step", [r.exposed_comm_pct for r in a.ranks]),
                svg.Bars("idle % (HTA)", [r.idle_pct for r in a.ranks]),
            ],
            y_title="%",
        )
    kernels = top_kernels_table(a, top)
    if not kernels.empty:
        what = "host ops (inclusive" if host_ops(a) else "kernels ("
        # Numbered: two kernels can shorten to the same text.
        out["kernels"] = svg.hbar_chart(
            f"Top {what} ms per rank over the trace)",
            [f"{i + 1}. {short_kernel_name(n, 60)}" for i, n in enumerate(kernels["name"])],
            kernels["ms_per_rank"].tolist(),
            x_title="ms",
            hover=[printable(n, one_line=True) for n in kernels["name"]],
        )
    return {k: v for k, v in out.items() if v}


def html_page(title: str, body: str) -> str:
    """A complete HTML document: the style sheet inline, no script and no URL fetched (works offline)."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def training_curves_html(a: "RunAnalysis") -> str:
    """The "Training curves" section: one chart per recorded metric (:mod:`analyzer.metrics.curves`),
    warmup steps shaded grey and profiled steps orange; "" for a run without metrics records."""
    c = training_curves(a.manifest, a.metrics)
    if not c.metrics:
        return ""
    bands = _step_bands(c.warmup_steps, c.profiled_steps)
    figures = []
    for name in c.metrics:
        label, unit, _ = METRICS[name]
        s = c.series(name)
        figures.append(
            svg.line_chart(
                f"{label} per optimizer step, all ranks",
                [svg.Series(label, s["step"].tolist(), s["value"].tolist())],
                x_title="step",
                y_title=f"{label} ({unit})" if unit else label,
                bands=bands,
            )
        )
    note = (
        "Mean over ranks per step (memory: max over ranks); tokens/s counts all ranks' tokens; shaded: grey "
        "warmup, orange profiled. Definitions: docs/dashboard.md, Training curves."
    )
    if c.missing:
        note += " Not recorded: " + "; ".join(f"{METRICS[m][0]}: {why}" for m, why in c.missing.items()) + "."
    return (
        f'<h2>Training curves</h2><p class="note">{html.escape(note)}</p>'
        f'<div id="training-curves">{"".join(figures)}</div>'
    )


def _stragglers_html(a: "RunAnalysis") -> str:
    """The straggler verdict, the per-rank table and the evidence as HTML (the text report's lines, as a table)."""
    s = a.stragglers
    out = [f"<p>{html.escape(s.verdict)}</p>"]
    if s.per_rank:
        out.append(
            table(
                [
                    "rank",
                    "steps",
                    "judged step ms",
                    "ratio",
                    "late ms",
                    "late z",
                    "last in",
                    "others waited ms",
                    "flagged",
                ],
                [
                    [
                        r.rank,
                        r.n_steps,
                        num(r.step_time_ms),
                        num(r.step_time_ratio, ".3f"),
                        num(r.lateness_excess_ms, ".2f"),
                        num(r.lateness_z, ".1f"),
                        f"{r.last_arrivals}/{r.n_collectives}",
                        num(r.caused_wait_ms, ".1f"),
                        "yes" if r.flagged else "",
                    ]
                    for r in s.per_rank
                ],
            )
        )
        out += [f"<p>rank {r.rank}: {html.escape(r.evidence)}</p>" for r in s.per_rank if r.flagged and r.evidence]
        if s.step_source or s.arrival_source:
            out.append(
                f'<p class="note">steps from {html.escape(s.step_source or "-")}; '
                f"arrivals from {html.escape(s.arrival_source or '-')}</p>"
            )
    out += [f'<p class="note">note: {html.escape(n)}</p>' for n in s.notes]
    return "".join(out)


def _suggestions_html(a: "RunAnalysis") -> str:
    """The ranked suggestions as one table (rule, finding, change, prediction, confidence)."""
    from analyzer.verbs.suggest.facts import run_facts
    from analyzer.verbs.suggest.run import suggest

    suggestions = suggest(a)
    if not suggestions:
        return "<p>none: no rule fired (docs/suggestions.md lists the rules and their thresholds)</p>"
    facts = run_facts(a)
    rows = []
    for i, sg in enumerate(suggestions, 1):
        change = " ".join(sg.change.set_args())
        command = sg.change.command(facts.config_path, facts.world_size) if sg.change.overrides else None
        what = (f"{change}\nrun: {command}" if command else change) if change else sg.change.advice
        rows.append(
            [
                i,
                sg.rule,
                f"{sg.title}: {sg.trigger}",
                what,
                prediction_text(sg),
                "diagnosis" if sg.kind == "diagnosis" else sg.confidence,
            ]
        )
    return '<p class="note">ranked by predicted gain; docs/suggestions.md</p>' + table(
        ["#", "rule", "finding", "change or advice", "predicted", "confidence"], rows, left=(1, 2, 3, 4)
    ).replace("<table>", '<table class="wrap">', 1)


def _attribution_html(a: "RunAnalysis", top: int) -> str:
    """The text report's attribution section as HTML tables (ops, modules, annotations); '' without ops."""
    at = a.attribution
    if at is None or at.ops.empty:
        return ""
    lines = attribution_lines(a, top)
    n_ranks = max(1, len(at.totals))
    ops = at.summed("ops").head(top)
    body = [
        f'<h2>Where device time goes</h2><p class="note">{html.escape(lines[0])}. Definitions: docs/metrics.md, '
        '"Attribution".</p>'
    ]
    body.append(
        table(
            ["op", "dir", "calls", "device ms", "incl ms", "host ms", "% of step"],
            [
                [
                    short_kernel_name(r.op),
                    "bwd" if r.backward else "fwd",
                    r.calls // n_ranks,
                    num(r.device_ms / n_ranks, ".3f"),
                    num(r.device_inclusive_ms / n_ranks, ".3f"),
                    num(r.host_ms / n_ranks, ".3f"),
                    num(r.share_of_step_pct),
                ]
                for r in table_rows(ops, OpRow)
            ],
            left=(0, 1),
        )
    )
    mods = at.summed("modules")
    if not mods.empty:
        mods = mods.loc[mods["depth"] <= 2].sort_values(["device_ms", "host_ms"], ascending=False).head(4 * top)
        body.append(
            "<h3>Modules (inclusive, per rank)</h3>"
            + table(
                ["module", "dir", "calls", "device ms", "self ms", "host ms"],
                [
                    [
                        m.module,
                        "bwd" if m.backward else "fwd",
                        m.calls // n_ranks,
                        num(m.device_ms / n_ranks, ".3f"),
                        num(m.device_self_ms / n_ranks, ".3f"),
                        num(m.host_ms / n_ranks, ".3f"),
                    ]
                    for m in table_rows(mods, ModuleRow)
                ],
                left=(0, 1),
            )
        )
    return "".join(body)


def critical_path_html(a: "RunAnalysis") -> str:
    """The critical path per profiled step: a stacked bar per (rank, step) by what bounds it, the breakdown
    table and the top ops' tables (analyzer.render.critical_path); "" without."""
    paths = cp_rows.shown_paths(a)
    if not paths:
        return ""
    bars = [
        svg.Bars(
            name=short.removesuffix(" %"),  # HTA's names overflow the legend; cp_rows.LEGEND spells them out
            values=[p.breakdown_pct[name] for p in paths],
            hover=[f"rank {p.rank} step {p.step}, {name}: {p.breakdown_pct[name]:.1f}%" for p in paths],
        )
        for short, name in zip(cp_rows.SHORT_LABELS, BOUND_CATEGORIES)
    ]
    chart = svg.bar_chart(
        "What bounds the critical path, per rank and step",
        [f"r{p.rank} s{p.step}" for p in paths],
        bars,
        y_title="% of path",
        stacked=True,
    )
    body = [
        "<h2>Critical path</h2>",
        f'<p class="note">{html.escape(cp_rows.TITLE)}. The path is the longest chain of dependent work in the '
        "step (CPU ops, launches, kernels, syncs): shortening what is on it shortens the step. Definitions: "
        "docs/metrics.md, &quot;Critical path&quot;.</p>",
        chart,
        table(cp_rows.HEADERS, cp_rows.breakdown_rows(a)),
        f'<p class="note">{html.escape(cp_rows.LEGEND.strip())} {html.escape(cp_rows.shown_note(a).strip())}</p>',
        f"<h3>{html.escape(cp_rows.OPS_NOTE)}</h3>",
    ]
    for p in cp_rows.shown_paths(a):
        body.append(
            f'<p class="note">rank {p.rank}, step {p.step}: {num(p.length_ms, ".2f")} ms, {p.n_ops} ops on the path</p>'
        )
        body.append(table(cp_rows.OPS_HEADERS, cp_rows.ops_rows(p, 120), left=(0, 1, 2)))
    return "".join(body)


def report_html(a: "RunAnalysis", *, top: int = 15) -> str:
    """A self-contained HTML report of one run: headline, tables and SVG charts."""
    body = _headline_html(a)
    warns = warning_lines(a)
    if warns:
        items = [
            f'<li class="warn">{html.escape(w)}</li>' if w.startswith("skipped: ") else f"<li>{html.escape(w)}</li>"
            for w in warns
        ]
        body.append(f"<h2>Input problems and warnings</h2><ul>{''.join(items)}</ul>")
    body += _ranks_html(a)
    figures = charts(a, top)
    body.append(training_curves_html(a))
    body += _timeline_html(a)
    for key, title in (("breakdown", "Step breakdown"), ("overlap", "Overlap and idle"), ("step_time", "Step time")):
        if key in figures:
            extra = f'<p class="note">{html.escape(BREAKDOWN_TITLE)}</p>' if key == "breakdown" else ""
            body.append(f"<h2>{title}</h2>{extra}{figures[key]}")
    body.append(
        "<h2>MFU</h2>"
        + "".join(f"<p>{html.escape(line.strip())}</p>" for line in mfu_lines(a))
        + figures.get("mfu", "")
    )
    goodput = goodput_lines(a)
    if goodput:
        body.append("<h2>Goodput</h2>" + "".join(f"<p>{html.escape(line)}</p>" for line in goodput))
    body.append("<h2>Stragglers</h2>" + _stragglers_html(a))
    body.append("<h2>Suggestions</h2>" + _suggestions_html(a))
    body.append(_attribution_html(a, top))
    body.append(critical_path_html(a))
    kernels = top_kernels_table(a, top)
    if not kernels.empty:
        body.append(_kernels_html(a, kernels, figures.get("kernels", "")))
    return html_page(f"analyzer report: {path_text(a.path)}", "\n".join(body))


def _headline_html(a: "RunAnalysis") -> list[str]:
    """The report's title line and its headline figures: MFU, HFU, step time, stragglers."""
    m = a.mfu
    mfu_text = pct(m.median, 2) if m.source != "none" else "none"
    hfu_text = pct(m.hfu_median, 2) if m.source != "none" else "none"
    st = a.step_time
    step_text = f"{num(st.ms, '.2f')} ms" if st.ms is not None else "-"
    step_note = st.label + (
        f"; profiled windows {num(st.profiled_ms, '.2f')} ms"
        if st.source == "steady_state" and st.profiled_ms is not None
        else ""
    )
    flagged = ", ".join(str(r) for r in a.stragglers.ranks) or "none"
    return [
        f'<h1>analyzer report</h1><p class="note">{html.escape(path_text(a.path))}<br>{html.escape(kind_text(a))}'
        f" &middot; generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} by analyzer {package_version()}</p>",
        '<div class="headline">'
        f"<div>MFU<b>{html.escape(mfu_text)}</b>{html.escape(m.source)}</div>"
        f"<div>HFU<b>{html.escape(hfu_text)}</b>with recompute</div>"
        f"<div>step time<b>{html.escape(step_text)}</b>{html.escape(step_note)}</div>"
        f"<div>stragglers<b>{html.escape(flagged)}</b></div></div>",
    ]


def _ranks_html(a: "RunAnalysis") -> list[str]:
    """The per-rank table (the text report's rows) and what its columns mean."""
    return [
        "<h2>Per rank</h2>"
        + table(
            [
                "rank",
                "timeline",
                "steps",
                *rank_step_headers(a),
                "compute %",
                "overlap % (HTA)",
                "exposed comm %",
                "idle % (HTA)",
                "device",
            ],
            rank_rows(a),
            left=(1, 8 + has_steady(a)),
        ),
        f'<p class="note">{html.escape(step_time_text(a))}. steady ms: median over the rank\'s steady-state metrics '
        "steps; profiled ms: median over its ProfilerStep windows (the steps of the breakdown, overlap and idle). "
        "overlap % (HTA): time in which communication and compute kernels both run, over communication "
        "time. exposed comm %: communication not hidden by compute, over step time. idle % (HTA): time with no GPU "
        "activity over the span of device events. Definitions: docs/metrics.md.</p>",
    ]


def _timeline_html(a: "RunAnalysis") -> list[str]:
    """The whole-trace GPU timeline table, and the note when there are no step windows; [] without a timeline."""
    if not has_timeline(a):
        return []
    out = [
        "<h2>Whole-trace GPU timeline</h2>" + f'<p class="note">{html.escape(TIMELINE_TITLE)}. '
        f"{html.escape(TIMELINE_NOTE.strip())}</p>" + table(TIMELINE_HEADERS, timeline_rows(a))
    ]
    if not breakdown_parts(a):
        out.append(f'<p class="note">{html.escape(NO_STEPS_LINE)}</p>')
    return out


def _kernels_html(a: "RunAnalysis", kernels: pd.DataFrame, chart: str) -> str:
    """The top kernels (or host ops) table of analyzer.verbs.report.top_kernels_table, under its chart."""
    title = "Top host ops" if host_ops(a) else "Top kernels"
    return (
        f"<h2>{title}</h2>"
        + chart
        + table(
            ["#", "name", "kind", "count", "total ms", "ms/rank", "share %"],
            [
                [
                    i + 1,
                    short_kernel_name(k.name, 120),
                    k.kind,
                    k.count,
                    num(k.total_ms, ".2f"),
                    num(k.ms_per_rank, ".2f"),
                    num(k.share_pct),
                ]
                for i, k in enumerate(table_rows(kernels, KernelRow))
            ],
            left=(1, 2),
        )
    )


_VERDICT_COLOUR = {"pass": "#1a7f37", "regression": "#cf222e", "inconclusive": "#9a6700"}
_EXTRA_CSS = (
    "<style>.verdict{display:inline-block;color:#fff;padding:.2rem .8rem;border-radius:4px;font-weight:600}"
    "table.stats td:first-child{text-align:left}</style>"
)


def _stats_rows(r: "CheckResult") -> list[list[str]]:
    return [
        [r.statistic_label, value_text(r.metric, r.base_value), value_text(r.metric, r.cand_value), f"{-r.drop:+.2%}"],
        [f"median {r.metric_label}", value_text(r.metric, r.base_median), value_text(r.metric, r.cand_median), ""],
        ["drop allowed (--max-mfu-drop)", "", "", f"{r.max_drop:.1%}"],
        ["one-sided Mann-Whitney p (alpha)", "", "", f"{r.p_value:.3g} ({r.alpha:g})"],
        ["runs' own noise", "", "", f"{r.noise:.2%} ({r.noise_source})"],
        ["smallest drop these runs can flag", "", "", f"{r.min_detectable_drop:.2%}"],
        [
            "steady-state steps",
            str(r.n_base) + (f" ({r.n_baselines} baselines)" if r.n_baselines > 1 else ""),
            str(r.n_cand),
            "",
        ],
    ]


def _samples_chart(outcome: "GateOutcome") -> str:
    """The gated per-step values of every run, with each side's statistic as a dashed line."""
    if outcome.samples is None:
        return ""
    bases, cand = outcome.samples
    r = outcome.result
    scale = 100.0 if r.metric == "mfu" else 1.0
    names = ["baseline"] if len(bases) == 1 else [f"baseline {i + 1}" for i in range(len(bases))]
    series = [
        svg.Series(name, s.steps.tolist(), (scale * s.values).tolist(), lines=False) for name, s in zip(names, bases)
    ]
    series.append(svg.Series("candidate", cand.steps.tolist(), (scale * cand.values).tolist(), lines=False))
    unit = "% of peak" if r.metric == "mfu" else r.metric_label
    return svg.line_chart(
        f"{r.metric_label} per steady-state step (dashed: {r.statistic_label})",
        series,
        x_title="optimizer step",
        y_title=unit,
        hlines=[
            svg.HLine(scale * r.base_value, svg.PALETTE[0], "baseline statistic"),
            svg.HLine(scale * r.cand_value, svg.PALETTE[3], "candidate statistic"),
        ],
    )


def _phase_chart(c: "Comparison") -> str:
    return svg.bar_chart(
        f"Mean ms per step by phase ({c.phase_source})",
        [d.name for d in c.phases],
        [svg.Bars("baseline", [d.base for d in c.phases]), svg.Bars("candidate", [d.cand for d in c.phases])],
        y_title="ms",
    )


def _delta_sections(c: "Comparison", top: int) -> list[str]:
    out = []
    if c.phases:
        out.append(
            f'<h2>Phases</h2><p class="note">{html.escape(c.phase_source)}; largest change first</p>'
            + _phase_chart(c)
            + table(["phase", "base ms", "cand ms", "delta ms", "delta %"], delta_rows(c.phases), left=(0,))
        )
    if c.kernels:
        out.append(
            f'<h2>Kernels</h2><p class="note">{html.escape(c.kernel_source)}; largest change first</p>'
            + table(
                ["name", "kind", "base ms", "cand ms", "delta ms", "delta %"],
                delta_rows(c.kernels[:top], ".3f", kernel=True),
                left=(0, 1),
            )
        )
    for title, deltas, what in (("Ops", c.ops, "op"), ("Modules", c.modules, "module")):
        if deltas:
            out.append(
                f'<h2>{title}</h2><p class="note">{html.escape(c.op_source)}; largest change first</p>'
                + table(
                    [what, "pass", "base ms", "cand ms", "delta ms", "delta %"],
                    delta_rows(deltas[:top], ".3f", kernel=True),
                    left=(0, 1),
                )
            )
    if c.memory:
        out.append(
            f'<h2>Peak memory</h2><p class="note">{html.escape(c.memory_source + growth_text(c))}</p>'
            + table(["", "base MiB", "cand MiB", "delta MiB", "delta %"], delta_rows(c.memory, ".1f"), left=(0,))
        )
    if c.ranks:
        out.append(
            "<h2>Per-rank median step time</h2>"
            + table(["rank", "base ms", "cand ms", "delta ms", "delta %"], delta_rows(c.ranks), left=(0,))
        )
    return out


def _generated() -> str:
    return f"generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} by analyzer {package_version()}"


def _compare_headline(c: "Comparison") -> str:
    m, sm = c.mfu, c.step_time_median
    rows = [
        [
            "MFU",
            pct(m.base, 2) if m.base is not None else "none",
            pct(m.cand, 2) if m.cand is not None else "none",
            f"{points_change(m.base, m.cand)} points" if m.base is not None and m.cand is not None else "-",
        ],
        [
            "step time (each run's headline)",
            f"{num(sm.base, '.2f')} ms",
            f"{num(sm.cand, '.2f')} ms",
            f"{num(sm.delta, '+.2f')} ms ({num(sm.delta_pct, '+.1f')}%)",
        ],
        [
            "mean step time over the phase rows",
            f"{num(c.step_time.base, '.2f')} ms",
            f"{num(c.step_time.cand, '.2f')} ms",
            f"{num(c.step_time.delta, '+.2f')} ms",
        ],
    ]
    if m.cand_on_base_peak is not None:
        rows.insert(
            1,
            [
                "MFU, candidate on the baseline's measured peak",
                "",
                pct(m.cand_on_base_peak, 2),
                f"drop {m.drop:+.1%}" if m.drop is not None else "-",
            ],
        )
    return table(["", "baseline", "candidate", "change"], rows, left=(0,)).replace(
        "<table>", '<table class="stats">', 1
    )


def check_html(outcome: "GateOutcome", *, top: int = 10) -> str:
    """The ``check --html`` page: verdict, statistics, per-step chart, deltas."""
    r, c = outcome.result, outcome.comparison
    body = [
        _EXTRA_CSS,
        f'<h1>analyzer check <span class="verdict" style="background:{_VERDICT_COLOUR[outcome.verdict]}">'
        f"{html.escape(outcome.verdict_label)}</span></h1>",
        f'<p class="note">baseline: {html.escape(c.base_path)}<br>candidate: {html.escape(c.cand_path)}'
        f"<br>{_generated()}</p>",
        f"<p>{html.escape(outcome.explanation)}</p>",
        "<h2>Statistics</h2>"
        + table(["", "baseline", "candidate", "change / value"], _stats_rows(r), left=(0,)).replace(
            "<table>", '<table class="stats">', 1
        ),
        '<p class="note">Regression when the drop exceeds the allowed drop, p &lt; alpha and the drop exceeds the '
        "runs' own noise; inconclusive when that noise exceeds the allowed drop or a drop beyond it is not beyond "
        "the noise (docs/ci.md).</p>",
    ]
    if outcome.cpu is not None:
        body.append(
            "<h2>CPU time per step</h2>"
            + table(["", "baseline", "candidate", "change / value"], _stats_rows(outcome.cpu), left=(0,)).replace(
                "<table>", '<table class="stats">', 1
            )
            + f'<p class="note">verdict on CPU time alone: '
            f"{html.escape(outcome.cpu.verdict_label)}</p>"
        )
    if outcome.goodput is not None:
        body.append(f"<h2>Goodput</h2><p>{html.escape(outcome.goodput.text())}</p>")
    if outcome.memory is not None:
        body.append(f"<h2>Peak memory</h2><p>{html.escape(outcome.memory.text())}</p>")
    chart = _samples_chart(outcome)
    if chart:
        body.append("<h2>Steps</h2>" + chart)
    body.append("<h2>What changed</h2>" + _compare_headline(c))
    body += _delta_sections(c, top)
    notes = [*r.notes, *outcome.notes, *c.notes]
    if notes:
        body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    body.append(
        f'<p class="note">baseline samples: {html.escape(r.base_source)}<br>'
        f"candidate samples: {html.escape(r.cand_source)}</p>"
    )
    return html_page(f"analyzer check: {outcome.verdict_label}", "\n".join(body))


def compare_html(c: "Comparison", *, top: int = 10) -> str:
    """The ``compare --html`` page: MFU and step time, phase chart, phase, kernel, op, module and rank deltas."""
    body = [
        _EXTRA_CSS,
        "<h1>analyzer compare</h1>",
        f'<p class="note">baseline: {html.escape(c.base_path)}<br>candidate: {html.escape(c.cand_path)}'
        f"<br>{_generated()}</p>",
        "<h2>Headline</h2>" + _compare_headline(c),
    ]
    body += _delta_sections(c, top)
    if c.notes:
        body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in c.notes) + "</ul>")
    return html_page("analyzer compare", "\n".join(body))


def history_html(h: "History") -> str:
    """A self-contained HTML page: MFU, step time and tokens/s per run (change points marked) and the table."""
    steps = list(range(len(h.points)))
    labels = [f"{i}: {p.run}" for i, p in enumerate(h.points)]
    figures = []
    for title, ys in (
        ("MFU (%)", [None if p.mfu is None else 100 * p.mfu for p in h.points]),
        ("step time (ms)", [p.step_time_ms for p in h.points]),
        ("tokens/s", [p.tokens_per_s for p in h.points]),
        ("goodput (%)", [None if p.goodput is None else 100 * p.goodput for p in h.points]),
    ):
        series = [svg.Series(title, steps, ys)]
        for direction in ("slower", "faster"):
            marked = [(x, y) for x, y, p in zip(steps, ys, h.points) if p.change_point and p.direction == direction]
            if marked:
                series.append(
                    svg.Series(f"change ({direction})", [x for x, _ in marked], [y for _, y in marked], lines=False)
                )
        figures.append(
            svg.line_chart(
                f"{title} per run, by {h.by} (x: run number, listed below)", series, x_title="run", y_title=title
            )
        )
    rows = [
        [
            p.start_time,
            p.run,
            (p.commit or "-")[:10] + ("+" if p.dirty else ""),
            "-" if p.mfu is None else f"{100 * p.mfu:.2f}",
            "-" if p.step_time_ms is None else f"{p.step_time_ms:.1f}",
            "-" if p.tokens_per_s is None else f"{p.tokens_per_s:.1f}",
            "-" if p.goodput is None else f"{100 * p.goodput:.1f}",
            p.verdict or ("cannot judge" if p.verdict_error else "-"),
            p.direction if p.change_point else "",
        ]
        for p in h.points
    ]
    body = [
        "<h1>Run history</h1>",
        '<p class="note">Change points: the CI gate finds a significant change from the run before. '
        + html.escape("; ".join(labels))
        + "</p>",
        *figures,
        table(
            ["start", "run", "commit", "MFU %", "step ms", "tokens/s", "goodput %", "verdict", "change point"],
            rows,
            left=(0, 1, 2, 7, 8),
        ),
    ]
    body += [f'<p class="note">skipped {html.escape(s)}</p>' for s in h.skipped]
    return html_page("analyzer history", "\n".join(body))
