"""JUnit XML of ``analyzer check`` for a CI test view, valid against pytest's xunit2 schema (junit-10.xsd).

One ``<testcase>`` per gate: the step statistic (the wall-clock metric),
CPU time per step where the gate used it, ``--min-goodput`` and
``--max-memory-growth``. The cases agree with the overall verdict (the exit
code):

* a case is a ``<failure>`` only when the check fails: its own gate found a
  regression and the overall verdict is a regression (CPU time alone can
  find a regression that the gate overrules; that case passes and says so);
* an inconclusive verdict follows ``--inconclusive``
  (:data:`INCONCLUSIVE_JUNIT`): ``exit`` (the default, exit code 4) writes a
  ``<skipped message="INCONCLUSIVE: ...">``, ``pass`` a passed case whose
  ``<system-out>`` says so, ``fail`` (exit code 1) a ``<failure>``; so an
  exit code 4 never shows as a failed test;
* a bound (goodput, memory) is a failure exactly when it is broken.

The figures behind each case are ``<property>`` elements of the suite (the
schema allows properties on a suite, not on a case), named
``<case>.<figure>`` with ``<case>`` one of ``gate``, ``cpu``, ``goodput``,
``memory``; floats are written with ``repr`` so a reader gets the exact
double back.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Literal, Sequence

if TYPE_CHECKING:
    from analyzer.verbs.check import CheckResult, GateOutcome, GoodputGate, MemoryGate

Inconclusive = Literal["exit", "pass", "fail"]
# How an inconclusive verdict appears in JUnit, by ``--inconclusive`` (docs/ci.md).
INCONCLUSIVE_JUNIT: dict[str, str] = {"exit": "skipped", "pass": "passed", "fail": "failure"}
Properties = Sequence[tuple[str, object]]


def _case(suite: ET.Element, name: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname="analyzer.check", name=name, time="0")


def _statistic_case(
    suite: ET.Element, name: str, r: "CheckResult", overall: str, inconclusive: Inconclusive, message: str
) -> str:
    """One gated statistic's testcase; its JUnit outcome (passed, failure or skipped), by the module doc's rules."""
    case = _case(suite, name)
    if overall == "inconclusive" and (r.regression or r.inconclusive):
        kind = INCONCLUSIVE_JUNIT[inconclusive]
    elif r.regression and overall == "regression":
        kind = "failure"
    else:
        kind = "passed"
    if kind == "failure":
        ET.SubElement(case, "failure", message=f"{r.verdict_label}: drop {r.drop:+.1%}", type=r.verdict).text = message
    elif kind == "skipped":
        ET.SubElement(case, "skipped", message=f"INCONCLUSIVE: {message}")
    if r.verdict != overall and kind == "passed" and overall != "inconclusive":
        message += f" (this statistic alone: {r.verdict_label}; the gate's verdict: {overall})"
    ET.SubElement(case, "system-out").text = message
    return kind


def _statistic_properties(key: str, r: "CheckResult") -> Properties:
    return [
        (f"{key}.{k}", v)
        for k, v in (
            ("verdict", r.verdict),
            ("metric", r.metric),
            ("base_value", r.base_value),
            ("cand_value", r.cand_value),
            ("drop", r.drop),
            ("max_drop", r.max_drop),
            ("p_value", r.p_value),
            ("alpha", r.alpha),
            ("noise", r.noise),
            ("min_detectable_drop", r.min_detectable_drop),
            ("n_base", r.n_base),
            ("n_cand", r.n_cand),
        )
    ]


def _bound_case(suite: ET.Element, name: str, failed: bool, failure: str, message: str) -> str:
    """A bound with no statistics (``--min-goodput``, ``--max-memory-growth``): a failure iff the bound
    is broken, never skipped (there is no noise to be inconclusive about)."""
    case = _case(suite, name)
    if failed:
        ET.SubElement(case, "failure", message=failure, type="regression").text = message
    ET.SubElement(case, "system-out").text = message
    return "failure" if failed else "passed"


def _goodput(suite: ET.Element, g: "GoodputGate") -> tuple[str, Properties]:
    kind = _bound_case(suite, "goodput", g.failed, f"goodput {g.goodput:.1%} below {g.min_goodput:.1%}", g.text())
    return kind, [
        (f"goodput.{k}", v)
        for k, v in (
            ("goodput", g.goodput),
            ("min_goodput", g.min_goodput),
            ("wall_s", g.wall_s),
            ("productive_s", g.productive_s),
            ("attempts", g.attempts),
            ("base_goodput", g.base_goodput),
        )
    ]


def _memory(suite: ET.Element, g: "MemoryGate") -> tuple[str, Properties]:
    kind = _bound_case(
        suite, "peak memory", g.failed, f"peak memory {g.growth:+.1%} over {g.max_growth:+.1%}", g.text()
    )
    return kind, [
        (f"memory.{k}", v)
        for k, v in (
            ("growth", g.growth),
            ("max_growth", g.max_growth),
            ("base_bytes", g.base_bytes),
            ("cand_bytes", g.cand_bytes),
            ("kind", g.kind),
            ("source", g.source),
            ("reserved_growth", g.reserved_growth),
        )
    ]


def check_junit(outcome: "GateOutcome", inconclusive: Inconclusive = "exit") -> str:
    """JUnit XML of the gate (see the module doc); the suite's ``tests``/``failures``/``skipped`` counts follow the cases."""
    r = outcome.result
    suite = ET.Element(
        "testsuite", name="analyzer check", timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds")
    )
    props_node = ET.SubElement(suite, "properties")
    props: list[tuple[str, object]] = [("verdict", outcome.verdict), *_statistic_properties("gate", r)]
    kinds = [_statistic_case(suite, r.statistic_label, r, outcome.verdict, inconclusive, outcome.explanation)]
    if outcome.cpu is not None:
        k = outcome.cpu
        kinds.append(
            _statistic_case(
                suite,
                k.statistic_label,
                k,
                outcome.verdict,
                inconclusive,
                f"CPU time per step: {k.statistic_label} drop {k.drop:+.1%} "
                f"(p = {k.p_value:.2g}, noise {k.noise:.1%}); {k.verdict_label}",
            )
        )
        props += _statistic_properties("cpu", k)
    bounds = ([_goodput(suite, outcome.goodput)] if outcome.goodput is not None else []) + (
        [_memory(suite, outcome.memory)] if outcome.memory is not None else []
    )
    for kind, extra in bounds:
        kinds.append(kind)
        props += extra
    for key, value in props:
        ET.SubElement(props_node, "property", name=key, value=repr(value) if isinstance(value, float) else str(value))
    counts = {"tests": str(len(kinds)), "failures": str(kinds.count("failure")), "errors": "0"}
    suite.attrib.update(counts, skipped=str(kinds.count("skipped")), time="0")
    root = ET.Element("testsuites", {"name": "analyzer", **counts})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
