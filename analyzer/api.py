"""The one entry point: ``analyze(path)`` turns a run directory or traces into a RunAnalysis.

The CLI (report, compare, check), the dashboard and the tests all call
:func:`analyze`; nothing else reads files or computes metrics for them.

Example::

    from analyzer.api import analyze

    run = analyze("runs/20250101-120000-tiny-ddp-w2")
    print(run.mfu.median, run.mfu.source)          # 0.41 manifest
    for r in run.ranks:
        print(r.rank, r.step_time_ms, r.comm_comp_overlap_pct, r.idle_pct)
    print(run.stragglers.ranks, run.stragglers.verdict)
    report = run.to_json()                          # schema "analyzer.report/1"

Every metric is defined in docs/metrics.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Literal, Sequence, cast

import numpy as np
import pandas as pd

from analyzer.errors import AnalyzerError
from analyzer.jsontext import jsonable, path_text
from analyzer.ingest.jobs import ParseJobs
from analyzer.ingest.formats import REPORT_SCHEMA, ReportCore, RunManifest
from analyzer.metrics.attribution import RunAttribution, run_attribution
from analyzer.metrics.roofline import Roofline, roofline
from analyzer.metrics.breakdown import Source, summarize_breakdown, with_waits
from analyzer.metrics.critical_summary import RunCriticalPath, run_critical_path
from analyzer.metrics.memory import RunMemory, run_memory
from analyzer.metrics.frames import empty_frame
from analyzer.metrics.idle import RunIdle, run_idle
from analyzer.metrics.mfu import MfuResult, RankFlops, mfu_from_manifest, mfu_from_trace_shapes, steady_state
from analyzer.metrics.overlap import OverlapResult, exposed_comm_pct
from analyzer.metrics.step_time import LABELS as STEP_TIME_LABELS
from analyzer.metrics.step_time import StepTime, step_time
from analyzer.metrics.timeline import Overview, RunTimeline, overview_from_grids
from analyzer.metrics.stragglers import (
    StragglerResult,
    arrivals_from_records,
    collective_table,
    disturbed_steps,
    find_stragglers,
    match_arrivals,
    match_collective_spans,
    wait_intervals,
)
from analyzer import runcache
from analyzer.execute import Executed, ExecOptions, Located, Progress, execute, locate
from analyzer.rankmap import RankPart

SCHEMA = REPORT_SCHEMA  # the report's schema, defined with its typed top level


@dataclass(frozen=True)
class _RankInputs:
    """What a rank's figures are computed from (:func:`_rank_summaries`).

    ``part``: the rank's map result (None for a rank known only from its
    metrics records); ``table``: its rows of :attr:`RunAnalysis.steps` (the
    profiled windows, with the breakdown parts); ``steady_ms`` and
    ``profiled_ms``: its median steady-state and profiled step times;
    ``headline``: the run's choice between them (``steady_state`` or
    ``profiled_windows``, :class:`analyzer.metrics.step_time.StepTime`).
    """

    rank: int
    part: RankPart | None
    table: pd.DataFrame
    steady_ms: float | None
    profiled_ms: float | None
    headline: str | None

    @property
    def overlap(self) -> OverlapResult | None:
        """The rank's HTA overlap result (None without a map part)."""
        return self.part.overlap if self.part else None

    @property
    def step(self) -> tuple[float | None, str]:
        """The rank's headline step time and its kind, the run's choice: so that a rank's
        figure and the run's headline cover the same steps; a rank missing those steps
        (no metrics file of its own) falls back to the other kind."""
        if self.headline == "steady_state" and self.steady_ms is not None or self.profiled_ms is None:
            return self.steady_ms, "steady_state"
        return self.profiled_ms, "profiled_windows"


def _figure(compute: Callable[[_RankInputs], Any]) -> Any:
    """A :class:`RankSummary` field whose value ``compute(inputs: _RankInputs)`` gives.

    The one registration of a per-rank figure: its field (name, type, place
    in the report's ``ranks[]``) and how it is computed sit on one line;
    :func:`_rank_summaries` fills every field from it, and ``to_json``
    writes every field.
    """
    return field(metadata={"compute": compute})


