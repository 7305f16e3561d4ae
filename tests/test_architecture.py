"""Shape rules of analyzer/ that neither import-linter nor ruff state: no function longer than
``MAX_FUNCTION_LINES`` (a longer one is several steps that deserve names)."""

from __future__ import annotations

import ast
from pathlib import Path

ANALYZER = Path(__file__).resolve().parent.parent / "analyzer"
# Lines from the ``def`` to the function's last line, docstring and comments included.
MAX_FUNCTION_LINES = 100


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``name (N lines)`` for each function or method in ``path`` longer than ``limit`` lines, nested ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found.append(f"{node.name} ({lines} lines)")
    return found


def test_no_function_in_the_analyzer_is_over_the_limit():
    found = {str(p.relative_to(ANALYZER)): long_functions(p) for p in sorted(ANALYZER.rglob("*.py"))}
    assert {name: fns for name, fns in found.items() if fns} == {}


def test_the_check_counts_every_line_of_a_function(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(99))
    code = f"def at_limit():\n{body}\n\nclass C:\n    def over(self):\n{body.replace('    ', '        ')}        return 1\n"
    src = tmp_path / "m.py"
    src.write_text(code)
    # at_limit: the def line and 99 statements, 100 lines; over: 101.
    assert long_functions(src) == ["over (101 lines)"]


def test_mypy_exempts_no_module():
    """mypy checks every module of the four packages: no override may switch its errors off (tomllib reads
    pyproject.toml as mypy does); the strict metrics layer is a stricter override, not an exemption."""
    import tomllib

    config = tomllib.loads((ANALYZER.parent / "pyproject.toml").read_text())["tool"]["mypy"]
    assert sorted(config["files"]) == ["analyzer", "dashboard", "recorder", "reftrain"]
    exempt = [o["module"] for o in config.get("overrides", []) if o.get("ignore_errors")]
    assert exempt == []


def _recipes() -> str:
    text = (ANALYZER.parent / "docs" / "architecture.md").read_text()
    start = text.index("## Recipes")
    return text[start : text.index("\n## ", start + 1) if "\n## " in text[start + 1 :] else len(text)]


def test_the_recipes_name_files_that_exist():
    """Every concrete path docs/architecture.md's recipes send a reader to exists (placeholders such as
    ``rules_<topic>.py`` aside), so the recipes follow the code when files move."""
    import re

    named = set(re.findall(r"`((?:analyzer|tests|bench|docs|recorder|reftrain|dashboard)/[\w/.<>-]+)`", _recipes()))
    named |= {f"analyzer/{p}" for p in re.findall(r"`((?:metrics|ingest|verbs|render)/[\w/.<>-]+)`", _recipes())}
    concrete = {p.rstrip("/") for p in named if "<" not in p}
    assert len(concrete) > 20  # the scan reads the recipes, not an empty section
    missing = sorted(p for p in concrete if not (ANALYZER.parent / p).exists())
    assert missing == []


def test_the_recipes_name_functions_that_exist():
    """The functions and constants the recipes name as ``module.name`` exist in the analyzer's module of that
    name (``rankmap.MAP_VERSION``, ``engine.RULE_PART``, ``decode.META_KEYS``, ...)."""
    import importlib
    import re

    modules = {
        ".".join(f.relative_to(ANALYZER.parent).with_suffix("").parts).removesuffix(".__init__")
        for f in ANALYZER.rglob("*.py")
    }
    checked = []
    for module, name in set(re.findall(r"`([a-z_]+(?:\.[a-z_]+)*)\.([A-Za-z_]+)`", _recipes())):
        if name in ("py", "toml") or module == "html":  # a file name; the standard library's html.escape
            continue
        found = sorted(m for m in modules if m == module or m.endswith("." + module))
        assert found, f"{module}.{name}: no module {module} in analyzer/"
        assert any(hasattr(importlib.import_module(m), name) for m in found), f"{module}.{name} in {found}"
        checked.append(f"{module}.{name}")
    assert len(checked) >= 10, checked
