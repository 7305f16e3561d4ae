"""Each stage of reading events, alone: reading the
bytes (analyzer.ingest.parse.read), the splitter (JSON text -> decoded event
lists, parse.split and parse.decode), the row rules (parse.classify), the
column builder (events -> typed columns, parse.columns), and the file-level
result they make together."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import orjson
import pytest

from analyzer.errors import TraceError
from analyzer.ingest.parse import Columns, Splitter, decode_events, parse_columns
from analyzer.ingest.parse import classify
from analyzer.ingest.parse.read import read_blocks
from synth import KinetoTrace


def _doc() -> bytes:
    t = KinetoTrace(rank=3, world_size=4)
    t.step(1, 0, 500)
    for i in range(40):
        t.kernel(f"k{i % 3}", 10 * i, 4.5)
    return t.dumps()


def _split(text: bytes, block: int, max_event_bytes: int | None = None) -> tuple[list, dict]:
    # The splitter is fed the blocks of a real file (it reads it again for an error's line number).
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        f.write(text)
    got: list = []
    s = Splitter(Path(f.name), lambda events: got.extend((e.name, e.ts, e.dur) for e in events), max_event_bytes)
    try:
        for i in range(0, len(text), block):
            s.feed(text[i : i + block])
        s.finish()
    finally:
        os.unlink(f.name)
    return got, s.meta


@pytest.mark.parametrize("block", [1, 7, 64, 4096, 1 << 20])
def test_splitter_gives_the_whole_document_parse_in_any_blocks(block: int) -> None:
    text = _doc()
    whole = [(e.name, e.ts, e.dur) for e in decode_events(orjson.dumps(orjson.loads(text)["traceEvents"]))]
    got, meta = _split(text, block)
    assert got == whole
    assert meta["distributedInfo"]["rank"] == 3 and meta["displayTimeUnit"] == "ms"


def test_splitter_bound_on_one_piece() -> None:
    text = b'{"traceEvents": [{"ph": "X", "name": "' + b"x" * 5000 + b'", "ts": 1, "dur": 1}]}'
    with pytest.raises(TraceError, match=r"an element of traceEvents longer than 0 MiB \(from line 1\)"):
        _split(text, 512, max_event_bytes=2048)
    got, _ = _split(text, 512, max_event_bytes=8192)
    assert got == [("x" * 5000, 1, 1)]


def test_columns_stage_builds_typed_columns() -> None:
    events = decode_events(
        orjson.dumps(
            [
                {
                    "ph": "X",
                    "cat": "Kernel",
                    "name": "k",
                    "pid": 0,
                    "tid": "stream 7",
                    "ts": 10,
                    "dur": 2,
                    "args": {"correlation": 5, "external id": 9},
                },
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "aten::mm",
                    "pid": 1,
                    "tid": 1,
                    "ts": 4.5,
                    "dur": 1,
                    "args": {"External id": 9, "Input Dims": [[2, 3], [3, 4]]},
                },
                {"ph": "X", "cat": "cpu_op", "name": "bad", "pid": 1, "tid": 1, "ts": "x", "dur": 1},
            ]
        )
    )
    cols = Columns()
    cols.add(events)
    columns = cols.finish(1000)
    assert cols.rows == 2 and cols.invalid == 1 and cols.first_invalid == "'bad' with ts='x', dur=1"
    assert columns["ts_ns"].tolist() == [10_000, 4_500] and columns["dur_ns"].tolist() == [2_000, 1_000]
    assert columns["stream"].tolist() == [7, -1]  # the old era's "Kernel" sits on a stream
    assert columns["external_id"].tolist() == [9, 9] and columns["correlation"].tolist() == [5, -1]
    assert cols.sparse["input_dims"] == {1: "[[2,3],[3,4]]"}
    assert all(c.dtype == (np.int32 if k in ("cat", "name") else np.int64) for k, c in columns.items())


def test_rows_over_int64_at_the_end_renumber_sparse_rows(tmp_path: Path) -> None:
    """A start that only fails once the unit is known (the last step) is
    dropped there, and the shapes of the rows after it stay on their rows."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "too late", "pid": 1, "tid": 1, "ts": 5e15, "dur": 1},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": 1,
            "ts": 3,
            "dur": 1,
            "args": {"Input Dims": [[2, 3], [3, 4]]},
        },
    ]
    path = tmp_path / "t.json"
    path.write_bytes(orjson.dumps({"traceEvents": events}))
    parsed = parse_columns(path)
    assert parsed.rows == 1 and parsed.sparse["input_dims"] == {0: "[[2,3],[3,4]]"}
    assert parsed.notes[0].startswith("1 complete events dropped") and parsed.notes[0].endswith(
        "first: 'too late' beyond int64 ns)"
    )


