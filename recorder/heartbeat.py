"""Hang detection: a heartbeat file per rank, stack dumps on demand, and the launcher's watchdog.

Each rank rewrites its own `heartbeat/rank{R}.json` (atomically, temp file +
rename; one file per rank, nothing shared or appended) at every point of
progress: set-up done, the start and the end of each step, inside a
checkpoint save, done. A beat holds the rank's pid, attempt, step, phase
and wall time. Each rank also registers `faulthandler` on SIGUSR1, so a
signal makes it write every thread's Python stack to
`stacks/[attempt{k}/]rank{R}.txt`, even while its main thread is blocked
inside a C++ collective.

The watchdog runs in `reftrain --nproc`'s launcher process (beside the
torchelastic agent), so it works whichever rank is stuck. Every
`watchdog.interval_s` it reads the beats of the live ranks of the newest
attempt; when one is older than `watchdog.timeout_s`, the job is stalled:
it asks every live rank for its stacks, names the rank that stopped making
progress, records the hang in run.json, prints one line, and kills the
attempt's ranks, so the agent restarts the job (--max-restarts) or ends it.
The rank named is a frozen process if there is one (stopped, /proc state T:
it cannot run at all, while the others wait for it in a collective, often
in the same step and phase), else the one with the least progress by
(step, phase), then the oldest beat (the ranks waiting for it have gone on
to the collective it never reached). A frozen process cannot write its
stacks (the signal stays pending); its stacks file then says so.
Torch-free: the launcher runs it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SCHEMA = "reftrain.heartbeat/1"
# Progress within a step, in order (a rank in a later phase of the same step is further on).
PHASES = ("setup", "start", "end", "checkpoint", "done")
STACK_SIGNAL = signal.SIGUSR1


def heartbeat_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "heartbeat" / f"rank{rank}.json"


def stacks_rel(rank: int, attempt: int) -> str:
    """Where rank `rank` of attempt `attempt` dumps its stacks, relative to the run directory."""
    return f"stacks/{'' if attempt == 0 else f'attempt{attempt}/'}rank{rank}.txt"


class Heartbeat:
    """This rank's heartbeat file and its stack dump on SIGUSR1."""

    def __init__(self, run_dir: Path, rank: int, attempt: int) -> None:
        self.path = heartbeat_path(run_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp")
        self.rank, self.attempt, self.pid = rank, attempt, os.getpid()
        stacks = Path(run_dir) / stacks_rel(rank, attempt)
        # Kept open for the life of the process: faulthandler writes to its descriptor
        # from the signal handler, without the GIL. Another rank's close() removes the folder
        # when it is empty, which it may be between our mkdir and open: then make it again.
        for tries_left in range(4, -1, -1):
            stacks.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._stacks_file = open(stacks, "w")
                break
            except FileNotFoundError:
                if not tries_left:
                    raise
        faulthandler.register(STACK_SIGNAL, file=self._stacks_file, all_threads=True, chain=False)

    def beat(self, step: int, phase: str, at: float | None = None) -> None:
        """Write the rank's progress: `step`, `phase`, and when it was reached (`at`, Unix seconds; now by default)."""
        record = {
            "schema": SCHEMA,
            "rank": self.rank,
            "attempt": self.attempt,
            "pid": self.pid,
            "step": step,
            "phase": phase,
            "time": time.time() if at is None else at,
        }
        self.tmp.write_text(json.dumps(record))
        os.replace(self.tmp, self.path)

    def close(self) -> None:
        faulthandler.unregister(STACK_SIGNAL)
        self._stacks_file.close()
        stacks = Path(self._stacks_file.name)
        try:
            if stacks.stat().st_size == 0:  # never asked for: no empty file left in the run directory
                stacks.unlink()
                stacks.parent.rmdir()  # when empty; the other ranks close theirs at the same time
        except OSError:
            pass  # not empty, or another rank removed it first


@dataclass(frozen=True)
class Beat:
    rank: int
    attempt: int
    pid: int
    step: int
    phase: str
    time: float

    @property
    def progress(self) -> tuple[int, int]:
        return (self.step, PHASES.index(self.phase) if self.phase in PHASES else 0)


@dataclass(frozen=True)
class Hang:
    """What the watchdog found: the rank that is behind and how long the job had been stalled."""

    rank: int
    attempt: int
    step: int  # the hung rank's last beat: its step and phase
    phase: str
    stalled_s: float  # now minus the hung rank's last beat
    detected_time: float  # time.time() at detection
    beats: tuple[Beat, ...]
    frozen: bool = False  # the hung rank's process is stopped (SIGSTOP, a debugger): it cannot run at all

    def describe(self) -> str:
        where = {
            "end": f"after step {self.step}",
            "start": f"in step {self.step}",
            "setup": "after set-up",
            "checkpoint": f"in the checkpoint save after step {self.step}",
        }
        state = "; its process is stopped (state T)" if self.frozen else ""
        return (
            f"hang: rank {self.rank} made no progress for {self.stalled_s:.1f} s "
            f"(last heartbeat {where.get(self.phase, self.phase)}, attempt {self.attempt}{state})"
        )


def read_beats(run_dir: Path, world_size: int) -> list[Beat]:
    """The ranks' last beats (a missing or half-written file is skipped)."""
    out = []
    for rank in range(world_size):
        try:
            d = json.loads(heartbeat_path(run_dir, rank).read_text())
            out.append(
                Beat(
                    int(d["rank"]), int(d["attempt"]), int(d["pid"]), int(d["step"]), str(d["phase"]), float(d["time"])
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def _state(pid: int) -> str:
    """The process state letter of /proc/PID/stat (R, S, D, T, t, Z, ...); '' when unreadable."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return ""


def _frozen(pid: int) -> bool:
    """Stopped by a signal (T) or a tracer (t): the process runs no code, not even a signal handler."""
    return _state(pid) in ("T", "t")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _state(pid) != "Z"  # a dead child the agent has not reaped yet is not alive


def find_hang(
    beats: list[Beat],
    now: float,
    timeout_s: float,
    alive: Callable[[int], bool] = _alive,
    frozen: Callable[[int], bool] = _frozen,
) -> Hang | None:
    """A hang among the beats, or None. Pure apart from `alive` (a dead rank is a crash,
    the agent's business, not a hang; a finished rank is not waited for) and `frozen`
    (a stopped process is the one behind, whatever its last beat says)."""
    live = [b for b in beats if b.phase != "done" and alive(b.pid)]
    if not live:
        return None
    attempt = max(b.attempt for b in live)
    live = [b for b in live if b.attempt == attempt]
    if not any(now - b.time > timeout_s for b in live):
        return None
    stopped = {b.rank for b in live if frozen(b.pid)}
    behind = min(live, key=lambda b: (b.rank not in stopped, b.progress, b.time))
    return Hang(
        behind.rank, attempt, behind.step, behind.phase, now - behind.time, now, tuple(live), behind.rank in stopped
    )


class Watchdog(threading.Thread):
    """The launcher's watcher (see the module docstring). `on_hang(hang, stack_files)` records it."""

    def __init__(
        self,
        run_dir: Path,
        world_size: int,
        timeout_s: float,
        interval_s: float,
        on_hang: Callable[[Hang, list[str]], None],
    ) -> None:
        super().__init__(name="reftrain-watchdog", daemon=True)
        self.run_dir, self.world_size = Path(run_dir), world_size
        self.timeout_s, self.interval_s, self.on_hang = timeout_s, interval_s, on_hang
        self.hangs: list[Hang] = []
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        while not self._stop.wait(self.interval_s):
            hang = find_hang(read_beats(self.run_dir, self.world_size), time.time(), self.timeout_s)
            if hang is None or any(h.attempt == hang.attempt for h in self.hangs):
                continue  # one report per attempt; its ranks are being killed
            self.hangs.append(hang)
            try:
                self._handle(hang)
            except Exception as exc:  # noqa: BLE001 - the watchdog must not die silently
                print(f"reftrain: watchdog: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def _handle(self, hang: Hang) -> None:
        files = [stacks_rel(b.rank, hang.attempt) for b in hang.beats]
        for b in hang.beats:
            _signal(b.pid, STACK_SIGNAL)
        # faulthandler writes from the signal handler at once; a short wait lets it finish.
        deadline = time.time() + STACKS_WAIT_S
        while time.time() < deadline and not all(_size(self.run_dir / f) > 0 for f in files):
            time.sleep(0.05)
        time.sleep(0.2)
        for b, rel in zip(hang.beats, files):
            if _size(self.run_dir / rel) == 0:  # no answer: say why instead of leaving an empty file
                (self.run_dir / rel).write_text(_no_stacks(b.rank, b.pid))
        self.on_hang(hang, files)
        for b in hang.beats:  # end the attempt: the agent sees dead ranks and restarts or stops
            _signal(b.pid, signal.SIGKILL)


STACKS_WAIT_S = 2.0  # how long the ranks get to write their stacks (faulthandler answers in microseconds)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _no_stacks(rank: int, pid: int) -> str:
    """The stacks file's text for a rank that did not answer the stack request."""
    state = _state(pid)
    why = {
        "T": "its process is stopped (state T, e.g. SIGSTOP): a stopped process runs no code, so it cannot "
        "dump its stack; the request stays pending until it is continued",
        "t": "its process is stopped by a tracer (state t): it cannot dump its stack until the tracer lets it run",
        "D": "its process is in uninterruptible sleep (state D, inside the kernel, e.g. a device or file-system "
        "call): it cannot run the signal handler until the call returns",
        "Z": "its process has exited",
        "": "its process has exited",
    }.get(state, f"its process (state {state}) did not run the signal handler in time")
    return f"no Python stacks: rank {rank} (pid {pid}) did not answer SIGUSR1 within {STACKS_WAIT_S:.0f} s; {why}.\n"


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
