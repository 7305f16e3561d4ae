"""What-if estimates on the measured timeline: the step after a change (pure functions).

Each function takes measured numbers (ms) and returns the predicted step
time; :func:`prediction` turns a before/after pair into a
:class:`~analyzer.suggest.engine.Prediction` with tokens/s and MFU. The
models, their assumptions and the constants' calibration are in
docs/suggestions.md ("What-if models").

The constants below were calibrated on the 2-core development machine
(bench/bench_suggest.py, docs/suggestions.md "Calibration"); nothing here
was calibrated on a GPU (none was available).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal, Mapping

import pandas as pd

from analyzer.verbs.suggest.engine import Prediction

if TYPE_CHECKING:
    from analyzer.metrics.depgraph import StepGraph
    from analyzer.verbs.suggest.engine import Suggestion
    from analyzer.verbs.suggest.facts import RunFacts
    from analyzer.verbs.whatif import WhatIfRequest

# Asymptotic efficiency of the per-token work of a training step on CPU,
# relative to the run's measured matmul peak (reftrain's 1024^3 fp32 matmul):
# the MFU a model of this width reaches at large micro-batch, the reference of
# rule mfu_gap. eta grows with the width of the matrices. Measured with
# `bench/bench_suggest.py --calibrate` (forward+backward at micro-batch 4 and
# 16 and the peak matmul, interleaved round by round, one rank's thread; four
# sessions on the development machine): d_model 64: 0.30-0.34; 128:
# 0.52-0.62; 256: 0.75-0.80 (docs/suggestions.md). Interpolated in
# log2(d_model), clamped outside.
CPU_ETA_POINTS = ((64, 0.32), (128, 0.57), (256, 0.75))


def _log_interp(points: tuple[tuple[int, float], ...], d_model: int | None) -> float:
    """Piecewise linear in log2(x) through ``(x, value)`` points (x: a model width or a batch), clamped at both ends."""
    if not d_model or d_model <= points[0][0]:
        return points[0][1]
    if d_model >= points[-1][0]:
        return points[-1][1]
    for (d0, e0), (d1, e1) in zip(points, points[1:]):
        if d_model <= d1:
            frac = (math.log2(d_model) - math.log2(d0)) / (math.log2(d1) - math.log2(d0))
            return e0 + frac * (e1 - e0)
    return points[-1][1]


def cpu_eta(d_model: int | None) -> float:
    """Per-token efficiency on CPU for a model of this width (see :data:`CPU_ETA_POINTS`)."""
    return _log_interp(CPU_ETA_POINTS, d_model)


def prediction(
    f: "RunFacts",
    step_after_ms: float,
    method: str,
    *,
    tokens_per_step_after: float | None = None,
    work_ratio: float = 1.0,
    peak_ratio: float = 1.0,
    scope: str = "steady-state step",
    step_before_ms: float | None = None,
    model: Literal["closed-form", "replay"] = "closed-form",
) -> Prediction:
    """A Prediction from the run's measured step and the what-if step.

    Throughput scales by ``work / (step_after / step)``, with ``work`` the
    tokens per step after over before (or ``work_ratio`` when the run has
    no token count). MFU scales the same way, times ``peak_ratio`` (old
    peak / new peak) when the change moves the run to another peak (a
    precision change). Model FLOPs per token are unchanged by every change
    the rules propose. ``step_before_ms`` replaces the steady step for
    predictions of another scope (the run's mean step).
    """
    before_ms = step_before_ms if step_before_ms is not None else f.step_time_ms
    if before_ms is None:
        raise ValueError("a prediction needs the run's measured step time")
    before = float(before_ms)
    tokens_before = f.tokens_per_step
    tokens_after = tokens_per_step_after if tokens_per_step_after is not None else tokens_before
    work = (tokens_after / tokens_before) if (tokens_before and tokens_after) else work_ratio
    ratio = work * before / step_after_ms
    tps_before = (tokens_before / (before / 1e3)) if tokens_before else None
    return Prediction(
        step_time_ms_before=before,
        step_time_ms_after=float(step_after_ms),
        tokens_per_step_before=tokens_before,
        tokens_per_step_after=tokens_after,
        mfu_before=f.mfu,
        mfu_after=None if f.mfu is None else f.mfu * ratio * peak_ratio,
        tokens_per_s_before=tps_before,
        tokens_per_s_after=None if tps_before is None else tps_before * ratio,
        method=method,
        scope=scope,
        work_ratio=work,
        model=model,
    )


def remove(step_ms: float, saved_ms: float) -> float:
    """Step time with ``saved_ms`` of it gone (clipped so that a step never vanishes)."""
    return max(step_ms - max(saved_ms, 0.0), 0.05 * step_ms)


# ---------------------------------------------------------------------------
# Data loading
# ---------------------------------------------------------------------------

# Time to take a ready batch from a DataLoader worker's queue (unpickling from
# shared memory, waking the main thread). Median of data_wait_ms per
# micro-batch in runs whose workers were ahead (num_workers >= 1, no delay)
# on the development machine under load; an idle machine shows ~1-3 ms.
DATA_WORKER_FLOOR_MS = 8.0
# A producer is sized to deliver a batch in this fraction of the consumer's time per micro-batch.
DATA_PRODUCER_HEADROOM = 0.7


def data_load_ms_per_batch(wait_per_micro_ms: float, consume_per_micro_ms: float, num_workers: int) -> float:
    """The source's time to produce one micro-batch, inferred from the wait.

    ``num_workers == 0``: loading is synchronous, the wait *is* the load
    time. ``num_workers = W > 0`` and the consumer waits: the workers
    deliver one batch per ``wait + consume`` ms, so each takes ``W * (wait +
    consume)`` ms per batch (a lower bound when the wait is only the
    queue floor).
    """
    if num_workers <= 0:
        return wait_per_micro_ms
    return num_workers * (wait_per_micro_ms + consume_per_micro_ms)


def data_wait_after(
    load_ms: float, consume_per_micro_ms: float, num_workers: int, floor_ms: float = DATA_WORKER_FLOOR_MS
) -> float:
    """Wait per micro-batch with ``num_workers`` workers: ``max(floor, load / W - consume)``."""
    if num_workers <= 0:
        return load_ms
    return max(floor_ms, load_ms / num_workers - consume_per_micro_ms)


def workers_needed(load_ms: float, consume_per_micro_ms: float, cap: int) -> int:
    """Fewest workers that keep up with headroom: ``ceil(load / (headroom * consume))``, within 1..cap."""
    if consume_per_micro_ms <= 0:
        return cap
    return max(1, min(cap, math.ceil(load_ms / (DATA_PRODUCER_HEADROOM * consume_per_micro_ms))))


# ---------------------------------------------------------------------------
# Micro-batch scaling
# ---------------------------------------------------------------------------


# The fixed part of one micro-batch's forward+backward on CPU (per-op dispatch,
# autograd, DDP hook and module overheads), in units of the marginal cost of one
# sequence: fb(B) = P * (kappa + B). A ratio of two CPU times on the same core,
# so machine load mostly cancels out of it (the peak FLOP/s measurement does
# not: 8 to 34 GFLOP/s on the development machine within an hour). Values at
# seq_len 64: the median over pairs of 2-rank reftrain runs of one model at two
# micro-batch sizes, kappa = fb(B1) / P - B1 with P = (fb(B2) - fb(B1)) /
# (B2 - B1) (`bench/bench_suggest.py --calibrate-kappa`; docs/suggestions.md,
# "Calibration": d_model 64, 6 pairs on an idle machine, 1.45 to 3.88, median
# 3.3 (14 pairs under load 3 to 16 gave 0.49 to 4.9, median 2.3: the fixed
# share shrinks when other jobs slow the per-token work); d_model 128 (4
# layers, vocabulary 4096), 6 pairs at load 0.8 to 1.9 (2026-12-06), 0.56 to
# 1.15, median 0.81; d_model 256, 3 pairs under load, 0.36 to 0.73, median
# 0.55). Without the d_model 128 point the interpolation gave 1.9 there, and
# rule micro_batch predicted +109 % for micro-batch 4 -> 32 where +43 % was
# measured (bench_suggest, sync-after-backward).
# Interpolated in log2(d_model) and scaled by 64 / seq_len (the fixed part does
# not grow with the sequence, the marginal one does).
CPU_FIXED_SEQUENCES_POINTS = ((64, 3.3), (128, 0.81), (256, 0.55))
CPU_FIXED_SEQUENCES_SEQ_LEN = 64
# The points above are of DDP runs that overlap the gradient all-reduce with backward (reftrain's default).
# gloo's all-reduce runs on the same 2 cores, so its CPU work during backward is a fixed cost per
# micro-batch (the gradients' size does not change with B) that lands in the backward phase. A run that
# syncs after backward (parallel.overlap_grad_sync=false) pays it in its grad_sync phase instead, and its
# forward+backward keeps only the dispatch overheads, which shrink against the per-sequence cost as B grows
# (that cost itself grows with B: 5.8 ms per sequence from 1 to 8, 7.2 ms from 4 to 16). Measured at
# d_model 128, per base micro-batch B1 (6 pairs, 2026-12-06, `--calibrate-kappa --kappa-model d128
# --kappa-set parallel.overlap_grad_sync=false`: 1->8 0.94, 1.09; 2->8 0.21, 0.21; 4->16 -0.10, -0.09;
# each point the mean of its two pairs). A negative kappa says forward+backward grows faster than B: the
# marginal sequence costs more than the average one. Interpolated in log2(B), clamped at both ends; other
# widths scale it by their overlapped kappa against the overlapped kappa at d_model 128.
CPU_FIXED_SEQUENCES_SYNC_AFTER_BACKWARD_POINTS = ((1, 1.015), (2, 0.21), (4, -0.095))
CPU_FIXED_SEQUENCES_SYNC_AFTER_BACKWARD_WIDTH = 128


def cpu_fixed_sequences(
    d_model: int | None, seq_len: int | None, overlap_grad_sync: bool = True, micro_batch: int | None = None
) -> float:
    """kappa: the fixed forward+backward cost per micro-batch in sequences (see CPU_FIXED_SEQUENCES_POINTS);
    ``overlap_grad_sync`` False: of a run at ``micro_batch`` sequences that all-reduces after backward
    (CPU_FIXED_SEQUENCES_SYNC_AFTER_BACKWARD_POINTS)."""
    kappa = _log_interp(CPU_FIXED_SEQUENCES_POINTS, d_model)
    if not overlap_grad_sync:
        at_width = _log_interp(CPU_FIXED_SEQUENCES_POINTS, CPU_FIXED_SEQUENCES_SYNC_AFTER_BACKWARD_WIDTH)
        kappa *= _log_interp(CPU_FIXED_SEQUENCES_SYNC_AFTER_BACKWARD_POINTS, micro_batch) / at_width
    return kappa * CPU_FIXED_SEQUENCES_SEQ_LEN / seq_len if seq_len else kappa


def split_micro_batch(per_micro_ms: float, micro_batch: int, kappa: float) -> tuple[float, float]:
    """``(fixed_ms, per_sequence_ms)`` of one micro-batch's forward+backward: ``per_micro = P (kappa + B)``."""
    per_seq = per_micro_ms / (kappa + micro_batch)
    return kappa * per_seq, per_seq


def cpu_micro_batch_split(f: "RunFacts") -> tuple[float, float, float, float] | None:
    """``(fb_per_micro_ms, fixed_ms, per_sequence_ms, kappa)`` of a CPU reftrain run's forward+backward.

    ``fb_per_micro`` is (forward + backward - the exposed communication tail
    that ends backward) / grad_accum; it is split with
    :func:`cpu_fixed_sequences`. None when the run lacks the phases or config.
    """
    mb, ga = f.cfg("train.micro_batch_size"), int(f.cfg("train.grad_accum", 1) or 1)
    if not mb or "forward" not in f.phases or "backward" not in f.phases:
        return None
    tail = max(0.0, (f.exposed_comm_ms or 0.0) - f.phases.get("grad_sync", 0.0))
    fb = max(0.0, f.phases["forward"] + f.phases["backward"] - tail)
    kappa = cpu_fixed_sequences(
        f.cfg("model.d_model"), f.cfg("model.seq_len"), f.cfg("parallel.overlap_grad_sync") is not False, int(mb)
    )
    fixed, per_seq = split_micro_batch(fb / ga, mb, kappa)
    return fb / ga, fixed, per_seq, kappa


def micro_batch_step_ms(step_ms: float, grad_accum: int, micro_batch: int, per_seq_ms: float, factor: float) -> float:
    """Step time when the micro-batch grows ``factor`` times: ``S + GA * P * B * (factor - 1)``.

    Per micro-batch, forward+backward = ``c0 + P * B``; the fixed ``c0`` and
    the other parts of the step (data wait with workers ahead, optimizer,
    gradient sync, communication of a fixed gradient size) do not depend on
    ``B``.
    """
    return step_ms + grad_accum * per_seq_ms * micro_batch * (factor - 1.0)


def device_batch_step_ms(step_ms: float, scaled_ms: float, fixed_ms: float, factor: float) -> float:
    """GPU step when the batch grows ``factor`` times: ``max(step, factor * scaled + fixed)``.

    A launch-bound step keeps the host's time (the same kernels are
    launched; each does more work) until the device's work, ``scaled``
    (compute and memcpy, proportional to the batch) plus ``fixed`` (exposed
    communication of the same gradients), catches up with it.
    """
    return max(step_ms, factor * scaled_ms + fixed_ms)


# ---------------------------------------------------------------------------
# Communication
# ---------------------------------------------------------------------------

# DDP's first bucket (the gradients ready first) is capped at 1 MiB whatever bucket_cap_mb says
# (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES).
DDP_FIRST_BUCKET_BYTES = 1 << 20


def ddp_bucket_count(grad_bytes: float, bucket_cap_mb: float) -> int:
    """Buckets DDP makes for ``grad_bytes`` of gradients: the 1 MiB first bucket, then ``bucket_cap_mb`` ones."""
    if grad_bytes <= DDP_FIRST_BUCKET_BYTES:
        return 1
    return 1 + math.ceil((grad_bytes - DDP_FIRST_BUCKET_BYTES) / (bucket_cap_mb * 2**20))


def ddp_last_bucket_bytes(grad_bytes: float, bucket_cap_mb: float) -> float:
    """Size of the bucket DDP all-reduces last (the gradients ready last, issued after backward's last op)."""
    n = ddp_bucket_count(grad_bytes, bucket_cap_mb)
    if n == 1:
        return grad_bytes
    cap = bucket_cap_mb * 2**20
    return grad_bytes - DDP_FIRST_BUCKET_BYTES - (n - 2) * cap


def accumulate_step_ms(step_ms: float, per_micro_ms: float, factor: int) -> float:
    """Step with ``factor`` times the micro-batches per optimizer step: the per-micro part repeats, the rest does not."""
    return step_ms + (factor - 1) * per_micro_ms


# ---------------------------------------------------------------------------
# The replay in place of the closed form
# ---------------------------------------------------------------------------

# The replay predicts only where the unchanged replay reproduces the measured profiled steps this closely.
REPLAY_TOLERANCE = 0.02


def replay_request(s: "Suggestion", f: "RunFacts") -> "WhatIfRequest | None":
    """The replay's version of a suggestion's change, for the rules whose change it can simulate; else None.

    micro_batch, smaller_micro_batch: the micro-batch factor; grad_accumulation:
    the accumulation factor; overlap_grad_sync: communication overlapped;
    straggler: the rank's delay removed; cuda_graphs: no launch overhead.
    """
    from analyzer.verbs.whatif import WhatIfRequest

    o = s.change.overrides
    mb, ga = f.cfg("train.micro_batch_size"), f.cfg("train.grad_accum", 1) or 1
    if s.rule in ("micro_batch", "smaller_micro_batch") and o.get("train.micro_batch_size") and mb:
        return WhatIfRequest(micro_batch_scale=float(o["train.micro_batch_size"]) / float(mb))
    if s.rule == "grad_accumulation" and o.get("train.grad_accum"):
        k = int(o["train.grad_accum"]) // int(ga)
        return WhatIfRequest(accumulate=k) if k >= 1 else None
    if s.rule == "overlap_grad_sync":
        return WhatIfRequest(overlap_comm=True)
    if s.rule == "straggler" and isinstance(s.evidence.get("rank"), int):
        return WhatIfRequest(remove_rank_delay=int(s.evidence["rank"]))
    if s.rule == "cuda_graphs":
        return WhatIfRequest(no_launch_overhead=True)
    return None


def replayed(
    s: "Suggestion", f: "RunFacts", graphs: Mapping[int, Mapping[int, tuple["StepGraph", pd.DataFrame]]]
) -> "Suggestion":
    """``s`` with its prediction made by the replay where :func:`replay_request` applies and the replay is
    trusted (the unchanged replay within :data:`REPLAY_TOLERANCE` of every profiled step); else ``s``.

    The replay's ratio predicted / measured over the profiled steps (the job's, the slowest rank's) is
    applied to the prediction's step before; tokens and work after are the closed form's (the change's).
    The method says both models' step after.
    """
    import dataclasses

    from analyzer.metrics.replay import ReplayError
    from analyzer.verbs.whatif import whatif_graphs

    request = replay_request(s, f)
    p = s.predicted
    if request is None or p is None or not graphs:
        return s
    try:
        result = whatif_graphs(graphs, request)
    except ReplayError:
        return s
    err, measured, predicted = result.unchanged_error, result.measured_step_ms, result.predicted_step_ms
    if err is None or err > REPLAY_TOLERANCE or not measured or not predicted:
        return s
    after = p.step_time_ms_before * predicted / measured
    method = (
        f"replay of {len(result.steps)} profiled step(s) with {'; '.join(result.changes)}: the slowest rank's "
        f"{measured:.1f} -> {predicted:.1f} ms, x {predicted / measured:.3f} on the {p.step_time_ms_before:.1f} ms "
        f"step = {after:.1f} ms (closed form: {p.step_time_ms_after:.1f} ms)"
    )
    new = prediction(
        f,
        after,
        method,
        tokens_per_step_after=p.tokens_per_step_after,
        work_ratio=p.work_ratio,
        scope=p.scope,
        step_before_ms=p.step_time_ms_before,
        model="replay",
    )
    return dataclasses.replace(s, predicted=new)
