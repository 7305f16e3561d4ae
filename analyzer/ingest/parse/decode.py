"""Stage 2 of reading a trace: JSON text -> typed event structs.

:func:`decode_events` turns one JSON array of events into :class:`Event`
structs; :class:`analyzer.ingest.parse.split.Splitter` cuts a file's text into
such arrays.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Optional, Union

import msgspec

# Typed decoding of events

# msgspec decodes each event straight into these structs: fields not named
# here (most of a kernel's args, call stacks, ...) are skipped without
# being built. Measured on the HTA samples: decoding is 2-3x faster than
# orjson's generic parse into dicts, and the whole load of
# trace_diff/control went from 2.7 s to 0.6 s. Everything is ``Any`` so odd
# value types never fail the decode; ``Input Dims``/``Input type`` stay raw
# JSON text (only the few rows that keep them are ever parsed).
_NO_RAW = msgspec.Raw()


class Args(msgspec.Struct):
    correlation: Any = -1
    external_id: Any = msgspec.field(default=-1, name="External id")
    # The TensorBoard-plugin era wrote "external id" on runtime and device
    # events (and "External id" on ops), some versions "Input dims".
    external_id_old: Any = msgspec.field(default=-1, name="external id")
    stream: Any = None
    # Autograd: an op's sequence number; a backward op carries its forward
    # op's number and the forward op's thread (analyzer.metrics.attribution).
    seq_num: Any = msgspec.field(default=-1, name="Sequence number")
    fwd_tid: Any = msgspec.field(default=-1, name="Fwd thread id")
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
    # cuda_sync "Stream Wait Event"/"Event Sync": the stream the awaited CUDA event was recorded on
    # and the correlation id of its cudaEventRecord call.
    wait_stream: Any = msgspec.field(default=None, name="wait_on_stream")
    wait_record_corr: Any = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")
    name: Any = None  # metadata events: process_name, thread_name
    labels: Any = None  # metadata events: process_labels
    # "[memory]" instant events (profile_memory=True): the allocator's totals after an allocation or free.
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    total_reserved: Any = msgspec.field(default=None, name="Total Reserved")
    nbytes: Any = msgspec.field(default=None, name="Bytes")
    device_type: Any = msgspec.field(default=None, name="Device Type")
    device_id: Any = msgspec.field(default=None, name="Device Id")


class Event(msgspec.Struct):
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
    args: Optional[Args] = None


class _Doc(msgspec.Struct):
    """The top level; ``traceEvents`` is decoded separately (see decode_events)."""

    traceEvents: msgspec.Raw = _NO_RAW
    distributedInfo: Any = None
    deviceProperties: Any = None
    computeProperties: Any = None  # the TensorBoard-plugin era's deviceProperties
    displayTimeUnit: Any = None
    baseTimeNanoseconds: Any = None  # the Unix time, ns, that event times count from (Kineto since 2023)


# Top-level keys kept from a document (see ParsedTrace.meta).
META_KEYS = ("distributedInfo", "deviceProperties", "computeProperties", "displayTimeUnit", "baseTimeNanoseconds")


NO_ARGS = Args()
_EVENTS = msgspec.json.Decoder(list[Event])
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
_ONE = msgspec.json.Decoder(Event)
DOC_DECODER = msgspec.json.Decoder(_Doc)


def decode_events(text: Any) -> list[Event]:
    """A JSON array of events; raises msgspec.DecodeError on bad syntax.

    Elements that are not objects are skipped and an ``args`` that is not
    an object is ignored (the only shapes the typed decode rejects).
    """
    try:
        return _EVENTS.decode(text)
    except msgspec.ValidationError:
        return [e for e in map(_lenient_event, _RAWS.decode(text)) if e is not None]


def _lenient_event(raw: msgspec.Raw) -> Event | None:
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
    return msgspec.convert(fixed, Event)


def json_error(exc: msgspec.DecodeError, length: int) -> tuple[str, int]:
    """(reason, byte position) of a msgspec syntax error."""
    text = str(exc)
    m = re.match(r"JSON is malformed: (.*) \(byte (\d+)\)$", text)
    if m:
        return m.group(1), int(m.group(2))
    if text == "Input data was truncated":
        return "the text ends early", length
    return text, length


JSON_TYPES = {
    ord("{"): "dict",
    ord("["): "list",
    ord('"'): "str",
    ord("t"): "bool",
    ord("f"): "bool",
    ord("n"): "null",
}
