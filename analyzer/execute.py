"""How :func:`analyzer.api.analyze` gets one summary per rank: locate, plan, cache lookup, run, assemble.

:func:`locate` finds what an input holds: a reftrain run directory's
records and its trace files grouped by profiler window, or a trace folder's
(or list's) one set of files. :func:`execute` then turns those sets into
one :class:`~analyzer.rankmap.RankPart` per rank, with the files' errors
and the set-level warnings, for the reduce (:func:`analyzer.api._reduce`):

1. plan (:func:`plan`): each set's trace files and parse-cache entries,
   grouped into map units, one per rank (a rank's files of every window);
2. the CLI's early parse jobs (:func:`take_early_jobs`): a unit with a
   file that :class:`~analyzer.ingest.jobs.ParseJobs` holds takes it from
   there, already mapped when the worker ran
   :func:`analyzer.engines.parse_and_map`;
3. cache lookup (:func:`read_summaries`): units whose files are unchanged
   since a previous analysis read their stored summary (:mod:`analyzer.rankcache`);
4. run (:func:`run_units`): the other units on the chosen engine
   (:mod:`analyzer.engines`); their summaries are stored (:func:`store_summaries`);
5. assemble (:func:`assemble_sets`): each set's errors and warnings, as
   :func:`analyzer.ingest.load.load_traces` words them, in the set's
   reading order (files to parse or held by the jobs first, then cache hits);
6. each rank's part (:func:`rank_parts`): the unit that read exactly the
   rank's kept files, else (files whose names and contents disagree on the
   rank) those files mapped again.

:class:`ExecOptions` holds every option of the execution; its
``progress`` callback hears a :class:`Progress` once the units are planned
and after each unit is done (counts only: the caller times them and draws).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Literal, Sequence

import pandas as pd

from analyzer import engines, rankcache
from analyzer.errors import AnalyzerError, TraceError
from analyzer.ingest import cache as trace_cache
from analyzer.ingest import rundir
from analyzer.ingest.jobs import ParseJobs
from analyzer.ingest.load import FileFacts, assemble, expand_paths
from analyzer.ingest.locate import trace_window
from analyzer.ingest.parse import ParsedTrace, rank_from_filename
from analyzer.rankmap import MapUnit, RankPart, UnitFile, UnitResult, map_unit, without_critical_paths


@dataclass(frozen=True)
class Progress:
    """How far the map is: trace files and ranks (map units) done, of their totals.

    A unit is done when its result is in hand, whichever way: mapped (here,
    in a worker or a Ray task), read from its stored summary, or taken from
    the CLI's early parse jobs. ``files_done`` counts the files of the units
    done.
    """

    files_done: int
    files_total: int
    ranks_done: int
    ranks_total: int


@dataclass(frozen=True)
class ExecOptions:
    """How an analysis runs its map (the keyword arguments of :func:`analyzer.api.analyze`).

    ``cache``: read and write the parse cache, the rank summaries and the
    finished analysis; ``jobs``: parsing the CLI started before importing
    pandas; ``engine`` and ``ray_address``: where the map runs
    (:mod:`analyzer.engines`); ``progress``: called with a :class:`Progress`
    as the map goes (None: nobody listens); ``critical_path``: compute each
    profiled step's critical path (:attr:`analyzer.rankmap.MapUnit.critical_path`,
    carried by every unit to whichever engine maps it).
    """

    cache: bool = True
    jobs: ParseJobs | None = None
    engine: str = "local"
    ray_address: str | None = None
    progress: Callable[[Progress], None] | None = None
    critical_path: bool = False

    def holds(self, path: Path) -> bool:
        """Whether the early parse jobs hold this file."""
        return self.jobs is not None and path in self.jobs


# ---------------------------------------------------------------------------
# Locate


@dataclass
class Located:
    """What an input holds: the trace sets to map and, for a reftrain run directory, its records."""

    kind: Literal["reftrain", "traces"]
    sets: list[list[Path]]
    manifest: dict | None = None
    metrics: pd.DataFrame | None = None
    records: pd.DataFrame | None = None
    telemetry: pd.DataFrame | None = None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def locate(paths: list[Path]) -> Located:
    """A run directory's records and trace sets (one per profiler window), or the traces' one set."""
    if len(paths) == 1 and rundir.is_run_dir(paths[0]):
        run = rundir.read_run_dir(paths[0])
        return Located(
            kind="reftrain",
            sets=_window_sets([Path(p) for p in run.trace_paths]) if run.trace_paths else [],
            manifest=run.manifest,
            metrics=run.metrics,
            records=run.collectives,
            telemetry=run.telemetry,
            errors=[str(e) for e in run.errors],
            warnings=list(run.warnings),
        )
    for p in paths:
        if not p.exists():
            raise AnalyzerError(f"{p}: no such file or folder")
    return Located(kind="traces", sets=[paths if len(paths) > 1 else [paths[0]]])


def _window_sets(files: list[Path]) -> list[list[Path]]:
    """A reftrain run's trace files grouped by profiler window (``step{N}/rank{R}``,
    or ``rank{R}.step{N}`` in older runs), windows in step order; one set when
    the run has a single window."""
    windows: dict[str, list[Path]] = {}
    for f in files:
        w = trace_window(f)
        windows.setdefault("" if w is None else str(w), []).append(f)
    if len(windows) <= 1:
        return [files]
    return [windows[key] for key in sorted(windows, key=lambda k: int(k) if k.isdigit() else -1)]


# ---------------------------------------------------------------------------
# Plan


@dataclass(frozen=True)
class SetPlan:
    """One set's trace files, the paths that could not be read as traces, its files
    in reading order (to parse first, then cache hits) and the parse cache's note."""

    files: list[Path]
    skipped: list[TraceError]
    order: list[UnitFile]
    note: str | None


