"""Rules on feeding the step: DataLoader wait, pinned memory, exposed host-device copies.

Each rule is ``rule_<id>(facts) -> Suggestion | None``; thresholds are the
module constants; docs/suggestions.md is the reference.
"""

from __future__ import annotations

import math

from analyzer.verbs.suggest import whatif
from analyzer.verbs.suggest.engine import Change, Suggestion, rule
from analyzer.verbs.suggest.facts import RunFacts

# Data-loading wait above this share of the step is worth removing (the
# issue's 5 %; on the development machine a DataLoader whose workers keep up
# still shows 1-2 % on an idle machine: the queue floor).
DATA_WAIT_MIN_SHARE = 0.05
# Exposed host<->device copies above this share of the step.
MEMCPY_MIN_SHARE = 0.05
# pin_memory matters once copies or data wait show at all.
PIN_MIN_SHARE = 0.01


# Workers per rank a suggestion may ask for: the host's cores per rank, but at
# least DATA_MIN_WORKER_CAP (a slow source is usually I/O, where workers wait
# rather than compute) and at most DATA_MAX_WORKER_CAP.
DATA_MIN_WORKER_CAP = 4
DATA_MAX_WORKER_CAP = 8


def _workers_cap(f: RunFacts) -> int:
    """Workers per rank worth suggesting (see DATA_MIN_WORKER_CAP)."""
    return max(DATA_MIN_WORKER_CAP, min(DATA_MAX_WORKER_CAP, f.cores_per_rank or 1))


@rule(part="data")
def rule_data_wait(f: RunFacts) -> Suggestion | None:
    """Data-loading wait over DATA_WAIT_MIN_SHARE of the step: more DataLoader workers.

    Evidence: the median data wait per step (metrics ``data_wait_ms``, or
    the trace's ``data`` phase). What-if (whatif.data_*): infer the
    source's time per micro-batch from the wait (synchronous with 0
    workers; ``W * (wait + consume)`` with W starved workers), size the
    workers to deliver a batch in 70 % of the consumer's time, and predict
    the wait as ``max(queue floor, load / W' - consume)``.
    """
    step = f.step_time_ms
    wait = f.phases.get("data_wait")
    source = "metrics data_wait_ms"
    if wait is None and f.shares_source == "host":
        wait, source = f.share_ms("data"), "trace phase 'data'"
    if not step or wait is None or wait / step <= DATA_WAIT_MIN_SHARE:
        return None
    ga = int(f.cfg("train.grad_accum", 1) or 1)
    workers = f.cfg("data.num_workers")
    w = wait / ga
    consume = (step - wait) / ga
    known_workers = int(workers) if workers is not None else 0
    load = whatif.data_load_ms_per_batch(w, consume, known_workers)
    floor = min(whatif.DATA_WORKER_FLOOR_MS, w) if known_workers > 0 else whatif.DATA_WORKER_FLOOR_MS
    cap = max(_workers_cap(f), known_workers + 1)
    new_workers = max(known_workers + 1, whatif.workers_needed(load, consume, cap))
    w_after = whatif.data_wait_after(load, consume, new_workers, floor)
    if w_after >= w:
        return None  # the wait is the queue floor already: more workers cannot shorten it
    step_after = step - ga * (w - w_after)
    overrides: dict = {"data.num_workers": new_workers}
    prefetch = f.cfg("data.prefetch_factor")
    if prefetch is not None and ga > 1 and prefetch * new_workers < ga:
        overrides["data.prefetch_factor"] = math.ceil(ga / new_workers)  # a whole step's micro-batches in flight
    if f.device == "cuda" and f.cfg("data.pin_memory") is False:
        overrides["data.pin_memory"] = True
    advice = (
        f"DataLoader(num_workers={new_workers}, pin_memory=True, prefetch_factor=2, persistent_workers=True): "
        "load batches in worker processes ahead of the step"
    )
    return Suggestion(
        title=f"Data loading stalls the step: {known_workers if workers is not None else '?'} -> {new_workers} DataLoader workers",
        trigger=f"data wait {wait / step:.1%} of step > DATA_WAIT_MIN_SHARE {DATA_WAIT_MIN_SHARE:.0%}",
        evidence={
            "data_wait_ms": wait,
            "step_time_ms": step,
            "data_wait_share": wait / step,
            "num_workers": workers,
            "load_ms_per_micro_batch": load,
            "consume_ms_per_micro_batch": consume,
            "source": source,
        },
        change=Change(overrides if f.is_reftrain else {}, advice),
        predicted=whatif.prediction(
            f,
            step_after,
            f"source time per micro-batch {load:.1f} ms inferred from the wait; with {new_workers} worker(s) the wait "
            f"per micro-batch becomes max(floor {floor:.1f} ms, {load:.1f}/{new_workers} - {consume:.1f}) = {w_after:.1f} ms",
        ),
        confidence="high" if workers == 0 else "medium",
    )


