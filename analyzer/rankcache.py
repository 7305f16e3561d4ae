"""Cache of rank summaries: a second analysis of unchanged traces skips the per-rank map.

The map (:func:`analyzer.rankmap.map_unit`) turns one rank's trace files
into a :class:`~analyzer.rankmap.UnitResult`: per file its facts, and the
rank's :class:`~analyzer.rankmap.RankPart`. Even from parse-cache hits that
costs building the events table and every per-rank metric, 30-60 ms a rank
on 2 cores (half a minute for 1,024 ranks); reading a stored summary costs a
few ms. So ``report``, ``compare``, ``check``, ``suggest`` and the dashboard
open a many-rank run from summaries without reading its traces.

Where: beside the parse cache entries of the unit's files (the same folder,
:class:`analyzer.ingest.cache.TraceCache`), one file per unit::

    <first trace file name>.<paths hash>.<key hash>.rank

The key hashes the unit's parse-cache entry names, in order (each already
names its file's absolute path, identity and content fingerprint, and
:data:`~analyzer.ingest.cache.LOADER_VERSION`: docs/loading.md, "Cache"),
and :data:`~analyzer.rankmap.MAP_VERSION`, the files of a
``capture_traces/`` folder beside a trace (:mod:`analyzer.ingest.graph_capture`),
and whether the summary holds the critical paths
(:attr:`~analyzer.rankmap.MapUnit.critical_path`); any change to a file, to the
parser or to what the map computes gives a new name, and writing a new
summary deletes the older ones of the same files. A summary without critical
paths never answers a unit that asks for them; one with them answers both
(:func:`analyzer.execute.read_summaries` drops the paths for a unit that did
not ask), so the later analyses of a run whose paths were asked for once
stay hits. Only units whose every
file loaded are stored (a bad file is read again, and reported again).

Format: no pickle (an entry planted in a shared folder may hold data, never
code). The summary is walked by :func:`encode` into a JSON tree in which
numeric numpy arrays (and DataFrame columns) are references into one
binary blob (dtype, shape, offset, size: no object dtypes), and only the
dataclasses named in :data:`_CLASSES` can be rebuilt. The file is a magic
line, the JSON's length (8 bytes, little-endian), the JSON, the blob:
an npz would cost a header parse per array (40 arrays a rank, 3.8 s for
1,024 ranks against 0.3 s). :func:`decode` is its exact inverse
(dtypes, categoricals, index and non-finite floats kept), so a summary hit
gives the same report as a fresh map (tests/test_rankcache.py compares
whole reports). An entry that cannot be used is a warning; the unit is
mapped again and the entry rewritten.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import glob
import hashlib
import math
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import orjson
import pandas as pd

from analyzer.ingest.load import FileFacts
from analyzer.metrics.attribution import AttributionTables
from analyzer.metrics.breakdown import BreakdownPieces
from analyzer.metrics.idle import IdleTables, LaunchSummary, PageableCopies, SyncPoints
from analyzer.metrics.critical_summary import StepCriticalPath
from analyzer.metrics.memory import RankMemory
from analyzer.metrics.mfu import RankFlops
from analyzer.metrics.overlap import OverlapResult
from analyzer.metrics.timeline import TimelineGrid
from analyzer.ingest.locate import capture_fingerprint
from analyzer.rankmap import MAP_VERSION, MapUnit, RankPart, UnitResult

SUFFIX = ".rank"
_MAGIC = b"trainperf rank summary\n"
# The only classes an entry can rebuild (by name); anything else in a summary is a bug of ours, found at write.
_CLASSES: dict[str, type] = {
    c.__name__: c
    for c in (
        UnitResult,
        RankPart,
        FileFacts,
        BreakdownPieces,
        OverlapResult,
        RankFlops,
        AttributionTables,
        RankMemory,
        TimelineGrid,
        IdleTables,
        LaunchSummary,
        PageableCopies,
        SyncPoints,
        StepCriticalPath,
    )
}


# Classes another store of this format (analyzer/runcache.py) may rebuild too, while it encodes or decodes.
_EXTRA_CLASSES: contextvars.ContextVar[dict[str, type]] = contextvars.ContextVar("summary_extra_classes", default={})


def _class(name: str) -> type | None:
    return _CLASSES.get(name) or _EXTRA_CLASSES.get().get(name)


@contextlib.contextmanager
def more_classes(classes: dict[str, type]) -> Iterator[None]:
    """Let :func:`encode` and :func:`decode` handle these dataclasses too (by name), inside the block."""
    token = _EXTRA_CLASSES.set({**_EXTRA_CLASSES.get(), **classes})
    try:
        yield
    finally:
        _EXTRA_CLASSES.reset(token)


class SummaryEntryError(Exception):
    """A stored summary cannot be used (the unit is mapped again)."""


# ---------------------------------------------------------------------------
# Where


def entry_for(unit: MapUnit) -> Path | None:
    """The summary a unit's current files would have; None when any file has no parse-cache entry name."""
    entries = [f.entry for f in unit.files if f.entry is not None]
    if not entries or len(entries) != len(unit.files):
        return None
    first = unit.files[0]
    paths_hash = hashlib.sha1(orjson.dumps([str(f.path.absolute()) for f in unit.files])).hexdigest()[:10]
    # Capture traces beside a trace change its events (graph replays mapped to captured ops): part of the key.
    captures = [capture_fingerprint(f.path.parent) for f in unit.files]
    key = [[e.name for e in entries], MAP_VERSION, captures, unit.critical_path]
    key_hash = hashlib.sha1(orjson.dumps(key)).hexdigest()[:16]
    return entries[0].parent / f"{first.path.name}.{paths_hash}.{key_hash}{SUFFIX}"


