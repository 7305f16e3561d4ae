"""Model FLOPs per token (PaLM appendix B); the peak FLOP/s that MFU divides by is recorder.peak's.

docs/mfu.md states every term; this module is the formula.
"""

from __future__ import annotations

from dataclasses import dataclass

# The peak lives with the recorder, which measures it for any loop; reftrain's
# call sites keep reading it through this module.
from recorder.peak import (  # noqa: F401
    GPU_PEAKS,
    MEASURE_MAX_SIZE,
    MEASURE_MIN_TIME_S,
    MEASURE_REPEATS,
    PeakFlops,
    measure_matmul_peak,
    peak_dtype,
    table_peak,
)

FORMULA = "6*N + 12*L*H*Q*T per token (PaLM, Chowdhery et al. 2022, appendix B)"
HARDWARE_FORMULA = (
    "model FLOPs + 2*L*H*Q*T (attention backward recomputes its scores); under activation "
    "checkpointing + 2*(N_blocks - L*F*D) + 4*L*H*Q*T (each block's forward again, up to its "
    "last saved activation: all but the MLP's output projection)"
)


@dataclass(frozen=True)
class FlopsPerToken:
    """Training FLOPs per token. `model` excludes recompute; `hardware` includes it."""

    model: int
    hardware: int
    n: int  # non-embedding parameters (N)
    n_blocks: int  # parameters inside the transformer blocks
    n_layers: int  # L
    n_heads: int  # H
    head_dim: int  # Q
    seq_len: int  # T
    d_model: int  # D
    d_ff: int  # F: MLP hidden width

    def to_manifest(self) -> dict:
        """The manifest's `flops` object (docs/rundir.md)."""
        return {
            "per_token": self.model,
            "per_token_hardware": self.hardware,
            "formula": FORMULA,
            "hardware_formula": HARDWARE_FORMULA,
            "terms": {
                "N": self.n,
                "N_blocks": self.n_blocks,
                "L": self.n_layers,
                "H": self.n_heads,
                "Q": self.head_dim,
                "T": self.seq_len,
                "D": self.d_model,
                "F": self.d_ff,
            },
        }


def flops_per_token(
    n_non_embedding: int,
    n_blocks: int,
    n_layers: int,
    n_heads: int,
    head_dim: int,
    seq_len: int,
    d_ff: int,
    activation_checkpointing: bool,
) -> FlopsPerToken:
    """PaLM's model FLOPs per token, 6N + 12LHQT, and the hardware FLOPs as the step runs them.

    6N: every weight does one multiply-add (2 FLOPs) per token in forward and
    two in backward (input and weight gradients). 12LHQT: attention's two
    matmuls (QK^T and AV), 2*2*H*Q*T per layer per token forward, times three
    for forward plus backward; causal masking is not discounted (as in PaLM).

    Hardware FLOPs add what runs twice, as torch's FlopCounterMode counts it
    (recorder.flops, the reference; tests/test_recorder_flops.py holds the two
    within 0.1 %):
    - 2LHQT: a fused SDPA backward (flash, memory-efficient, CPU flash: the
      kernels scaled_dot_product_attention picks for this model) keeps no
      score matrix and computes QK^T again.
    - With activation checkpointing, each block's forward once more in
      backward: 4LHQT for its attention and 2 FLOPs per token per weight of
      its matmuls, except the MLP's output projection (L*F*D weights).
      torch.utils.checkpoint's non-reentrant implementation (what
      checkpoint_wrapper uses) stops recomputing at the last activation that
      backward needs, and no backward needs the block's last matmul's output
      (the residual add that takes it saves nothing).
    """
    attention = 12 * n_layers * n_heads * head_dim * seq_len
    model = 6 * n_non_embedding + attention
    hardware = model + attention // 6
    if activation_checkpointing:
        d_model = n_heads * head_dim
        hardware += 2 * (n_blocks - n_layers * d_ff * d_model) + attention // 3
    return FlopsPerToken(
        model, hardware, n_non_embedding, n_blocks, n_layers, n_heads, head_dim, seq_len, n_heads * head_dim, d_ff
    )


def mfu(tokens: int, flops_per_token_: int, step_time_s: float, peak_flops_per_s: float) -> float:
    """Fraction of peak: tokens * FLOPs/token / (step time * peak). 0 for a zero-length step."""
    if step_time_s <= 0 or peak_flops_per_s <= 0:
        return 0.0
    return tokens * flops_per_token_ / (step_time_s * peak_flops_per_s)