def _gpu_timeline(r: _RankInputs) -> dict[str, float]:
    span_parts, span_ns = r.part.span if r.part else ({}, 0)
    return {k: 100.0 * v / span_ns for k, v in span_parts.items()} if span_ns > 0 else {}


def _gpu_span_ms(r: _RankInputs) -> float | None:
    span_ns = r.part.span[1] if r.part else 0
    return span_ns / 1e6 if span_ns > 0 else None


@dataclass
class RankSummary:
    """One rank's headline numbers (docs/metrics.md).

    Step times (ms, docs/metrics.md "Step time"): ``steady_step_time_ms``
    is the median over the rank's steady-state metrics steps,
    ``profiled_step_time_ms`` the median over its ProfilerStep windows;
    ``step_time_ms`` is the rank's headline, chosen as the run's
    (:class:`analyzer.metrics.step_time.StepTime`): the steady one when the
    run has metrics records, else the profiled one; ``step_time_source``
    names it in words. ``breakdown`` covers the profiled windows: it maps
    each part of the step (device: compute, overlapped_comm,
    collective_wait, exposed_comm, exposed_memcpy, idle; host: data,
    forward, backward, optimizer, grad_sync, collective_wait, exposed_comm,
    other) to ``median_ms``, ``mean_ms`` and ``pct`` (of the profiled step
    time; the parts' pct sum to 100).
    ``gpu_timeline`` is the whole trace's GPU timeline (TraceLens's
    ``gpu_timeline.csv`` window: from the first device event's start to the
    last one's end, ``gpu_span_ms`` long; docs/metrics.md, "Whole-trace GPU
    timeline"): ``computation``, ``exposed_comm``, ``exposed_memcpy`` and
    ``idle`` in percent of that span, summing to 100 (empty without device
    events). It is defined with or without ProfilerStep windows; the
    breakdown is defined only inside them.
    ``comm_comp_overlap_pct``, ``idle_pct``, ``compute_pct`` and
    ``non_compute_pct`` follow HTA's definitions (None without GPU
    communication or GPU events); ``exposed_comm_pct`` is the
    share of step time with communication not hidden by compute.

    Each field is declared with :func:`_figure`, the computation of its value
    from the rank's :class:`_RankInputs`: adding a per-rank figure is one line here.
    """

    rank: int = _figure(lambda r: r.rank)
    source: Source | None = _figure(lambda r: r.part.source if r.part else None)
    n_steps: int = _figure(lambda r: int(len(r.table)))
    step_time_ms: float | None = _figure(lambda r: r.step[0])
    step_time_source: str | None = _figure(lambda r: STEP_TIME_LABELS[r.step[1]] if r.step[0] is not None else None)
    breakdown: dict[str, dict[str, float]] = _figure(
        lambda r: summarize_breakdown(r.table, r.part.source) if r.part and len(r.table) else {}
    )
    comm_comp_overlap_pct: float | None = _figure(lambda r: r.overlap.comm_comp_overlap_pct if r.overlap else None)
    exposed_comm_pct: float | None = _figure(lambda r: exposed_comm_pct(r.table) if len(r.table) else None)
    idle_pct: float | None = _figure(lambda r: r.overlap.idle_pct if r.overlap else None)
    compute_pct: float | None = _figure(lambda r: r.overlap.compute_pct if r.overlap else None)
    non_compute_pct: float | None = _figure(lambda r: r.overlap.non_compute_pct if r.overlap else None)
    steady_step_time_ms: float | None = _figure(lambda r: r.steady_ms)
    profiled_step_time_ms: float | None = _figure(lambda r: r.profiled_ms)
    device_name: str | None = _figure(lambda r: r.part.device_name if r.part else None)
    trace: str | None = _figure(lambda r: r.part.trace if r.part else None)
    n_device_events: int = _figure(lambda r: r.overlap.n_device_events if r.overlap else 0)
    gpu_timeline: dict[str, float] = _figure(_gpu_timeline)
    gpu_span_ms: float | None = _figure(_gpu_span_ms)

    def to_json(self) -> dict[str, Any]:
        """The rank's entry of the report's ``ranks`` (every field, in order)."""
        return asdict(self)


