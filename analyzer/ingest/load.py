"""Load PyTorch profiler (Kineto) traces into the columnar tables of
:mod:`analyzer.ingest.tables`, one :class:`RankTrace` per rank.

:mod:`analyzer.ingest.parse` reads a file into typed columns (streaming, msgspec;
docs/loading.md has the full story); this module turns them into the
events table (rows sorted by start, names categoricals, kinds classified),
and :func:`load_traces` handles many files: ranks parsed in parallel worker
processes, and the parsed columns kept in a cache (:mod:`analyzer.ingest.cache`,
written by the parse workers), so a second load reads a few MB of numpy
arrays instead of re-parsing JSON.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence, TypeVar

import numpy as np
import pandas as pd

from analyzer.ingest import cache as trace_cache
from analyzer.errors import AnalyzerError, TraceError
from analyzer.ingest.jobs import ParseJobs, parse_file, usable_cpus
from analyzer.ingest.locate import capture_folder, find_trace_files, scan_trace_files  # noqa: F401 - find_trace_files is part of this module's API
from analyzer.ingest.graph_capture import (
    SPLICED_THREAD_NAME,
    SPLICED_TID,
    load_captures,
    replay_kernels,
    splice_replays,
    uncovered_replays_note,
)
from analyzer.ingest.strays import stray_mask
from analyzer.ingest.parse import (  # noqa: F401 - rank_from_filename is part of this module's API
    ParsedTrace,
    resolve_rank,
    parse_columns,
    rank_from_filename,
)
from analyzer.ingest.tables import (
    COLUMNS,
    DEVICE_KINDS,
    KINDS,
    RankTrace,
    classify,
    empty_events,
    empty_processes,
    empty_threads,
    memory_table,
    steps_from_events,
)

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


@dataclass
class FileFacts:
    """What the set-level warnings (:func:`assemble`) need from one loaded
    file, without its events: the per-rank map (analyzer.rankmap) returns
    these from its workers."""

    path: Path
    rank: int
    rank_source: str
    notes: list[str]
    steps: pd.DataFrame  # step, start_ns, end_ns
    world_size: int | None
    # Which run the file belongs to (:func:`_check_one_run`): RankTrace's properties of the same names.
    device_kind: str = "CPU-only"
    job: dict[str, str] = field(default_factory=dict)
    first_ns: int | None = None
    last_ns: int | None = None

    @classmethod
    def of(cls, rt: RankTrace) -> FileFacts:
        return cls(
            rt.path,
            rt.rank,
            rt.rank_source,
            list(rt.notes),
            rt.steps,
            rt.world_size,
            rt.device_kind,
            rt.job,
            rt.first_ns,
            rt.last_ns,
        )


_Loaded = TypeVar("_Loaded", RankTrace, FileFacts)


# --------------------------------------------------------------------------
# One file


def parse_trace(path: Path, rank: int | None = None) -> RankTrace:
    """Parse one Kineto trace file without touching the cache.

    See :func:`load_trace`; this is the uncached work it does.
    """
    return rank_trace(parse_columns(path), rank)


def rank_trace(parsed: ParsedTrace, rank: int | None = None) -> RankTrace:
    """The RankTrace of a parsed file (rank resolved as :func:`load_trace` says)."""
    dist = parsed.meta.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    props = parsed.meta.get("deviceProperties")
    props = props if isinstance(props, list) else []
    resolved, source = resolve_rank(dist, parsed.path, rank)
    events, notes = _build_events(parsed, resolved)
    threads = _threads_frame(parsed.threads)
    captures = capture_folder(parsed.path)
    if captures is not None:
        events, threads = _with_captured_ops(events, threads, captures, notes)
    else:
        replayed, n_launches = replay_kernels(events)
        if len(replayed):
            notes.append(
                uncovered_replays_note(
                    events,
                    replayed,
                    n_launches,
                    "and no capture traces beside the trace (capture_traces/ with execution_details.json)",
                )
            )
    return RankTrace(
        rank=resolved,
        path=parsed.path,
        events=events,
        steps=steps_from_events(events),
        distributed_info=dist,
        device_properties=props,
        has_device=bool(events["kind"].isin(DEVICE_KINDS).any()),
        rank_source=source,
        processes=_processes_frame(parsed.processes),
        threads=threads,
        json_bytes=parsed.json_bytes,
        notes=notes,
        memory=memory_table(parsed.memory),
        clock_origin_ns=_clock_origin_ns(parsed.meta.get("baseTimeNanoseconds")),
    )


def _clock_origin_ns(value: object) -> int:
    """A trace's ``baseTimeNanoseconds`` as an int (Kineto writes a number; 0 when absent or not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return 0
    try:
        return int(value)
    except ValueError:
        return 0


