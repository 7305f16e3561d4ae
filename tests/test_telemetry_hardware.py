"""Tests for recorder.telemetry (NVML sampling, with a stand-in NVML) and recorder.hardware."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
import torch

from reftrain.errors import ReftrainError
from recorder.hardware import describe_hardware, git_state
from recorder.telemetry import THROTTLE_REASON_BITS, GpuTelemetry, decode_throttle_reasons, nvml_index_of, sample


class FakeNVMLError(Exception):
    pass


class FakeNvml:
    """Stand-in for the pynvml module: two GPUs; GPU 1 does not report power."""

    NVMLError = FakeNVMLError
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def __init__(self, count: int = 2, init_error: str | None = None, legacy: bool = False) -> None:
        self.count = count
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0
        if not legacy:
            self.nvmlDeviceGetCurrentClocksEventReasons = self._reasons

    def nvmlInit(self):
        if self.init_error:
            raise FakeNVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index):
        if index >= self.count:
            raise FakeNVMLError("Invalid Argument")
        return SimpleNamespace(index=index)

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-0000000{handle.index}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=87, memory=41)

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == pynvml.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetPowerUsage(self, handle):
        if handle.index == 1:
            raise FakeNVMLError("Not Supported")
        return 612_345  # mW

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=70 * 2**30, total=141 * 2**30, free=71 * 2**30)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 71

    def _reasons(self, handle):
        return 0x4 | 0x40  # sw power cap + hw thermal slowdown

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return 0x1  # idle: distinguishes the legacy call from the new one


def _real_nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_real_nvml_works(), reason="this machine has a working NVIDIA driver")
def test_available_without_driver_is_one_clear_line():
    ok, reason = GpuTelemetry.available()
    assert ok is False
    assert reason.startswith("NVML unavailable: ")
    assert "\n" not in reason and "Traceback" not in reason
    assert "NVML Shared Library Not Found" in reason  # pynvml's own words for a missing driver


def test_available_with_fake_nvml():
    fake = FakeNvml()
    assert GpuTelemetry.available(fake) == (True, "")
    assert fake.inits == fake.shutdowns == 1
    ok, reason = GpuTelemetry.available(FakeNvml(init_error="Driver Not Loaded"))
    assert not ok and reason.startswith("NVML unavailable: Driver Not Loaded")
    ok, reason = GpuTelemetry.available(FakeNvml(count=0))
    assert not ok and reason == "NVML unavailable: the driver reports no NVIDIA GPU"


def test_throttle_reason_table_matches_nvml_constants():
    for bit, name in THROTTLE_REASON_BITS:
        camel = "".join(word.capitalize() for word in name.split("_"))
        assert getattr(pynvml, f"nvmlClocksThrottleReason{camel}") == bit, name


def test_decode_throttle_reasons():
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_throttle_reasons(0x1 | 0x8 | 0x100) == ["gpu_idle", "hw_slowdown", "display_clock_setting"]
    assert decode_throttle_reasons(0x20 | 0x1000) == ["sw_thermal_slowdown", "unknown_0x1000"]


def test_sample_formats_a_record():
    fake = FakeNvml()
    before = time.time_ns()
    rec = sample(fake, fake.nvmlDeviceGetHandleByIndex(0))
    assert before <= rec.pop("time_ns") <= time.time_ns()
    assert rec == {
        "gpu_util_pct": 87,
        "mem_util_pct": 41,
        "sm_clock_mhz": 1980,
        "power_w": 612.345,
        "mem_used_bytes": 70 * 2**30,
        "temp_c": 71,
        "throttle_reasons": ["sw_power_cap", "hw_thermal_slowdown"],
    }
    unsupported = sample(fake, fake.nvmlDeviceGetHandleByIndex(1))
    assert unsupported["power_w"] is None and unsupported["temp_c"] == 71
    legacy = FakeNvml(legacy=True)
    assert sample(legacy, legacy.nvmlDeviceGetHandleByIndex(0))["throttle_reasons"] == ["gpu_idle"]


def _wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def test_gpu_telemetry_thread_writes_records(tmp_path):
    fake = FakeNvml()
    path = tmp_path / "telemetry" / "gpu1.jsonl"
    tel = GpuTelemetry(path, gpu_index=1, interval_ms=20, nvml=fake)
    tel.start()
    _wait_for(lambda: tel.samples >= 3)
    tel.stop()
    tel.stop()  # idempotent
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == tel.samples >= 3
    assert tel.error is None
    assert fake.inits == fake.shutdowns == 1
    times = [r["time_ns"] for r in records]
    assert times == sorted(times)
    # Fixed-period schedule: gaps average the interval (generous bound: busy machine).
    assert (times[-1] - times[0]) / (len(times) - 1) >= 15e6
    for r in records:
        assert r["power_w"] is None  # GPU 1 has no power sensor in the fake: handle index was used
        assert r["sm_clock_mhz"] == 1980 and r["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    with pytest.raises(ReftrainError, match="already exists"):
        GpuTelemetry(path, gpu_index=0, nvml=FakeNvml()).start()


def test_gpu_telemetry_sampling_failure_is_reported_not_raised(tmp_path):
    fake = FakeNvml()
    fake.nvmlDeviceGetUtilizationRates = lambda handle: (_ for _ in ()).throw(RuntimeError("boom"))
    tel = GpuTelemetry(tmp_path / "gpu0.jsonl", gpu_index=0, interval_ms=10, nvml=fake)
    tel.start()
    _wait_for(lambda: tel.error is not None)
    tel.stop()
    assert "boom" in tel.error and "after 0 samples" in tel.error


def test_gpu_telemetry_bad_index_and_interval(tmp_path):
    with pytest.raises(ReftrainError, match="cannot open GPU 5"):
        GpuTelemetry(tmp_path / "g.jsonl", gpu_index=5, nvml=FakeNvml()).start()
    with pytest.raises(ReftrainError, match="positive"):
        GpuTelemetry(tmp_path / "g.jsonl", gpu_index=0, interval_ms=0, nvml=FakeNvml())


def test_nvml_index_of_matches_uuid(monkeypatch):
    props = SimpleNamespace(uuid="00000001-aaaa-bbbb-cccc-dddddddddddd")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    fake = FakeNvml()
    assert nvml_index_of(torch.device("cuda", 0), nvml=fake) == 1
    assert fake.inits == fake.shutdowns == 1  # usable before GpuTelemetry.start()
    props.uuid = "ffffffff-aaaa-bbbb-cccc-dddddddddddd"
    with pytest.raises(ReftrainError, match="no NVML device"):
        nvml_index_of(torch.device("cuda", 0), nvml=FakeNvml())


# ---------------------------------------------------------------------------
# hardware
# ---------------------------------------------------------------------------


def test_describe_hardware_cpu():
    info = describe_hardware(torch.device("cpu"))
    models = (
        [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
        if Path("/proc/cpuinfo").exists()
        else []
    )
    if models:
        assert info["cpu_model"] == models[0]
    assert info["device_type"] == "cpu" and info["device_name"] == info["cpu_model"]
    assert info["device_memory_bytes"] is None
    assert info["cpu_cores"] == os.cpu_count()
    assert 1 <= info["cpu_cores_usable"] <= info["cpu_cores"]
    assert info["hostname"] == socket.gethostname()


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_state(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    assert git_state(repo) == {"sha": None, "dirty": None}  # not a repository
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@e", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    assert git_state(repo) == {"sha": None, "dirty": None}  # no commit yet: no HEAD
    (repo / "a.txt").write_text("1")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert git_state(repo) == {"sha": head, "dirty": False}
    (repo / "a.txt").write_text("2")
    assert git_state(repo) == {"sha": head, "dirty": True}
    subprocess.run([*git, "checkout", "-q", "a.txt"], check=True)
    (repo / "new.py").write_text("")
    assert git_state(repo)["dirty"] is True  # untracked files count
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no git executable
    assert git_state(repo) == {"sha": None, "dirty": None}
