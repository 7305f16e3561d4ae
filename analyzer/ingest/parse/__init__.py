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

The stages, each a module of this package that can be used and tested
alone:

=================== ========================================================
``read``            the file's bytes, decompressed, in blocks; bounds
``decode``          JSON text of an events array -> typed ``Event`` structs
``split``           a file's text cut at event boundaries (``Splitter``),
                    each piece given to ``decode`` as it arrives
``classify``        which events become rows, valid times, what a row keeps
``columns``         events -> typed numpy columns (``Columns``)
``units``           the time unit, decided from the raw columns
``__init__``        one file end to end: :func:`parse_columns` ->
                    :class:`ParsedTrace`; the rank of a file
=================== ========================================================
"""

from __future__ import annotations

import gc
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.errors import TraceError
from analyzer.ingest.limits import ParseLimits
from analyzer.ingest.limits import current as current_limits
from analyzer.ingest.parse.classify import MAX_TIME_NS, complete_events, raw_times
from analyzer.ingest.parse.columns import Columns, to_ns
from analyzer.ingest.parse.decode import META_KEYS, Event, decode_events
from analyzer.ingest.parse.read import BLOCK_BYTES, read_blocks
from analyzer.ingest.parse.split import Splitter
from analyzer.ingest.parse.units import UnitDecision, decide, gather, time_unit_ns
from analyzer.ingest.schema import canonical_category

__all__ = [
    "BLOCK_BYTES",
    "MAX_TIME_NS",
    "Columns",
    "Event",
    "ParsedTrace",
    "Splitter",
    "complete_events",
    "decode_events",
    "parse_columns",
    "rank_from_filename",
    "raw_times",
    "time_unit_ns",
    "to_ns",
]

_RANK_IN_NAME_RE = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?![0-9])", re.IGNORECASE)


# --------------------------------------------------------------------------
# Finding files and ranks


def rank_from_filename(name: str) -> int | None:
    """Rank written in a file name: ``rank-3``, ``rank3``, ``rank_3`` (any
    case, not inside a longer word), the last one when several; else None."""
    found = _RANK_IN_NAME_RE.findall(name)
    return int(found[-1]) if found else None


def resolve_rank(distributed_info: dict, path: Path, hint: int | None) -> tuple[int, str]:
    """(rank, where it came from): the trace's ``distributedInfo.rank``, else the file name, else ``hint``, else 0."""
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
    older era's ``computeProperties`` under that name), ``displayTimeUnit``
    and ``baseTimeNanoseconds``. ``notes``: one sentence per oddity the parse
    coped with (events dropped for bad times, a ns time unit), reported as
    the file's warnings. ``memory``: the ``[memory]`` instant events of a
    trace taken with ``profile_memory=True``, as int64 columns
    (:data:`analyzer.ingest.parse.columns.MEMORY_FIELDS`, in file order);
    empty without any.
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
    memory: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return len(self.columns["ts_ns"])


def _time_unit(cols: Columns, display_time_unit: Any) -> UnitDecision:
    """The unit of the raw times, from the columns before conversion
    (:mod:`analyzer.ingest.parse.units`): a few numpy passes over arrays."""
    kernel_cats = [i for c, i in cols.cat_ids.items() if canonical_category(c) == "kernel"]
    host_cats = [i for c, i in cols.cat_ids.items() if canonical_category(c) == "cpu_op"]
    steps = [i for n, i in cols.name_ids.items() if n.startswith("ProfilerStep#")]
    parts = cols.parts
    evidence = gather(parts["ts"], parts["dur"], parts["cat"], parts["name"], kernel_cats, host_cats, steps)
    return decide(display_time_unit, evidence)


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
    cols = Columns()
    splitter = Splitter(path, cols.add, limits.max_event_bytes)
    # The parse allocates millions of small acyclic objects; the cyclic GC
    # would traverse them again and again (measured: 2x slower). Nothing
    # here creates cycles, and refcounting frees each block.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for block in read_blocks(path, limits=limits):
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
    meta = {k: splitter.meta[k] for k in META_KEYS if k in splitter.meta}
    if "deviceProperties" not in meta and "computeProperties" in meta:
        meta["deviceProperties"] = meta["computeProperties"]
    meta.pop("computeProperties", None)
    unit = _time_unit(cols, meta.get("displayTimeUnit"))
    unit_ns = unit.unit_ns
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
            f'no timed events: none of the {cols.seen_events} events is a complete event ("ph": "X") with ts and dur',
        )
    notes = []
    if cols.invalid:
        notes.append(
            f"{cols.invalid} complete events dropped for a missing or invalid ts/dur (ts and dur must be "
            f"finite numbers >= 0 whose end fits int64 ns; first: {cols.first_invalid})"
        )
    if unit.note:
        notes.append(unit.note)
    memory = cols.memory_columns(unit_ns)
    if cols.memory_invalid:
        notes.append(f"{cols.memory_invalid} [memory] events dropped for a missing or invalid ts or allocator total")
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
        memory=memory,
    )