def storable(result: UnitResult) -> bool:
    """Whether a map result may be stored: every file loaded and the rank has its part."""
    return result.part is not None and all(isinstance(facts, FileFacts) for _, facts, _ in result.outcomes)


# ---------------------------------------------------------------------------
# Read and write


def read(entry: Path, unit: MapUnit) -> UnitResult:
    """The stored result of ``unit``, its file paths the unit's own; SummaryEntryError when unusable."""
    try:
        data = bytearray(entry.read_bytes())  # mutable: the arrays below are views of it and must be writable
        if data[: len(_MAGIC)] != _MAGIC:
            raise ValueError("not a rank summary")
        start = len(_MAGIC) + 8
        meta_len = int.from_bytes(data[len(_MAGIC) : start], "little")
        meta = orjson.loads(bytes(data[start : start + meta_len]))
        if not isinstance(meta, dict) or meta.get("map_version") != MAP_VERSION:
            raise ValueError("another map version")
        blob = memoryview(data)[start + meta_len :]
        arrays = [_array_at(blob, *spec) for spec in meta["arrays"]]
        result = decode(meta["result"], arrays)
        if not isinstance(result, UnitResult) or len(result.outcomes) != len(unit.files):
            raise ValueError("not a summary of these files")
        stored = [facts for _, facts, _ in result.outcomes if isinstance(facts, FileFacts)]
        if len(stored) != len(unit.files):  # only storable() results are written
            raise ValueError("a summary with a failed file")
    except Exception as exc:  # noqa: BLE001 - any failure means "map again"
        raise SummaryEntryError(
            f"{unit.files[0].path.name}: rank summary {entry.name} unreadable ({_short(exc)}); summarized again"
        ) from None
    # Paths as this analysis names them (the entry may have been written from another working directory).
    result.outcomes = [
        (f.path, dataclasses.replace(facts, path=f.path), list(warnings))
        for f, facts, (_, _, warnings) in zip(unit.files, stored, result.outcomes)
    ]
    return result


