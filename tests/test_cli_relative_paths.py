"""A folder of traces named by a relative path, as users type it in a shell (`analyzer report traces/`).

The CLI parses uncached traces in early workers (analyzer.ingest.jobs), which key files by
absolute path; the analysis names them as given. With two or more ranks the rank's part was
then looked up under the absolute name and not found: `analyzer report tr` of the example
run's two traces exited 3 (KeyError in analyzer/api.py) until the parsed traces were named as
the analysis names them. Nothing here is timed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ANALYZER = Path(sys.executable).with_name("analyzer")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    shutil.copytree(
        REPO / "traces" / "example-ddp-w2" / "traces", tmp_path / "tr", ignore=shutil.ignore_patterns(".analyzer-cache")
    )
    assert len(list((tmp_path / "tr").glob("rank*.json.gz"))) == 2
    return tmp_path


def _run(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ANALYZER), *argv], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "no-cache"])
def test_a_relative_folder_of_ranks_reports_as_the_absolute_one(folder: Path, cache: bool) -> None:
    flags = [] if cache else ["--no-cache"]
    rel = _run(folder, "report", "tr", "--json", "rel.json", *flags)
    assert rel.returncode == 0, rel.stderr
    shutil.rmtree(folder / "tr" / ".analyzer-cache", ignore_errors=True)  # the absolute run parses cold too
    absolute = _run(folder, "report", str(folder / "tr"), "--json", "abs.json", *flags)
    assert absolute.returncode == 0, absolute.stderr
    a, b = (json.loads((folder / name).read_text()) for name in ("rel.json", "abs.json"))
    for doc in (a, b):
        doc.pop("path"), doc["generator"].pop("created_at", None)
    assert a == b
    assert [r["rank"] for r in a["ranks"]] == [0, 1]


def test_compare_and_check_take_relative_folders(folder: Path) -> None:
    shutil.copytree(folder / "tr", folder / "tr2")
    done = _run(folder, "compare", "tr", "tr2")
    assert done.returncode == 0, done.stderr
    gate = _run(folder, "check", "tr2", "--baseline", "tr")
    assert gate.returncode in (0, 2, 4) and "internal error" not in gate.stderr, gate.stderr
