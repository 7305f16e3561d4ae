"""When each rank process exited, as the launcher saw it: which rank failed first.

When one rank dies, the others fail soon after in their next collective
(gloo: "Connection reset by peer"), and torchelastic reports every failure
with a timestamp in whole seconds, so the order is lost. The launcher
watches its child processes (the ranks torchelastic's agent starts, in the
launcher's process) through Linux pidfds, which become readable the moment
a process exits, before anyone reaps it: the first to exit is the first to
fail. The survivors' failures take far longer than the gap between two
exits this measures (their error travels through a socket, a Python
exception, the run.json and error-file writes and interpreter shutdown).
Torch-free; without pidfds (not Linux, kernel < 5.3) no times are known.
"""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path


def children(pid: int) -> set[int]:
    """The direct child processes of `pid` (every thread's, /proc/PID/task/*/children)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out.update(int(c) for c in task.read_text().split())
        except (OSError, ValueError):
            continue
    return out


class ExitTimes(threading.Thread):
    """Records `time.time()` at the exit of each child process of this one, by pid.

    New children are looked for every `interval_s` (a rank that starts and
    dies within one interval may be reaped unseen: no time for it).
    """

    def __init__(self, interval_s: float = 0.1) -> None:
        super().__init__(name="reftrain-exit-times", daemon=True)
        self.interval_s = interval_s
        self.times: dict[int, float] = {}
        self._watched: dict[int, int] = {}  # pidfd -> pid
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.supported = hasattr(os, "pidfd_open") and Path("/proc/self/task").is_dir()

    def exit_time(self, pid: int) -> float | None:
        with self._lock:
            return self.times.get(pid)

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        if not self.supported:
            return
        poller = select.poll()
        me = os.getpid()
        try:
            while not self._stop.is_set():
                seen = set(self._watched.values()) | set(self.times)
                for pid in children(me) - seen:
                    try:
                        fd = os.pidfd_open(pid)
                    except OSError:  # reaped already
                        continue
                    self._watched[fd] = pid
                    poller.register(fd, select.POLLIN)
                for fd, _ in poller.poll(self.interval_s * 1e3):
                    now = time.time()
                    with self._lock:
                        self.times[self._watched[fd]] = now
                    poller.unregister(fd)
                    os.close(fd)
                    del self._watched[fd]
        finally:
            for fd in self._watched:
                os.close(fd)
