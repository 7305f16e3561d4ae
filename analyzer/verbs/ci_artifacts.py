"""CI artifacts of ``analyzer check`` and ``analyzer compare``: HTML, JUnit XML, GitHub Actions output.

One renderer per output format, each a function of a result computed
elsewhere (analyzer/verbs/check.py, compare.py); nothing here computes a
metric. Definitions and the CI workflow that uses these: docs/ci.md.

* :func:`check_html`, :func:`compare_html`: self-contained pages (plotly.js
  inline, no URL is fetched) built from the HTML report's helpers.
* :func:`check_junit`: JUnit XML, one ``<testcase>`` per gated metric (the
  wall-clock metric, and CPU time per step where the gate used it). A
  regression is a ``<failure>``; an inconclusive verdict follows
  ``--inconclusive``: ``exit`` (default) and ``pass`` write a
  ``<skipped>`` (resp. a passed case whose ``<system-out>`` says so),
  ``fail`` a ``<failure>``; see :data:`INCONCLUSIVE_JUNIT`.
* :func:`github_annotations`: GitHub Actions workflow commands
  (``::error title=...::message``), printed on stdout when
  ``GITHUB_ACTIONS=true``; :func:`append_step_summary` appends the Markdown
  summary to the file named by ``$GITHUB_STEP_SUMMARY``.
"""
from __future__ import annotations

import html
import os
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Sequence

from analyzer.errors import AnalyzerError
from analyzer.ingest.formats import package_version
from analyzer.verbs.printable import printable
from analyzer.verbs.report import (
    _delta_rows,
    _growth_text,
    _figure_html,
    _html_table,
    _num,
    _pct,
    html_page,
    render_check_markdown,
)

if TYPE_CHECKING:
    from analyzer.verbs.check import CheckResult, GateOutcome, GoodputGate, MemoryGate
    from analyzer.verbs.compare import Comparison

Inconclusive = Literal["exit", "pass", "fail"]
# How an inconclusive verdict appears in JUnit, by ``--inconclusive`` (docs/ci.md).
INCONCLUSIVE_JUNIT: dict[str, str] = {"exit": "skipped", "pass": "passed", "fail": "failure"}
_VERDICT_COLOUR = {"pass": "#1a7f37", "regression": "#cf222e", "inconclusive": "#9a6700"}
_EXTRA_CSS = (
    "<style>.verdict{display:inline-block;color:#fff;padding:.2rem .8rem;border-radius:4px;font-weight:600}"
    "table.stats td:first-child{text-align:left}</style>"
)


