"""Stage 4 of reading a trace: decoded events -> typed columns.

:class:`Columns` takes one block of :class:`analyzer.ingest.parse.decode.Event`
at a time, applies the row rules of :mod:`analyzer.ingest.parse.classify`, and
keeps numpy arrays (times in the trace's unit until :meth:`Columns.finish`
converts them to integer ns, names as integer codes) plus the sparse
columns of the few rows that carry shapes or collective details.
"""

from __future__ import annotations

import re
from operator import attrgetter
from typing import Any, TypeGuard

import numpy as np
import orjson

from analyzer.ingest.parse.classify import (
    MAX_TIME_NS,
    complete_events,
    drop_trace_span,
    on_gpu_timeline,
    text_fields,
    valid_times,
    wants_args,
)
from analyzer.ingest.parse.decode import NO_ARGS, Args, Event
from analyzer.ingest.schema import CONCRETE_OPS, text_id

_PID, _TID = attrgetter("pid"), attrgetter("tid")
_CORRELATION, _EXTERNAL_ID = attrgetter("correlation"), attrgetter("external_id")
_SEQ_NUM, _FWD_TID = attrgetter("seq_num"), attrgetter("fwd_tid")
_STREAM_TID_RE = re.compile(r"stream\s*(\d+)", re.IGNORECASE)
# Annotation prefixes PyTorch writes around a collective's host-side work.
_COLL_ANNOTATION_PREFIXES = ("gloo:", "nccl:")


