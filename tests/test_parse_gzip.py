"""Reading trace files as a bounded stream.

Multi-member gzip files are read like ``gzip -dc`` reads them; a file over a
bound (decompressed size, longest JSON piece) is one error naming the flag
that raises it, found while streaming, with peak memory measured in a
child process. Hostile files are generated small on disk at test time.
"""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer.ingest import limits as limits_mod
from analyzer.errors import TraceError
from analyzer.ingest.limits import ParseLimits
from analyzer.ingest.load import load_trace, load_traces
from analyzer.ingest.parse import parse_columns
from analyzer.ingest.parse.read import read_blocks
from synth import KinetoTrace

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
MIB = 1 << 20


def _trace(n_kernels: int = 200, rank: int = 0) -> KinetoTrace:
    t = KinetoTrace(rank=rank, world_size=2)
    t.step(1, 0, 10 * n_kernels + 100)
    for i in range(n_kernels):
        t.kernel(f"kernel_{i % 7}", 10 * i, 5)
    return t


def _columns_equal(a, b) -> None:
    assert a.cats == b.cats and a.names == b.names
    assert a.columns.keys() == b.columns.keys()
    for key in a.columns:
        np.testing.assert_array_equal(a.columns[key], b.columns[key])
    assert a.sparse == b.sparse and a.meta == b.meta and a.json_bytes == b.json_bytes


# --------------------------------------------------------------------------
# Multi-member gzip


def test_two_member_gzip_of_a_real_trace_equals_the_plain_file(tmp_path: Path, hta_samples: Path) -> None:
    """``cat a.gz b.gz`` of one document split at a byte boundary: the old
    reader decompressed the second member twice (Python 3.11 keeps the
    bytes after a member in both unused_data and unconsumed_tail) and
    rejected the file with "trailing characters"."""
    text = gzip.decompress((hta_samples / "trace_diff" / "control" / "control.json.gz").read_bytes())
    cut = len(text) // 2 + 12345  # inside an event, not at a boundary
    plain = tmp_path / "plain.json"
    plain.write_bytes(text)
    two = tmp_path / "rank0.json.gz"
    two.write_bytes(gzip.compress(text[:cut], compresslevel=1) + gzip.compress(text[cut:], compresslevel=1))
    _columns_equal(parse_columns(plain), parse_columns(two))
    a, b = load_trace(plain), load_trace(two)
    pd.testing.assert_frame_equal(a.events, b.events)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert len(b.steps) > 0 and b.notes == []


def test_many_members_and_zero_padding(tmp_path: Path) -> None:
    text = _trace(3000).dumps()
    plain = tmp_path / "plain.json"
    plain.write_bytes(text)
    pieces = [text[i : i + 7001] for i in range(0, len(text), 7001)]  # about 100 members
    many = tmp_path / "many.json.gz"
    # Highly compressible members, then the zero padding some writers add.
    many.write_bytes(b"".join(gzip.compress(p, compresslevel=9) for p in pieces) + b"\x00" * 4096)
    assert len(pieces) > 50
    _columns_equal(parse_columns(plain), parse_columns(many))


def test_member_ending_exactly_at_a_read_boundary(tmp_path: Path) -> None:
    """The first member's compressed bytes end exactly where the reader's
    1 MiB read ends: the old reader then saw no unused data, read one more
    byte and called the second member "trailing garbage"."""
    text = _trace(20000).dumps(layout="compact")
    # Stored (level 0) members have a size that is linear in their input:
    # pick the cut that makes the first member exactly 1 MiB.
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(gzip.compress(text[:mid], compresslevel=0, mtime=0)) < MIB:
            lo = mid + 1
        else:
            hi = mid
    first = gzip.compress(text[:lo], compresslevel=0, mtime=0)
    assert len(first) == MIB, len(first)
    path = tmp_path / "boundary.json.gz"
    path.write_bytes(first + gzip.compress(text[lo:], mtime=0))
    plain = tmp_path / "plain.json"
    plain.write_bytes(text)
    _columns_equal(parse_columns(plain), parse_columns(path))


