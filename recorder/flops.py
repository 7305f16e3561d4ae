"""FLOPs of one training step, measured with torch's ``FlopCounterMode`` (docs/record.md, "Model FLOPs").

One step of the user's loop runs under a :class:`StepFlopCounter`; every
dispatched aten op with a FLOP formula is counted once and charged to one of
three phases:

* ``model``: the forward and backward of the model as written (PaLM's model
  FLOPs, the numerator of MFU);
* ``recompute``: forwards that activation checkpointing runs again during the
  backward pass. Hardware FLOPs (HFU's numerator) are ``model + recompute``;
* ``optimizer``: ops inside ``Optimizer.step`` (a Newton-Schulz or Shampoo
  optimizer does matmuls). These are not model FLOPs and are reported apart,
  in neither total: MFU compares the model's arithmetic with the peak
  (PaLM appendix B), whatever the optimizer costs.

How recompute is told apart: the autograd engine runs backward functions
with grad mode off (for ``create_graph=False``), and both checkpoint
implementations re-run the forward with grad mode on inside that backward
(``torch.utils.checkpoint``: ``CheckpointFunction.backward`` for the
reentrant one, the saved-tensor unpack hook for the non-reentrant one). So
an op dispatched while a backward graph task runs
(``torch._C._current_graph_task_id() != -1``) with grad mode on is
recompute. A backward with ``create_graph=True`` (higher-order gradients)
runs all its ops with grad on, so there the split cannot be made: such a
step's backward would read as recompute, a limitation docs/record.md states.

Why the real first step and not a fake-tensor copy: the ops of a step depend
on its data where routing does (a mixture-of-experts layer sends a
data-dependent number of tokens to each expert; under FakeTensorMode those
sizes are unbacked symbols the formulas cannot count), and a copy would need
the user's loss and inputs rebuilt. Counting the real step runs nothing
twice: the step computes exactly what it would, while the mode adds a Python
call per op (once, on a step that is warm-up anyway).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from analyzer.ingest import formats as fmt

aten = torch.ops.aten

SOURCE = "FlopCounterMode"


def _cpu_flash_attention_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """CPU flash attention forward: QK^T and PV, as torch counts the CUDA kernels' (causal not discounted)."""
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_flash_attention_backward_flop(
    grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
) -> int:
    """CPU flash attention backward: scores recomputed, then dV, dP, dQ, dK, as torch counts the CUDA kernels'."""
    return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


# Formulas FlopCounterMode lacks for ops a training step runs: the CPU flash
# attention kernels F.scaled_dot_product_attention picks on CPU. Their
# arguments start (query, key, value) and (grad_out, query, key, value) like
# the CUDA flash kernels', so torch's own SDPA counts apply. Passed as the
# counter's custom mapping (nothing registered globally), and only where torch
# has no formula of its own.
ADDED_FORMULAS: dict[Any, Any] = {
    op: formula
    for op, formula in (
        (aten._scaled_dot_product_flash_attention_for_cpu, _cpu_flash_attention_flop),
        (aten._scaled_dot_product_flash_attention_for_cpu_backward, _cpu_flash_attention_backward_flop),
    )
    if op not in flop_counter.flop_registry
}


# torch counts an attention backward as five products (flop_counter.sdpa_backward_flop_count):
# the scores QK^T computed again, then dP, dV, dQ, dK. The first is the fused
# kernel's own recompute (flash and memory-efficient kernels keep no score
# matrix; the math backend keeps it and runs four): hardware FLOPs, not model
# FLOPs, so that the model's count does not depend on the SDPA backend and is
# PaLM's 12LHQT. Arguments start (grad_out, query, key, value) for all of them.
ATTENTION_BACKWARD_OPS = frozenset(
    {
        aten._scaled_dot_product_efficient_attention_backward,
        aten._scaled_dot_product_flash_attention_backward,
        aten._scaled_dot_product_cudnn_attention_backward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward,
        aten._flash_attention_backward,
        aten._efficient_attention_backward,
    }
)


def attention_backward_recompute(flops: int, query_head_dim: int, value_head_dim: int) -> int:
    """The scores' recompute inside an attention backward of ``flops`` FLOPs (torch's count).

    Of torch's five products, QK^T, dQ and dK have the query's head dim E and
    dP and dV the value's Ev: 2BHLS(3E + 2Ev) in all, QK^T being 2BHLS E.
    """
    return flops * query_head_dim // (3 * query_head_dim + 2 * value_head_dim)


