"""The console script imports the parser before it forks its parse workers (analyzer.cli._one_blas_thread).

With OpenBLAS held to one thread, importing numpy starts no thread, so the
process can still fork its workers, which then inherit numpy and the parser
instead of importing them each. Only the console script's own process does
this; a caller of :func:`analyzer.cli.main` (a notebook, a test) and a user
who set ``OPENBLAS_NUM_THREADS`` keep their environment, and their workers
import the parser themselves. The golden reports through the console script
(tests/test_cli_arrow.py) take this path, so its figures are pinned there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# What the process holds when the parse workers start: numpy imported, the parser imported, the start
# method, OPENBLAS_NUM_THREADS; then the exit code.
PROBE = """
import os, sys
from analyzer import cli
from analyzer.ingest import jobs
seen = {}
init = jobs.ParseJobs.__init__
def record(self, *a, **k):
    seen.update(numpy="numpy" in sys.modules, parser="analyzer.ingest.parse" in sys.modules,
                method=jobs.start_method(), blas=os.environ.get("OPENBLAS_NUM_THREADS", "unset"))
    init(self, *a, **k)
jobs.ParseJobs.__init__ = record
code = cli.main(sys.argv[2:], own_process=sys.argv[1] == "own")
print(seen.get("numpy"), seen.get("parser"), seen.get("method"), seen.get("blas"), code)
"""


def _probe(how: str, blas: str | None, tmp_path: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if blas is not None:
        env["OPENBLAS_NUM_THREADS"] = blas
    run = REPO / "traces" / "example-ddp-w2"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, how, "report", str(run), "--no-cache", "--json", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-5:]  # after the command's own output


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and OpenBLAS's environment: Linux")
def test_console_process_forks_workers_with_the_parser_imported(tmp_path: Path) -> None:
    assert _probe("own", None, tmp_path) == ["True", "True", "fork", "1", "0"]
    assert (tmp_path / "r.json").is_file()


def test_main_called_in_process_leaves_numpy_and_the_environment_alone(tmp_path: Path) -> None:
    numpy, parser, _method, blas, code = _probe("caller", None, tmp_path)
    assert (numpy, parser, blas, code) == ("False", "False", "unset", "0")


def test_a_users_blas_threads_are_kept(tmp_path: Path) -> None:
    numpy, parser, _method, blas, code = _probe("own", "4", tmp_path)
    assert (numpy, parser, blas, code) == ("False", "False", "4", "0")