def _value_text(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if metric == "mfu":
        return f"{100 * value:.2f}%"
    if metric == "tokens_per_s":
        return f"{value:,.0f} tokens/s"
    return f"{value:.3f} steps/s" if metric == "steps_per_s" else f"{value:.2f} steps/CPU-s"


def _stats_rows(r: "CheckResult") -> list[list[str]]:
    return [
        [r.statistic_label, _value_text(r.metric, r.base_value), _value_text(r.metric, r.cand_value), f"{-r.drop:+.2%}"],
        [f"median {r.metric_label}", _value_text(r.metric, r.base_median), _value_text(r.metric, r.cand_median), ""],
        ["drop allowed (--max-mfu-drop)", "", "", f"{r.max_drop:.1%}"],
        ["one-sided Mann-Whitney p (alpha)", "", "", f"{r.p_value:.3g} ({r.alpha:g})"],
        ["runs' own noise", "", "", f"{r.noise:.2%} ({r.noise_source})"],
        ["smallest drop these runs can flag", "", "", f"{r.min_detectable_drop:.2%}"],
        ["steady-state steps", str(r.n_base) + (f" ({r.n_baselines} baselines)" if r.n_baselines > 1 else ""),
         str(r.n_cand), ""],
    ]


def _samples_chart(outcome: "GateOutcome") -> str:
    """The gated per-step values of every run, with each side's statistic as a dashed line."""
    if outcome.samples is None:
        return ""
    import plotly.graph_objects as go

    bases, cand = outcome.samples
    r = outcome.result
    scale = 100.0 if r.metric == "mfu" else 1.0
    fig = go.Figure()
    names = ["baseline"] if len(bases) == 1 else [f"baseline {i + 1}" for i in range(len(bases))]
    for name, s in zip(names, bases):
        fig.add_scatter(name=name, x=s.steps.tolist(), y=(scale * s.values).tolist(), mode="markers")
    fig.add_scatter(name="candidate", x=cand.steps.tolist(), y=(scale * cand.values).tolist(), mode="markers")
    fig.add_hline(y=scale * r.base_value, line_dash="dash", line_color="#1f77b4",
                  annotation_text="baseline statistic", annotation_position="top left")
    fig.add_hline(y=scale * r.cand_value, line_dash="dash", line_color="#d62728",
                  annotation_text="candidate statistic", annotation_position="bottom left")
    unit = "% of peak" if r.metric == "mfu" else r.metric_label
    fig.update_layout(title=f"{r.metric_label} per steady-state step (dashed: {r.statistic_label})",
                      xaxis_title="optimizer step", yaxis_title=unit)
    return _figure_html(fig)


def _phase_chart(c: "Comparison") -> str:
    if not c.phases:
        return ""
    import plotly.graph_objects as go

    names = [d.name for d in c.phases]
    fig = go.Figure()
    fig.add_bar(name="baseline", x=names, y=[d.base for d in c.phases])
    fig.add_bar(name="candidate", x=names, y=[d.cand for d in c.phases])
    fig.update_layout(barmode="group", title=f"Mean ms per step by phase ({c.phase_source})", yaxis_title="ms")
    return _figure_html(fig)


def _delta_sections(c: "Comparison", top: int) -> list[str]:
    out = []
    if c.phases:
        out.append(f"<h2>Phases</h2><p class=\"note\">{html.escape(c.phase_source)}; largest change first</p>"
                   + _phase_chart(c)
                   + _html_table(["phase", "base ms", "cand ms", "delta ms", "delta %"], _delta_rows(c.phases), left=(0,)))
    if c.kernels:
        out.append(f"<h2>Kernels</h2><p class=\"note\">{html.escape(c.kernel_source)}; largest change first</p>"
                   + _html_table(["name", "kind", "base ms", "cand ms", "delta ms", "delta %"],
                                 _delta_rows(c.kernels[:top], ".3f", kernel=True), left=(0, 1)))
    for title, deltas, what in (("Ops", c.ops, "op"), ("Modules", c.modules, "module")):
        if deltas:
            out.append(f"<h2>{title}</h2><p class=\"note\">{html.escape(c.op_source)}; largest change first</p>"
                       + _html_table([what, "pass", "base ms", "cand ms", "delta ms", "delta %"],
                                     _delta_rows(deltas[:top], ".3f", kernel=True), left=(0, 1)))
    if c.memory:
        out.append(f"<h2>Peak memory</h2><p class=\"note\">{html.escape(c.memory_source + _growth_text(c))}</p>"
                   + _html_table(["", "base MiB", "cand MiB", "delta MiB", "delta %"], _delta_rows(c.memory, ".1f"),
                                 left=(0,)))
    if c.ranks:
        out.append("<h2>Per-rank median step time</h2>"
                   + _html_table(["rank", "base ms", "cand ms", "delta ms", "delta %"], _delta_rows(c.ranks), left=(0,)))
    return out


def _generated() -> str:
    return f"generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} by analyzer {package_version()}"


def _compare_headline(c: "Comparison") -> str:
    m, sm = c.mfu, c.step_time_median
    rows = [
        ["MFU", _pct(m.base, 2) if m.base is not None else "none", _pct(m.cand, 2) if m.cand is not None else "none",
         f"{100 * m.delta:+.2f} points" if m.delta is not None else "-"],
        ["step time (each run's headline)", f"{_num(sm.base, '.2f')} ms", f"{_num(sm.cand, '.2f')} ms",
         f"{_num(sm.delta, '+.2f')} ms ({_num(sm.delta_pct, '+.1f')}%)"],
        ["mean step time over the phase rows", f"{_num(c.step_time.base, '.2f')} ms", f"{_num(c.step_time.cand, '.2f')} ms",
         f"{_num(c.step_time.delta, '+.2f')} ms"],
    ]
    if m.cand_on_base_peak is not None:
        rows.insert(1, ["MFU, candidate on the baseline's measured peak", "", _pct(m.cand_on_base_peak, 2),
                        f"drop {m.drop:+.1%}" if m.drop is not None else "-"])
    return _html_table(["", "baseline", "candidate", "change"], rows, left=(0,)).replace("<table>", '<table class="stats">', 1)


def check_html(outcome: "GateOutcome", *, top: int = 10) -> str:
    """The ``check --html`` page: verdict, statistics, per-step chart, deltas."""
    r, c = outcome.result, outcome.comparison
    body = [
        _EXTRA_CSS,
        f"<h1>analyzer check <span class=\"verdict\" style=\"background:{_VERDICT_COLOUR[outcome.verdict]}\">"
        f"{html.escape(outcome.verdict_label)}</span></h1>",
        f"<p class=\"note\">baseline: {html.escape(c.base_path)}<br>candidate: {html.escape(c.cand_path)}"
        f"<br>{_generated()}</p>",
        f"<p>{html.escape(outcome.explanation)}</p>",
        "<h2>Statistics</h2>"
        + _html_table(["", "baseline", "candidate", "change / value"], _stats_rows(r), left=(0,)).replace(
            "<table>", '<table class="stats">', 1),
        "<p class=\"note\">Regression when the drop exceeds the allowed drop, p &lt; alpha and the drop exceeds the "
        "runs' own noise; inconclusive when that noise exceeds the allowed drop or a drop beyond it is not beyond "
        "the noise (docs/ci.md).</p>",
    ]
    if outcome.cpu is not None:
        body.append("<h2>CPU time per step</h2>" + _html_table(
            ["", "baseline", "candidate", "change / value"], _stats_rows(outcome.cpu), left=(0,)).replace(
            "<table>", '<table class="stats">', 1) + f"<p class=\"note\">verdict on CPU time alone: "
            f"{html.escape(outcome.cpu.verdict_label)}</p>")
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
    body.append(f"<p class=\"note\">baseline samples: {html.escape(r.base_source)}<br>"
                f"candidate samples: {html.escape(r.cand_source)}</p>")
    return html_page(f"analyzer check: {outcome.verdict_label}", "\n".join(body))


def compare_html(c: "Comparison", *, top: int = 10) -> str:
    """The ``compare --html`` page: MFU and step time, phase chart, phase, kernel, op, module and rank deltas."""
    body = [
        _EXTRA_CSS,
        "<h1>analyzer compare</h1>",
        f"<p class=\"note\">baseline: {html.escape(c.base_path)}<br>candidate: {html.escape(c.cand_path)}"
        f"<br>{_generated()}</p>",
        "<h2>Headline</h2>" + _compare_headline(c),
    ]
    body += _delta_sections(c, top)
    if c.notes:
        body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in c.notes) + "</ul>")
    return html_page("analyzer compare", "\n".join(body))


