"""Every metric function of the layer, registered once, with the tables it reads.

A metric is a pure function over tables (docs/architecture.md, "A metric").
:data:`METRICS` names each one with the kind of input each of its table
parameters takes; :data:`EMPTY_INPUTS` builds every kind empty, with the
real schema: the ingest tables from :mod:`analyzer.ingest.tables` and
:mod:`analyzer.ingest.rundir` (``empty_events()``, ``METRICS_COLUMNS``, ...),
a run manifest from :class:`analyzer.ingest.formats.RunManifest`, and an
intermediate table (a step table, the matmul ops, a rank's arrivals) as its
producing metric returns it on empty tables.

tests/test_invariants.py runs every registered metric on empty
inputs and requires its typed empty result (an instance of its return
annotation, no warning, nothing measured), and requires every public
function of ``analyzer.metrics.*`` that takes a ``pd.DataFrame`` to be
registered here. Adding a metric: write the function, add one
:func:`metric` line below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analyzer.ingest import tables
from analyzer.ingest.formats import RunManifest
from analyzer.ingest.rundir import COLLECTIVES_COLUMNS, METRICS_COLUMNS
from analyzer.metrics import (
    attribution,
    breakdown,
    collective_model,
    collectives,
    critical_path,
    curves,
    depgraph,
    goodput,
    idle,
    kernels,
    launch,
    machine_speed,
    matmul_flops,
    memory,
    mfu,
    overlap,
    passes,
    replay,
    roofline,
    step_time,
    stragglers,
    taxonomy,
    throughput,
    timeline,
    windows,
    workload,
)


def _frame(columns: Mapping[str, str]) -> pd.DataFrame:
    """A table with no rows and the documented columns and dtypes."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})


def _no_rows() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


# Each kind of input a metric reads, built empty. Raw inputs first (the ingest layer's
# tables, a run directory's files), then what a metric makes of them on empty tables.
EMPTY_INPUTS: dict[str, Callable[[], Any]] = {
    "events": tables.empty_events,
    "steps": tables.empty_steps,
    "event_rows": lambda: tables.empty_events().index,
    "metrics": lambda: _frame(METRICS_COLUMNS),
    "collective_records": lambda: _frame(COLLECTIVES_COLUMNS),
    "manifest": lambda: RunManifest().to_json(),
    "times_ns": _no_rows,
    "ids": _no_rows,
    "event_flags": lambda: np.zeros(0, dtype=bool),
    "step_table": lambda: breakdown.step_breakdown(tables.empty_events(), tables.empty_steps()),
    "pieces": lambda: breakdown.breakdown_pieces(tables.empty_events(), tables.empty_steps()),
    "comm_kernels": lambda: collectives.collective_table(tables.empty_events()),
    "launches": lambda: launch.launches(tables.empty_events()),
    "matmul_ops": lambda: matmul_flops.matmul_ops(tables.empty_events()),
    "flop_kernels": lambda: matmul_flops.flop_kernels(
        tables.empty_events(), matmul_flops.matmul_ops(tables.empty_events())
    ),
    "arrivals": lambda: stragglers.arrivals_from_records(_frame(COLLECTIVES_COLUMNS), None),
    "spans": lambda: stragglers.match_collective_spans({0: None}),
    "matched_collectives": lambda: stragglers.collective_table(EMPTY_INPUTS["arrivals"]()),
    "collective_times": lambda: collective_model.collective_times(EMPTY_INPUTS["matched_collectives"]()),
    "values": lambda: np.zeros(0, dtype=np.float64),
    "curves": lambda: curves.training_curves(None, _frame(METRICS_COLUMNS)).table,
    "window_device": lambda: idle.window_device(tables.empty_events(), tables.empty_steps()),
    "device_gaps": lambda: idle.device_gaps(idle.window_device(tables.empty_events(), tables.empty_steps())),
    # Per rank (one rank, 0, with empty tables: the map over a rank that recorded nothing).
    "events_by_rank": lambda: {0: tables.empty_events()},
    "steps_by_rank": lambda: {0: tables.empty_steps()},
    "origins": lambda: {0: 0},
    "device_names": lambda: {0: None},
    "rank_tables": lambda: {0: (tables.empty_events(), tables.empty_steps())},
    "rank_arrivals": lambda: {0: stragglers.rank_arrivals(0, tables.empty_events(), tables.empty_steps())},
    "rank_spans": lambda: {0: stragglers.rank_collective_spans(0, tables.empty_events())},
    "rank_flops": lambda: [mfu.rank_flops_from_shapes(0, tables.empty_events(), tables.empty_steps())],
    "rank_attribution": lambda: {0: attribution.rank_attribution(tables.empty_events(), tables.empty_steps())},
    "run_curves": lambda: {"run": curves.training_curves(None, _frame(METRICS_COLUMNS))},
    "rank_idle": lambda: {0: idle.rank_idle(tables.empty_events(), tables.empty_steps())},
    "memory_events": memory.empty_events,
    "memory_steps": lambda: memory.metrics_step_memory(_frame(METRICS_COLUMNS)),
    "rank_memory": lambda: {0: memory.rank_memory(memory.empty_events(), tables.empty_steps())},
    "op_shapes": lambda: attribution.run_attribution({}).shapes,
    "step_graph": lambda: depgraph.step_graph(tables.empty_events(), tables.empty_steps(), -1),
    "replay": lambda: replay.replay(EMPTY_INPUTS["step_graph"]()),
    "edge_facts": lambda: replay.edge_facts(EMPTY_INPUTS["step_graph"](), tables.empty_events()),
}


