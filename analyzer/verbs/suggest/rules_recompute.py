"""Rules on activation recompute: checkpoint selectively when the rerun forward ops are a visible share of the step.

The facts (``RunFacts.recompute``, analyzer.metrics.workload) find
recompute from the trace alone: forward ops (an autograd ``Sequence
number`` with ``Fwd thread id`` 0) running inside backward's
``autograd::engine::evaluate_function`` ranges, which is what both of
``torch.utils.checkpoint``'s implementations do. docs/suggestions.md
("Recompute") is the reference.
"""

from __future__ import annotations

from typing import Any

from analyzer.verbs.suggest import whatif
from analyzer.verbs.suggest.engine import Change, Confidence, Suggestion, rule
from analyzer.verbs.suggest.facts import RecomputeFacts, RunFacts

# Recompute over this share of the step is worth trading memory for.
RECOMPUTE_MIN_SHARE = 0.05
# After the change, peak memory must stay under this share of the device (rules_memory.MEMORY_HIGH's figure).
MEMORY_LIMIT = 0.90
# Keeping under this share of the matmul outputs (memory allows no more) is not worth the policy's complexity.
MIN_KEPT_FRACTION = 0.10
# Activations a standard transformer layer stores, in bytes per token and hidden unit at 2-byte elements, plus
# 5 a s / h for the attention scores (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
# Transformer Models", eq. 1: s b h (34 + 5 a s / h)); with checkpointing, the layer's input (2 bytes) stays.
KORTHIKANTI_BYTES_PER_ELEMENT = 34.0

_POLICY = (
    "from functools import partial; from torch.utils.checkpoint import checkpoint, CheckpointPolicy, "
    "create_selective_checkpoint_contexts; "
    "policy = lambda ctx, op, *a, **k: CheckpointPolicy.MUST_SAVE if op in (torch.ops.aten.mm.default, "
    "torch.ops.aten.addmm.default, torch.ops.aten._scaled_dot_product_flash_attention.default, "
    "torch.ops.aten._scaled_dot_product_efficient_attention.default) else CheckpointPolicy.PREFER_RECOMPUTE; "
    "checkpoint(block, x, use_reentrant=False, context_fn=partial(create_selective_checkpoint_contexts, policy))"
)


def _full_activation_bytes(f: RunFacts) -> float | None:
    """reftrain: the extra bytes all blocks' activations take without checkpointing (Korthikanti eq. 1), or None."""
    layers, width, heads, seq = (
        f.cfg("model.n_layers"),
        f.cfg("model.d_model"),
        f.cfg("model.n_heads"),
        f.cfg("model.seq_len"),
    )
    batch = f.cfg("train.micro_batch_size")
    if not all(isinstance(v, int) and v > 0 for v in (layers, width, heads, seq, batch)):
        return None
    element = 2.0 if f.cfg("train.dtype") == "bf16" else 4.0
    per_layer = seq * batch * width * (KORTHIKANTI_BYTES_PER_ELEMENT + 5.0 * heads * seq / width - 2.0)
    return float(layers * per_layer * element / 2.0)


def _evidence(f: RunFacts, r: RecomputeFacts, recompute_ms: float, flop_ms: float) -> dict[str, Any]:
    """The evidence both of the rule's suggestions carry."""
    return {
        "recompute_ms": recompute_ms,
        "recompute_share": r.share,
        "recompute_flop_ms": flop_ms,
        "recompute_ranges_per_window": r.ranges_per_window,
        "recompute_matmul_ops_per_window": r.flop_ops,
        "matmul_output_bytes": r.out_bytes,
        "matmul_ops_with_known_size": r.shaped_ops,
        "checkpoint_implementation": "reentrant (CheckpointFunctionBackward)" if r.reentrant else "non-reentrant",
        "peak_memory_bytes": r.peak_bytes,
        "memory_capacity_bytes": r.capacity_bytes,
        "memory_source": r.memory_source,
        "step_time_ms": f.step_time_ms,
        "windows": r.windows,
        "ranks": r.ranks,
    }


def _turn_off(
    f: RunFacts,
    r: RecomputeFacts,
    evidence: dict[str, Any],
    step_time_ms: float,
    recompute_ms: float,
    limit: float | None,
) -> Suggestion | None:
    """reftrain with activation checkpointing on and every activation fitting under ``limit`` (bytes;
    Korthikanti et al.'s per-layer bytes): turn it off, the gain the whole recompute; else None."""
    if (
        f.is_reftrain
        and f.cfg("train.activation_checkpointing") is True
        and r.peak_bytes is not None
        and r.capacity_bytes is not None
        and limit
    ):
        full = _full_activation_bytes(f)
        if full is not None and r.peak_bytes + full <= limit:
            return Suggestion(
                title=f"Recompute is {r.share:.0%} of the step and the activations fit: turn activation checkpointing off",
                trigger=f"recompute {r.share:.1%} of step > RECOMPUTE_MIN_SHARE {RECOMPUTE_MIN_SHARE:.0%}; peak "
                f"{r.peak_bytes / 2**30:.1f} GiB + all activations {full / 2**30:.1f} GiB <= "
                f"{MEMORY_LIMIT:.0%} of {r.capacity_bytes / 2**30:.0f} GiB",
                evidence=evidence | {"activation_bytes_estimate": full},
                change=Change(
                    {"train.activation_checkpointing": False},
                    "stop wrapping the blocks in checkpoint_wrapper: every activation is kept",
                ),
                predicted=whatif.prediction(
                    f,
                    whatif.remove(step_time_ms, recompute_ms),
                    f"the {recompute_ms:.1f} ms of recompute per step removed",
                ),
                confidence="medium",
                notes=("activation bytes from Korthikanti et al. 2022 eq. 1 for a standard transformer layer",),
            )
    return None