def test_truncated_member_and_garbage_after_members(tmp_path: Path) -> None:
    text = _trace(50).dumps()
    data = gzip.compress(text)
    second = gzip.compress(text[len(text) // 2 :])
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(text[: len(text) // 2]) + second[: len(second) - 20])  # the second member cut short
    with pytest.raises(TraceError, match=r"^cut\.json\.gz: truncated gzip stream after"):
        parse_columns(cut)
    junk = tmp_path / "junk.json.gz"
    junk.write_bytes(data + b"not gzip")
    with pytest.raises(TraceError, match=r"^junk\.json\.gz: trailing garbage after gzip stream"):
        parse_columns(junk)


# --------------------------------------------------------------------------
# Bounds


def _gzip_member_of_zeros(gib: int = 1) -> bytes:
    """One gzip member holding ``gib`` GiB of zero bytes, built in well
    under a second: deflate chunks ended by a full flush do not depend on
    what came before, so one 1 MiB chunk is compressed once and repeated."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = c.compress(b"\0" * MIB) + c.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    block = b"\0" * MIB
    for _ in range(gib * 1024):
        crc = zlib.crc32(block, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + chunk * (gib * 1024) + b"\x03\x00" + struct.pack("<II", crc, (gib << 30) & 0xFFFFFFFF)


def test_zero_member_builder_is_valid_gzip() -> None:
    member = _gzip_member_of_zeros(1)
    d = zlib.decompressobj(31)
    out = 0
    data = member
    while data:
        out += len(d.decompress(data, 64 * MIB))
        data = d.unconsumed_tail
    assert d.eof and out == 1 << 30


def _peak_rss_of_parse(path: Path, extra_env: dict | None = None) -> tuple[str, int, int]:
    """(error line, peak RSS in bytes, RSS before parsing) of parse_columns(path) in a fresh process."""
    code = (
        "import resource, sys\n"
        "from analyzer.ingest.parse import parse_columns\n"
        "from analyzer.errors import TraceError\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    parse_columns(sys.argv[1]); msg = 'parsed'\n"
        "except TraceError as e:\n"
        "    msg = str(e)\n"
        "print(msg); print(before * 1024); print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), **(extra_env or {})}
    out = subprocess.run([PY, "-c", code, str(path)], capture_output=True, text=True, env=env, timeout=120, check=True)
    assert out.stderr == ""
    msg, before, peak = out.stdout.splitlines()
    return msg, int(peak), int(before)


def test_3_gib_string_in_3_mb_is_skipped_with_bounded_memory(tmp_path: Path) -> None:
    """A 3 MB gzip holding one 3 GiB string (it passed 6 GB of RSS before):
    the longest-piece bound trips after 64 MiB of text, peak RSS stays
    within the documented bound (docs/loading.md: about 2 x --max-event-mb
    above the interpreter)."""
    chunk = gzip.compress(b"a" * (64 * MIB), compresslevel=9, mtime=0)
    path = tmp_path / "rank1.json.gz"
    with open(path, "wb") as f:
        # Members of one stream: gzip -dc gives one document with one 3 GiB string.
        f.write(gzip.compress(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "'))
        for _ in range(48):
            f.write(chunk)
        f.write(gzip.compress(b'", "ts": 1, "dur": 1}]}'))
    assert path.stat().st_size < 4 * MIB
    msg, peak, before = _peak_rss_of_parse(path)
    assert msg == (
        "rank1.json.gz: an element of traceEvents longer than 64 MiB (from line 1) (raise the bound with --max-event-mb)"
    )
    assert peak - before < 2 * ParseLimits().max_event_bytes + 16 * MIB, (peak, before)


def test_ten_1_gib_members_of_zeros_stop_at_the_first_block(tmp_path: Path) -> None:
    """Ten 1 GiB members of zeros took 1.22 GB and were called corrupt gzip:
    the text is not JSON, which the first block shows."""
    path = tmp_path / "zeros.json.gz"
    path.write_bytes(_gzip_member_of_zeros(1) * 10)
    msg, peak, before = _peak_rss_of_parse(path)
    assert msg == "zeros.json.gz: invalid JSON at line 1, column 1: invalid character"
    assert peak - before < 16 * MIB, (peak, before)


def test_gzip_ratio_bound_trips_while_streaming(tmp_path: Path) -> None:
    """Valid, endlessly repeated events: the decompressed-size bound stops
    the read at max(64 x compressed, floor) and names --max-gzip-ratio."""
    event = b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 5, "dur": 1},'
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = [c.compress(b'{"traceEvents": [')] + [c.compress(event * 10000) for _ in range(200)]
    body.append(c.compress(event[:-1] + b"]}") + c.flush())
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(b"".join(body))
    compressed = path.stat().st_size
    assert 200 * 10000 * len(event) > 64 * compressed > MIB  # the ratio, not the floor, binds here
    lim = ParseLimits(gzip_floor_bytes=MIB)
    seen = 0
    with pytest.raises(TraceError) as err:
        for block in read_blocks(path, limits=lim):
            seen += len(block)
    assert seen <= lim.max_decompressed(compressed)  # stopped at the bound, not at the end
    assert str(err.value).startswith(
        f"bomb.json.gz: decompresses to more than {lim.max_decompressed(compressed) / MIB:,.0f} MiB, the bound for "
        f"{compressed / 1e6:.1f} MB of gzip (64x, at least 1 MiB; a gzip bomb?)"
    )
    assert str(err.value).endswith("(raise the bound with --max-gzip-ratio)")
    # The same file with a higher ratio loads (and the floor keeps small traces safe).
    assert parse_columns(path, ParseLimits(max_gzip_ratio=10000)).rows == 200 * 10000 + 1


def test_small_well_compressed_trace_is_under_the_floor(tmp_path: Path) -> None:
    t = _trace(0)
    for i in range(5000):
        t.cpu_op("aten::add", i, 1, args={"Call stack": "train.py(12): step\n" * 50})
    path = t.write(tmp_path / "rank0.json.gz")
    text = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(text, compresslevel=9))
    assert len(text) > 64 * path.stat().st_size  # over the ratio, but under the 64 MiB floor
    assert parse_columns(path).rows == 5000 + 1


def test_json_size_ceiling_applies_to_plain_files(tmp_path: Path) -> None:
    path = _trace(500).write(tmp_path / "rank0.json", gz=False)
    with pytest.raises(
        TraceError, match=r"^rank0\.json: more than .* GiB of JSON \(raise the bound with --max-json-gb\)$"
    ):
        parse_columns(path, ParseLimits(max_json_bytes=4096))


def test_head_bound(tmp_path: Path) -> None:
    path = tmp_path / "head.json"
    path.write_bytes(b'{"junk": "' + b"x" * (3 * MIB) + b'", "traceEvents": []}')
    with pytest.raises(TraceError, match=r"more than 2 MiB of JSON before traceEvents .*--max-event-mb\)$"):
        parse_columns(path, ParseLimits(max_event_bytes=2 * MIB))


def test_bounds_reach_parse_workers_through_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's flags are applied with limits.apply (environment), so
    worker processes use them too."""
    folder = tmp_path / "run"
    big = _trace(50)
    big.cpu_op("aten::add", 5, 1, args={"Call stack": "x" * (3 * MIB)})
    big.write(folder / "rank0.json.gz")
    _trace(50, rank=1).write(folder / "rank1.json.gz")
    for var in (
        "TRAINPERF_MAX_EVENT_BYTES",
        "TRAINPERF_MAX_GZIP_RATIO",
        "TRAINPERF_MAX_JSON_BYTES",
        "TRAINPERF_GZIP_FLOOR_BYTES",
    ):
        monkeypatch.delenv(var, raising=False)
    assert limits_mod.current() == ParseLimits()
    limits = limits_mod.from_options(max_event_mb=1)
    for name, var in limits_mod._ENV.items():
        monkeypatch.setenv(var, repr(getattr(limits, name)))
    assert limits_mod.current().max_event_bytes == MIB
    ts = load_traces(folder, cache=False, workers=2)
    assert sorted(ts.ranks) == [1]
    assert [str(e) for e in ts.errors] == [
        "rank0.json.gz: an element of traceEvents longer than 1 MiB (from line 1726) (raise the bound with --max-event-mb)"
    ]


def test_cli_skips_the_bomb_and_reports_the_good_rank(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    _trace(100).write(folder / "rank0.json.gz")
    chunk = gzip.compress(b"a" * (64 * MIB), compresslevel=9, mtime=0)
    with open(folder / "rank1.json.gz", "wb") as f:
        f.write(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "'))
        for _ in range(48):
            f.write(chunk)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINPERF_")}
    out = subprocess.run(
        [PY, "-m", "analyzer.cli", "report", "--no-cache", str(folder)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    skipped = [line for line in out.stderr.splitlines() if "skipped:" in line]
    assert skipped == [
        "analyzer: skipped: rank1.json.gz: an element of traceEvents longer than 64 MiB (from line 1) "
        "(raise the bound with --max-event-mb)"
    ]
    assert "Warning" not in out.stderr and "Traceback" not in out.stderr
