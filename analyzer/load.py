"""Load PyTorch profiler (Kineto) traces into the columnar tables of
:mod:`analyzer.tables`, one :class:`RankTrace` per rank.

Reading one file (docs/loading.md has the full story):

* The file is decompressed and parsed as a *stream*: the JSON text is cut at
  event boundaries into blocks of about 1 MB, each block is decoded with
  msgspec into small typed structs (only the fields the tables need; the
  rest of each event is skipped, not built) and turned into typed columns,
  and the block's objects are freed before the next one is read. Peak
  memory is a few blocks plus the final columns, independent of the trace
  size; HTA holds the whole JSON text and its object tree, 4 to 7 times the
  file.
* A cut is only *trusted* when both sides parse: a JSON object is
  self-delimiting, so if ``[`` + block + ``]`` parses, the block ends on an
  element boundary of the ``traceEvents`` array and the result equals what
  a whole-document parse gives. A cut that fails (the candidate sat inside
  a string) is retried later; an error before the block's end is a real
  syntax error and is reported with its line.
* Columns: times become integer ns, names categoricals, and only the args
  the schema needs are kept.

Many files: :func:`load_traces` parses ranks in parallel worker processes
and keeps the parsed tables in a Parquet cache (:mod:`analyzer.cache`), so
a second load reads a few MB of Parquet instead of re-parsing JSON.
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import re
import sys
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Optional, Sequence

import msgspec
import numpy as np
import orjson
import pandas as pd

from analyzer import cache as trace_cache
from analyzer.errors import AnalyzerError, TraceError
from analyzer.tables import (
    COLUMNS,
    CPU_COMM_RE,
    DEVICE_KINDS,
    GPU_TIMELINE_CATS,
    KINDS,
    MATMUL_OPS,
    RankTrace,
    classify,
    empty_events,
    empty_processes,
    empty_threads,
    steps_from_events,
    text_id,
)

# Decompressed bytes per parse block. On df_index_resolver + control,
# 1 and 2 MB parse equally fast (per-block overhead is small: the text is
# never copied), 4 and 8 MB slower, and the peak grows with the block
# (148, 151, 164, 188 MB for 1, 2, 4, 8 MB).
BLOCK_BYTES = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_MB = 1e6

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_IN_NAME_RE = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?![0-9])", re.IGNORECASE)
_TRACE_EVENTS_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*')
_STREAM_TID_RE = re.compile(r"stream\s*(\d+)", re.IGNORECASE)
# Annotation prefixes PyTorch writes around a collective's host-side work.
_COLL_ANNOTATION_PREFIXES = ("gloo:", "nccl:")


# --------------------------------------------------------------------------
# Result of loading many files


@dataclass
class TraceSet:
    """Traces of several ranks, plus what went wrong on the way.

    ``ranks`` maps rank -> trace for every file that loaded; ``errors`` has
    one :class:`TraceError` per file that could not be used (its message is
    one line naming the file); ``warnings`` are one-line notes about the set
    (duplicated ranks, differing step counts, ranks missing against
    ``world_size``, traces without ProfilerStep markers, ...).
    """

    ranks: dict[int, RankTrace] = field(default_factory=dict)
    errors: list[TraceError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def events(self) -> pd.DataFrame:
        """All ranks' events in one table (categories unified), ordered by rank."""
        frames = [self.ranks[r].events for r in sorted(self.ranks)]
        if not frames:
            return empty_events()
        cat_cols = [c for c, t in COLUMNS.items() if t == "category" and c != "kind"]
        unified = {}
        for col in cat_cols:
            unified[col] = pd.api.types.union_categoricals([f[col] for f in frames]).categories
        out = []
        for f in frames:
            f = f.copy(deep=False)
            for col, cats in unified.items():
                f[col] = f[col].cat.set_categories(cats)
            out.append(f)
        return pd.concat(out, ignore_index=True)


# --------------------------------------------------------------------------
# Finding files and ranks


def find_trace_files(path: Path) -> list[Path]:
    """Trace files named by ``path``: the file itself, or the ``*.json`` and
    ``*.json.gz`` files directly inside a folder (one level, like HTA;
    hidden files skipped), in natural order (``rank2`` before ``rank10``).

    Raises AnalyzerError when the path does not exist or a folder holds no
    trace file; the message points at subfolders that do.
    """
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.exists():
        raise AnalyzerError(f"{path}: no such file or directory")
    if not path.is_dir():
        raise AnalyzerError(f"{path}: not a file or directory")
    from analyzer.rundir import is_run_dir

    if is_run_dir(path):
        # Its run.json is not a trace, and its traces/ may hold several
        # profiler windows per rank: the run-directory reader sorts that out.
        raise AnalyzerError(
            f"{path}: a reftrain run directory; read it with analyzer.rundir.read_run_dir, or pass {path / 'traces'}"
        )
    files = [p for p in path.iterdir() if _is_trace_name(p.name) and p.is_file()]
    if not files:
        deeper = sorted(p for p in path.rglob("*") if _is_trace_name(p.name) and p.is_file() and not _hidden(p, path))
        hint = f" ({len(deeper)} in subfolders, e.g. {deeper[0].parent}; pass that folder)" if deeper else ""
        raise AnalyzerError(f"{path}: no trace files (*.json, *.json.gz){hint}")
    return sorted(files, key=_natural_key)


