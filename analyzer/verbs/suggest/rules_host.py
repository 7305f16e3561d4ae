"""Rules on why the GPU is idle when the host is the cause, or is not: dependencies, host syncs, pageable copies.

They read :class:`analyzer.verbs.suggest.facts.IdleFacts` (HTA's idle
breakdown by cause, launch statistics, the syncs and pageable copies inside
the step windows; analyzer.metrics.idle). The launch-bound case itself
(host wait dominates) is rules_compute's ``launch_bound`` and
``cuda_graphs``, which stay silent when the idle breakdown says the idle is
dependency-bound; ``dependency_idle`` here says that case. Each predicted
gain removes at most the part of the step the rule addresses.
docs/suggestions.md is the reference; thresholds are the module constants.
"""

from __future__ import annotations

from analyzer.verbs.suggest import whatif
from analyzer.verbs.suggest.engine import Change, Suggestion, rule
from analyzer.verbs.suggest.facts import RunFacts
from analyzer.verbs.suggest.rules_compute import IDLE_MIN_SHARE, LAUNCH_WAIT_MIN_FRAC

# Dependency-bound: the "other" cause (the next kernel was queued, its stream waited on something else: an
# event of another stream, a collective, a sync) holds more than this share of the idle time: exactly where
# launch_bound and cuda_graphs fall silent (host + kernel wait under LAUNCH_WAIT_MIN_FRAC).
OTHER_MIN_FRAC = 1.0 - LAUNCH_WAIT_MIN_FRAC
# Device idle right after host syncs above this share of the step (2 %: one .item() per step on a 50 ms step
# that drains a 1 ms queue is below it; a per-layer sync is far above).
SYNC_IDLE_MIN_SHARE = 0.02
# Pageable host-to-device copies whose exposed time (no kernel runs meanwhile) is above this share of the step.
PAGEABLE_MIN_SHARE = 0.01


def _cap(f: RunFacts, part: str, saved_ms: float) -> float:
    """``saved_ms`` no larger than the breakdown part it comes out of (when the run has a breakdown)."""
    part_ms = f.share_ms(part)
    return min(saved_ms, part_ms) if part_ms is not None else saved_ms


@rule(part="idle")
def rule_dependency_idle(f: RunFacts) -> Suggestion | None:
    """GPU idle over IDLE_MIN_SHARE with over OTHER_MIN_FRAC of it neither host wait nor kernel wait: a diagnosis.

    The next kernel was already launched, so neither a larger batch nor CUDA
    graphs (rules launch_bound, cuda_graphs, silent here) fill the gap: the
    stream waited on a dependency. What-if (an upper bound): the "other" idle
    share of the step removed.
    """
    idle = f.idle
    if idle is None or f.shares_source != "device" or not f.step_time_ms:
        return None
    idle_share = f.shares.get("idle", 0.0)
    if idle_share <= IDLE_MIN_SHARE or idle.other_frac <= OTHER_MIN_FRAC:
        return None
    saved = idle_share * idle.other_frac * f.step_time_ms
    return Suggestion(
        title=f"The GPU waits on dependencies, not on the host ({idle.other_frac:.0%} of its idle time)",
        trigger=f"device idle {idle_share:.1%} of step > IDLE_MIN_SHARE {IDLE_MIN_SHARE:.0%} and 'other' (not host "
        f"or kernel wait) {idle.other_frac:.0%} of it > OTHER_MIN_FRAC {OTHER_MIN_FRAC:.0%}",
        evidence={
            "idle_share": idle_share,
            "other_frac": idle.other_frac,
            "host_wait_frac": idle.host_wait_frac,
            "kernel_wait_frac": idle.kernel_wait_frac,
            "step_time_ms": f.step_time_ms,
            "syncs_per_step": idle.syncs_per_step,
        },
        change=Change(
            {},
            "find what each stream waits on (the report's idle breakdown per stream: the streams with "
            "'other' idle): a cross-stream event (a copy or collective on another stream), a collective "
            "of a slower rank, a host sync; start that work earlier (prefetch the next batch, bucket and "
            "overlap collectives) or give the waiting stream independent work",
        ),
        predicted=whatif.prediction(
            f,
            whatif.remove(f.step_time_ms, saved),
            f"upper bound: the 'other' idle, {idle_share:.1%} x {idle.other_frac:.0%} of the "
            f"step = {saved:.2f} ms, removed",
        ),
        confidence="low",
        kind="diagnosis",
    )


