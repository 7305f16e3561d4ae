"""Read Kineto trace files into typed columns, without pandas.

The first half of loading (docs/loading.md); :mod:`analyzer.ingest.load` turns
the columns into the tables of :mod:`analyzer.ingest.tables`. Kept free of pandas
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
import json
import math
import os
import re
import sys
import zlib
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Optional, Union

import msgspec
import numpy as np
import orjson

from analyzer.errors import TraceError
from analyzer.ingest.limits import FLAGS, ParseLimits
from analyzer.ingest.limits import current as current_limits
from analyzer.ingest.schema import CONV_OPS, CPU_COMM_RE, FLOP_OPS, GPU_TIMELINE_CATS, canonical_category, text_id

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


def _over_bound(path: Path, what: str, limit_name: str) -> TraceError:
    """The one line for a file over a bound: what it exceeded, and the flag that raises it."""
    return TraceError(path, f"{what} (raise the bound with {FLAGS[limit_name]})")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB" if n < (10 << 30) else f"{n / (1 << 30):,.0f} GiB"


def _read_blocks(path: Path, size: int | None = None, limits: ParseLimits | None = None) -> Iterator[bytes]:
    """Decompressed content of ``path`` in blocks of at most ``size`` bytes
    (default :data:`BLOCK_BYTES`).

    Gzip is recognized by its magic bytes, not the suffix; a file of several
    gzip members (``cat a.gz b.gz``) is their concatenated content, as
    ``gzip -dc`` gives. Raises TraceError for an unreadable file, a truncated
    or corrupt gzip stream, and for text over the bounds of ``limits``
    (default :func:`analyzer.ingest.limits.current`): more than
    ``max_json_bytes``, or for gzip more than
    ``limits.max_decompressed(compressed size)``, counted as it is
    decompressed so a bomb stops at the bound.
    """
    size = size or BLOCK_BYTES
    limits = limits or current_limits()
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise TraceError(path, f"cannot read file: {exc.strerror or exc}") from None
    with fh:
        head = _read(fh, path, 2)
        fh.seek(0)
        if head != _GZIP_MAGIC:
            total = 0
            while True:
                block = _read(fh, path, size)
                if not block:
                    return
                total += len(block)
                if total > limits.max_json_bytes:
                    raise _over_bound(path, f"more than {_gib(limits.max_json_bytes)} of JSON", "max_json_bytes")
                yield block
        compressed = os.fstat(fh.fileno()).st_size
        yield from _gunzip(fh, path, size, compressed, limits)


def _read(fh: Any, path: Path, n: int) -> bytes:
    try:
        return fh.read(n)
    except OSError as exc:
        raise TraceError(path, f"cannot read file: {exc.strerror or exc}") from None


def _gunzip(fh: Any, path: Path, size: int, compressed: int, limits: ParseLimits) -> Iterator[bytes]:
    """The blocks of a gzip file of one or more members (see _read_blocks)."""
    bound = limits.max_decompressed(compressed)
    out_bytes = 0
    # wbits=31: gzip wrapper, CRC and length checked by zlib.
    d = zlib.decompressobj(31)
    in_member = True  # d has not reached the end of its member yet
    data = b""  # compressed bytes read but not yet given to d
    at_end = False  # the file is read to its end
    while True:
        if not data and not at_end:
            data = _read(fh, path, 1 << 20)
            at_end = not data
        if not in_member:
            # Between members: zero padding (some tools pad) or the next member.
            data = data.lstrip(b"\x00")
            if not data:
                if at_end:
                    return
                continue
            if len(data) < 2 and not at_end:
                more = _read(fh, path, 1 << 20)
                at_end = not more
                data += more
                continue
            if data[:2] != _GZIP_MAGIC:
                raise TraceError(path, f"trailing garbage after gzip stream at {out_bytes / _MB:.1f} MB")
            d = zlib.decompressobj(31)
            in_member = True
        try:
            block = d.decompress(data, size)
        except zlib.error as exc:
            raise TraceError(path, f"corrupt gzip data after {out_bytes / _MB:.1f} MB ({exc})") from None
        if d.eof:
            # Everything after this member. Not unused_data + unconsumed_tail:
            # on Python 3.11 both hold the bytes after the member, and
            # joining them decompressed the next member twice (issue 17).
            data = d.unused_data
            in_member = False
        else:
            data = d.unconsumed_tail
        if block:
            out_bytes += len(block)
            if out_bytes > bound:
                raise _gzip_over_bound(path, bound, compressed, limits)
            yield block
        elif in_member and not data and at_end:
            # No input left and no output pending: the member never ended.
            raise TraceError(path, f"truncated gzip stream after {out_bytes / _MB:.1f} MB")
        if not in_member and at_end and not data:
            return


def _gzip_over_bound(path: Path, bound: int, compressed: int, limits: ParseLimits) -> TraceError:
    if bound >= limits.max_json_bytes:
        return _over_bound(path, f"decompresses to more than {_gib(bound)} of JSON", "max_json_bytes")
    return _over_bound(
        path,
        f"decompresses to more than {_mib(bound)}, the bound for {compressed / _MB:.1f} MB of gzip "
        f"({limits.max_gzip_ratio:g}x, at least {_mib(limits.gzip_floor_bytes)}; a gzip bomb?)",
        "max_gzip_ratio",
    )


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
    # The TensorBoard-plugin era wrote "external id" on runtime and device
    # events (and "External id" on ops), some versions "Input dims".
    external_id_old: Any = msgspec.field(default=-1, name="external id")
    stream: Any = None
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_dims_old: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input dims")
    input_types: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
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
    # Typed so that a bool (or an array, an object) fails the fast decode
    # and takes the lenient path, which marks it invalid: numpy would read
    # true as 1 (raw_times checks numbers, not their JSON type).
    ts: Union[int, float, str, None] = None
    dur: Union[int, float, str, None] = None
    args: Optional[_Args] = None


class _Doc(msgspec.Struct):
    """The top level; ``traceEvents`` is decoded separately (see _decode_events)."""

    traceEvents: msgspec.Raw = _NO_RAW
    distributedInfo: Any = None
    deviceProperties: Any = None
    computeProperties: Any = None  # the TensorBoard-plugin era's deviceProperties
    displayTimeUnit: Any = None


# Top-level keys kept from a document (see ParsedTrace.meta).
_META_KEYS = ("distributedInfo", "deviceProperties", "computeProperties", "displayTimeUnit")


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
    """One element that failed the typed decode: None when it is not an
    object; else the event without its args, and with a ts/dur of the
    wrong JSON type replaced by its text (so it is counted as invalid)."""
    try:
        return _ONE.decode(raw)
    except msgspec.ValidationError:
        pass
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.ValidationError:  # a number beyond float64 (1e400): the standard library reads it as inf
        obj = json.loads(bytes(raw))
    if not isinstance(obj, dict):
        return None
    fixed = {**obj, "args": None}
    for key in ("ts", "dur"):
        v = fixed.get(key)
        if not (v is None or type(v) in (int, float, str)) or (type(v) is float and not math.isfinite(v)):
            fixed[key] = repr(v)[:60]
    return msgspec.convert(fixed, _Event)


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

    def __init__(self, path: Path, on_events: Callable[[list], None], max_event_bytes: int | None = None) -> None:
        self.path = path
        self.on_events = on_events
        # The longest JSON text held whole (see analyzer.limits.ParseLimits).
        self.max_event_bytes = max_event_bytes or current_limits().max_event_bytes
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
        if len(self._buf) - self._lead > self.max_event_bytes:
            self._over_event_bound()

    def _over_event_bound(self) -> NoReturn:
        what = {
            "body": f"an element of traceEvents longer than {_mib(self.max_event_bytes)}",
            "head": f"more than {_mib(self.max_event_bytes)} of JSON before traceEvents",
        }.get(self._state, f"a JSON document that cannot be read in parts, over {_mib(self.max_event_bytes)}")
        # The buffer starts where the unfinished piece starts.
        raise _over_bound(self.path, f"{what} (from line {self._lines_before + 1})", "max_event_bytes")

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
        if first != 0x7B:  # not "{": a scalar, never a trace; judged on the text so far
            self._state = "whole"
            self._judge_scalar(start)
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

    def _judge_scalar(self, start: int) -> None:
        """A document that starts with neither ``{`` nor ``[``: report it from
        its first block (invalid JSON, or valid JSON that is not a trace)
        instead of holding a file of, say, zeros whole. A scalar still open
        at the block's end (a long string) is read on, up to the bound."""
        try:
            with memoryview(self._buf) as whole, whole[start:] as text:
                value = msgspec.json.decode(text)
        except msgspec.DecodeError as exc:
            reason, pos = _json_error(exc, len(self._buf) - start)
            if reason != "the text ends early" and start + pos < len(self._buf):
                self._raise_json(reason, start + pos)
            return
        raise TraceError(self.path, f"not a Kineto trace: the JSON is a {type(value).__name__}, not an object")

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
        for key in _META_KEYS:
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
            k: [] for k in ("cat", "name", "pid", "tid", "stream", "ts", "dur", "correlation", "external_id")
        }
        self.rows = 0
        # Sparse columns: row -> value, for the few rows that carry them.
        self.sparse: dict[str, dict[int, Any]] = {
            k: {}
            for k in (
                "input_dims",
                "input_types",
                "concrete_inputs",
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
        # Complete events dropped for a missing or invalid ts/dur, and the first of them.
        self.invalid = 0
        self.first_invalid: str | None = None
        self._wants_args: dict[str, bool] = {}
        self._gpu_cat: dict[str, bool] = {}

    def add(self, events: list[_Event]) -> None:
        """Append the rows of one block of decoded events.

        Stages, each a function of its own: :func:`complete_events` (which
        events become rows), :meth:`_valid_times` (ts/dur checked, bad rows
        dropped and counted), then the columns. Column at a time
        (comprehensions and C-level attribute getters) rather than one
        Python loop appending to nine lists per event: 0.45 -> 0.33 s for
        trace_diff/control. The rare shapes (bad times, null or non-text
        names) take slower exact paths.
        """
        self.seen_events += len(events)
        xs = complete_events(events, self._metadata)
        xs, ts, dur = self._valid_times(xs)
        cats = list(map(_CAT, xs))
        names = list(map(_NAME, xs))
        if not (set(map(type, cats)) <= _STR and set(map(type, names)) <= _STR):
            cats, names = _exact_text(cats, names)
        if "Trace" in cats:  # the profiler's own span (HTA drops it too)
            keep = [c != "Trace" for c in cats]
            xs, cats, names = (list(compress(col, keep)) for col in (xs, cats, names))
            mask = np.array(keep, dtype=bool)
            ts, dur = ts[mask], dur[mask]
        if not cats:
            return
        no_args = _NO_ARGS
        args = [e.args or no_args for e in xs]
        on_gpu = self._on_gpu_timeline(cats)
        streams = [
            (e.tid if a.stream is None else a.stream) if on_gpu[c] else -1 for e, a, c in zip(xs, args, cats)
        ]
        wants = self._wants_args
        for name in set(names).difference(wants):
            wants[name] = name in FLOP_OPS or bool(CPU_COMM_RE.search(name))
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
        if -1 in exts:  # the older era's "external id"
            exts = [x if x != -1 else a.external_id_old for x, a in zip(exts, args)]
        del xs
        self.rows += len(cats)
        self.parts["cat"].append(_codes(cats, self.cat_ids))
        self.parts["name"].append(_codes(names, self.name_ids))
        self.parts["pid"].append(_ids(pids))
        self.parts["tid"].append(_ids(tids))
        self.parts["stream"].append(_streams(streams))
        self.parts["ts"].append(ts)
        self.parts["dur"].append(dur)
        self.parts["correlation"].append(_ids(corrs))
        self.parts["external_id"].append(_ids(exts))
        for row, name, a in special:
            self._special(row, name, a)

    def _on_gpu_timeline(self, cats: list[str]) -> dict[str, bool]:
        """Category (as written) -> whether its events sit on a GPU stream,
        judged once per distinct spelling in today's names."""
        known = self._gpu_cat
        for c in set(cats).difference(known):
            known[c] = canonical_category(c) in GPU_TIMELINE_CATS
        return known

    def _valid_times(self, xs: list[_Event]) -> tuple[list[_Event], np.ndarray, np.ndarray]:
        """The events whose ts and dur are valid, and those as numbers in the
        trace's unit (:func:`raw_times`); the others are counted in
        :attr:`invalid` with the first as an example."""
        tss = list(map(_TS, xs))
        durs = list(map(_DUR, xs))
        ts, ts_ok = raw_times(tss)
        dur, dur_ok = raw_times(durs)
        if ts_ok is None and dur_ok is None:
            return xs, ts, dur
        ok = ts_ok if dur_ok is None else dur_ok if ts_ok is None else ts_ok & dur_ok
        bad = np.flatnonzero(~ok)
        self.dropped_no_time += sum(1 for i in bad if tss[i] is None or durs[i] is None)
        first = int(bad[0])
        self._count_invalid(len(bad), _event_example(xs[first].name, tss[first], durs[first]))
        return list(compress(xs, ok.tolist())), ts[ok], dur[ok]

    def _count_invalid(self, n: int, example: str) -> None:
        self.invalid += n
        if self.first_invalid is None:
            self.first_invalid = example

    def finish(self, unit_ns: int) -> dict[str, np.ndarray]:
        """The file's columns: parts joined, times converted to integer ns
        (``unit_ns`` ns per unit of the trace), rows whose start or end
        would not fit int64 ns dropped and counted."""
        columns = {}
        over = np.zeros(self.rows, dtype=bool)
        for key in ("ts", "dur"):
            converted = [_to_ns(part, unit_ns) for part in self.parts.pop(key)]
            columns[key + "_ns"] = _join([ns for ns, _ in converted], np.int64)
            over |= _join([np.zeros(len(ns), dtype=bool) if o is None else o for ns, o in converted], bool)
        for key, parts in self.parts.items():
            columns[key] = _join(parts, np.int32 if key in ("cat", "name") else np.int64)
        if over.any():
            first = int(np.flatnonzero(over)[0])
            self._count_invalid(int(over.sum()), f"{self.name_of(columns['name'][first])!r} beyond int64 ns")
            keep = ~over
            columns = {key: col[keep] for key, col in columns.items()}
            new_row = np.cumsum(keep) - 1
            self.sparse = {
                col: {int(new_row[row]): v for row, v in values.items() if keep[row]} for col, values in self.sparse.items()
            }
            self.rows = int(keep.sum())
        return columns

    def name_of(self, code: int) -> str:
        return list(self.name_ids)[code]

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
        raw_dims = a.input_dims if len(a.input_dims) else a.input_dims_old
        dims = orjson.loads(bytes(raw_dims)) if len(raw_dims) else None
        types = orjson.loads(bytes(a.input_types)) if len(a.input_types) else None
        if name in FLOP_OPS or CPU_COMM_RE.search(name):
            if dims is not None:
                sp["input_dims"][row] = orjson.dumps(dims).decode()
            if types is not None:
                sp["input_types"][row] = orjson.dumps(types).decode()
            if name in CONV_OPS and len(a.concrete_inputs):
                sp["concrete_inputs"][row] = orjson.dumps(orjson.loads(bytes(a.concrete_inputs))).decode()
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


def complete_events(events: list[_Event], on_metadata: Callable[[_Event], None]) -> list[_Event]:
    """The events that can become rows: complete events (``"ph": "X"``).
    Metadata events (``"M"``: process and thread names) go to
    ``on_metadata``; instants, flows and counters are not rows."""
    xs = [e for e in events if e.ph == "X"]
    if len(xs) != len(events):
        for e in events:
            if e.ph == "M":
                on_metadata(e)
    return xs


# Largest start or duration kept, in ns: 2**62, so that start + duration
# fits int64 (292 years; epoch-based Kineto clocks are at about 1.7e18 ns).
MAX_TIME_NS = 1 << 62


def raw_times(values: list) -> tuple[np.ndarray, np.ndarray | None]:
    """ts or dur values as written -> (numbers, valid mask or None when all
    are valid).

    Valid: a JSON number (not a string, a bool or null), finite, >= 0 and
    at most :data:`MAX_TIME_NS` (the bound in the trace's unit is applied
    after conversion, :func:`_to_ns`, once the unit is known). The numbers
    are int64 when every value is an integer, else float64; invalid
    entries hold 0.
    """
    try:
        arr = np.asarray(values)
    except ValueError:  # ragged lists
        return _raw_times_exact(values)
    kind = arr.dtype.kind if arr.ndim == 1 else "O"
    if kind == "i":
        ok = (arr >= 0) & (arr <= MAX_TIME_NS)
    elif kind == "f":
        with np.errstate(invalid="ignore"):  # NaN compares False: invalid, no warning
            ok = (arr >= 0) & (arr <= MAX_TIME_NS)
    else:  # text, bools, nulls, integers beyond int64: value by value
        return _raw_times_exact(values)
    if ok.all():
        return arr, None
    return np.where(ok, arr, 0), ok


def _raw_times_exact(values: list) -> tuple[np.ndarray, np.ndarray]:
    nums = [v if (type(v) is int or type(v) is float) and 0 <= v <= MAX_TIME_NS else None for v in values]
    ok = np.array([v is not None for v in nums], dtype=bool)
    arr = np.asarray([0 if v is None else v for v in nums])
    if arr.dtype.kind not in "if":  # empty
        arr = arr.astype(np.int64)
    return arr, ok


def _to_ns(raw: np.ndarray, unit_ns: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Times in the trace's unit -> (int64 ns, mask of values over
    MAX_TIME_NS after conversion, or None when there are none).

    Integers are scaled exactly. Floats in µs are split into whole and
    fractional µs so the fraction is rounded to the ns without the float64
    product ``ts * 1000`` losing the low digits of large timestamps; floats
    in ns are rounded to the ns.
    """
    over = raw > MAX_TIME_NS // unit_ns
    if over.any():
        raw = np.where(over, 0, raw)
    else:
        over = None
    if raw.dtype.kind in "iu":
        return raw.astype(np.int64) * unit_ns, over
    if unit_ns == 1:
        return np.rint(raw).astype(np.int64), over
    whole = np.floor(raw)
    return whole.astype(np.int64) * unit_ns + np.rint((raw - whole) * unit_ns).astype(np.int64), over


def _join(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def _event_example(name: Any, ts: Any, dur: Any) -> str:
    """An event's name and times for a message, each cut to a readable length."""

    def short(v: Any) -> str:
        text = repr(v)
        return text if len(text) <= 40 else text[:37] + "..."

    return f"{short(name)} with ts={short(ts)}, dur={short(dur)}"


def time_unit_ns(display_time_unit: Any) -> int:
    """ns per unit of ``ts``/``dur``: 1 when the document says
    ``"displayTimeUnit": "ns"``, else 1000 (µs, the Chrome trace format's
    unit, which Kineto writes; its ``"ms"`` is a display hint)."""
    return 1 if isinstance(display_time_unit, str) and display_time_unit.strip().lower() == "ns" else 1000


# --------------------------------------------------------------------------
# One file


@dataclass
class ParsedTrace:
    """The columns of one trace file, before they become an events table.

    ``columns`` are in file order (one entry per complete event kept):
    ``cat``/``name`` as codes into ``cats``/``names`` (first-seen order;
    categories in today's spelling, :func:`analyzer.ingest.schema.canonical_category`),
    ``pid``, ``tid``, ``stream``, ``ts_ns``, ``dur_ns``, ``correlation``,
    ``external_id``. ``sparse`` maps column -> {row: value} for the few
    rows that carry matmul shapes or collective details. ``meta`` holds the
    document's top-level ``distributedInfo``, ``deviceProperties`` (an
    older era's ``computeProperties`` under that name) and
    ``displayTimeUnit``. ``notes``: one sentence per oddity the parse
    coped with (events dropped for bad times, a ns time unit), reported as
    the file's warnings.
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
    notes: list[str] = field(default_factory=list)
    # Set by analyzer.cache.parse_and_store when its cache entry could not be written.
    cache_warning: str | None = None

    @property
    def rows(self) -> int:
        return len(self.columns["ts_ns"])


def parse_columns(path: Path, limits: ParseLimits | None = None) -> ParsedTrace:
    """Parse one Kineto trace file (``.json`` or ``.json.gz``) into columns.

    ``limits``: the bounds on what the file may cost (default
    :func:`analyzer.ingest.limits.current`). Raises TraceError (one line naming
    the file) for an empty file, a truncated or corrupt gzip stream,
    invalid JSON (with its line), JSON nested deeper than the decoder's
    limit, a file over a bound (naming the flag that raises it), a
    document without a ``traceEvents`` array, or one without valid timed
    events. Events with a missing or invalid ts/dur are dropped and counted
    in one note.
    """
    path = Path(path)
    limits = limits or current_limits()
    cols = _Columns()
    splitter = _Splitter(path, cols.add, limits.max_event_bytes)
    # The parse allocates millions of small acyclic objects; the cyclic GC
    # would traverse them again and again (measured: 2x slower). Nothing
    # here creates cycles, and refcounting frees each block.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for block in _read_blocks(path, limits=limits):
            splitter.feed(block)
        splitter.finish()
    except RecursionError:
        # msgspec (and orjson) stop at the interpreter's recursion limit;
        # Kineto's events nest a few levels, so this is a hostile or broken file.
        raise TraceError(
            path, f"JSON nested too deeply (over about {sys.getrecursionlimit()} levels, the decoder's limit)"
        ) from None
    except (TypeError, ValueError, OverflowError) as exc:
        # Valid JSON with values of a shape nothing expects.
        raise TraceError(path, f"unexpected values in traceEvents ({type(exc).__name__}: {str(exc)[:100]})") from None
    finally:
        if was_enabled:
            gc.enable()
    meta = {k: splitter.meta[k] for k in _META_KEYS if k in splitter.meta}
    if "deviceProperties" not in meta and "computeProperties" in meta:
        meta["deviceProperties"] = meta["computeProperties"]
    meta.pop("computeProperties", None)
    unit_ns = time_unit_ns(meta.get("displayTimeUnit"))
    columns = cols.finish(unit_ns)
    if cols.rows == 0:
        if cols.invalid:
            raise TraceError(
                path,
                f"no valid events: {'the 1 complete event has' if cols.invalid == 1 else f'all {cols.invalid} complete events have'}"
                f" a missing or invalid ts/dur (first: {cols.first_invalid})",
            )
        if cols.seen_events == 0:
            raise TraceError(path, "traceEvents is empty")
        raise TraceError(
            path,
            f"no timed events: none of the {cols.seen_events} events is a complete event (\"ph\": \"X\") with ts and dur",
        )
    notes = []
    if cols.invalid:
        notes.append(
            f"{cols.invalid} complete events dropped for a missing or invalid ts/dur (ts and dur must be "
            f"finite numbers >= 0 whose end fits int64 ns; first: {cols.first_invalid})"
        )
    if unit_ns == 1:
        notes.append('timestamps read as nanoseconds (the trace says "displayTimeUnit": "ns")')
    return ParsedTrace(
        path=path,
        columns=columns,
        cats=[canonical_category(c) for c in cols.cat_ids],
        names=list(cols.name_ids),
        sparse=cols.sparse,
        processes=cols.processes,
        threads=cols.threads,
        meta=meta,
        seen_events=cols.seen_events,
        dropped_no_time=cols.dropped_no_time,
        json_bytes=splitter.total,
        notes=notes,
    )
