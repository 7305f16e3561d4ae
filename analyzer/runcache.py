"""Finished analyses, kept beside the rank summaries: an unchanged run opens without its reduce.

From rank summaries (:mod:`analyzer.rankcache`) an analysis reads no
trace, but it still decodes every rank's summary (a dozen small tables a
rank) and runs the reduce across ranks: about 20 s for 1,024 ranks on 2
cores, which a dashboard page would wait for after every server restart.
So :func:`analyzer.api.analyze` also keeps its finished
:class:`~analyzer.api.RunAnalysis` (a few run-level tables instead of
1,024 x 12 small ones) and answers from it while nothing it was computed
from has changed. docs/loading.md, "Finished analyses", has the figures.

The key (any change gives a new name, so a stale entry is never read):

* the inputs: each trace file's parse-cache entry name (its absolute path,
  :func:`~analyzer.ingest.locate.file_key` and the loader's version), and
  for a reftrain run directory the ``file_key`` of every other file in it
  (manifest, metrics, collectives, telemetry; hidden folders left out);
* the rank summaries: name, size, mtime and inode of every ``.rank`` file in
  the cache folders of those traces (a summary rewritten, corrupted or
  removed is a miss, and the analysis reads the summaries again, with their
  warnings);
* the code: size, mtime, ctime and inode of the analyzer's ``.py`` files,
  the Python version, :data:`RUN_CACHE_VERSION` and
  :data:`~analyzer.rankmap.MAP_VERSION`;
* the options that change the result (``peak_flops``, ``critical_path``).

An analysis is stored only when it has no errors and no rank summary was
written while it ran (the summaries it was keyed on are the ones it read),
so a run is stored on its second cached analysis and read from the third.
Where: the cache folder of the first trace's parse entries, as
``analysis.<paths hash>.<key hash>.run``; a new entry deletes the older
ones of the same input; a store that fails is one line in the analysis'
``warnings``. Format: :mod:`analyzer.rankcache`'s (a magic line,
a JSON tree, one binary blob; no pickle), with the analyzer's own
dataclasses that the analysis holds named in the entry and rebuilt only
when they are analyzer dataclasses of this process. ``RunAnalysis.derived``
(values computed on first use) is not stored. An entry that cannot be read
is ignored and rewritten by the next analysis that may store one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from analyzer import rankcache
from analyzer.ingest.cache import TraceCache
from analyzer.ingest.locate import file_key, is_run_dir, run_trace_files
from analyzer.rankmap import MAP_VERSION

RUN_CACHE_VERSION = 1
SUFFIX = ".run"
_MAGIC = b"trainperf run analysis\n"


@dataclass(frozen=True)
class RunKey:
    """Where the analysis of some inputs is (or would be) stored, and the summaries it was keyed on."""

    entry: Path
    folders: tuple[Path, ...]
    summaries: tuple[tuple[str, int, int, int], ...]


def key_for(paths: list[Path], peak_flops: float | None, critical_path: bool = False) -> RunKey | None:
    """The key of analyzing ``paths`` (as :func:`analyzer.api.analyze` takes them, with or without the critical paths) now;
    None when some input cannot be read or has no cache entry (nothing to key on)."""
    from analyzer.ingest.load import expand_paths

    store = TraceCache()
    others: list[list[Any]] = []
    try:
        if len(paths) == 1 and is_run_dir(paths[0]):
            root = paths[0].absolute()
            traces = run_trace_files(root)
            listed = set(traces)
            for folder, dirs, files in os.walk(root):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(files):
                    f = Path(folder) / name
                    if f.absolute() not in listed:
                        others.append([str(f.relative_to(root)), *file_key(f)])
        else:
            traces, skipped = expand_paths(paths if len(paths) > 1 else paths[0])
            if skipped:
                return None  # an analysis with errors is never stored
        entries = [store.entry_for(f) for f in traces]
    except OSError:
        return None
    if not entries or any(e is None for e in entries):
        return None
    folders = tuple(sorted({e.parent for e in entries if e is not None}))
    summaries = _summaries(folders)
    key = orjson.dumps(
        {
            "version": [RUN_CACHE_VERSION, MAP_VERSION],
            "python": sys.version,
            "code": _code_fingerprint(),
            "traces": [e.name for e in entries if e is not None],
            "others": others,
            "summaries": summaries,
            "peak_flops": peak_flops,
            "critical_path": critical_path,
        },
        option=orjson.OPT_SORT_KEYS,
    )
    paths_hash = hashlib.sha1(orjson.dumps([str(p.absolute()) for p in paths])).hexdigest()[:10]
    key_hash = hashlib.sha1(key).hexdigest()[:16]
    return RunKey(folders[0] / f"analysis.{paths_hash}.{key_hash}{SUFFIX}", folders, summaries)


def _summaries(folders: tuple[Path, ...]) -> tuple[tuple[str, int, int, int], ...]:
    out = []
    for folder in folders:
        try:
            with os.scandir(folder) as it:
                for e in it:
                    if e.name.endswith(rankcache.SUFFIX):
                        st = e.stat()
                        out.append((f"{folder.name}/{e.name}", st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            continue
    return tuple(sorted(out))


_code: list[list[Any]] | None = None


def _code_fingerprint() -> list[list[Any]]:
    """Stat of every .py file of the analyzer package (as the report cache keys on its code)."""
    global _code
    if _code is None:
        here = Path(__file__).resolve().parent
        found: list[list[Any]] = []
        for folder, dirs, files in os.walk(here):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    st = os.stat(Path(folder) / name)
                    found.append(
                        [
                            str((Path(folder) / name).relative_to(here)),
                            st.st_size,
                            st.st_mtime_ns,
                            st.st_ctime_ns,
                            st.st_ino,
                        ]
                    )
        _code = found
    return _code


@dataclass
class FrameDict:
    """A ``dict[int, DataFrame]`` field stored as one table (``RunAnalysis.rank_collectives``:
    1,024 small tables a run): ``keys`` and ``lengths`` in order, ``frame`` their rows
    concatenated. Decoding 2,048 small tables costs about 1 s; slicing one, a tenth of it."""

    keys: np.ndarray
    lengths: np.ndarray
    frame: pd.DataFrame


def _packable(d: Any) -> bool:
    """A dict of int -> DataFrame whose tables concatenate without changing a dtype."""
    if (
        not isinstance(d, dict)
        or len(d) < 2
        or not all(isinstance(k, int) and isinstance(v, pd.DataFrame) for k, v in d.items())
    ):
        return False
    first = next(iter(d.values()))
    if any(isinstance(t, pd.CategoricalDtype) for t in first.dtypes):
        return False
    return all(
        type(v.index) is pd.RangeIndex
        and v.index.start == 0
        and v.index.step == 1
        and v.columns.equals(first.columns)
        and v.dtypes.equals(first.dtypes)
        for v in d.values()
    )


def _pack(ra: Any) -> Any:
    changes = {}
    for f in dataclasses.fields(ra):
        value = getattr(ra, f.name)
        if _packable(value):
            changes[f.name] = FrameDict(
                np.array(list(value), dtype=np.int64),
                np.array([len(v) for v in value.values()], dtype=np.int64),
                pd.concat(list(value.values()), ignore_index=True),
            )
    return dataclasses.replace(ra, **changes)


def _unpack(ra: Any) -> None:
    for f in dataclasses.fields(ra):
        value = getattr(ra, f.name)
        if isinstance(value, FrameDict):
            ends = np.cumsum(value.lengths)
            starts = ends - value.lengths
            setattr(
                ra,
                f.name,
                {int(k): value.frame.iloc[a:b].reset_index(drop=True) for k, a, b in zip(value.keys, starts, ends)},
            )


def read(key: RunKey, path: Any) -> Any | None:
    """The stored analysis for ``key`` (its ``path`` set to ``path``), or None (absent or unusable)."""
    try:
        data = bytearray(key.entry.read_bytes())
    except OSError:
        return None
    try:
        if data[: len(_MAGIC)] != _MAGIC:
            return None
        start = len(_MAGIC) + 8
        meta_len = int.from_bytes(data[len(_MAGIC) : start], "little")
        meta = orjson.loads(bytes(data[start : start + meta_len]))
        blob = memoryview(data)[start + meta_len :]
        arrays = [rankcache._array_at(blob, *spec) for spec in meta["arrays"]]
        classes = _resolve(meta["classes"])
        if classes is None:
            return None
        with rankcache.more_classes({**classes, "FrameDict": FrameDict}):
            ra = rankcache.decode(meta["result"], arrays)
        # By name: this module sits below analyzer.api (pyproject.toml, the layers contract).
        if type(ra).__name__ != "RunAnalysis" or type(ra).__module__ != "analyzer.api":
            return None
        _unpack(ra)
    except Exception:  # noqa: BLE001 - any failure means "analyze again"; the next store rewrites it
        return None
    ra.path = path
    ra.derived = {}
    return ra


def _resolve(names: list[list[str]]) -> dict[str, type] | None:
    """The named classes, only when each is an analyzer dataclass already imported here (no import, no code)."""
    out: dict[str, type] = {}
    for module, name in names:
        cls = getattr(sys.modules.get(module), name, None) if module.startswith("analyzer.") else None
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            return None
        out[name] = cls
    return out


def _classes_of(x: Any, found: dict[str, type]) -> None:
    """Every analyzer dataclass reachable from ``x`` through dataclass fields, lists, tuples and dicts."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        t = type(x)
        if t.__module__.startswith("analyzer.") and t.__name__ not in found:
            found[t.__name__] = t
        for f in dataclasses.fields(x):
            _classes_of(getattr(x, f.name), found)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _classes_of(v, found)
    elif isinstance(x, dict):
        for v in x.values():
            _classes_of(v, found)


