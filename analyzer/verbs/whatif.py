"""``analyzer whatif``: a run's profiled steps replayed with the changes a user asks about.

Each rank's profiled step (ProfilerStep#N) becomes its dependency graph
(:func:`analyzer.metrics.depgraph.build_step_graph`), which
:mod:`analyzer.metrics.replay` re-simulates with the changes applied. Per
step the job's time is the slowest rank's (a synchronous job's ranks meet
at every collective); the run's measured and predicted step times are the
medians over profiled steps of those. MFU moves with throughput: ``MFU
after = MFU before * work * measured / predicted``, ``work`` the
micro-batch factor (the model FLOPs per sample do not change).
docs/cli.md ("whatif") and docs/suggestions.md ("Replay").
"""

from __future__ import annotations

import statistics
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import pandas as pd

from analyzer.errors import AnalyzerError
from analyzer.ingest.tables import RankTrace
from analyzer.jsontext import jsonable
from analyzer.metrics.critical_path import CriticalPath
from analyzer.metrics.depgraph import StepGraph
from analyzer.metrics.replay import (
    Change,
    EdgeFacts,
    Replay,
    ReplayError,
    Weights,
    accumulate,
    apply,
    collective_order,
    comm_bandwidth,
    edge_facts,
    faster,
    micro_batch_scale,
    no_launch_overhead,
    overlap_comm,
    replay,
    replayed_path,
    without_rank_delay,
)

SCHEMA = "analyzer.whatif/1"
# The replay of the unchanged graph must give the measured step within this (docs/suggestions.md, "Replay").
UNCHANGED_TOLERANCE = 0.02
# Ops of the new critical path listed per step.
TOP_PATH_OPS = 5


@dataclass(frozen=True)
class WhatIfRequest:
    """The changes to replay, in the order they apply (each one documented in analyzer.metrics.replay).

    ``faster``: (kernel class, factor) pairs; ``comm_bandwidth_gbps``: the
    collectives' bus bandwidth; ``micro_batch_scale``: the micro-batch
    growth factor; ``accumulate``: the factor on the micro-batches per
    optimizer step; ``remove_rank_delay``: the rank whose delay goes.
    """

    faster: tuple[tuple[str, float], ...] = ()
    comm_bandwidth_gbps: float | None = None
    no_launch_overhead: bool = False
    overlap_comm: bool = False
    micro_batch_scale: float | None = None
    accumulate: int | None = None
    remove_rank_delay: int | None = None

    def changes(self) -> list[Change]:
        out: list[Change] = [faster(cls, k) for cls, k in self.faster]
        if self.comm_bandwidth_gbps is not None:
            out.append(comm_bandwidth(self.comm_bandwidth_gbps))
        if self.no_launch_overhead:
            out.append(no_launch_overhead)
        if self.overlap_comm:
            out.append(overlap_comm)
        if self.micro_batch_scale is not None:
            out.append(micro_batch_scale(self.micro_batch_scale))
        if self.accumulate is not None:
            out.append(accumulate(self.accumulate))
        return out

    def describe(self) -> list[str]:
        """One phrase per change, in order."""
        out = [f"{cls} kernels {k:g}x faster" for cls, k in self.faster]
        if self.comm_bandwidth_gbps is not None:
            out.append(f"collectives at {self.comm_bandwidth_gbps:g} GB/s bus bandwidth")
        if self.no_launch_overhead:
            out.append("no launch overhead (CUDA graphs)")
        if self.overlap_comm:
            out.append("communication overlapped")
        if self.micro_batch_scale is not None:
            out.append(f"micro-batch {self.micro_batch_scale:g}x")
        if self.accumulate is not None:
            out.append(f"{self.accumulate}x the micro-batches per optimizer step")
        if self.remove_rank_delay is not None:
            out.append(f"rank {self.remove_rank_delay}'s delay removed")
        return out

    @property
    def work_ratio(self) -> float:
        """Work per step after over before: the micro-batch and accumulation factors."""
        return (self.micro_batch_scale or 1.0) * (self.accumulate or 1)


@dataclass(frozen=True)
class PathOp:
    """Events of one name on a replayed critical path: their time on it (ms), share of it (%), category."""

    name: str
    kind: str
    bound: str
    ms_on_path: float
    pct: float