@dataclass
class RunAnalysis:
    """Everything the analyzer knows about one run; :meth:`to_json` is the report.

    ``step_time``: the run's step time, one definition for every surface
    (headline ``step_time.ms`` plus the steady-state and profiled-window
    figures it is chosen from; :mod:`analyzer.metrics.step_time`).
    ``steps``: one row per (rank, ProfilerStep) with ``rank, step, start_ns,
    end_ns, step_time_ms, source``, the breakdown parts in ms, ``comm_ms``
    and ``mfu`` (NaN when MFU is unknown). ``kernels``: the top
    :data:`analyzer.rankmap.TOP_KERNELS_PER_RANK` kernels (or host ops) per rank.
    ``collectives``: one row per collective matched across ranks (None when
    there are none). ``metrics``: the run directory's per-step records
    (reftrain runs only), for the CI gate. ``telemetry``: its NVML samples
    (``reftrain.telemetry/1``, one row per sample with ``rank``; None or
    empty without a GPU), for the suggestions' health rules. ``derived``:
    values computed from this analysis on first use (the suggestions'
    facts and ranked suggestions), so the text report, the JSON report and
    the dashboard do not each recompute them; not part of the report.
    """

    path: Path | list[Path]
    kind: Literal["reftrain", "traces"]
    manifest: dict | None
    ranks: list[RankSummary]
    steps: pd.DataFrame
    mfu: MfuResult
    stragglers: StragglerResult
    kernels: pd.DataFrame
    collectives: pd.DataFrame | None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    metrics: pd.DataFrame | None = None
    telemetry: pd.DataFrame | None = None
    derived: dict[str, Roofline] = field(default_factory=dict, repr=False, compare=False)
    # Per rank: one row per communication kernel (analyzer.metrics.collectives), for suggest; not in the report.
    rank_collectives: dict[int, pd.DataFrame] = field(default_factory=dict, repr=False, compare=False)
    # Per rank: tokens from the input shapes and activation recompute per step window (analyzer.metrics.workload),
    # for suggest; not in the report.
    rank_workload: dict[int, pd.DataFrame] = field(default_factory=dict, repr=False, compare=False)
    step_time: StepTime = field(default_factory=lambda: StepTime(None, None, None, 0, None, 0))
    # Kernels attributed to ops, modules and annotations, per rank (analyzer.metrics.attribution).
    attribution: RunAttribution | None = None
    # Peak allocated and reserved memory per step and rank, the timeline (analyzer.metrics.memory).
    memory: RunMemory = field(default_factory=RunMemory)
    # Why the GPU is idle: idle causes, launch statistics, host syncs, pageable copies (analyzer.metrics.idle).
    idle: RunIdle | None = None
    # Every rank's fine time grids, for timelines without events (analyzer.metrics.timeline; not in the report).
    timeline: RunTimeline | None = field(default=None, repr=False, compare=False)
    # The critical path of each rank's profiled steps, in brief (analyzer.metrics.critical_summary);
    # None when not asked for (analyze(..., critical_path=True)).
    critical_path: RunCriticalPath | None = None

    def __repr__(self) -> str:
        # A console shows this; the generated repr printed every table (tens of KB). A notebook shows the
        # HTML view instead (analyzer/render/notebook.py). Equality and to_json are the dataclass's.
        m, st = self.mfu, self.step_time
        paths = self.path if isinstance(self.path, list) else [self.path]
        ranks = [r.rank for r in self.ranks]
        where = f"{paths[0]}" + (f" (+{len(paths) - 1} more)" if len(paths) > 1 else "")
        mfu = f"{100 * m.median:.2f}% ({m.source}" if m.median is not None else f"none ({m.reason or m.source}"
        step = f"{st.ms:.2f} ms" if st.ms is not None else "none"
        return (
            f"<RunAnalysis {where}: {self.kind}, {len(ranks)} rank(s)"
            + (f" {ranks[0]}..{ranks[-1]}" if ranks else "")
            + f"\n  steps: {st.n_steady_steps} steady-state, {st.n_profiled_steps} profiled"
            + f"\n  MFU: {'>= ' if m.lower_bound else ''}{mfu}{', lower bound' if m.lower_bound else ''})"
            + f"\n  step time: {step} ({st.label})"
            + f"\n  stragglers: {', '.join(map(str, self.stragglers.ranks)) or 'none'}; "
            + f"{len(self.errors)} error(s), {len(self.warnings)} warning(s)>"
        )

    def rank(self, rank: int) -> RankSummary:
        """The summary of one rank; KeyError when absent."""
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise KeyError(rank)

    def ops(self, rank: int | None = None) -> pd.DataFrame:
        """Device and host time per (op, backward) and rank (docs/metrics.md, "Attribution"); one rank's when given."""
        return self._attribution_table("ops", rank)

    def modules(self, rank: int | None = None) -> pd.DataFrame:
        """The nn.Module tree: inclusive device and host time per (module path, backward) and rank."""
        return self._attribution_table("modules", rank)

    def annotations(self, rank: int | None = None) -> pd.DataFrame:
        """Device time launched under each user annotation, and its GPU-side copies' time, per rank."""
        return self._attribution_table("annotations", rank)

    def roofline(self, rank: int | None = None) -> Roofline:
        """Per-op FLOPs, bytes, achieved rates, bound and efficiency against the device's datasheet peaks
        (analyzer.metrics.roofline), over every rank's op shapes summed, or one rank's.
        Computed once per rank selection (the text and the JSON report both ask); do not modify it."""
        key = f"roofline/{rank}"
        if key not in self.derived:
            self.derived[key] = self._roofline(rank)
        return self.derived[key]

    def _roofline(self, rank: int | None) -> Roofline:
        if rank is None:
            shapes = self.attribution.summed("shapes") if self.attribution is not None else run_attribution({}).shapes
            names = [r.device_name for r in self.ranks if r.device_name]
        else:
            shapes = self._attribution_table("shapes", rank)
            names = [r.device_name for r in self.ranks if r.rank == rank and r.device_name]
        # The op kernels decide the TF32 peak of fp32 GEMMs (analyzer.metrics.roofline, "TF32").
        return roofline(shapes, names[0] if names else None, self._attribution_table("op_kernels", rank))

    def _attribution_table(self, name: str, rank: int | None) -> pd.DataFrame:
        if self.attribution is None:
            return run_attribution({}).__getattribute__(name)
        table = getattr(self.attribution, name)
        return table if rank is None else table.loc[table["rank"] == rank].reset_index(drop=True)

    def idle_causes(self, rank: int | None = None) -> pd.DataFrame:
        """Per rank: device idle by cause (host wait, kernel wait, other), the kernel launch statistics, host
        syncs and pageable copies in the step windows (docs/metrics.md, "Why the GPU is idle")."""
        return self._idle_table("ranks", rank)

    def idle_breakdown(self, rank: int | None = None) -> pd.DataFrame:
        """HTA's idle-time breakdown: per (rank, stream, cause) the idle ms and its share of the stream's idle."""
        return self._idle_table("streams", rank)

    def host_syncs(self, rank: int | None = None) -> pd.DataFrame:
        """Host syncs inside the step windows per (rank, call or op name): calls and host ms."""
        return self._idle_table("syncs", rank)

    def _idle_table(self, name: str, rank: int | None) -> pd.DataFrame:
        table: pd.DataFrame = getattr(self.idle if self.idle is not None else run_idle({}), name)
        return table if rank is None else table.loc[table["rank"] == rank].reset_index(drop=True)

    def timeline_windows(self) -> list[int | None]:
        """The profiler windows a timeline can show (their last steps; None: the traces' one window)."""
        return self.timeline.windows() if self.timeline is not None else []

    def timeline_overview(self, window: int | None, n_bins: int) -> tuple[Overview, list[str]]:
        """Rank-by-time occupancy of one profiler window from the rank summaries
        (:func:`analyzer.metrics.timeline.overview_from_grids`: about ``n_bins``
        bins, ranks aligned at their first common step), and notes on ranks left out."""
        if self.timeline is None:
            raise KeyError(window)
        return overview_from_grids(self.timeline, window, n_bins)

    @property
    def run_manifest(self) -> RunManifest:
        """``run.json`` typed (:class:`analyzer.ingest.formats.RunManifest`); an empty one for trace folders.

        ``manifest`` is the same document as decoded, for readers of fields
        that the type does not name (they are in ``run_manifest.extra``).
        Read from ``manifest`` on every access (tens of microseconds), not
        memoized: an analysis copied with another manifest
        (``dataclasses.replace``) or given one later must not read the old.
        """
        return RunManifest.from_json(self.manifest or {})

    def goodput(self):
        """The run's goodput (:mod:`analyzer.metrics.goodput`; docs/rundir.md "Restarts and
        goodput"), or None (a trace folder, or no records or start time to compute it)."""
        from analyzer.metrics.goodput import goodput

        if self.kind != "reftrain" or not self.manifest or self.metrics is None:
            return None
        return goodput(self.run_manifest, self.metrics)

    def to_json(self) -> ReportCore:
        """The versioned report (schema ``analyzer.report/1``), JSON-serializable."""
        manifest = self.run_manifest
        gp = self.goodput()
        # Typed (analyzer.ingest.formats.ReportCore), so mypy checks every key
        # here against the one definition of the report's top level.
        core: ReportCore = {
            "schema": SCHEMA,
            "path": [str(p) for p in self.path] if isinstance(self.path, list) else str(self.path),
            "kind": self.kind,
            "run": {
                "run_id": manifest.run_id,
                "status": manifest.status,
                "world_size": manifest.world_size or (len(self.ranks) or None),
                "n_ranks": len(self.ranks),
                "step_time_ms": self.step_time.ms,  # the headline; its definition and both figures below
                "step_time": self.step_time.to_json(),
                "mfu": self.mfu.to_json(),
                "goodput": None if gp is None else gp.to_json(),
            },
            "ranks": [r.to_json() for r in self.ranks],
            "steps": _records(self.steps),
            "stragglers": self.stragglers.to_json(),
            "kernels": _records(self.kernels),
            "collectives": None if self.collectives is None else _records(self.collectives),
            "attribution": None if self.attribution is None else self.attribution.to_json(),
            "memory": self.memory.to_json(),
            "idle": None if self.idle is None else self.idle.to_json(),
            "roofline": self.roofline().to_json(),
            "critical_path": None if self.critical_path is None else self.critical_path.to_json(),
            "errors": list(self.errors),
            "warnings": list(self.warnings),
        }
        return jsonable(core)


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A table's rows as the report writes them (its column names are str)."""
    return cast(list[dict[str, Any]], frame.to_dict("records"))


