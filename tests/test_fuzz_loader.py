"""Property-based fuzzing of the loader.

The property: whatever the bytes of a file named like a trace, loading a
folder that holds it next to a good rank never raises, names that file in
at most one error line (or loads it as a rank), and leaves the good rank's
events unchanged. Inputs: arbitrary bytes, gzip of arbitrary bytes, and
trace-shaped JSON whose event fields take values of every JSON type
(including huge numbers and deep nesting), the shapes a corrupt or hostile
trace takes.
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import orjson
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in the dev extra (pip install -e .[dev])")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from synth import KinetoTrace  # noqa: E402

from analyzer.ingest.load import load_traces  # noqa: E402

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e308, -1e308, 1e30, 0.5, -1.0]),
    st.text(max_size=20),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20,
)
_event = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.one_of(st.sampled_from(["X", "M", "i", "f", "s"]), _json),
        "cat": st.one_of(st.sampled_from(["kernel", "cpu_op", "user_annotation", "gpu_memcpy"]), _json),
        "name": st.one_of(st.sampled_from(["ProfilerStep#1", "sgemm", "nccl:all_reduce"]), _json),
        "pid": _json,
        "tid": _json,
        "ts": _json,
        "dur": _json,
        "args": st.one_of(
            st.fixed_dictionaries(
                {}, optional={"stream": _json, "correlation": _json, "External id": _json, "Input Dims": _json}
            ),
            _json,
        ),
    },
)
_trace_doc = st.fixed_dictionaries(
    {"traceEvents": st.one_of(st.lists(_event, max_size=30), _json)},
    # No distributedInfo: a fuzzed file claiming rank 0 would (rightly) replace the good rank.
    optional={"deviceProperties": _json, "schemaVersion": _json},
)


def _encode(doc) -> bytes:
    try:
        return orjson.dumps(doc)
    except TypeError:  # an integer over 64 bits: orjson refuses, the standard library writes it
        import json

        return json.dumps(doc).encode()


_contents = st.one_of(
    st.binary(max_size=2000),
    st.binary(max_size=2000).map(gzip.compress),
    _trace_doc.map(_encode),
    _trace_doc.map(lambda d: gzip.compress(_encode(d))),
    _trace_doc.map(lambda d: _encode(d)[: max(1, len(_encode(d)) // 2)]),  # cut short
)


@pytest.fixture(scope="module")
def good_events(tmp_path_factory):
    folder = tmp_path_factory.mktemp("good")
    t = KinetoTrace(rank=0, world_size=2)
    for i in range(3):
        t.step(i, i * 1000, 1000)
        t.kernel("sgemm", i * 1000 + 100, 200)
    good = t.write(folder / "rank0.json.gz")
    return good, load_traces(good, cache=False, workers=1).ranks[0].events


# 60 examples: ~20 s on the shared 2-core machine; raise locally to search harder.
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(content=_contents)
def test_any_bytes_give_one_line_or_a_rank(tmp_path_factory, good_events, content: bytes) -> None:
    good, events = good_events
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "rank0.json.gz").write_bytes(good.read_bytes())
    (folder / "rank1.json").write_bytes(content)
    ts = load_traces(folder, cache=False, workers=1)  # must not raise
    lines = [str(e) for e in ts.errors]
    assert all(line.startswith("rank1.json: ") and "\n" not in line for line in lines), lines
    assert len(lines) <= 1
    assert (len(lines) == 1) != (1 in ts.ranks or any(r.path.name == "rank1.json" for r in ts.ranks.values()))
    rank0 = next(r for r in ts.ranks.values() if r.path.name == "rank0.json.gz")
    assert rank0.events.equals(events)
