"""Failures on purpose (config section `fault`), to test that a job recovers.

A crash is `os._exit`: no Python clean-up, no flush, no error file, like a
rank killed by the OOM killer or a segfault. A hang is a rank that stops
making progress (a Python sleep loop, so its stack dump shows where): the
other ranks then block in the next collective, as behind a deadlock or a
stuck device. Faults fire in the first
attempt of a job only (torchelastic's TORCHELASTIC_RESTART_COUNT is 0), so
that `--max-restarts` can bring the job to its end. A run's saved config
records its faults, but `--resume` and `--config` of a run's config.yaml
do not repeat them (reftrain/cli.py): a repeated run that crashed on
purpose would crash again.
"""

from __future__ import annotations

import os
import sys
import time

from recorder.ranks import restart_count
from reftrain.config import FaultConfig

CRASH_EXIT_CODE = 17  # an exit status no other failure of ours uses: tests and run.json can tell it apart


class Faults:
    """The faults configured for this rank, in this attempt."""

    def __init__(self, cfg: FaultConfig, rank: int) -> None:
        armed = cfg.crash_rank == rank and restart_count() == 0
        self.crash_step = cfg.crash_step if armed and not cfg.crash_in_save else None
        self.crash_save_step = cfg.crash_step if armed and cfg.crash_in_save else None
        self.hang_step = cfg.hang_step if cfg.hang_rank == rank and restart_count() == 0 else None
        self.rank = rank

    def _die(self, where: str) -> None:
        print(f"reftrain: fault injection: rank {self.rank} dies {where}", file=sys.stderr, flush=True)
        os._exit(CRASH_EXIT_CODE)

    def step_start(self, step: int) -> None:
        """Called at the start of step `step`, before its heartbeat."""
        if self.crash_step == step:
            self._die(f"at the start of step {step}")
        if self.hang_step == step:
            print(
                f"reftrain: fault injection: rank {self.rank} hangs at the start of step {step}",
                file=sys.stderr,
                flush=True,
            )
            hang_forever()

    def in_save(self, step: int) -> None:
        """Called inside the save of checkpoints/step{step} after the data is written, before it is published."""
        if self.crash_save_step is not None and step == self.crash_save_step:
            self._die(f"inside the save of checkpoint step{step}")

    def unreachable(self, start_step: int) -> list[str]:
        """Why a configured fault cannot fire in a run that starts at `start_step` (one line each).

        The config check refuses faults past the end of the run (reftrain/config.py);
        where the run starts is known only once a resumed checkpoint is loaded."""
        out = []
        for key, step in (
            ("fault.crash_step", self.crash_step),
            ("fault.crash_step", self.crash_save_step),
            ("fault.hang_step", self.hang_step),
        ):
            if step is not None and step < start_step:
                out.append(f"{key}={step} cannot fire: this run starts at step {start_step}")
        return out


def hang_forever() -> None:
    """Never return (until the process is killed)."""
    while True:
        time.sleep(3600)
