"""Peak memory per step and rank, and the memory timeline (analyzer.metrics.memory).

Exact answers on synthetic ``[memory]`` events (tests/synth.py) and on hand-made
metrics records; the parse of real ``profile_memory=True`` traces against a
plain JSON read of the same files (skipped when ../shared is absent); the
report, compare and the ``check --max-memory-growth`` gate on the example run.
"""

from __future__ import annotations

import gzip
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer import analyze, compare
from analyzer.ingest.load import load_trace
from analyzer.metrics.memory import memory_timeline, metrics_step_memory, rank_peaks, run_memory, step_peaks
from synth import KinetoTrace

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "traces" / "example-ddp-w2"
SHARED = REPO.parent / "shared" / "traces"
MiB = 2**20


def memory_trace(folder: Path, scale: int = 1, rank: int = 0) -> Path:
    """Steps 10, 11, 12 of 1000 us each; CUDA events (us, allocated, reserved) at (50, 1000, 2048),
    (300, 5000, 8192), (600, 3000, 8192), (1200, 4000, 8192), (1500, 2000, 4096), none in step 12;
    one CPU allocator event (100 us, 16 bytes). Allocated bytes times ``scale``."""
    t = KinetoTrace(rank=rank, world_size=1)
    for i, step in enumerate((10, 11, 12)):
        t.step(step, 1000 * i, 1000)
        t.cpu_op("aten::add", 1000 * i + 10, 20)
        t.kernel("add_kernel", 1000 * i + 40, 10, launch_us=1000 * i + 15)
    for ts, alloc, resv, nbytes in (
        (50, 1000, 2048, 1000),
        (300, 5000, 8192, 4000),
        (600, 3000, 8192, -2000),
        (1200, 4000, 8192, 1000),
        (1500, 2000, 4096, -2000),
    ):
        t.memory(ts, alloc * scale, resv, nbytes)
    t.memory(100, 16, 0, 16, device_type=0)
    return t.write(folder / f"rank{rank}.json.gz")


def test_events_are_read_with_their_device(tmp_path: Path) -> None:
    rt = load_trace(memory_trace(tmp_path))
    m = rt.memory
    assert list(m["device"]) == ["cuda:0", "cpu", "cuda:0", "cuda:0", "cuda:0", "cuda:0"]
    assert list(m["ts_ns"]) == [50_000, 100_000, 300_000, 600_000, 1_200_000, 1_500_000]
    assert list(m["allocated_bytes"]) == [1000, 16, 5000, 3000, 4000, 2000]
    assert list(m["delta_bytes"]) == [1000, 16, 4000, -2000, 1000, -2000]
    assert m["allocated_bytes"].dtype == np.int64 and m["reserved_bytes"].dtype == np.int64


def test_step_peaks_carry_the_level_into_windows(tmp_path: Path) -> None:
    rt = load_trace(memory_trace(tmp_path))
    got = step_peaks(rt.memory, rt.steps)
    rows = {(r.step, r.device): (r.peak_allocated_bytes, r.peak_reserved_bytes, r.n_events) for r in got.itertuples()}
    assert rows == {
        (10, "cuda:0"): (5000, 8192, 3),  # no level before the first event: the events inside
        (11, "cuda:0"): (4000, 8192, 2),  # the level at start (3000, 8192 from 600 us) and 4000, 2000 inside
        (12, "cuda:0"): (2000, 4096, 0),  # no event: the level carried in from 1500 us
        (10, "cpu"): (16, 0, 1),
        (11, "cpu"): (16, 0, 0),
        (12, "cpu"): (16, 0, 0),
    }
    assert list(got["device"][:2]) == ["cuda:0", "cpu"]  # accelerators first


