"""A rank's trace with its critical paths marked, for the Perfetto UI (``analyzer report --critical-path-trace``).

HTA's ``overlay_critical_path_analysis`` is the model: every event on a
profiled step's critical path gets ``args.critical = 1``, and flow arrows
(``cat: "critical_path"``) follow the path where it jumps from one thread
or stream to another (a launch to its kernel, a kernel to the host op
that waited for it, one stream to the next). The file is written from
the rank's events table (docs/loading.md, "Tables"), not copied from the
original JSON: every complete event the loader keeps, with the arguments
the tables hold (correlation, stream, shapes, collective fields), so
:func:`analyzer.ingest.load.load_traces` reads it back into the same table.

Per marked event, ``args`` also holds ``critical_path_steps`` (the steps
whose path passes through it) and ``critical_path_ms`` (its time on those
paths, ms: the weights of the path edges attributed to it). Each arrow's
``args`` give the edge's kind (:data:`~analyzer.metrics.depgraph.EDGE_KINDS`),
its weight in ns and its step.

Times: event times are written in µs with three decimals (ns exact),
counted from the rank's first event; ``baseTimeNanoseconds`` moves by the
same amount, so the Unix time of every event is kept.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import orjson
import pandas as pd

from analyzer.errors import AnalyzerError
from analyzer.ingest.load import expand_paths, load_traces
from analyzer.ingest.tables import RankTrace
from analyzer.metrics.critical_path import CriticalPath, critical_paths
from analyzer.metrics.depgraph import EDGE_KINDS

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis

FLOW_CAT = "critical_path"
MARK_ARG = "critical"
# Columns of the events table written back as the Kineto argument they were read from (docs/loading.md).
_INT_ARGS = (
    ("correlation", "correlation"),
    ("external_id", "External id"),
    ("seq_num", "Sequence number"),
    ("fwd_tid", "Fwd thread id"),
    ("msg_in_nelems", "In msg nelems"),
    ("msg_out_nelems", "Out msg nelems"),
    ("group_size", "Group size"),
)
_TEXT_ARGS = (("coll_name", "Collective name"), ("msg_dtype", "dtype"), ("pg_name", "Process Group Name"))
_JSON_ARGS = (("input_dims", "Input Dims"), ("input_types", "Input type"), ("concrete_inputs", "Concrete Inputs"))


@dataclass(frozen=True)
class OverlayTrace:
    """An overlaid trace: the Chrome-trace ``document``, the rank, its trace file, and what is marked:
    ``steps`` (the profiled steps whose paths are marked), ``n_marked`` events and ``n_flows`` arrows."""

    document: dict[str, Any]
    rank: int
    source: Path
    steps: tuple[int, ...]
    n_marked: int
    n_flows: int

    def to_bytes(self) -> bytes:
        """The document as gzip-compressed JSON (what Perfetto opens as ``.json.gz``)."""
        return gzip.compress(orjson.dumps(self.document), compresslevel=6, mtime=0)

    def write(self, out: Path) -> None:
        """Write the document to ``out``: gzip-compressed when the name ends in ``.gz``, else plain JSON."""
        data = self.to_bytes() if out.name.endswith(".gz") else orjson.dumps(self.document)
        try:
            out.write_bytes(data)
        except OSError as exc:
            raise AnalyzerError(f"{out}: cannot write the critical-path trace ({exc.strerror or exc})") from exc


def _us(ns: np.ndarray) -> list[float]:
    # ns -> µs with three decimals. Exact: times count from the rank's first event, far below 2**53 ns.
    return (ns / 1000.0).round(3).tolist()


def _event_args(events: pd.DataFrame) -> list[dict[str, Any]]:
    """Per row, the Kineto arguments the events table keeps (absent values left out)."""
    n = len(events)
    args: list[dict[str, Any]] = [{} for _ in range(n)]
    stream = events["stream"].to_numpy()
    for i in np.flatnonzero(stream >= 0):
        args[i]["stream"] = int(stream[i])
    for column, key in _INT_ARGS:
        values = events[column].to_numpy()
        for i in np.flatnonzero(values >= 0):
            args[i][key] = int(values[i])
    for column, key in _TEXT_ARGS:
        values = events[column].astype(object).to_numpy()
        for i in np.flatnonzero(pd.notna(values)):
            args[i][key] = str(values[i])
    for column, key in _JSON_ARGS:
        values = events[column].to_numpy()
        for i in np.flatnonzero(pd.notna(values)):
            args[i][key] = orjson.loads(values[i])
    return args


def overlay_trace(rt: RankTrace, paths: Sequence[CriticalPath]) -> OverlayTrace:
    """The rank's events as a Chrome trace with ``paths`` marked (module docstring); pure."""
    ev = rt.events
    t0 = int(ev["start_ns"].min()) if len(ev) else 0
    start = ev["start_ns"].to_numpy() - t0
    end = ev["end_ns"].to_numpy() - t0
    pid, tid = ev["pid"].to_numpy(), ev["tid"].to_numpy()
    args = _event_args(ev)
    flows: list[dict[str, Any]] = []
    marked: set[int] = set()
    for cp in paths:
        g = cp.graph
        for e in (int(x) for x in cp.path_edges):
            src, dst = int(g.edge_src[e]), int(g.edge_dst[e])
            for node in (src, dst):
                if g.node_event[node] >= 0:
                    _mark(args[int(g.node_event[node])], cp.step, 0)
                    marked.add(int(g.node_event[node]))
            owner = int(g.edge_event[e])
            if owner >= 0:
                _mark(args[owner], cp.step, int(g.edge_weight_ns[e]))
                marked.add(owner)
            a, b = int(g.node_event[src]), int(g.node_event[dst])
            if a < 0 or b < 0 or (pid[a], tid[a]) == (pid[b], tid[b]):
                continue  # the path stays on one lane: the marks show it
            flow_args = {
                "kind": EDGE_KINDS[int(g.edge_kind[e])],
                "weight_ns": int(g.edge_weight_ns[e]),
                "step": cp.step,
            }
            flows += [
                _flow(len(flows) // 2, a, _node_ns(g, src, start, end, a), pid, tid, True, flow_args),
                _flow(len(flows) // 2, b, _node_ns(g, dst, start, end, b), pid, tid, False, flow_args),
            ]
    for event_args in args:
        if MARK_ARG in event_args:
            event_args["critical_path_ms"] = event_args.pop("_ns") / 1e6
    ts, dur = _us(start), _us(end - start)
    cats, names = ev["cat"].astype(str).tolist(), ev["name"].astype(str).tolist()
    trace_events: list[dict[str, Any]] = [
        {"ph": "X", "cat": c, "name": n, "pid": int(p), "tid": int(t), "ts": s, "dur": d, "args": a}
        for c, n, p, t, s, d, a in zip(cats, names, pid, tid, ts, dur, args)
    ]
    trace_events += _metadata(rt)
    trace_events += flows
    doc: dict[str, Any] = {
        "schemaVersion": 1,
        "distributedInfo": dict(rt.distributed_info),
        "deviceProperties": list(rt.device_properties),
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": rt.clock_origin_ns + t0,
        "traceEvents": trace_events,
    }
    return OverlayTrace(doc, rt.rank, rt.path, tuple(cp.step for cp in paths), len(marked), len(flows) // 2)


def _mark(a: dict[str, Any], step: int, weight_ns: int) -> None:
    if MARK_ARG not in a:
        a[MARK_ARG] = 1
        a["critical_path_steps"] = []
        a["_ns"] = 0
    if step not in a["critical_path_steps"]:
        a["critical_path_steps"].append(step)
    a["_ns"] += weight_ns


def _node_ns(g: Any, node: int, start: np.ndarray, end: np.ndarray, event: int) -> int:
    """Where an arrow meets its event: the event's start, or 1 ns before its end (HTA's nudge), so that
    Perfetto binds the arrow to this event and not to the one starting where it ends."""
    if g.node_is_start[node]:
        return int(start[event])
    return int(end[event]) - (1 if end[event] > start[event] else 0)


def _flow(
    flow_id: int, event: int, at_ns: int, pid: np.ndarray, tid: np.ndarray, is_start: bool, args: dict[str, Any]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ph": "s" if is_start else "f",
        "id": flow_id,
        "pid": int(pid[event]),
        "tid": int(tid[event]),
        "ts": round(at_ns / 1000.0, 3),
        "cat": FLOW_CAT,
        "name": FLOW_CAT,
        "args": args,
    }
    if not is_start:
        out["bp"] = "e"  # bind to the enclosing slice, as Kineto's and HTA's flow ends do
    return out


def _metadata(rt: RankTrace) -> list[dict[str, Any]]:
    """Process and thread names (and process labels), as Kineto's metadata events write them."""
    out: list[dict[str, Any]] = []
    procs = rt.processes
    for pid, name, labels in zip(procs["pid"].tolist(), procs["name"].tolist(), procs["labels"].tolist()):
        out.append({"ph": "M", "name": "process_name", "pid": int(pid), "tid": 0, "args": {"name": str(name)}})
        if isinstance(labels, str) and labels:
            out.append({"ph": "M", "name": "process_labels", "pid": int(pid), "tid": 0, "args": {"labels": labels}})
    threads = rt.threads
    for pid, tid, name in zip(threads["pid"].tolist(), threads["tid"].tolist(), threads["name"].tolist()):
        out.append({"ph": "M", "name": "thread_name", "pid": int(pid), "tid": int(tid), "args": {"name": str(name)}})
    return out


def critical_path_trace(trace_file: Path) -> OverlayTrace:
    """Load one trace file (through the parse cache), find each profiled step's critical path and mark it.

    Raises AnalyzerError (one line naming the file) when the file cannot be
    read or has no profiled step, so no path to mark.
    """
    loaded = load_traces([trace_file], cache=True, progress=False)
    if loaded.errors:
        raise AnalyzerError(str(loaded.errors[0]))
    if len(loaded.ranks) != 1:
        raise AnalyzerError(f"{trace_file}: not one rank's trace")
    rt = next(iter(loaded.ranks.values()))
    paths = critical_paths(rt)
    if not paths:
        raise AnalyzerError(f"{trace_file}: no ProfilerStep window, so no critical path to mark")
    return overlay_trace(rt, paths)


def rank_trace_file(a: "RunAnalysis", rank: int | None) -> Path:
    """The trace file of ``rank`` (default: the first rank with a critical path) in an analysis:
    its last profiler window's file. Raises AnalyzerError when there is none."""
    from analyzer.execute import locate

    if rank is None:
        if a.critical_path is None:
            raise AnalyzerError("critical paths not computed: analyze(..., critical_path=True), or --critical-path")
        with_paths = sorted({p.rank for p in a.critical_path.paths})
        if not with_paths:
            raise AnalyzerError("no rank has a profiled step with a critical path (no ProfilerStep markers)")
        rank = with_paths[0]
    names = {r.rank: r.trace for r in a.ranks}
    if names.get(rank) is None:
        raise AnalyzerError(f"rank {rank}: not in this run (ranks: {', '.join(map(str, sorted(names))) or 'none'})")
    paths = a.path if isinstance(a.path, list) else [a.path]
    for files in locate(paths).sets:
        for f in expand_paths(files if len(files) > 1 else files[0])[0]:
            if f.name == names[rank]:
                return f
    raise AnalyzerError(f"rank {rank}: its trace file {names[rank]} is gone since the analysis")
