"""Rules on device memory: peak memory over MEMORY_HIGH of the GPU.

Both rules trade speed for headroom (their predicted gain is negative):
they are shown because a run this close to the limit fails on the next
longer sequence or larger batch, and because the headroom they free is what
rules micro_batch / launch_bound spend. docs/suggestions.md is the reference.
"""

from __future__ import annotations

from analyzer.verbs.suggest import whatif
from analyzer.verbs.suggest.engine import Change, Suggestion, rule
from analyzer.verbs.suggest.facts import RunFacts

# The threshold: peak memory over 90 % of the device.
MEMORY_HIGH = 0.90
# Activation checkpointing recomputes each block's forward in backward: the
# step grows by about one forward (PaLM appendix B counts the same extra
# forward in HFU); on a trace without phase times, forward ~ 1/3 of compute.
FORWARD_SHARE_OF_COMPUTE = 1.0 / 3.0


def _pressure(f: RunFacts) -> float | None:
    mem = f.memory.fraction
    return mem if (mem is not None and mem > MEMORY_HIGH) else None


def _forward_ms(f: RunFacts) -> float | None:
    if "forward" in f.phases:
        return f.phases["forward"]
    if f.shares_source == "device" and f.step_time_ms:
        compute = (f.shares.get("compute", 0.0) + f.shares.get("overlapped_comm", 0.0)) * f.step_time_ms
        return compute * FORWARD_SHARE_OF_COMPUTE
    return None


def _memory_evidence(f: RunFacts, mem: float) -> dict:
    return {
        "peak_memory_bytes": f.memory.peak_bytes,
        "memory_capacity_bytes": f.memory.capacity_bytes,
        "memory_fraction": mem,
        "memory_kind": f.memory.kind,
        "capacity_source": f.memory.capacity_source,
        "step_time_ms": f.step_time_ms,
    }


@rule(part="compute", flops=True)
def rule_activation_checkpointing(f: RunFacts) -> Suggestion | None:
    """Peak memory over MEMORY_HIGH without activation checkpointing: recompute activations in backward.

    What-if: the step grows by one forward (the measured ``forward_ms``, or
    a third of the device compute time on traces); MFU falls by the same
    ratio, HFU stays.
    """
    mem = _pressure(f)
    if mem is None or not f.step_time_ms or (f.is_reftrain and f.cfg("train.activation_checkpointing")):
        return None
    if f.recompute is not None:
        return None  # the trace recomputes activations already (rules_recompute)
    fwd = _forward_ms(f)
    if fwd is None:
        return None
    return Suggestion(
        title=f"Memory at {mem:.0%}: recompute activations in backward",
        trigger=f"peak memory {mem:.1%} of the device > MEMORY_HIGH {MEMORY_HIGH:.0%}",
        evidence=_memory_evidence(f, mem) | {"forward_ms": fwd},
        change=Change(
            {"train.activation_checkpointing": True} if f.is_reftrain else {},
            "wrap each transformer block: torch.distributed.algorithms._checkpoint.checkpoint_wrapper."
            "checkpoint_wrapper(block) or torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
        ),
        predicted=whatif.prediction(f, f.step_time_ms + fwd, f"one more forward ({fwd:.1f} ms) per step"),
        confidence="medium",
        notes=("costs speed; buys the headroom a larger micro-batch or longer sequence needs",),
    )


@rule(part="other")
def rule_smaller_micro_batch(f: RunFacts) -> Suggestion | None:
    """Peak memory over MEMORY_HIGH: half the micro-batch, twice the accumulation (same tokens per step).

    What-if: activations halve; each micro-batch keeps its fixed cost. On
    CPU timelines the micro-batch model of rule micro_batch (factor 1/2,
    twice the micro-batches); on GPU the launch gaps (idle) are paid twice.
    """
    mem = _pressure(f)
    mb = f.cfg("train.micro_batch_size")
    if mem is None or not f.step_time_ms or not f.is_reftrain or not mb or mb < 2:
        return None
    ga = int(f.cfg("train.grad_accum", 1) or 1)
    split = whatif.cpu_micro_batch_split(f) if f.device == "cpu" else None
    if split is not None:
        c0 = split[1]
        step_after = f.step_time_ms + ga * c0  # ga more fixed costs, the same sequences
        method = f"{ga} more micro-batches of fixed cost {c0:.1f} ms each"
    else:
        idle = f.shares.get("idle", 0.0) * f.step_time_ms if f.shares_source == "device" else 0.0
        step_after = f.step_time_ms + idle
        method = f"the step's launch gaps ({idle:.1f} ms idle) paid twice"
    return Suggestion(
        title=f"Memory at {mem:.0%}: micro-batch {mb} -> {mb // 2} with grad_accum {ga} -> {2 * ga}",
        trigger=f"peak memory {mem:.1%} of the device > MEMORY_HIGH {MEMORY_HIGH:.0%}",
        evidence=_memory_evidence(f, mem) | {"micro_batch_size": mb, "grad_accum": ga},
        change=Change(
            {"train.micro_batch_size": mb // 2, "train.grad_accum": 2 * ga},
            "half the per-GPU batch and accumulate twice as many micro-batches under model.no_sync()",
        ),
        predicted=whatif.prediction(f, step_after, method),
        confidence="medium",
        notes=("costs speed; keeps the same global batch with half the activation memory",),
    )