def test_timeline_bins_keep_every_peak(tmp_path: Path) -> None:
    rt = load_trace(memory_trace(tmp_path))
    tl = memory_timeline(rt.memory, n_bins=2)
    # The bins split [50, 1500] us: [50 000, 775 000) and [775 000, 1 500 001) ns.
    assert list(tl["start_ns"]) == [50_000, 775_000, 50_000, 775_000]
    assert list(tl["end_ns"]) == [775_000, 1_500_001, 775_000, 1_500_001]
    assert list(tl["device"]) == ["cuda:0", "cuda:0", "cpu", "cpu"]
    # Bin 2 of cuda:0: 4000 and 2000 inside, 3000 carried in: its peak is 4000; reserved 8192 carried in.
    assert list(tl["allocated_bytes"]) == [5000, 4000, 16, 16]
    assert list(tl["reserved_bytes"]) == [8192, 8192, 0, 0]
    fine = memory_timeline(rt.memory, n_bins=290)  # 5 us bins: every event in a bin of its own
    assert len(fine.loc[fine["device"] == "cuda:0"]) == 290 and fine["allocated_bytes"].max() == 5000
    # A bin before the CPU allocator's first event (100 us) has no level: left out.
    assert fine.loc[fine["device"] == "cpu", "start_ns"].min() > 50_000


def test_run_memory_of_a_trace_folder(tmp_path: Path) -> None:
    memory_trace(tmp_path, rank=0)
    memory_trace(tmp_path, scale=3, rank=1)
    a = analyze(tmp_path, cache=False)
    m = a.memory
    assert (m.source, m.kind) == ("trace", "cuda")  # rank 0 on cuda:0, rank 1 on cuda:1
    ranks = m.ranks.set_index("rank")
    assert ranks.loc[0, "peak_allocated_bytes"] == 5000 and ranks.loc[1, "peak_allocated_bytes"] == 15000
    assert ranks.loc[1, "peak_allocated_step"] == 10 and ranks.loc[1, "peak_reserved_bytes"] == 8192
    assert (m.peak_allocated_bytes, m.peak_reserved_bytes) == (15000, 8192)  # max over ranks
    per_step = m.per_step().set_index("step")
    assert per_step.loc[11, "peak_allocated_bytes"] == 12000 and per_step.loc[11, "rank"] == 1
    peaks = m.trace_peaks.set_index(["rank", "device"])
    assert peaks.loc[(0, "cuda:0"), "n_events"] == 5 and peaks.loc[(0, "cpu"), "peak_allocated_bytes"] == 16
    assert set(m.timeline["rank"]) == {0, 1}
    doc = a.to_json()["memory"]
    assert doc["schema"] == "analyzer.memory/1" and doc["peak_allocated_bytes"] == 15000
    assert [r["rank"] for r in doc["ranks"]] == [0, 1] and len(doc["steps"]) == 3
    # The text report's section, and the cached summary gives the same figures.
    from analyzer.render.text import memory_lines

    lines = memory_lines(a)
    assert lines[0].startswith("Memory, peak allocated and reserved bytes, MiB (profiler memory events")
    assert "run peak (max over ranks): 0.0 MiB allocated" in "\n".join(lines)
    first, second = analyze(tmp_path, cache=True), analyze(tmp_path, cache=True)
    assert first.to_json()["memory"] == second.to_json()["memory"] == doc
    assert second.memory.timeline.equals(m.timeline)


