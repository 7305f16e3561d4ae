"""Rules on gradient communication: DDP buckets, overlap, accumulation, FSDP resharding, compression.

All of them start from exposed communication (communication no compute
hides, ``facts.exposed_comm_ms``) over EXPOSED_COMM_MIN_SHARE of the step,
except overlap_grad_sync (reftrain's explicit sync after backward).
docs/suggestions.md is the reference.
"""

from __future__ import annotations

from analyzer.verbs.suggest import whatif
from analyzer.verbs.suggest.engine import Change, Suggestion, rule
from analyzer.verbs.suggest.facts import RunFacts

# The threshold: exposed communication above 10 % of the step.
EXPOSED_COMM_MIN_SHARE = 0.10
# Bucketing matters when a step issues at least this many collectives.
BUCKET_MIN_COLLECTIVES = 4
# Explicit gradient sync (parallel.overlap_grad_sync=false) above this share of the step.
GRAD_SYNC_MIN_SHARE = 0.10
# Accumulate this many micro-batches per optimizer step when communication is exposed.
ACCUMULATION_FACTOR = 4
# FSDP resharding is only worth turning off while memory has this much headroom.
FSDP_RESHARD_MAX_MEMORY = 0.70
# Estimated gradient copy into DDP buckets above this share of the step.
BUCKET_COPY_MIN_SHARE = 0.01
# Effective copy bandwidth (bytes/s) for gradient <-> bucket copies: one core's
# memcpy on the development machine's EPYC (measured, torch.Tensor.copy_ of
# 16 MiB fp32), and HBM3 at ~60 % of the H100 datasheet 3.35 TB/s.
COPY_BYTES_PER_S = {"cpu": 4e9, "cuda": 2e12}


def _exposed(f: RunFacts) -> tuple[float, float, float] | None:
    """(exposed comm ms, share of step, step ms) when over EXPOSED_COMM_MIN_SHARE, else None."""
    if not f.step_time_ms or f.exposed_comm_ms is None:
        return None
    share = f.exposed_comm_ms / f.step_time_ms
    return (f.exposed_comm_ms, share, f.step_time_ms) if share > EXPOSED_COMM_MIN_SHARE else None


def _comm_evidence(f: RunFacts, exposed_ms: float, share: float) -> dict:
    ev = {
        "exposed_comm_ms": exposed_ms,
        "step_time_ms": f.step_time_ms,
        "exposed_comm_share": share,
        "exposed_comm_source": f.exposed_comm_source,
    }
    if f.comm is not None:
        ev |= {
            "collectives_per_step": f.comm.n_per_step,
            "comm_bytes_per_step": f.comm.bytes_per_step,
            "comm_service_ms_per_step": f.comm.service_ms_per_step,
        }
        if f.comm.alpha_ms is not None:
            ev["comm_alpha_ms"] = f.comm.alpha_ms
    return ev


def _verdict(f: RunFacts) -> str | None:
    """The communication diagnosis of the traced kernels (analyzer.metrics.collectives.diagnose), if any."""
    return f.comm_diagnosis.verdict if f.comm_diagnosis is not None else None


def _is_ddp(f: RunFacts) -> bool:
    if f.is_reftrain:
        return f.cfg("parallel.strategy") == "ddp"
    return f.comm is not None and "all_reduce" in f.comm.kinds and "all_gather" not in f.comm.kinds


