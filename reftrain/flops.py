"""Model FLOPs per token (PaLM appendix B) and the peak FLOP/s that MFU divides by.

docs/mfu.md states every term; this module is the formula and the table.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

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

# Dense (no 2:4 sparsity) peak FLOP/s per device from vendor datasheets, by
# compute dtype: "bf16" (also fp16), "tf32" (fp32 matmuls on tensor cores),
# "fp32" (plain FP32 cores). Patterns are tried in order on the lower-cased
# torch.cuda.get_device_name(); more specific names first.
_T = 1e12
GPU_PEAKS: list[tuple[str, str, dict[str, float]]] = [
    # NVIDIA Blackwell: HGX B200 datasheet (1000 W), dense = half the sparse figures.
    (r"gb200", "GB200", {"bf16": 2500 * _T, "tf32": 1250 * _T, "fp32": 90 * _T}),
    (r"b200", "B200", {"bf16": 2250 * _T, "tf32": 1100 * _T, "fp32": 75 * _T}),
    # NVIDIA Hopper: H100/H200 datasheets.
    (r"h200.*nvl", "H200 NVL", {"bf16": 835.5 * _T, "tf32": 417.5 * _T, "fp32": 60 * _T}),
    (r"h200", "H200 SXM", {"bf16": 989.4 * _T, "tf32": 494.7 * _T, "fp32": 66.9 * _T}),
    (r"h100.*nvl", "H100 NVL", {"bf16": 835.5 * _T, "tf32": 417.5 * _T, "fp32": 60 * _T}),
    (r"h100.*pcie", "H100 PCIe", {"bf16": 756 * _T, "tf32": 378 * _T, "fp32": 51.2 * _T}),
    (r"gh200|h100", "H100 SXM", {"bf16": 989.4 * _T, "tf32": 494.7 * _T, "fp32": 66.9 * _T}),
    # NVIDIA Ampere: A100 (SXM and PCIe share the tensor-core peak), A10/A10G, A30, A40.
    (r"a100|a800", "A100", {"bf16": 312 * _T, "tf32": 156 * _T, "fp32": 19.5 * _T}),
    # A10G is AWS's variant of the A10; NVIDIA publishes no separate datasheet, so the A10's is used.
    (r"a10g?\b", "A10", {"bf16": 125 * _T, "tf32": 62.5 * _T, "fp32": 31.2 * _T}),
    (r"a30\b", "A30", {"bf16": 165 * _T, "tf32": 82 * _T, "fp32": 10.3 * _T}),
    (r"a40\b", "A40", {"bf16": 149.7 * _T, "tf32": 74.8 * _T, "fp32": 37.4 * _T}),
    # NVIDIA Ada: L40S, L4.
    (r"l40s", "L40S", {"bf16": 362.05 * _T, "tf32": 183 * _T, "fp32": 91.6 * _T}),
    (r"\bl4\b", "L4", {"bf16": 121 * _T, "tf32": 60 * _T, "fp32": 30.3 * _T}),
    # Volta/Turing: no TF32 (fp32 matmuls run on FP32 cores) and no bf16 tensor cores, so
    # no bf16 entry: a bf16 run there is measured instead of given a meaningless peak.
    (r"v100", "V100 SXM2", {"tf32": 15.7 * _T, "fp32": 15.7 * _T}),
    (r"\bt4\b", "T4", {"tf32": 8.1 * _T, "fp32": 8.1 * _T}),
    # AMD Instinct (ROCm reports "AMD Instinct MI300X"): CDNA3 datasheets, dense matrix peaks.
    (r"mi325x|mi300x", "MI300X", {"bf16": 1307.4 * _T, "tf32": 653.7 * _T, "fp32": 163.4 * _T}),
    (r"mi250x", "MI250X", {"bf16": 383 * _T, "tf32": 95.7 * _T, "fp32": 95.7 * _T}),
]


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
    """Dense datasheet peak for a GPU name, or None when the name is not in the table."""
    name = device_name.lower()
    for pattern, label, peaks in GPU_PEAKS:
        if re.search(pattern, name):
            if dtype_key not in peaks:
                return None
            label_dtype = {"bf16": "bf16 dense", "tf32": "tf32 dense", "fp32": "fp32"}[dtype_key]
            return PeakFlops(peaks[dtype_key], "table", f"{label} {label_dtype} (datasheet; device '{device_name}')", dtype_key)
    return None


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
