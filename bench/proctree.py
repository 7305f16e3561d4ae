"""Measure a child process and its descendants from /proc (Linux only).

Shared by the benchmarks: wall time, CPU time and peak memory of a whole
process tree, sampled every ``period_s``. Memory is reported two ways:
summed PSS (pages shared between a parent and its forked workers split
between them, so the tree is not double-counted) and summed RSS (shared
pages counted in every process). CPU seconds are user + system time of
every process of the tree, the last value sampled per process (a process's
final < period is missed); read from /proc rather than
getrusage(RUSAGE_CHILDREN), which misses descendants nobody waits for
(e.g. a forkserver's or a terminated pool's workers).
"""

from __future__ import annotations

import os
import resource
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass
class TreeRun:
    """One measured run of a command."""

    wall_s: float
    cpu_s: float
    peak_pss_bytes: int
    peak_rss_bytes: int
    returncode: int
    stdout: bytes
    stderr: bytes


def _children() -> dict[int, list[int]]:
    """ppid -> pids, from /proc/*/stat."""
    out: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
            out.setdefault(ppid, []).append(int(entry.name))
    return out


def _cpu_ticks(pid: int) -> int:
    """utime + stime of one process, in clock ticks (fields 14 and 15 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def _pss_rss(pid: int) -> tuple[int, int]:
    pss = rss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    pss = int(line.split()[1]) * 1024
                elif line.startswith(b"Rss:"):
                    rss = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return pss, rss


def sample_tree(root: int, cpu_ticks: dict[int, int]) -> tuple[int, int]:
    """(summed PSS, summed RSS) bytes of ``root`` and its descendants; updates the
    last CPU ticks seen per pid in ``cpu_ticks``."""
    children = _children()
    pss = rss = 0
    stack = [root]
    while stack:
        pid = stack.pop()
        p, r = _pss_rss(pid)
        pss, rss = pss + p, rss + r
        cpu_ticks[pid] = max(cpu_ticks.get(pid, 0), _cpu_ticks(pid))
        stack.extend(children.get(pid, ()))
    return pss, rss


def run_timed(cmd: list[str], env: dict[str, str], cwd: Path) -> TreeRun:
    """Run ``cmd`` to completion without sampling: wall time, and CPU time
    from getrusage(RUSAGE_CHILDREN) (the child plus the descendants it
    waited for); memory is not measured (0).

    Why a separate run for time: the sampler reads /proc/PID/smaps_rollup
    of every process in the tree every 10 ms, which costs CPU. On a 2-core
    machine that CPU is taken from a tool that keeps both cores busy (a
    main process and a parse worker) but not from a single-process one,
    so sampled wall times are biased against the parallel tool.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return TreeRun(wall, cpu, 0, 0, proc.returncode, out, err)


def run_tree(cmd: list[str], env: dict[str, str], cwd: Path, period_s: float = 0.01) -> TreeRun:
    """Run ``cmd`` to completion, sampling its process tree every ``period_s``."""
    peak = [0, 0]
    cpu_ticks: dict[int, int] = {}
    done = threading.Event()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)

    def sample() -> None:
        while not done.is_set():
            pss, rss = sample_tree(proc.pid, cpu_ticks)
            peak[0], peak[1] = max(peak[0], pss), max(peak[1], rss)
            done.wait(period_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    cpu = sum(cpu_ticks.values()) / _TICKS_PER_S
    return TreeRun(wall, cpu, peak[0], peak[1], proc.returncode, out, err)
