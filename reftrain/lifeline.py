"""Processes that die with their parent: Linux's parent-death signal (prctl PR_SET_PDEATHSIG).

A rank started by `reftrain --nproc` is a child of the launcher, and a
DataLoader worker a child of its rank. When the parent dies without
cleaning up (SIGKILL from a scheduler past its grace period, the OOM
killer), nobody would stop the children: ranks would train on unsupervised
(no watchdog, no restarts) and record a run their launcher never saw end.
With the parent-death signal the kernel sends SIGKILL to the child the
moment its parent exits. Torch-free; a no-op where prctl does not exist.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(expected_parent: int | None = None) -> bool:
    """Ask the kernel to SIGKILL this process when its parent exits; whether it could.

    The signal is tied to the parent thread that forked this process (the
    launcher's and the rank's main threads here, which live as long as their
    process). A parent that died before the request is seen afterwards:
    this process was re-parented, so ``os.getppid()`` is no longer
    `expected_parent` (the parent's pid the caller knows; None = the parent
    at the time of the call, which only guards against a later death), and
    the process exits at once, as the signal would have made it.
    """
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid() if expected_parent is None else expected_parent
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent is gone already: the signal was never going to come
        print(f"reftrain: parent process {parent} has exited; pid {os.getpid()} exits too", file=sys.stderr, flush=True)
        os._exit(1)
    return True
