"""Deliberate slowness for tests and the CI-gate bench: `--inject-slowdown F` and `--inject-slow-rank R`.

Used by the training loop (reftrain/train.py) inside its forward and
backward phases; what was injected is measured and written into every
metrics record (docs/rundir.md).
"""

from __future__ import annotations

import contextlib
import functools
import time

import torch

from reftrain.config import Config

_BURN_SIZE = 32  # 32x32 float matmul: ~2 us on one core, so the spin overshoots its target by no more


@functools.lru_cache(maxsize=1)
def _burn_operands() -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.full((_BURN_SIZE, _BURN_SIZE), 0.5)
    return a, a


class Injector:
    """Deliberate compute slowness, added inside the forward/backward phases so it counts as compute.

    - slow rank: `inject.slow_rank` waits `inject.delay_ms` (wall clock) in
      the forward of its first micro-batch of every step (a straggler).
    - slowdown F: after each forward and each backward, every rank does
      (F-1) times the compute that phase just did, so compute takes F times
      as long.

    On CPU both are busy loops, not `time.sleep`: the injected time must
    load the machine like the compute it stands for. A sleeping rank hands
    its core to its neighbours (the other rank, a concurrent run, CI load),
    which then run faster and hide part of the injection: a sleep-based
    1.5x forward/backward once came out as +17.5 % step time under load.
    The slowdown is measured and added in *CPU time of the rank's main
    thread* (`time.thread_time`, where CPU autograd and the one intra-op
    thread run): wall time of a phase also holds waits for the other ranks
    (DDP waits for its gradient all-reduce inside backward, FSDP for its
    all-gathers), and multiplying those would feed one rank's injection
    into the other's, step after step; and CPU time is what load cannot
    inflate, so under load the injected work stretches in wall time exactly
    as the real compute does. Each turn of the loop is a small matmul
    (`_BURN`, single-threaded, a few microseconds), which releases the GIL
    so the rank's other threads (collective callbacks) still run. It used
    to be `time.sleep(0)`: on Linux that is a zero-length nanosleep which
    still sleeps for the thread's timer slack (~50-60 us) while using
    almost no CPU, so a spin of 10 ms CPU time took ~29 ms of wall time
    (measured), and `--inject-slowdown 2` made forward and backward 3x+ as
    long on an idle machine (the bench's 5/10/25 % cases gave
    +4.7/+23/+77 %).

    On CUDA the wait is `torch.cuda._sleep`, a kernel that spins for a number
    of GPU clock cycles (calibrated once with CUDA events), so the delay is
    device time where the real compute is; compute and wait are timed with
    CUDA events and a synchronize.

    What was injected is measured, not assumed: per step, `injected` holds
    the wall-clock ms the waits added to the forward and backward phases,
    and (slowdown on CPU) `compute_cpu_ms` / `injected_cpu_ms` the CPU time
    of the phases' own work and of the injected work. All go into each
    metrics record, so the analyzer can tell injected from measured time.
    """

    def __init__(self, cfg: Config, rank: int, device: torch.device) -> None:
        inj = cfg.inject
        self.delay_ms = inj.delay_ms if inj.slow_rank == rank else 0.0
        self.factor = inj.slowdown if inj.slowdown is not None else 1.0
        self.device = device
        self.cuda = device.type == "cuda"
        self.active = bool(self.delay_ms) or self.factor > 1.0
        self.start_step()
        self._cycles_per_ms = self._calibrate() if self.active and self.cuda else 0.0
        if self.active and not self.cuda:
            # The first matmul of the burn shape in a process pays one-time set-up (1.5 ms of
            # CPU measured in a fresh clone's test run); pay it here, not inside the first
            # injected spin, whose CPU time is what the slowdown is sized and recorded by.
            torch.mm(*_burn_operands())

    @property
    def injected_ms(self) -> float:
        """Wall-clock ms the injection added to the current step, forward and backward together."""
        return self.injected["forward"] + self.injected["backward"]

    def _calibrate(self) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 10_000_000
        torch.cuda._sleep(cycles)  # warm up
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / max(start.elapsed_time(end), 1e-3)

    def _cuda_wait(self, ms: float, kind: str) -> None:
        if ms <= 0:
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(int(ms * self._cycles_per_ms))
        end.record()
        end.synchronize()
        self.injected[kind] += start.elapsed_time(end)

    def _spin(self, ms: float, kind: str, clock) -> None:
        """Busy-wait until `clock` (seconds) has advanced `ms`; add the wall time it took to `kind`."""
        if ms <= 0:
            return
        # One intra-op thread for the burn: with two, each 32x32 matmul hands work to an OpenMP
        # worker and the main thread spins at the barrier until it returns; under load that worker
        # is descheduled for milliseconds, all of it CPU time of this thread, so one turn cost up to
        # 11 ms of CPU and the spin overshot a 40 ms target by 4-9 ms (measured beside other jobs;
        # 0.1 ms worst turn single-threaded). torchrun's ranks already run with OMP_NUM_THREADS=1;
        # a single-process run and the unit tests do not.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            wall0, c0 = time.perf_counter(), clock()
            target = c0 + ms / 1e3
            now = c0
            burn = _burn_operands()
            while now < target:
                torch.mm(*burn)  # CPU work with the GIL released; see the class docstring (not time.sleep(0))
                now = clock()
        finally:
            torch.set_num_threads(threads)
        self.injected[kind] += (time.perf_counter() - wall0) * 1e3
        if clock is time.thread_time:
            self.injected_cpu_ms += (now - c0) * 1e3

    def start_step(self) -> None:
        self.injected = {"forward": 0.0, "backward": 0.0}
        self.compute_cpu_ms = 0.0  # CPU time of the wrapped phases' own work (slowdown on CPU only)
        self.injected_cpu_ms = 0.0  # CPU time of the injected work

    @contextlib.contextmanager
    def compute(self, kind: str = "forward", first_forward: bool = False):
        """Wrap a forward or backward (`kind`); adds the straggler delay and/or the slowdown."""
        if not self.active:
            yield
            return
        if first_forward and self.delay_ms:
            if self.cuda:
                self._cuda_wait(self.delay_ms, kind)
            else:
                self._spin(self.delay_ms, kind, time.perf_counter)
        if self.factor <= 1.0:
            yield
            return
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            end.synchronize()
            self._cuda_wait((self.factor - 1.0) * start.elapsed_time(end), kind)
        else:
            c0 = time.thread_time()
            yield
            own_ms = (time.thread_time() - c0) * 1e3
            self.compute_cpu_ms += own_ms
            self._spin((self.factor - 1.0) * own_ms, kind, time.thread_time)