def _is_trace_name(name: str) -> bool:
    return not name.startswith(".") and name.endswith(TRACE_SUFFIXES)


def _hidden(p: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in p.relative_to(root).parts)


def _natural_key(p: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]


def rank_from_filename(name: str) -> int | None:
    """Rank written in a file name: ``rank-3``, ``rank3``, ``rank_3`` (any
    case, not inside a longer word), the last one when several; else None."""
    found = _RANK_IN_NAME_RE.findall(name)
    return int(found[-1]) if found else None


def _resolve_rank(distributed_info: dict, path: Path, hint: int | None) -> tuple[int, str]:
    rank = distributed_info.get("rank") if isinstance(distributed_info, dict) else None
    if isinstance(rank, (int, float, str)) and str(rank).lstrip("-").isdigit():
        return int(rank), "distributedInfo"
    from_name = rank_from_filename(path.name)
    if from_name is not None:
        return from_name, "filename"
    if hint is not None:
        return int(hint), "argument"
    return 0, "default"


# --------------------------------------------------------------------------
# Reading bytes


def _read_blocks(path: Path, size: int | None = None) -> Iterator[bytes]:
    """Decompressed content of ``path`` in blocks of at most ``size`` bytes
    (default :data:`BLOCK_BYTES`).

    Gzip is recognized by its magic bytes, not the suffix. Raises TraceError
    for an unreadable file, a truncated or corrupt gzip stream.
    """
    size = size or BLOCK_BYTES
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise TraceError(path, f"cannot read file: {exc.strerror or exc}") from None
    with fh:
        head = fh.read(2)
        fh.seek(0)
        if head != _GZIP_MAGIC:
            while True:
                try:
                    block = fh.read(size)
                except OSError as exc:
                    raise TraceError(path, f"cannot read file: {exc.strerror or exc}") from None
                if not block:
                    return
                yield block
        out_bytes = 0
        # wbits=31: gzip wrapper, CRC and length checked by zlib.
        d = zlib.decompressobj(31)
        pending = b""
        while True:
            if not pending:
                pending = fh.read(1 << 20)
                if not pending:
                    if not d.eof:
                        raise TraceError(path, f"truncated gzip stream after {out_bytes / _MB:.1f} MB")
                    return
            try:
                block = d.decompress(pending, size)
            except zlib.error as exc:
                raise TraceError(path, f"corrupt gzip data after {out_bytes / _MB:.1f} MB ({exc})") from None
            pending = d.unconsumed_tail
            if block:
                out_bytes += len(block)
                yield block
            if d.eof:
                rest = d.unused_data + pending
                pending = b""
                if rest.strip(b"\x00"):
                    if rest[:2] != _GZIP_MAGIC:
                        raise TraceError(path, f"trailing garbage after gzip stream at {out_bytes / _MB:.1f} MB")
                    # A second gzip member (concatenated .gz files): continue.
                    d = zlib.decompressobj(31)
                    pending = rest
                    continue
                if not fh.read(1):
                    return
                raise TraceError(path, f"trailing garbage after gzip stream at {out_bytes / _MB:.1f} MB")


# --------------------------------------------------------------------------
# Typed decoding of events

# msgspec decodes each event straight into these structs: fields not named
# here (most of a kernel's args, call stacks, ...) are skipped without
# being built. Measured on the HTA samples: decoding is 2-3x faster than
# orjson's generic parse into dicts, and the whole load of
# trace_diff/control went from 2.7 s to 0.6 s. Everything is ``Any`` so odd
# value types never fail the decode; ``Input Dims``/``Input type`` stay raw
# JSON text (only the few rows that keep them are ever parsed).
_NO_RAW = msgspec.Raw()


class _Args(msgspec.Struct):
    correlation: Any = -1
    external_id: Any = msgspec.field(default=-1, name="External id")
    stream: Any = None
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    name: Any = None  # metadata events: process_name, thread_name
    labels: Any = None  # metadata events: process_labels


class _Event(msgspec.Struct):
    ph: Any = None
    cat: Any = ""
    name: Any = ""
    pid: Any = -1
    tid: Any = -1
    ts: Any = None
    dur: Any = None
    args: Optional[_Args] = None


class _Doc(msgspec.Struct):
    """The top level; ``traceEvents`` is decoded separately (see _decode_events)."""

    traceEvents: msgspec.Raw = _NO_RAW
    distributedInfo: Any = None
    deviceProperties: Any = None


_NO_ARGS = _Args()
_EVENTS = msgspec.json.Decoder(list[_Event])
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
_ONE = msgspec.json.Decoder(_Event)
_DOC = msgspec.json.Decoder(_Doc)


def _decode_events(text: Any) -> list[_Event]:
    """A JSON array of events; raises msgspec.DecodeError on bad syntax.

    Elements that are not objects are skipped and an ``args`` that is not
    an object is ignored (the only shapes the typed decode rejects).
    """
    try:
        return _EVENTS.decode(text)
    except msgspec.ValidationError:
        return [e for e in map(_lenient_event, _RAWS.decode(text)) if e is not None]


def _lenient_event(raw: msgspec.Raw) -> _Event | None:
    try:
        return _ONE.decode(raw)
    except msgspec.ValidationError:
        obj = orjson.loads(bytes(raw))
        if not isinstance(obj, dict):
            return None
        return _ONE.decode(orjson.dumps({**obj, "args": None}))


