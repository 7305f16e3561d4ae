"""Cache of parsed traces, so a second analysis skips the JSON.

Where: ``.analyzer-cache/`` in the folder of the trace when that folder is
writable, else ``$XDG_CACHE_HOME/trainperf`` (default ``~/.cache/trainperf``),
or a folder the caller names. One file per trace::

    <trace file name>.<path hash>.<key hash>.npz

The key hashes the trace's absolute path, its :func:`~analyzer.locate.file_key`
(size, mtime and ctime in ns, device, inode, and a BLAKE2 fingerprint of
its first and last MiB) and :data:`LOADER_VERSION`; any change gives a new
name, so a stale entry is never read (an edit in place with the mtime set
back, as ``touch -d`` or ``cp -p`` do, still moves the ctime and usually the
fingerprint), and writing a new entry deletes the older ones of that trace
(including entries of earlier formats). An entry that cannot be used
(truncated, not an npz, wrong content) raises :class:`CacheEntryError`; the
loader reports it as a warning, parses the trace again and rewrites it.

Contents: the parser's output (:class:`~analyzer.parse.ParsedTrace`), not
the events table built from it: its numeric columns as uncompressed
``.npy`` members and the rest (category and name strings, sparse columns,
process and thread names, document metadata) as one JSON member. Why not
the events table in Parquet, as before: writing that needed pandas and
Arrow, so it could only happen in the main process, after the parse, on
the critical path (90 ms with zstd for trace_diff/control, plus an Arrow
copy of the table at the memory peak). This entry is written by the parse
worker itself right after parsing, with numpy alone (17 ms, 5 MB for that
trace), and read back in 12 ms; building the events table from it is the
same code as after a parse (``load.rank_trace``), so a hit is identical to
a fresh parse by construction. Numbers are stored with ``allow_pickle``
off: an entry planted in a shared folder can hold data, never code.

This module imports neither numpy nor pandas at import time: the CLI
locates entries before forking the parse workers (analyzer/ingest/jobs.py).
"""

from __future__ import annotations

import glob
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from analyzer.errors import AnalyzerError
from analyzer.ingest.locate import CACHE_DIRNAME, file_key, usable_cache_dir, user_cache_dir

if TYPE_CHECKING:
    from analyzer.ingest.parse import ParsedTrace

# Bump when the parser changes what an entry holds (2: parser columns in npz;
# 3: categories in today's spelling, validated times, displayTimeUnit, notes;
# 4: concrete_inputs of convolution ops; 5: seq_num and fwd_tid of autograd ops; 6: [memory] events;
# 7: input shapes of aten::embedding; 8: shapes and concrete_inputs of attention's backend ops;
# 9: shapes of the memory-bound families, concrete_inputs of reductions, softmax and normalization;
# 10: baseTimeNanoseconds kept in the document's metadata; 11: the time unit decided from the events, the header a hint;
# 12: shapes and concrete_inputs of the FLOP table's backward, grouped-GEMM and backend ops;
# 13: wait_stream and record_corr of the cuda_sync events waiting on a recorded CUDA event).
LOADER_VERSION = 13
ENTRY_SUFFIX = ".npz"
# Suffixes of entries this and earlier versions wrote, removed when a trace's entry is rewritten.
_ENTRY_SUFFIXES = (".npz", ".parquet")
_META_MEMBER = "trainperf_meta"
_MEMORY_PREFIX = "memory_"  # members holding ParsedTrace.memory's columns
_INT_COLUMNS = ("pid", "tid", "stream", "ts_ns", "dur_ns", "correlation", "external_id", "seq_num", "fwd_tid")
_CODE_COLUMNS = ("cat", "name")


class CacheEntryError(AnalyzerError):
    """A cache entry exists but cannot be used; the trace is parsed again."""


def _usable_dir(folder: Path) -> bool:
    return usable_cache_dir(folder)


class TraceCache:
    """Locates, reads and writes cache entries.

    ``root`` None: beside each trace, falling back to :func:`user_cache_dir`
    for read-only trace folders. ``note`` holds a one-line warning when no
    writable place was found (loading then works uncached).
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = root
        self.note: str | None = None
        self._dirs: dict[Path, Path | None] = {}

    def _dir_for(self, trace_dir: Path) -> Path | None:
        if trace_dir in self._dirs:
            return self._dirs[trace_dir]
        candidates = [self.root] if self.root is not None else [trace_dir / CACHE_DIRNAME, user_cache_dir()]
        chosen = next((c for c in candidates if _usable_dir(c)), None)
        if chosen is None and self.note is None:
            self.note = (
                f"no writable cache folder ({', '.join(str(c) for c in candidates)}); traces are parsed every time"
            )
        self._dirs[trace_dir] = chosen
        return chosen

    def entry_for(self, trace: Path) -> Path | None:
        """The entry a trace's current version would have (it may not exist
        yet); None when the trace cannot be stat'ed or nothing is writable."""
        trace = Path(trace).absolute()
        try:
            identity = file_key(trace)
        except OSError:
            return None
        folder = self._dir_for(trace.parent)
        if folder is None:
            return None
        path_hash = hashlib.sha1(str(trace).encode()).hexdigest()[:10]
        key = orjson.dumps([str(trace), identity, LOADER_VERSION])
        key_hash = hashlib.sha1(key).hexdigest()[:16]
        return folder / f"{trace.name}.{path_hash}.{key_hash}{ENTRY_SUFFIX}"

    def read(self, entry: Path, trace: Path) -> ParsedTrace:
        """The cached parse of ``trace``; raises CacheEntryError."""
        return read_entry(entry, trace)


