"""CPU time per step in units of the machine-speed canary: the work of a step, with the machine's speed taken out.

The canary (recorder/canary.py, docs/ci.md "Machine speed") is a fixed
compute probe that reftrain and the recorder time on CPU runs before every
5th step. Its CPU time is the same work in every run of every code version,
so it moves only with the machine: contention from other processes (a busy
sibling hyperthread, caches, memory bandwidth) raises the CPU time of a
step and of the probe next to it alike. Dividing one by the other cancels
what they share:

* ``local_probe_cpu_ms`` of rank ``r`` at step ``s``: the median of that
  rank's ``canary_cpu_ms`` over its steady-state probes at steps ``s - W ..
  s + W`` (``W = window_steps``, default 5, the probe interval: two or three
  probes, the ones before and after the step); the nearest probe when none
  lies that close (a loop whose probes are sparser).
* ``cost`` of the step on rank ``r``: ``cpu_ms / local_probe_cpu_ms``,
  dimensionless: how many probes' worth of CPU time the step took (a tiny
  2-rank CPU step is about 10).
* the step's cost: the max over its ranks (the busiest rank, as the gate's
  CPU-time samples: a straggler's extra work shows there, not in a mean).

Steady-state steps as everywhere in the gate: ``step >= warmup_steps``,
outside profiler windows (``profiled_steps`` and rows flagged
``profiled``), where the probe never runs either. Units: ``cpu_ms`` is the
rank process's CPU time over the step (all threads), ``canary_cpu_ms`` the
probing thread's, both milliseconds.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

# Each rank needs this many probes for a local machine speed to mean anything (the gate's own minimum).
MIN_PROBES = 3
# Probes within this many steps of a step make its local machine speed: the probe interval, so the probes
# on both sides of every step.
WINDOW_STEPS = 5


def local_probe(probe_steps: np.ndarray, probe_ms: np.ndarray, steps: np.ndarray, window_steps: int) -> np.ndarray:
    """Per step of ``steps``, the median of ``probe_ms`` at ``probe_steps`` within ``window_steps``; else the nearest.

    ``probe_steps`` ascending and non-empty. Ties for the nearest probe take
    the earlier one.
    """
    lo = np.searchsorted(probe_steps, steps - window_steps, side="left")
    hi = np.searchsorted(probe_steps, steps + window_steps, side="right")
    out = np.empty(len(steps), dtype=np.float64)
    for i, (a, b) in enumerate(zip(lo, hi)):
        if b > a:
            out[i] = np.median(probe_ms[a:b])
        else:
            # a == b: the probes on either side of the window are a - 1 and a.
            near = [j for j in (a - 1, a) if 0 <= j < len(probe_steps)]
            out[i] = probe_ms[min(near, key=lambda j: abs(probe_steps[j] - steps[i]))]
    return out


def canary_cost_per_step(
    metrics: pd.DataFrame,
    *,
    warmup_steps: int,
    profiled_steps: Sequence[int],
    through_step: int | None = None,
    window_steps: int = WINDOW_STEPS,
) -> pd.Series | None:
    """Each steady-state step's CPU time in canary units, busiest rank (module docstring); index: step, ascending.

    ``metrics``: one row per (rank, step) with ``cpu_ms`` and, on probed
    steps, ``canary_cpu_ms``. ``through_step``: only records up to that
    step count, probes included (a run cut short, as bench_gate measures
    shorter runs). None when the records lack either field, any rank has
    fewer than ``MIN_PROBES`` steady-state probes, or a value is not a
    positive finite number: no machine speed to divide by.
    """
    if metrics is None or len(metrics) == 0 or not {"cpu_ms", "canary_cpu_ms"} <= set(metrics.columns):
        return None
    keep = (metrics["step"] >= warmup_steps) & ~metrics["step"].isin(list(profiled_steps))
    if "profiled" in metrics.columns:
        keep &= ~metrics["profiled"].fillna(False).astype(bool)
    if through_step is not None:
        keep &= metrics["step"] <= through_step
    steady = metrics.loc[keep, ["rank", "step", "cpu_ms", "canary_cpu_ms"]]
    per_rank = []
    for rank, g in steady.groupby("rank", sort=True):
        g = g.sort_values("step")
        cpu_ms = pd.to_numeric(g["cpu_ms"], errors="coerce").to_numpy(np.float64)
        probe = pd.to_numeric(g["canary_cpu_ms"], errors="coerce").to_numpy(np.float64)
        probed = ~np.isnan(probe)
        if probed.sum() < MIN_PROBES or not _positive(cpu_ms) or not _positive(probe[probed]):
            return None
        steps = g["step"].to_numpy(np.int64)
        local = local_probe(steps[probed], probe[probed], steps, window_steps)
        per_rank.append(pd.Series(cpu_ms / local, index=steps, name=rank))
    if not per_rank:
        return None
    cost = pd.concat(per_rank, axis=1).max(axis=1).sort_index()
    cost.index.name = "step"
    return cost


def _positive(values: np.ndarray) -> bool:
    return bool(len(values)) and bool(np.all(np.isfinite(values))) and bool(np.all(values > 0))