# ----------------------------------------------------------------- JUnit
def _testcase(suite: ET.Element, name: str, r: "CheckResult", inconclusive: Inconclusive, message: str) -> str:
    """Append one testcase; its JUnit outcome: passed, failure or skipped."""
    case = ET.SubElement(suite, "testcase", classname="analyzer.check", name=name, time="0")
    kind = "passed"
    if r.regression:
        kind = "failure"
    elif r.inconclusive:
        kind = INCONCLUSIVE_JUNIT[inconclusive]
    if kind == "failure":
        ET.SubElement(case, "failure", message=f"{r.verdict_label}: drop {r.drop:+.1%}", type=r.verdict).text = message
    elif kind == "skipped":
        ET.SubElement(case, "skipped", message=f"{r.verdict_label}: {message}")
    _output_and_properties(case, message, (
        ("verdict", r.verdict), ("metric", r.metric), ("base_value", r.base_value), ("cand_value", r.cand_value),
        ("drop", r.drop), ("max_drop", r.max_drop), ("p_value", r.p_value), ("alpha", r.alpha), ("noise", r.noise),
        ("min_detectable_drop", r.min_detectable_drop), ("n_base", r.n_base), ("n_cand", r.n_cand)))
    return kind


def _output_and_properties(case: ET.Element, message: str, props: Sequence[tuple[str, object]]) -> None:
    """A testcase's ``system-out`` and its ``properties`` (floats as ``repr``: a reader gets the exact double)."""
    ET.SubElement(case, "system-out").text = message
    node = ET.SubElement(case, "properties")
    for key, value in props:
        ET.SubElement(node, "property", name=key, value=repr(value) if isinstance(value, float) else str(value))


def _bound_testcase(suite: ET.Element, name: str, failed: bool, failure: str, message: str,
                    props: Sequence[tuple[str, object]]) -> str:
    """A testcase of a bound with no statistics (``--min-goodput``, ``--max-memory-growth``): a failure iff
    the bound is broken, never skipped (there is no noise to be inconclusive about)."""
    case = ET.SubElement(suite, "testcase", classname="analyzer.check", name=name, time="0")
    if failed:
        ET.SubElement(case, "failure", message=failure, type="regression").text = message
    _output_and_properties(case, message, props)
    return "failure" if failed else "passed"


def _goodput_testcase(suite: ET.Element, g: "GoodputGate") -> str:
    return _bound_testcase(suite, "goodput", g.failed, f"goodput {g.goodput:.1%} below {g.min_goodput:.1%}", g.text(), (
        ("goodput", g.goodput), ("min_goodput", g.min_goodput), ("wall_s", g.wall_s),
        ("productive_s", g.productive_s), ("attempts", g.attempts), ("base_goodput", g.base_goodput)))