@dataclass(frozen=True)
class Metric:
    """One registered metric: ``fn``, the input kind of each table parameter (``reads``), values
    for its other required parameters (``params``), and the fields of its result that echo a
    setting or a coordinate rather than measure anything (``echoes``: not empty on empty tables)."""

    fn: Callable[..., Any]
    reads: Mapping[str, str]
    params: Mapping[str, Any] = field(default_factory=dict)
    echoes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """``module.function``, e.g. ``overlap.overlap``."""
        return f"{self.fn.__module__.rsplit('.', 1)[-1]}.{self.fn.__name__}"

    def on_empty(self) -> Any:
        """The metric of empty inputs (each read built by :data:`EMPTY_INPUTS`)."""
        args = {p: EMPTY_INPUTS[kind]() for p, kind in self.reads.items()}
        return self.fn(**args, **self.params)


def metric(
    fn: Callable[..., Any], params: Mapping[str, Any] | None = None, echoes: tuple[str, ...] = (), **reads: str
) -> Metric:
    """A :class:`Metric`: ``metric(overlap.overlap, events="events", steps="steps")``."""
    unknown = sorted(set(reads.values()) - set(EMPTY_INPUTS))
    if unknown:
        raise KeyError(f"{fn.__name__}: input kinds {unknown} are not in EMPTY_INPUTS")
    return Metric(fn, reads, dict(params or {}), echoes)


