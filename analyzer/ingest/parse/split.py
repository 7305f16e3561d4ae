"""Stage 2 of reading a trace, the streaming half: a file's text is cut at
event boundaries into blocks that :func:`analyzer.ingest.parse.decode.decode_events`
decodes one at a time (docs/loading.md, "Speed and memory")."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, NoReturn

import msgspec
import orjson

from analyzer.errors import TraceError
from analyzer.ingest.limits import current as current_limits
from analyzer.ingest.parse.decode import DOC_DECODER, JSON_TYPES, META_KEYS, decode_events, json_error
from analyzer.ingest.parse.read import MB, mib, over_bound

_TRACE_EVENTS_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*')


# Splitting the JSON text


class Splitter:
    """Turns the decompressed text of a Kineto trace into the top-level
    metadata and a sequence of event lists, holding at most a few blocks.

    Handles the object form ``{..., "traceEvents": [...], ...}`` (Kineto)
    and the bare-array form ``[...]`` of the Chrome trace format.

    In the body of the array the buffer is a bytearray whose first byte is
    a synthetic ``[``: a cut writes ``]`` over the separator after the
    block's last event and hands the decoder a memoryview, so the text is
    never copied to be parsed. ``on_events`` runs while that view is open
    (the events' raw ``Input Dims`` point into it) and must not keep them.

    ``path`` is the file the blocks are read from (analyzer.ingest.parse.read):
    an error's line number is counted by reading it again (``_newlines_before``).
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
            "body": f"an element of traceEvents longer than {mib(self.max_event_bytes)}",
            "head": f"more than {mib(self.max_event_bytes)} of JSON before traceEvents",
        }.get(self._state, f"a JSON document that cannot be read in parts, over {mib(self.max_event_bytes)}")
        # The buffer starts where the unfinished piece starts.
        raise over_bound(self.path, f"{what} (from line {self._newlines_before() + 1})", "max_event_bytes")

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
            reason, pos = json_error(exc, len(self._buf) - start)
            if reason != "the text ends early" and start + pos < len(self._buf):
                self._raise_json(reason, start + pos)
            return
        raise TraceError(self.path, f"not a Kineto trace: the JSON is a {type(value).__name__}, not an object")

    def _enter_body(self, offset: int) -> None:
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
            failure: tuple[str, int] | None = None
            with memoryview(buf) as whole, whole[: end + 1] as chunk:
                try:
                    events = decode_events(chunk)
                except msgspec.DecodeError as exc:
                    failure = json_error(exc, end + 1)
                else:
                    self.on_events(events)
                    del events
            if failure is not None:
                reason, pos = failure
                buf[end] = saved
                if pos < end:
                    # It failed before the cut: a real syntax error.
                    self._raise_json(reason, pos - self._lead)
                hi = end - 1
                continue
            consumed = next_start - 1  # keep one byte to become the new "["
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
        doc: bytes | bytearray
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
                events = decode_events(doc)
                self._buf = bytearray()
                self.on_events(events)
                return
            if first != b"{":
                obj = msgspec.json.decode(doc)  # raises for invalid text
                raise TraceError(self.path, f"not a Kineto trace: the JSON is a {type(obj).__name__}, not an object")
            top = DOC_DECODER.decode(doc)
        except msgspec.DecodeError as exc:
            reason, pos = json_error(exc, len(doc))
            self._raise_json(reason, pos - lead)
        raw = top.traceEvents
        if not len(raw):
            keys = ", ".join(list(orjson.loads(doc))[:6]) or "none"
            raise TraceError(self.path, f"no traceEvents array (top-level keys: {keys})")
        kind = JSON_TYPES.get(memoryview(raw)[0], "number")
        if kind != "list":
            raise TraceError(self.path, f"traceEvents is a {kind}, not an array")
        for key in META_KEYS:
            if getattr(top, key) is not None:
                self.meta[key] = getattr(top, key)
        events = decode_events(raw)
        del raw, top
        self._buf = bytearray()
        self.on_events(events)

    def _newlines_before(self) -> int:
        """Newlines in the text before ``_buf[_lead]`` (the text already consumed), for an error's line number.

        Counted when an error needs it, by reading the file again up to that offset: counting
        every consumed piece as it went cost 14 ms of a 54 MB parse, for messages that almost
        never come. The file is read as the parse read it (analyzer.ingest.parse.read).
        """
        if self._buf_pos == 0:
            return 0
        from analyzer.ingest.parse.read import read_blocks

        count = seen = 0
        for block in read_blocks(self.path):
            take = min(len(block), self._buf_pos - seen)
            count += block.count(b"\n", 0, take)
            seen += take
            if seen >= self._buf_pos:
                break
        return count

    def _raise_json(self, reason: str, rel_pos: int) -> NoReturn:
        """One line: where the JSON breaks (line, column) and why.

        ``rel_pos`` is a byte offset into the real text held in the buffer.
        """
        buf, lead = self._buf, self._lead
        rel_pos = max(0, min(rel_pos, len(buf) - lead))
        at = lead + rel_pos
        line = self._newlines_before() + buf.count(b"\n", lead, at) + 1
        line_start = buf.rfind(b"\n", lead, at)
        col = None if line_start < 0 and self._buf_pos else at - (line_start + 1 if line_start >= 0 else lead) + 1
        where = f"line {line}" + (f", column {col}" if col is not None else "")
        if reason == "the text ends early" or at >= len(buf):
            raise TraceError(
                self.path,
                f"invalid JSON: the text ends early, after {self.total / MB:.1f} MB ({where}; file cut off?)",
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