@rule(part="exposed_comm")
def rule_ddp_bucket_size(f: RunFacts) -> Suggestion | None:
    """Exposed comm over 10 % with many small all-reduces: larger DDP buckets (``bucket_cap_mb``).

    What-if: each collective costs ``alpha + bytes * beta`` (fitted to the
    run's queue-corrected service times); fewer, larger buckets save
    ``(n - n') * alpha`` of the exposed time (at most all of it).
    """
    ex = _exposed(f)
    if ex is None or not _is_ddp(f) or f.comm is None or f.comm.alpha_ms is None:
        return None
    if f.comm.n_per_step < BUCKET_MIN_COLLECTIVES or _verdict(f) in ("waiting", "bandwidth_bound"):
        return None  # waiting: fewer collectives would wait as long (rule_comm_waiting); bandwidth-bound: alpha is not the cost
    exposed_ms, share, step = ex
    cap = float(f.cfg("parallel.bucket_cap_mb", 25.0) or 25.0)
    new_cap = max(25.0, 4 * cap)
    n_after = whatif.ddp_bucket_count(f.comm.bytes_per_step, new_cap)
    if n_after >= f.comm.n_per_step:
        return None
    saved = min(exposed_ms, (f.comm.n_per_step - n_after) * f.comm.alpha_ms)
    return Suggestion(
        title=f"Fewer, larger gradient buckets: bucket_cap_mb {cap:g} -> {new_cap:g}",
        trigger=f"exposed comm {share:.1%} > {EXPOSED_COMM_MIN_SHARE:.0%} with {f.comm.n_per_step:.0f} collectives "
        f"per step >= BUCKET_MIN_COLLECTIVES {BUCKET_MIN_COLLECTIVES}",
        evidence=_comm_evidence(f, exposed_ms, share) | {"bucket_cap_mb": cap},
        change=Change(
            {"parallel.bucket_cap_mb": new_cap},
            f"DistributedDataParallel(model, bucket_cap_mb={new_cap:g}); with a fixed graph also "
            "static_graph=True (DDP then skips re-checking which parameters get gradients)",
        ),
        predicted=whatif.prediction(
            f,
            whatif.remove(step, saved),
            f"{f.comm.n_per_step:.0f} -> {n_after} collectives per step at alpha {f.comm.alpha_ms:.2f} ms each "
            f"(alpha-beta fit of service times), at most the {exposed_ms:.1f} ms exposed",
        ),
        confidence="medium",
    )


@rule(part="exposed_comm")
def rule_gradient_as_bucket_view(f: RunFacts) -> Suggestion | None:
    """DDP without ``gradient_as_bucket_view``: gradients are copied into buckets and back every step.

    Fires when that copy (2 x gradient bytes at COPY_BYTES_PER_S) exceeds
    BUCKET_COPY_MIN_SHARE of the step, or when memory is over 90 % (the
    view also saves one gradient-sized buffer). What-if: the copy removed.
    """
    if (
        not f.is_reftrain
        or f.cfg("parallel.strategy") != "ddp"
        or f.cfg("parallel.gradient_as_bucket_view") is not False
    ):
        return None
    if f.world_size < 2 or not f.step_time_ms or f.comm is None:
        return None
    grad_bytes = f.comm.bytes_per_step
    copy_ms = 1e3 * 2 * grad_bytes / COPY_BYTES_PER_S[f.device]
    mem = f.memory.fraction
    if copy_ms / f.step_time_ms <= BUCKET_COPY_MIN_SHARE and not (mem is not None and mem > 0.9):
        return None
    return Suggestion(
        title="Let gradients live in DDP's buckets (no copy, one gradient-sized buffer less)",
        trigger=f"estimated bucket copy {copy_ms / f.step_time_ms:.1%} of step > {BUCKET_COPY_MIN_SHARE:.0%}"
        + (f" or memory {mem:.0%} > 90%" if mem is not None else ""),
        evidence={
            "grad_bytes_per_step": grad_bytes,
            "copy_ms_estimate": copy_ms,
            "step_time_ms": f.step_time_ms,
            "memory_fraction": mem,
        },
        change=Change(
            {"parallel.gradient_as_bucket_view": True}, "DistributedDataParallel(model, gradient_as_bucket_view=True)"
        ),
        predicted=whatif.prediction(
            f,
            whatif.remove(f.step_time_ms, copy_ms),
            f"2 x {grad_bytes / 2**20:.1f} MiB copied at {COPY_BYTES_PER_S[f.device] / 1e9:.0f} GB/s removed",
        ),
        confidence="low",
    )


