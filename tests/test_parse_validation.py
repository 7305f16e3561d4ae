"""Hostile nesting and out-of-range values at the parse edge: each is one file's error or one warning, never a
traceback, a RecursionError or a numpy warning."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import orjson
import pytest

from analyzer.errors import TraceError
from analyzer.ingest.load import load_trace, load_traces
from analyzer.ingest.parse import MAX_TIME_NS, complete_events, raw_times, time_unit_ns, to_ns
from synth import KinetoTrace

REPO = Path(__file__).resolve().parent.parent
DEEP = 100_000


def _good(rank: int) -> KinetoTrace:
    t = KinetoTrace(rank=rank, world_size=2, time_format="int")
    t.step(1, 0, 1000)
    t.kernel("sgemm", 100, 200)
    return t


def _event(**fields) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 10, "dur": 5, **fields}


# --------------------------------------------------------------------------
# Nesting


@pytest.mark.parametrize(
    "where",
    ["top level", "in args", "in an object before traceEvents", "in an object after traceEvents", "in an event"],
)
def test_deep_nesting_is_one_error(tmp_path: Path, where: str) -> None:
    deep = b"[" * DEEP + b"]" * DEEP
    deep_obj = b'{"a":' * DEEP + b"1" + b"}" * DEEP
    ok = orjson.dumps(_event())
    content = {
        "top level": deep,
        "in args": b'{"traceEvents": [' + ok + b', {"ph": "X", "ts": 1, "dur": 1, "args": {"x": ' + deep + b"}}]}",
        "in an object before traceEvents": b'{"meta": ' + deep_obj + b', "traceEvents": [' + ok + b"]}",
        "in an object after traceEvents": b'{"traceEvents": [' + ok + b'], "meta": ' + deep_obj + b"}",
        "in an event": b'{"traceEvents": [' + ok + b", " + deep_obj + b"]}",
    }[where]
    path = tmp_path / "rank1.json"
    path.write_bytes(content)
    with pytest.raises(
        TraceError, match=r"^rank1\.json: JSON nested too deeply \(over about \d+ levels, the decoder's limit\)$"
    ):
        load_trace(path)


def test_deep_file_among_good_ranks_leaves_them_analyzed(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    _good(0).write(folder / "rank0.json.gz")
    (folder / "rank1.json").write_bytes(b'{"traceEvents": [' + b"[" * DEEP + b"]" * DEEP + b"]}")
    for workers in (1, 2):
        ts = load_traces(folder, cache=False, workers=workers)
        assert sorted(ts.ranks) == [0]
        assert [str(e) for e in ts.errors] == [
            f"rank1.json: JSON nested too deeply (over about {sys.getrecursionlimit()} levels, the decoder's limit)"
        ]


# --------------------------------------------------------------------------
# Times


def test_raw_times_stage() -> None:
    arr, ok = raw_times([0, 5, 7])
    assert arr.dtype == np.int64 and ok is None
    arr, ok = raw_times([1.5, 2.25])
    assert arr.dtype == np.float64 and ok is None
    arr, ok = raw_times([1.0, 1e308, float("inf"), float("nan"), -1.0, 3.0])
    assert ok.tolist() == [True, False, False, False, False, True] and arr.tolist() == [1.0, 0, 0, 0, 0, 3.0]
    arr, ok = raw_times([1, "2", None, True, 10**30, -4, 7, [1]])
    assert ok.tolist() == [True, False, False, False, False, False, True, False]
    assert arr.dtype == np.int64 and arr.tolist() == [1, 0, 0, 0, 0, 0, 7, 0]


def test_to_ns_stage_units_and_int64_bound() -> None:
    ns, over = to_ns(np.array([1, 4458676522690]), 1000)
    assert ns.tolist() == [1000, 4458676522690000] and over is None
    ns, over = to_ns(np.array([4458676522690.655, 0.0006]), 1000)
    assert ns.tolist() == [4458676522690655, 1] and over is None
    ns, over = to_ns(np.array([1700000000000000123, 5]), 1)  # ns in, ns out
    assert ns.tolist() == [1700000000000000123, 5] and over is None
    ns, over = to_ns(np.array([MAX_TIME_NS // 1000 + 1, 3]), 1000)  # start would not fit int64 ns
    assert over.tolist() == [True, False] and ns.tolist() == [0, 3000]
    assert time_unit_ns("ns") == 1 and time_unit_ns("NS") == 1
    assert time_unit_ns("ms") == 1000 and time_unit_ns(None) == 1000 and time_unit_ns(5) == 1000


def test_complete_events_stage() -> None:
    from analyzer.ingest.parse.decode import _EVENTS

    events = _EVENTS.decode(orjson.dumps([_event(), {"ph": "M", "name": "process_name"}, {"ph": "i", "ts": 3}]))
    meta = []
    assert [e.name for e in complete_events(events, meta.append)] == ["op"]
    assert [e.name for e in meta] == ["process_name"]


def test_out_of_range_values_are_dropped_and_counted_once(tmp_path: Path) -> None:
    """ts/dur of 1e308 or 1e30 became garbage integers (with a numpy
    RuntimeWarning on stderr); text, bools and negatives are dropped too,
    in one note with the count and the first example."""
    t = _good(0)
    bad = [
        _event(name="huge ts", ts=1e308),
        _event(name="huge dur", dur=1e30),
        _event(name="text ts", ts="abc"),
        _event(name="numeric text ts", ts="12"),
        _event(name="bool dur", dur=True),
        _event(name="negative ts", ts=-3),
        _event(name="negative dur", dur=-1),
        _event(name="int beyond int64", ts=10**30),
        _event(name="beyond int64 ns", ts=9_300_000_000_000_000),  # fits int64 as µs, not as ns
    ]
    doc = t.to_dict()
    doc["traceEvents"] += bad
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))  # the standard library writes 10**30 and 1e308 as given
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning fails the test
        rt = load_trace(path)
    assert rt.notes == [
        "9 complete events dropped for a missing or invalid ts/dur (ts and dur must be finite numbers >= 0 "
        "whose end fits int64 ns; first: 'huge ts' with ts=1e+308, dur=5)"
    ]
    names = set(rt.events["name"].astype(str))
    assert names == {"ProfilerStep#1", "sgemm"}
    assert rt.events["start_ns"].min() >= 0 and rt.events["end_ns"].max() == 1_000_000
    assert rt.steps["end_ns"].tolist() == [1_000_000]


def test_file_of_only_invalid_events_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    path.write_bytes(orjson.dumps({"traceEvents": [_event(ts=1e308), _event(ts=1e30, name="b")]}))
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(err.value) == (
        "rank0.json: no valid events: all 2 complete events have a missing or invalid ts/dur "
        "(first: 'op' with ts=1e+308, dur=5)"
    )


def test_text_ts_does_not_keep_a_rank_with_zero_steps_silently(tmp_path: Path) -> None:
    t = KinetoTrace(rank=1, world_size=2, time_format="int")
    t.step(1, 0, 1000)
    t.kernel("sgemm", 100, 200)
    doc = t.to_dict()
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] = str(e["ts"])
    (tmp_path / "rank1.json").write_bytes(orjson.dumps(doc))
    t0 = _good(0)
    t0.write(tmp_path / "rank0.json.gz")
    ts = load_traces(tmp_path, cache=False)
    assert [str(e) for e in ts.errors] == [
        "rank1.json: no valid events: all 3 complete events have a missing or invalid ts/dur "
        "(first: 'ProfilerStep#1' with ts='0', dur=1000)"
    ]
    assert sorted(ts.ranks) == [0]


def test_cli_prints_one_line_per_bad_file_and_no_python_warnings(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    doc = _good(0).to_dict()
    doc["traceEvents"].append(_event(name="huge", ts=1e308, dur=1e30))
    folder.mkdir()
    (folder / "rank0.json.gz").write_bytes(gzip.compress(orjson.dumps(doc)))
    bad = folder / "rank1.json"
    bad.write_bytes(orjson.dumps({"traceEvents": [_event(ts=1e30)]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINPERF_", "PYTHONWARNINGS"))}
    out = subprocess.run(
        [sys.executable, "-m", "analyzer.cli", "report", "--no-cache", str(folder)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert [line for line in lines if "rank1.json" in line] == [
        "analyzer: skipped: rank1.json: no valid events: the 1 complete event has a missing or invalid ts/dur "
        "(first: 'op' with ts=1e+30, dur=5)"
    ]
    assert [line for line in lines if "rank0.json.gz" in line and "dropped" in line] == [
        "analyzer: warning: rank0.json.gz: 1 complete events dropped for a missing or invalid ts/dur (ts and dur "
        "must be finite numbers >= 0 whose end fits int64 ns; first: 'huge' with ts=1e+308, dur=1e+30)"
    ]
    assert all(line.startswith("analyzer: ") for line in lines), lines  # no RuntimeWarning, no traceback


def test_decode_stage_marks_wrong_json_types_invalid() -> None:
    """Bools, arrays, objects and numbers beyond float64 as ts/dur fail the
    typed decode; the lenient path keeps them as text, so the times stage
    counts them as invalid (numpy alone would read true as 1)."""
    from analyzer.ingest.parse import decode_events

    events = decode_events(
        b'[{"ph": "X", "name": "a", "ts": 1e400, "dur": true, "args": {"External id": 3}},'
        b' {"ph": "X", "name": "b", "ts": [1], "dur": {"a": 1}}, 5,'
        b' {"ph": "X", "name": "c", "ts": 1, "dur": 2, "args": [1]}]'
    )
    assert [(e.name, e.ts, e.dur) for e in events] == [("a", "inf", "True"), ("b", "[1]", "{'a': 1}"), ("c", 1, 2)]
    _, ok = raw_times([e.ts for e in events])
    assert ok.tolist() == [False, False, True]
