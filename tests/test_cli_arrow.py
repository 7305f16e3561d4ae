"""The console script keeps pyarrow out of its process (analyzer.cli._without_arrow) without changing a figure.

pandas backs text columns with Arrow when pyarrow is importable and with
Python strings when it is not; the analyzer's reports must not depend on
which. The golden reports are computed in this (pytest) process, pyarrow
loaded; here the same inputs go through the console script in a process of
its own, where pandas runs without it, and must match the goldens exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_golden_reports import CASES, WITH_CRITICAL_PATH, differences, golden_path, masked

# Which modules a console-script process ends with: pyarrow None (blocked), absent, or a module.
PROBE = """
import sys
from analyzer import cli
code = cli.main(sys.argv[1:], own_process=True)
entry = sys.modules.get("pyarrow", "absent")
print(code, "blocked" if entry is None else "absent" if entry == "absent" else "loaded")
"""


def _probe(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-2:]  # after the command's own output


@pytest.mark.parametrize("name", list(CASES))
def test_console_report_without_arrow_matches_golden(name: str, tmp_path: Path) -> None:
    base, sub = CASES[name]
    if not base.is_dir():
        pytest.skip(f"{base} is absent (the shared sample traces are only on the project's CI and dev machines)")
    out = tmp_path / "report.json"
    # `python -m analyzer.cli` runs console_main, as the installed `analyzer` script does.
    done = subprocess.run(
        [sys.executable, "-m", "analyzer.cli", "report", str(base / sub), "--no-cache", "--json", str(out)]
        + (["--critical-path"] if name in WITH_CRITICAL_PATH else []),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    diffs = differences(json.loads(golden_path(name).read_text()), masked(json.loads(out.read_text())))
    assert not diffs, f"without pyarrow the report of {sub} differs at {len(diffs)} place(s):\n  " + "\n  ".join(
        diffs[:25]
    )


def test_report_process_blocks_arrow_and_export_keeps_it(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    from tests.conftest import REPO

    run = REPO / "traces" / "example-ddp-w2"
    assert _probe("report", str(run), "--no-cache", "--json", str(tmp_path / "r.json")) == ["0", "blocked"]
    # Parquet needs Arrow: export keeps it importable and writes the files.
    code, arrow = _probe("export", str(run), "--no-cache", "--to", "parquet", str(tmp_path / "pq"))
    assert (code, arrow) == ("0", "loaded")
    written = list((tmp_path / "pq").iterdir())
    assert written and all(p.suffix == ".parquet" for p in written)
    # An interpreter that imported pandas already (a notebook, a test calling main) is left as it is.
    done = subprocess.run(
        [sys.executable, "-c", "import pandas\n" + PROBE, "report", str(run), "--no-cache"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.stdout.split()[-2:] == ["0", "loaded"], done.stderr
