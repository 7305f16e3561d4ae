"""reftrain.inject: `--inject-slowdown F` makes the wrapped compute take F times as long on the wall clock."""

from __future__ import annotations

import time

import pytest
import torch

from reftrain.config import Config, apply_set, resolve
from reftrain.inject import Injector


def _cfg(**sets: object) -> Config:
    cfg = Config()
    apply_set(cfg, "model.preset=tiny")
    for key, value in sets.items():
        apply_set(cfg, f"{key.replace('__', '.')}={value}")
    return resolve(cfg)


def _work(ms: float) -> None:
    """Stands for a phase's compute: small matmuls on this thread until `ms` of its CPU time passed."""
    a = torch.full((64, 64), 0.25)
    until = time.thread_time() + ms / 1e3
    while time.thread_time() < until:
        torch.mm(a, a)


@pytest.mark.parametrize("factor", [2.0, 3.0])
def test_slowdown_takes_factor_times_as_long_on_the_wall_clock(factor: float) -> None:
    # The measured ratio: the wall time of a wrapped phase over the wall time of its own work
    # (timed inside the block), summed over 40 phases of 5 ms CPU work, must be F within 30 %.
    # Why load cannot flake it: the own work and the injected work are both CPU work on this
    # thread, interleaved every few ms, so being descheduled by neighbours stretches both alike
    # and the ratio stays near F; sums over 40 phases average out which of the two a time slice
    # hit. Not exactly F: with seven other test processes on 2 cores (load ~9) the ratio for
    # F = 3 came out 3.49, so the bound is 30 %. The defect this guards against is far beyond
    # it: spinning with `time.sleep(0)` each turn slept ~60 us of timer slack per turn for ~1 us
    # of CPU, so the injected part took ~3x its CPU time and the ratio came out 1 + 3 (F - 1)
    # (4.0 for F = 2, measured; 7 for F = 3).
    torch.set_num_threads(1)
    inj = Injector(_cfg(inject__slowdown=factor), rank=0, device=torch.device("cpu"))
    own_ms = phase_ms = own_cpu_ms = injected_cpu_ms = 0.0
    for i in range(40):
        inj.start_step()
        kind = "forward" if i % 2 else "backward"
        t0 = time.perf_counter()
        with inj.compute(kind):
            t1 = time.perf_counter()
            _work(5.0)
            own_ms += (time.perf_counter() - t1) * 1e3
        this_ms = (time.perf_counter() - t0) * 1e3
        phase_ms += this_ms
        # The injector's own record of injected wall time lies inside the phase, in the right phase.
        assert 0 < inj.injected[kind] < this_ms and inj.injected_ms == inj.injected[kind]
        # In CPU time the injection stops at the first turn of its loop past the target: never
        # short of it (exact, whatever the load). How far past is one turn, a few us idle, but
        # under load one turn can cost far more CPU (0.17 ms beside two busy processes, 0.7 ms
        # at a load average of 7: cache refills and time the VM's host took from a running
        # thread count as its CPU), 14 % of a 5 ms phase; so the upper bound is judged on the
        # sum over the 40 phases, where one such turn is 0.4 %. The sizing defect this guards
        # against (F - 1 of the wrong clock) is a factor, not a few per cent.
        assert inj.injected_cpu_ms >= (factor - 1) * inj.compute_cpu_ms
        own_cpu_ms += inj.compute_cpu_ms
        injected_cpu_ms += inj.injected_cpu_ms
    assert injected_cpu_ms == pytest.approx((factor - 1) * own_cpu_ms, rel=0.10)
    assert phase_ms / own_ms == pytest.approx(factor, rel=0.30)


def test_inactive_injector_adds_nothing() -> None:
    inj = Injector(_cfg(), rank=0, device=torch.device("cpu"))
    assert not inj.active
    with inj.compute("forward", first_forward=True):
        _work(1.0)
    assert inj.injected_ms == 0.0 and inj.compute_cpu_ms == 0.0 and inj.injected_cpu_ms == 0.0