@rule(part="grad_sync")
def rule_overlap_grad_sync(f: RunFacts) -> Suggestion | None:
    """reftrain's explicit gradient sync after backward over GRAD_SYNC_MIN_SHARE: overlap it with backward.

    What-if: DDP all-reduces buckets as gradients become ready (its bucket
    copies happen in backward's hooks), so only the last bucket's all-reduce
    stays exposed: the measured all-reduce service time pro rata of that
    bucket's bytes replaces the whole sync.
    """
    if not f.is_reftrain or f.cfg("parallel.strategy") != "ddp" or f.cfg("parallel.overlap_grad_sync") is not False:
        return None
    sync = f.phases.get("grad_sync")
    if not sync or not f.step_time_ms or sync / f.step_time_ms <= GRAD_SYNC_MIN_SHARE:
        return None
    cap_mb = float(f.cfg("parallel.bucket_cap_mb", 25.0))
    tail = sync
    if f.comm is not None and f.comm.bytes_per_step > 0:
        # The explicit sync's flatten/copy work moves into DDP's hooks during backward;
        # what stays exposed is the all-reduce of the last bucket DDP issues.
        last = whatif.ddp_last_bucket_bytes(f.comm.bytes_per_step, cap_mb)
        tail = f.comm.service_ms_per_step * last / f.comm.bytes_per_step
    tail = min(tail, sync)
    return Suggestion(
        title="Overlap the gradient all-reduce with backward (DDP's bucketed hooks)",
        trigger=f"grad_sync {sync / f.step_time_ms:.1%} of step > GRAD_SYNC_MIN_SHARE {GRAD_SYNC_MIN_SHARE:.0%}",
        evidence={
            "grad_sync_ms": sync,
            "step_time_ms": f.step_time_ms,
            "grad_sync_share": sync / f.step_time_ms,
            "last_bucket_ms_estimate": tail,
        },
        change=Change(
            {"parallel.overlap_grad_sync": True},
            "let DistributedDataParallel all-reduce during backward instead of a manual all_reduce after it",
        ),
        predicted=whatif.prediction(
            f,
            whatif.remove(f.step_time_ms, sync - tail),
            f"the {sync:.1f} ms sync becomes the last bucket's {tail:.1f} ms tail",
        ),
        confidence="medium",
    )


@rule(part="exposed_comm")
def rule_grad_accumulation(f: RunFacts) -> Suggestion | None:
    """Exposed comm over 10 %: accumulate ACCUMULATION_FACTOR x more micro-batches per optimizer step.

    Gradients are synchronized once per optimizer step, so the exposed
    communication (and the optimizer) are paid once per ``k`` micro-batches.
    What-if: ``step' = step + (k - 1) * per-micro-batch time`` for ``k``
    times the tokens. The global batch grows ``k`` times: a change of
    optimization, so the learning rate may need retuning.
    """
    ex = _exposed(f)
    if ex is None or (not f.tokens_per_step and f.shares_source != "device") or _verdict(f) == "waiting":
        return None
    exposed_ms, share, step = ex
    ga = int(f.cfg("train.grad_accum", 1) or 1)
    per_micro = None
    if f.phases:
        fb = f.phases.get("forward", 0.0) + f.phases.get("backward", 0.0) + f.phases.get("data_wait", 0.0)
        per_micro = (fb - (exposed_ms - f.phases.get("grad_sync", 0.0))) / ga
    elif f.shares_source == "device":
        per_micro = step - exposed_ms  # one micro-batch per trace step assumed
    if per_micro is None or per_micro <= 0:
        return None
    k = ACCUMULATION_FACTOR
    step_after = whatif.accumulate_step_ms(step, per_micro, k)
    return Suggestion(
        title=f"Synchronize gradients every {k * ga} micro-batches instead of {ga}",
        trigger=f"exposed comm {share:.1%} of step > EXPOSED_COMM_MIN_SHARE {EXPOSED_COMM_MIN_SHARE:.0%}",
        evidence=_comm_evidence(f, exposed_ms, share)
        | {"grad_accum": ga, "per_micro_batch_ms": per_micro}
        | ({"tokens_per_step": f.tokens_per_step, "tokens_source": f.tokens_source} if f.tokens_per_step else {}),
        change=Change(
            {"train.grad_accum": k * ga},
            f"accumulate {k}x more micro-batches per optimizer step under model.no_sync() "
            "(the global batch grows; retune the learning rate)",
        ),
        predicted=whatif.prediction(
            f,
            step_after,
            f"{k}x the micro-batches ({per_micro:.1f} ms each) per step, exposed comm and optimizer once"
            + (
                ""
                if f.tokens_per_step
                else " (tokens per step unknown: the gain is per micro-batch of the trace's step)"
            ),
            tokens_per_step_after=f.tokens_per_step * k if f.tokens_per_step else None,
            work_ratio=1.0 if f.tokens_per_step else float(k),
        ),
        confidence="medium",
        notes=("changes the global batch size (optimization, not only speed)",),
    )


