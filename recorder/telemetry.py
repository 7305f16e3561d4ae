"""NVML GPU telemetry sampled in a background thread (`reftrain.telemetry/1`).

Each sample (docs/rundir.md) holds `time_ns`, `gpu_util_pct`, `mem_util_pct`,
`sm_clock_mhz`, `power_w`, `mem_used_bytes`, `temp_c` and `throttle_reasons`
(names of the set bits of NVML's clocks-event-reasons mask). A field NVML does
not support on a given GPU is `null`.

Definitions (NVML API reference): utilization is the percent of the last
sample period (1/6 s to 1 s, driver dependent) during which a kernel ran
(`gpu`) or device memory was read or written (`memory`); power is the board
draw, NVML reports milliwatts; the SM clock is the current clock in MHz.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from recorder.errors import RecorderError
from recorder.instrument import JsonlWriter

# Bits of nvmlClocksEventReasons / nvmlClocksThrottleReasons (nvml.h; the
# values of pynvml's nvmlClocksEventReason* and nvmlClocksThrottleReason*
# constants), in bit order.
THROTTLE_REASON_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)
_KNOWN_BITS = 0
for _bit, _ in THROTTLE_REASON_BITS:
    _KNOWN_BITS |= _bit


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the reasons set in an NVML clocks-event-reasons bitmask, in bit order.

    Bits NVML may add later appear as `unknown_0x...` rather than vanish.
    """
    names = [name for bit, name in THROTTLE_REASON_BITS if mask & bit]
    if mask & ~_KNOWN_BITS:
        names.append(f"unknown_{mask & ~_KNOWN_BITS:#x}")
    return names


def _load_nvml(nvml: ModuleType | None) -> ModuleType:
    if nvml is not None:
        return nvml
    import pynvml  # nvidia-ml-py; imports fine without a driver, nvmlInit then fails

    return pynvml


def sample(nvml: Any, handle: Any) -> dict:
    """One `reftrain.telemetry/1` record from an NVML device handle (unsupported fields -> None)."""

    def query(fn: Any, *args: Any) -> Any:
        try:
            return fn(handle, *args)
        except nvml.NVMLError:  # e.g. NVML_ERROR_NOT_SUPPORTED for power on some boards
            return None

    util = query(nvml.nvmlDeviceGetUtilizationRates)
    power_mw = query(nvml.nvmlDeviceGetPowerUsage)
    mem = query(nvml.nvmlDeviceGetMemoryInfo)
    # Renamed in CUDA 12 drivers ("throttle" -> "event"); the bits are the same.
    reasons_fn = (
        getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    mask = query(reasons_fn)
    return {
        "time_ns": time.time_ns(),
        "gpu_util_pct": None if util is None else util.gpu,
        "mem_util_pct": None if util is None else util.memory,
        "sm_clock_mhz": query(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
        "power_w": None if power_mw is None else power_mw / 1000.0,
        "mem_used_bytes": None if mem is None else mem.used,
        "temp_c": query(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU),
        "throttle_reasons": None if mask is None else decode_throttle_reasons(mask),
    }


def nvml_index_of(device: torch.device, nvml: ModuleType | None = None) -> int:
    """NVML index of a CUDA device, matched by UUID.

    CUDA numbers devices after CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER;
    NVML numbers all devices in PCI order, so `cuda:N` is NVML index N only by
    coincidence. Initializes NVML for the lookup (nvmlInit is reference counted).
    """
    nvml = _load_nvml(nvml)
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise RecorderError(f"NVML unavailable: {exc}") from None
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            nvml_uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
            if isinstance(nvml_uuid, bytes):
                nvml_uuid = nvml_uuid.decode()
            if nvml_uuid.removeprefix("GPU-") == uuid.removeprefix("GPU-"):
                return index
    finally:
        nvml.nvmlShutdown()
    raise RecorderError(f"{device}: no NVML device has UUID {uuid}")


class GpuTelemetry:
    """NVML sampler in a background thread writing reftrain.telemetry/1 records (docs/rundir.md).

    `start()` opens the file and samples at once, then every `interval_ms`
    (on a fixed schedule, so slow NVML calls do not stretch the period);
    `stop()` takes no further samples, joins the thread and closes the file.
    If sampling fails unexpectedly, the thread stops and `error` says why
    (training goes on). `nvml` lets tests inject a stand-in for `pynvml`.
    """

    def __init__(self, path: Path, gpu_index: int, interval_ms: int = 500, nvml: ModuleType | None = None) -> None:
        if interval_ms <= 0:
            raise RecorderError(f"telemetry interval must be positive, got {interval_ms} ms")
        self.path = Path(path)
        self.gpu_index = gpu_index
        self.interval_ms = interval_ms
        self.error: str | None = None
        self.samples = 0
        self._nvml = _load_nvml(nvml)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._writer: JsonlWriter | None = None

    @staticmethod
    def available(nvml: ModuleType | None = None) -> tuple[bool, str]:
        """(True, "") when NVML answers, else (False, "NVML unavailable: <reason>")."""
        try:
            nvml = _load_nvml(nvml)
        except ImportError as exc:
            return False, f"NVML unavailable: nvidia-ml-py is not installed ({exc})"
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            return False, f"NVML unavailable: {exc} (no NVIDIA driver on this machine?)"
        try:
            if nvml.nvmlDeviceGetCount() == 0:
                return False, "NVML unavailable: the driver reports no NVIDIA GPU"
        except nvml.NVMLError as exc:
            return False, f"NVML unavailable: {exc}"
        finally:
            nvml.nvmlShutdown()
        return True, ""

    def start(self) -> None:
        """Initialize NVML, open the output file and start sampling."""
        if self._thread is not None:
            raise RecorderError("GpuTelemetry already started")
        nvml = self._nvml
        try:
            nvml.nvmlInit()
            handle = nvml.nvmlDeviceGetHandleByIndex(self.gpu_index)
        except nvml.NVMLError as exc:
            raise RecorderError(f"NVML: cannot open GPU {self.gpu_index}: {exc}") from None
        self._writer = writer = JsonlWriter(self.path)
        self._thread = threading.Thread(
            target=self._run, args=(handle, writer), name=f"gpu-telemetry-{self.gpu_index}", daemon=True
        )
        self._thread.start()

    def _run(self, handle: Any, writer: JsonlWriter) -> None:
        interval_s = self.interval_ms / 1000.0
        next_s = time.monotonic()
        try:
            while not self._stop.is_set():
                writer.write(sample(self._nvml, handle))
                writer.flush()  # one small write per interval; keeps data on a crash
                self.samples += 1
                next_s += interval_s
                self._stop.wait(max(0.0, next_s - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - keep training alive; the trainer reports `error`
            self.error = f"{self.path}: telemetry stopped after {self.samples} samples: {exc!r}"

    def stop(self) -> None:
        """Stop sampling, join the thread, close the file and NVML. Idempotent."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self._writer is not None:
            self._writer.close()
        self._nvml.nvmlShutdown()