@dataclass(frozen=True)
class StepWhatIf:
    """One profiled step: per rank the measured span, the unchanged and the changed replay (ms); the job's
    (slowest rank's) times; the new critical path (of the slowest rank after the change)."""

    step: int
    measured_ms: dict[int, float]
    unchanged_ms: dict[int, float]
    predicted_ms: dict[int, float]
    job_measured_ms: float
    job_predicted_ms: float
    rank_on_path: int
    breakdown_before_pct: dict[str, float]
    breakdown_after_pct: dict[str, float]
    path_ops: tuple[PathOp, ...]

    def to_json(self) -> dict[str, Any]:
        def by_rank(d: Mapping[int, float]) -> dict[str, Any]:
            return {str(r): jsonable(v) for r, v in sorted(d.items())}

        return {
            "step": self.step,
            "measured_ms": by_rank(self.measured_ms),
            "unchanged_ms": by_rank(self.unchanged_ms),
            "predicted_ms": by_rank(self.predicted_ms),
            "job_measured_ms": jsonable(self.job_measured_ms),
            "job_predicted_ms": jsonable(self.job_predicted_ms),
            "rank_on_path": self.rank_on_path,
            "breakdown_before_pct": {k: jsonable(v) for k, v in self.breakdown_before_pct.items()},
            "breakdown_after_pct": {k: jsonable(v) for k, v in self.breakdown_after_pct.items()},
            "path_ops": [
                {
                    "name": o.name,
                    "kind": o.kind,
                    "bound": o.bound,
                    "ms_on_path": jsonable(o.ms_on_path),
                    "pct": jsonable(o.pct),
                }
                for o in self.path_ops
            ],
        }


@dataclass(frozen=True)
class WhatIfResult:
    """The run's answer: measured and predicted step (median over profiled steps of the job's time), MFU."""

    path: str
    changes: tuple[str, ...]
    steps: tuple[StepWhatIf, ...]
    work_ratio: float
    mfu_before: float | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def measured_step_ms(self) -> float | None:
        return statistics.median(s.job_measured_ms for s in self.steps) if self.steps else None

    @property
    def predicted_step_ms(self) -> float | None:
        return statistics.median(s.job_predicted_ms for s in self.steps) if self.steps else None

    @property
    def unchanged_error(self) -> float | None:
        """Largest relative error of the unchanged replay against the measured span, over ranks and steps."""
        errs = [abs(s.unchanged_ms[r] / m - 1.0) for s in self.steps for r, m in s.measured_ms.items() if m > 0]
        return max(errs) if errs else None

    @property
    def speedup(self) -> float | None:
        """Throughput after over before: ``work * measured / predicted``."""
        m, p = self.measured_step_ms, self.predicted_step_ms
        return self.work_ratio * m / p if m and p else None

    @property
    def mfu_after(self) -> float | None:
        return None if self.mfu_before is None or self.speedup is None else self.mfu_before * self.speedup

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "path": self.path,
            "changes": list(self.changes),
            "step_time_ms": {
                "measured": jsonable(self.measured_step_ms),
                "predicted": jsonable(self.predicted_step_ms),
            },
            "work_ratio": jsonable(self.work_ratio),
            "speedup": jsonable(self.speedup),
            "mfu": {"measured": jsonable(self.mfu_before), "predicted": jsonable(self.mfu_after)},
            "unchanged_replay_max_error": jsonable(self.unchanged_error),
            "steps": [s.to_json() for s in self.steps],
            "notes": list(self.notes),
        }


def path_ops(path: CriticalPath, top: int) -> tuple[PathOp, ...]:
    """The ``top`` rows of a critical path's ops (ranked by time on it)."""
    ops = path.ops.head(top)
    return tuple(
        PathOp(name=str(n), kind=str(k), bound=str(b), ms_on_path=float(ms), pct=float(p))
        for n, k, b, ms, p in zip(ops["name"], ops["kind"], ops["bound"], ops["ms_on_path"], ops["pct"])
    )