@dataclass(frozen=True)
class Plan:
    """The sets and the map units their files form (one per rank, in first-seen order)."""

    sets: list[SetPlan]
    units: list[MapUnit]


def plan(sets: list[list[Path]], options: ExecOptions) -> Plan:
    """Each set's files and cache entries, grouped into units: one file each for a single set;
    with several sets (profiler windows), a rank's files of every window (by the rank in their names)."""
    set_plans = [_plan_set(files_in, options) for files_in in sets]
    unit_files: dict[object, list[UnitFile]] = {}
    for set_plan in set_plans:
        for uf in set_plan.order:
            named = rank_from_filename(uf.path.name) if len(sets) > 1 else None
            unit_files.setdefault(uf.path if named is None else ("rank", named), []).append(uf)
    return Plan(set_plans, [MapUnit(tuple(fs), options.critical_path) for fs in unit_files.values()])


def _plan_set(files_in: list[Path], options: ExecOptions) -> SetPlan:
    files, skipped = expand_paths(files_in if len(files_in) > 1 else files_in[0])
    store = trace_cache.TraceCache() if options.cache else None
    misses: list[UnitFile] = []
    hits: list[UnitFile] = []
    for f in files:
        entry = store.entry_for(f) if store else None
        uf = UnitFile(f, entry, hit=entry is not None and entry.exists() and not options.holds(f))
        (hits if uf.hit else misses).append(uf)
    return SetPlan(files, skipped, misses + hits, store.note if store else None)


# ---------------------------------------------------------------------------
# Execute