def test_bad_memory_events_are_dropped_and_counted(tmp_path: Path) -> None:
    t = KinetoTrace(rank=0, world_size=1)
    t.step(1, 0, 100)
    t.cpu_op("aten::add", 10, 20)
    t.memory(5, 100, 200)
    t.raw(
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "name": "[memory]",
            "pid": t.pid,
            "tid": t.tid,
            "ts": 6,
            "args": {"Total Allocated": "lots", "Total Reserved": 1},
        }
    )
    t.raw({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": t.pid, "tid": t.tid, "ts": 7, "args": {}})
    rt = load_trace(t.write(tmp_path / "rank0.json.gz"))
    assert list(rt.memory["allocated_bytes"]) == [100]
    assert any("2 [memory] events dropped" in n for n in rt.notes)


def _metrics(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["rank", "step", "mem_bytes", "mem_kind", "mem_reserved_bytes", "profiled"])


def test_metrics_records_peak_outside_profiled_steps() -> None:
    m = _metrics(
        [
            (0, 0, 300 * MiB, "cuda_peak_allocated", 400 * MiB, False),
            (0, 1, 500 * MiB, "cuda_peak_allocated", 640 * MiB, False),  # the optimizer's state: the peak
            (0, 2, 450 * MiB, "cuda_peak_allocated", 640 * MiB, True),
            (0, 3, 900 * MiB, "cuda_peak_allocated", 999 * MiB, True),  # profiled: left out
            (1, 0, 310 * MiB, "cuda_peak_allocated", 410 * MiB, False),
            (1, 1, 520 * MiB, "cuda_peak_allocated", 660 * MiB, False),
            (1, 2, None, None, None, False),  # no memory figure: no row
        ]
    )
    steps = metrics_step_memory(m)
    assert len(steps) == 6 and set(steps["source"]) == {"metrics"}
    ranks = rank_peaks(steps).set_index("rank")
    assert ranks.loc[0, "peak_allocated_bytes"] == 500 * MiB and ranks.loc[0, "peak_allocated_step"] == 1
    assert ranks.loc[0, "peak_reserved_bytes"] == 640 * MiB and ranks.loc[0, "n_steps"] == 2
    assert ranks.loc[1, "peak_allocated_bytes"] == 520 * MiB
    rm = run_memory(m, {})
    assert (rm.source, rm.kind, rm.peak_allocated_bytes, rm.peak_reserved_bytes) == (
        "metrics",
        "cuda_peak_allocated",
        520 * MiB,
        660 * MiB,
    )
    # Every step profiled: all of them count.
    only = rank_peaks(metrics_step_memory(m.loc[m["profiled"]]))
    assert only.loc[0, "peak_allocated_bytes"] == 900 * MiB


def test_compare_gives_memory_deltas_and_growth(tmp_path: Path) -> None:
    memory_trace(tmp_path / "base")
    memory_trace(tmp_path / "cand", scale=2)
    c = compare(analyze(tmp_path / "base", cache=False), analyze(tmp_path / "cand", cache=False))
    assert c.memory_source == "trace (cuda), MiB, max over ranks"
    peak = c.memory[0]
    assert (peak.name, peak.base, peak.cand) == ("peak allocated", 5000 / MiB, 10000 / MiB)
    assert c.memory[1].name == "peak reserved" and c.memory[1].delta == 0.0
    assert c.memory[2].name == "rank 0"
    assert c.memory_growth == pytest.approx(1.0)
    doc = c.to_json()
    assert doc["memory_growth"] == pytest.approx(1.0) and doc["memory"][0]["delta_pct"] == pytest.approx(100.0)
    from analyzer.render.text import compare_text as render_compare_text

    assert "Peak memory (trace (cuda), MiB, max over ranks); growth of the peak +100.0%" in render_compare_text(c)


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    from analyzer.cli import main

    code = main([*argv, "--no-cache"])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def grown_run(tmp_path: Path) -> Path:
    """The example run with every record's mem_bytes 1.2 x (the same step times)."""
    dest = tmp_path / "grown"
    shutil.copytree(RUN, dest, ignore=shutil.ignore_patterns(".analyzer-cache"))
    for f in (dest / "metrics").glob("rank*.jsonl"):
        recs = [json.loads(line) for line in f.read_text().splitlines()]
        f.write_text("".join(json.dumps({**r, "mem_bytes": round(r["mem_bytes"] * 1.2)}) + "\n" for r in recs))
    return dest


def test_check_max_memory_growth_fails_beyond_the_allowance(capsys, tmp_path: Path, grown_run: Path) -> None:
    base_peak = analyze(RUN, cache=False).memory.peak_allocated_bytes
    code, out, _ = _main(
        capsys,
        "check",
        str(grown_run),
        "--baseline",
        str(RUN),
        "--max-memory-growth",
        "0.1",
        "--json",
        str(tmp_path / "v.json"),
        "--junit",
        str(tmp_path / "v.xml"),
        "--summary",
        str(tmp_path / "v.md"),
    )
    assert code == 1 and out.startswith("analyzer check: REGRESSION")
    assert "Regression: peak memory" in out and "(+20.0%, over the allowed +10.0%" in out
    v = json.loads((tmp_path / "v.json").read_text())
    assert (v["verdict"], v["step_verdict"]) == ("regression", "pass")  # same step times: only memory decides
    assert v["memory"]["failed"] is True and v["memory"]["growth"] == pytest.approx(0.2, abs=1e-8)
    assert v["memory"]["base_bytes"] == base_peak and v["memory"]["kind"] == "cpu_rss"
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "v.xml").getroot().iter("testcase")}
    assert cases["peak memory"].find("failure") is not None
    assert "| peak memory, MiB (allowed +10.0%) |" in (tmp_path / "v.md").read_text()
    code, out, _ = _main(capsys, "check", str(grown_run), "--baseline", str(RUN), "--max-memory-growth", "0.25")
    assert code == 0 and "Peak memory" in out and "within the allowed +25.0%" in out


