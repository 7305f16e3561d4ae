"""CI artifacts of `analyzer check` and `compare` (analyzer/render/: junit.py, github.py, html.py; docs/ci.md).

On synthetic trace folders with exact timings (tests/test_compare.py's write_run: the
candidate's steps are 1.2 ms instead of 1.0 ms, MFU 20.00 % -> 16.67 %) and a drifting
run that is inconclusive: JUnit parsed back case by case under each --inconclusive mode
and validated against pytest's xunit2 schema (tests/data/junit-10.xsd), GitHub Actions
annotations line by line, the step summary appended (never overwritten), and HTML pages
that fetch nothing and run no script.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from test_compare import PEAK, write_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, str]:
    from synth import KinetoTrace

    root = tmp_path_factory.mktemp("ci")
    base, cand = write_run(root / "base"), write_run(root / "cand", extra_kernel_us=200)
    # A run whose second half is 20 % slower: against itself, inconclusive at the 5 % default.
    for rank in range(2):
        t = KinetoTrace(rank=rank, world_size=2, device_name="Mystery GPU 9000")
        start = 0
        for i in range(16):
            period = 1000 if i < 8 else 1250
            t.step(i, start, period)
            t.kernel("k", start + 10, 100, launch_us=start + 1)
            start += period
        t.write(root / "drift" / f"rank{rank}.json.gz")
    return {"base": str(base), "cand": str(cand), "drift": str(root / "drift")}


def _main(capsys, monkeypatch, *argv: str, github: bool = False, summary: Path | None = None) -> tuple[int, str]:
    from analyzer.cli import main

    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    if github:
        monkeypatch.setenv("GITHUB_ACTIONS", "true")
    if summary is not None:
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code = main(list(argv))
    return code, capsys.readouterr().out


XUNIT2 = Path(__file__).parent / "data" / "junit-10.xsd"


def _validate(path: Path) -> None:
    """Raise unless ``path`` is valid against pytest's xunit2 schema (xmlschema names the offending element)."""
    xmlschema = pytest.importorskip("xmlschema", reason="xmlschema (the dev extra) validates the JUnit files")
    xmlschema.XMLSchema(XUNIT2).validate(str(path))


def _cases(path: Path) -> list[ET.Element]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    return [case for suite in suites for case in suite.findall("testcase")]


def _outcome(case: ET.Element) -> str:
    for tag in ("failure", "skipped", "error"):
        if case.find(tag) is not None:
            return tag
    return "passed"


def test_junit_regression_pass_and_inconclusive_under_each_mode(runs, capsys, monkeypatch, tmp_path):
    junit = tmp_path / "gate.xml"
    code, _ = _main(
        capsys,
        monkeypatch,
        "check",
        runs["cand"],
        "--baseline",
        runs["base"],
        "--peak-flops",
        str(PEAK),
        "--junit",
        str(junit),
    )
    assert code == 1
    _validate(junit)
    (case,) = _cases(junit)
    assert case.get("name") == "MFU at the 25th percentile of step time"
    assert _outcome(case) == "failure" and "16.7" in case.find("failure").get("message")

    code, _ = _main(
        capsys,
        monkeypatch,
        "check",
        runs["base"],
        "--baseline",
        runs["base"],
        "--peak-flops",
        str(PEAK),
        "--junit",
        str(junit),
    )
    assert code == 0 and [_outcome(c) for c in _cases(junit)] == ["passed"]

    for mode, exit_code, outcome in (("exit", 4, "skipped"), ("pass", 0, "passed"), ("fail", 1, "failure")):
        code, _ = _main(
            capsys,
            monkeypatch,
            "check",
            runs["drift"],
            "--baseline",
            runs["drift"],
            "--inconclusive",
            mode,
            "--junit",
            str(junit),
        )
        assert code == exit_code, mode
        _validate(junit)
        (case,) = _cases(junit)
        assert _outcome(case) == outcome, mode
        text = ET.tostring(case, encoding="unicode")
        assert "inconclusive" in text.lower(), mode  # the case says why, whatever it maps to
    root = ET.parse(junit).getroot()
    assert root.get("skipped") is None and root.get("failures") == "1"  # the last mode: fail


