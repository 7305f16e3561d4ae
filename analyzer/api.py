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

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import pandas as pd

from analyzer.errors import AnalyzerError
from analyzer.ingest.load import TraceSet, load_traces
from analyzer.ingest.jobs import ParseJobs
from analyzer.metrics.breakdown import Source, source_of, step_breakdown, summarize_breakdown
from analyzer.metrics.kernels import top_kernels
from analyzer.metrics.windows import check_windows
from analyzer.metrics.mfu import (
    MfuResult,
    device_name_of,
    mfu_from_manifest,
    mfu_from_trace_shapes,
    rank_flops_from_shapes,
    steady_state,
)
from analyzer.metrics.overlap import OverlapResult, exposed_comm_pct, overlap, span_parts_ns
from analyzer.metrics.step_time import LABELS as STEP_TIME_LABELS
from analyzer.metrics.step_time import StepTime, step_time
from analyzer.metrics.stragglers import (
    StragglerResult,
    arrivals_from_records,
    arrivals_from_traces,
    collective_table,
    disturbed_steps,
    collective_spans,
    find_stragglers,
    wait_intervals,
)
from analyzer.ingest.tables import RankTrace

SCHEMA = "analyzer.report/1"
TOP_KERNELS_PER_RANK = 50


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
    """

    rank: int
    source: Source | None
    n_steps: int
    step_time_ms: float | None
    step_time_source: str | None
    breakdown: dict[str, dict[str, float]]
    comm_comp_overlap_pct: float | None
    exposed_comm_pct: float | None
    idle_pct: float | None
    compute_pct: float | None
    non_compute_pct: float | None
    steady_step_time_ms: float | None = None
    profiled_step_time_ms: float | None = None
    device_name: str | None = None
    trace: str | None = None
    n_device_events: int = 0
    gpu_timeline: dict[str, float] = field(default_factory=dict)
    gpu_span_ms: float | None = None


@dataclass
class RunAnalysis:
    """Everything the analyzer knows about one run; :meth:`to_json` is the report.

    ``step_time``: the run's step time, one definition for every surface
    (headline ``step_time.ms`` plus the steady-state and profiled-window
    figures it is chosen from; :mod:`analyzer.metrics.step_time`).
    ``steps``: one row per (rank, ProfilerStep) with ``rank, step, start_ns,
    end_ns, step_time_ms, source``, the breakdown parts in ms, ``comm_ms``
    and ``mfu`` (NaN when MFU is unknown). ``kernels``: the top
    :data:`TOP_KERNELS_PER_RANK` kernels (or host ops) per rank.
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
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    step_time: StepTime = field(default_factory=lambda: StepTime(None, None, None, 0, None, 0))

    def rank(self, rank: int) -> RankSummary:
        """The summary of one rank; KeyError when absent."""
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise KeyError(rank)

    def goodput(self):
        """The run's goodput (:mod:`analyzer.metrics.goodput`; docs/rundir.md "Restarts and
        goodput"), or None (a trace folder, or no records or start time to compute it)."""
        from analyzer.metrics.goodput import goodput

        if self.kind != "reftrain" or not self.manifest or self.metrics is None:
            return None
        return goodput(self.manifest, self.metrics)

    def _repr_html_(self) -> str:  # Jupyter (issue 15 item 5): analyzer/verbs/notebook.py
        from analyzer.verbs.notebook import run_html

        return run_html(self)

    def to_json(self) -> dict[str, Any]:
        """The versioned report (schema ``analyzer.report/1``), JSON-serializable."""
        manifest = self.manifest or {}
        gp = self.goodput()
        return _jsonable(
            {
                "schema": SCHEMA,
                "path": [str(p) for p in self.path] if isinstance(self.path, list) else str(self.path),
                "kind": self.kind,
                "run": {
                    "run_id": manifest.get("run_id"),
                    "status": manifest.get("status"),
                    "world_size": manifest.get("world_size") or (len(self.ranks) or None),
                    "n_ranks": len(self.ranks),
                    "step_time_ms": self.step_time.ms,  # the headline; its definition and both figures below
                    "step_time": self.step_time.to_json(),
                    "mfu": self.mfu.to_json(),
                    "goodput": None if gp is None else gp.to_json(),
                },
                "ranks": [r.__dict__ for r in self.ranks],
                "steps": self.steps.to_dict("records"),
                "stragglers": self.stragglers.to_json(),
                "kernels": self.kernels.to_dict("records"),
                "collectives": None if self.collectives is None else self.collectives.to_dict("records"),
                "errors": list(self.errors),
                "warnings": list(self.warnings),
            }
        )


