"""What a run ran on: device and CPU description, and the git state of the code."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from pathlib import Path

import torch


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (x86 "model name"; ARM lacks it), else platform's guess."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def describe_hardware(device: torch.device) -> dict:
    """This process's hardware: device_type, device_name, device_memory_bytes,
    cpu_model, cpu_cores, cpu_cores_usable, hostname.

    `cpu_cores` is the machine's logical CPU count (os.cpu_count);
    `cpu_cores_usable` those this process may run on (sched_getaffinity,
    which containers and launchers narrow). `device_memory_bytes` is the
    GPU's total memory (what a run's peak allocation is measured against);
    None on CPU, where a run's RSS has no device limit.
    """
    device = torch.device(device)
    model = cpu_model()
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
        memory = int(torch.cuda.get_device_properties(device).total_memory)
    else:
        device_name, memory = model, None
    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    return {
        "device_type": device.type,
        "device_name": device_name,
        "device_memory_bytes": memory,
        "cpu_model": model,
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": usable,
        "hostname": socket.gethostname(),
    }


def git_state(path: Path) -> dict:
    """{"sha": HEAD commit or None, "dirty": uncommitted changes or None}; never raises.

    None values mean "unknown": no git executable, not a work tree, or git failed.
    Untracked files count as dirty (they can change what runs).
    """
    unknown = {"sha": None, "dirty": None}

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(path), *args], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    sha = git("rev-parse", "--verify", "HEAD")
    if sha is None:
        return unknown
    status = git("status", "--porcelain")
    return {"sha": sha.strip(), "dirty": None if status is None else bool(status.strip())}