def test_inconclusive_junit_has_no_failure_even_when_one_statistic_regresses(runs):
    """Exit code 4 is never a failed test: a check whose verdict is inconclusive while one gated
    statistic alone (here CPU time per step) says regression writes skipped cases, no <failure>."""
    from dataclasses import replace

    from analyzer.api import analyze
    from analyzer.render.junit import check_junit
    from analyzer.verbs.check import check

    drift = analyze(Path(runs["drift"]), cache=False)
    inconclusive = check(drift, drift)
    assert inconclusive.verdict == "inconclusive"
    regression = check(
        analyze(Path(runs["base"]), cache=False, peak_flops=PEAK),
        analyze(Path(runs["cand"]), cache=False, peak_flops=PEAK),
    ).result
    assert regression.verdict == "regression"
    outcome = replace(inconclusive, cpu=regression)
    root = ET.fromstring(check_junit(outcome, "exit"))
    cases = [c for suite in root.findall("testsuite") for c in suite.findall("testcase")]
    assert [_outcome(c) for c in cases] == ["skipped", "skipped"]
    assert root.get("failures") == "0" and root.find("testsuite").get("skipped") == "2"
    # With --inconclusive fail (exit code 1) both are failures; a passing verdict passes both.
    assert [_outcome(c) for c in ET.fromstring(check_junit(outcome, "fail")).iter("testcase")] == ["failure"] * 2
    passing = replace(
        check(
            analyze(Path(runs["base"]), cache=False, peak_flops=PEAK),
            analyze(Path(runs["base"]), cache=False, peak_flops=PEAK),
        ),
        cpu=regression,
    )
    (gate, cpu) = ET.fromstring(check_junit(passing)).iter("testcase")
    assert _outcome(gate) == _outcome(cpu) == "passed"
    assert "this statistic alone: REGRESSION" in cpu.find("system-out").text


def test_annotations_on_github_actions_only(runs, capsys, monkeypatch):
    argv = ("check", runs["cand"], "--baseline", runs["base"], "--peak-flops", str(PEAK))
    _, out = _main(capsys, monkeypatch, *argv)
    assert "::error" not in out and "::notice" not in out
    _, out = _main(capsys, monkeypatch, *argv, github=True)
    (line,) = [x for x in out.splitlines() if x.startswith("::")]
    assert line.startswith("::error title=analyzer check%3A REGRESSION::")
    _, out = _main(
        capsys, monkeypatch, "check", runs["base"], "--baseline", runs["base"], "--peak-flops", str(PEAK), github=True
    )
    assert [x.split(" ", 1)[0] for x in out.splitlines() if x.startswith("::")] == ["::notice"]
    drift = ("check", runs["drift"], "--baseline", runs["drift"])
    _, out = _main(capsys, monkeypatch, *drift, github=True)
    assert [x.split(" ", 1)[0] for x in out.splitlines() if x.startswith("::")] == ["::warning"]
    _, out = _main(capsys, monkeypatch, *drift, "--inconclusive", "fail", github=True)
    assert [x.split(" ", 1)[0] for x in out.splitlines() if x.startswith("::")] == ["::error"]


def test_step_summary_is_appended_not_overwritten(runs, capsys, monkeypatch, tmp_path):
    summary = tmp_path / "step_summary.md"
    summary.write_text("prior step's line\n")
    argv = ("check", runs["cand"], "--baseline", runs["base"], "--peak-flops", str(PEAK))
    _main(capsys, monkeypatch, *argv, github=True, summary=summary)
    text = summary.read_text()
    assert text.startswith("prior step's line\n")
    assert text.count("## :x: analyzer check: regression") == 1
    # --summary naming the same file: still appended once, not written over.
    _main(capsys, monkeypatch, *argv, "--summary", str(summary), github=True, summary=summary)
    text = summary.read_text()
    assert text.startswith("prior step's line\n") and text.count("## :x: analyzer check: regression") == 2


def _external_urls(page: str) -> list[str]:
    """src=/href= attributes pointing at http(s)."""
    return re.findall(r"""(?:src|href)\s*=\s*["']https?://[^"']*""", page)


def test_html_pages_are_self_contained(runs, capsys, monkeypatch, tmp_path):
    check_html, compare_html = tmp_path / "check.html", tmp_path / "compare.html"
    _main(
        capsys,
        monkeypatch,
        "check",
        runs["cand"],
        "--baseline",
        runs["base"],
        "--peak-flops",
        str(PEAK),
        "--html",
        str(check_html),
    )
    _main(
        capsys,
        monkeypatch,
        "compare",
        runs["base"],
        runs["cand"],
        "--peak-flops",
        str(PEAK),
        "--html",
        str(compare_html),
    )
    for page in (check_html.read_text(), compare_html.read_text()):
        assert page.startswith("<!DOCTYPE html>") or page.lower().startswith("<!doctype html>")
        assert _external_urls(page) == []
        assert "<script" not in page and "<svg" in page  # charts are inline SVG: nothing to load or run
    check_page = check_html.read_text()
    assert "REGRESSION" in check_page.upper() and "16.67%" in check_page and "layernorm" in check_page


def test_html_report_tables_not_preformatted(runs, capsys, monkeypatch, tmp_path):
    page = tmp_path / "report.html"
    code, _ = _main(
        capsys, monkeypatch, "report", runs["cand"], "--peak-flops", str(PEAK), "--no-cache", "--html", str(page)
    )
    assert code == 0
    html = page.read_text()
    assert "<pre" not in html
    assert html.count("<table") >= 3
