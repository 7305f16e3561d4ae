"""Read Kineto trace files into typed columns, without pandas.

The first half of loading (docs/loading.md); :mod:`analyzer.load` turns
the columns into the tables of :mod:`analyzer.tables`. Kept free of pandas
so that worker processes forked before pandas is imported can parse while
the main process imports it: on the 2-core development machine pandas
takes about 1 s to import, as long as parsing a 50 MB trace, and
:class:`ParseJobs` runs the two side by side (the CLI starts them first).

Reading one file:

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
* Columns: times become integer ns, names integer codes, and only the args
  the schema needs are kept.
"""
from __future__ import annotations

import gc
import re
import zlib
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Optional

import msgspec
import numpy as np
import orjson

from analyzer.errors import TraceError
from analyzer.schema import CPU_COMM_RE, GPU_TIMELINE_CATS, MATMUL_OPS, text_id

# Decompressed bytes per parse block. On df_index_resolver + control,
# 1 and 2 MB parse equally fast (per-block overhead is small: the text is
# never copied), 4 and 8 MB slower, and the peak grows with the block
# (148, 151, 164, 188 MB for 1, 2, 4, 8 MB).
BLOCK_BYTES = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_MB = 1e6

_RANK_IN_NAME_RE = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?![0-9])", re.IGNORECASE)
_TRACE_EVENTS_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*')
_STREAM_TID_RE = re.compile(r"stream\s*(\d+)", re.IGNORECASE)
# Annotation prefixes PyTorch writes around a collective's host-side work.
_COLL_ANNOTATION_PREFIXES = ("gloo:", "nccl:")



# --------------------------------------------------------------------------
# Finding files and ranks


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


_TS, _DUR, _CAT, _NAME, _PID, _TID = (attrgetter(f) for f in ("ts", "dur", "cat", "name", "pid", "tid"))
_CORRELATION, _EXTERNAL_ID = attrgetter("correlation"), attrgetter("external_id")
_STR = {str}


def _exact_text(cats: list, names: list) -> tuple[list[str], list[str]]:
    """Category and name as text: a missing or false value is "", anything
    else that is not text becomes its str() (both, when either is not text)."""
    out_c, out_n = [], []
    for cat, name in zip(cats, names):
        cat, name = cat or "", name or ""
        if type(name) is not str or type(cat) is not str:
            cat, name = str(cat), str(name)
        out_c.append(cat)
        out_n.append(name)
    return out_c, out_n


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
        # Column at a time (comprehensions and C-level attribute getters)
        # rather than one Python loop appending to nine lists per event:
        # 0.45 -> 0.33 s for trace_diff/control. The rare shapes (events
        # without ts, null or non-text names) take a slower exact path.
        self.seen_events += len(events)
        xs = [e for e in events if e.ph == "X"]
        if len(xs) != len(events):
            for e in events:
                if e.ph == "M":
                    self._metadata(e)
        tss = list(map(_TS, xs))
        durs = list(map(_DUR, xs))
        if None in tss or None in durs:
            timed = [e for e, ts, dur in zip(xs, tss, durs) if ts is not None and dur is not None]
            self.dropped_no_time += len(xs) - len(timed)
            xs = timed
            tss, durs = list(map(_TS, xs)), list(map(_DUR, xs))
        cats = list(map(_CAT, xs))
        names = list(map(_NAME, xs))
        if not (set(map(type, cats)) <= _STR and set(map(type, names)) <= _STR):
            cats, names = _exact_text(cats, names)
        if "Trace" in cats:  # the profiler's own span (HTA drops it too)
            keep = [c != "Trace" for c in cats]
            xs, cats, names, tss, durs = (list(compress(col, keep)) for col in (xs, cats, names, tss, durs))
        no_args = _NO_ARGS
        args = [e.args or no_args for e in xs]
        gpu_cats = GPU_TIMELINE_CATS
        streams = [
            (e.tid if a.stream is None else a.stream) if c in gpu_cats else -1 for e, a, c in zip(xs, args, cats)
        ]
        wants = self._wants_args
        for name in set(names).difference(wants):
            wants[name] = name in MATMUL_OPS or bool(CPU_COMM_RE.search(name))
        row0 = self.rows
        special = [
            (row0 + i, n, a)
            for i, (n, a) in enumerate(zip(names, args))
            if wants[n] or a.collective is not None or a.in_nelems is not None
        ]
        pids = list(map(_PID, xs))
        tids = list(map(_TID, xs))
        corrs = list(map(_CORRELATION, args))
        exts = list(map(_EXTERNAL_ID, args))
        del xs
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
    """Global integer codes of strings: a per-block dictionary of the
    block's distinct values (first-seen order), then one remap to the
    file-wide ``ids``."""
    local = {v: i for i, v in enumerate(dict.fromkeys(values))}  # first-seen order
    codes = np.fromiter(map(local.__getitem__, values), dtype=np.int32, count=len(values))
    remap = np.empty(len(local), dtype=np.int32)
    for u, i in local.items():
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


@dataclass
class ParsedTrace:
    """The columns of one trace file, before they become an events table.

    ``columns`` are in file order (one entry per complete event kept):
    ``cat``/``name`` as codes into ``cats``/``names`` (first-seen order),
    ``pid``, ``tid``, ``stream``, ``ts_ns``, ``dur_ns``, ``correlation``,
    ``external_id``. ``sparse`` maps column -> {row: value} for the few
    rows that carry matmul shapes or collective details. ``meta`` holds the
    document's top-level ``distributedInfo`` and ``deviceProperties``.
    """

    path: Path
    columns: dict[str, np.ndarray]
    cats: list[str]
    names: list[str]
    sparse: dict[str, dict[int, Any]]
    processes: dict[int, dict[str, str]]
    threads: dict[tuple[int, int], str]
    meta: dict = field(default_factory=dict)
    seen_events: int = 0
    dropped_no_time: int = 0
    json_bytes: int = 0
    # Set by analyzer.cache.parse_and_store when its cache entry could not be written.
    cache_warning: str | None = None

    @property
    def rows(self) -> int:
        return len(self.columns["ts_ns"])


def parse_columns(path: Path) -> ParsedTrace:
    """Parse one Kineto trace file (``.json`` or ``.json.gz``) into columns.

    Raises TraceError (one line naming the file) for an empty file, a
    truncated or corrupt gzip stream, invalid JSON (with its line), a
    document without a ``traceEvents`` array, or one without timed events.
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
    return ParsedTrace(
        path=path,
        columns={key: np.concatenate(parts) for key, parts in cols.parts.items()},
        cats=list(cols.cat_ids),
        names=list(cols.name_ids),
        sparse=cols.sparse,
        processes=cols.processes,
        threads=cols.threads,
        meta={k: splitter.meta[k] for k in ("distributedInfo", "deviceProperties") if k in splitter.meta},
        seen_events=cols.seen_events,
        dropped_no_time=cols.dropped_no_time,
        json_bytes=splitter.total,
    )
