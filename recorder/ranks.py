"""Where this process sits in the job, and the ranks' agreement at open and close through the store.

The recorder never assumes that every rank opened it: a collective that one
rank never reaches would block the others until the process group's timeout
(30 min by default). So open and close meet through the default process
group's key-value store, with a timeout of the recorder's own: each rank
posts a key, waits for the keys it needs, and when they do not come it says
so in one line and goes on with what it has.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

# torch is imported where it is used: reftrain's launcher reads the restart count without it.


@dataclass(frozen=True)
class Place:
    """This process's rank, the job's world size, and the process group (when initialized)."""

    rank: int
    world_size: int
    backend: str | None
    distributed: bool  # torch.distributed is initialized (the store and collectives are there)


def this_place() -> Place:
    """The rank and world size from torch.distributed when it is initialized, else from the
    environment torchrun sets (RANK, WORLD_SIZE), else a single process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return Place(dist.get_rank(), dist.get_world_size(), str(dist.get_backend()), True)
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    return Place(rank, world, None, False)


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def restart_count() -> int:
    """Which attempt of the job this process belongs to (0 = the first; torchelastic sets
    TORCHELASTIC_RESTART_COUNT after each restart)."""
    return _env_int("TORCHELASTIC_RESTART_COUNT", 0)


def max_restarts() -> int | None:
    """The job's --max-restarts (torchelastic's TORCHELASTIC_MAX_RESTARTS; None outside torchelastic)."""
    value = os.environ.get("TORCHELASTIC_MAX_RESTARTS")
    return int(value) if value and value.isdigit() else None


class Meeting:
    """Keys on the default store under one prefix: post a JSON value, wait for others' with a timeout.

    Every rank that opens a recorder makes the n-th Meeting of its process with
    the same prefix, so a job that opens two recorders in turn keeps them apart.
    """

    _opened = 0

    def __init__(self, timeout_s: float) -> None:
        from torch.distributed import distributed_c10d as c10d

        Meeting._opened += 1
        self.prefix = f"trainperf-recorder/{Meeting._opened}/"
        self.timeout_s = timeout_s
        self._store: Any = c10d._get_default_store()

    def post(self, key: str, value: Any) -> None:
        self._store.set(self.prefix + key, json.dumps(value))

    def wait(self, key: str, timeout_s: float | None = None) -> Any:
        """The value posted under `key`, or None when it did not come within the timeout."""
        import torch.distributed as dist

        full = self.prefix + key
        try:
            self._store.wait([full], timedelta(seconds=self.timeout_s if timeout_s is None else timeout_s))
        except (RuntimeError, dist.DistStoreError):  # the store's timeout (DistStoreError on recent torch)
            return None
        return json.loads(self._store.get(full))
