"""The per-rank map of :func:`analyzer.api.analyze`: one rank's files in, a compact summary out.

A *unit* is the trace files of one rank (one file; several profiler
windows of one rank in a reftrain run). :func:`map_unit` reads each file
(its parse-cache entry when valid, else the JSON, storing the entry),
builds the rank's tables, computes every per-rank figure and returns a
:class:`UnitResult`: per file the facts the run-level warnings need
(:class:`FileFacts`), and one :class:`RankPart`, everything the reduce in
:mod:`analyzer.api` needs from the rank. Both are small and picklable (a
few KB to a few hundred KB, against tens to hundreds of MB for the events
table), so a unit can run in a worker process or a Ray task
(:mod:`analyzer.engines`) and the driver never holds a rank's events.

What needs every rank is left to the reduce: the waits at collectives (the
breakdown's ``collective_wait`` part, :func:`analyzer.metrics.breakdown.with_waits`),
arrival matching and stragglers, MFU and the run tables. docs/loading.md
tells the whole flow.

This module sits below the execution: it imports ingest and metrics, and is
imported by :mod:`analyzer.execute`, :mod:`analyzer.engines` and the caches
(:mod:`analyzer.rankcache`, :mod:`analyzer.runcache`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from analyzer.errors import TraceError
from analyzer.ingest import cache as trace_cache
from analyzer.ingest.jobs import parse_file
from analyzer.ingest.load import FileFacts, rank_trace
from analyzer.ingest.locate import trace_window
from analyzer.ingest.parse import ParsedTrace
from analyzer.ingest.tables import RankTrace
from analyzer.metrics.attribution import AttributionTables, rank_attribution
from analyzer.metrics.breakdown import BreakdownPieces, Source, breakdown_pieces, source_of
from analyzer.metrics.collectives import collective_table as rank_collective_table
from analyzer.metrics.critical_path import critical_paths
from analyzer.metrics.critical_summary import StepCriticalPath, step_critical_path
from analyzer.metrics.idle import IdleTables, rank_idle
from analyzer.metrics.kernels import top_kernels
from analyzer.metrics.memory import RankMemory, rank_memory
from analyzer.metrics.mfu import RankFlops, device_name_of, rank_flops_from_shapes
from analyzer.metrics.overlap import OverlapResult, overlap, span_parts_ns
from analyzer.metrics.stragglers import rank_arrivals, rank_collective_spans
from analyzer.metrics.timeline import TimelineGrid, timeline_grid
from analyzer.metrics.windows import check_windows
from analyzer.metrics.workload import rank_workload

# Bump when what a RankPart holds or how it is computed changes: it keys the stored summaries (analyzer/rankcache.py).
MAP_VERSION = 14
TOP_KERNELS_PER_RANK = 50


@dataclass(frozen=True)
class UnitFile:
    """One file of a unit: its cache entry (None: uncached) and whether that entry exists."""

    path: Path
    entry: Path | None = None
    hit: bool = False


@dataclass(frozen=True)
class MapUnit:
    """The files of one rank, in profiler-window order (one file for a trace folder), and
    whether its summary computes each profiled step's critical path (asked for: it costs about
    as much as every other per-rank figure together)."""

    files: tuple[UnitFile, ...]
    critical_path: bool = False


@dataclass
class RankPart:
    """Everything the reduce needs from one rank (see the module docstring).

    ``trace``: the name of the rank's (last) file; ``window_warnings`` and
    ``window_flagged`` (``step``, ``window_flagged``) from
    :func:`analyzer.metrics.windows.check_windows`; ``pieces`` the step
    breakdown before the waits; ``overlap``, ``span`` (the whole-trace GPU
    timeline parts and span, ns), ``kernels`` (top
    :data:`TOP_KERNELS_PER_RANK`), ``device_name`` and ``flops`` (None
    without usable step windows) as the metrics modules return them;
    ``spans`` and ``arrivals`` the rank's collective records before
    matching across ranks; ``comm_table`` one row per communication kernel
    (kind, message size, achieved bandwidth:
    :func:`analyzer.metrics.collectives.collective_table`), for the
    suggestions' communication diagnosis; ``attribution`` the rank's
    op, module and annotation tables (:func:`analyzer.metrics.attribution.rank_attribution`,
    aggregated per op name, not per kernel, so a summary stays small);
    ``timeline`` one fine time grid per profiler window
    (:func:`analyzer.metrics.timeline.timeline_grid`, at most
    :data:`~analyzer.metrics.timeline.FINE_BINS` bins), from which the
    dashboard's timeline bins every rank without its events; ``idle`` its
    idle causes, launch statistics, host syncs and pageable copies
    (:func:`analyzer.metrics.idle.rank_idle`); ``critical_paths`` the
    critical path of each profiled step in brief
    (:func:`analyzer.metrics.critical_summary.step_critical_path`), None when
    not asked for (:attr:`MapUnit.critical_path`), and
    ``critical_path_warnings`` the line saying why they could not be computed.
    """

    rank: int
    trace: str
    source: Source
    window_warnings: list[str]
    pieces: BreakdownPieces
    window_flagged: pd.DataFrame
    overlap: OverlapResult
    span: tuple[dict[str, int], int]
    kernels: pd.DataFrame
    device_name: str | None
    flops: RankFlops | None
    spans: pd.DataFrame | None
    arrivals: tuple[pd.DataFrame | None, str]
    comm_table: pd.DataFrame | None = None
    attribution: AttributionTables | None = None
    # Peak memory per step, a timeline and peaks per device from [memory] events (None without them).
    memory: RankMemory | None = None
    idle: IdleTables | None = None
    timeline: list[TimelineGrid] = field(default_factory=list)
    # Tokens from the input shapes and activation recompute per step window (analyzer.metrics.workload).
    workload: pd.DataFrame | None = None
    critical_paths: list[StepCriticalPath] | None = None
    critical_path_warnings: list[str] = field(default_factory=list)


@dataclass
class UnitResult:
    """:func:`map_unit`'s answer. ``outcomes`` per file, in the unit's order:
    its facts or its error, and the cache warnings met on the way. ``part``
    is None when no file loaded, or when the files turned out not to be one
    rank (the caller then regroups them: :func:`analyzer.execute.rank_parts`)."""

    outcomes: list[tuple[Path, FileFacts | TraceError, list[str]]] = field(default_factory=list)
    part: RankPart | None = None


def read_file(f: UnitFile, parsed: ParsedTrace | TraceError | None = None) -> tuple[RankTrace | TraceError, list[str]]:
    """One file's tables: ``parsed`` when given (parsing already done), else
    its cache entry when ``f.hit``, else the JSON (storing the entry).
    Returns (the RankTrace or the file's TraceError, warnings)."""
    warnings: list[str] = []
    if isinstance(parsed, TraceError):
        return parsed, warnings
    try:
        if parsed is None and f.hit and f.entry is not None:
            try:
                parsed = trace_cache.read_entry(f.entry, f.path)
            except trace_cache.CacheEntryError as exc:
                warnings.append(str(exc))
        if parsed is None:
            parsed = parse_file(f.path, f.entry)
    except TraceError as err:
        return err, warnings
    if parsed.cache_warning:
        warnings.append(parsed.cache_warning)
    try:
        return rank_trace(parsed), warnings
    except TraceError as err:
        return err, warnings
    except Exception as exc:  # noqa: BLE001 - a bug of ours on odd input: still one line for one file
        return TraceError(f.path, f"could not be tabled ({type(exc).__name__}: {str(exc)[:200]})"), warnings


def map_unit(unit: MapUnit, parsed: dict[Path, ParsedTrace | TraceError] | None = None) -> UnitResult:
    """Read a unit's files and summarize its rank (the map; module docstring).

    ``parsed``: files already parsed elsewhere (the CLI's early parse jobs).
    Never raises for a bad file: it becomes that file's TraceError.
    """
    out = UnitResult()
    traces: list[RankTrace] = []
    for f in unit.files:
        rt, warnings = read_file(f, (parsed or {}).get(f.path))
        out.outcomes.append((f.path, rt if isinstance(rt, TraceError) else FileFacts.of(rt), warnings))
        if isinstance(rt, RankTrace):
            traces.append(rt)
    if traces and len({rt.rank for rt in traces}) == 1:
        part = summarize_rank(merge_windows(traces), critical_path=unit.critical_path)
        # One grid per window, each on its own span (windows of a run lie far apart in time).
        grids = [timeline_grid(rt.events, rt.steps, part.source, trace_window(rt.path), rt.path.name) for rt in traces]
        part.timeline = [g for g in grids if g is not None]
        out.part = part
    return out


def merge_windows(rts: list[RankTrace]) -> RankTrace:
    """One RankTrace from several profiler windows of the same rank (disjoint in time)."""
    if len(rts) == 1:
        return rts[0]
    events = pd.concat([rt.events for rt in rts], ignore_index=True)
    for col in ("cat", "name", "coll_name", "msg_dtype", "pg_name"):
        events[col] = events[col].astype("category")
    steps = pd.concat([rt.steps for rt in rts], ignore_index=True).sort_values("step").reset_index(drop=True)
    last = rts[-1]
    return RankTrace(
        rank=last.rank,
        path=last.path,
        events=events,
        steps=steps,
        distributed_info=last.distributed_info,
        device_properties=last.device_properties,
        has_device=any(rt.has_device for rt in rts),
        memory=pd.concat([rt.memory for rt in rts], ignore_index=True)
        .sort_values("ts_ns", kind="stable")
        .reset_index(drop=True),
    )


def summarize_rank(rt: RankTrace, critical_path: bool = False) -> RankPart:
    """Every per-rank figure of one rank's tables (the formulas are the metrics modules');
    the critical paths of its profiled steps only with ``critical_path``."""
    rank, events = rt.rank, rt.events
    source = source_of(events)
    # Step windows clipped or dropped to fit the trace (analyzer.metrics.windows); flagged ones feed no rule.
    checked = check_windows(events, rt.steps, rank)
    windows = checked.steps[["step", "start_ns", "end_ns"]]
    paths, path_warnings = rank_critical_paths(rt) if critical_path else (None, [])
    return RankPart(
        rank=rank,
        trace=rt.path.name,
        source=source,
        window_warnings=list(checked.warnings),
        pieces=breakdown_pieces(events, windows, source),
        window_flagged=checked.steps[["step", "flagged"]].rename(columns={"flagged": "window_flagged"}),
        overlap=overlap(events, windows),
        span=span_parts_ns(events),
        kernels=top_kernels(events, windows, rank, TOP_KERNELS_PER_RANK),
        device_name=device_name_of(events, rt.device_properties) if source == "device" else None,
        flops=rank_flops_from_shapes(rank, events, windows) if not windows.empty else None,
        spans=rank_collective_spans(rank, events),
        arrivals=rank_arrivals(rank, events, rt.steps),
        comm_table=rank_collective_table(events),
        attribution=rank_attribution(events, windows),
        memory=rank_memory(rt.memory, windows),
        idle=rank_idle(events, windows),
        workload=rank_workload(events, windows),
        critical_paths=paths,
        critical_path_warnings=path_warnings,
    )


def without_critical_paths(result: UnitResult) -> UnitResult:
    """A summary computed with critical paths, as one computed without them (the same otherwise)."""
    if result.part is not None:
        result.part = replace(result.part, critical_paths=None, critical_path_warnings=[])
    return result


def rank_critical_paths(rt: RankTrace) -> tuple[list[StepCriticalPath], list[str]]:
    """The brief critical path of each profiled step, and a warning when they could not be computed.

    The dependency graph is built from every kind of trace the loader reads;
    a trace it cannot make a graph of loses its critical paths (withheld,
    and said in one warning line), not the rest of its rank's figures.
    """
    try:
        return [step_critical_path(cp) for cp in critical_paths(rt)], []
    except Exception as exc:  # noqa: BLE001 - withheld and named in a warning; the other figures stand
        return [], [f"{rt.path.name}: critical path not computed ({type(exc).__name__}: {str(exc)[:200]})"]
