"""The analyzer installs and runs without torch, the dashboard's libraries or
the test tools: dependencies are split by use.

A fresh virtual environment per test would cost a minute of installs, so the
"not installed" state is simulated: a meta-path finder in a subprocess makes
every import of a blocked package fail exactly as it does where the package
is absent (ModuleNotFoundError). An analyzer module that imported one of them,
even lazily on the path a verb takes, fails the verb.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "traces" / "example-ddp-w2"
EXAMPLE_SLOW = ROOT / "traces" / "example-ddp-w2-slow-rank1"

# What only the extras bring: trainer (torch, NVML), dashboard, test tools.
EXTRA_ONLY = ("torch", "pynvml", "streamlit", "plotly", "traceinsight", "hta", "pytest", "playwright")

_BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = {blocked!r}

    class _Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, _Absent())

    # Where a package is absent, importlib.util.find_spec answers None
    # rather than raising: the commands ask it before importing.
    import importlib.util
    _real_find_spec = importlib.util.find_spec

    def _find_spec(name, package=None):
        if name.split(".")[0] in BLOCKED:
            return None
        return _real_find_spec(name, package)

    importlib.util.find_spec = _find_spec
    """
)


def _run_without_extras(body: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = _BLOCKER.format(blocked=set(EXTRA_ONLY)) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_core_dependencies_exclude_every_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {d.split(">")[0].split("=")[0].split("[")[0].strip().lower() for d in project["dependencies"]}
    assert not core & {"torch", "streamlit", "plotly", "traceinsight", "pytest", "playwright", "nvidia-ml-py"}
    extras = project["optional-dependencies"]
    assert any(d.startswith("torch") for d in extras["train"])
    assert {d.split(">")[0] for d in extras["dashboard"]} >= {"streamlit", "plotly"}
    assert any(d.startswith("traceinsight") for d in extras["dev"])


def test_blocker_really_blocks(tmp_path: Path) -> None:
    # Guards the simulation itself: were the finder ineffective, the tests
    # below would pass whatever the analyzer imports.
    proc = _run_without_extras("import torch\n", tmp_path)
    assert proc.returncode != 0
    assert "No module named 'torch'" in proc.stderr


def test_analyzer_verbs_run_without_extras(tmp_path: Path) -> None:
    if not EXAMPLE.is_dir():
        pytest.skip(f"{EXAMPLE} missing")
    out = tmp_path / "report.json"
    body = f"""
    import sys
    from analyzer.cli import main
    from analyzer import analyze
    codes = [
        main(["report", {str(EXAMPLE)!r}, "--no-cache", "--json", {str(out)!r}]),
        main(["compare", {str(EXAMPLE)!r}, {str(EXAMPLE_SLOW)!r}, "--no-cache"]),
        main(["check", {str(EXAMPLE_SLOW)!r}, "--baseline", {str(EXAMPLE)!r}, "--no-cache"]),
        main(["suggest", {str(EXAMPLE)!r}, "--no-cache"]),
    ]
    run = analyze({str(EXAMPLE)!r}, cache=False)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in {set(EXTRA_ONLY) | {"reftrain", "dashboard"}!r})
    print("CODES", codes, "LEAKED", leaked, "RANKS", len(run.ranks))
    """
    proc = _run_without_extras(body, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("CODES"))
    codes = json.loads(line.split("CODES", 1)[1].split("LEAKED")[0])
    # report, compare, suggest succeed; check of the slow-rank run against
    # the clean one is a verdict (0, 1 or the inconclusive code), never the
    # 2 of an unusable input nor the 3 of a crash.
    assert codes[0] == 0 and codes[1] == 0 and codes[3] == 0, proc.stdout + proc.stderr[-2000:]
    assert codes[2] not in (2, 3), proc.stdout + proc.stderr[-2000:]
    assert "LEAKED []" in line, line
    assert "RANKS 2" in line
    assert json.loads(out.read_text())["ranks"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "from reftrain.cli import main\nraise SystemExit(main(['--nproc', '1', '--steps', '1']))",
            "reftrain: error: torch is not installed: pip install 'trainperf[train]' "
            "(on a CPU machine first: pip install torch==2.13.0)",
        ),
        (
            f"from dashboard.cli import main\nraise SystemExit(main([{str(ROOT / 'traces')!r}]))",
            "dashboard: streamlit, plotly not installed: pip install 'trainperf[dashboard]'",
        ),
    ],
)
def test_commands_without_their_extra_say_which_to_install(tmp_path: Path, body: str, expected: str) -> None:
    proc = _run_without_extras(body, tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [expected], proc.stderr[-2000:]