@rule(part="exposed_comm")
def rule_fsdp_reshard(f: RunFacts) -> Suggestion | None:
    """FSDP with exposed comm over 10 % and memory headroom: ``reshard_after_forward=False``.

    Parameters then stay gathered from forward to backward, so backward
    needs no all-gathers. What-if: half the all-gather service time per
    step (forward's gathers stay) is removed from the exposed time.
    Silent when memory is over FSDP_RESHARD_MAX_MEMORY.
    """
    ex = _exposed(f)
    if ex is None or f.comm is None or "all_gather" not in f.comm.kinds:
        return None
    if f.is_reftrain and (f.cfg("parallel.strategy") != "fsdp" or f.cfg("parallel.reshard_after_forward") is not True):
        return None
    mem = f.memory.fraction
    if mem is not None and mem > FSDP_RESHARD_MAX_MEMORY:
        return None
    exposed_ms, share, step = ex
    gather_share = f.comm.gather_service_share if f.comm.gather_service_share is not None else 0.5
    saved = min(exposed_ms, 0.5 * gather_share * f.comm.service_ms_per_step)
    return Suggestion(
        title="Keep gathered parameters from forward to backward (FSDP reshard_after_forward=False)",
        trigger=f"exposed comm {share:.1%} > {EXPOSED_COMM_MIN_SHARE:.0%}, memory "
        + (f"{mem:.0%}" if mem is not None else "unknown")
        + f" <= {FSDP_RESHARD_MAX_MEMORY:.0%}",
        evidence=_comm_evidence(f, exposed_ms, share)
        | {"memory_fraction": mem, "all_gather_service_share": gather_share},
        change=Change(
            {"parallel.reshard_after_forward": False},
            "fully_shard(module, reshard_after_forward=False) (FSDP1: ShardingStrategy.SHARD_GRAD_OP)",
        ),
        predicted=whatif.prediction(
            f,
            whatif.remove(step, saved),
            "backward's all-gathers (half of the all-gather service time) removed, "
            f"at most the {exposed_ms:.1f} ms exposed",
        ),
        confidence="low" if mem is None else "medium",
    )


# The step's last all-reduce over this share of the step is worth shrinking; DDP's smallest sensible cap (MiB).
LAST_BUCKET_MIN_SHARE = 0.05
LAST_BUCKET_MIN_CAP_MB = 5.0


