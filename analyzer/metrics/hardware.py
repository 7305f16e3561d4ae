"""Dense datasheet peak FLOP/s per GPU model and compute dtype.

The one peak table of the project: the analyzer rates trace MFU against it
and reftrain (``reftrain.flops``) imports it from here, so data flows one
way (reftrain -> analyzer, never back; docs/mfu.md, "The peak").

Dtype keys: ``bf16`` and ``fp16`` (16-bit tensor-core math), ``fp8``
(e4m3/e5m2 tensor cores), ``tf32`` (fp32 matmuls on tensor cores), ``fp32``
(plain FP32 cores; on AMD CDNA the FP32 *matrix* rate). Every figure is
the dense rate (no 2:4 structured sparsity): where a datasheet quotes only
the sparse figure, the value is half of it. A missing key means the device
has no such unit (no bf16 on Volta/Turing, no fp8 before Hopper/Ada/CDNA3):
a run in that dtype there is measured or given a peak, not rated against a
meaningless number.

Patterns are tried in order on the lower-cased device name (as
``torch.cuda.get_device_name`` or Kineto's ``deviceProperties`` write it);
more specific names first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_T = 1e12
DTYPE_KEYS = ("fp8", "bf16", "fp16", "tf32", "fp32")


@dataclass(frozen=True)
class GpuModel:
    """One row of the peak table: name pattern, label, dense peaks by dtype key, datasheet."""

    pattern: str
    label: str
    peaks_per_s: dict[str, float]
    source: str


GPU_PEAKS: tuple[GpuModel, ...] = (
    # NVIDIA Blackwell. HGX B200 / GB200 NVL72 datasheets (2024), per GPU, dense = half the sparse figures.
    GpuModel(
        r"gb200",
        "GB200",
        {"fp8": 5000 * _T, "bf16": 2500 * _T, "fp16": 2500 * _T, "tf32": 1250 * _T, "fp32": 90 * _T},
        "NVIDIA GB200 NVL72 datasheet (per GPU)",
    ),
    GpuModel(
        r"b200",
        "B200",
        {"fp8": 4500 * _T, "bf16": 2250 * _T, "fp16": 2250 * _T, "tf32": 1100 * _T, "fp32": 75 * _T},
        "NVIDIA HGX B200 datasheet (1000 W, per GPU)",
    ),
    # NVIDIA Hopper. H100 and H200 datasheets (H200 keeps H100's compute).
    GpuModel(
        r"h200.*nvl",
        "H200 NVL",
        {"fp8": 1670.5 * _T, "bf16": 835.5 * _T, "fp16": 835.5 * _T, "tf32": 417.5 * _T, "fp32": 60 * _T},
        "NVIDIA H200 datasheet (NVL)",
    ),
    GpuModel(
        r"h200",
        "H200 SXM",
        {"fp8": 1978.9 * _T, "bf16": 989.4 * _T, "fp16": 989.4 * _T, "tf32": 494.7 * _T, "fp32": 66.9 * _T},
        "NVIDIA H200 datasheet (SXM)",
    ),
    GpuModel(
        r"h100.*nvl",
        "H100 NVL",
        {"fp8": 1670.5 * _T, "bf16": 835.5 * _T, "fp16": 835.5 * _T, "tf32": 417.5 * _T, "fp32": 60 * _T},
        "NVIDIA H100 datasheet (NVL)",
    ),
    GpuModel(
        r"h100.*pcie",
        "H100 PCIe",
        {"fp8": 1513 * _T, "bf16": 756 * _T, "fp16": 756 * _T, "tf32": 378 * _T, "fp32": 51.2 * _T},
        "NVIDIA H100 datasheet (PCIe)",
    ),
    GpuModel(
        r"gh200|h100",
        "H100 SXM",
        {"fp8": 1978.9 * _T, "bf16": 989.4 * _T, "fp16": 989.4 * _T, "tf32": 494.7 * _T, "fp32": 66.9 * _T},
        "NVIDIA H100 datasheet (SXM)",
    ),
    # NVIDIA Ampere: A100 (SXM and PCIe share the tensor-core peak), A10/A10G, A30, A40.
    GpuModel(
        r"a100|a800",
        "A100",
        {"bf16": 312 * _T, "fp16": 312 * _T, "tf32": 156 * _T, "fp32": 19.5 * _T},
        "NVIDIA A100 datasheet",
    ),
    # A10G is AWS's variant of the A10; NVIDIA publishes no separate datasheet, so the A10's is used.
    GpuModel(
        r"a10g?\b",
        "A10",
        {"bf16": 125 * _T, "fp16": 125 * _T, "tf32": 62.5 * _T, "fp32": 31.2 * _T},
        "NVIDIA A10 datasheet",
    ),
    GpuModel(
        r"a30\b", "A30", {"bf16": 165 * _T, "fp16": 165 * _T, "tf32": 82 * _T, "fp32": 1300e9}, "NVIDIA A30 datasheet"
    ),
    GpuModel(
        r"a40\b",
        "A40",
        {"bf16": 149.7 * _T, "fp16": 149.7 * _T, "tf32": 74.8 * _T, "fp32": 37.4 * _T},
        "NVIDIA A40 datasheet",
    ),
    # NVIDIA Ada: L40S, L4 (fp8 tensor cores).
    GpuModel(
        r"l40s",
        "L40S",
        {"fp8": 733 * _T, "bf16": 362.05 * _T, "fp16": 362.05 * _T, "tf32": 183 * _T, "fp32": 91.6 * _T},
        "NVIDIA L40S datasheet",
    ),
    GpuModel(
        r"\bl4\b",
        "L4",
        {"fp8": 242.5 * _T, "bf16": 121 * _T, "fp16": 121 * _T, "tf32": 60 * _T, "fp32": 3300e9},
        "NVIDIA L4 datasheet",
    ),
    # Volta/Turing: fp16 tensor cores only; no TF32 (fp32 matmuls run on FP32 cores, so the tf32
    # key carries the fp32 rate) and no bf16.
    GpuModel(
        r"v100", "V100 SXM2", {"fp16": 125 * _T, "tf32": 15.7 * _T, "fp32": 15.7 * _T}, "NVIDIA V100 datasheet (SXM2)"
    ),
    GpuModel(r"\bt4\b", "T4", {"fp16": 65 * _T, "tf32": 8.1 * _T, "fp32": 8.1 * _T}, "NVIDIA T4 datasheet"),
    # AMD Instinct (ROCm reports "AMD Instinct MI300X"): CDNA3 / CDNA2 datasheets, dense matrix peaks.
    GpuModel(
        r"mi325x|mi300x",
        "MI300X",
        {"fp8": 2614.9 * _T, "bf16": 1307.4 * _T, "fp16": 1307.4 * _T, "tf32": 653.7 * _T, "fp32": 163.4 * _T},
        "AMD Instinct MI300X / MI325X datasheets",
    ),
    GpuModel(
        r"mi250x",
        "MI250X",
        {"bf16": 383 * _T, "fp16": 383 * _T, "tf32": 95.7 * _T, "fp32": 95.7 * _T},
        "AMD Instinct MI250X datasheet (FP32 matrix)",
    ),
)

_LABELS = {"fp8": "fp8 dense", "bf16": "bf16 dense", "fp16": "fp16 dense", "tf32": "tf32 dense", "fp32": "fp32"}


@dataclass(frozen=True)
class TablePeak:
    """A datasheet peak: FLOP/s per device, its dtype key and a sentence saying where it came from."""

    per_s: float
    dtype: str
    detail: str


def gpu_model(device_name: str) -> GpuModel | None:
    """The table row whose pattern matches the device name, or None."""
    name = device_name.lower()
    for model in GPU_PEAKS:
        if re.search(model.pattern, name):
            return model
    return None


def datasheet_peak(device_name: str, dtype_key: str) -> TablePeak | None:
    """Dense peak of a device in one dtype key; None when the device or its dtype is not in the table."""
    model = gpu_model(device_name)
    if model is None or dtype_key not in model.peaks_per_s:
        return None
    return TablePeak(
        model.peaks_per_s[dtype_key],
        dtype_key,
        f"{model.label} {_LABELS[dtype_key]} (datasheet: {model.source}; device '{device_name}')",
    )


# ---------------------------------------------------------------------------
# Interconnect peaks, for rating collectives' bus bandwidth
# ---------------------------------------------------------------------------
# nccl-tests' busbw is meant to be compared with the hardware's per-GPU,
# one-direction bandwidth (nccl-tests doc/PERFORMANCE.md, "bus bandwidth"),
# so every figure here is unidirectional GB/s (1e9 bytes/s) per GPU: half
# the "total" or "bidirectional" figure datasheets print.


@dataclass(frozen=True)
class LinkPeak:
    """Per-GPU one-direction bandwidth of one link kind (GB/s) and where the figure came from."""

    link: str
    gbps: float
    source: str


# Scale-up fabric per GPU model: pattern (same matching as GPU_PEAKS), label, link peak.
GPU_LINKS: tuple[tuple[str, LinkPeak], ...] = (
    (r"gb200|b200", LinkPeak("NVLink 5", 900.0, "NVIDIA HGX B200 / GB200 datasheets: NVLink 1.8 TB/s total per GPU")),
    (
        r"h200.*nvl|h100.*nvl",
        LinkPeak("NVLink bridge", 300.0, "NVIDIA H100/H200 NVL datasheets: NVLink bridge 600 GB/s total"),
    ),
    (r"h100.*pcie", LinkPeak("NVLink bridge", 300.0, "NVIDIA H100 PCIe datasheet: NVLink bridge 600 GB/s total")),
    (r"gh200|h200|h100", LinkPeak("NVLink 4", 450.0, "NVIDIA H100/H200 SXM datasheets: NVLink 900 GB/s total per GPU")),
    (r"a100|a800", LinkPeak("NVLink 3", 300.0, "NVIDIA A100 datasheet: NVLink 600 GB/s total per GPU (SXM)")),
    (r"v100", LinkPeak("NVLink 2", 150.0, "NVIDIA V100 datasheet: NVLink 300 GB/s total per GPU (SXM2)")),
    (
        r"mi325x|mi300x",
        LinkPeak(
            "xGMI (Infinity Fabric)",
            448.0,
            "AMD Instinct MI300X datasheet: 7 x 128 GB/s bidirectional Infinity Fabric links, 896 GB/s total",
        ),
    ),
    (
        r"mi250x",
        LinkPeak("xGMI (Infinity Fabric)", 400.0, "AMD Instinct MI250X datasheet: 800 GB/s peak Infinity Fabric total"),
    ),
)

# Links without a per-model figure: PCIe x16 per direction (PCI-SIG base specs: 16 GT/s and 32 GT/s
# per lane, 128b/130b), and one InfiniBand NIC per GPU (IBTA rates: HDR 200 Gb/s, NDR 400 Gb/s).
PCIE4_X16 = LinkPeak("PCIe 4.0 x16", 31.5, "PCI-SIG PCIe 4.0: 16 GT/s x 16 lanes, 128b/130b, per direction")
PCIE5_X16 = LinkPeak("PCIe 5.0 x16", 63.0, "PCI-SIG PCIe 5.0: 32 GT/s x 16 lanes, 128b/130b, per direction")
IB_HDR = LinkPeak("InfiniBand HDR (1 NIC/GPU)", 25.0, "IBTA HDR 200 Gb/s per port")
IB_NDR = LinkPeak("InfiniBand NDR (1 NIC/GPU)", 50.0, "IBTA NDR 400 Gb/s per port")


def link_peak(device_name: str) -> LinkPeak | None:
    """The scale-up link (NVLink / xGMI) of a GPU model, or None when the model has none in the table.

    A trace does not say whether its group spans nodes; callers that know
    the group crosses the network rate against :data:`IB_NDR` or :data:`IB_HDR`.
    """
    name = device_name.lower()
    for pattern, peak in GPU_LINKS:
        if re.search(pattern, name):
            return peak
    return None


# ---------------------------------------------------------------------------
# HBM (device memory) bandwidth, for the roofline's memory roof
# ---------------------------------------------------------------------------
# Peak DRAM bandwidth per GPU as the datasheet prints it, in bytes/s (1 TB/s =
# 1e12 B/s). The memory size changes the figure on some models (A100 40 GB vs
# 80 GB), so more specific patterns come first; device names as
# torch.cuda.get_device_name writes them ("NVIDIA A100-SXM4-80GB",
# "NVIDIA A100 80GB PCIe", "NVIDIA H100 80GB HBM3").


@dataclass(frozen=True)
class MemoryPeak:
    """A GPU model's peak HBM bandwidth (bytes/s) and its datasheet."""

    label: str
    bytes_per_s: float
    source: str


