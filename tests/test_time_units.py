"""The time unit decided from the events (the header a hint), and events
stamped far outside their rank's span dropped with a warning
(analyzer/ingest/parse/units.py, analyzer/ingest/strays.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import orjson
import pytest

from analyzer.api import analyze
from analyzer.ingest.load import load_trace
from tests.synth import KinetoTrace

STEP_US = 95_500.25  # 95.5 ms and 250 ns: the decimals Kineto writes


def _realistic() -> dict:
    """One 95.5 ms ProfilerStep holding 200 host ops (1-20 µs) each launching
    a kernel (2-40 µs), times in µs with ns decimals as today's Kineto writes."""
    t = KinetoTrace(rank=0, world_size=1)
    t.step(1, 1_000.0, STEP_US)
    for i in range(200):
        start = 1_010.0 + 450 * i
        t.cpu_op("aten::add", start, 1.125 + (i % 20), tid=t.tid)
        t.kernel("elementwise_kernel", start + 30.5, 2.375 + (i % 39))
    return t.to_dict()


def _with_times(doc: dict, scale: int, unit: str | None) -> dict:
    """``doc`` with every ts/dur multiplied by ``scale`` (1000: integer ns) and ``displayTimeUnit`` set to ``unit``."""
    out = copy.deepcopy(doc)
    out.pop("displayTimeUnit", None)
    if scale != 1:
        for e in out["traceEvents"]:
            for key in ("ts", "dur"):
                if isinstance(e.get(key), (int, float)):
                    e[key] = int(round(e[key] * scale))
    if unit is not None:
        out["displayTimeUnit"] = unit
    return out


def _load(tmp_path: Path, doc: dict, name: str):
    path = tmp_path / name
    path.write_bytes(orjson.dumps(doc))
    return load_trace(path)


def _step_ms(rt) -> float:
    (dur,) = (rt.steps["end_ns"] - rt.steps["start_ns"]).tolist()
    return dur / 1e6


def test_us_trace_with_kineto_header_reads_as_us_without_a_note(tmp_path: Path) -> None:
    rt = _load(tmp_path, _with_times(_realistic(), 1, "ms"), "us.json")
    assert _step_ms(rt) == 95.50025 and rt.notes == []


def test_ns_trace_with_ns_header_reads_as_its_us_twin(tmp_path: Path) -> None:
    us = _load(tmp_path, _with_times(_realistic(), 1, "ms"), "us.json")
    ns = _load(tmp_path, _with_times(_realistic(), 1000, "ns"), "ns.json")
    assert _step_ms(ns) == 95.50025
    assert ns.events["end_ns"].tolist() == us.events["end_ns"].tolist()
    assert ns.notes == ['timestamps read as nanoseconds (the trace says "displayTimeUnit": "ns")']


def test_header_saying_ns_over_us_data_with_ns_decimals_reads_us(tmp_path: Path) -> None:
    # The header lies: µs with three decimals. Read as ns, the step would be 0.0955 ms.
    rt = _load(tmp_path, _with_times(_realistic(), 1, "ns"), "lying.json")
    assert _step_ms(rt) == 95.50025
    (note,) = rt.notes
    assert note.startswith(
        "timestamps read as microseconds, not nanoseconds (the trace says \"displayTimeUnit\": 'ns')"
    )
    assert "100 % of durations have decimals" in note


def test_header_saying_ns_over_whole_us_reads_us_from_kernel_durations(tmp_path: Path) -> None:
    # Older Kineto's whole µs: no decimals, but a tenth of 200 kernels under 100 units is under 0.1 µs as ns.
    doc = _with_times(_realistic(), 1, "ns")
    for e in doc["traceEvents"]:
        for key in ("ts", "dur"):
            if isinstance(e.get(key), float):
                e[key] = int(e[key])
    rt = _load(tmp_path, doc, "whole_us.json")
    assert _step_ms(rt) == 95.5
    (note,) = rt.notes
    assert "the shortest tenth of 200 kernels" in note and "under 0.1 µs as ns" in note


def test_ns_trace_without_the_hint_reads_ns_with_a_note(tmp_path: Path) -> None:
    # Integer ns and no displayTimeUnit: as µs the step would last 95.5 s.
    rt = _load(tmp_path, _with_times(_realistic(), 1000, None), "ns_no_hint.json")
    assert _step_ms(rt) == 95.50025
    (note,) = rt.notes
    assert note.startswith("timestamps read as nanoseconds, not microseconds (the trace has no displayTimeUnit)")


def test_few_events_follow_the_header(tmp_path: Path) -> None:
    # Five events say too little to overrule the header either way.
    t = KinetoTrace(rank=0, world_size=1, time_format="int")
    t.step(1, 1_000, 5_000)
    t.kernel("sgemm", 1_100, 2_000)
    rt = _load(tmp_path, _with_times(t.to_dict(), 1, "ns"), "few.json")
    assert _step_ms(rt) == 0.005


def _absurd(gpu_steps: bool) -> dict:
    """_realistic() plus one kernel stamped 2**31 µs (about 36 minutes) after the others."""
    doc = _realistic()
    if not gpu_steps:
        doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")]
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    stray = dict(kernel, ts=kernel["ts"] + 2**31, name="stray_kernel")
    doc["traceEvents"].append(stray)
    return doc


def test_absurd_timestamp_is_dropped_with_a_warning(tmp_path: Path) -> None:
    rt = _load(tmp_path, _absurd(gpu_steps=True), "absurd.json")
    assert "stray_kernel" not in set(rt.events["name"].astype(str))
    (note,) = rt.notes
    assert note.startswith("1 events dropped whose times lie far outside the rest of the rank's events")
    assert "'stray_kernel'" in note
    span_ms = (rt.events["end_ns"].max() - rt.events["start_ns"].min()) / 1e6
    assert span_ms < 100


def test_absurd_timestamp_does_not_make_the_rank_idle(tmp_path: Path) -> None:
    # Without ProfilerSteps the GPU timeline spans first to last kernel: the
    # stray kernel made it 36 minutes long and the rank 100.0 % idle.
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "rank0.json").write_bytes(orjson.dumps(_absurd(gpu_steps=False)))
    a = analyze(folder, cache=False)
    r0 = a.rank(0)
    # 200 kernels of 2.375 + (i % 39) µs in a 89.6 ms span.
    busy_us = sum(2.375 + (i % 39) for i in range(200))
    span_us = 1_010.0 + 450 * 199 + 30.5 + 2.375 + (199 % 39) - (1_010.0 + 30.5)
    assert r0.gpu_timeline["computation"] == pytest.approx(100 * busy_us / span_us)
    assert any("stray_kernel" in w for w in a.warnings)
