"""Text that reaches a terminal, a CI log or a Markdown file: control characters escaped.

Kernel, op, module, annotation and file names come from trace content, which
anyone can craft. Printed raw, an ESC sequence rewrites the terminal (moves
the cursor, retitles the window, hides lines), a NUL or a carriage return
hides text from a CI log, and a bidi override (U+202E) makes a name read
backwards. :func:`printable` escapes them where text is rendered, never at
parse time: the tables and the JSON report keep the real names.

Escapes are Python's: ``\\x1b`` for C0 and C1 controls and DEL, ``\\u202e``
for the bidi embeddings, overrides and isolates and the line and paragraph
separators. Escaping twice gives the same text (the escapes are printable),
so a renderer's output may pass through again at the CLI's edge unchanged.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis

# C0 controls (tab and newline are handled apart), DEL, C1 controls; the bidi
# embeddings and overrides (U+202A-202E) and isolates (U+2066-2069), the
# implicit direction marks (U+200E, U+200F, U+061C) and the line and paragraph
# separators (U+2028, U+2029), which some terminals and editors break lines at.
_CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_IN_TEXT = re.compile(f"[{_CONTROLS}]")
_IN_LINE = re.compile(f"[{_CONTROLS}\t\n]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str, *, one_line: bool = False) -> str:
    """`text` with every control character escaped (``"\\x1b[2J"`` becomes ``"\\\\x1b[2J"``).

    Newlines and tabs are kept, unless ``one_line``: then they are escaped
    too, for a table cell or a name inside a sentence, so that a name can
    never start a line of its own (a forged ``::error::`` workflow command
    in a GitHub Actions log, say).
    """
    return (_IN_LINE if one_line else _IN_TEXT).sub(_escape, str(text))


def say(kind: str, message: str, prog: str = "analyzer") -> None:
    """One line on stderr: ``analyzer: <kind>: <message>`` (whitespace runs folded to one space, controls escaped)."""
    text = printable(" ".join(str(message).split()), one_line=True)
    print(f"{prog}: {kind}: {text}" if kind else f"{prog}: {text}", file=sys.stderr)


def run_messages(a: "RunAnalysis") -> list[tuple[str, str]]:
    """What every verb says on stderr about an analyzed run, in order: ``("skipped", error)`` per
    unusable file, then ``("warning", warning)`` per warning of the analysis."""
    return [("skipped", str(e)) for e in a.errors] + [("warning", str(w)) for w in a.warnings]