def parse_and_store(path: Path, entry: Path | None) -> ParsedTrace:
    """Parse ``path`` and write its cache entry (when ``entry`` is given).

    The body of a parse worker, and of an in-process parse: the entry is
    written from the parsed columns before the events table is built from
    them (which consumes them). A failed write becomes
    ``ParsedTrace.cache_warning``; a failed parse raises TraceError.
    """
    from analyzer.ingest.parse import parse_columns

    parsed = parse_columns(path)
    parsed.cache_warning = write_entry(entry, parsed)
    return parsed


def write_entry(entry: Path | None, parsed: ParsedTrace) -> str | None:
    """Write atomically (temporary file, then rename); return a one-line
    warning instead of raising when the folder turns out unwritable or full."""
    if entry is None:
        return None
    try:
        _write(entry, parsed)
    except OSError as exc:
        return f"{parsed.path.name}: could not write cache entry {entry} ({exc.strerror or exc})"
    except (ValueError, TypeError) as exc:  # a value JSON cannot hold (an integer over 64 bits, say)
        return f"{parsed.path.name}: could not write cache entry {entry} ({_short(exc)})"
    _remove_stale(entry)
    return None


def _write(entry: Path, parsed: ParsedTrace) -> None:
    import numpy as np

    meta = {
        "loader_version": LOADER_VERSION,
        "trace": str(Path(parsed.path).absolute()),
        "rows": parsed.rows,
        "cats": parsed.cats,
        "names": parsed.names,
        # JSON objects have text keys: rows, pids and (pid, tid) pairs go as lists.
        "sparse": {col: list(values.items()) for col, values in parsed.sparse.items()},
        "processes": list(parsed.processes.items()),
        "threads": [[pid, tid, name] for (pid, tid), name in parsed.threads.items()],
        "meta": parsed.meta,
        "seen_events": parsed.seen_events,
        "dropped_no_time": parsed.dropped_no_time,
        "json_bytes": parsed.json_bytes,
        "notes": parsed.notes,
    }
    members = {_META_MEMBER: np.frombuffer(orjson.dumps(meta), dtype=np.uint8)}
    members.update((c, parsed.columns[c]) for c in _CODE_COLUMNS + _INT_COLUMNS)
    members.update((_MEMORY_PREFIX + c, values) for c, values in parsed.memory.items())
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(
                f, allow_pickle=False, **members
            )  # uncompressed: zlib would cost 10x the write time for a 5 MB entry
        os.replace(tmp, entry)
    finally:
        if tmp.exists():
            tmp.unlink()


def _remove_stale(entry: Path) -> None:
    trace_name, path_hash, _key, _suffix = entry.name.rsplit(".", 3)
    for old in entry.parent.glob(f"{glob.escape(trace_name)}.{path_hash}.*"):
        if old != entry and old.suffix in _ENTRY_SUFFIXES and old.name.count(".") == entry.name.count("."):
            try:
                old.unlink()
            except OSError:
                pass  # another process removed it, or read-only: harmless


def read_entry(entry: Path, trace: Path) -> ParsedTrace:
    """The ParsedTrace stored in ``entry``; CacheEntryError when unusable."""
    import numpy as np

    from analyzer.ingest.parse import ParsedTrace
    from analyzer.ingest.parse.columns import MEMORY_FIELDS

    try:
        with np.load(entry, allow_pickle=False) as z:
            meta = orjson.loads(z[_META_MEMBER].tobytes())
            if not isinstance(meta, dict) or meta.get("loader_version") != LOADER_VERSION:
                raise ValueError(f"loader version {meta.get('loader_version') if isinstance(meta, dict) else '?'}")
            columns = {c: z[c] for c in _CODE_COLUMNS + _INT_COLUMNS}
            memory = {name[len(_MEMORY_PREFIX) :]: z[name] for name in z.files if name.startswith(_MEMORY_PREFIX)}
        if memory and (
            set(memory) != set(MEMORY_FIELDS)
            or len({v.shape for v in memory.values()}) != 1
            or any(v.dtype != np.int64 or v.ndim != 1 for v in memory.values())
        ):
            raise ValueError("memory columns of unequal length or type")
        rows = int(meta["rows"])
        cats, names = [str(c) for c in meta["cats"]], [str(n) for n in meta["names"]]
        for c, values in columns.items():
            want = np.int32 if c in _CODE_COLUMNS else np.int64
            if values.dtype != want or values.shape != (rows,):
                raise ValueError(f"column {c} is {values.dtype} {values.shape}, not {np.dtype(want)} ({rows},)")
        for c, labels in (("cat", cats), ("name", names)):
            if rows and (columns[c].min() < 0 or columns[c].max() >= len(labels)):
                raise ValueError(f"column {c} has codes outside its {len(labels)} labels")
        sparse = {str(col): {int(row): v for row, v in pairs} for col, pairs in meta["sparse"].items()}
        if any(not 0 <= row < rows for values in sparse.values() for row in values):
            raise ValueError("a sparse column names a row outside the table")
        parsed = ParsedTrace(
            path=Path(trace),
            columns=columns,
            cats=cats,
            names=names,
            sparse=sparse,
            processes={int(pid): dict(fields) for pid, fields in meta["processes"]},
            threads={(int(pid), int(tid)): str(name) for pid, tid, name in meta["threads"]},
            meta=dict(meta["meta"]),
            seen_events=int(meta["seen_events"]),
            dropped_no_time=int(meta["dropped_no_time"]),
            json_bytes=int(meta["json_bytes"]),
            notes=[str(n) for n in meta["notes"]],
            memory=memory,
        )
    except Exception as exc:  # noqa: BLE001 - any failure means "parse again"
        raise CacheEntryError(
            f"{Path(trace).name}: cache entry {entry.name} unreadable ({_short(exc)}); parsed again"
        ) from None
    return parsed


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:120]
