"""docs/ci.md's GitHub Actions workflow, run from the document in a venv with the core install only.

The workflow is read from docs/ci.md (its fenced YAML, parsed with yaml) and its ``run:`` steps
are executed in order, as the runner executes them (``bash --noprofile --norc -eo pipefail``,
``GITHUB_ACTIONS=true``, ``GITHUB_STEP_SUMMARY`` set), in a fresh venv where
``pip install <this checkout>`` installed the project with no extras (no plotly, no streamlit,
no torch). Only what a CI runner provides is substituted, each checked against the document:

* ``uses:`` steps (checkout, setup-python, upload-artifact) are the runner's; the artifact
  step's paths must exist at the end;
* the base branch's worktree (``git worktree add``) needs a pull request's remote;
* the install step: the test's own venv build stands in for it, after checking that the
  document installs the project without extras (torch there is for training only);
* the training step (minutes on a runner, and torch): runs are written under the run names and
  runs folder the step's script writes.

Every other ``run:`` step (Report, Gate) runs as written, on two pull requests' worth of runs:
three runs of the same code (synthetic trace folders with exact, identical steps: the gate
passes, exit 0, every JUnit case passing) and the committed reftrain runs in ``traces/``, the
candidate with rank 1 slowed down on purpose (exit 1, ``<failure>`` cases). The JUnit files
are validated against pytest's xunit2 schema (tests/data/junit-10.xsd).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import xml.etree.ElementTree as ET
from functools import partial
from pathlib import Path
from typing import Callable

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from test_ci_artifacts import _cases, _outcome, _validate
from test_compare import write_run

REPO = Path(__file__).resolve().parent.parent
CI_DOC = REPO / "docs" / "ci.md"
EXAMPLES = REPO / "traces"
BASE_RUN, SLOW_RUN = EXAMPLES / "example-ddp-w2", EXAMPLES / "example-ddp-w2-slow-rank1"
SHELL = ["bash", "--noprofile", "--norc", "-eo", "pipefail"]  # GitHub's default `run` shell on Linux
INSTALL_TIMEOUT_S = 240


def workflow() -> dict:
    """The workflow of docs/ci.md: its fenced YAML block that names a .github/workflows file."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", CI_DOC.read_text(), flags=re.S | re.M)
    found = [b for b in blocks if b.startswith("# .github/workflows/")]
    assert len(found) == 1, f"docs/ci.md: {len(found)} workflow blocks"
    return yaml.safe_load(found[0])


def _is_worktree(script: str) -> bool:
    return script.startswith("git worktree add")


def _is_install(script: str) -> bool:
    return "pip install" in script


def _is_train(script: str) -> bool:
    return "-m reftrain" in script


def test_the_documented_workflow_is_what_this_test_runs():
    """Fast and always on: the document's steps are the ones the slow test reads and substitutes."""
    steps = workflow()["jobs"]["gate"]["steps"]
    scripts = [s["run"] for s in steps if "run" in s]
    assert [sum(map(f, scripts)) for f in (_is_worktree, _is_install, _is_train)] == [1, 1, 1]
    install = next(s for s in scripts if _is_install(s)).splitlines()
    # The project itself with no extras: HTML, JSON and JUnit come from the core install.
    assert [line for line in install if "install -e" in line] == ["python -m pip install -e ."]
    assert all("[" not in line for line in install)


