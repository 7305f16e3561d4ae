"""Comments say why, never history: no comment or docstring in the four packages cites an issue number.

History lives in commit messages and CHANGELOG.md. The scan reads each module's comments (tokenize)
and docstrings (ast), so a user-facing message that happened to say "issue 3" would not count, and a
commented-out or quoted "issue 12" would.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("analyzer", "recorder", "reftrain", "dashboard")
ISSUE = re.compile(r"\bissue \d+", re.IGNORECASE)


def issue_references(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment or docstring of ``source`` that matches ``\\bissue \\d+``."""
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT and ISSUE.search(tok.string)
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc and ISSUE.search(doc):
                first = node.body[0]
                found.append((first.lineno, doc))
    return sorted(found)


def _modules() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def _offenders(paths: list[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for rel in paths:
        lines = [line for line, _ in issue_references((REPO / rel).read_text(encoding="utf-8"))]
        if lines:
            out[rel] = lines
    return out


def test_the_scan_finds_comments_and_docstrings_and_nothing_else() -> None:
    source = '''"""Module (Issue 7)."""
x = "issue 3 in a message"  # see issue 12
def f():
    """Does f."""
    # an issue with 2 parts
    return "issue 4"
class C:
    """Fixed in issue 40, item 6."""
'''
    assert [line for line, _ in issue_references(source)] == [1, 2, 8]


def test_no_module_cites_an_issue_number() -> None:
    offenders = _offenders(list(_modules()))
    assert not offenders, f"comments or docstrings citing an issue number (file: lines): {offenders}"


# The build's own files (pyproject.toml, Makefile, .ci/run) hold comments too; theirs start with "#".
BUILD_FILES = ("pyproject.toml", "Makefile", ".ci/run")


def hash_comment_references(text: str) -> list[int]:
    """Lines of ``text`` whose ``#`` comment (from the first ``#`` that starts a comment) cites an issue."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        comment = stripped if stripped.startswith("#") else line.partition(" #")[2]
        if comment and ISSUE.search(comment):
            found.append(number)
    return found


def test_the_build_files_scan_reads_comments_only() -> None:
    text = 'a = "issue 3"\n# see issue 12\nb = 1  # issue 4, item 2\n# an issue with 2 parts\n'
    assert hash_comment_references(text) == [2, 3]


def test_no_build_file_comment_cites_an_issue_number() -> None:
    offenders = {
        name: lines
        for name in BUILD_FILES
        if (REPO / name).exists() and (lines := hash_comment_references((REPO / name).read_text(encoding="utf-8")))
    }
    assert not offenders, f"comments citing an issue number (file: lines): {offenders}"


# `docs/<name>.md, "Heading"` or `docs/<name>.md "Heading"` in code and docs: the reader is sent to a
# section, so the section must exist when the docs are reorganized.
DOC_SECTION = re.compile(r'docs/(\w+)\.md,?\s*\(?"([^"\n]+)"')


def _section_names(doc: Path) -> list[str]:
    """A doc's headings, bold run-in labels (``**A metric.**``) and code spans, lower-cased."""
    text = doc.read_text(encoding="utf-8")
    names = [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]
    names += re.findall(r"\*\*([^*]+)\*\*", text) + re.findall(r"`([^`]+)`", text)
    return [n.lower() for n in names]


def test_every_named_doc_section_exists() -> None:
    sections = {d.stem: _section_names(d) for d in (REPO / "docs").glob("*.md")}
    if not sections:
        pytest.skip("docs/ is not in this checkout")
    files = [
        p
        for pkg in (*PACKAGES, "tests", "bench", "docs")
        for p in (REPO / pkg).rglob("*")
        if p.suffix in (".py", ".md") and "golden" not in p.parts and "results" not in p.parts
    ]
    missing = []
    for f in files:
        for m in DOC_SECTION.finditer(f.read_text(encoding="utf-8")):
            doc, name = m.group(1), m.group(2).lower()
            if not any(name in s for s in sections.get(doc, [])):
                missing.append(f"{f.relative_to(REPO)}: docs/{doc}.md, {m.group(2)!r}")
    assert not missing, "references to doc sections that do not exist:\n" + "\n".join(missing)