def _json_error(exc: msgspec.DecodeError, length: int) -> tuple[str, int]:
    """(reason, byte position) of a msgspec syntax error."""
    text = str(exc)
    m = re.match(r"JSON is malformed: (.*) \(byte (\d+)\)$", text)
    if m:
        return m.group(1), int(m.group(2))
    if text == "Input data was truncated":
        return "the text ends early", length
    return text, length


_JSON_TYPES = {ord("{"): "dict", ord("["): "list", ord('"'): "str", ord("t"): "bool", ord("f"): "bool", ord("n"): "null"}


# --------------------------------------------------------------------------
# Splitting the JSON text


class _Splitter:
    """Turns the decompressed text of a Kineto trace into the top-level
    metadata and a sequence of event lists, holding at most a few blocks.

    Handles the object form ``{..., "traceEvents": [...], ...}`` (Kineto)
    and the bare-array form ``[...]`` of the Chrome trace format.

    In the body of the array the buffer is a bytearray whose first byte is
    a synthetic ``[``: a cut writes ``]`` over the separator after the
    block's last event and hands the decoder a memoryview, so the text is
    never copied to be parsed. ``on_events`` runs while that view is open
    (the events' raw ``Input Dims`` point into it) and must not keep them.
    """

    def __init__(self, path: Path, on_events: Callable[[list], None]) -> None:
        self.path = path
        self.on_events = on_events
        self.meta: dict = {}
        self.total = 0  # bytes seen
        self._buf = bytearray()
        self._lead = 0  # synthetic bytes at the front of _buf (the "[" in the body)
        self._buf_pos = 0  # absolute offset of _buf[_lead]
        self._lines_before = 0  # newlines before _buf[_lead]
        self._state = "head"
        self._array_form = False
        self._retry_at = 0  # after a failed cut, wait until _buf is this long

    # The structure: head -> body, or the whole-document fallback.
    def feed(self, block: bytes) -> None:
        self.total += len(block)
        self._buf += block
        if self._state == "head":
            self._find_events_array()
        if self._state == "body" and len(self._buf) >= self._retry_at:
            self._cut_body()

    def finish(self) -> None:
        if self.total == 0:
            raise TraceError(self.path, "empty file")
        if self._state == "body":
            self._parse_last()
        else:
            self._parse_whole()

    def _find_events_array(self) -> None:
        buf = self._buf
        start = 3 if buf.startswith(b"\xef\xbb\xbf") else 0  # UTF-8 byte order mark
        while start < len(buf) and buf[start] in b" \t\r\n":
            start += 1
        if start == len(buf):
            return
        first = buf[start]
        if first == 0x5B:  # "[": the bare-array form
            self._array_form = True
            self._enter_body(start + 1)
            return
        if first != 0x7B:  # not "{": let the whole-document parse judge
            self._state = "whole"
            return
        m = _TRACE_EVENTS_KEY_RE.search(buf)
        if m is None or m.end() >= len(buf):
            return  # need more text
        if buf[m.end()] != 0x5B:
            self._state = "whole"  # traceEvents is not an array: report it properly
            return
        head = bytes(buf[start : m.start()]).rstrip()
        if head.endswith(b","):
            head = head[:-1] + b"}"
        elif head == b"{":
            head = b"{}"
        else:
            self._state = "whole"
            return
        try:
            meta = orjson.loads(head)
        except orjson.JSONDecodeError:
            # "traceEvents" sat inside a string or a nested object.
            self._state = "whole"
            return
        self.meta.update(meta)
        self._enter_body(m.end() + 1)

    def _enter_body(self, offset: int) -> None:
        self._lines_before += self._buf.count(b"\n", 0, offset)
        self._buf_pos += offset
        self._buf = bytearray(b"[") + self._buf[offset:]
        self._lead = 1
        self._state = "body"

    def _cut_body(self) -> None:
        buf = self._buf
        hi = len(buf)
        for _ in range(4):  # a few candidates before waiting for more text
            cut = _last_boundary(buf, hi, lo=1)
            if cut is None:
                break
            end, next_start = cut
            saved = buf[end]
            buf[end] = 0x5D  # "]" over the separator
            with memoryview(buf) as whole, whole[: end + 1] as chunk:
                try:
                    events = _decode_events(chunk)
                except msgspec.DecodeError as exc:
                    events = None
                    reason, pos = _json_error(exc, end + 1)
                else:
                    self.on_events(events)
                    del events
                    events = True
            if events is None:
                buf[end] = saved
                if pos < end:
                    # It failed before the cut: a real syntax error.
                    self._raise_json(reason, pos - self._lead)
                hi = end - 1
                continue
            consumed = next_start - 1  # keep one byte to become the new "["
            self._lines_before += buf.count(b"\n", self._lead, next_start)
            self._buf_pos += consumed - self._lead + 1
            del buf[:consumed]
            buf[0] = 0x5B
            self._retry_at = 0
            return
        # No usable cut yet: wait until the buffer has doubled (bounds the
        # re-parsing of an unusual document to linear total work).
        self._retry_at = 2 * len(buf)

    def _parse_last(self) -> None:
        # The rest of the array, its "]", and the remaining top-level
        # members; re-opening the object makes that one valid document.
        if self._array_form:
            doc, lead = self._buf, self._lead
        else:
            doc, lead = b'{"traceEvents":' + self._buf, len(b'{"traceEvents":') + self._lead
        self._decode_document(doc, lead)

    def _parse_whole(self) -> None:
        doc = self._buf
        start = 3 if doc.startswith(b"\xef\xbb\xbf") else 0
        body = doc[start:].lstrip()
        if not body:
            raise TraceError(self.path, "empty file (only whitespace)")
        self._decode_document(doc[start:], -start)

    def _decode_document(self, doc: bytes | bytearray, lead: int) -> None:
        """A whole (rest of the) document: the object form, or an array of
        events. ``lead`` maps its offsets to the buffer's text."""
        first = doc.lstrip()[:1]
        try:
            if first == b"[":
                events = _decode_events(doc)
                self._buf = bytearray()
                self.on_events(events)
                return
            if first != b"{":
                obj = msgspec.json.decode(doc)  # raises for invalid text
                raise TraceError(self.path, f"not a Kineto trace: the JSON is a {type(obj).__name__}, not an object")
            top = _DOC.decode(doc)
        except msgspec.DecodeError as exc:
            reason, pos = _json_error(exc, len(doc))
            self._raise_json(reason, pos - lead)
        raw = top.traceEvents
        if not len(raw):
            keys = ", ".join(list(orjson.loads(doc))[:6]) or "none"
            raise TraceError(self.path, f"no traceEvents array (top-level keys: {keys})")
        kind = _JSON_TYPES.get(memoryview(raw)[0], "number")
        if kind != "list":
            raise TraceError(self.path, f"traceEvents is a {kind}, not an array")
        for key in ("distributedInfo", "deviceProperties"):
            if getattr(top, key) is not None:
                self.meta[key] = getattr(top, key)
        events = _decode_events(raw)
        del raw, top
        self._buf = bytearray()
        self.on_events(events)

    def _raise_json(self, reason: str, rel_pos: int) -> NoReturn:
        """One line: where the JSON breaks (line, column) and why.

        ``rel_pos`` is a byte offset into the real text held in the buffer.
        """
        buf, lead = self._buf, self._lead
        rel_pos = max(0, min(rel_pos, len(buf) - lead))
        at = lead + rel_pos
        line = self._lines_before + buf.count(b"\n", lead, at) + 1
        line_start = buf.rfind(b"\n", lead, at)
        col = None if line_start < 0 and self._buf_pos else at - (line_start + 1 if line_start >= 0 else lead) + 1
        where = f"line {line}" + (f", column {col}" if col is not None else "")
        if reason == "the text ends early" or at >= len(buf):
            raise TraceError(
                self.path, f"invalid JSON: the text ends early, after {self.total / _MB:.1f} MB ({where}; file cut off?)"
            ) from None
        raise TraceError(self.path, f"invalid JSON at {where}: {reason}") from None