def _with_captured_ops(
    events: pd.DataFrame, threads: pd.DataFrame, folder: Path, notes: list[str]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Graph replays linked to the ops of the capture traces in ``folder``
    (:mod:`analyzer.ingest.graph_capture`); the notes go to ``notes``."""
    graphs, capture_notes = load_captures(folder, parse_trace)
    notes.extend(capture_notes)
    spliced, splice_notes = splice_replays(events, graphs)
    notes.extend(splice_notes)
    if spliced is not events:
        pids = sorted(set(spliced.loc[spliced["tid"] == SPLICED_TID, "pid"].tolist()))
        extra = pd.DataFrame(
            {
                "pid": np.array(pids, dtype=np.int64),
                "tid": np.full(len(pids), SPLICED_TID, dtype=np.int64),
                "name": pd.Series([SPLICED_THREAD_NAME] * len(pids), dtype=object),
            }
        )
        threads = pd.concat([threads, extra], ignore_index=True)
    return spliced, threads


def _build_events(parsed: ParsedTrace, rank: int) -> tuple[pd.DataFrame, list[str]]:
    """The events table from the parsed columns: rows sorted by start,
    negative durations dropped. Column by column, dropping the parsed
    arrays as it goes, so the peak holds about one extra column."""
    parts = parsed.columns
    notes = []
    notes.extend(parsed.notes)  # the parser's (events dropped for a missing or invalid ts/dur, ...)
    ts = parts.pop("ts_ns")
    dur = parts.pop("dur_ns")
    keep = dur >= 0
    if not keep.all():
        notes.append(f"{int((~keep).sum())} events with a negative duration were dropped")
    # Stable sort by start: ties keep file order.
    order = np.flatnonzero(keep)
    order = order[np.argsort(ts[order], kind="stable")]
    start = ts[order]
    end = start + dur[order]
    stray = stray_mask(start, end)
    if stray is not None:
        first = order[np.flatnonzero(stray)[0]]
        notes.append(
            f"{int(stray.sum())} events dropped whose times lie far outside the rest of the rank's events "
            f"(over max(10x the span of the middle 90 % of starts, 60 s) away; first: "
            f"{parsed.names[parts['name'][first]]!r} at ts {ts[first] / 1e9:.6g} s, "
            f"the median start being {np.median(start) / 1e9:.6g} s)"
        )
        order, start, end = order[~stray], start[~stray], end[~stray]
    n = len(order)
    del ts, dur

    def column(key: str) -> np.ndarray:
        return parts.pop(key)[order]

    lower_code, cat_list = _lower_categories(parsed.cats)
    name_list = parsed.names
    cat_code = lower_code[column("cat")]
    name_code = column("name")
    frame = {
        "rank": np.full(n, rank, dtype=np.int32),
        "cat": _compact_categorical(cat_code, cat_list),
        "name": _compact_categorical(name_code, name_list),
        "kind": pd.Categorical.from_codes(
            _kind_codes(cat_list, cat_code, name_list, name_code), categories=pd.Index(KINDS)
        ),
    }
    del cat_code, name_code
    for key in ("pid", "tid", "stream"):
        frame[key] = column(key)
    frame["start_ns"], frame["end_ns"] = start, end
    for key in ("correlation", "external_id", "seq_num", "fwd_tid"):
        frame[key] = column(key)
    # Sparse columns: row numbers of the file order -> positions in the table.
    position = np.full(len(keep), -1, dtype=np.int64)
    position[order] = np.arange(n)

    def scatter(col: str, values: np.ndarray, given: np.ndarray) -> np.ndarray:
        """``values`` with the sparse column's entries (``given``, in its row order) at their table positions."""
        sparse = parsed.sparse[col]
        pos = position[np.fromiter(sparse, dtype=np.int64, count=len(sparse))]
        kept = pos >= 0
        values[pos[kept]] = given[kept]
        return values

    for col in ("input_dims", "input_types", "concrete_inputs"):
        given = np.empty(len(parsed.sparse[col]), dtype=object)
        given[:] = list(parsed.sparse[col].values())
        # An explicit object Series: pandas 3 would infer its str dtype.
        frame[col] = pd.Series(scatter(col, np.full(n, None, dtype=object), given), dtype=object, copy=False)
    for col in ("msg_in_nelems", "msg_out_nelems", "group_size", "wait_stream", "record_corr"):
        given = np.fromiter(parsed.sparse[col].values(), dtype=np.int64, count=len(parsed.sparse[col]))
        frame[col] = scatter(col, np.full(n, -1, dtype=np.int64), given)
    for col in ("coll_name", "msg_dtype", "pg_name"):
        cats = sorted(set(parsed.sparse[col].values()))
        index = {c: i for i, c in enumerate(cats)}
        given = np.fromiter(
            (index[v] for v in parsed.sparse[col].values()), dtype=np.int32, count=len(parsed.sparse[col])
        )
        codes = scatter(col, np.full(n, -1, dtype=np.int32), given)
        frame[col] = pd.Categorical.from_codes(codes, categories=pd.Index(cats, dtype="str"))
    events = pd.DataFrame({c: frame[c] for c in COLUMNS}, copy=False)
    return events, notes


def _lower_categories(cats: list[str]) -> tuple[np.ndarray, list[str]]:
    """Lower-case categories; two spellings of one category merge."""
    lowered: dict[str, int] = {}
    remap = np.empty(len(cats), dtype=np.int32)
    for i, raw in enumerate(cats):
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
    width = max(len(names), 1)
    pair = cat_code.astype(np.int64) * width + name_code
    kind_index = {k: i for i, k in enumerate(KINDS)}

    def kinds_of(pairs: np.ndarray) -> np.ndarray:
        return np.array([kind_index[classify(cat_cats[u // width], names[u % width])] for u in pairs], dtype=np.int8)

    size = len(cat_cats) * width
    if size > 8 * len(pair):  # a sparse pair space: sort to find the pairs
        uniq, inv = np.unique(pair, return_inverse=True)
        return kinds_of(uniq)[inv]
    # The pairs that occur, by a table over every possible pair (linear; np.unique sorted 75k rows in 3 ms).
    seen = np.zeros(size, dtype=bool)
    seen[pair] = True
    table = np.zeros(size, dtype=np.int8)
    occurring = np.flatnonzero(seen)
    table[occurring] = kinds_of(occurring)
    return table[pair]


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
    jobs: ParseJobs | None = None,
) -> TraceSet:
    """Load a folder, a file, or a list of files/folders of Kineto traces.

    Every file either loads or becomes one entry of ``errors``; the others
    still load. With ``cache`` (True: ``.analyzer-cache/`` beside the traces,
    or the user cache folder when that is read-only; a Path: that folder)
    parsed tables are reused while a file's path, size and mtime are
    unchanged. ``workers`` parallel processes parse uncached files
    (default: min(files, usable CPUs), or 1 when the uncached files hold
    less than 8 MB compressed). ``jobs``: parsing already started (by
    :func:`analyzer.ingest.parse.ParseJobs`, e.g. before pandas was imported);
    files it holds are taken from it instead of being parsed again.
    ``progress``: a tqdm bar on stderr; None shows it only on a terminal
    for many (> 4) or large (> 200 MB) inputs.

    Raises AnalyzerError only when no file can be found at all.
    """
    files, skipped = _expand(paths)
    result = TraceSet(errors=skipped)
    store = trace_cache.TraceCache(None if cache is True else Path(cache)) if cache else None
    hits: list[tuple[Path, Path]] = []
    misses: list[tuple[Path, Path | None]] = []
    for f in files:
        entry = store.entry_for(f) if store else None
        if entry is not None and entry.exists() and not (jobs and f in jobs):
            hits.append((f, entry))
        else:
            misses.append((f, entry))
    loaded: dict[Path, RankTrace] = {}
    total_bytes = sum(_size(f) for f, _ in misses)
    bar = _progress_bar(progress, len(files), total_bytes)
    try:
        # Parse first, then read cache hits, so the workers start at once.
        entries = dict(misses)
        for f, parsed in _parse_many([f for f, _ in misses], workers, jobs, entries):
            if isinstance(parsed, TraceError):
                result.errors.append(parsed)
            else:
                if parsed.cache_warning:
                    result.warnings.append(parsed.cache_warning)
                _add_rank(loaded, result, f, parsed)
            if bar:
                bar.update(1)
        if store is not None:  # hits come from the store only
            for f, entry in hits:
                try:
                    parsed = store.read(entry, f)
                except trace_cache.CacheEntryError as exc:
                    result.warnings.append(str(exc))
                    try:
                        parsed = parse_file(f, entry)
                    except TraceError as err:
                        result.errors.append(err)
                        continue
                    if parsed.cache_warning:
                        result.warnings.append(parsed.cache_warning)
                _add_rank(loaded, result, f, parsed)
                if bar:
                    bar.update(1)
    finally:
        if bar:
            bar.close()
    if store and store.note:
        result.warnings.append(store.note)
    _assemble(files, loaded, result)
    return result


def _add_rank(loaded: dict[Path, RankTrace], result: TraceSet, f: Path, parsed: ParsedTrace) -> None:
    """Build the rank's tables; a failure there is this file's error line,
    not the end of the analysis: nothing one file does ends it."""
    try:
        loaded[f] = rank_trace(parsed)
    except TraceError as err:
        result.errors.append(err)
    except Exception as exc:  # noqa: BLE001 - a bug of ours on odd input: still one line for one file
        result.errors.append(TraceError(f, f"could not be tabled ({type(exc).__name__}: {str(exc)[:200]})"))


def expand_paths(paths: Path | Sequence[Path]) -> tuple[list[Path], list[TraceError]]:
    """(trace files, one TraceError per path named like a trace that cannot be read as one)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [Path(paths)]
    files: list[Path] = []
    skipped: list[TraceError] = []
    seen: set[Path] = set()
    for p in paths:
        found, unusable = scan_trace_files(Path(p))
        skipped += [TraceError(path, reason) for path, reason in unusable]
        for f in found:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                files.append(f)
    return files, skipped


_expand = expand_paths


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# Below this much compressed input, starting worker processes costs more
# than it saves (a process start plus imports is ~0.2-1 s).
PARALLEL_MIN_BYTES = 8 << 20


def _parse_many(
    files: list[Path], workers: int | None, jobs: ParseJobs | None, entries: dict[Path, Path | None]
) -> Iterator[tuple[Path, ParsedTrace | TraceError]]:
    """(file, its parsed columns or its TraceError), in the order of ``files``;
    each file's cache entry (``entries``) written by whoever parses it."""
    if not files:
        return
    todo = [f for f in files if not (jobs and f in jobs)]
    if workers is None and sum(_size(f) for f in todo) < PARALLEL_MIN_BYTES:
        workers = 1
    n = min(len(todo), workers or usable_cpus())
    own = ParseJobs(todo, n, entries) if n > 1 else None
    try:
        for f in files:
            try:
                if jobs and f in jobs:
                    yield f, jobs.take(f)
                elif own is not None:
                    yield f, own.take(f)
                else:
                    yield f, parse_file(f, entries.get(f))
            except TraceError as err:
                yield f, err
    finally:
        if own is not None:
            own.close()


def _progress_bar(progress: bool | None, n_files: int, total_bytes: int):
    if progress is None:
        progress = sys.stderr.isatty() and (n_files > 4 or total_bytes > 200 * 1_000_000)
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=n_files, unit="trace", desc="loading traces", file=sys.stderr, leave=False)


def _assemble(files: list[Path], loaded: dict[Path, RankTrace], result: TraceSet) -> None:
    """Ranks by rank, and the set-level warnings."""
    ranks, warnings = assemble(files, loaded)
    result.ranks.update(ranks)
    result.warnings += warnings


def assemble(files: list[Path], loaded: Mapping[Path, _Loaded]) -> tuple[dict[int, _Loaded], list[str]]:
    """The rank of each file that loaded (a RankTrace, or its :class:`FileFacts`),
    by rank, and the set-level warnings, in this order: each file's notes, a
    rank assumed 0, a duplicated rank (the file sorting last is kept), a rank
    without ProfilerStep markers, differing step counts, ranks missing
    against ``world_size``, ranks far apart in time.

    Raises AnalyzerError when the kept ranks are traces of different runs
    (:func:`_check_one_run`: a device type or a distributed job identity
    that differs)."""
    warnings: list[str] = []
    multi = len(files) > 1
    by_rank: dict[int, list[_Loaded]] = {}
    for f in files:  # natural order
        rt = loaded.get(f)
        if rt is None:
            continue
        for note in rt.notes:
            warnings.append(f"{rt.path.name}: {note}")
        if multi and rt.rank_source == "default":
            warnings.append(f"{rt.path.name}: no rank in distributedInfo or the file name; assumed rank 0")
        by_rank.setdefault(rt.rank, []).append(rt)
    ranks: dict[int, _Loaded] = {}
    for rank in sorted(by_rank):
        group = by_rank[rank]
        kept = group[-1]
        if len(group) > 1:
            others = ", ".join(g.path.name for g in group[:-1])
            warnings.append(
                f"duplicated rank {rank}: kept {kept.path.name}, ignored {others} (the file sorting last is kept)"
            )
        ranks[rank] = kept
    for rank, rt in sorted(ranks.items()):
        if rt.steps.empty:
            warnings.append(f"{rt.path.name}: no ProfilerStep markers; per-step metrics unavailable for rank {rank}")
    _check_step_counts(ranks, warnings)
    _check_world(ranks, warnings)
    _check_one_run(ranks, warnings)
    return ranks, warnings


# Ranks of one job record the same profiler steps (the schedule counts steps, and each step's
# collectives keep the ranks within a step of each other), so their first events lie within about
# one trace span of each other, plus the hosts' clock offset (NTP: milliseconds). Twice the longest
# rank's span, and at least 10 s for short windows and drifting clocks, is "far apart"; a second
# launch of a job restarts its processes, loads and warms up before its window, and lands further off.
FAR_APART_SPANS = 2.0
FAR_APART_MIN_NS = 10 * 10**9


def _check_one_run(ranks: Mapping[int, _Loaded], warnings: list[str]) -> None:
    """Refuse traces of different runs analyzed as one (docs/loading.md, "One run").

    An error when the kept ranks disagree on the device type (GPU or CPU-only)
    or on a field of the job identity their traces record
    (:func:`analyzer.ingest.tables.job_identity`; a field compared only
    among the files that have it); a warning when their first events lie
    further apart than :data:`FAR_APART_SPANS` x the longest rank's span (at
    least :data:`FAR_APART_MIN_NS`): the clocks of different hosts can
    disagree, so time alone does not prove two runs.
    """
    files = [ranks[r] for r in sorted(ranks)]
    if len(files) < 2:
        return
    differ = ["device type"] if len({rt.device_kind for rt in files}) > 1 else []
    for key in sorted({k for rt in files for k in rt.job}):
        if len({rt.job[key] for rt in files if key in rt.job}) > 1:
            differ.append(key)
    if differ:
        groups: dict[tuple[str, ...], list[str]] = {}
        for rt in files:
            values = tuple(
                rt.device_kind if k == "device type" else f"{k} {rt.job.get(k, 'not recorded')}" for k in differ
            )
            groups.setdefault(values, []).append(rt.path.name)
        described = "; ".join(f"{_first_names(names)}: {', '.join(values)}" for values, names in groups.items())
        raise AnalyzerError(
            f"traces of different runs: {described}. Ranks of one run share these; analyze each run's traces on its own"
        )
    # (first_ns, last_ns, file name) of each rank whose trace has a time span, earliest first.
    timed = sorted(
        ((rt.first_ns, rt.last_ns, rt.path.name) for rt in files if rt.first_ns is not None and rt.last_ns is not None),
        key=lambda span: span[0],
    )
    if len(timed) < 2:
        return
    longest_ns = max(last_ns - first_ns for first_ns, last_ns, _ in timed)
    allowed_ns = max(FAR_APART_SPANS * longest_ns, FAR_APART_MIN_NS)
    (earliest_ns, _, earliest_name), (latest_ns, _, latest_name) = timed[0], timed[-1]
    gap_ns = latest_ns - earliest_ns
    if gap_ns > allowed_ns:
        warnings.append(
            f"{latest_name} starts {gap_ns / 1e9:,.1f} s after {earliest_name}, further apart than "
            f"{allowed_ns / 1e9:,.1f} s ({FAR_APART_SPANS:g}x the longest rank's trace, at least "
            f"{FAR_APART_MIN_NS / 1e9:g} s): traces of different runs? Ranks of one run record the same steps"
        )


def _first_names(names: list[str], shown: int = 3) -> str:
    """``a, b, c and 5 more``."""
    head = ", ".join(names[:shown])
    return head + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _check_step_counts(ranks: Mapping[int, _Loaded], warnings: list[str]) -> None:
    counts = {r: len(rt.steps) for r, rt in ranks.items() if not rt.steps.empty}
    if len(set(counts.values())) <= 1:
        return
    values = list(counts.values())
    usual = max(set(values), key=lambda c: (values.count(c), c))
    for rank, count in sorted(counts.items()):
        if count != usual:
            steps = ranks[rank].steps["step"]
            warnings.append(
                f"{ranks[rank].path.name}: {count} ProfilerSteps "
                f"(#{steps.min()}..#{steps.max()}) while most ranks have {usual}; "
                f"rank {rank}'s per-step comparison covers different steps"
            )


def _check_world(ranks: Mapping[int, _Loaded], warnings: list[str]) -> None:
    sizes = {rt.world_size for rt in ranks.values() if rt.world_size}
    if not sizes:
        return
    world = max(sizes)
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        have = "rank has" if len(missing) == 1 else "ranks have"
        warnings.append(f"world_size is {world} but {len(missing)} {have} no trace: {_ranges(missing)}")
    extra = sorted(r for r in ranks if r >= world or r < 0)
    if extra:
        warnings.append(f"ranks {_ranges(extra)} are outside world_size {world}")


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