# ---------------------------------------------------------------------------
# analyze()
# ---------------------------------------------------------------------------


def analyze(
    path: Path | str | Sequence[Path | str],
    *,
    peak_flops: float | None = None,
    cache: bool = True,
    jobs: ParseJobs | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    progress: Callable[[Progress], None] | None = None,
    critical_path: bool = False,
) -> RunAnalysis:
    """Analyze a reftrain run directory, a folder of Kineto traces, or a list of trace files.

    ``peak_flops`` (FLOP/s per device) overrides the manifest's or the
    device table's peak. ``cache`` reuses parsed traces (analyzer.ingest.cache).
    ``jobs``: trace parsing already under way (:class:`analyzer.ingest.jobs.ParseJobs`,
    which the CLI starts before importing pandas); files it holds are
    taken from it. ``engine``: where the per-rank map runs, ``"local"``
    (this machine's worker pool) or ``"ray"`` (``ray_address`` None: a
    local Ray instance; ``"auto"`` or ``"ray://HOST:PORT"``: a cluster);
    :mod:`analyzer.engines`. The report is the same whichever runs it.
    ``progress``: called with an :class:`analyzer.execute.Progress` (files
    and ranks done of their totals) once the map is planned and after each
    rank; not called when a finished analysis is read from the cache.
    ``critical_path``: compute each profiled step's critical path
    (``RunAnalysis.critical_path``; None without: it costs about as much
    CPU as every other per-rank figure together).
    Files that cannot be used become one-line ``errors``; the other ranks are
    still analyzed. Raises AnalyzerError (one line) when nothing usable is
    left: no run directory records and no trace that loads.

    The flow, top to bottom (docs/architecture.md, "The data flow of
    ``analyze(path)``"): a finished analysis of the unchanged inputs
    (:mod:`analyzer.runcache`), else locate the trace files and the run
    directory's records, execute the per-rank map (:mod:`analyzer.execute`:
    plan, cache lookup, run, assemble) and reduce across ranks.
    """
    paths = [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]
    if not paths:
        raise AnalyzerError("nothing to analyze: no path given")
    options = ExecOptions(
        cache=cache,
        jobs=jobs,
        engine=engine,
        ray_address=ray_address,
        progress=progress,
        critical_path=critical_path,
    )
    run_key = _run_key(paths, peak_flops, options)
    stored = runcache.read(run_key, paths[0] if len(paths) == 1 else paths) if run_key is not None else None
    if stored is not None:
        return stored
    located = locate(paths)
    executed = execute(located.sets, options)
    analysis = _reduce(_run_inputs(paths, located, executed, peak_flops), options.critical_path)
    analysis.telemetry = located.telemetry
    if run_key is not None:
        problem = runcache.write(run_key, analysis)
        if problem:
            analysis.warnings.append(problem)
    return analysis


