"""The machine-speed canary: a fixed compute probe timed between steps.

Other processes on a machine slow a run's steps and raise their CPU time
too (a busy core's sibling, caches, memory bandwidth), so two runs of the
same code on one machine differ by however busy it was during each. The
probe is the same work in every run of every code version: a fixed chain of
small matmul + tanh on a fixed 64x64 tensor, on one intra-op thread, about
a millisecond on an idle core. Its wall time follows the machine's speed
as the step sees it (time lost to neighbours included), so the gate
(`analyzer check`, docs/ci.md "Machine speed") can tell a slower machine
from slower code.

The recorder (recorder/run.py) and reftrain (reftrain/train.py) run it on
CPU runs before the step timer starts (outside `step_time_ms` and `cpu_ms`)
on the first step, every `EVERY_STEPS` steps and the last step when it is
known, never inside a profiler window (its ops would land in the trace), and
write its times into that step's metrics record (`canary_ms`,
`canary_cpu_ms`, docs/rundir.md).
"""

from __future__ import annotations

import time

import torch

# Probe every this many steps: at ~1 ms a probe, about 1 % of a 20 ms step's wall
# time, and 12 probes in a 60-step run.
EVERY_STEPS = 5
# Matmul + tanh turns per probe; fixed, so every run times the same work.
TURNS = 40
_SIZE = 64


class Canary:
    """The probe and its schedule; `due(step)` says whether it runs before `step`.

    `last_step` None: the loop did not say how many steps it runs, and the
    probe runs on the first step and every `every` steps from it only.
    """

    def __init__(self, first_step: int, last_step: int | None, every: int = EVERY_STEPS) -> None:
        self.first_step, self.last_step, self.every = first_step, last_step, every
        g = torch.Generator().manual_seed(0)
        # Scaled so that the chain stays in tanh's non-saturated range: the same
        # arithmetic each turn, never denormals or constant outputs.
        self._a = torch.randn(_SIZE, _SIZE, generator=g)
        self._b = torch.randn(_SIZE, _SIZE, generator=g) / _SIZE**0.5

    def due(self, step: int) -> bool:
        return step == self.last_step or (step - self.first_step) % self.every == 0

    def probe(self) -> tuple[float, float]:
        """Run the fixed work once; returns (wall ms, CPU ms of this thread)."""
        threads = torch.get_num_threads()
        # One intra-op thread: the probe's time must not depend on how many threads a run was given.
        torch.set_num_threads(1)
        try:
            y = self._a
            wall0, cpu0 = time.perf_counter(), time.thread_time()
            with torch.no_grad():
                for _ in range(TURNS):
                    y = torch.tanh(torch.mm(y, self._b))
            wall_ms, cpu_ms = (time.perf_counter() - wall0) * 1e3, (time.thread_time() - cpu0) * 1e3
        finally:
            torch.set_num_threads(threads)
        return wall_ms, cpu_ms