def _jsonable(x: Any) -> Any:
    """Plain Python: numpy scalars to int/float/bool, NaN and inf to None, Paths to str."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(float(x)) else None
    if isinstance(x, Path):
        return str(x)
    if x is pd.NA or x is pd.NaT:
        return None
    return x


# ---------------------------------------------------------------------------
# analyze()
# ---------------------------------------------------------------------------


def analyze(
    path: Path | str | Sequence[Path | str],
    *,
    peak_flops: float | None = None,
    cache: bool = True,
    jobs: ParseJobs | None = None,
) -> RunAnalysis:
    """Analyze a reftrain run directory, a folder of Kineto traces, or a list of trace files.

    ``peak_flops`` (FLOP/s per device) overrides the manifest's or the
    device table's peak. ``cache`` reuses parsed traces (analyzer.load).
    ``jobs``: trace parsing already under way (:class:`analyzer.ingest.parse.ParseJobs`,
    which the CLI starts before importing pandas); files it holds are
    taken from it.
    Files that cannot be used become one-line ``errors``; the other ranks are
    still analyzed. Raises AnalyzerError (one line) when nothing usable is
    left: no run directory records and no trace that loads.
    """
    paths = [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]
    if not paths:
        raise AnalyzerError("nothing to analyze: no path given")
    manifest: dict | None = None
    metrics: pd.DataFrame | None = None
    records: pd.DataFrame | None = None
    telemetry: pd.DataFrame | None = None
    errors: list[str] = []
    warnings: list[str] = []
    from analyzer.ingest import rundir

    if len(paths) == 1 and rundir.is_run_dir(paths[0]):
        kind: Literal["reftrain", "traces"] = "reftrain"
        run = rundir.read_run_dir(paths[0])
        manifest, metrics, records, telemetry = run.manifest, run.metrics, run.collectives, run.telemetry
        errors += [str(e) for e in run.errors]
        warnings += list(run.warnings)
        traces = _load_windows([Path(p) for p in run.trace_paths], cache, jobs) if run.trace_paths else TraceSet()
    else:
        kind = "traces"
        for p in paths:
            if not p.exists():
                raise AnalyzerError(f"{p}: no such file or folder")
        traces = load_traces(paths if len(paths) > 1 else paths[0], cache=cache, jobs=jobs)
    errors += [str(e) for e in traces.errors]
    warnings += list(traces.warnings)
    has_metrics = metrics is not None and not metrics.empty
    if not traces.ranks and not has_metrics:
        where = ", ".join(str(p) for p in paths)
        detail = f": {errors[0]}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "") if errors else ""
        exc = AnalyzerError(f"{where}: no usable trace or metrics records{detail}")
        exc.skipped = list(errors)  # the CLI prints one line per file before this one (issue 17)
        raise exc
    analysis = _analyze_loaded(
        paths[0] if len(paths) == 1 else paths, kind, manifest, metrics, records, traces, peak_flops, errors, warnings
    )
    analysis.telemetry = telemetry
    return analysis


def _load_windows(files: list[Path], cache: bool, jobs: ParseJobs | None) -> TraceSet:
    """Load reftrain traces, merging a rank's profiler windows (``step{N}/rank{R}``,
    or ``rank{R}.step{N}`` in older runs) into one."""
    from analyzer.ingest.locate import trace_window

    windows: dict[str, list[Path]] = {}
    for f in files:
        w = trace_window(f)
        windows.setdefault("" if w is None else str(w), []).append(f)
    if len(windows) <= 1:
        return load_traces(files, cache=cache, jobs=jobs)
    merged = TraceSet()
    per_rank: dict[int, list[RankTrace]] = {}
    for key in sorted(windows, key=lambda k: int(k) if k.isdigit() else -1):
        ts = load_traces(windows[key], cache=cache, jobs=jobs)
        merged.errors += ts.errors
        merged.warnings += ts.warnings
        for rank, rt in ts.ranks.items():
            per_rank.setdefault(rank, []).append(rt)
    for rank, rts in per_rank.items():
        merged.ranks[rank] = _merge_rank_windows(rts)
    return merged


def _merge_rank_windows(rts: list[RankTrace]) -> RankTrace:
    """One RankTrace from several profiler windows of the same rank (disjoint in time)."""
    if len(rts) == 1:
        return rts[0]
    events = pd.concat([rt.events for rt in rts], ignore_index=True)
    for col in ("cat", "name", "coll_name", "msg_dtype", "pg_name"):
        events[col] = events[col].astype("category")
    steps = pd.concat([rt.steps for rt in rts], ignore_index=True).sort_values("step").reset_index(drop=True)
    first = rts[-1]
    return RankTrace(
        rank=first.rank,
        path=first.path,
        events=events,
        steps=steps,
        distributed_info=first.distributed_info,
        device_properties=first.device_properties,
        has_device=any(rt.has_device for rt in rts),
    )


def _analyze_loaded(
    path: Path | list[Path],
    kind: Literal["reftrain", "traces"],
    manifest: dict | None,
    metrics: pd.DataFrame | None,
    records: pd.DataFrame | None,
    traces: TraceSet,
    peak_flops: float | None,
    errors: list[str],
    warnings: list[str],
) -> RunAnalysis:
    """The metrics over loaded tables (pure: no file access)."""
    step_tables: list[pd.DataFrame] = []
    kernel_tables: list[pd.DataFrame] = []
    overlaps: dict[int, OverlapResult] = {}
    spans: dict[int, tuple[dict[str, int], int]] = {}
    sources: dict[int, Source] = {}
    device_names: dict[int, str | None] = {}
    rank_flops = []
    # Waiting at collectives, on each rank's trace clock: the breakdown's collective_wait part.
    waits = wait_intervals(collective_spans({r: rt.events for r, rt in traces.ranks.items()}))
    for rank, rt in sorted(traces.ranks.items()):
        source = source_of(rt.events)
        sources[rank] = source
        # Step windows clipped or dropped to fit the trace (analyzer.metrics.windows); flagged ones feed no rule.
        checked = check_windows(rt.events, rt.steps, rank)
        warnings += checked.warnings
        windows = checked.steps[["step", "start_ns", "end_ns"]]
        table = step_breakdown(rt.events, windows, source, waits.get(rank))
        table = table.merge(checked.steps[["step", "flagged"]].rename(columns={"flagged": "window_flagged"}), on="step", how="left")
        step_tables.append(table.assign(rank=rank))
        overlaps[rank] = overlap(rt.events, windows)
        spans[rank] = span_parts_ns(rt.events)
        kernel_tables.append(top_kernels(rt.events, windows, rank, TOP_KERNELS_PER_RANK))
        device_names[rank] = device_name_of(rt.events, rt.device_properties) if source == "device" else None
        if not windows.empty:
            rank_flops.append(rank_flops_from_shapes(rank, rt.events, windows))
    steps = _concat_steps(step_tables)

    # MFU: the manifest when the run has one, else trace shapes.
    mfu: MfuResult
    if manifest is not None:
        mfu = mfu_from_manifest(manifest, metrics, peak_flops=peak_flops)
        if mfu.source == "none" and rank_flops:
            fallback = mfu_from_trace_shapes(rank_flops, device_names, peak_flops)
            fallback.notes.insert(0, f"manifest MFU unavailable ({mfu.reason})")
            mfu = fallback if fallback.source != "none" else mfu
    else:
        mfu = mfu_from_trace_shapes(rank_flops, device_names, peak_flops) if rank_flops else MfuResult(
            "none", reason="no ProfilerStep windows to time the FLOPs against"
        )
    steps["mfu"] = _rank_step_mfu(steps, mfu, rank_flops)

    # Stragglers: steady-state metrics and collective records when the run has them.
    steady = None
    quiet = None  # steady-state steps not disturbed by trace or checkpoint writing
    if metrics is not None and not metrics.empty and {"rank", "step", "step_time_ms"} <= set(metrics.columns):
        m = manifest or {}
        steady = steady_state(metrics, int(m.get("warmup_steps") or 0), list(m.get("profiled_steps") or []))
        disturbed = disturbed_steps(m.get("profiled_steps") or [], (m.get("files") or {}).get("checkpoints") or [])
        quiet = steady.loc[~steady["step"].isin(sorted(disturbed))]
    if quiet is not None and not quiet.empty:
        step_times = quiet[["rank", "step", "step_time_ms"]]
        step_source = "metrics JSONL (steady-state steps, without the steps after trace or checkpoint writing)"
    else:
        usable = steps.loc[~steps["window_flagged"].fillna(False).astype(bool)] if "window_flagged" in steps.columns else steps
        step_times, step_source = usable[["rank", "step", "step_time_ms"]], "ProfilerStep windows (not flagged)"
    arrival_notes: list[str] = []
    if records is not None and not records.empty and "rank" in records.columns:
        offsets = ((manifest or {}).get("clock") or {}).get("offsets_ns")
        arrivals = arrivals_from_records(records, offsets)
        arrival_source = "collective records (collectives/rank*.jsonl), clocks aligned with clock.offsets_ns"
        if quiet is not None and not quiet.empty:
            arrivals = arrivals.loc[arrivals["step"].isin(quiet["step"].unique())].reset_index(drop=True)
    else:
        arrivals, arrival_source, arrival_notes = arrivals_from_traces({r: (rt.events, rt.steps) for r, rt in traces.ranks.items()})
        if arrival_source:
            arrival_source = f"trace {arrival_source} matched by order (assumes the ranks' clocks agree)"
    stragglers = find_stragglers(step_times, arrivals, step_source=step_source, arrival_source=arrival_source)
    stragglers.notes += arrival_notes
    collectives = collective_table(arrivals) if not arrivals.empty else None

    run_step_time = step_time(steady, steps)
    ranks = _rank_summaries(traces, steps, overlaps, sources, device_names, steady, run_step_time.source, spans)
    kernels = pd.concat(kernel_tables, ignore_index=True) if kernel_tables else top_kernels_empty()
    return RunAnalysis(
        path=path,
        kind=kind,
        manifest=manifest,
        ranks=ranks,
        steps=steps,
        mfu=mfu,
        stragglers=stragglers,
        kernels=kernels,
        collectives=collectives,
        errors=errors,
        warnings=warnings,
        metrics=metrics,
        step_time=run_step_time,
    )


def top_kernels_empty() -> pd.DataFrame:
    from analyzer.metrics.kernels import COLUMNS

    return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})


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
        return mfu.flops_per_step / (seconds * mfu.peak_flops_per_s)
    flops = pd.concat([rf.steps[["step", "flops"]].assign(rank=rf.rank) for rf in rank_flops], ignore_index=True)
    joined = steps[["rank", "step"]].merge(flops, on=["rank", "step"], how="left")
    return joined["flops"].to_numpy(np.float64) / (seconds * mfu.peak_flops_per_s)


def _rank_summaries(
    traces: TraceSet,
    steps: pd.DataFrame,
    overlaps: dict[int, OverlapResult],
    sources: dict[int, Source],
    device_names: dict[int, str | None],
    steady: pd.DataFrame | None,
    headline: str | None,
    spans: dict[int, tuple[dict[str, int], int]] | None = None,
) -> list[RankSummary]:
    """Per-rank summaries; each rank's ``step_time_ms`` follows the run's ``headline`` source."""
    ranks = set(traces.ranks)
    if steady is not None and not steady.empty:
        ranks |= set(int(r) for r in steady["rank"].unique())
    out = []
    for rank in sorted(ranks):
        table = steps.loc[steps["rank"] == rank] if not steps.empty else steps
        steady_ms = None
        if steady is not None and not steady.empty:
            mine = steady.loc[steady["rank"] == rank, "step_time_ms"]
            steady_ms = float(mine.median()) if len(mine) else None
        source = sources.get(rank)
        profiled_ms = float(table["step_time_ms"].median()) if len(table) else None
        # The run's choice, so that a rank's figure and the run's headline cover the same steps;
        # a rank missing those steps (no metrics file of its own) falls back to the other kind.
        if headline == "steady_state" and steady_ms is not None or profiled_ms is None:
            step_ms, kind = steady_ms, "steady_state"
        else:
            step_ms, kind = profiled_ms, "profiled_windows"
        step_src = STEP_TIME_LABELS[kind] if step_ms is not None else None
        ov = overlaps.get(rank)
        rt = traces.ranks.get(rank)
        span_parts, span_ns = (spans or {}).get(rank, ({}, 0))
        out.append(
            RankSummary(
                rank=rank,
                source=source,
                n_steps=int(len(table)),
                step_time_ms=step_ms,
                step_time_source=step_src,
                breakdown=summarize_breakdown(table, source) if source and len(table) else {},
                comm_comp_overlap_pct=ov.comm_comp_overlap_pct if ov else None,
                exposed_comm_pct=exposed_comm_pct(table) if len(table) else None,
                idle_pct=ov.idle_pct if ov else None,
                compute_pct=ov.compute_pct if ov else None,
                non_compute_pct=ov.non_compute_pct if ov else None,
                steady_step_time_ms=steady_ms,
                profiled_step_time_ms=profiled_ms,
                device_name=device_names.get(rank),
                trace=rt.path.name if rt else None,
                n_device_events=ov.n_device_events if ov else 0,
                gpu_timeline={k: 100.0 * v / span_ns for k, v in span_parts.items()} if span_ns > 0 else {},
                gpu_span_ms=span_ns / 1e6 if span_ns > 0 else None,
            )
        )
    return out