def _run_key(paths: list[Path], peak_flops: float | None, options: ExecOptions) -> runcache.RunKey | None:
    """Where a finished analysis of these inputs is kept; None when it may be neither read nor
    stored (no cache, or parsing under way: the jobs' files must be taken from the jobs)."""
    if not options.cache or options.jobs is not None:
        return None
    return runcache.key_for(paths, peak_flops, options.critical_path)


def _run_inputs(paths: list[Path], located: Located, executed: Executed, peak_flops: float | None) -> RunInputs:
    """The reduce's inputs; AnalyzerError when neither a rank nor a metrics record is usable."""
    errors = located.errors + [str(e) for e in executed.errors]
    has_metrics = located.metrics is not None and not located.metrics.empty
    if not executed.parts and not has_metrics:
        detail = f": {errors[0]}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "") if errors else ""
        exc = AnalyzerError(f"{path_text(paths)}: no usable trace or metrics records{detail}")
        exc.skipped = list(errors)  # the CLI prints one line per file before this one
        raise exc
    return RunInputs(
        path=paths[0] if len(paths) == 1 else paths,
        kind=located.kind,
        manifest=located.manifest,
        metrics=located.metrics,
        records=located.records,
        parts=executed.parts,
        peak_flops=peak_flops,
        errors=errors,
        warnings=located.warnings + executed.warnings,
    )