def _last_boundary(buf: bytearray, hi: int, lo: int = 0) -> tuple[int, int] | None:
    """Last ``}`` ws* ``,`` ws* ``{`` in ``buf[lo:hi]``: (end of the previous
    element, start of the next). Only a candidate: the caller verifies it
    by parsing."""
    i = hi
    while True:
        i = buf.rfind(b"{", lo, i)
        if i <= lo:
            return None
        j = i - 1
        while j >= lo and buf[j] in b" \t\r\n":
            j -= 1
        if j >= lo and buf[j] == 0x2C:  # ","
            k = j - 1
            while k >= lo and buf[k] in b" \t\r\n":
                k -= 1
            if k >= lo and buf[k] == 0x7D:  # "}"
                return k + 1, i


# --------------------------------------------------------------------------
# Events -> columns


class _Columns:
    """Accumulates typed columns from lists of decoded events.

    Per block, one Python loop picks the fields every row needs into lists;
    the lists become numpy arrays at the end of the block, so a block's
    objects (and their duplicate name strings) die with the block.
    """

    def __init__(self) -> None:
        self.cat_ids: dict[str, int] = {}
        self.name_ids: dict[str, int] = {}
        self.parts: dict[str, list[np.ndarray]] = {
            k: [] for k in ("cat", "name", "pid", "tid", "stream", "ts_ns", "dur_ns", "correlation", "external_id")
        }
        self.rows = 0
        # Sparse columns: row -> value, for the few rows that carry them.
        self.sparse: dict[str, dict[int, Any]] = {
            k: {}
            for k in (
                "input_dims",
                "input_types",
                "coll_name",
                "msg_in_nelems",
                "msg_out_nelems",
                "msg_dtype",
                "group_size",
                "pg_name",
            )
        }
        self.processes: dict[int, dict[str, str]] = {}
        self.threads: dict[tuple[int, int], str] = {}
        self.seen_events = 0
        self.dropped_no_time = 0
        self._wants_args: dict[str, bool] = {}

    def add(self, events: list[_Event]) -> None:
        self.seen_events += len(events)
        cats: list = []
        names: list = []
        pids: list = []
        tids: list = []
        tss: list = []
        durs: list = []
        streams: list = []
        corrs: list = []
        exts: list = []
        special: list = []
        wants = self._wants_args
        gpu_cats = GPU_TIMELINE_CATS
        no_args = _NO_ARGS
        row0 = self.rows
        for e in events:
            ph = e.ph
            if ph != "X":
                if ph == "M":
                    self._metadata(e)
                continue
            ts = e.ts
            dur = e.dur
            if ts is None or dur is None:
                self.dropped_no_time += 1
                continue
            cat = e.cat or ""
            if cat == "Trace":
                continue  # the profiler's own span (HTA drops it too)
            name = e.name or ""
            if type(name) is not str or type(cat) is not str:
                cat, name = str(cat), str(name)
            a = e.args or no_args
            tid = e.tid
            cats.append(cat)
            names.append(name)
            pids.append(e.pid)
            tids.append(tid)
            tss.append(ts)
            durs.append(dur)
            corrs.append(a.correlation)
            exts.append(a.external_id)
            if cat in gpu_cats:
                s = a.stream
                streams.append(tid if s is None else s)
            else:
                streams.append(-1)
            w = wants.get(name)
            if w is None:
                w = wants[name] = name in MATMUL_OPS or bool(CPU_COMM_RE.search(name))
            if w or a.collective is not None or a.in_nelems is not None:
                special.append((row0 + len(cats) - 1, name, a))
        if not cats:
            return
        self.rows += len(cats)
        self.parts["cat"].append(_codes(cats, self.cat_ids))
        self.parts["name"].append(_codes(names, self.name_ids))
        self.parts["pid"].append(_ids(pids))
        self.parts["tid"].append(_ids(tids))
        self.parts["stream"].append(_streams(streams))
        self.parts["ts_ns"].append(_us_to_ns(tss))
        self.parts["dur_ns"].append(_us_to_ns(durs))
        self.parts["correlation"].append(_ids(corrs))
        self.parts["external_id"].append(_ids(exts))
        for row, name, a in special:
            self._special(row, name, a)

    def _metadata(self, e: _Event) -> None:
        a = e.args or _NO_ARGS
        if e.name == "process_name":
            self.processes.setdefault(text_id(e.pid), {})["name"] = "" if a.name is None else str(a.name)
        elif e.name == "process_labels":
            self.processes.setdefault(text_id(e.pid), {})["labels"] = "" if a.labels is None else str(a.labels)
        elif e.name == "thread_name":
            self.threads[(text_id(e.pid), text_id(e.tid))] = "" if a.name is None else str(a.name)

    def _special(self, row: int, name: str, a: _Args) -> None:
        sp = self.sparse
        # Copy the raw text out now: it points into the parse buffer.
        dims = orjson.loads(bytes(a.input_dims)) if len(a.input_dims) else None
        types = orjson.loads(bytes(a.input_types)) if len(a.input_types) else None
        if name in MATMUL_OPS or CPU_COMM_RE.search(name):
            if dims is not None:
                sp["input_dims"][row] = orjson.dumps(dims).decode()
            if types is not None:
                sp["input_types"][row] = orjson.dumps(types).decode()
        coll = a.collective
        if coll is None and name.startswith(_COLL_ANNOTATION_PREFIXES):
            coll = name.split(":", 1)[1]
        if coll is not None:
            sp["coll_name"][row] = str(coll)
        for v, col in ((a.in_nelems, "msg_in_nelems"), (a.out_nelems, "msg_out_nelems"), (a.group_size, "group_size")):
            if v is not None:
                sp[col][row] = _int_or_default(v)
        if coll is not None:
            for v, col in ((a.dtype, "msg_dtype"), (a.pg_name, "pg_name")):
                if v is not None:
                    sp[col][row] = str(v)
        if name.startswith("gloo:") and a.in_nelems is None:
            # gloo writes no record_param_comms; its annotation carries the
            # input tensor's shape (docs/loading.md, "CPU collectives").
            n = _first_input_nelems(dims)
            if n is not None:
                sp["msg_in_nelems"][row] = n
            if isinstance(types, list) and types and isinstance(types[0], str) and types[0]:
                sp["msg_dtype"][row] = types[0]