def _in_recompute() -> bool:
    """True inside activation checkpointing's recompute (see the module doc)."""
    return torch._C._current_graph_task_id() != -1 and torch.is_grad_enabled()


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one training step on one rank, by phase, and what they were counted over.

    ``model``: forward + backward as written (MFU). ``hardware``: as run,
    ``model + recompute`` (HFU). ``optimizer``: inside ``Optimizer.step``,
    in neither. ``by_op``: model FLOPs per aten op (``aten.mm``: ...).
    ``tokens``: tokens of the counted step on this rank, when the loop gave
    them (``per_token`` needs them). ``added_formulas``: ops counted with a
    formula this module adds to torch's.
    """

    model: int
    recompute: int
    optimizer: int
    by_op: dict[str, int] = field(default_factory=dict)
    tokens: int | None = None
    step: int | None = None
    torch_version: str = torch.__version__
    added_formulas: list[str] = field(default_factory=list)

    @property
    def hardware(self) -> int:
        return self.model + self.recompute

    @property
    def per_token(self) -> float | None:
        return self.model / self.tokens if self.tokens else None

    @property
    def per_token_hardware(self) -> float | None:
        return self.hardware / self.tokens if self.tokens else None

    @property
    def detail(self) -> str:
        """One line naming the measurement, for run.json's ``flops.detail``."""
        where = f"step {self.step}" if self.step is not None else "one step"
        return (
            f"torch.utils.flop_counter.{SOURCE} (torch {self.torch_version}) over {where} on rank 0: "
            "forward + backward; recompute and the optimizer step apart"
        )

    def to_manifest(self) -> fmt.Flops:
        """run.json's ``flops`` (docs/rundir.md): per token when the step's tokens are known."""
        return fmt.Flops(
            per_token=self.per_token,
            per_token_hardware=self.per_token_hardware,
            source="measured",
            detail=self.detail,
            measured=fmt.MeasuredFlops(
                model=self.model,
                hardware=self.hardware,
                recompute=self.recompute,
                optimizer=self.optimizer,
                tokens=self.tokens,
                step=self.step,
                by_op=dict(self.by_op),
                added_formulas=list(self.added_formulas),
            ),
        )


class _PhaseCounter(FlopCounterMode):
    """FlopCounterMode that also charges each counted op to a phase.

    ``_count_flops`` is the one place FlopCounterMode evaluates a formula (its
    dispatch mode calls it for every op after decomposition); overriding it is
    the only way to see each count with the state it ran in.
    """

    def __init__(self) -> None:
        super().__init__(display=False, custom_mapping=ADDED_FORMULAS)
        self.phases: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.in_optimizer = 0

    def _count_flops(self, func_packet, out, args, kwargs):
        formula = self.flop_registry.get(func_packet)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
            if self.in_optimizer:
                phase = "optimizer"
            elif _in_recompute():
                phase = "recompute"
            else:
                phase = "model"
            if phase == "model" and func_packet in ATTENTION_BACKWARD_OPS:
                scores = attention_backward_recompute(flops, args[1].shape[-1], args[3].shape[-1])
                self.phases["recompute"][str(func_packet)] += scores
                flops -= scores
            self.phases[phase][str(func_packet)] += flops
        return super()._count_flops(func_packet, out, args, kwargs)


class StepFlopCounter:
    """Count one training step: ``with StepFlopCounter() as c: <forward, backward, optimizer step>``.

    ``c.result(tokens=..., step=...)`` is the :class:`StepFlops`. Every
    optimizer's ``step`` is recognised through torch's global optimizer
    hooks, installed only inside the block; a closure passed to ``step`` counts
    as the model's. Counting the same block twice
    gives the same numbers: the counts restart on every entry.
    """

    def __init__(self) -> None:
        self._counter: _PhaseCounter | None = None
        self._hooks: list[Any] = []

    def __enter__(self) -> StepFlopCounter:
        counter = _PhaseCounter()

        def pre(optimizer: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            counter.in_optimizer += 1
            # A closure (Lightning passes one; LBFGS needs one) runs the forward and backward inside
            # Optimizer.step: they are model FLOPs, so the counter leaves the optimizer phase for it.
            # args are step's own: (the optimizer, closure?)
            closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
            if closure is None:
                return None

            def model_closure() -> Any:
                counter.in_optimizer -= 1
                try:
                    return closure()
                finally:
                    counter.in_optimizer += 1

            if "closure" in kwargs:
                return args, {**kwargs, "closure": model_closure}
            return (args[0], model_closure, *args[2:]), kwargs

        def post(*_: Any) -> None:
            counter.in_optimizer -= 1

        self._hooks = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
        self._counter = counter
        counter.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._counter is not None
        try:
            self._counter.__exit__(*exc)
        finally:
            for handle in self._hooks:
                handle.remove()
            self._hooks = []

    def result(self, tokens: int | None = None, step: int | None = None) -> StepFlops:
        if self._counter is None:
            raise RuntimeError("StepFlopCounter.result() before the counted block ran")
        phases = self._counter.phases
        by_op = dict(sorted(phases["model"].items(), key=lambda kv: -kv[1]))
        used = {str(op) for ops in phases.values() for op in ops}
        added = sorted(str(op) for op in ADDED_FORMULAS if str(op) in used)
        return StepFlops(
            model=sum(phases["model"].values()),
            recompute=sum(phases["recompute"].values()),
            optimizer=sum(phases["optimizer"].values()),
            by_op=by_op,
            tokens=tokens,
            step=step,
            added_formulas=added,
        )
