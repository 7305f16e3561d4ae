"""`analyzer check --min-goodput G` (analyzer/verbs/check/goodput.py GoodputGate; docs/ci.md "Goodput").

On the example reftrain run under traces/ (one attempt, goodput 58.8 %: 13.06 s of
productive steps in 22.22 s of wall, most of the rest start-up), checked against itself so
the step statistic passes exactly (drop 0, noise 0) and only the goodput floor decides.
Nothing here judges timing: the run's records are fixed files.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from analyzer import analyze

RUN = Path(__file__).resolve().parents[1] / "traces" / "example-ddp-w2"


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    from analyzer.cli import main

    code = main([*argv, "--no-cache"])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def goodput() -> float:
    g = analyze(RUN, cache=False).goodput()
    assert g is not None
    # The definition (docs/rundir.md): productive step time / wall time.
    assert g.goodput == pytest.approx(g.productive_s / g.wall_s, rel=1e-12)
    assert 0.5 < g.goodput < 0.7  # 58.8 %: the floors below sit well either side of it
    return g.goodput


def test_below_the_floor_is_a_regression_whatever_the_step_statistic(capsys, tmp_path: Path, goodput: float) -> None:
    code, out, _ = _main(
        capsys,
        "check",
        str(RUN),
        "--baseline",
        str(RUN),
        "--min-goodput",
        "0.9",
        "--json",
        str(tmp_path / "v.json"),
        "--junit",
        str(tmp_path / "v.xml"),
        "--summary",
        str(tmp_path / "v.md"),
    )
    assert code == 1
    assert out.startswith("analyzer check: REGRESSION")
    assert f"goodput {goodput:.1%} (below the floor 90.0%" in out and "largest losses: startup" in out
    v = json.loads((tmp_path / "v.json").read_text())
    assert (v["verdict"], v["step_verdict"]) == ("regression", "pass")
    assert v["goodput"]["failed"] is True and v["goodput"]["goodput"] == pytest.approx(goodput, rel=1e-12)
    assert v["goodput"]["min_goodput"] == 0.9 and v["goodput"]["attempts"] == 1
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "v.xml").getroot().iter("testcase")}
    assert cases["goodput"].find("failure") is not None
    assert sum(c.find("failure") is not None for c in cases.values()) == 1  # the step statistic passed
    assert "| goodput (floor 90.0%) |" in (tmp_path / "v.md").read_text()
    assert "## :x: analyzer check: regression" in (tmp_path / "v.md").read_text()


def test_at_or_above_the_floor_leaves_the_verdict_to_the_step_statistic(capsys, tmp_path: Path, goodput: float) -> None:
    code, out, _ = _main(
        capsys, "check", str(RUN), "--baseline", str(RUN), "--min-goodput", "0.5", "--json", str(tmp_path / "v.json")
    )
    assert code == 0 and out.startswith("analyzer check: PASS")
    assert f"Goodput {goodput:.1%} (at or above the floor 50.0%" in out
    v = json.loads((tmp_path / "v.json").read_text())
    assert (v["verdict"], v["goodput"]["failed"]) == ("pass", False)


def test_without_the_flag_there_is_no_goodput_gate(capsys, tmp_path: Path) -> None:
    code, out, _ = _main(capsys, "check", str(RUN), "--baseline", str(RUN), "--json", str(tmp_path / "v.json"))
    assert code == 0 and json.loads((tmp_path / "v.json").read_text())["goodput"] is None
    assert "goodput" not in out.lower()


def test_a_trace_folder_has_no_goodput_one_line_exit_2(capsys) -> None:
    code, out, err = _main(capsys, "check", str(RUN / "traces"), "--baseline", str(RUN), "--min-goodput", "0.5")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--min-goodput" in err and "no goodput" in err and "Traceback" not in err


@pytest.mark.parametrize("bad", ["1.5", "-0.1"])
def test_a_floor_outside_0_1_is_refused_before_analysis(capsys, bad: str) -> None:
    code, out, err = _main(capsys, "check", str(RUN), "--baseline", str(RUN), "--min-goodput", bad)
    assert code == 2 and err.strip() == f"analyzer: error: --min-goodput must be between 0 and 1, got {float(bad)}"
