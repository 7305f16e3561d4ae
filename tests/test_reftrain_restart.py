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

from test_reftrain_faults import assert_no_rank_left

from reftrain import checkpoint
from reftrain.faults import CRASH_EXIT_CODE

pytestmark = pytest.mark.slow

# These jobs really restart (torchelastic relaunching both ranks). They were opt-in
# while a restarted attempt's gloo rendezvous read the dead attempt's keys from the
# rendezvous store torch shares across attempts (3 of 8 jobs failed or hung); with a
# store per attempt (reftrain/cli.py, reftrain/parallel.py) 34 of 34 restarted attempts
# came up, 8 of 8 with the per-attempt PrefixStore alone (docs/reftrain.md, "Restarts"),
# so they run by default and allow exactly the one restart the one crash needs.

TIMEOUT_S = 300  # a busy 2-core machine starts 3 torch processes per attempt
BASE = [
    "--nproc",
    "2",
    "--preset",
    "tiny",
    "--device",
    "cpu",
    "--steps",
    "6",
    "--checkpoint-every",
    "2",
    "--set",
    "data.num_workers=0",
    "--set",
    "profile.enabled=false",
]


def reftrain(runs: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            [sys.executable, "-m", "reftrain", *BASE, "--runs-dir", str(runs), "--run-name", name, *args],
            cwd=runs,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            start_new_session=True,
        )
    finally:
        if (runs / name).is_dir():
            assert_no_rank_left(runs / name)


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

    One crash, --max-restarts 1: exactly two attempts, the second completing.
    """
    m = json.loads((run / "run.json").read_text())
    assert m["status"] == "completed" and m["max_restarts"] == 1
    first, second = m["attempts"]
    assert (first["attempt"], first["status"], first["resumed_from_step"]) == (0, "failed", 0)
    assert (second["attempt"], second["status"], second["exit_codes"]) == (1, "completed", [0, 0])
    times = [t for a in m["attempts"] for t in (a["start_time"], a["end_time"])]
    assert times == sorted(times)
    return m


def test_crash_restarts_from_the_checkpoint_and_matches_bit_for_bit(runs: Path, baseline: dict) -> None:
    proc = reftrain(runs, "crash", "--crash-rank", "1", "--crash-step", "3", "--max-restarts", "1")
    must_succeed(proc)
    run = runs / "crash"
    m = _restarted(run)
    assert m["attempts"][-1]["resumed_from_step"] == 2  # checkpoints/step2: the last one before the crash
    assert m["files"]["checkpoints"] == ["checkpoints/step2", "checkpoints/step4", "checkpoints/step6"]
    assert any(rel.startswith("metrics/attempt") for rel in m["files"]["metrics"])
    # Exact equality, not a tolerance: same data (a function of seed, rank, step), same state.
    assert losses(run) == baseline
    _goodput_is_reported(run)


def _goodput_is_reported(run: Path) -> None:
    """The restarted run's goodput is shown (report) and its parts follow
    their definitions (docs/rundir.md "Restarts and goodput") on the run's own records."""
    from analyzer import analyze

    m = json.loads((run / "run.json").read_text())
    records = [json.loads(line) for rel in m["files"]["metrics"] for line in (run / rel).read_text().splitlines()]
    resumed = m["attempts"][1]["resumed_from_step"]
    # Recomputed: the steps attempt 0 ran that attempt 1 ran again (from its resume step on), and
    # their time at the slowest rank; known from the records alone, independent of the analyzer.
    redone = {r["step"] for r in records if r["attempt"] == 0 and r["step"] >= resumed}
    redone_s = (
        sum(max(r["step_time_ms"] for r in records if r["attempt"] == 0 and r["step"] == s) for s in redone) / 1e3
    )
    g = analyze(run).goodput()
    assert g is not None and g.attempts == 2 and g.recomputed_steps == len(redone) >= 1
    assert abs(g.lost_s["recomputed"] - redone_s) < 1e-6
    assert g.lost_s["restarts"] > 0  # the relaunch between the attempts
    assert abs(g.productive_s + sum(g.lost_s.values()) - g.wall_s) < 1e-6  # the parts add up to the wall time
    text = subprocess.run(
        [str(Path(sys.executable).with_name("analyzer")), "report", str(run), "--no-cache"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert text.returncode == 0 and f"Goodput: {100 * g.goodput:.1f}%" in text.stdout and "2 attempt(s)" in text.stdout


def test_a_save_killed_before_publishing_is_never_loaded(runs: Path, baseline: dict) -> None:
    proc = reftrain(
        runs, "crash_in_save", "--crash-rank", "1", "--crash-step", "4", "--crash-in-save", "--max-restarts", "1"
    )
    must_succeed(proc)
    assert "rank 1 dies inside the save of checkpoint step4" in proc.stderr
    m = _restarted(runs / "crash_in_save")
    # Rank 1 died in the save of step 4 after DCP wrote its data: step4 was never
    # published, so the restart resumed from step 2 (and saved step 4 itself).
    assert m["attempts"][-1]["resumed_from_step"] == 2
    assert losses(runs / "crash_in_save") == baseline


def test_a_crash_after_the_last_checkpoint_completes_the_job(runs: Path, baseline: dict) -> None:
    """Rank 1 dies after step 5 and the final checkpoint (step6), before the run is recorded
    complete: the restart finds nothing left to run and completes the run, no step redone."""
    proc = reftrain(runs, "crash_at_end", "--crash-rank", "1", "--crash-step", "6", "--max-restarts", "1")
    must_succeed(proc)
    m = _restarted(runs / "crash_at_end")
    assert m["attempts"][1]["resumed_from_step"] == 6
    assert not any(
        rel.startswith("metrics/attempt1") and (runs / "crash_at_end" / rel).read_text()
        for rel in m["files"]["metrics"]
    )
    assert losses(runs / "crash_at_end") == baseline


def test_a_hung_rank_is_killed_and_the_job_restarts_bit_for_bit(runs: Path, baseline: dict) -> None:
    """The watchdog (3 s) names rank 1, kills the attempt; torchelastic restarts it from step 2."""
    proc = reftrain(
        runs,
        "hang_restart",
        "--hang-rank",
        "1",
        "--hang-step",
        "3",
        "--max-restarts",
        "1",
        "--set",
        "watchdog.timeout_s=3",
        "--set",
        "watchdog.interval_s=0.5",
    )
    must_succeed(proc)
    m = json.loads((runs / "hang_restart" / "run.json").read_text())
    assert m["status"] == "completed" and [h["rank"] for h in m["hangs"]] == [1]
    first, second = m["attempts"]
    assert (first["status"], second["status"], second["resumed_from_step"]) == ("hung", "completed", 2)
    assert first["cause"].startswith("hang: rank 1 made no progress")
    assert losses(runs / "hang_restart") == baseline


def test_each_attempt_reads_its_own_keys_from_a_shared_store() -> None:
    """The rendezvous store torchelastic shares across attempts: attempt 1's PrefixStore
    does not see attempt 0's keys (what made a restarted gloo rendezvous dial a dead rank)."""
    from datetime import timedelta

    import torch.distributed as dist

    from reftrain.parallel import _attempt_store

    server = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=10))
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port)}
    saved = {k: os.environ.get(k) for k in [*env, "TORCHELASTIC_RESTART_COUNT"]}
    try:
        os.environ.update(env, TORCHELASTIC_RESTART_COUNT="0")
        _attempt_store(0, 1, timedelta(seconds=10)).set("0/rank_1", "dead-address")
        os.environ["TORCHELASTIC_RESTART_COUNT"] = "1"
        again = _attempt_store(0, 1, timedelta(seconds=10))
        assert again.check(["0/rank_1"]) is False
        assert server.check(["reftrain/attempt0/0/rank_1"]) is True
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
        assert _attempt_store(0, 1, timedelta(seconds=10)) is None  # a store per attempt already: env://
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_without_restarts_the_crash_fails_the_run(runs: Path) -> None:
    proc = reftrain(runs, "no_restart", "--crash-rank", "1", "--crash-step", "3")
    assert proc.returncode == 1, proc.stderr[-2000:]
    m = json.loads((runs / "no_restart" / "run.json").read_text())
    assert m["status"] == "failed" and len(m["attempts"]) == 1
    assert m["attempts"][0]["status"] == "failed" and CRASH_EXIT_CODE in m["attempts"][0]["exit_codes"]
    # The run's error is the rank that died first, not rank 0's consequence of it (its collective
    # with the dead rank failed: gloo's "Connection reset/closed by peer"), which is kept as secondary.
    assert m["error"] == f"rank 1 exited with status {CRASH_EXIT_CODE}"
    assert f"reftrain: error: rank 1 exited with status {CRASH_EXIT_CODE}" in proc.stderr
    assert m["attempts"][0]["cause"] == m["error"]
    (secondary,) = m["secondary_errors"]
    assert secondary.startswith("rank 0")


def test_find_checkpoint_skips_an_unpublished_save(tmp_path: Path) -> None:
    """A save killed before its rename leaves checkpoints/.step{K}.tmp: never a candidate."""
    for name in ("step2", ".step4.tmp"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        (tmp_path / "checkpoints" / name / ".metadata").write_bytes(b"")
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step2"
    assert checkpoint.latest_checkpoint(tmp_path / "nothing") is None
