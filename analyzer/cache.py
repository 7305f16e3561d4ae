"""Parquet cache of parsed traces, so a second analysis skips the JSON.

Where: ``.analyzer-cache/`` in the folder of the trace when that folder is
writable, else ``$XDG_CACHE_HOME/trainperf`` (default ``~/.cache/trainperf``),
or a folder the caller names. One file per trace::

    <trace file name>.<path hash>.<key hash>.parquet

The key hashes the trace's absolute path, size, mtime (ns) and
:data:`LOADER_VERSION`; any change gives a new name, so a stale entry is
never read, and writing a new entry deletes the older ones of that trace.
An entry that cannot be read (truncated, not Parquet, wrong content) raises
:class:`CacheEntryError`; the loader reports it as a warning, parses the
trace again and rewrites the entry.

Contents: the events table without its ``rank`` column (the rank can depend
on the caller's hint, so it is resolved at read time), plus the rest of
:class:`~analyzer.tables.RankTrace` as JSON in the Parquet key-value
metadata under ``trainperf``.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from analyzer.errors import AnalyzerError
from analyzer.locate import CACHE_DIRNAME, usable_cache_dir, user_cache_dir  # noqa: F401 - part of this module's API
from analyzer.schema import COLUMNS, KINDS

if TYPE_CHECKING:
    from analyzer.tables import RankTrace

# Bump when the parser or the table schema changes what an entry holds.
LOADER_VERSION = 1
_META_KEY = b"trainperf"
_OBJECT_COLUMNS = [c for c, t in COLUMNS.items() if t == "object"]
_CATEGORY_COLUMNS = [c for c, t in COLUMNS.items() if t == "category"]


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
            self.note = f"no writable cache folder ({', '.join(str(c) for c in candidates)}); traces are parsed every time"
        self._dirs[trace_dir] = chosen
        return chosen

    def entry_for(self, trace: Path) -> Path | None:
        """The entry a trace's current version would have (it may not exist
        yet); None when the trace cannot be stat'ed or nothing is writable."""
        trace = Path(trace).absolute()
        try:
            st = trace.stat()
        except OSError:
            return None
        folder = self._dir_for(trace.parent)
        if folder is None:
            return None
        path_hash = hashlib.sha1(str(trace).encode()).hexdigest()[:10]
        key = f"{trace}|{st.st_size}|{st.st_mtime_ns}|{LOADER_VERSION}"
        key_hash = hashlib.sha1(key.encode()).hexdigest()[:16]
        return folder / f"{trace.name}.{path_hash}.{key_hash}.parquet"

    def read(self, entry: Path, trace: Path, rank: int | None = None) -> RankTrace:
        """The cached RankTrace of ``trace``; raises CacheEntryError."""
        return read_entry(entry, trace, rank)

    def write(self, entry: Path | None, rt: RankTrace) -> str | None:
        """Write atomically; return a one-line warning instead of raising
        when the folder turns out unwritable or full."""
        if entry is None:
            return None
        try:
            _write(entry, rt)
        except OSError as exc:
            return f"{rt.path.name}: could not write cache entry {entry} ({exc.strerror or exc})"
        except (ValueError, TypeError) as exc:  # Arrow could not convert a column
            return f"{rt.path.name}: could not write cache entry {entry} ({_short(exc)})"
        _remove_stale(entry)
        return None