def whatif_graphs(
    steps: Mapping[int, Mapping[int, tuple[StepGraph, pd.DataFrame]]],
    request: WhatIfRequest,
    *,
    path: str = "",
    mfu_before: float | None = None,
    top: int = TOP_PATH_OPS,
) -> WhatIfResult:
    """Replay every (step -> rank -> (graph, rank's events)) with ``request``'s changes (pure).

    Raises ReplayError when a change does not apply (a rank's delay without
    that rank, or with one rank only).
    """
    changes = request.changes()
    notes: list[str] = []
    out: list[StepWhatIf] = []
    for step in sorted(steps):
        ranks = steps[step]
        facts: dict[int, EdgeFacts] = {r: edge_facts(g, ev) for r, (g, ev) in ranks.items()}
        for f in facts.values():
            notes += [n for n in f.notes if n not in notes]
        weights: dict[int, Weights] = {r: apply(g, facts[r], []) for r, (g, _) in ranks.items()}
        before = {r: replay(g, weights[r]) for r, (g, _) in ranks.items()}
        after_weights = dict(weights)
        if request.remove_rank_delay is not None:
            if len(ranks) < 2:
                raise ReplayError("--remove-rank-delay needs the traces of two or more ranks")
            graphs = {r: g for r, (g, _) in ranks.items()}
            order = {r: collective_order(g, facts[r], ev) for r, (g, ev) in ranks.items()}
            after_weights = without_rank_delay(graphs, facts, order, request.remove_rank_delay)
        after: dict[int, tuple[Replay, Weights]] = {}
        for r, w in after_weights.items():
            g = ranks[r][0]
            for change in changes:
                w = change(g, facts[r], w)
            after[r] = (replay(g, w), w)
        slow = max(after, key=lambda r: (after[r][0].length_ns, -r))
        slow_before = max(before, key=lambda r: (before[r].length_ns, -r))
        path_before = replayed_path(ranks[slow_before][0], before[slow_before], ranks[slow_before][1])
        path_after = replayed_path(ranks[slow][0], after[slow][0], ranks[slow][1])
        out.append(
            StepWhatIf(
                step=step,
                measured_ms={r: b.measured_ms for r, b in before.items()},
                unchanged_ms={r: b.length_ms for r, b in before.items()},
                predicted_ms={r: a.length_ms for r, (a, _) in after.items()},
                job_measured_ms=max(b.measured_ms for b in before.values()),
                job_predicted_ms=after[slow][0].length_ms,
                rank_on_path=slow,
                breakdown_before_pct=path_before.breakdown_pct,
                breakdown_after_pct=path_after.breakdown_pct,
                path_ops=path_ops(path_after, top),
            )
        )
    result = WhatIfResult(
        path=path,
        changes=tuple(request.describe()),
        steps=tuple(out),
        work_ratio=request.work_ratio,
        mfu_before=mfu_before,
        notes=tuple(notes),
    )
    err = result.unchanged_error
    if err is not None and err > UNCHANGED_TOLERANCE:
        notes.append(
            f"the unchanged replay is {err:.1%} off the measured step (over {UNCHANGED_TOLERANCE:.0%}): "
            "the graph misses a constraint, so the predictions are not reliable"
        )
    if not out:
        notes.append("no profiled step (ProfilerStep#N) in the traces: nothing to replay")
    return WhatIfResult(**{**result.__dict__, "notes": tuple(notes)})


def step_graphs(traces: Sequence[RankTrace]) -> dict[int, dict[int, tuple[StepGraph, pd.DataFrame]]]:
    """step -> rank -> (its graph, the rank's events) for every profiled step of every trace (a rank's
    profiler windows are separate traces with different steps)."""
    from analyzer.metrics.depgraph import build_step_graph

    out: dict[int, dict[int, tuple[StepGraph, pd.DataFrame]]] = {}
    for trace in sorted(traces, key=lambda t: t.rank):
        for step in trace.steps["step"].astype(int).tolist():
            out.setdefault(step, {})[trace.rank] = (build_step_graph(trace, step), trace.events)
    return out


def run_traces(path: Path, cache: bool = True) -> tuple[list[RankTrace], list[str]]:
    """Every trace of a run directory (each profiler window of each rank), a folder of traces or one file,
    and one line per file that could not be used. Raises AnalyzerError when none loads."""
    from analyzer.ingest.load import expand_paths, load_traces
    from analyzer.ingest.rundir import MANIFEST, read_run_dir

    files = read_run_dir(path).trace_paths if (path / MANIFEST).is_file() else expand_paths(path)[0]
    traces: list[RankTrace] = []
    problems: list[str] = []
    for f in files:  # one at a time: a folder's loader keeps one trace per rank, a run has one per window
        loaded = load_traces(f, cache=cache, progress=False)
        traces += list(loaded.ranks.values())
        problems += [str(e) for e in loaded.errors]
    if not traces:
        raise AnalyzerError(f"{path}: no trace to replay" + (f" ({problems[0]})" if problems else ""))
    return traces, problems


def whatif(
    traces: Sequence[RankTrace], request: WhatIfRequest, *, path: str = "", mfu_before: float | None = None
) -> WhatIfResult:
    """:func:`whatif_graphs` over the profiled steps of ``traces``."""
    return whatif_graphs(step_graphs(traces), request, path=path, mfu_before=mfu_before)


def parse_faster(items: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """``CLASS=K`` items (``gemm=2``) as (class, factor) pairs; ReplayError names a malformed one."""
    out = []
    for item in items:
        cls, sep, k = item.partition("=")
        try:
            factor = float(k)
        except ValueError:
            factor = float("nan")
        if not sep or not cls or not factor > 0:
            raise ReplayError(f"--faster {item!r}: expected KERNEL_CLASS=FACTOR with a positive factor, e.g. gemm=2")
        faster(cls, factor)  # the class is checked here, before any trace is read
        out.append((cls, factor))
    return tuple(out)


__all__ = ["SCHEMA", "StepWhatIf", "WhatIfRequest", "WhatIfResult", "parse_faster", "whatif", "whatif_graphs"]