@rule(part="exposed_comm")
def rule_last_bucket_overlap(f: RunFacts) -> Suggestion | None:
    """DDP trace whose last all-reduce of the step is long: a smaller bucket cap shortens the exposed tail.

    DDP fills buckets in reverse parameter order and all-reduces each as it
    fills; the last one (the first layers, often the embedding) is issued
    when backward ends, so nothing hides it. With ``bucket_cap_mb`` c' = c/4
    (at least LAST_BUCKET_MIN_CAP_MB) that bucket holds at most c' MiB.
    What-if from the alpha-beta fit: the tail ``alpha + L x per_byte``
    becomes ``alpha + min(L, c') x per_byte``; the extra buckets are issued
    during backward and overlap it. Needs sized kernels (traces), DDP, a tail
    over LAST_BUCKET_MIN_SHARE of the step; silent on a waiting or latency-bound verdict.
    """
    ex = _exposed(f)
    c = f.comm
    if ex is None or c is None or not _is_ddp(f) or c.last_bytes is None or c.last_ms is None:
        return None
    if c.alpha_ms is None or c.per_byte_ms is None or _verdict(f) in ("waiting", "latency_bound"):
        return None  # latency-bound: larger buckets (rule_ddp_bucket_size) are the advice, not smaller ones
    exposed_ms, share, step = ex
    if c.last_ms / step <= LAST_BUCKET_MIN_SHARE:
        return None
    cap = float(f.cfg("parallel.bucket_cap_mb", 25.0) or 25.0)
    new_cap = max(LAST_BUCKET_MIN_CAP_MB, cap / 4)
    if c.last_bytes <= new_cap * 2**20:
        return None  # the last bucket is already under the smaller cap
    tail_after = c.alpha_ms + new_cap * 2**20 * c.per_byte_ms
    saved = min(exposed_ms, c.last_ms - tail_after)
    if saved <= 0:
        return None
    return Suggestion(
        title=f"Shorten the exposed last gradient bucket: bucket_cap_mb {cap:g} -> {new_cap:g}",
        trigger=f"last all-reduce of the step {c.last_ms:.2f} ms = {c.last_ms / step:.1%} of step > "
        f"{LAST_BUCKET_MIN_SHARE:.0%}, {c.last_bytes / 2**20:.1f} MiB > {new_cap:g} MiB",
        evidence=_comm_evidence(f, exposed_ms, share)
        | {"last_bucket_bytes": c.last_bytes, "last_bucket_ms": c.last_ms, "comm_per_byte_ms": c.per_byte_ms},
        change=Change(
            {"parallel.bucket_cap_mb": new_cap},
            f"DistributedDataParallel(model, bucket_cap_mb={new_cap:g}): the bucket issued after backward "
            "(the first layers' gradients) gets smaller; with a large embedding first, consider its own bucket "
            "order (DDP buckets in reverse parameter order)",
        ),
        predicted=whatif.prediction(
            f,
            whatif.remove(step, saved),
            f"tail {c.last_ms:.2f} ms -> alpha {c.alpha_ms:.3f} + {new_cap:g} MiB x per-byte = {tail_after:.2f} ms "
            f"(alpha-beta fit), at most the {exposed_ms:.1f} ms exposed",
        ),
        confidence="low",
    )


