"""Preemption: SIGTERM or SIGINT asks the run to stop at the end of the current step.

A scheduler's SIGTERM (or Ctrl-C) reaches the ranks directly or through
torchelastic's agent, which forwards it to every rank and waits 30 s before
SIGKILL. Each rank's handler only records the signal; after every step the
ranks agree by an all-reduce (MAX) whether any of them got one, so all stop
after the same step even when the signal reached them at different times.
The loop then saves a checkpoint, run.json says `preempted`, and the rank
exits 0; `reftrain --resume RUN_DIR` continues bit for bit.
"""

from __future__ import annotations

import signal
import sys
import threading

import torch
import torch.distributed as dist

from recorder.instrument import untimed_collectives

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption:
    def __init__(self, rank: int, device: torch.device) -> None:
        self.rank, self.device = rank, device
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "Preemption":
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handler(self, signum: int, frame: object) -> None:
        if self.received is None:
            print(
                f"rank {self.rank}: {signal.Signals(signum).name} received: stopping after this step with a checkpoint",
                file=sys.stderr,
                flush=True,
            )
        self.received = signum

    def agreed(self) -> str | None:
        """The signal's name when any rank received one (collective), else None."""
        flag = torch.tensor([float(self.received or 0)], device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            with untimed_collectives():  # not training communication
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        signum = int(flag.item())
        return signal.Signals(signum).name if signum else None
