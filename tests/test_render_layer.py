"""Rules that import-linter cannot state: no module of analyzer/ imports another module's private name
(a ``_name``; dunders such as ``__version__`` are public); the render package's ``__init__`` imports nothing."""

from __future__ import annotations

import ast
from pathlib import Path

ANALYZER = Path(__file__).resolve().parent.parent / "analyzer"
CHECKED = sorted(ANALYZER.rglob("*.py"))


def private_imports(path: Path) -> list[str]:
    """``module.name`` for each ``from analyzer... import _name`` in ``path`` (relative imports count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("analyzer")):
            found += [
                f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.endswith("__")
            ]
    return found


def test_no_private_name_crosses_a_module_boundary():
    found = {str(p.relative_to(ANALYZER)): private_imports(p) for p in CHECKED if private_imports(p)}
    assert found == {}


def test_the_check_catches_a_private_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from analyzer.verbs.compare import _growth\nfrom analyzer.render.format import num\n"
        "from analyzer import __version__\nfrom .decode import _DOC\n"
    )
    assert private_imports(bad) == ["analyzer.verbs.compare._growth", "decode._DOC"]


def test_the_render_package_imports_nothing():
    tree = ast.parse((ANALYZER / "render" / "__init__.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