@rule(part="idle")
def rule_host_sync(f: RunFacts) -> Suggestion | None:
    """Host syncs inside the step after which the device idles over SYNC_IDLE_MIN_SHARE of the step.

    A sync (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
    ``cudaEventSynchronize``, blocking ``cudaMemcpy``, ``tensor.item()``)
    holds the host until the device drains its queue; the device then idles
    until the host launches again. What-if: that idle (the gaps holding a
    sync's end, in the step windows) removed, as if the host had queued
    ahead; no more than the step's idle part.
    """
    idle = f.idle
    if idle is None or not f.step_time_ms or not idle.syncs_per_step or idle.sync_idle_share is None:
        return None
    if idle.sync_idle_share <= SYNC_IDLE_MIN_SHARE:
        return None
    saved = _cap(f, "idle", idle.sync_idle_share * f.step_time_ms)
    names = ", ".join(f"{n} x{c:.3g}" for n, c in list(idle.sync_names.items())[:4])
    return Suggestion(
        title=f"{idle.syncs_per_step:.3g} host sync(s) per step stall the GPU",
        trigger=f"device idle after host syncs {idle.sync_idle_share:.1%} of step > SYNC_IDLE_MIN_SHARE "
        f"{SYNC_IDLE_MIN_SHARE:.0%}",
        evidence={
            "syncs_per_step": idle.syncs_per_step,
            "sync_calls_per_step": names,
            "sync_host_ms_per_step": (idle.sync_host_share or 0.0) * f.step_time_ms,
            "idle_after_sync_ms_per_step": idle.sync_idle_share * f.step_time_ms,
            "step_time_ms": f.step_time_ms,
        },
        change=Change(
            {},
            "keep values on the device inside the step and read them every N steps (accumulate "
            "loss.detach(), call .item() when logging); no torch.cuda.synchronize() in the step (time with "
            "CUDA events); copy to the host with .to('cpu', non_blocking=True) into pinned memory; avoid "
            "Python control flow on device tensors (if t:, .tolist(), nonzero())",
        ),
        predicted=whatif.prediction(
            f,
            whatif.remove(f.step_time_ms, saved),
            f"the device idle after the syncs, {saved:.2f} ms per step, removed (the host "
            "queues ahead instead of waiting)",
        ),
        confidence="medium",
    )


@rule(part="exposed_memcpy")
def rule_pageable_copies(f: RunFacts) -> Suggestion | None:
    """Pageable host-to-device copies (``Memcpy HtoD (Pageable -> Device)``) exposed over PAGEABLE_MIN_SHARE.

    A copy from pageable memory is staged through a pinned buffer by the
    driver and cannot overlap compute; from pinned memory with
    ``non_blocking=True`` it can. What-if: the pageable copies' exposed time
    hidden (no more than the step's exposed memcpy part). Silent on reftrain
    runs with ``data.pin_memory=false``: rule pin_memory says it with the
    exact override.
    """
    idle = f.idle
    if idle is None or not f.step_time_ms or not idle.pageable_per_step or idle.pageable_exposed_share is None:
        return None
    if f.is_reftrain and f.cfg("data.pin_memory") is False:
        return None
    if idle.pageable_exposed_share <= PAGEABLE_MIN_SHARE:
        return None
    saved = _cap(f, "exposed_memcpy", idle.pageable_exposed_share * f.step_time_ms)
    return Suggestion(
        title=f"{idle.pageable_per_step:.3g} pageable host-to-device copies per step block the GPU",
        trigger=f"pageable HtoD copies exposed {idle.pageable_exposed_share:.1%} of step > PAGEABLE_MIN_SHARE "
        f"{PAGEABLE_MIN_SHARE:.0%}",
        evidence={
            "pageable_htod_per_step": idle.pageable_per_step,
            "pageable_htod_ms_per_step": (idle.pageable_share or 0.0) * f.step_time_ms,
            "pageable_htod_exposed_ms_per_step": idle.pageable_exposed_share * f.step_time_ms,
            "step_time_ms": f.step_time_ms,
        },
        change=Change(
            {},
            "pin the host tensors (DataLoader(pin_memory=True), or tensor.pin_memory() once for tensors "
            "reused every step) and copy with .to(device, non_blocking=True), ideally prefetching the next "
            "batch on a side stream",
        ),
        predicted=whatif.prediction(
            f,
            whatif.remove(f.step_time_ms, saved),
            f"the pageable copies' exposed time, {saved:.2f} ms per step, hidden behind compute",
        ),
        confidence="medium",
    )