def _core_venv(root: Path) -> Path:
    """A venv holding this checkout installed with no extras; skips with the reason when it cannot be built."""
    env_dir = root / "core-venv"
    try:
        venv.EnvBuilder(with_pip=True).create(env_dir)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot create a venv here: {exc}")
    # --no-compile: the bytecode of pandas and scipy is most of an install's time, and is written on first import.
    cmd = [str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile", str(REPO)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip install of the core took over {INSTALL_TIMEOUT_S} s (registry unreachable?)")
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        pytest.skip(f"cannot install the core into a fresh venv (network or registry): {' | '.join(tail)}")
    return env_dir


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory) -> Path:
    env_dir = _core_venv(tmp_path_factory.mktemp("ci-workflow"))
    # The point of the test: the core install has none of the extras' packages.
    probe = "import importlib.util as u; print([m for m in ('plotly', 'streamlit', 'torch') if u.find_spec(m)])"
    shown = subprocess.run([str(env_dir / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]"
    return env_dir


def _place_runs(
    train_script: str, workspace: Path, base: Callable[[Path], object], cand: Callable[[Path], object]
) -> None:
    """What the training step leaves: the runs folder and run names its script writes (baselines are the
    runs trained in the base branch's checkout, ``cd ../base``), each written by ``base`` or ``cand``."""
    (runs_dir,) = set(re.findall(r"--runs-dir \$PWD/([\w./-]+)", train_script))
    named = [(line, re.search(r"--run-name ([\w.-]+)", line)) for line in train_script.splitlines()]
    names = [(m.group(1), "cd ../base" in line) for line, m in named if m]
    assert sorted(is_base for _, is_base in names) == [False, True, True], names  # one candidate, two baselines
    for name, is_base in names:
        (base if is_base else cand)(workspace / runs_dir / name)


def _run_steps(
    core: Path,
    workspace: Path,
    base: Callable[[Path], object],
    cand: Callable[[Path], object],
    *,
    only: str | None = None,
) -> dict[str, tuple[int, str]]:
    """The workflow's steps in order (module doc); returns {step name: (exit code, stdout)} of those run."""
    steps = workflow()["jobs"]["gate"]["steps"]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env |= {
        "PATH": f"{core / 'bin'}:{os.environ['PATH']}",
        "VIRTUAL_ENV": str(core),
        "GITHUB_ACTIONS": "true",
        "GITHUB_STEP_SUMMARY": str(workspace / "step-summary.md"),
        "GITHUB_WORKSPACE": str(workspace),
        "GITHUB_BASE_REF": "main",
    }
    results = {}
    for step in steps:
        script = step.get("run")
        if script is None or _is_worktree(script) or _is_install(script):
            continue
        if _is_train(script):
            _place_runs(script, workspace, base, cand)
            continue
        if only is not None and step["name"] != only:
            continue
        done = subprocess.run(SHELL + ["-c", script], cwd=workspace, env=env, capture_output=True, text=True)
        results[step["name"]] = (done.returncode, done.stdout + done.stderr)
    return results


def _artifact_paths() -> list[str]:
    steps = workflow()["jobs"]["gate"]["steps"]
    (upload,) = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    return upload["with"]["path"].split()


@pytest.mark.slow
def test_the_documented_workflow_runs_green_in_a_core_venv(core_venv, tmp_path):
    green, red = tmp_path / "green", tmp_path / "red"
    green.mkdir()
    red.mkdir()

    # Three runs of the same code: synthetic 2-rank trace folders with exact, identical step times (the
    # two committed runs cannot make this case: three copies of one run pool two identical baselines, and the
    # gate's interpolated quantile of the pooled steps moves 5.1 % from the candidate's: inconclusive).
    # Within bounds: every step the job runs exits 0.
    results = _run_steps(core_venv, green, write_run, write_run)
    assert set(results) == {"Report", "Gate on MFU"}
    for name, (code, out) in results.items():
        assert code == 0, f"{name}: exit {code}\n{out[-3000:]}"
    gate_out = results["Gate on MFU"][1]
    assert "analyzer check: PASS" in gate_out and "::notice" in gate_out
    for rel in _artifact_paths():
        assert (green / rel).exists(), f"the artifact step uploads {rel}, which the job did not write"
    check = json.loads((green / "perf-check.json").read_text())
    assert check["verdict"] == "pass" and check["drop"] == 0.0 and check["n_baselines"] == 2
    report = json.loads((green / "perf-report.json").read_text())
    assert report["schema"] == "analyzer.report/1" and report["path"] == "runs/cand" and len(report["ranks"]) == 2
    junit = green / "perf-check.xml"
    _validate(junit)
    assert [_outcome(c) for c in _cases(junit)] and {_outcome(c) for c in _cases(junit)} == {"passed"}
    assert "PASS" in (green / "perf-check.html").read_text()
    assert (green / "perf-report.html").read_text().lstrip().lower().startswith("<!doctype html")
    assert "analyzer check: within bounds" in (green / "step-summary.md").read_text()  # the job page's summary

    # The committed reftrain runs: a candidate with rank 1 delayed 300 ms per step against two copies of the
    # normal run. The gate step fails the job with exit 1.
    base, cand = partial(shutil.copytree, BASE_RUN), partial(shutil.copytree, SLOW_RUN)
    code, out = _run_steps(core_venv, red, base, cand, only="Gate on MFU")["Gate on MFU"]
    assert code == 1, out[-3000:]
    assert "analyzer check: REGRESSION" in out and "::error" in out
    junit = red / "perf-check.xml"
    _validate(junit)
    root = ET.parse(junit).getroot()
    assert [_outcome(c) for c in _cases(junit)][0] == "failure" and root.get("failures") != "0"
    assert json.loads((red / "perf-check.json").read_text())["verdict"] == "regression"
    assert "REGRESSION" in (red / "perf-check.html").read_text()