def _array_at(blob: memoryview, dtype: str, shape: list[int], offset: int, nbytes: int) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.hasobject or offset < 0 or offset + nbytes > len(blob) or nbytes != dt.itemsize * math.prod(shape):
        raise ValueError("an array outside the entry")
    return np.frombuffer(blob, dtype=dt, count=math.prod(shape), offset=offset).reshape(shape)


def write(entry: Path, result: UnitResult) -> str | None:
    """Store ``result`` atomically; a one-line warning instead of raising when that fails."""
    arrays: list[np.ndarray] = []
    try:
        tree = encode(result, arrays)
        specs, offset = [], 0
        for a in arrays:
            specs.append([a.dtype.str, list(a.shape), offset, a.nbytes])
            offset += a.nbytes
        meta = orjson.dumps({"map_version": MAP_VERSION, "arrays": specs, "result": tree})
        tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(_MAGIC + len(meta).to_bytes(8, "little") + meta)
                for a in arrays:
                    f.write(a.tobytes())
            os.replace(tmp, entry)
        finally:
            if tmp.exists():
                tmp.unlink()
    except OSError as exc:
        return f"{entry.name}: could not write rank summary ({exc.strerror or exc})"
    except (TypeError, ValueError) as exc:
        return f"{entry.name}: could not write rank summary ({_short(exc)})"
    _remove_stale(entry)
    return None


def _remove_stale(entry: Path) -> None:
    stem = entry.name[: -len(SUFFIX)]
    first, paths_hash, _key = stem.rsplit(".", 2)
    for old in entry.parent.glob(f"{glob.escape(first)}.{paths_hash}.*{SUFFIX}"):
        if old != entry:
            try:
                old.unlink()
            except OSError:
                pass  # removed by another process, or read-only: harmless


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:120]


# ---------------------------------------------------------------------------
# The codec: a JSON tree with array references, and its inverse


def encode(x: Any, arrays: list[np.ndarray]) -> Any:
    """``x`` as a JSON-able tree; numeric arrays are appended to ``arrays`` and referenced by index.

    Every value keeps its type through :func:`decode`: tagged objects
    (``{"$": tag, ...}``) for everything JSON does not hold exactly.
    Raises TypeError for a value it does not know (a class outside
    :data:`_CLASSES`, an object array of unknown values).
    """
    t = type(x)
    if x is None or t in (bool, int, str):
        return x
    if t is float:
        return x if math.isfinite(x) else {"$": "float", "v": repr(x)}
    if isinstance(x, np.generic):
        return {"$": "np", "dtype": x.dtype.str, "v": encode(x.item(), arrays)}
    if t is list:
        return [encode(v, arrays) for v in x]
    if t is tuple:
        return {"$": "tuple", "v": [encode(v, arrays) for v in x]}
    if t is dict:
        return {"$": "dict", "v": [[encode(k, arrays), encode(v, arrays)] for k, v in x.items()]}
    if isinstance(x, Path):
        return {"$": "path", "v": str(x)}
    if x is pd.NA:
        return {"$": "NA"}
    if t is np.ndarray:
        return _encode_array(x, arrays)
    if t is pd.DataFrame:
        return {
            "$": "frame",
            "columns": _encode_index(x.columns, arrays),
            "index": _encode_index(x.index, arrays),
            "data": [_encode_column(x.iloc[:, i], arrays) for i in range(x.shape[1])],
        }
    if dataclasses.is_dataclass(x) and _class(t.__name__) is t:
        return {
            "$": "dc",
            "cls": t.__name__,
            "v": {f.name: encode(getattr(x, f.name), arrays) for f in dataclasses.fields(x)},
        }
    raise TypeError(f"a rank summary cannot hold a {t.__module__}.{t.__qualname__}")


def _encode_array(a: np.ndarray, arrays: list[np.ndarray]) -> dict:
    if a.dtype.kind in "biufcmM":
        arrays.append(np.ascontiguousarray(a))
        return {"$": "array", "ref": len(arrays) - 1}
    if a.dtype.kind == "O":
        return {"$": "objarray", "shape": list(a.shape), "v": [encode(v, arrays) for v in a.ravel().tolist()]}
    raise TypeError(f"a rank summary cannot hold an array of {a.dtype}")


