"""GitHub Actions output: workflow commands (annotations) and the job's step summary.

:func:`check_annotations` and :func:`compare_annotations` give the workflow
commands (``::error title=...::message``) the CLI prints on stdout when
``GITHUB_ACTIONS=true``; :func:`append_step_summary` appends the check's
Markdown summary to the file named by ``$GITHUB_STEP_SUMMARY``. docs/ci.md
shows the workflow that uses them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from analyzer.errors import AnalyzerError
from analyzer.render.format import num, pct
from analyzer.render.junit import Inconclusive
from analyzer.render.markdown import check_markdown
from analyzer.verbs.printable import printable

if TYPE_CHECKING:
    from analyzer.verbs.check import GateOutcome
    from analyzer.verbs.compare import Comparison


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
    mfu = f"MFU {pct(m.base, 2)} -> {pct(m.cand, 2)}" if m.base is not None and m.cand is not None else "MFU -"
    text = f"{mfu}; step time {num(sm.base, '.2f')} -> {num(sm.cand, '.2f')} ms ({num(sm.delta_pct, '+.1f')}%)"
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
            f.write(check_markdown(outcome, outcome.explanation) + "\n")
    except OSError as exc:
        raise AnalyzerError(
            f"{path}: cannot append the step summary ($GITHUB_STEP_SUMMARY): {exc.strerror or exc}"
        ) from None
    return path
