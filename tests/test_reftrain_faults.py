"""Preemption, hang detection and asynchronous checkpoints of `reftrain --nproc 2`
(docs/reftrain.md "Fault tolerance"), with real signals and injected faults.

Tiny runs on 2 CPU gloo ranks; each job is a subprocess bounded by a timeout,
in its own session, and every test checks that no rank process outlives it
(the ranks' pids come from their heartbeat files). Timing is judged only
against bounds far beyond any load (see each test).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reftrain import checkpoint

pytestmark = pytest.mark.slow

TIMEOUT_S = 240  # a busy 2-core machine starts 3 torch processes per job
BASE = ["--nproc", "2", "--preset", "tiny", "--device", "cpu", "--set", "data.num_workers=0",
        "--set", "profile.enabled=false"]


def command(runs: Path, name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "reftrain", *BASE, "--runs-dir", str(runs), "--run-name", name, *args]


def rank_pids(run: Path) -> list[int]:
    pids = []
    for f in (run / "heartbeat").glob("rank*.json"):
        try:
            pids.append(json.loads(f.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            pass
    return pids


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.split(") ", 1)[1][0] != "Z"


def assert_no_rank_left(run: Path) -> None:
    """Every rank process of the run has exited (killed here, then failed, if not)."""
    deadline = time.monotonic() + 10
    left = [p for p in rank_pids(run) if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"rank processes {left} of {run.name} outlived the job"


def reftrain(runs: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(command(runs, name, *args), cwd=runs, capture_output=True, text=True,
                              timeout=TIMEOUT_S, start_new_session=True)
    finally:
        if (runs / name).is_dir():
            assert_no_rank_left(runs / name)
    return proc


def must_succeed(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"reftrain failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def losses(run: Path) -> dict[tuple[int, int], float]:
    """(rank, step) -> loss, the last attempt's record where a step was run twice."""
    m = json.loads((run / "run.json").read_text())
    out: dict[tuple[int, int], float] = {}
    for rel in m["files"]["metrics"]:
        for line in (run / rel).read_text().splitlines():
            r = json.loads(line)
            out[(r["rank"], r["step"])] = r["loss"]
    return out


