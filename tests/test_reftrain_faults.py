"""Preemption, hang detection and asynchronous checkpoints of `reftrain --nproc 2`
(docs/reftrain.md "Fault tolerance"), with real signals and injected faults.

Tiny runs on 2 CPU gloo ranks; each job is a subprocess bounded by a timeout,
in its own session, and every test checks that no rank process outlives it
(the ranks' pids come from their heartbeat files). Timing is judged only
against bounds far beyond any load (see each test).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reftrain import checkpoint
from reftrain.exits import children

pytestmark = pytest.mark.slow

TIMEOUT_S = 240  # a busy 2-core machine starts 3 torch processes per job
BASE = [
    "--nproc",
    "2",
    "--preset",
    "tiny",
    "--device",
    "cpu",
    "--set",
    "data.num_workers=0",
    "--set",
    "profile.enabled=false",
]


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
        proc = subprocess.run(
            command(runs, name, *args),
            cwd=runs,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            start_new_session=True,
        )
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


@pytest.fixture(scope="module")
def preempt_baseline(runs: Path) -> dict[tuple[int, int], float]:
    must_succeed(reftrain(runs, "preempt_baseline", *PREEMPT))
    baseline = losses(runs / "preempt_baseline")
    assert len(baseline) == 80
    return baseline


def wait_for_steps(proc: subprocess.Popen, run: Path, steps: int) -> None:
    """Until rank 0 has recorded `steps` steps (the job still running), within TIMEOUT_S."""
    first = run / "metrics" / "rank0.jsonl"
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if first.is_file() and len(first.read_text().splitlines()) >= steps:
            return
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be stopped"
    raise AssertionError(f"{run.name}: {steps} steps not recorded within {TIMEOUT_S} s")


# DataLoader workers get the SIGTERM too (the agent signals each rank's process group);
# they must not die first and fail the rank ("DataLoader worker exited unexpectedly").
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_sigterm_preempts_saves_and_resumes_bit_for_bit(runs: Path, preempt_baseline: dict, workers: int) -> None:
    name = f"preempted_w{workers}"
    run = runs / name
    loader = ["--set", f"data.num_workers={workers}"]
    proc = subprocess.Popen(
        command(runs, name, *PREEMPT, *loader),
        cwd=runs,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_steps(proc, run, 3)
        os.kill(proc.pid, signal.SIGTERM)  # the launcher, as a scheduler would: the agent forwards it
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        assert_no_rank_left(run)
    assert proc.returncode == 0, f"{proc.returncode}\n{out[-2000:]}\n{err[-2000:]}"
    m = manifest(run)
    assert m["status"] == "preempted" and len(m["attempts"]) == 1 and m["end_time"]
    a = m["attempts"][0]
    assert a["status"] == "preempted" and "SIGTERM" in a["cause"] and a["exit_codes"] == [0, 0]
    assert a["end_time"] == m["end_time"]  # the attempt is closed with the run
    done = {s for (_, s) in losses(run)}
    k = max(done) + 1
    assert done == set(range(k)) and 3 <= k < 40  # stopped at a step boundary, mid-way
    assert m["files"]["checkpoints"] == [f"checkpoints/step{k}"]  # the preemption's own save
    assert [s["step"] for s in m["checkpoint_saves"]] == [k]
    assert "preempted" in out

    must_succeed(reftrain(runs, f"resumed_w{workers}", "--resume", str(run), *loader))
    r = manifest(runs / f"resumed_w{workers}")
    assert r["status"] == "completed" and r["start_step"] == k
    # Exact equality, not a tolerance: same data (a function of seed, rank, step), same state.
    assert losses(run) | losses(runs / f"resumed_w{workers}") == preempt_baseline


def test_a_step_longer_than_the_grace_period_is_killed_and_recorded_failed(runs: Path) -> None:
    """preemption.grace_s=1 and steps that sleep 6 s in the data source (in the rank: no workers):
    the SIGTERM lands at the start of step 1 (both ranks' heartbeats say so), the step cannot end
    within the grace period, whatever the load (a sleep is never shorter), and the agent kills
    the ranks: no checkpoint at the stop, the run and its attempt closed `failed` with the reason."""
    name = "grace_exceeded"
    run = runs / name
    proc = subprocess.Popen(
        command(runs, name, "--steps", "3", "--set", "data.delay_ms=6000", "--set", "preemption.grace_s=1"),
        cwd=runs,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            beats = (
                [json.loads(f.read_text()) for f in (run / "heartbeat").glob("rank*.json")]
                if (run / "heartbeat").is_dir()
                else []
            )
            if len(beats) == 2 and all((b["step"], b["phase"]) == (1, "start") for b in beats):
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be stopped"
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        assert_no_rank_left(run)
    assert proc.returncode == 130, err[-2000:]
    m = manifest(run)
    assert m["status"] == "failed" and m["error"].startswith("stopped by SIGTERM: the ranks saved no checkpoint")
    assert m["error"].endswith("latest checkpoint: none") and "preemption.grace_s=1 s" in m["error"]
    (a,) = m["attempts"]
    assert (a["status"], a["cause"], a["exit_codes"]) == ("failed", m["error"], None) and a["end_time"]
    assert not (run / "checkpoints").exists()


# ---------------------------------------------------------------------------
# Hang: the watchdog names the hung rank within the timeout plus 10 s, with stacks
# ---------------------------------------------------------------------------

HANG_TIMEOUT_S = 3.0


def test_a_hung_rank_is_named_with_every_ranks_stacks(runs: Path) -> None:
    proc = reftrain(
        runs,
        "hang",
        "--steps",
        "6",
        "--hang-rank",
        "1",
        "--hang-step",
        "3",
        "--set",
        f"watchdog.timeout_s={HANG_TIMEOUT_S}",
        "--set",
        "watchdog.interval_s=0.5",
    )
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


def test_a_frozen_rank_is_named_and_its_missing_stacks_explained(runs: Path) -> None:
    """SIGSTOP on rank 1 mid-run: rank 0 then waits in a collective, often in the same step and
    phase, so the heartbeats alone cannot tell them apart; the stopped process is the one named.
    A stopped process cannot dump its stacks: its file says so instead of being empty."""
    name = "frozen"
    run = runs / name
    proc = subprocess.Popen(
        command(
            runs,
            name,
            "--steps",
            "400",
            "--set",
            "data.delay_ms=20",
            "--set",
            f"watchdog.timeout_s={HANG_TIMEOUT_S}",
            "--set",
            "watchdog.interval_s=0.5",
        ),
        cwd=runs,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    stopped = None
    try:
        wait_for_steps(proc, run, 3)
        stopped = json.loads((run / "heartbeat" / "rank1.json").read_text())["pid"]
        os.kill(stopped, signal.SIGSTOP)
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if stopped is not None and alive(stopped):
            os.kill(stopped, signal.SIGCONT)  # a stopped process left behind would take its SIGKILL only now
        assert_no_rank_left(run)
    assert proc.returncode == 1, err[-2000:]
    m = manifest(run)
    (hang,) = m["hangs"]
    assert hang["rank"] == 1 and m["error"].startswith("hang: rank 1 made no progress")
    assert "its process is stopped (state T)" in m["error"]
    assert "hang: rank 1" in err
    frozen = (run / "stacks" / "rank1.txt").read_text()
    assert frozen.startswith(f"no Python stacks: rank 1 (pid {stopped}) did not answer SIGUSR1")
    assert "stopped (state T" in frozen
    assert "_loop" in (run / "stacks" / "rank0.txt").read_text()  # rank 0 answered: waiting in its step


# ---------------------------------------------------------------------------
# The launcher's death ends the ranks; the first rank to fail is the run's error
# ---------------------------------------------------------------------------


def test_ranks_do_not_outlive_a_killed_launcher(runs: Path) -> None:
    """SIGKILL to the launcher (a scheduler past its grace period, the OOM killer): the ranks and their
    DataLoader workers get the kernel's parent-death SIGKILL, so none trains on unsupervised and the
    run is never recorded completed. 5 s is the bound asked for; the kernel signals at once."""
    name = "launcher_killed"
    run = runs / name
    proc = subprocess.Popen(
        command(runs, name, *PREEMPT, "--set", "data.num_workers=1"),
        cwd=runs,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_steps(proc, run, 3)
        ranks = rank_pids(run)
        workers = [c for pid in ranks for c in children(pid)]
        assert len(ranks) == 2 and len(workers) == 2
        proc.kill()
        proc.communicate()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(p) for p in ranks + workers):
            time.sleep(0.05)
        left = [p for p in ranks + workers if alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        assert_no_rank_left(run)
    assert not left, f"processes {left} outlived their launcher by 5 s"
    assert manifest(run)["status"] == "running"  # nobody saw the end: never `completed`


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
    from recorder.heartbeat import Beat
    from recorder.heartbeat import find_hang as find_hang_of

    live = lambda pid: pid != 99  # noqa: E731 - pid 99 has exited
    find_hang = functools.partial(find_hang_of, frozen=lambda pid: False)
    waiting = Beat(rank=0, attempt=0, pid=10, step=3, phase="start", time=100.0)  # in step 3's collective
    behind = Beat(rank=1, attempt=0, pid=11, step=2, phase="end", time=100.5)  # never started step 3
    assert find_hang([waiting, behind], now=102.0, timeout_s=3.0, alive=live) is None  # not stale yet
    hang = find_hang([waiting, behind], now=104.0, timeout_s=3.0, alive=live)
    assert (hang.rank, hang.step, hang.phase, hang.stalled_s, hang.frozen) == (1, 2, "end", 3.5, False)
    # Same progress: the older beat is the one behind.
    tie = Beat(rank=1, attempt=0, pid=11, step=3, phase="start", time=99.0)
    assert find_hang([waiting, tie], now=104.0, timeout_s=3.0, alive=live).rank == 1
    # A stopped process is behind whatever its beat says: here it started step 3 after rank 0
    # and froze there, while rank 0 waits for it in that step's collective (same step and phase).
    frozen_later = Beat(rank=1, attempt=0, pid=11, step=3, phase="start", time=100.2)
    hang = find_hang_of([waiting, frozen_later], now=104.0, timeout_s=3.0, alive=live, frozen=lambda pid: pid == 11)
    assert (hang.rank, hang.frozen, round(hang.stalled_s, 6)) == (1, True, 3.8)
    assert hang.describe().endswith("(last heartbeat in step 3, attempt 0; its process is stopped (state T))")
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