def _encode_index(index: pd.Index, arrays: list[np.ndarray]) -> dict:
    if type(index) is pd.RangeIndex:
        return {"$": "range", "v": [index.start, index.stop, index.step], "name": encode(index.name, arrays)}
    return {"$": "index", "v": _encode_column(pd.Series(index), arrays), "name": encode(index.name, arrays)}


def _encode_column(s: pd.Series, arrays: list[np.ndarray]) -> dict:
    dtype = s.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        return {
            "$": "cat",
            "codes": _encode_array(s.cat.codes.to_numpy(), arrays),
            "categories": _encode_column(pd.Series(dtype.categories), arrays),
            "ordered": bool(dtype.ordered),
        }
    if isinstance(dtype, np.dtype) and dtype.kind in "biufcmM":
        return _encode_array(s.to_numpy(), arrays)
    if isinstance(dtype, np.dtype) and dtype.kind == "O":
        return {"$": "objects", "v": [encode(v, arrays) for v in s.tolist()]}
    # pandas extension dtypes (Int64, string, boolean, ...): values and the dtype's name.
    return {"$": "ext", "dtype": str(dtype), "v": [encode(v, arrays) for v in s.astype(object).tolist()]}


def decode(x: Any, z: list[np.ndarray]) -> Any:
    """The value :func:`encode` wrote; ``z`` the stored arrays, in :func:`encode`'s order."""
    if isinstance(x, list):
        return [decode(v, z) for v in x]
    if not isinstance(x, dict):
        return x
    tag = x["$"]
    if tag == "float":
        return float(x["v"])
    if tag == "np":
        return np.dtype(x["dtype"]).type(decode(x["v"], z))
    if tag == "tuple":
        return tuple(decode(v, z) for v in x["v"])
    if tag == "dict":
        return {decode(k, z): decode(v, z) for k, v in x["v"]}
    if tag == "path":
        return Path(x["v"])
    if tag == "NA":
        return pd.NA
    if tag == "array":
        return z[int(x["ref"])]
    if tag == "objarray":
        out = np.empty(len(x["v"]), dtype=object)
        out[:] = [decode(v, z) for v in x["v"]]
        return out.reshape(x["shape"])
    if tag == "frame":
        index = _decode_index(x["index"], z)
        data = {i: _decode_column(c, z) for i, c in enumerate(x["data"])}
        frame = pd.DataFrame(data, index=index)
        frame.columns = _decode_index(x["columns"], z)
        return frame
    if tag == "dc":
        cls = _class(x["cls"])
        if cls is None:
            raise ValueError(f"unknown class {x['cls']!r}")
        return cls(**{k: decode(v, z) for k, v in x["v"].items()})
    raise ValueError(f"unknown tag {tag!r}")


def _decode_index(x: dict, z: list[np.ndarray]) -> pd.Index:
    name = decode(x["name"], z)
    if x["$"] == "range":
        start, stop, step = x["v"]
        return pd.RangeIndex(start, stop, step, name=name)
    values = _decode_column(x["v"], z)
    return pd.Index(values, name=name)


def _decode_column(x: dict, z: list[np.ndarray]) -> Any:
    tag = x["$"]
    if tag == "array":
        return z[int(x["ref"])]
    if tag == "cat":
        categories = pd.Index(_decode_column(x["categories"], z))
        return pd.Categorical.from_codes(_decode_column(x["codes"], z), categories=categories, ordered=x["ordered"])
    if tag == "objects":
        out = np.empty(len(x["v"]), dtype=object)
        out[:] = [decode(v, z) for v in x["v"]]
        return out
    if tag == "ext":
        return pd.array([decode(v, z) for v in x["v"]], dtype=x["dtype"])
    raise ValueError(f"unknown column tag {tag!r}")