def test_check_without_memory_figures_is_one_line_exit_2(capsys) -> None:
    code, out, err = _main(
        capsys, "check", str(RUN / "traces"), "--baseline", str(RUN / "traces"), "--max-memory-growth", "0.1"
    )
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--max-memory-growth" in err and "no peak memory" in err


def test_a_negative_allowance_is_refused(capsys) -> None:
    code, _, err = _main(capsys, "check", str(RUN), "--baseline", str(RUN), "--max-memory-growth", "-0.1")
    assert code == 2 and "--max-memory-growth must be >= 0" in err


def _raw_memory_peaks(path: Path) -> dict[str, tuple[int, int, int]]:
    """Per device label, (max Total Allocated, max Total Reserved, count) by a plain JSON read."""
    doc = json.loads(gzip.open(path).read())
    out: dict[str, list[int]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "i" and e.get("name") == "[memory]":
            a = e["args"]
            kind = {0: "cpu", 1: "cuda", 6: "hip"}[a["Device Type"]]  # c10::DeviceType: ROCm traces write HIP
            label = kind if kind == "cpu" or a["Device Id"] < 0 else f"{kind}:{a['Device Id']}"
            cur = out.setdefault(label, [0, 0, 0])
            cur[0], cur[1], cur[2] = max(cur[0], a["Total Allocated"]), max(cur[1], a["Total Reserved"]), cur[2] + 1
    return {k: tuple(v) for k, v in out.items()}


SAMPLES = [
    "tracelens-samples/h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "tracelens-samples/mi300/gaunernst_bert-small-uncased__1016001.json.gz",
    "tracelens-samples/perf_model/normalization/normalization_layer_test.json.gz",
    "tracelens-samples/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
]


@pytest.mark.parametrize("sample", SAMPLES)
def test_real_traces_peaks_equal_a_plain_json_read(sample: str) -> None:
    path = SHARED / sample
    if not path.exists():
        pytest.skip(f"{path} absent")
    a = analyze(path, cache=False)
    got = {
        r.device: (r.peak_allocated_bytes, r.peak_reserved_bytes, r.n_events)
        for r in a.memory.trace_peaks.itertuples(index=False)
    }
    assert got == _raw_memory_peaks(path)
    assert a.memory.source == "trace" and not a.memory.timeline.empty


def test_plain_memory_rows_are_converted_column_at_a_time_and_odd_ones_row_by_row() -> None:
    """The column-at-a-time path takes only rows as PyTorch writes them; anything else falls back to the exact
    row-by-row check (test_bad_memory_events_are_dropped_and_counted), never converted loosely."""
    from analyzer.ingest.parse.columns import _plain_memory_columns

    rows = [(10.5, 4096, 8192, 512, 1, 0), (11, 2048, 8192, None, 1, None)]
    ts, alloc, resv, nbytes, device_type, device_id = _plain_memory_columns(rows)
    assert ts.dtype == np.float64 and ts.tolist() == [10.5, 11.0]
    assert alloc.tolist() == [4096, 2048] and resv.tolist() == [8192, 8192] and alloc.dtype == np.int64
    assert nbytes.tolist() == [512, 0] and device_type.tolist() == [1, 1] and device_id.tolist() == [0, -1]
    for odd in [
        (10, True, 8192, 0, 1, 0),  # a bool total (not a number for the row check)
        (10, None, 8192, 0, 1, 0),  # a missing total: the row is dropped, and counted
        (-1, 4096, 8192, 0, 1, 0),  # a negative ts
        (float("nan"), 4096, 8192, 0, 1, 0),
        (10, 4096.0, 8192, 0, 1, 0),  # a float total: int() it row by row, as before
        (10, 1 << 70, 8192, 0, 1, 0),
    ]:  # beyond int64
        assert _plain_memory_columns([rows[0], odd]) is None, odd