@dataclass
class RunInputs:
    """What the reduce reads: the run directory's records and one RankPart per rank."""

    path: Path | list[Path]
    kind: Literal["reftrain", "traces"]
    manifest: dict | None
    metrics: pd.DataFrame | None
    records: pd.DataFrame | None
    parts: dict[int, RankPart]
    peak_flops: float | None
    errors: list[str]
    warnings: list[str]


def _reduce(run: RunInputs, critical_path: bool = False) -> RunAnalysis:
    """The run-level metrics from the ranks' parts (pure: no file access, no events); the
    critical paths with ``critical_path`` (else None)."""
    manifest, metrics, records, peak_flops = run.manifest, run.metrics, run.records, run.peak_flops
    man = RunManifest.from_json(manifest or {})  # the typed run.json (empty for traces)
    warnings = run.warnings
    parts = dict(sorted(run.parts.items()))
    # Waiting at collectives, on each rank's trace clock: the breakdown's collective_wait part.
    waits = wait_intervals(match_collective_spans({r: p.spans for r, p in parts.items()}))
    step_tables: list[pd.DataFrame] = []
    rank_flops = []
    for rank, part in parts.items():
        warnings += part.window_warnings + part.critical_path_warnings
        table = with_waits(part.pieces, waits.get(rank))
        table = table.merge(part.window_flagged, on="step", how="left")
        step_tables.append(table.assign(rank=rank))
        if part.flops is not None:
            rank_flops.append(part.flops)
    steps = _concat_steps(step_tables)
    device_names = {r: p.device_name for r, p in parts.items()}
    mfu = _run_mfu(man, manifest is not None, metrics, rank_flops, device_names, peak_flops)
    steps["mfu"] = _rank_step_mfu(steps, mfu, rank_flops)
    steady, quiet = _steady_steps(man, metrics)
    stragglers, arrivals = _run_stragglers(man, records, steps, parts, quiet)
    collectives = collective_table(arrivals) if not arrivals.empty else None

    run_step_time = step_time(steady, steps)
    ranks = _rank_summaries(parts, steps, steady, run_step_time.source)
    kernel_tables = [p.kernels for p in parts.values()]
    kernels = pd.concat(kernel_tables, ignore_index=True) if kernel_tables else top_kernels_empty()
    timeline = RunTimeline(
        source="device" if any(p.source == "device" for p in parts.values()) else "host",
        # A trace folder is one window whatever its files are named.
        grids={
            r: p.timeline if run.kind == "reftrain" else [replace(g, window=None) for g in p.timeline]
            for r, p in parts.items()
            if p.timeline
        },
        movable={r: p.pieces.movable for r, p in parts.items()},
        waits=waits,
    )
    return RunAnalysis(
        path=run.path,
        kind=run.kind,
        manifest=manifest,
        ranks=ranks,
        steps=steps,
        mfu=mfu,
        stragglers=stragglers,
        kernels=kernels,
        collectives=collectives,
        errors=run.errors,
        warnings=warnings,
        metrics=metrics,
        step_time=run_step_time,
        attribution=run_attribution({r: p.attribution for r, p in parts.items()}),
        memory=run_memory(metrics, {r: p.memory for r, p in parts.items()}),
        idle=run_idle({r: p.idle for r, p in parts.items()}),
        timeline=timeline,
        critical_path=run_critical_path({r: p.critical_paths or [] for r, p in parts.items()})
        if critical_path
        else None,
        rank_collectives={r: p.comm_table for r, p in parts.items() if p.comm_table is not None and len(p.comm_table)},
        rank_workload={r: p.workload for r, p in parts.items() if p.workload is not None and len(p.workload)},
    )