@rule(part="compute")
def rule_selective_checkpointing(f: RunFacts) -> Suggestion | None:
    """Recompute over RECOMPUTE_MIN_SHARE of the step with the memory to keep some of it: checkpoint selectively.

    What-if (never more than removing the recompute): a selective policy
    saves the outputs of the matmul-like ops (GEMM, attention) and still
    recomputes the rest (elementwise, norms: cheap to rerun, as large to
    store), so the step loses the recompute's GEMM/attention time
    ``flop_share x step``. It holds the recomputed matmuls' outputs
    (``out_bytes``) from forward to backward: when peak + that exceeds
    MEMORY_LIMIT of the device, only the fraction that fits is kept (that
    share of the blocks saves its matmul outputs), and the gain scales with
    it; silent under MIN_KEPT_FRACTION. reftrain runs (one switch,
    ``train.activation_checkpointing``): when even all activations fit
    (Korthikanti et al.'s per-layer bytes), the change is to turn it off and
    the gain is the whole recompute. Memory unknown: the advice stands with
    low confidence and says so.
    """
    r = f.recompute
    if r is None or not f.step_time_ms or r.share <= RECOMPUTE_MIN_SHARE:
        return None
    recompute_ms = r.share * f.step_time_ms
    flop_ms = min(recompute_ms, r.flop_share * f.step_time_ms)
    shapes_known = r.flop_ops > 0 and r.shaped_ops >= r.flop_ops
    evidence = _evidence(f, r, recompute_ms, flop_ms)
    notes: list[str] = []
    limit = MEMORY_LIMIT * r.capacity_bytes if r.capacity_bytes is not None else None
    off = _turn_off(f, r, evidence, f.step_time_ms, recompute_ms, limit)
    if off is not None:
        return off
    if flop_ms <= 0:
        return None  # only cheap ops are recomputed: a selective policy has nothing expensive to save
    kept = 1.0
    if limit is not None and r.peak_bytes is not None and r.out_bytes > 0 and r.peak_bytes + r.out_bytes > limit:
        kept = max(0.0, (limit - r.peak_bytes) / r.out_bytes)
        if kept < MIN_KEPT_FRACTION:
            return None  # memory does not allow it
    saved = flop_ms * kept
    confidence: Confidence
    if r.capacity_bytes is None:
        confidence = "low"
        notes.append(
            "memory headroom unknown (no peak memory or device capacity): check that the saved matmul "
            f"outputs (~{r.out_bytes / 2**20:.0f} MiB per rank) fit"
        )
    else:
        confidence = "medium" if shapes_known else "low"
    if not shapes_known:
        notes.append(
            f"{r.shaped_ops:.0f} of {r.flop_ops:.0f} recomputed matmul ops have a known output size: "
            "the memory cost is a lower bound"
        )
    which = "the blocks' matmul outputs" if kept >= 1.0 else f"the matmul outputs of {kept:.0%} of the blocks"
    reftrain = f.is_reftrain and f.cfg("train.activation_checkpointing") is True
    advice = f"save {which} and recompute the rest: {_POLICY}" + (
        "; reftrain has one switch (train.activation_checkpointing, every block), so this is a code change "
        "in reftrain/parallel.py apply_activation_checkpointing: checkpoint_wrapper(block, "
        "context_fn=partial(create_selective_checkpoint_contexts, policy))"
        if reftrain
        else ""
    )
    return Suggestion(
        title=f"Recompute is {r.share:.0%} of the step: checkpoint selectively (save matmul outputs, recompute the rest)",
        trigger=f"recompute {r.share:.1%} of step > RECOMPUTE_MIN_SHARE {RECOMPUTE_MIN_SHARE:.0%}, "
        f"{flop_ms:.1f} ms of it in GEMM/attention kernels"
        + (
            f", memory after {(r.peak_bytes + kept * r.out_bytes) / r.capacity_bytes:.0%} <= {MEMORY_LIMIT:.0%}"
            if r.capacity_bytes is not None and r.peak_bytes is not None
            else ", memory unknown"
        ),
        evidence=evidence | {"kept_fraction": kept},
        change=Change({}, advice),
        predicted=whatif.prediction(
            f,
            whatif.remove(f.step_time_ms, saved),
            f"the recompute's GEMM/attention time {flop_ms:.1f} ms"
            + (f" x {kept:.2f} kept" if kept < 1.0 else "")
            + f" removed, at most the {recompute_ms:.1f} ms recompute",
        ),
        confidence=confidence,
        notes=tuple(notes) + ("holds the saved outputs from forward to backward: more memory, less recompute",),
    )