GPU_HBM: tuple[tuple[str, MemoryPeak], ...] = (
    (r"gb200", MemoryPeak("GB200", 8.0 * _T, "NVIDIA GB200 NVL72 datasheet: HBM3e 8 TB/s per GPU")),
    (r"b200", MemoryPeak("B200", 8.0 * _T, "NVIDIA HGX B200 datasheet: HBM3e 8 TB/s per GPU")),
    (r"gh200", MemoryPeak("GH200", 4.0 * _T, "NVIDIA GH200 datasheet: HBM3 4 TB/s (96 GB)")),
    (r"h200", MemoryPeak("H200", 4.8 * _T, "NVIDIA H200 datasheet: HBM3e 4.8 TB/s (SXM and NVL)")),
    (r"h100.*nvl", MemoryPeak("H100 NVL", 3.9 * _T, "NVIDIA H100 datasheet (NVL): HBM3 3.9 TB/s")),
    (r"h100.*pcie", MemoryPeak("H100 PCIe", 2.0 * _T, "NVIDIA H100 datasheet (PCIe): HBM2e 2 TB/s")),
    (r"h100", MemoryPeak("H100 SXM", 3.35 * _T, "NVIDIA H100 datasheet (SXM): HBM3 3.35 TB/s")),
    (
        r"(a100|a800).*80gb.*pcie|(a100|a800).*pcie.*80gb",
        MemoryPeak("A100 80GB PCIe", 1935e9, "NVIDIA A100 datasheet: 80 GB PCIe HBM2e 1,935 GB/s"),
    ),
    (r"(a100|a800).*80gb", MemoryPeak("A100 80GB SXM", 2039e9, "NVIDIA A100 datasheet: 80 GB SXM HBM2e 2,039 GB/s")),
    (r"a100|a800", MemoryPeak("A100 40GB", 1555e9, "NVIDIA A100 datasheet: 40 GB HBM2 1,555 GB/s")),
    (r"a10g?\b", MemoryPeak("A10", 600e9, "NVIDIA A10 datasheet: GDDR6 600 GB/s")),
    (r"a30\b", MemoryPeak("A30", 933e9, "NVIDIA A30 datasheet: HBM2 933 GB/s")),
    (r"a40\b", MemoryPeak("A40", 696e9, "NVIDIA A40 datasheet: GDDR6 696 GB/s")),
    (r"l40s", MemoryPeak("L40S", 864e9, "NVIDIA L40S datasheet: GDDR6 864 GB/s")),
    (r"\bl4\b", MemoryPeak("L4", 300e9, "NVIDIA L4 datasheet: GDDR6 300 GB/s")),
    (r"v100", MemoryPeak("V100", 900e9, "NVIDIA V100 datasheet (SXM2): HBM2 900 GB/s")),
    (r"\bt4\b", MemoryPeak("T4", 320e9, "NVIDIA T4 datasheet: GDDR6 320 GB/s")),
    (r"mi325x", MemoryPeak("MI325X", 6.0 * _T, "AMD Instinct MI325X datasheet: HBM3E 6 TB/s")),
    (r"mi300x", MemoryPeak("MI300X", 5.3 * _T, "AMD Instinct MI300X datasheet: HBM3 5.3 TB/s")),
    (r"mi250x", MemoryPeak("MI250X", 3276.8e9, "AMD Instinct MI250X datasheet: HBM2e 3.2768 TB/s")),
)


def hbm_peak(device_name: str) -> MemoryPeak | None:
    """The datasheet HBM bandwidth of a GPU model, or None when it is not in :data:`GPU_HBM`."""
    name = device_name.lower()
    for pattern, peak in GPU_HBM:
        if re.search(pattern, name):
            return peak
    return None