@rule(part="exposed_comm")
def rule_fsdp_prefetch(f: RunFacts) -> Suggestion | None:
    """FSDP with exposed comm over 10 % and two or more all-gathers per step: gather the next modules ahead.

    Each FSDP unit all-gathers its parameters before its forward (and, when
    resharded, its backward); with prefetching the gather of unit ``i + 1``
    runs while unit ``i`` computes. What-if: of the exposed time, the
    all-gathers' part (their share of the service time) is hidden except the
    first gather of the step, which has no compute before it:
    ``saved = exposed x gather_share x (1 - 1 / gathers_per_step)``.
    Silent on a waiting verdict (prefetching does not make a peer earlier).
    """
    ex = _exposed(f)
    if ex is None or f.comm is None or "all_gather" not in f.comm.kinds or f.comm.gathers_per_step < 2:
        return None
    if f.is_reftrain and f.cfg("parallel.strategy") != "fsdp":
        return None
    if f.comm.gather_service_share is None or _verdict(f) == "waiting":
        return None
    exposed_ms, share, step = ex
    g = f.comm.gathers_per_step
    saved = exposed_ms * f.comm.gather_service_share * (1 - 1 / g)
    return Suggestion(
        title="Prefetch FSDP all-gathers one module ahead (overlap them with the previous module's compute)",
        trigger=f"exposed comm {share:.1%} > {EXPOSED_COMM_MIN_SHARE:.0%} with {g:.0f} all-gathers per step",
        evidence=_comm_evidence(f, exposed_ms, share)
        | {"all_gathers_per_step": g, "all_gather_service_share": f.comm.gather_service_share},
        change=Change(
            {},
            "FSDP2: module.set_modules_to_forward_prefetch([next_block]) and "
            "set_modules_to_backward_prefetch([previous_block]) per transformer block; FSDP1: "
            "FullyShardedDataParallel(..., forward_prefetch=True, backward_prefetch=BackwardPrefetch.BACKWARD_PRE)",
        ),
        predicted=whatif.prediction(
            f,
            whatif.remove(step, saved),
            f"the all-gathers' {f.comm.gather_service_share:.0%} of the {exposed_ms:.1f} ms exposed hidden but the "
            f"first of {g:.0f} per step",
        ),
        confidence="low",
        notes=("prefetching holds one more module's gathered parameters: check memory headroom",),
    )


@rule(part="exposed_comm")
def rule_comm_compression(f: RunFacts) -> Suggestion | None:
    """Exposed all-reduce time dominated by bytes (not latency) on fp32 gradients: bf16 compression hook.

    What-if: the per-byte part of the service time halves (2-byte instead of
    4-byte gradients on the wire), at most the exposed time. reftrain has no
    knob for comm hooks, so the change is plain PyTorch advice.
    """
    ex = _exposed(f)
    if ex is None or f.comm is None or f.comm.per_byte_ms is None or not _is_ddp(f) or _verdict(f) == "waiting":
        return None
    bytes_ms = f.comm.bytes_per_step * f.comm.per_byte_ms
    if bytes_ms <= 0.5 * f.comm.service_ms_per_step:
        return None  # latency-bound: compression would not help
    exposed_ms, share, step = ex
    saved = min(exposed_ms, 0.5 * bytes_ms)
    return Suggestion(
        title="Send gradients in bf16 (DDP compression hook)",
        trigger=f"exposed comm {share:.1%} > {EXPOSED_COMM_MIN_SHARE:.0%}, bandwidth part {bytes_ms:.1f} ms of "
        f"{f.comm.service_ms_per_step:.1f} ms service",
        evidence=_comm_evidence(f, exposed_ms, share) | {"comm_bandwidth_ms_per_step": bytes_ms},
        change=Change(
            {},
            "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks; "
            "model.register_comm_hook(None, default_hooks.bf16_compress_hook)",
        ),
        predicted=whatif.prediction(
            f,
            whatif.remove(step, saved),
            f"half of the {bytes_ms:.1f} ms bandwidth-bound service per step saved",
        ),
        confidence="low",
        notes=("gradients are averaged in bf16: a small numerical change",),
    )


# Exposed communication above this share of the step on a single traced rank is diagnosed (rule_comm_one_rank):
# one rank's trace cannot tell waiting for a peer from the transfer.
ONE_RANK_COMM_MIN_SHARE = 0.20