def _codes(values: list, ids: dict[str, int]) -> np.ndarray:
    """Global integer codes of strings, via a per-block factorize."""
    codes, uniques = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=False)
    remap = np.empty(len(uniques), dtype=np.int32)
    for i, u in enumerate(uniques):
        u = u if isinstance(u, str) else str(u)
        j = ids.get(u)
        if j is None:
            j = ids[u] = len(ids)
        remap[i] = j
    return remap[codes]


def _ids(values: list) -> np.ndarray:
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([text_id(v) for v in values], dtype=np.int64)


def _streams(values: list) -> np.ndarray:
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([_stream_id(v) for v in values], dtype=np.int64)


def _stream_id(v: object) -> int:
    if isinstance(v, str):
        m = _STREAM_TID_RE.search(v)  # old traces: tid "stream 7"
        if m:
            return int(m.group(1))
        try:
            return int(v, 0)
        except ValueError:
            return -1
    if isinstance(v, float):
        return int(v) if v == v else -1
    return v if isinstance(v, int) else -1


def _int_or_default(v: object) -> int:
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return -1


def _first_input_nelems(dims: object) -> int | None:
    if not isinstance(dims, list) or not dims or not isinstance(dims[0], list):
        return None
    shape = dims[0]
    if not all(isinstance(d, int) for d in shape):
        return None
    n = 1
    for d in shape:
        n *= d
    return n


