"""The peak FLOP/s per device that MFU divides by: a GPU's datasheet entry, or a matmul measured on the device.

docs/mfu.md ("The peak") states the choices; the datasheet table is the
analyzer's (analyzer/metrics/hardware.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from analyzer.metrics import hardware

# The datasheet table lives in the analyzer (analyzer/metrics/hardware.py):
# the recorder may import the analyzer, never the other way round.
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


def measure_matmul_peak(
    device, dtype_key: str, max_size: int = MEASURE_MAX_SIZE, repeats: int = MEASURE_REPEATS
) -> PeakFlops:
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