def _arrow() -> tuple[Any, Any]:
    """``pyarrow`` and ``pyarrow.parquet``, Arrow allocating with the system allocator.

    Arrow's default, mimalloc, keeps freed pages for reuse even after
    ``release_unused()``: reading trace_diff/control's entry left the process
    51 MB larger with mimalloc and 29 MB with the system allocator (peak 163
    vs 140 MB), which decides whether a report stays under half of HTA's
    memory. A user's own ``ARROW_DEFAULT_MEMORY_POOL`` is left alone.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    global _POOL_CHOSEN
    if not _POOL_CHOSEN:
        _POOL_CHOSEN = True
        if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
            pa.set_memory_pool(pa.system_memory_pool())
    return pa, pq


_POOL_CHOSEN = False


def _write(entry: Path, rt: RankTrace) -> None:
    import numpy as np

    pa, pq = _arrow()

    events = rt.events.drop(columns=["rank"])
    table = pa.Table.from_pandas(events, preserve_index=False)
    meta = {
        "loader_version": LOADER_VERSION,
        "trace": str(Path(rt.path).absolute()),
        "rank": rt.rank,
        "rank_source": rt.rank_source,
        "distributed_info": rt.distributed_info,
        "device_properties": rt.device_properties,
        "has_device": rt.has_device,
        "steps": rt.steps[["step", "start_ns", "end_ns"]].to_numpy(np.int64).tolist(),
        "processes": rt.processes.to_dict("list"),
        "threads": rt.threads.to_dict("list"),
        "json_bytes": rt.json_bytes,
        "notes": rt.notes,
        "rows": len(events),
    }
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), _META_KEY: orjson.dumps(meta)})
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
    try:
        # Dictionary-encode only the categoricals: trying it on every int64
        # column costs ~30 MB of peak memory for nothing (timestamps and ids
        # are nearly unique).
        pq.write_table(
            table, tmp, compression="zstd", use_dictionary=[c for c in _CATEGORY_COLUMNS if c in events.columns],
            row_group_size=1 << 16,
        )
        os.replace(tmp, entry)
    finally:
        if tmp.exists():
            tmp.unlink()
        del table
        # Arrow's allocator keeps freed buffers for reuse; hand them back
        # (tens of MB per entry otherwise stay resident).
        pa.default_memory_pool().release_unused()


def _remove_stale(entry: Path) -> None:
    stem = entry.name.rsplit(".", 2)[0]  # "<name>.<path hash>"
    for old in entry.parent.glob(f"{stem}.*.parquet"):
        if old != entry and old.name.count(".") == entry.name.count("."):
            try:
                old.unlink()
            except OSError:
                pass  # another process removed it, or read-only: harmless


def read_entry(entry: Path, trace: Path, rank: int | None = None) -> RankTrace:
    """Rebuild a RankTrace from an entry; CacheEntryError when unusable."""
    # numpy, pandas and Arrow are imported here, not at the top: locating
    # entries (entry_for) runs before they are loaded (analyzer/jobs.py says why).
    import numpy as np
    import pandas as pd

    pa, pq = _arrow()

    from analyzer.tables import RankTrace, empty_processes, empty_steps, empty_threads

    try:
        table = pq.read_table(entry)
        raw = (table.schema.metadata or {}).get(_META_KEY)
        if raw is None:
            raise ValueError("no trainperf metadata")
        meta = orjson.loads(raw)
        if meta.get("loader_version") != LOADER_VERSION:
            raise ValueError(f"loader version {meta.get('loader_version')}")
        # self_destruct frees each Arrow column once converted: the peak
        # holds one copy of the table, not two.
        events = table.to_pandas(self_destruct=True, split_blocks=True)
        del table
        pa.default_memory_pool().release_unused()
        if len(events) != meta["rows"] or list(events.columns) != [c for c in COLUMNS if c != "rank"]:
            raise ValueError("columns or row count differ from the schema")
    except Exception as exc:  # noqa: BLE001 - any failure means "parse again"
        raise CacheEntryError(f"{Path(trace).name}: cache entry {entry.name} unreadable ({_short(exc)}); parsed again") from None
    source = meta["rank_source"]
    if source in ("distributedInfo", "filename"):
        resolved = int(meta["rank"])
    elif rank is not None:
        resolved, source = int(rank), "argument"
    else:
        resolved, source = 0, "default"
    events.insert(0, "rank", np.full(len(events), resolved, dtype=np.int32))
    for col in _OBJECT_COLUMNS:
        # Parquet gives pandas' str dtype with NaN; the schema says object/None.
        values = events[col].to_numpy(dtype=object, na_value=None)
        events[col] = pd.Series(values, dtype=object)
    for col in _CATEGORY_COLUMNS:
        # Parquet returns empty categories as object; the loader writes str.
        cats = events[col].cat.categories
        if cats.dtype != "str":
            events[col] = pd.Categorical.from_codes(events[col].cat.codes, categories=pd.Index(cats, dtype="str"))
    events["kind"] = events["kind"].cat.set_categories(list(KINDS))
    steps = empty_steps()
    if meta["steps"]:
        arr = np.array(meta["steps"], dtype=np.int64)
        steps = pd.DataFrame({"step": arr[:, 0], "start_ns": arr[:, 1], "end_ns": arr[:, 2]})
    processes = empty_processes()
    if meta["processes"].get("pid"):
        processes = pd.DataFrame(
            {
                "pid": np.array(meta["processes"]["pid"], dtype=np.int64),
                "name": pd.Series(meta["processes"]["name"], dtype=object),
                "labels": pd.Series(meta["processes"]["labels"], dtype=object),
            }
        )
    threads = empty_threads()
    if meta["threads"].get("pid"):
        threads = pd.DataFrame(
            {
                "pid": np.array(meta["threads"]["pid"], dtype=np.int64),
                "tid": np.array(meta["threads"]["tid"], dtype=np.int64),
                "name": pd.Series(meta["threads"]["name"], dtype=object),
            }
        )
    return RankTrace(
        rank=resolved,
        path=Path(trace),
        events=events,
        steps=steps,
        distributed_info=meta["distributed_info"],
        device_properties=meta["device_properties"],
        has_device=bool(meta["has_device"]),
        rank_source=source,
        processes=processes,
        threads=threads,
        json_bytes=int(meta["json_bytes"]),
        notes=list(meta["notes"]),
    )


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:120]
