"""The render layer's rules that import-linter cannot state: no module of it, and no verb module
it was split from, imports another module's private name; its package imports nothing."""

from __future__ import annotations

import ast
from pathlib import Path

ANALYZER = Path(__file__).resolve().parent.parent / "analyzer"
# The renderers and the verbs whose rendering moved into them.
CHECKED = sorted((ANALYZER / "render").glob("*.py")) + [
    ANALYZER / "verbs" / name for name in ("report.py", "check.py", "compare.py", "history.py")
]


def private_imports(path: Path) -> list[str]:
    """``module.name`` for each ``from analyzer... import _name`` in ``path`` (relative imports count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("analyzer")):
            found += [
                f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_") and a.name != "__future__"
            ]
    return found


def test_no_private_name_crosses_a_module_boundary():
    assert {p.name: private_imports(p) for p in CHECKED if private_imports(p)} == {}


def test_the_check_catches_a_private_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from analyzer.verbs.compare import _growth\nfrom analyzer.render.format import num\n")
    assert private_imports(bad) == ["analyzer.verbs.compare._growth"]


def test_the_render_package_imports_nothing():
    tree = ast.parse((ANALYZER / "render" / "__init__.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
