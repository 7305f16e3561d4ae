"""Run-directory reader tests on a hand-built reftrain run directory."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synth import KinetoTrace

from analyzer.errors import AnalyzerError
from analyzer.ingest.rundir import (
    COLLECTIVES_COLUMNS,
    METRICS_COLUMNS,
    TELEMETRY_COLUMNS,
    is_run_dir,
    read_run_dir,
)


def _metrics(rank: int, step: int) -> dict:
    return {
        "step": step,
        "rank": rank,
        "loss": 5.0 - 0.1 * step,
        "step_time_ms": 100.0 + 10 * rank + step,
        "data_wait_ms": 1.0,
        "forward_ms": 30.0,
        "backward_ms": 50.0,
        "optimizer_ms": 5.0,
        "grad_sync_ms": 0.0,
        "comm_ms": 20.0,
        "tokens": 512,
        "tokens_per_s": 5120.0,
        "mfu": 0.25,
        "hfu": 0.25,
        "mem_bytes": 1 << 30,
        "mem_kind": "cpu_rss",
        "profiled": step == 2,
        "lr": 0.001,
        "time_ns": 1_700_000_000_000_000_000 + step,
    }


def _collective(rank: int, step: int) -> dict:
    return {
        "step": step,
        "rank": rank,
        "seq": step,
        "kind": "all_reduce",
        "bytes": 4096,
        "dtype": "float32",
        "pg": "0",
        "group_size": 2,
        "start_ns": 1000 * step + rank,
        "end_ns": 1000 * step + 500,
        "clock": "host",
    }


def _write_jsonl(path: Path, records: list[dict], tail: bytes = b"") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records) + tail)


def _run_dir(root: Path, *, files: bool = True, schema: str = "reftrain.run/1") -> Path:
    run = root / "20260101-000000-tiny-ddp-w2"
    for rank in (0, 1):
        # Steps written out of order on rank 1: the table is sorted.
        steps = [0, 1, 2] if rank == 0 else [2, 0, 1]
        _write_jsonl(run / f"metrics/rank{rank}.jsonl", [_metrics(rank, s) for s in steps])
        _write_jsonl(run / f"collectives/rank{rank}.jsonl", [_collective(rank, s) for s in (0, 1, 2)])
        t = KinetoTrace(rank=rank, world_size=2, gpu=False)
        t.step(2, 0, 100)
        t.write(run / f"traces/rank{rank}.step2.json.gz")
    _write_jsonl(
        run / "telemetry/gpu1.jsonl",
        [
            {
                "time_ns": 20,
                "gpu_util_pct": 90,
                "mem_util_pct": 40,
                "sm_clock_mhz": 1980,
                "power_w": 650.5,
                "mem_used_bytes": 10,
                "temp_c": 60,
                "throttle_reasons": [],
            },
            {
                "time_ns": 10,
                "gpu_util_pct": 80,
                "mem_util_pct": 30,
                "sm_clock_mhz": 1980,
                "power_w": None,
                "mem_used_bytes": 11,
                "temp_c": 61,
                "throttle_reasons": ["sw_power_cap"],
            },
        ],
    )
    listing = {
        "config": "config.yaml",
        "metrics": ["metrics/rank0.jsonl", "metrics/rank1.jsonl"],
        "collectives": ["collectives/rank0.jsonl", "collectives/rank1.jsonl"],
        "telemetry": ["telemetry/gpu1.jsonl"],
        "traces": ["traces/rank0.step2.json.gz", "traces/rank1.step2.json.gz"],
        "checkpoints": [],
    }
    manifest = {
        "schema": schema,
        "run_id": run.name,
        "status": "completed",
        "world_size": 2,
        "backend": "gloo",
        "files": listing
        if files
        else {
            "config": "config.yaml",
            "metrics": [],
            "collectives": [],
            "telemetry": [],
            "traces": [],
            "checkpoints": [],
        },
        "schemas": {
            "metrics": "reftrain.metrics/1",
            "collectives": "reftrain.collectives/1",
            "telemetry": "reftrain.telemetry/1",
        },
    }
    (run / "run.json").write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    return run


def test_read_complete_run_dir(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    assert is_run_dir(run)
    rd = read_run_dir(run)
    assert rd.errors == [] and rd.world_size == 2 and rd.manifest["run_id"] == run.name
    m = rd.metrics
    assert list(m.columns) == list(METRICS_COLUMNS) + ["lr"]
    assert {c: str(m[c].dtype) for c in METRICS_COLUMNS} == METRICS_COLUMNS
    assert list(zip(m["rank"], m["step"])) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert m["step_time_ms"].tolist() == [100.0, 101.0, 102.0, 110.0, 111.0, 112.0]
    assert m["profiled"].tolist() == [False, False, True] * 2
    c = rd.collectives
    assert list(c.columns) == list(COLLECTIVES_COLUMNS) and len(c) == 6
    assert c.loc[c["rank"] == 1, "start_ns"].tolist() == [1, 1001, 2001]
    t = rd.telemetry
    assert list(t.columns) == list(TELEMETRY_COLUMNS)
    # rank from the file name gpu1.jsonl; sorted by time; null power stays missing
    assert t["rank"].tolist() == [1, 1] and t["time_ns"].tolist() == [10, 20]
    assert pd.isna(t["power_w"].iloc[0]) and t["power_w"].iloc[1] == 650.5
    assert t["throttle_reasons"].tolist() == [["sw_power_cap"], []]
    assert rd.trace_paths == [
        (run / "traces/rank0.step2.json.gz").absolute(),
        (run / "traces/rank1.step2.json.gz").absolute(),
    ]


def test_analysis_carries_the_telemetry(tmp_path: Path) -> None:
    """analyze() passes the run's NVML samples on (the suggestions' health rules read them)."""
    from analyzer.api import analyze

    ra = analyze(_run_dir(tmp_path), cache=False)
    assert ra.telemetry["rank"].tolist() == [1, 1] and ra.telemetry["temp_c"].tolist() == [61, 60]
    assert ra.telemetry["throttle_reasons"].tolist() == [["sw_power_cap"], []]


def test_damaged_rank_files_are_error_lines_and_the_rest_is_read(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    (run / "metrics/rank1.jsonl").unlink()
    # A writer killed mid-line leaves a torn last line.
    _write_jsonl(
        run / "collectives/rank1.jsonl", [_collective(1, 0), _collective(1, 1)], tail=b'{"step": 2, "rank": 1, "se'
    )
    (run / "telemetry/gpu1.jsonl").write_bytes(b"\x00\x01garbage\nmore garbage\n")
    rd = read_run_dir(run)
    assert rd.errors == [
        "metrics/rank1.jsonl: listed in run.json but missing",
        "collectives/rank1.jsonl: last line 3 is incomplete (unexpected end of data; run killed while writing?); 2 records read",
        "telemetry/gpu1.jsonl: 2 unreadable lines skipped (first: line 1, unexpected character, expected a JSON value); 0 records read",
    ]
    assert sorted(set(rd.metrics["rank"])) == [0] and len(rd.metrics) == 3
    assert rd.collectives.groupby("rank").size().to_dict() == {0: 3, 1: 2}
    assert rd.telemetry.empty and list(rd.telemetry.columns) == list(TELEMETRY_COLUMNS)
    assert {c: str(rd.telemetry[c].dtype) for c in TELEMETRY_COLUMNS} == TELEMETRY_COLUMNS


def test_running_run_without_file_listing_is_read_from_disk(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, files=False)
    rd = read_run_dir(run)
    assert rd.errors == []
    assert len(rd.metrics) == 6 and len(rd.collectives) == 6 and len(rd.telemetry) == 2
    assert [p.name for p in rd.trace_paths] == ["rank0.step2.json.gz", "rank1.step2.json.gz"]


def test_minor_schema_versions_are_accepted(tmp_path: Path) -> None:
    assert read_run_dir(_run_dir(tmp_path, schema="reftrain.run/1.3")).errors == []


def test_unknown_major_schema_is_an_error(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, schema="reftrain.run/2")
    assert is_run_dir(run)
    with pytest.raises(
        AnalyzerError,
        match=r"run\.json: schema reftrain\.run/2 is not supported \(this analyzer reads reftrain\.run/1\)",
    ):
        read_run_dir(run)


def test_unknown_family_schema_skips_that_family(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    manifest = orjson.loads((run / "run.json").read_bytes())
    manifest["schemas"]["collectives"] = "reftrain.collectives/7"
    (run / "run.json").write_bytes(orjson.dumps(manifest))
    rd = read_run_dir(run)
    assert rd.errors == [
        "collectives: schema reftrain.collectives/7 is not supported (this analyzer reads reftrain.collectives/1); "
        "upgrade the analyzer; collectives not read"
    ]
    assert rd.collectives.empty and len(rd.metrics) == 6


def test_is_run_dir_and_manifest_problems(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    assert not is_run_dir(traces)
    (traces / "run.json").write_bytes(b'{"schema": "other.tool/1"}')
    assert not is_run_dir(traces)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "run.json").write_bytes(b'{"schema": "reftrain.run/1", ')
    assert is_run_dir(broken)
    with pytest.raises(AnalyzerError, match=r"broken/run\.json: invalid JSON \(unexpected end of data\)"):
        read_run_dir(broken)
    with pytest.raises(AnalyzerError, match=r"not a run directory \(no run\.json\)"):
        read_run_dir(tmp_path / "nothing")