@rule(part="exposed_memcpy")
def rule_pin_memory(f: RunFacts) -> Suggestion | None:
    """CUDA run with ``pin_memory`` off and copies or data wait over PIN_MIN_SHARE: pin host batches.

    Pageable host memory is staged through a pinned bounce buffer and the
    copy cannot be asynchronous; pinned batches copy with ``non_blocking``
    while compute runs. What-if: the exposed host-to-device copy time is
    hidden (the data wait itself is left to rule data_wait).
    """
    if not f.is_reftrain or f.device != "cuda" or f.cfg("data.pin_memory") is not False or not f.step_time_ms:
        return None
    memcpy = f.share_ms("exposed_memcpy") or 0.0
    if memcpy / f.step_time_ms <= PIN_MIN_SHARE:
        return None
    return Suggestion(
        title="Pin host batches so copies overlap compute",
        trigger=f"exposed memcpy {memcpy / f.step_time_ms:.1%} of step > PIN_MIN_SHARE {PIN_MIN_SHARE:.0%} with pin_memory=false",
        evidence={"exposed_memcpy_ms": memcpy, "step_time_ms": f.step_time_ms, "pin_memory": False},
        change=Change(
            {"data.pin_memory": True}, "DataLoader(pin_memory=True) and tensor.to(device, non_blocking=True)"
        ),
        predicted=whatif.prediction(
            f, whatif.remove(f.step_time_ms, memcpy), f"exposed memcpy {memcpy:.2f} ms per step hidden behind compute"
        ),
        confidence="medium",
    )


@rule(part="exposed_memcpy")
def rule_exposed_memcpy(f: RunFacts) -> Suggestion | None:
    """Device traces with exposed memcpy/memset over MEMCPY_MIN_SHARE of the step.

    Copies that no kernel overlaps are host-device transfers on the
    critical path (pageable memory, blocking ``.to()``, ``.item()`` /
    ``.cpu()`` syncs). What-if: that time hidden. When reftrain's
    pin_memory is off, rule pin_memory says it with an exact override, so
    this rule stays silent.
    """
    if f.shares_source != "device" or not f.step_time_ms:
        return None
    if f.is_reftrain and f.cfg("data.pin_memory") is False:
        return None
    memcpy = f.share_ms("exposed_memcpy") or 0.0
    share = memcpy / f.step_time_ms
    if share <= MEMCPY_MIN_SHARE:
        return None
    return Suggestion(
        title="Host-device copies on the critical path",
        trigger=f"exposed memcpy {share:.1%} of step > MEMCPY_MIN_SHARE {MEMCPY_MIN_SHARE:.0%}",
        evidence={"exposed_memcpy_ms": memcpy, "step_time_ms": f.step_time_ms, "exposed_memcpy_share": share},
        change=Change(
            {},
            "pin host tensors (DataLoader(pin_memory=True)), copy with .to(device, non_blocking=True), "
            "prefetch the next batch on a side CUDA stream, and avoid .item()/.cpu()/print of device "
            "tensors inside the step (each one blocks until the device catches up)",
        ),
        predicted=whatif.prediction(
            f, whatif.remove(f.step_time_ms, memcpy), f"exposed memcpy {memcpy:.2f} ms per step hidden behind compute"
        ),
        confidence="medium",
    )