class Columns:
    """Accumulates typed columns from lists of decoded events.

    Per block, one Python loop picks the fields every row needs into lists;
    the lists become numpy arrays at the end of the block, so a block's
    objects (and their duplicate name strings) die with the block.
    """

    def __init__(self) -> None:
        self.cat_ids: dict[str, int] = {}
        self.name_ids: dict[str, int] = {}
        self.parts: dict[str, list[np.ndarray]] = {
            k: []
            for k in (
                "cat",
                "name",
                "pid",
                "tid",
                "stream",
                "ts",
                "dur",
                "correlation",
                "external_id",
                "seq_num",
                "fwd_tid",
            )
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
                "wait_stream",
                "record_corr",
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
        self._canonical_texts: dict[bytes, tuple[str, Any]] = {}  # raw argument text -> (compact text, value)
        self._gpu_cat: dict[str, bool] = {}
        # "[memory]" instant events as read: ts (trace unit), then the allocator fields (memory_columns checks them).
        self.memory_rows: list[tuple] = []
        self.memory_invalid = 0

    def add(self, events: list[Event]) -> None:
        """Append the rows of one block of decoded events.

        The row rules are the functions of :mod:`analyzer.ingest.parse.classify`:
        :func:`complete_events` (which events become rows),
        :func:`valid_times` (ts/dur checked, bad rows dropped and counted),
        :func:`text_fields`, :func:`drop_trace_span`, then the columns.
        Column at a time (comprehensions and C-level attribute getters)
        rather than one Python loop appending to nine lists per event: 0.45
        -> 0.33 s for trace_diff/control. The rare shapes (bad times, null
        or non-text names) take slower exact paths.
        """
        self.seen_events += len(events)
        complete = complete_events(events, self._metadata)
        if len(complete) != len(events):
            self._memory_events(events)
        timed = valid_times(complete)
        if timed.invalid:
            self.dropped_no_time += timed.no_time
            self._count_invalid(timed.invalid, timed.first_invalid or "")
        xs = timed.events
        cats, names = text_fields(xs)
        xs, cats, names, ts, dur = drop_trace_span(xs, cats, names, timed.ts, timed.dur)
        del timed
        if not cats:
            return
        no_args = NO_ARGS
        args = [e.args or no_args for e in xs]
        on_gpu = on_gpu_timeline(cats, self._gpu_cat)
        streams = [(e.tid if a.stream is None else a.stream) if on_gpu[c] else -1 for e, a, c in zip(xs, args, cats)]
        wants = wants_args(names, self._wants_args)
        row0 = self.rows
        # Rows _special has something to keep from. An op of a wanted name without shapes, types or
        # message fields (a trace taken without record_shapes: df_index_resolver's 24k) is skipped here,
        # not in a call that finds nothing (about 15 ms of a 54 MB parse).
        special = [
            (row0 + i, n, a)
            for i, (n, a) in enumerate(zip(names, args))
            if a.collective is not None
            or a.in_nelems is not None
            or a.wait_record_corr is not None
            or (
                wants[n]
                and (
                    len(a.input_dims)
                    or len(a.input_dims_old)
                    or len(a.input_types)
                    or len(a.concrete_inputs)
                    or a.out_nelems is not None
                    or a.group_size is not None
                    or n.startswith(_COLL_ANNOTATION_PREFIXES)
                )
            )
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
        self.parts["seq_num"].append(_ids(list(map(_SEQ_NUM, args))))
        self.parts["fwd_tid"].append(_ids(list(map(_FWD_TID, args))))
        for row, name, a in special:
            self._special(row, name, a)

    def _memory_events(self, events: list[Event]) -> None:
        """Keep the ``[memory]`` instant events' raw ts and allocator fields (profile_memory=True);
        :meth:`memory_columns` checks and converts them."""
        # A comprehension picks the few memory events (a Python loop over every event cost ~40 % more).
        self.memory_rows.extend(
            [
                (e.ts, a.total_allocated, a.total_reserved, a.nbytes, a.device_type, a.device_id)
                for e in events
                if e.name == "[memory]" and e.ph == "i"
                for a in (e.args or NO_ARGS,)
            ]
        )

    def memory_columns(self, unit_ns: int) -> dict[str, np.ndarray]:
        """The memory events as columns (MEMORY_FIELDS; ``ts_ns`` in ns), in file order; empty dict without any.

        An event whose ts or totals are not numbers is dropped and counted
        (:attr:`memory_invalid`); ``Bytes`` (negative for a free) and the
        device default to 0 and -1 when absent."""
        rows = self.memory_rows
        if not rows:
            return {}
        # Column at a time when every value is as PyTorch writes it (integers; a float or integer ts, all
        # valid): checking df_index_resolver's 28k memory events one by one made its parse 0.37 s instead
        # of 0.34. Anything else takes the exact row-by-row path.
        raw = _plain_memory_columns(rows)
        if raw is None:
            kept = []
            for ts, alloc, resv, *rest in rows:
                if not (_is_number(ts) and ts >= 0 and _is_number(alloc) and _is_number(resv)):
                    self.memory_invalid += 1
                    continue
                kept.append((ts, int(alloc), int(resv), *(_int_or(v, d) for v, d in zip(rest, _MEMORY_DEFAULTS[3:]))))
            if not kept:
                return {}
            raw = [np.asarray([r[0] for r in kept])] + [
                np.array([r[i] for r in kept], dtype=np.int64) for i in range(1, 6)
            ]
        ts_ns, over = to_ns(raw[0], unit_ns)
        cols = {"ts_ns": ts_ns.astype(np.int64)}
        for name, values in zip(MEMORY_FIELDS[1:], raw[1:]):
            cols[name] = values
        if over is not None:
            cols = {k: v[~over] for k, v in cols.items()}
            self.memory_invalid += int(over.sum())
        return cols

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
            converted = [to_ns(part, unit_ns) for part in self.parts.pop(key)]
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
                col: {int(new_row[row]): v for row, v in values.items() if keep[row]}
                for col, values in self.sparse.items()
            }
            self.rows = int(keep.sum())
        return columns

    def name_of(self, code: int) -> str:
        return list(self.name_ids)[code]

    def _metadata(self, e: Event) -> None:
        a = e.args or NO_ARGS
        if e.name == "process_name":
            self.processes.setdefault(text_id(e.pid), {})["name"] = "" if a.name is None else str(a.name)
        elif e.name == "process_labels":
            self.processes.setdefault(text_id(e.pid), {})["labels"] = "" if a.labels is None else str(a.labels)
        elif e.name == "thread_name":
            self.threads[(text_id(e.pid), text_id(e.tid))] = "" if a.name is None else str(a.name)

    def _special(self, row: int, name: str, a: Args) -> None:
        sp = self.sparse
        if a.wait_record_corr is not None:  # a cuda_sync event waiting on a recorded CUDA event
            sp["record_corr"][row] = _int_or_default(a.wait_record_corr)
            sp["wait_stream"][row] = _int_or_default(a.wait_stream)
            return
        # Copy the raw text out now: it points into the parse buffer.
        raw_dims = a.input_dims if len(a.input_dims) else a.input_dims_old
        dims_text, dims = self._canonical(raw_dims)
        types_text, types = self._canonical(a.input_types)
        if self._wants_args[name]:  # name in SHAPE_OPS or a host collective (classify.wants_args)
            if dims_text is not None:
                sp["input_dims"][row] = dims_text
            if types_text is not None:
                sp["input_types"][row] = types_text
            if name in CONCRETE_OPS and len(a.concrete_inputs):
                sp["concrete_inputs"][row] = self._canonical(a.concrete_inputs)[0]
        if (
            a.collective is None
            and a.in_nelems is None
            and a.out_nelems is None
            and a.group_size is None
            and not name.startswith(_COLL_ANNOTATION_PREFIXES)
        ):
            return  # an op's shapes only (nearly every call): no message fields to keep
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

    def _canonical(self, raw: Any) -> tuple[str | None, Any]:
        """A raw JSON argument as compact text (orjson's: the shape tables' keys) and its value; (None, None)
        when absent. Once per distinct text: a trace repeats its layers' shapes every step (control's
        19k shape arguments have a few hundred texts), and the value is only read, never changed."""
        if not len(raw):
            return None, None
        key = bytes(raw)
        hit = self._canonical_texts.get(key)
        if hit is None:
            value = orjson.loads(key)
            hit = self._canonical_texts[key] = (orjson.dumps(value).decode(), value)
        return hit


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


# Columns of the memory events (ParsedTrace.memory), all int64.
MEMORY_FIELDS = ("ts_ns", "total_allocated", "total_reserved", "bytes", "device_type", "device_id")


# Per field of a memory row (ts, totals, Bytes, Device Type, Device Id): the value when absent; None: required.
_MEMORY_DEFAULTS = (None, None, None, 0, -1, -1)


def _plain_memory_columns(rows: list[tuple]) -> list[np.ndarray] | None:
    """The memory rows' six columns when every row is valid and plain (ts an int or a float, finite and >= 0;
    the totals ints; bytes and device ints or absent), else None (the caller checks row by row)."""
    fields = list(zip(*rows))
    ts_types = set(map(type, fields[0]))
    if not ts_types <= {int, float}:
        return None
    try:
        ts = np.asarray(fields[0])
        if ts.dtype.kind not in "if" or (ts.dtype.kind == "f" and not np.isfinite(ts).all()) or (ts < 0).any():
            return None
        out = [ts]
        for values, default in zip(fields[1:], _MEMORY_DEFAULTS[1:]):
            types = set(map(type, values))
            if types <= {int}:
                out.append(np.array(values, dtype=np.int64))
            elif default is not None and types <= {int, type(None)}:
                out.append(np.array([default if v is None else v for v in values], dtype=np.int64))
            else:
                return None
    except OverflowError:  # an integer beyond int64: the row-by-row path says what it does with it
        return None
    return out


def _is_number(v: object) -> TypeGuard[int | float]:
    return (type(v) is int or type(v) is float) and v == v and abs(v) != float("inf")


def _int_or(v: object, default: int) -> int:
    return int(v) if _is_number(v) else default


def _int_or_default(v: object) -> int:
    # A decoded JSON value: a list, an object or null has no integer value.
    if not isinstance(v, (int, float, str)):
        return -1
    try:
        return int(v)
    except (ValueError, OverflowError):
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


def to_ns(raw: np.ndarray, unit_ns: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Times in the trace's unit -> (int64 ns, mask of values over
    MAX_TIME_NS after conversion, or None when there are none).

    Integers are scaled exactly. Floats in µs are split into whole and
    fractional µs so the fraction is rounded to the ns without the float64
    product ``ts * 1000`` losing the low digits of large timestamps; floats
    in ns are rounded to the ns.
    """
    too_large = raw > MAX_TIME_NS // unit_ns
    over = too_large if too_large.any() else None
    if over is not None:
        raw = np.where(over, 0, raw)
    if raw.dtype.kind in "iu":
        return raw.astype(np.int64) * unit_ns, over
    if unit_ns == 1:
        return np.rint(raw).astype(np.int64), over
    whole = np.floor(raw)
    return whole.astype(np.int64) * unit_ns + np.rint((raw - whole) * unit_ns).astype(np.int64), over


def _join(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)