@rule(part="exposed_comm")
def rule_comm_one_rank(f: RunFacts) -> Suggestion | None:
    """Diagnosis: exposed comm over 20 % of the step, seen on one rank only: waiting or transfer cannot be told apart.

    A communication kernel on one rank runs from its launch until the
    slowest peer has joined and the data has moved, so its time holds both
    the wait for a slower peer and the transfer. Only the other ranks'
    arrivals separate them (the straggler rule does, from all ranks'
    traces). What-if (an upper bound): all exposed communication removed.
    """
    if f.kind != "traces" or f.ranks_traced != 1 or not f.step_time_ms or f.exposed_comm_ms is None:
        return None
    share = f.exposed_comm_ms / f.step_time_ms
    if share <= ONE_RANK_COMM_MIN_SHARE or _verdict(f) == "waiting":
        return None  # the waiting verdict has its own diagnosis (rule_comm_waiting)
    evidence = _comm_evidence(f, f.exposed_comm_ms, share) | {"ranks_traced": f.ranks_traced}
    if f.comm_diagnosis is not None:
        evidence |= {"comm_verdict": f.comm_diagnosis.verdict, "comm_verdict_reason": f.comm_diagnosis.reason}
    return Suggestion(
        title=f"Exposed communication is {share:.0%} of the step; one rank's trace cannot tell waiting for a peer from a slow transfer",
        trigger=f"exposed comm {share:.1%} > {ONE_RANK_COMM_MIN_SHARE:.0%} with {f.ranks_traced} rank traced",
        evidence=evidence,
        change=Change(
            {},
            "profile every rank in the same steps (torch.profiler.profile on each rank with the same "
            "schedule, one trace file per rank in one folder) and run `analyzer suggest FOLDER`: the "
            "ranks' collective arrivals then show whether one rank arrives late (a straggler) or all "
            "wait on the transfer (bucket size, overlap, compression)",
        ),
        predicted=whatif.prediction(
            f, whatif.remove(f.step_time_ms, f.exposed_comm_ms), "upper bound: all exposed communication removed"
        ),
        confidence="low",
        kind="diagnosis",
    )


# The waiting verdict is reported above this share of the step in exposed communication.
WAITING_MIN_SHARE = 0.05


@rule(part="exposed_comm")
def rule_comm_waiting(f: RunFacts) -> Suggestion | None:
    """Diagnosis: the communication kernels wait for peers (analyzer.metrics.collectives' ``waiting`` verdict).

    Fires when the traced collectives are diagnosed *waiting* (large messages
    far below the link's peak with a wide spread, or, without sizes, most of
    the time in kernels over WAIT_FACTOR x their kind's median) and exposed
    comm is over WAITING_MIN_SHARE of the step. No config change follows from
    it: a slower peer or a sync point (a .item(), a barrier, uneven data) is
    the cause, and only all ranks' traces name it. What-if (an upper bound):
    all exposed communication removed.
    """
    d = f.comm_diagnosis
    if d is None or d.verdict != "waiting" or not f.step_time_ms or f.exposed_comm_ms is None:
        return None
    share = f.exposed_comm_ms / f.step_time_ms
    if share <= WAITING_MIN_SHARE:
        return None
    evidence = (
        {
            "exposed_comm_ms": f.exposed_comm_ms,
            "step_time_ms": f.step_time_ms,
            "exposed_comm_share": share,
            "ranks_traced": f.ranks_traced,
            "link": f.link_name,
        }
        | d.evidence
        | {"verdict": d.reason}
    )
    one = f.ranks_traced <= 1
    return Suggestion(
        title=f"Collectives wait for peers: exposed communication {share:.0%} of the step is mostly waiting, not transfer",
        trigger=f"collectives diagnosed waiting ({d.reason.split(':')[0]}), exposed comm {share:.1%} > {WAITING_MIN_SHARE:.0%}",
        evidence=evidence,
        change=Change(
            {},
            (
                "profile every rank in the same steps (torch.profiler.profile on each rank with the same "
                "schedule, one trace file per rank in one folder) and run `analyzer suggest FOLDER` to name "
                "the rank that arrives late; "
                if one
                else "see the straggler report for the rank that arrives late; "
            )
            + "then look on it for a host sync (.item(), .cpu(), a barrier) or uneven input before the collective",
        ),
        predicted=whatif.prediction(
            f,
            whatif.remove(f.step_time_ms, f.exposed_comm_ms),
            "upper bound: all exposed communication removed (the wait ends when the late peer is fixed)",
        ),
        confidence="low" if one else "medium",
        kind="diagnosis",
    )