METRICS: tuple[Metric, ...] = (
    # attribution: kernels to ops, modules and annotations
    metric(attribution.attribute, events="events", steps="steps"),
    metric(attribution.rank_attribution, events="events", steps="steps"),
    metric(attribution.run_attribution, parts="rank_attribution"),
    # breakdown: the step's parts
    metric(breakdown.source_of, events="events"),
    metric(breakdown.device_timeline, events="events"),
    metric(breakdown.host_timeline, events="events"),
    metric(breakdown.phase_annotations, events="events"),
    metric(breakdown.issuing_threads_busy, events="events"),
    metric(breakdown.step_breakdown, events="events", steps="steps"),
    metric(breakdown.breakdown_pieces, events="events", steps="steps"),
    metric(breakdown.with_waits, params={"waits": None}, pieces="pieces"),
    metric(breakdown.summarize_breakdown, params={"source": "device"}, table="step_table"),
    # collective_model: service times, the exposed tail, the alpha-beta fit, sync delay
    metric(collective_model.collective_times, collectives="matched_collectives"),
    metric(collective_model.service_times_ms, times="collective_times"),
    metric(collective_model.collective_tail_ms, times="collective_times"),
    metric(collective_model.fit_alpha_beta, bytes_="values", service_ms="values"),
    metric(collective_model.sync_delay_ms, collectives="matched_collectives"),
    # collectives: sizes, bandwidths, alpha-beta, diagnosis
    metric(collectives.collective_table, events="events"),
    metric(collectives.alpha_beta, table="comm_kernels"),
    metric(collectives.diagnose, params={"link_gbps": None}, table="comm_kernels"),
    metric(collectives.diagnose_unsized, table="comm_kernels"),
    # curves: training curves of the metrics records
    metric(
        critical_path.critical_path,
        echoes=("rank", "step", "graph"),
        graph="step_graph",
        events="events",
    ),
    metric(
        depgraph.step_graph,
        params={"step": -1},
        echoes=("rank", "step", "start_node", "end_node"),
        events="events",
        steps="steps",
    ),
    # replay: the step graph replayed with changed weights (what-if)
    metric(replay.replayed_path, echoes=("rank", "step", "graph"), graph="step_graph", r="replay", events="events"),
    metric(replay.edge_facts, graph="step_graph", events="events"),
    metric(replay.collective_order, graph="step_graph", facts="edge_facts", events="events"),
    metric(curves.training_curves, manifest="manifest", metrics="metrics"),
    metric(curves.smooth, params={"window": 5}, table="curves"),
    metric(curves.overlay, params={"metric": "loss"}, curves="run_curves"),
    # goodput
    metric(goodput.goodput, manifest="manifest", metrics="metrics"),
    # machine_speed: CPU time per step in canary units
    metric(machine_speed.canary_cost_per_step, params={"warmup_steps": 0, "profiled_steps": []}, metrics="metrics"),
    # idle: why the GPU is idle
    metric(idle.window_device, events="events", steps="steps"),
    metric(idle.stream_idle, dev="window_device"),
    metric(idle.device_gaps, dev="window_device"),
    metric(idle.launch_stats, events="events", steps="steps"),
    metric(idle.host_syncs, events="events", steps="steps", gaps="device_gaps"),
    metric(idle.pageable_copies, events="events", steps="steps"),
    metric(idle.rank_idle, events="events", steps="steps"),
    metric(idle.run_idle, parts="rank_idle"),
    # kernels
    metric(kernels.top_kernels, params={"rank": 0}, events="events", steps="steps"),
    # launch: launch calls and the ops around them
    metric(launch.launches, events="events"),
    metric(launch.launching_op, events="events", device_rows="event_rows", ops="launches"),
    metric(launch.innermost_containing, ops="launches", q_pid="ids", q_tid="ids", q_t="times_ns"),
    # passes: backward ranges of every era, activation recompute
    metric(passes.thread_ranges, frame="events"),
    metric(passes.backward_ranges, events="events"),
    metric(passes.in_backward, events="events"),
    metric(passes.recompute_ops, events="events", backward="event_flags"),
    metric(passes.recompute_ranges, events="events", backward="event_flags"),
    metric(passes.stopped_recompute, params={"flop_ops": frozenset()}, events="events", backward="event_flags"),
    # matmul FLOPs
    metric(matmul_flops.matmul_ops, events="events"),
    metric(matmul_flops.flop_kernels, events="events", ops="matmul_ops"),
    metric(matmul_flops.charged_ops, ops="matmul_ops", kernels="flop_kernels"),
    metric(matmul_flops.dominant_dtype, ops="matmul_ops"),
    # memory: peaks per step and rank, the timeline
    metric(memory.step_peaks, events="memory_events", steps="steps"),
    metric(memory.memory_timeline, events="memory_events"),
    metric(memory.rank_memory, events="memory_events", steps="steps"),
    metric(memory.metrics_step_memory, metrics="metrics"),
    metric(memory.trace_step_memory, parts="rank_memory"),
    metric(memory.trace_rank_peaks, parts="rank_memory"),
    metric(memory.rank_peaks, steps="memory_steps"),
    metric(memory.run_memory, metrics="metrics", parts="rank_memory"),
    # MFU
    metric(mfu.steady_state, params={"warmup_steps": 0, "profiled_steps": []}, metrics="metrics"),
    metric(mfu.mfu_from_manifest, manifest="manifest", metrics="metrics"),
    metric(mfu.rank_flops_from_shapes, params={"rank": 0}, events="events", steps="steps"),
    metric(mfu.device_name_of, params={"device_properties": []}, events="events"),
    metric(mfu.mfu_from_trace_shapes, ranks="rank_flops", device_names="device_names"),
    metric(mfu.flop_coverage, ranks="rank_flops"),
    metric(mfu.rank_step_mfu, params={"flops_per_step": 1e9, "peak_flops_per_s": 1e12}, step_table="step_table"),
    # roofline: per-op efficiency
    metric(roofline.roofline, shapes="op_shapes"),
    # overlap (HTA's definitions)
    metric(overlap.hta_window, events="events", steps="steps"),
    metric(overlap.overlap, events="events", steps="steps"),
    metric(overlap.exposed_comm_pct, step_table="step_table"),
    metric(overlap.span_breakdown, events="events"),
    metric(overlap.span_parts_ns, events="events"),
    metric(overlap.kernel_utilization, events="events", win_start_ns="times_ns", win_end_ns="times_ns"),
    # step time
    metric(step_time.median_of_rank_mean, table="metrics"),
    metric(step_time.step_time, steady="metrics", profiled="step_table"),
    # stragglers and the waits at collectives
    metric(stragglers.arrivals_from_records, params={"offsets_ns": None}, collectives="collective_records"),
    metric(stragglers.rank_collective_events, events="events"),
    metric(stragglers.arrivals_from_traces, per_rank="rank_tables"),
    metric(stragglers.rank_arrivals, params={"rank": 0}, events="events", steps="steps"),
    metric(stragglers.match_arrivals, per_rank="rank_arrivals"),
    metric(stragglers.collective_table, arrivals="arrivals"),
    metric(stragglers.collective_spans, per_rank="events_by_rank"),
    metric(stragglers.rank_collective_spans, params={"rank": 0}, events="events"),
    metric(stragglers.match_collective_spans, per_rank="rank_spans"),
    metric(stragglers.wait_intervals, spans="spans"),
    # The thresholds it applied are part of the result (StragglerResult.config).
    metric(
        stragglers.find_stragglers,
        params={"step_source": None, "arrival_source": None},
        echoes=("config",),
        step_times="metrics",
        arrivals="arrivals",
    ),
    # taxonomy: kernel classes
    metric(taxonomy.kernel_class, events="events"),
    metric(taxonomy.row_classes, events="events"),
    metric(taxonomy.collective_kinds, events="events"),
    # throughput
    metric(throughput.throughput, manifest="manifest", metrics="metrics"),
    # timeline: occupancy over time. A span is a coordinate, not a measurement: active_span's
    # fallback (0, 1) keeps callers' spans non-empty. occupancy's rows are its bins (n_bins of
    # the given span), all in the remainder state ("other"/"idle") when nothing ran.
    metric(
        timeline.occupancy,
        params={"origin_ns": 0, "span_ns": (0, 1000), "n_bins": 10},
        echoes=("<result>",),
        events="events",
    ),
    metric(timeline.align_origins, steps_by_rank="steps_by_rank", events_by_rank="events_by_rank"),
    metric(
        timeline.active_span,
        params={"source": "device"},
        echoes=("<result>",),
        events_by_rank="events_by_rank",
        origins="origins",
    ),
    metric(
        timeline.select_window,
        params={"span_ns": (0, 1000), "max_events": 100, "source": "device"},
        events_by_rank="events_by_rank",
        origins="origins",
    ),
    metric(
        timeline.overview,
        params={"n_bins": 10},
        echoes=("span_ns", "occupancy"),
        events_by_rank="events_by_rank",
        steps_by_rank="steps_by_rank",
    ),
    # One rank's fine grid of one window (None without timeline events): the map's share of the overview.
    metric(
        timeline.timeline_grid,
        params={"source": "device", "window": None, "trace": "rank0.json"},
        events="events",
        steps="steps",
    ),
    # windows: ProfilerStep windows and their checks
    metric(windows.events_extent, events="events"),
    metric(windows.check_windows, params={"rank": 0}, events="events", steps="steps"),
    # workload: tokens from input shapes, activation recompute
    metric(workload.rank_workload, events="events", steps="steps"),
)

__all__ = ["EMPTY_INPUTS", "METRICS", "Metric", "metric"]