def test_read_stage_gives_the_bytes_in_blocks(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(b"x" * 10)
    assert list(read_blocks(path, size=4)) == [b"xxxx", b"xxxx", b"xx"]


def _events(*dicts: dict) -> list:
    return decode_events(orjson.dumps(list(dicts)))


def test_classify_stage_rows_times_and_text() -> None:
    meta: list = []
    events = _events(
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}},
        {"ph": "i", "name": "instant", "ts": 1},
        {"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "name": "no dur", "ts": 1},
        {"ph": "X", "cat": "cpu_op", "name": "neg", "ts": -1, "dur": 2},
        {"ph": "X", "cat": None, "name": 7, "ts": 3, "dur": 0.5},
    )
    xs = classify.complete_events(events, meta.append)
    assert [e.name for e in meta] == ["thread_name"] and len(xs) == 4
    timed = classify.valid_times(xs)
    assert (timed.invalid, timed.no_time) == (2, 1)
    assert timed.first_invalid == "'no dur' with ts=1, dur=None"
    assert timed.ts.tolist() == [1, 3] and timed.dur.tolist() == [2, 0.5]
    assert classify.text_fields(timed.events) == (["cpu_op", ""], ["a", "7"])


def test_classify_stage_trace_span_streams_and_kept_args() -> None:
    xs = _events(
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler", "ts": 0, "dur": 9},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1},
    )
    cats, names = classify.text_fields(xs)
    ts, dur = np.array([0, 1]), np.array([9, 1])
    kept, cats, names, ts, dur = classify.drop_trace_span(xs, cats, names, ts, dur)
    assert (cats, names, ts.tolist(), dur.tolist()) == (["kernel"], ["k"], [1], [1])
    memo: dict = {}
    assert classify.on_gpu_timeline(["Kernel", "cpu_op", "Memcpy"], memo) == {
        "Kernel": True,
        "cpu_op": False,
        "Memcpy": True,
    }
    # aten::view launches no kernel and has no roofline model: its args are not read. aten::add is a binary
    # elementwise op (the roofline's memory-bound families).
    assert classify.wants_args(
        ["aten::mm", "aten::add", "aten::view", "record_param_comms", "gloo:all_reduce"], {}
    ) == {
        "aten::mm": True,
        "aten::add": True,
        "aten::view": False,
        "record_param_comms": True,
        "gloo:all_reduce": True,
    }


def test_columns_stage_keeps_autograd_sequence_numbers() -> None:
    events = _events(
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": 1,
            "ts": 1,
            "dur": 2,
            "args": {"Sequence number": 17},
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "MmBackward0",
            "pid": 1,
            "tid": 2,
            "ts": 5,
            "dur": 2,
            "args": {"Sequence number": 17, "Fwd thread id": 1},
        },
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 6, "dur": 1},
    )
    cols = Columns()
    cols.add(events)
    columns = cols.finish(1000)
    assert columns["seq_num"].tolist() == [17, 17, -1] and columns["fwd_tid"].tolist() == [-1, 1, -1]