def _us_to_ns(values: list) -> np.ndarray:
    """Kineto microseconds (int, or float with ns decimals) -> int64 ns.

    Integers are scaled exactly. Floats are split into whole and fractional
    µs so the fraction is rounded to the ns without the float64 product
    ``ts * 1000`` losing the low digits of large timestamps.
    """
    arr = np.asarray(values)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64) * 1000
    if arr.dtype.kind != "f":
        arr = np.array([float(v) for v in values], dtype=np.float64)
    whole = np.floor(arr)
    return whole.astype(np.int64) * 1000 + np.rint((arr - whole) * 1000).astype(np.int64)


# --------------------------------------------------------------------------
# One file


def parse_trace(path: Path, rank: int | None = None) -> RankTrace:
    """Parse one Kineto trace file without touching the cache.

    See :func:`load_trace`; this is the uncached work it does.
    """
    path = Path(path)
    cols = _Columns()
    splitter = _Splitter(path, cols.add)
    # The parse allocates millions of small acyclic objects; the cyclic GC
    # would traverse them again and again (measured: 2x slower). Nothing
    # here creates cycles, and refcounting frees each block.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for block in _read_blocks(path):
            splitter.feed(block)
        splitter.finish()
    except (TypeError, ValueError, OverflowError) as exc:
        # Valid JSON with values of the wrong type (a text "ts", say).
        raise TraceError(path, f"unexpected values in traceEvents ({type(exc).__name__}: {str(exc)[:100]})") from None
    finally:
        if was_enabled:
            gc.enable()
    if cols.rows == 0:
        if cols.seen_events == 0:
            raise TraceError(path, "traceEvents is empty")
        raise TraceError(
            path,
            f"no timed events: none of the {cols.seen_events} events is a complete event (\"ph\": \"X\") with ts and dur",
        )
    meta = splitter.meta
    dist = meta.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    props = meta.get("deviceProperties")
    props = props if isinstance(props, list) else []
    resolved, source = _resolve_rank(dist, path, rank)
    events, notes = _build_events(cols, resolved)
    return RankTrace(
        rank=resolved,
        path=path,
        events=events,
        steps=steps_from_events(events),
        distributed_info=dist,
        device_properties=props,
        has_device=bool(events["kind"].isin(DEVICE_KINDS).any()),
        rank_source=source,
        processes=_processes_frame(cols.processes),
        threads=_threads_frame(cols.threads),
        json_bytes=splitter.total,
        notes=notes,
    )


def _build_events(cols: _Columns, rank: int) -> tuple[pd.DataFrame, list[str]]:
    """The events table from the accumulated columns: rows sorted by start,
    negative durations dropped. Column by column, freeing the per-block
    parts as it goes, so the peak holds about one extra column."""
    parts = cols.parts
    notes = []
    if cols.dropped_no_time:
        notes.append(f"{cols.dropped_no_time} complete events without ts or dur were dropped")
    ts = np.concatenate(parts.pop("ts_ns"))
    dur = np.concatenate(parts.pop("dur_ns"))
    keep = dur >= 0
    if not keep.all():
        notes.append(f"{int((~keep).sum())} events with a negative duration were dropped")
    # Stable sort by start: ties keep file order.
    order = np.flatnonzero(keep)
    order = order[np.argsort(ts[order], kind="stable")]
    n = len(order)
    start = ts[order]
    end = start + dur[order]
    del ts, dur

    def column(key: str) -> np.ndarray:
        return np.concatenate(parts.pop(key))[order]

    lower_code, cat_list = _lower_categories(cols.cat_ids)
    name_list = list(cols.name_ids)
    cat_code = lower_code[column("cat")]
    name_code = column("name")
    frame = {
        "rank": np.full(n, rank, dtype=np.int32),
        "cat": _compact_categorical(cat_code, cat_list),
        "name": _compact_categorical(name_code, name_list),
        "kind": pd.Categorical.from_codes(_kind_codes(cat_list, cat_code, name_list, name_code), categories=list(KINDS)),
    }
    del cat_code, name_code
    for key in ("pid", "tid", "stream"):
        frame[key] = column(key)
    frame["start_ns"], frame["end_ns"] = start, end
    for key in ("correlation", "external_id"):
        frame[key] = column(key)
    # Sparse columns: row numbers of the file order -> positions in the table.
    position = np.full(len(keep), -1, dtype=np.int64)
    position[order] = np.arange(n)
    for col in ("input_dims", "input_types"):
        values = np.full(n, None, dtype=object)
        for row, v in cols.sparse[col].items():
            if position[row] >= 0:
                values[position[row]] = v
        # An explicit object Series: pandas 3 would infer its str dtype.
        frame[col] = pd.Series(values, dtype=object, copy=False)
    for col in ("msg_in_nelems", "msg_out_nelems", "group_size"):
        values = np.full(n, -1, dtype=np.int64)
        for row, v in cols.sparse[col].items():
            if position[row] >= 0:
                values[position[row]] = v
        frame[col] = values
    for col in ("coll_name", "msg_dtype", "pg_name"):
        cats = sorted(set(cols.sparse[col].values()))
        index = {c: i for i, c in enumerate(cats)}
        codes = np.full(n, -1, dtype=np.int32)
        for row, v in cols.sparse[col].items():
            if position[row] >= 0:
                codes[position[row]] = index[v]
        frame[col] = pd.Categorical.from_codes(codes, categories=pd.Index(cats, dtype="str"))
    events = pd.DataFrame({c: frame[c] for c in COLUMNS}, copy=False)
    return events, notes