def manifest(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fault_runs")


# ---------------------------------------------------------------------------
# Preemption: SIGTERM finishes the step, saves, records `preempted`; resume is bit-exact
# ---------------------------------------------------------------------------

# 40 ms of sleep per step in the data source: 40 steps take >= 1.6 s, so the
# SIGTERM sent once step 2 is recorded lands with >= 1.4 s of steps still to run
# (no load makes a sleep shorter). The losses do not depend on the delay.
PREEMPT = ["--steps", "40", "--set", "data.delay_ms=40"]


def test_sigterm_preempts_saves_and_resumes_bit_for_bit(runs: Path) -> None:
    must_succeed(reftrain(runs, "preempt_baseline", *PREEMPT))
    baseline = losses(runs / "preempt_baseline")
    assert len(baseline) == 80

    run = runs / "preempted"
    proc = subprocess.Popen(command(runs, "preempted", *PREEMPT), cwd=runs, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        first = run / "metrics" / "rank0.jsonl"
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if first.is_file() and len(first.read_text().splitlines()) >= 3:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be preempted"
        os.kill(proc.pid, signal.SIGTERM)  # the launcher, as a scheduler would: the agent forwards it
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        assert_no_rank_left(run)
    assert proc.returncode == 0, f"{proc.returncode}\n{out[-2000:]}\n{err[-2000:]}"
    m = manifest(run)
    assert m["status"] == "preempted" and len(m["attempts"]) == 1
    a = m["attempts"][0]
    assert a["status"] == "preempted" and "SIGTERM" in a["cause"] and a["exit_codes"] == [0, 0]
    done = {s for (_, s) in losses(run)}
    k = max(done) + 1
    assert done == set(range(k)) and 3 <= k < 40  # stopped at a step boundary, mid-way
    assert m["files"]["checkpoints"] == [f"checkpoints/step{k}"]  # the preemption's own save
    assert [s["step"] for s in m["checkpoint_saves"]] == [k]
    assert "preempted" in out

    must_succeed(reftrain(runs, "resumed", "--resume", str(run)))
    r = manifest(runs / "resumed")
    assert r["status"] == "completed" and r["start_step"] == k
    # Exact equality, not a tolerance: same data (a function of seed, rank, step), same state.
    assert losses(run) | losses(runs / "resumed") == baseline


# ---------------------------------------------------------------------------
# Hang: the watchdog names the hung rank within the timeout plus 10 s, with stacks
# ---------------------------------------------------------------------------

HANG_TIMEOUT_S = 3.0


def test_a_hung_rank_is_named_with_every_ranks_stacks(runs: Path) -> None:
    proc = reftrain(runs, "hang", "--steps", "6", "--hang-rank", "1", "--hang-step", "3",
                    "--set", f"watchdog.timeout_s={HANG_TIMEOUT_S}", "--set", "watchdog.interval_s=0.5")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "hang: rank 1 made no progress" in proc.stderr
    run = runs / "hang"
    m = manifest(run)
    assert m["status"] == "failed" and m["error"].startswith("hang: rank 1")
    (hang,) = m["hangs"]
    assert (hang["rank"], hang["attempt"], hang["step"], hang["phase"]) == (1, 0, 2, "end")
    assert m["attempts"][0]["status"] == "hung" and m["attempts"][0]["cause"].startswith("hang: rank 1")
    # Named within the timeout plus 10 s of rank 1's last progress (its step-2 record):
    # the watchdog reads every 0.5 s, so only a stall of several seconds of the
    # launcher itself could break the bound.
    last_ns = max(json.loads(line)["time_ns"] for line in (run / "metrics" / "rank1.jsonl").read_text().splitlines())
    from datetime import datetime

    detected = datetime.fromisoformat(hang["detected_time"]).timestamp()
    assert HANG_TIMEOUT_S <= detected - last_ns / 1e9 <= HANG_TIMEOUT_S + 10
    assert hang["stacks"] == ["stacks/rank0.txt", "stacks/rank1.txt"]
    stacks1 = (run / "stacks" / "rank1.txt").read_text()
    assert "hang_forever" in stacks1 and "step_start" in stacks1  # where rank 1 stopped
    assert "_loop" in (run / "stacks" / "rank0.txt").read_text()  # rank 0: waiting in its step


# ---------------------------------------------------------------------------
# Asynchronous checkpoints: same checkpoints as synchronous ones, published only when complete
# ---------------------------------------------------------------------------

ASYNC = ["--steps", "6", "--checkpoint-every", "2"]


def test_async_checkpoints_are_published_complete_and_resume_bit_for_bit(runs: Path) -> None:
    must_succeed(reftrain(runs, "sync", *ASYNC))
    must_succeed(reftrain(runs, "async", *ASYNC, "--set", "checkpoint.async_save=true"))
    run = runs / "async"
    m = manifest(run)
    assert m["files"]["checkpoints"] == ["checkpoints/step2", "checkpoints/step4", "checkpoints/step6"]
    assert not list((run / "checkpoints").glob(".*"))  # nothing left unpublished
    saves = m["checkpoint_saves"]
    assert [s["step"] for s in saves] == [2, 4, 6] and {s["mode"] for s in saves} == {"async"}
    assert all(s["complete_s"] >= s["stall_s"] > 0 for s in saves)
    assert losses(run) == losses(runs / "sync")
    # The staged copy is the state after step 4, though steps 4 and 5 ran while it was written.
    must_succeed(reftrain(runs, "async_resumed", "--resume", str(run / "checkpoints" / "step4")))
    resumed = losses(runs / "async_resumed")
    assert sorted({s for (_, s) in resumed}) == [4, 5]
    assert all(resumed[k] == losses(runs / "sync")[k] for k in resumed)


class _Future:
    def __init__(self, done: bool) -> None:
        self._done = done

    def done(self) -> bool:
        return self._done

    def result(self) -> None:
        assert self._done, "result() of a write in flight would block"


def test_an_async_save_in_flight_is_never_published(tmp_path: Path) -> None:
    """finish_async renames `.step{K}.tmp` only once the write's future is done (no process group: rank 0)."""
    tmp = tmp_path / "checkpoints" / ".step4.tmp"
    tmp.mkdir(parents=True)
    (tmp / ".metadata").write_bytes(b"")
    pending = checkpoint.PendingSave(4, tmp, tmp_path / "checkpoints" / "step4", _Future(False), 0.0, 0.0)
    assert not checkpoint.finish_async(tmp_path, pending, wait=False)
    assert checkpoint.latest_checkpoint(tmp_path) is None and tmp.is_dir()
    pending.future = _Future(True)
    assert checkpoint.finish_async(tmp_path, pending, wait=False)
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step4"


def test_find_hang_names_the_rank_that_is_behind() -> None:
    """The watchdog's rule on hand-made beats (no processes): exact answers."""
    from recorder.heartbeat import Beat, find_hang

    live = lambda pid: pid != 99  # noqa: E731 - pid 99 has exited
    waiting = Beat(rank=0, attempt=0, pid=10, step=3, phase="start", time=100.0)  # in step 3's collective
    behind = Beat(rank=1, attempt=0, pid=11, step=2, phase="end", time=100.5)  # never started step 3
    assert find_hang([waiting, behind], now=102.0, timeout_s=3.0, alive=live) is None  # not stale yet
    hang = find_hang([waiting, behind], now=104.0, timeout_s=3.0, alive=live)
    assert (hang.rank, hang.step, hang.phase, hang.stalled_s) == (1, 2, "end", 3.5)
    # Same progress: the older beat is the one behind.
    tie = Beat(rank=1, attempt=0, pid=11, step=3, phase="start", time=99.0)
    assert find_hang([waiting, tie], now=104.0, timeout_s=3.0, alive=live).rank == 1
    # A dead rank is a crash (the agent restarts), a finished one is not waited for,
    # and an earlier attempt's beats do not count once a newer attempt beats.
    dead = Beat(rank=1, attempt=0, pid=99, step=2, phase="end", time=50.0)
    done = Beat(rank=1, attempt=0, pid=11, step=5, phase="done", time=50.0)
    assert find_hang([dead], now=104.0, timeout_s=3.0, alive=live) is None
    assert find_hang([done], now=104.0, timeout_s=3.0, alive=live) is None
    fresh = Beat(rank=1, attempt=1, pid=12, step=2, phase="start", time=103.5)
    assert find_hang([waiting, fresh], now=104.0, timeout_s=3.0, alive=live) is None


def test_stack_file_survives_another_rank_removing_the_empty_folder(tmp_path: Path, monkeypatch) -> None:
    """Rank 1's close() removes the attempt's stacks folder when it is empty; if that lands between
    rank 0's mkdir and open (seen once in a clean-clone run), rank 0 makes the folder again instead of
    failing with FileNotFoundError. The race is reproduced exactly: the folder goes right before the open."""
    from recorder import heartbeat

    real_open = open
    removed = []

    def racing_open(path, *args, **kwargs):
        if not removed and str(path).endswith("rank0.txt"):
            removed.append(path)
            Path(path).parent.rmdir()  # the other rank's close(), just before our open
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(heartbeat, "open", racing_open, raising=False)
    hb = heartbeat.Heartbeat(tmp_path, rank=0, attempt=1)
    try:
        assert removed and (tmp_path / heartbeat.stacks_rel(0, 1)).is_file()
    finally:
        hb.close()
    assert not (tmp_path / "stacks" / "attempt1").exists()  # nothing asked for: the empty file and folder go
