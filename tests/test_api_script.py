"""``analyze()`` from plain scripts, guarded or not.

The hazard: ``analyze()`` at the top level of a script without an
``if __name__ == "__main__":`` guard, on a folder of several files over
8 MB (so the parse runs in worker processes), can hang with repeated
"bootstrapping phase" tracebacks: importing the analyzer starts numpy's
threads, so workers start with forkserver, which imports the main
script again in each worker, which calls ``analyze()`` again. Each test
runs a real script in a subprocess with a timeout and checks its numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synth import KinetoTrace

from analyzer.ingest import jobs, load

REPO = Path(__file__).resolve().parent.parent
# A hang is the failure mode: generous for a loaded 2-core machine, far
# below "for ever". The analysis itself takes a few seconds.
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def big_folder(tmp_path_factory) -> Path:
    """3 ranks, uncompressed, over load.PARALLEL_MIN_BYTES together (so workers are used)."""
    folder = tmp_path_factory.mktemp("big")
    for r in range(3):
        t = KinetoTrace(rank=r, world_size=3)
        for s in range(4):
            t.step(s, s * 100_000, 100_000)
        for i in range(30_000):
            t.cpu_op(f"aten::op{i % 40}", (i * 13) % 400_000, 5 + r)
        t.write(folder / f"rank{r}.json", gz=False)
    assert sum(f.stat().st_size for f in folder.iterdir()) > load.PARALLEL_MIN_BYTES
    return folder


def _run(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "user_script.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )


_REPORT = """
    import json, sys
    from analyzer import analyze
    from analyzer.ingest import jobs
    from analyzer.ingest.load import load_traces
    traces = load_traces({folder!r}, cache=False)
    print(json.dumps({{
        "method": getattr(jobs, "start_method", lambda: "old code")(),
        "ranks": sorted(traces.ranks),
        "steps": {{r: len(t.steps) for r, t in traces.ranks.items()}},
        "events": {{r: len(t.events) for r, t in traces.ranks.items()}},
        "errors": [str(e) for e in traces.errors],
        "n_ranks": len(analyze({folder!r}, cache=False).ranks),
    }}))
"""


def _expected(folder: Path) -> dict:
    traces = load.load_traces(folder, cache=False, workers=1)
    return {
        "ranks": [0, 1, 2],
        "steps": {str(r): len(t.steps) for r, t in traces.ranks.items()},
        "events": {str(r): len(t.events) for r, t in traces.ranks.items()},
        "errors": [],
        "n_ranks": 3,
    }


def test_unguarded_script_finishes_with_the_right_numbers(big_folder: Path, tmp_path: Path) -> None:
    proc = _run(_REPORT.format(folder=str(big_folder)), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bootstrapping" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # numpy's threads are running and the script is unguarded: parsed in this process.
    assert out.pop("method") is None
    assert out == _expected(big_folder)
    assert out["steps"] == {"0": 4, "1": 4, "2": 4}


def test_guarded_script_uses_worker_processes(big_folder: Path, tmp_path: Path) -> None:
    body = textwrap.indent(textwrap.dedent(_REPORT.format(folder=str(big_folder))), "    ")
    script = "def main():\n" + body + "\n\nif __name__ == '__main__':\n    main()\n"
    proc = _run(script, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out.pop("method") == "forkserver"  # threaded parent: never forked
    assert out == _expected(big_folder)


def test_unguarded_call_through_a_function_is_detected(tmp_path: Path) -> None:
    """``main()`` called at the top level without a guard is just as unsafe."""
    script = """
        import numpy  # starts OpenBLAS threads: fork is ruled out
        from analyzer.ingest import jobs
        def main():
            print(jobs.start_method())
        main()
        if __name__ == "__main__":
            main()
    """
    proc = _run(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "forkserver"]


def test_single_threaded_script_forks(tmp_path: Path) -> None:
    """Fork never imports __main__ again, so even an unguarded script may use it."""
    proc = _run("from analyzer.ingest import jobs\nprint(jobs.start_method())\n", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "fork"


def test_repl_and_dash_c_use_worker_processes() -> None:
    """No main file (the REPL, ``python -c``, a notebook): nothing is imported again."""
    proc = subprocess.run(
        [sys.executable, "-c", "import numpy; from analyzer.ingest import jobs; print(jobs.start_method())"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "forkserver"


def test_main_guard_detection() -> None:
    import ast

    guard = ast.parse('if "__main__" == __name__:\n    pass').body[0].test
    assert jobs._is_main_test(guard)
    assert not jobs._is_main_test(ast.parse('if __name__ != "__main__":\n    pass').body[0].test)
    assert not jobs._is_main_test(ast.parse('if __name__ == "mod":\n    pass').body[0].test)
