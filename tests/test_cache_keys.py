"""Caches that cannot go stale.

The hazard: a cache keyed on path, size and mtime alone replays the old
numbers with no warning for a trace edited in place with its size kept and
its mtime set back (``touch -d``, ``cp -p``, a restore). Each test here makes
exactly that edit, restores the mtime to the nanosecond with ``os.utime``,
and requires the new numbers.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from synth import KinetoTrace

from analyzer import cli

from analyzer.ingest import locate
from analyzer.ingest.load import load_traces


def _trace(sgemm_us: int) -> bytes:
    """One rank, 3 steps of 1000 us, an sgemm of ``sgemm_us`` (3 digits: the size never changes)."""
    assert 100 <= sgemm_us <= 999
    t = KinetoTrace(rank=0, world_size=1)
    for i in range(3):
        t.step(i, i * 1000, 1000)
        t.kernel("sgemm", i * 1000 + 100, sgemm_us)
    return t.dumps()


def _edit_keeping_size_and_mtime(path: Path, content: bytes) -> None:
    before = path.stat()
    assert len(content) == before.st_size
    with open(path, "r+b") as f:  # in place: same inode
        f.write(content)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)


def _sgemm_total_us(folder: Path, cache: Path) -> float:
    events = load_traces(folder, cache=cache).ranks[0].events
    k = events[events["name"] == "sgemm"]
    return float((k["end_ns"] - k["start_ns"]).sum()) / 1000


def test_parse_cache_misses_an_in_place_edit_with_the_mtime_restored(tmp_path: Path) -> None:
    folder, cache = tmp_path / "traces", tmp_path / "cache"
    folder.mkdir()
    trace = folder / "rank0.json"
    trace.write_bytes(_trace(200))
    assert _sgemm_total_us(folder, cache) == 600.0
    assert _sgemm_total_us(folder, cache) == 600.0  # a hit: same numbers
    assert len(list(cache.glob("rank0.json.*.npz"))) == 1
    _edit_keeping_size_and_mtime(trace, _trace(500))
    assert _sgemm_total_us(folder, cache) == 1500.0  # a cache keyed on mtime would replay 600.0
    assert len(list(cache.glob("rank0.json.*.npz"))) == 1  # the stale entry was replaced, not kept


def test_report_cache_misses_an_in_place_edit_with_the_mtime_restored(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    trace = folder / "rank0.json"
    trace.write_bytes(_trace(200))
    out = tmp_path / "report.json"

    def report(*extra: str) -> dict:
        assert cli.main(["report", str(folder), "--json", str(out), "--peak-flops", "1e12", *extra]) == 0
        capsys.readouterr()
        doc = json.loads(out.read_text())
        doc["generator"].pop("created_at", None)
        return doc

    before = report()
    assert report() == before  # replayed from the report cache
    assert list((folder / locate.CACHE_DIRNAME).glob("report.*.json"))
    _edit_keeping_size_and_mtime(trace, _trace(500))
    after = report()
    assert after != before  # a cache keyed on mtime would replay `before`
    assert after == report("--no-cache")  # and it is what a fresh analysis gives


def test_fingerprint_sees_the_content_at_both_ends(tmp_path: Path) -> None:
    """Where the ctime is coarse or an inode is reused, the fingerprint still
    sees an edit within the first or last MiB (the middle of a big file is
    left to size, mtime, ctime and inode: docs/loading.md)."""
    edge = locate.FINGERPRINT_EDGE_BYTES
    path = tmp_path / "big.json"
    data = bytearray(b"a" * (3 * edge))
    path.write_bytes(data)
    base = locate.content_fingerprint(path)
    for at in (0, edge - 1, len(data) - edge, len(data) - 1):
        edited = bytearray(data)
        edited[at] = ord("b")
        path.write_bytes(edited)
        assert locate.content_fingerprint(path) != base, at
    edited = bytearray(data)
    edited[edge + 10] = ord("b")  # the middle: not read, by design
    path.write_bytes(edited)
    assert locate.content_fingerprint(path) == base
    small = tmp_path / "small.json"
    small.write_bytes(b"x" * 100)
    one = locate.content_fingerprint(small)
    small.write_bytes(b"x" * 99 + b"y")
    assert locate.content_fingerprint(small) != one  # a small file is hashed whole


def test_file_key_fields(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    path.write_bytes(b"{}")
    st = path.stat()
    size, mtime_ns, ctime_ns, dev, ino, fingerprint = locate.file_key(path)
    assert (size, mtime_ns, ctime_ns, dev, ino) == (2, st.st_mtime_ns, st.st_ctime_ns, st.st_dev, st.st_ino)
    assert fingerprint == locate.content_fingerprint(path)
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    assert locate.file_key(fifo)[-1] == ""  # a FIFO is stat'ed, never opened (that would block)