def write(key: RunKey, ra: Any) -> str | None:
    """Store ``ra`` under ``key`` when it may be (no errors, the summaries unchanged since
    the key was made). A store that fails costs only the next analysis its shortcut, and
    is one warning line (as a rank summary's), so a value the format cannot hold is seen."""
    if ra.errors or _summaries(key.folders) != key.summaries:
        return None
    stored = _pack(dataclasses.replace(ra, derived={}))
    found: dict[str, type] = {}
    _classes_of(stored, found)
    found.pop(FrameDict.__name__, None)  # this module's own; always known to read()
    arrays: list[np.ndarray] = []
    try:
        if len({c.__name__ for c in found.values()}) != len(found):
            raise TypeError("two of its dataclasses share a name")
        with rankcache.more_classes({**found, "FrameDict": FrameDict}):
            tree = rankcache.encode(stored, arrays)
    except (TypeError, ValueError) as exc:
        return f"{key.entry.name}: could not store the finished analysis ({str(exc)[:120]})"
    specs, offset = [], 0
    for a in arrays:
        specs.append([a.dtype.str, list(a.shape), offset, a.nbytes])
        offset += a.nbytes
    meta = orjson.dumps(
        {"arrays": specs, "classes": [[c.__module__, c.__name__] for c in found.values()], "result": tree}
    )
    tmp = key.entry.with_name(f".{key.entry.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(_MAGIC + len(meta).to_bytes(8, "little") + meta)
            for a in arrays:
                f.write(a.tobytes())
        os.replace(tmp, key.entry)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        return f"{key.entry.name}: could not store the finished analysis ({exc.strerror or exc})"
    prefix = key.entry.name.rsplit(".", 2)[0]  # analysis.<paths hash>
    for old in key.entry.parent.glob(f"{prefix}.*{SUFFIX}"):
        if old != key.entry:
            old.unlink(missing_ok=True)
    return None