def _run_mfu(
    man: RunManifest,
    has_manifest: bool,
    metrics: pd.DataFrame | None,
    rank_flops: list[RankFlops],
    device_names: dict[int, str | None],
    peak_flops: float | None,
) -> MfuResult:
    """The run's MFU: from the manifest when the run has one (the trace shapes when it cannot
    give one), else from the trace shapes."""
    if has_manifest:
        mfu = mfu_from_manifest(man, metrics, peak_flops=peak_flops)
        if mfu.source == "none" and rank_flops:
            fallback = mfu_from_trace_shapes(rank_flops, device_names, peak_flops)
            fallback.notes.insert(0, f"manifest MFU unavailable ({mfu.reason})")
            mfu = fallback if fallback.source != "none" else mfu
        return mfu
    if rank_flops:
        return mfu_from_trace_shapes(rank_flops, device_names, peak_flops)
    return MfuResult("none", reason="no ProfilerStep windows to time the FLOPs against")


def _steady_steps(man: RunManifest, metrics: pd.DataFrame | None) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """The steady-state metrics records, and those of them not disturbed by trace or checkpoint
    writing (None, None without per-step records)."""
    if metrics is None or metrics.empty or not {"rank", "step", "step_time_ms"} <= set(metrics.columns):
        return None, None
    steady = steady_state(metrics, man.warmup_steps or 0, man.profiled_steps)
    disturbed = disturbed_steps(man.profiled_steps, man.files.checkpoints or [])
    return steady, steady.loc[~steady["step"].isin(sorted(disturbed))]


