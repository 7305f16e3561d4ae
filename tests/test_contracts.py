"""The import contracts of pyproject.toml ([tool.importlinter]; docs/architecture.md) hold, and catch a wrong import.

`make lint` runs them before the tests; here they run on the tree as it is, and on a
copy of the four packages with one deliberately wrong import each, which must
break the named contract and name the offending line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"

needs_linter = pytest.mark.skipif(
    not LINT.exists(), reason="import-linter is not installed (pip install 'trainperf[dev]')"
)
CONTRACTS = 8


def _lint(root: Path) -> subprocess.CompletedProcess:
    # PYTHONPATH first: the copy's packages, not the editable install's, are the ones analyzed.
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run(
        [str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for pkg in ("analyzer", "recorder", "reftrain", "dashboard"):
        shutil.copytree(REPO / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def _prepend(path: Path, line: str) -> None:
    text = path.read_text()
    head, sep, rest = text.partition("from __future__ import annotations\n")
    path.write_text(head + sep + line + "\n" + rest if sep else line + "\n" + text)


def _contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_the_architecture_rules_are_contracts():
    """The join never imports a verb, and no two sibling modules of any package import each other in a circle."""
    contracts = _contracts()
    assert len(contracts) == CONTRACTS
    api = [c for c in contracts if c["type"] == "forbidden" and c["source_modules"] == ["analyzer.api"]]
    assert len(api) == 1 and api[0]["forbidden_modules"] == ["analyzer.verbs", "analyzer.render"]
    assert not api[0].get("allow_indirect_imports", False)
    acyclic = [c for c in contracts if c["type"] == "acyclic_siblings"]
    assert len(acyclic) == 1
    assert sorted(acyclic[0]["ancestors"]) == ["analyzer", "dashboard", "recorder", "reftrain"]
    assert "depth" not in acyclic[0]  # import-linter's default depth (10) reaches every module here


@needs_linter
def test_the_tree_keeps_every_contract():
    done = _lint(REPO)
    assert done.returncode == 0, done.stdout[-3000:]
    assert f"Contracts: {CONTRACTS} kept, 0 broken." in done.stdout


@needs_linter
@pytest.mark.parametrize(
    ("module", "line", "contract", "named", "broken"),
    [
        (
            "analyzer/metrics/mfu.py",
            "import reftrain.config",
            "the analyzer imports neither the recorder, the trainer",
            "analyzer.metrics.mfu -> reftrain.config",
            1,
        ),
        # An import against the layers between siblings closes a circle too (the metrics import ingest).
        (
            "analyzer/ingest/locate.py",
            "import analyzer.metrics.overlap",
            "analyzer layers",
            "analyzer.ingest.locate -> analyzer.metrics.overlap",
            2,
        ),
        (
            "dashboard/data.py",
            "import analyzer.ingest.parse",
            "the dashboard uses the analyzer's public modules only",
            "dashboard.data -> analyzer.ingest.parse",
            1,
        ),
        (
            "analyzer/api.py",
            "import recorder.run",
            "the analyzer imports neither the recorder",
            "analyzer.api -> recorder.run",
            1,
        ),
        (
            "recorder/run.py",
            "import reftrain.config",
            "the recorder imports neither the trainer nor the dashboard",
            "recorder.run -> reftrain.config",
            1,
        ),
        # analyzer.ingest.load imports the cache: the reverse import closes a circle of siblings.
        (
            "analyzer/ingest/cache.py",
            "import analyzer.ingest.load",
            "no import cycles between sibling modules",
            ".cache -> .load",
            1,
        ),
        # A verb in the join also breaks the layers, and closes a circle (the verbs import the join).
        (
            "analyzer/api.py",
            "import analyzer.verbs.printable",
            "analyzer.api imports neither analyzer.verbs nor analyzer.render",
            "analyzer.api -> analyzer.verbs.printable",
            3,
        ),
        # The run analysis draws nothing itself: a renderer imported there breaks its own contract, the
        # layers, and closes a circle (the renderers import the join).
        (
            "analyzer/api.py",
            "import analyzer.render.html",
            "analyzer.api imports neither analyzer.verbs nor analyzer.render",
            "analyzer.api -> analyzer.render.html",
            3,
        ),
    ],
)
def test_a_wrong_import_breaks_its_contract(tmp_path, module, line, contract, named, broken):
    root = _copy(tmp_path)
    _prepend(root / module, line)
    done = _lint(root)
    assert done.returncode == 1
    report = done.stdout.split("Broken contracts", 1)[1]
    assert contract in report and named in report
    assert f"Contracts: {CONTRACTS - broken} kept, {broken} broken." in done.stdout
