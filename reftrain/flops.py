"""Model FLOPs per token (PaLM appendix B) and the peak FLOP/s that MFU divides by.

docs/mfu.md states every term; this module is the formula and the table.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from analyzer.metrics import hardware

FORMULA = "6*N + 12*L*H*Q*T per token (PaLM, Chowdhery et al. 2022, appendix B)"
HARDWARE_FORMULA = "model FLOPs + 2*N_blocks + 4*L*H*Q*T (one extra forward of every block under activation checkpointing)"


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

    def to_manifest(self) -> dict:
        """The manifest's `flops` object (docs/rundir.md)."""
        return {
            "per_token": self.model,
            "per_token_hardware": self.hardware,
            "formula": FORMULA,
            "hardware_formula": HARDWARE_FORMULA,
            "terms": {"N": self.n, "N_blocks": self.n_blocks, "L": self.n_layers, "H": self.n_heads,
                      "Q": self.head_dim, "T": self.seq_len},
        }


def flops_per_token(n_non_embedding: int, n_blocks: int, n_layers: int, n_heads: int, head_dim: int,
                    seq_len: int, activation_checkpointing: bool) -> FlopsPerToken:
    """PaLM's model FLOPs per token, 6N + 12LHQT, and the hardware FLOPs with recompute.

    6N: every weight does one multiply-add (2 FLOPs) per token in forward and
    two in backward (input and weight gradients). 12LHQT: attention's two
    matmuls (QK^T and AV), 2*2*H*Q*T per layer per token forward, times three
    for forward plus backward; causal masking is not discounted (as in PaLM).
    With activation checkpointing each block's forward runs again in
    backward: 2*N_blocks for its weights and 4*L*H*Q*T for its attention.
    """
    attention = 12 * n_layers * n_heads * head_dim * seq_len
    model = 6 * n_non_embedding + attention
    hardware = model
    if activation_checkpointing:
        hardware += 2 * n_blocks + attention // 3
    return FlopsPerToken(model, hardware, n_non_embedding, n_blocks, n_layers, n_heads, head_dim, seq_len)


def mfu(tokens: int, flops_per_token_: int, step_time_s: float, peak_flops_per_s: float) -> float:
    """Fraction of peak: tokens * FLOPs/token / (step time * peak). 0 for a zero-length step."""
    if step_time_s <= 0 or peak_flops_per_s <= 0:
        return 0.0
    return tokens * flops_per_token_ / (step_time_s * peak_flops_per_s)


# ---------------------------------------------------------------------------
# Peak FLOP/s
# ---------------------------------------------------------------------------

# The datasheet table lives in the analyzer (analyzer/metrics/hardware.py):
# reftrain may import the analyzer, never the other way round.
GPU_PEAKS = hardware.GPU_PEAKS


@dataclass(frozen=True)
class PeakFlops:
    """Per-device peak FLOP/s in the run's dtype and where it came from."""

    per_s: float
    source: str  # "table", "measured" or "override"
    detail: str
    dtype: str

    def to_manifest(self) -> dict:
        return {"per_s": self.per_s, "source": self.source, "detail": self.detail, "dtype": self.dtype}


def peak_dtype(dtype: str, device_type: str, tf32: bool) -> str:
    """Which peak applies: bf16; tf32 for fp32 on CUDA with TF32 on; else fp32."""
    if dtype == "bf16":
        return "bf16"
    return "tf32" if device_type == "cuda" and tf32 else "fp32"


def table_peak(device_name: str, dtype_key: str) -> PeakFlops | None:
    """Dense datasheet peak for a GPU name (analyzer.metrics.hardware), or None when not in the table."""
    found = hardware.datasheet_peak(device_name, dtype_key)
    return PeakFlops(found.per_s, "table", found.detail, dtype_key) if found else None


MEASURE_MAX_SIZE = 1024
MEASURE_MIN_TIME_S = 0.025
MEASURE_REPEATS = 5


def measure_matmul_peak(device, dtype_key: str, max_size: int = MEASURE_MAX_SIZE,
                        repeats: int = MEASURE_REPEATS) -> PeakFlops:
    """Best-of-`repeats` FLOP/s of an n x n x n matmul on `device` in the run's dtype (2*n^3 FLOPs each).

    Used on CPUs (no datasheet applies: the result depends on cores, threads
    and vector units) and on GPUs missing from the table. n doubles from 128
    until one matmul takes at least 25 ms or n reaches `max_size`, so a slow
    path (bf16 on a CPU without bf16 instructions runs ~100x slower than fp32)
    is measured in well under a second instead of minutes. Each repeat times
    enough matmuls to cover at least 50 ms.
    """
    import torch

    device = torch.device(device)
    tdtype = {"bf16": torch.bfloat16, "tf32": torch.float32, "fp32": torch.float32}[dtype_key]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def one_matmul_s(a: torch.Tensor, b: torch.Tensor) -> float:
        start = time.perf_counter()
        torch.matmul(a, b)
        sync()
        return max(time.perf_counter() - start, 1e-7)

    size = 128
    while True:
        a = torch.randn(size, size, device=device, dtype=tdtype)
        b = torch.randn(size, size, device=device, dtype=tdtype)
        torch.matmul(a, b)  # first call: allocation, kernel selection
        sync()
        one_s = one_matmul_s(a, b)
        if one_s >= MEASURE_MIN_TIME_S or size >= max_size:
            break
        size *= 2
    per_timing = max(1, int(0.05 / one_s))
    best_s = one_s
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(per_timing):
            torch.matmul(a, b)
        sync()
        best_s = min(best_s, (time.perf_counter() - start) / per_timing)
    threads = torch.get_num_threads()
    where = f"{device.type} matmul {size}^3 {dtype_key}, best of {repeats}"
    if device.type == "cpu":
        where += f", {threads} thread{'s' if threads != 1 else ''}"
    return PeakFlops(2 * size**3 / best_s, "measured", where, dtype_key)
