"""Peak dense FLOP/s per accelerator and dtype, for MFU of foreign traces.

Values are the vendors' datasheet numbers for *dense* math (NVIDIA quotes
16-bit and TF32 tensor-core rates "with sparsity", twice the dense rate; the
table holds the dense half). ``fp32`` is the plain (non-tensor-core) FP32
rate, or the FP32 matrix-core rate on AMD Instinct parts; ``tf32`` the
TF32 tensor-core rate where the part has one. Units: FLOP/s per device.

Lookup is by a case-insensitive substring of the device name Kineto writes in
``deviceProperties[].name`` (``NVIDIA H100 80GB HBM3``, ``NVIDIA A100-SXM4-80GB``,
``AMD Instinct MI300X``); more specific patterns come first (``H100 PCIe``
before ``H100``).
"""
from __future__ import annotations

from dataclasses import dataclass

T = 1e12

# (pattern, label, {dtype: FLOP/s}); bf16 and fp16 share the 16-bit rate.
PEAK_TABLE: tuple[tuple[str, str, dict[str, float]], ...] = (
    ("GB200", "NVIDIA GB200 (per GPU)", {"bf16": 2500 * T, "fp16": 2500 * T, "tf32": 1250 * T, "fp32": 80 * T, "fp8": 5000 * T}),
    ("B200", "NVIDIA B200", {"bf16": 2250 * T, "fp16": 2250 * T, "tf32": 1100 * T, "fp32": 80 * T, "fp8": 4500 * T}),
    ("B100", "NVIDIA B100", {"bf16": 1750 * T, "fp16": 1750 * T, "tf32": 875 * T, "fp32": 60 * T, "fp8": 3500 * T}),
    ("H200 NVL", "NVIDIA H200 NVL", {"bf16": 835.5 * T, "fp16": 835.5 * T, "tf32": 417.5 * T, "fp32": 60 * T, "fp8": 1671 * T}),
    ("H200", "NVIDIA H200 SXM", {"bf16": 989.4 * T, "fp16": 989.4 * T, "tf32": 494.7 * T, "fp32": 66.9 * T, "fp8": 1978.9 * T}),
    ("GH200", "NVIDIA GH200", {"bf16": 989.4 * T, "fp16": 989.4 * T, "tf32": 494.7 * T, "fp32": 66.9 * T, "fp8": 1978.9 * T}),
    ("H100 PCIe", "NVIDIA H100 PCIe", {"bf16": 756 * T, "fp16": 756 * T, "tf32": 378 * T, "fp32": 51.2 * T, "fp8": 1513 * T}),
    ("H100 NVL", "NVIDIA H100 NVL", {"bf16": 835 * T, "fp16": 835 * T, "tf32": 417.5 * T, "fp32": 60 * T, "fp8": 1670 * T}),
    ("H100", "NVIDIA H100 SXM", {"bf16": 989.4 * T, "fp16": 989.4 * T, "tf32": 494.7 * T, "fp32": 66.9 * T, "fp8": 1978.9 * T}),
    ("H800", "NVIDIA H800 SXM", {"bf16": 989.4 * T, "fp16": 989.4 * T, "tf32": 494.7 * T, "fp32": 66.9 * T, "fp8": 1978.9 * T}),
    ("A100", "NVIDIA A100", {"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "fp32": 19.5 * T}),
    ("A800", "NVIDIA A800", {"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "fp32": 19.5 * T}),
    ("L40S", "NVIDIA L40S", {"bf16": 362.05 * T, "fp16": 362.05 * T, "tf32": 183 * T, "fp32": 91.6 * T, "fp8": 733 * T}),
    ("L40", "NVIDIA L40", {"bf16": 181 * T, "fp16": 181 * T, "tf32": 90.5 * T, "fp32": 90.5 * T, "fp8": 362 * T}),
    ("L4", "NVIDIA L4", {"bf16": 121 * T, "fp16": 121 * T, "tf32": 60 * T, "fp32": 30.3 * T, "fp8": 242.5 * T}),
    ("A10", "NVIDIA A10", {"bf16": 125 * T, "fp16": 125 * T, "tf32": 62.5 * T, "fp32": 31.2 * T}),
    ("V100-PCIE", "NVIDIA V100 PCIe", {"fp16": 112 * T, "fp32": 14 * T}),
    ("V100", "NVIDIA V100 SXM2", {"fp16": 125 * T, "fp32": 15.7 * T}),
    ("MI325X", "AMD Instinct MI325X", {"bf16": 1307.4 * T, "fp16": 1307.4 * T, "tf32": 653.7 * T, "fp32": 163.4 * T, "fp8": 2614.9 * T}),
    ("MI300X", "AMD Instinct MI300X", {"bf16": 1307.4 * T, "fp16": 1307.4 * T, "tf32": 653.7 * T, "fp32": 163.4 * T, "fp8": 2614.9 * T}),
    ("MI250X", "AMD Instinct MI250X", {"bf16": 383 * T, "fp16": 383 * T, "fp32": 95.7 * T}),
    ("MI250", "AMD Instinct MI250", {"bf16": 362.1 * T, "fp16": 362.1 * T, "fp32": 90.5 * T}),
    ("MI210", "AMD Instinct MI210", {"bf16": 181 * T, "fp16": 181 * T, "fp32": 45.3 * T}),
)


_FALLBACK = {"bf16": "fp16", "fp8": "fp16", "tf32": "fp32"}


@dataclass(frozen=True)
class Peak:
    """A peak rate and where it came from."""

    per_s: float
    dtype: str | None
    source: str  # "argument" | "table"
    detail: str


def lookup_peak(device_name: str, dtype: str) -> Peak | None:
    """Dense peak FLOP/s of ``device_name`` for ``dtype`` (bf16, fp16, tf32, fp32, fp8).

    A dtype the part has no units for falls back to the rate that runs it:
    bf16 and fp8 to fp16 (V100 has neither), tf32 to fp32 (MI200 parts have
    no TF32). None when the device is not in the table.
    """
    upper = device_name.upper()
    for pattern, label, rates in PEAK_TABLE:
        if pattern.upper() in upper:
            for candidate in (dtype, _FALLBACK.get(dtype)):
                if candidate and candidate in rates:
                    return Peak(rates[candidate], candidate, "table", f"{label} {candidate} dense")
            return None
    return None