@dataclass
class Executed:
    """What the map and the assembly hand to the reduce: one RankPart per rank."""

    parts: dict[int, RankPart] = field(default_factory=dict)
    errors: list[TraceError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class _Counter:
    """Counts the units done and tells ``options.progress`` (a no-op without one)."""

    def __init__(self, units: Sequence[MapUnit], listener: Callable[[Progress], None] | None) -> None:
        self.listener = listener
        self.files_total = sum(len(u.files) for u in units)
        self.ranks_total = len(units)
        self.files_done = 0
        self.ranks_done = 0
        self._tell()

    def done(self, unit: MapUnit) -> None:
        self.files_done += len(unit.files)
        self.ranks_done += 1
        self._tell()

    def _tell(self) -> None:
        if self.listener is not None:
            self.listener(Progress(self.files_done, self.files_total, self.ranks_done, self.ranks_total))


def execute(sets: list[list[Path]], options: ExecOptions) -> Executed:
    """One part per rank from the trace sets (the module docstring's steps, in order)."""
    planned = plan(sets, options)
    counter = _Counter(planned.units, options.progress)
    held: list[MapUnit] = []
    free: list[MapUnit] = []
    for u in planned.units:
        (held if any(options.holds(f.path) for f in u.files) else free).append(u)
    results: dict[MapUnit, UnitResult] = {}
    for u in held:
        assert options.jobs is not None  # units are held only by jobs
        results[u] = take_early_jobs(u, options.jobs)
        counter.done(u)
    todo = free
    summary_warnings: dict[MapUnit, str] = {}
    if options.cache:
        stored, summary_warnings = read_summaries(free, counter.done)
        results.update(stored)
        todo = [u for u in free if u not in stored]
    results.update(zip(todo, run_units(todo, options, counter.done)))
    if options.cache:
        store_summaries([*held, *todo], results, summary_warnings)
    out = Executed()
    kept = assemble_sets(planned.sets, _outcomes(results.values()), out)
    out.parts = rank_parts(kept, results.values(), planned.units, options.critical_path)
    return out


def take_early_jobs(unit: MapUnit, jobs: ParseJobs) -> UnitResult:
    """A unit with files the early parse jobs hold: the worker's own map of a one-file
    unit, else the unit mapped here from the columns the workers parsed."""
    parsed: dict[Path, ParsedTrace | TraceError] = {}
    to_map = list(unit.files)
    for i, held_file in enumerate(unit.files):
        if held_file.path not in jobs:
            continue
        try:
            got = jobs.take(held_file.path)
        except TraceError as err:
            parsed[held_file.path] = err
            continue
        if isinstance(got, UnitResult):  # analyzer.engines.parse_and_map: the worker mapped the file
            if len(unit.files) == 1 and _answers(got, unit):
                return _named_as(got if unit.critical_path else without_critical_paths(got), held_file.path)
            # Not a unit of its own after all, or mapped without the critical paths asked for:
            # read what the worker stored (or parse again).
            to_map[i] = replace(held_file, hit=held_file.entry is not None and held_file.entry.exists())
            continue
        # Named as the unit names it: a relative folder's files reach the workers resolved,
        # and the rank's lookup in rank_parts goes by the unit's names.
        parsed[held_file.path] = replace(got, path=held_file.path)
    return map_unit(replace(unit, files=tuple(to_map)), parsed)


def _answers(result: UnitResult, unit: MapUnit) -> bool:
    """Whether a summary answers the unit: one with critical paths answers any unit, one
    without them only a unit that does not ask for them (a file that failed has no part)."""
    return result.part is None or result.part.critical_paths is not None or not unit.critical_path


def _named_as(result: UnitResult, path: Path) -> UnitResult:
    """A worker's result for one file, its outcome named by ``path`` as the unit names it."""
    if result.outcomes:
        _, facts, warnings = result.outcomes[0]
        if not isinstance(facts, TraceError):
            facts = replace(facts, path=path)
        result.outcomes[0] = (path, facts, warnings)
    return result


def read_summaries(
    units: list[MapUnit], done: Callable[[MapUnit], None]
) -> tuple[dict[MapUnit, UnitResult], dict[MapUnit, str]]:
    """The stored summaries of units whose files are unchanged (:mod:`analyzer.rankcache`),
    and the problem with each stored entry that could not be used (that unit is mapped again).

    A unit that does not ask for critical paths is also answered by the summary made with
    them (the paths dropped), so asking once keeps every later analysis a hit."""
    stored: dict[MapUnit, UnitResult] = {}
    problems: dict[MapUnit, str] = {}
    for u in units:
        asked = [u] if u.critical_path else [replace(u, critical_path=True), u]
        entry = next((e for e in map(rankcache.entry_for, asked) if e is not None and e.exists()), None)
        if entry is None:
            continue
        try:
            stored[u] = rankcache.read(entry, u)
        except rankcache.SummaryEntryError as exc:
            problems[u] = str(exc)
            continue
        if not u.critical_path:
            without_critical_paths(stored[u])
        done(u)
    return stored, problems


def run_units(units: list[MapUnit], options: ExecOptions, done: Callable[[MapUnit], None]) -> list[UnitResult]:
    """The map of each unit, in order, on the options' engine; ``done(unit)`` after each."""
    return engines.run_map(units, options.engine, ray_address=options.ray_address, done=done)


def store_summaries(units: list[MapUnit], results: dict[MapUnit, UnitResult], problems: dict[MapUnit, str]) -> None:
    """Store the summary of each unit whose files all loaded; a failed store, and the problem
    with the entry it replaces, become warnings of the unit's first file."""
    for u in units:
        entry = rankcache.entry_for(u)
        if entry is None or not rankcache.storable(results[u]):
            continue
        problem = rankcache.write(entry, results[u])
        extra = [w for w in (problems.get(u), problem) if w]
        if extra:
            first_path, first_facts, warnings = results[u].outcomes[0]
            results[u].outcomes[0] = (first_path, first_facts, [*warnings, *extra])


# ---------------------------------------------------------------------------
# Assemble

Outcomes = dict[Path, tuple[FileFacts | TraceError, list[str]]]


def _outcomes(results: Iterable[UnitResult]) -> Outcomes:
    """Each file's facts or error, and its cache warnings."""
    out: Outcomes = {}
    for result in results:
        for done_path, done, cache_warnings in result.outcomes:
            out[done_path] = (done, cache_warnings)
    return out


def assemble_sets(sets: list[SetPlan], outcomes: Outcomes, out: Executed) -> dict[int, list[Path]]:
    """Each set's errors and warnings into ``out`` (in its reading order), as load_traces
    would word them; returns each rank's kept files across the sets."""
    kept: dict[int, list[Path]] = {}
    for s in sets:
        out.errors += s.skipped
        facts: dict[Path, FileFacts] = {}
        for uf in s.order:
            got, cache_warnings = outcomes[uf.path]
            out.warnings += cache_warnings
            if isinstance(got, TraceError):
                out.errors.append(got)
            else:
                facts[uf.path] = got
        if s.note:
            out.warnings.append(s.note)
        ranks, set_warnings = assemble(s.files, facts)
        out.warnings += set_warnings
        for rank, rank_trace in ranks.items():
            kept.setdefault(rank, []).append(rank_trace.path)
    return kept


def rank_parts(
    kept: dict[int, list[Path]], results: Iterable[UnitResult], units: list[MapUnit], critical_path: bool = False
) -> dict[int, RankPart]:
    """Each rank's part: the unit that read exactly its kept files, else (files whose
    names and contents disagree on the rank) those files mapped again, here (with the
    critical paths when ``critical_path``)."""
    by_files = {}
    for result in results:
        if result.part is not None:
            loaded_files = tuple(f for f, got, _w in result.outcomes if not isinstance(got, TraceError))
            by_files[(result.part.rank, loaded_files)] = result.part
    entries = {uf.path: uf.entry for u in units for uf in u.files}
    parts: dict[int, RankPart] = {}
    for rank, files in sorted(kept.items()):
        part = by_files.get((rank, tuple(files)))
        if part is None:
            regrouped = MapUnit(
                tuple(UnitFile(f, e, e is not None and e.exists()) for f in files for e in [entries[f]]), critical_path
            )
            part = map_unit(regrouped).part
        if part is not None:
            parts[rank] = part
    return parts