def _lower_categories(ids: dict[str, int]) -> tuple[np.ndarray, list[str]]:
    """Lower-case categories; two spellings of one category merge."""
    lowered: dict[str, int] = {}
    remap = np.empty(len(ids), dtype=np.int32)
    for raw, i in ids.items():
        remap[i] = lowered.setdefault(raw.lower(), len(lowered))
    return remap, list(lowered)


def _compact_categorical(codes: np.ndarray, categories: list[str]) -> pd.Categorical:
    # Keep only names that survived the filters, in first-seen order.
    used = np.zeros(len(categories), dtype=bool)
    used[codes] = True
    if used.all():
        return pd.Categorical.from_codes(codes, categories=pd.Index(categories, dtype="str"))
    new_id = np.cumsum(used) - 1
    kept = [c for c, u in zip(categories, used) if u]
    return pd.Categorical.from_codes(new_id[codes], categories=pd.Index(kept, dtype="str"))


def _kind_codes(cat_cats: list[str], cat_code: np.ndarray, names: list[str], name_code: np.ndarray) -> np.ndarray:
    """classify() once per distinct (cat, name) pair, not per row."""
    if len(cat_code) == 0:
        return np.empty(0, dtype=np.int8)
    pair = cat_code.astype(np.int64) * max(len(names), 1) + name_code
    uniq, inv = np.unique(pair, return_inverse=True)
    kind_index = {k: i for i, k in enumerate(KINDS)}
    per_pair = np.array(
        [kind_index[classify(cat_cats[u // max(len(names), 1)], names[u % max(len(names), 1)])] for u in uniq],
        dtype=np.int8,
    )
    return per_pair[inv]


def _processes_frame(processes: dict[int, dict[str, str]]) -> pd.DataFrame:
    if not processes:
        return empty_processes()
    pids = sorted(processes)
    return pd.DataFrame(
        {
            "pid": np.array(pids, dtype=np.int64),
            "name": pd.Series([processes[p].get("name") for p in pids], dtype=object),
            "labels": pd.Series([processes[p].get("labels") for p in pids], dtype=object),
        }
    )


def _threads_frame(threads: dict[tuple[int, int], str]) -> pd.DataFrame:
    if not threads:
        return empty_threads()
    keys = sorted(threads)
    return pd.DataFrame(
        {
            "pid": np.array([k[0] for k in keys], dtype=np.int64),
            "tid": np.array([k[1] for k in keys], dtype=np.int64),
            "name": pd.Series([threads[k] for k in keys], dtype=object),
        }
    )


def load_trace(path: Path, rank: int | None = None) -> RankTrace:
    """Parse one Kineto trace (``.json`` or ``.json.gz``, any PyTorch version).

    The rank is ``distributedInfo.rank`` when the trace has it, else a rank
    in the file name (``rank-3``, ``rank3``, ``rank_3``), else ``rank``,
    else 0; ``RankTrace.rank_source`` says which. Times are integer ns.

    Raises TraceError (one line naming the file) for an empty file, a
    truncated or corrupt gzip stream, invalid JSON (with its line), a
    document without a ``traceEvents`` array, or one without timed events.
    Uncached; :func:`load_traces` adds the cache and parallelism.
    """
    return parse_trace(path, rank)


# --------------------------------------------------------------------------
# Many files


def load_traces(
    paths: Path | Sequence[Path],
    *,
    cache: bool | Path = True,
    workers: int | None = None,
    progress: bool | None = None,
) -> TraceSet:
    """Load a folder, a file, or a list of files/folders of Kineto traces.

    Every file either loads or becomes one entry of ``errors``; the others
    still load. With ``cache`` (True: ``.analyzer-cache/`` beside the traces,
    or the user cache folder when that is read-only; a Path: that folder)
    parsed tables are reused while a file's path, size and mtime are
    unchanged. ``workers`` parallel processes parse uncached files
    (default: min(files, usable CPUs), or 1 when the uncached files hold
    less than 8 MB compressed). ``progress``: a tqdm bar on stderr;
    None shows it only on a terminal for many (> 4) or large (> 200 MB)
    inputs.

    Raises AnalyzerError only when no file can be found at all.
    """
    files = _expand(paths)
    result = TraceSet()
    store = trace_cache.TraceCache(None if cache is True else Path(cache)) if cache else None
    hits: list[tuple[Path, Path]] = []
    misses: list[tuple[Path, Path | None]] = []
    for f in files:
        entry = store.entry_for(f) if store else None
        if entry is not None and entry.exists():
            hits.append((f, entry))
        else:
            misses.append((f, entry))
    loaded: dict[Path, RankTrace] = {}
    total_bytes = sum(_size(f) for f, _ in misses)
    bar = _progress_bar(progress, len(files), total_bytes)
    try:
        # Parse first, then read cache hits: the worker processes are forked
        # before this process starts any Arrow threads.
        entries = dict(misses)
        for f, (first, second) in _parse_many([f for f, _ in misses], workers):
            if isinstance(first, RankTrace):
                loaded[f] = first
                note = store.write(entries[f], first) if store else None
                if note:
                    result.warnings.append(note)
            else:
                result.errors.append(TraceError(first, second))
            if bar:
                bar.update(1)
        for f, entry in hits:
            try:
                rt = store.read(entry, f)
            except trace_cache.CacheEntryError as exc:
                result.warnings.append(str(exc))
                try:
                    rt = parse_trace(f)
                except TraceError as err:
                    result.errors.append(err)
                    continue
                note = store.write(entry, rt)
                if note:
                    result.warnings.append(note)
            loaded[f] = rt
            if bar:
                bar.update(1)
    finally:
        if bar:
            bar.close()
    if store and store.note:
        result.warnings.append(store.note)
    _assemble(files, loaded, result)
    return result


def _expand(paths: Path | Sequence[Path]) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [Path(paths)]
    files: list[Path] = []
    seen: set[Path] = set()
    for p in paths:
        for f in find_trace_files(Path(p)):
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                files.append(f)
    return files


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _parse_one(path: Path) -> tuple[RankTrace, None] | tuple[str, str]:
    """Worker body: parse one file.

    A failure comes back as ``(path, problem)`` text: TraceError's
    two-argument constructor does not survive pickling between processes.
    The cache entry is written by the calling process, so forked workers
    never use Arrow (its thread and memory pools are not fork-safe) and
    hold no Arrow buffers.
    """
    try:
        return parse_trace(path), None
    except TraceError as err:
        return str(err.path), err.problem


# Below this much compressed input, starting worker processes costs more
# than it saves (a process start plus imports is ~0.2-1 s).
PARALLEL_MIN_BYTES = 8 << 20


def _parse_many(files: list[Path], workers: int | None) -> Iterator[tuple[Path, Any]]:
    """(file, _parse_one(file)) in the order of ``files``."""
    if not files:
        return
    if workers is None and sum(_size(f) for f in files) < PARALLEL_MIN_BYTES:
        workers = 1
    n = min(len(files), workers or _usable_cpus())
    if n <= 1:
        for f in files:
            yield f, _parse_one(f)
        return
    with ProcessPoolExecutor(max_workers=n, mp_context=_mp_context()) as pool:
        futures = [(f, pool.submit(_parse_one, f)) for f in files]
        for f, fut in futures:
            yield f, fut.result()


def _usable_cpus() -> int:
    """CPUs this process may run on (affinity and cpusets), not the host's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _mp_context() -> multiprocessing.context.BaseContext:
    """fork when this process has a single thread (fast: the children
    inherit the imported modules); forkserver otherwise, since forking a
    multi-threaded process (a Streamlit server, say) can deadlock."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and _single_threaded():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        import threading

        return threading.active_count() == 1


def _progress_bar(progress: bool | None, n_files: int, total_bytes: int):
    if progress is None:
        progress = sys.stderr.isatty() and (n_files > 4 or total_bytes > 200 * 1_000_000)
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=n_files, unit="trace", desc="loading traces", file=sys.stderr, leave=False)


def _assemble(files: list[Path], loaded: dict[Path, RankTrace], result: TraceSet) -> None:
    """Ranks by rank, and the set-level warnings."""
    multi = len(files) > 1
    by_rank: dict[int, list[RankTrace]] = {}
    for f in files:  # natural order
        rt = loaded.get(f)
        if rt is None:
            continue
        for note in rt.notes:
            result.warnings.append(f"{rt.path.name}: {note}")
        if multi and rt.rank_source == "default":
            result.warnings.append(f"{rt.path.name}: no rank in distributedInfo or the file name; assumed rank 0")
        by_rank.setdefault(rt.rank, []).append(rt)
    for rank in sorted(by_rank):
        group = by_rank[rank]
        kept = group[-1]
        if len(group) > 1:
            others = ", ".join(g.path.name for g in group[:-1])
            result.warnings.append(
                f"duplicated rank {rank}: kept {kept.path.name}, ignored {others} (the file sorting last is kept)"
            )
        result.ranks[rank] = kept
    for rank, rt in sorted(result.ranks.items()):
        if rt.steps.empty:
            result.warnings.append(
                f"{rt.path.name}: no ProfilerStep markers; per-step metrics unavailable for rank {rank}"
            )
    _check_step_counts(result)
    _check_world(result)


def _check_step_counts(result: TraceSet) -> None:
    counts = {r: len(rt.steps) for r, rt in result.ranks.items() if not rt.steps.empty}
    if len(set(counts.values())) <= 1:
        return
    values = list(counts.values())
    usual = max(set(values), key=lambda c: (values.count(c), c))
    for rank, count in sorted(counts.items()):
        if count != usual:
            steps = result.ranks[rank].steps["step"]
            result.warnings.append(
                f"{result.ranks[rank].path.name}: {count} ProfilerSteps "
                f"(#{steps.min()}..#{steps.max()}) while most ranks have {usual}; "
                f"rank {rank}'s per-step comparison covers different steps"
            )


def _check_world(result: TraceSet) -> None:
    sizes = {rt.world_size for rt in result.ranks.values() if rt.world_size}
    if not sizes:
        return
    world = max(sizes)
    missing = sorted(set(range(world)) - set(result.ranks))
    if missing:
        have = "rank has" if len(missing) == 1 else "ranks have"
        result.warnings.append(f"world_size is {world} but {len(missing)} {have} no trace: {_ranges(missing)}")
    extra = sorted(r for r in result.ranks if r >= world or r < 0)
    if extra:
        result.warnings.append(f"ranks {_ranges(extra)} are outside world_size {world}")


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    out = []
    start = prev = values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if v is not None:
            start = prev = v
    return ", ".join(out)