def _run_stragglers(
    man: RunManifest,
    records: pd.DataFrame | None,
    steps: pd.DataFrame,
    parts: dict[int, RankPart],
    quiet: pd.DataFrame | None,
) -> tuple[StragglerResult, pd.DataFrame]:
    """Stragglers, and the collective arrivals they were found from: the quiet steady-state steps
    and the collective records when the run has them, else the profiled windows and the traces."""
    if quiet is not None and not quiet.empty:
        step_times = quiet[["rank", "step", "step_time_ms"]]
        step_source = "metrics JSONL (steady-state steps, without the steps after trace or checkpoint writing)"
    else:
        usable = (
            steps.loc[~steps["window_flagged"].fillna(False).astype(bool)]
            if "window_flagged" in steps.columns
            else steps
        )
        step_times, step_source = usable[["rank", "step", "step_time_ms"]], "ProfilerStep windows (not flagged)"
    arrival_notes: list[str] = []
    arrival_source: str | None
    if records is not None and not records.empty and "rank" in records.columns:
        offsets = man.clock.offsets_ns if man.clock else None
        arrivals = arrivals_from_records(records, offsets)
        arrival_source = "collective records (collectives/rank*.jsonl), clocks aligned with clock.offsets_ns"
        if quiet is not None and not quiet.empty:
            arrivals = arrivals.loc[arrivals["step"].isin(quiet["step"].unique())].reset_index(drop=True)
    else:
        arrivals, arrival_source, arrival_notes = match_arrivals({r: p.arrivals for r, p in parts.items()})
        if arrival_source:
            arrival_source = f"trace {arrival_source} matched by order (assumes the ranks' clocks agree)"
    stragglers = find_stragglers(step_times, arrivals, step_source=step_source, arrival_source=arrival_source)
    stragglers.notes += arrival_notes
    return stragglers, arrivals


def top_kernels_empty() -> pd.DataFrame:
    from analyzer.metrics.kernels import COLUMNS

    return empty_frame(COLUMNS)


def _concat_steps(tables: list[pd.DataFrame]) -> pd.DataFrame:
    base = ["rank", "step", "start_ns", "end_ns", "step_time_ms", "source"]
    tables = [t for t in tables if not t.empty]
    if not tables:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in base + ["comm_ms"]})
    out = pd.concat(tables, ignore_index=True)
    parts = [c for c in out.columns if c not in base]
    return out[base + parts].sort_values(["rank", "step"], kind="stable").reset_index(drop=True)


def _rank_step_mfu(steps: pd.DataFrame, mfu: MfuResult, rank_flops: list) -> np.ndarray:
    """MFU of each (rank, ProfilerStep) row with the run's FLOPs source and peak."""
    if steps.empty or not mfu.peak_flops_per_s:
        return np.full(len(steps), np.nan)
    seconds = steps["step_time_ms"].to_numpy() / 1e3
    if mfu.source == "manifest":
        assert mfu.flops_per_step is not None  # a manifest MFU has it
        return mfu.flops_per_step / (seconds * mfu.peak_flops_per_s)
    flops = pd.concat([rf.steps[["step", "flops"]].assign(rank=rf.rank) for rf in rank_flops], ignore_index=True)
    joined = steps[["rank", "step"]].merge(flops, on=["rank", "step"], how="left")
    return joined["flops"].to_numpy(np.float64) / (seconds * mfu.peak_flops_per_s)


def _rank_summaries(
    parts: dict[int, RankPart],
    steps: pd.DataFrame,
    steady: pd.DataFrame | None,
    headline: str | None,
) -> list[RankSummary]:
    """Per-rank summaries; each rank's ``step_time_ms`` follows the run's ``headline`` source."""
    ranks = set(parts)
    if steady is not None and not steady.empty:
        ranks |= set(int(r) for r in steady["rank"].unique())
    out = []
    for rank in sorted(ranks):
        table = steps.loc[steps["rank"] == rank] if not steps.empty else steps
        steady_ms = None
        if steady is not None and not steady.empty:
            mine = steady.loc[steady["rank"] == rank, "step_time_ms"]
            steady_ms = float(mine.median()) if len(mine) else None
        profiled_ms = float(table["step_time_ms"].median()) if len(table) else None
        inputs = _RankInputs(rank, parts.get(rank), table, steady_ms, profiled_ms, headline)
        # every figure of the rank, each by its field's computation (_figure)
        out.append(RankSummary(**{f.name: f.metadata["compute"](inputs) for f in fields(RankSummary)}))
    return out
