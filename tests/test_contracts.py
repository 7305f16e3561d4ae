"""The import contracts of pyproject.toml ([tool.importlinter]; docs/architecture.md) hold, and catch a wrong import.

`make lint` runs them before the tests; here they run on the tree as it is, and on a
copy of the three packages with one deliberately wrong import each, which must
break the named contract and name the offending line.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (pip install 'trainperf[dev]')")


def _lint(root: Path) -> subprocess.CompletedProcess:
    # PYTHONPATH first: the copy's packages, not the editable install's, are the ones analyzed.
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")], cwd=root,
                          capture_output=True, text=True, timeout=300, env=env)


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


def test_the_tree_keeps_every_contract():
    done = _lint(REPO)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "Contracts: 7 kept, 0 broken." in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract", "named", "n_broken"),
    [
        ("analyzer/metrics/mfu.py", "import reftrain.config", "the analyzer imports neither the recorder, the trainer",
         "analyzer.metrics.mfu -> reftrain.config", 1),
        ("analyzer/ingest/locate.py", "import analyzer.metrics.overlap", "analyzer layers",
         "analyzer.ingest.locate -> analyzer.metrics.overlap", 1),
        ("dashboard/data.py", "import analyzer.ingest.parse", "the dashboard uses the analyzer's public modules only",
         "dashboard.data -> analyzer.ingest.parse", 1),
        # The run analysis draws nothing itself: a renderer imported there breaks its own contract (and the layers).
        ("analyzer/api.py", "import analyzer.render.html", "analyzer.api imports neither analyzer.verbs nor analyzer.render",
         "analyzer.api -> analyzer.render.html", 2),
        ("recorder/run.py", "import reftrain.config", "the recorder imports neither the trainer nor the dashboard",
         "recorder.run -> reftrain.config", 1),
    ],
)
def test_a_wrong_import_breaks_its_contract(tmp_path, module, line, contract, named, n_broken):
    root = _copy(tmp_path)
    _prepend(root / module, line)
    done = _lint(root)
    assert done.returncode == 1
    broken = done.stdout.split("Broken contracts", 1)[1]
    assert contract in broken and named in broken
    assert f"Contracts: {7 - n_broken} kept, {n_broken} broken." in done.stdout