def _memory_testcase(suite: ET.Element, g: "MemoryGate") -> str:
    return _bound_testcase(
        suite, "peak memory", g.failed, f"peak memory {g.growth:+.1%} over {g.max_growth:+.1%}", g.text(), (
            ("growth", g.growth), ("max_growth", g.max_growth), ("base_bytes", g.base_bytes),
            ("cand_bytes", g.cand_bytes), ("kind", g.kind), ("source", g.source),
            ("reserved_growth", g.reserved_growth)))


def check_junit(outcome: "GateOutcome", inconclusive: Inconclusive = "exit") -> str:
    """JUnit XML of the gate: one testcase per gated metric (see the module doc for the mapping).

    Float properties are written with ``repr`` so a reader gets the exact
    double back. The suite's ``tests``/``failures``/``skipped`` counts
    follow the cases.
    """
    r = outcome.result
    suite = ET.Element("testsuite", name="analyzer check", timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    cases = [(r.statistic_label, r, outcome.explanation)]
    if outcome.cpu is not None:
        k = outcome.cpu
        cases.append((k.statistic_label, k, f"CPU time per step: {k.statistic_label} drop {k.drop:+.1%} "
                      f"(p = {k.p_value:.2g}, noise {k.noise:.1%}); {k.verdict_label}"))
    kinds = [_testcase(suite, name, res, inconclusive, msg) for name, res, msg in cases]
    if outcome.goodput is not None:
        kinds.append(_goodput_testcase(suite, outcome.goodput))
    if outcome.memory is not None:
        kinds.append(_memory_testcase(suite, outcome.memory))
    suite.set("tests", str(len(kinds)))
    suite.set("failures", str(kinds.count("failure")))
    suite.set("errors", "0")
    suite.set("skipped", str(kinds.count("skipped")))
    suite.set("time", "0")
    root = ET.Element("testsuites", name="analyzer", tests=suite.get("tests"), failures=suite.get("failures"),
                      errors="0", skipped=suite.get("skipped"))
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# ----------------------------------------------------------------- GitHub Actions
def _escape_data(text: str) -> str:
    """A workflow command's message: ``%``, CR and LF percent-encoded (actions/toolkit, core/src/command.ts)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """A workflow command's property value: as the message, plus ``:`` and ``,``."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_command(kind: Literal["error", "warning", "notice"], title: str, message: str) -> str:
    """One GitHub Actions workflow command line, e.g. ``::error title=T::message``."""
    return printable(f"::{kind} title={_escape_property(title)}::{_escape_data(message)}")


def on_github_actions() -> bool:
    """True inside a GitHub Actions job (the runner sets ``GITHUB_ACTIONS=true``)."""
    return os.environ.get("GITHUB_ACTIONS") == "true"


def check_annotations(outcome: "GateOutcome", inconclusive: Inconclusive = "exit") -> list[str]:
    """The workflow commands of a check: ``error`` on a regression, ``warning`` when inconclusive
    (``error`` with ``--inconclusive fail``), ``notice`` within bounds."""
    if outcome.regression:
        kind: Literal["error", "warning", "notice"] = "error"
    elif outcome.inconclusive:
        kind = "error" if inconclusive == "fail" else "warning"
    else:
        kind = "notice"
    return [workflow_command(kind, f"analyzer check: {outcome.verdict_label}", outcome.explanation)]


def compare_annotations(c: "Comparison") -> list[str]:
    """One ``notice`` with the headline deltas (compare has no verdict)."""
    m, sm = c.mfu, c.step_time_median
    mfu = (f"MFU {_pct(m.base, 2)} -> {_pct(m.cand, 2)}" if m.base is not None and m.cand is not None else "MFU n/a")
    text = f"{mfu}; step time {_num(sm.base, '.2f')} -> {_num(sm.cand, '.2f')} ms ({_num(sm.delta_pct, '+.1f')}%)"
    grew = c.growing_phases(1)
    if grew:
        text += f"; largest growth: {grew[0].name} {grew[0].delta:+.2f} ms"
    return [workflow_command("notice", "analyzer compare", text)]


def append_step_summary(outcome: "GateOutcome") -> Path | None:
    """Append the check's Markdown summary to ``$GITHUB_STEP_SUMMARY`` when it is set; the file, or None."""
    name = os.environ.get("GITHUB_STEP_SUMMARY")
    if not name:
        return None
    path = Path(name)
    try:
        with path.open("a", encoding="utf-8") as f:
            f.write(render_check_markdown(outcome, outcome.explanation) + "\n")
    except OSError as exc:
        raise AnalyzerError(f"{path}: cannot append the step summary ($GITHUB_STEP_SUMMARY): {exc.strerror or exc}") from None
    return path
