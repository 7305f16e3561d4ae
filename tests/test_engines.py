"""The per-rank map on both engines (analyzer/engines.py, docs/loading.md "Engines").

The report must not depend on where the map ran: the same folders are
analyzed on the local engine and on a local Ray instance and their whole
report JSON compared. Ray is an optional extra; without it ``--engine ray``
is one error line. The Ray tests start one local instance for the module
(about 10 s on 2 cores) and shut it down after, so no later test runs with
Ray's threads in the pytest process.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.api import analyze
from analyzer.errors import AnalyzerError
from tests.test_scale_rundir import make_run_dir

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "traces" / "example-ddp-w2"
SHARED_NCCL = REPO.parent / "shared" / "traces" / "hta-samples"


def _report(a) -> str:
    return json.dumps(a.to_json(), sort_keys=True, default=str)


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "analyzer.cli", *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=600
    )


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray instance for the module, started as the engine starts it (the CLI test
    starts its own in a subprocess)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'trainperf[ray]')")
    # ray.init() installs its own SIGTERM handler in the driver and ray.shutdown() leaves it
    # there: put the suite's back at once, or every process forked later inherits it.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    try:
        yield ray
    finally:
        ray.shutdown()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _bad_and_good(tmp_path: Path) -> Path:
    """A trace folder of two good ranks (the example run's traces) and a truncated third."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    for i, trace in enumerate(sorted(EXAMPLE.glob("traces/**/rank*.json.gz"))[:2]):
        (folder / f"rank{i}.pt.trace.json.gz").write_bytes(trace.read_bytes())
    whole = gzip.decompress((folder / "rank0.pt.trace.json.gz").read_bytes())
    (folder / "rank2.pt.trace.json.gz").write_bytes(gzip.compress(whole[: len(whole) // 2]))
    return folder


@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'trainperf[ray]')"
)
def test_cli_on_ray_names_the_straggler_of_a_generated_run(tmp_path):
    """``analyzer report --engine ray`` on a run directory generated as in tests/test_scale_rundir.py
    (clock offsets of +-100 ms hide a 60 ms straggler), in a subprocess with its own Ray instance.
    256 ranks, not 1,024: Ray's workers run at a lower priority, and beside other work on 2 cores
    1,024 ranks took minutes; the 1,024-rank figures are in docs/scale.md and docs/loading.md.
    First in the file, so no other Ray instance of this module is running beside it."""
    run = tmp_path / "w256"
    make_run_dir(run, world=256, straggler=200)
    out = tmp_path / "report.json"
    done = _cli("report", str(run), "--engine", "ray", "--no-cache", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # Ray's own start-up notices stay off our stderr
    doc = json.loads(out.read_text())
    assert doc["run"]["world_size"] == 256
    assert doc["stragglers"]["ranks"] == [200]


def test_ray_gives_the_local_report_on_a_run_dir_and_a_folder_with_a_bad_file(ray_instance, tmp_path):
    local = analyze(EXAMPLE, cache=False)
    on_ray = analyze(EXAMPLE, cache=False, engine="ray")
    assert ray_instance.is_initialized()
    assert _report(on_ray) == _report(local)
    assert len(local.ranks) == 2 and local.mfu.median > 0  # a real analysis, not two empty ones
    mixed = _bad_and_good(tmp_path)
    local, on_ray = analyze(mixed, cache=False), analyze(mixed, cache=False, engine="ray")
    assert [str(e) for e in on_ray.errors] == [str(e) for e in local.errors]
    assert len(local.errors) == 1 and "rank2.pt.trace.json.gz" in str(local.errors[0])
    assert _report(on_ray) == _report(local)


def test_ray_gives_the_local_report_on_a_shared_nccl_trace(ray_instance):
    folder = SHARED_NCCL / "nccl_parser_config"
    if not folder.is_dir():
        pytest.skip(f"{folder}: shared HTA samples not present (only in the project's CI and workspace)")
    local = analyze(folder, cache=False)
    assert local.errors == [] and local.ranks[0].n_steps > 0
    assert _report(analyze(folder, cache=False, engine="ray")) == _report(local)


def test_ray_address_needs_engine_ray():
    done = _cli("report", str(EXAMPLE), "--ray-address", "auto")
    assert done.returncode == 2 and "--ray-address needs --engine ray" in done.stderr


def test_unknown_engine_in_the_api_is_one_error():
    with pytest.raises(AnalyzerError, match="unknown engine 'spark'"):
        analyze(EXAMPLE, cache=False, engine="spark")


def test_without_ray_engine_ray_is_one_error_line(tmp_path):
    # sys.modules["ray"] = None makes `import ray` fail as it does where Ray is not installed.
    code = (
        "import sys; sys.modules['ray'] = None; from analyzer.cli import main; "
        f"sys.exit(main(['report', {str(EXAMPLE)!r}, '--engine', 'ray', '--no-cache']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "analyzer: error: --engine ray needs Ray, which is not installed (pip install 'trainperf[ray]')"
    ]
