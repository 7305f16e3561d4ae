"""CUDA/HIP graph replays mapped to the ops that were captured into them.

A graph replay runs many kernels from one ``cudaGraphLaunch``/``hipGraphLaunch``
call; every replayed kernel carries that call's correlation id, and no op
with shapes lies around it, so the kernels have no op, no shapes and no
FLOPs. LLM servers (vLLM, SGLang) save, beside such a trace, the trace of
the capture itself, in TraceLens's layout::

    trace.json.gz
    capture_traces/
        execution_details.json   [{"file": "bs_32_rank0.json.gz", "batch_size": 32, "mode": "FULL"}, ...]
        bs_32_rank0.json.gz      the profiler trace taken while the graph was captured

In a capture trace the kernels are launched between ``*StreamBeginCapture``
and ``*StreamEndCapture`` but not run: each launch call
(``cudaLaunchKernel``, ``hipExtModuleLaunchKernel``, ...) sits inside the
ops that issued it, with their shapes, and names its kernel in
``args.kernel``. A replay runs the captured launches in capture order, so
the i-th kernel of a replay (by start time) is the i-th launch of its
capture: on the shared SGLang decode trace all 544 names agree position by
position. TraceLens's reports (``perf_csvs/ops_summary.csv``) charge the
replayed kernels to the captured ops in the same way, with the captured
call stacks (``nn.Module: MergedColumnParallelLinear`` and so on).

:func:`splice_replays` applies that mapping to a replay trace's events
table: for every graph launch whose kernel names equal, in order, the
launches of one captured graph, it adds the captured ops (``cpu_op`` rows
enclosing a launch) and one launch call per kernel on a thread of their
own (named ``hipLaunchKernel (captured)`` and so on: not calls made at
replay time), and gives each replayed kernel its launch's correlation id. Every
analysis that follows launches to ops (FLOPs, roofline, op attribution)
then sees the replayed kernels' ops and shapes. The added rows keep the
capture's nesting and order but not its durations: they are laid out, in
order, inside the graph launch call's own interval (the capture ran long
before), on a thread named :data:`SPLICED_THREAD_NAME`. A replay that
matches no capture is left as it was and named in a note, so its kernel
time stays without FLOPs (the FLOP coverage shows it).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, Union

import numpy as np
import msgspec
import pandas as pd

from analyzer.errors import TraceError
from analyzer.ingest.locate import DETAILS_FILE
from analyzer.ingest.schema import text_id

GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cudaGraphLaunch_v10000", "hipGraphLaunch"})
SPLICED_THREAD_NAME = "ops captured into CUDA graphs (capture_traces/), laid out inside their replay's launch"
SPLICED_TID = text_id(SPLICED_THREAD_NAME)
CAPTURED_SUFFIX = " (captured)"


@dataclass(frozen=True)
class CapturedGraph:
    """One graph captured in a capture trace.

    ``kernels``: the kernel names launched during the capture, in launch
    order; ``launches``: those launch calls' rows (events table columns);
    ``ops``: the capture's ``cpu_op`` rows that enclose at least one of the
    launches, with their shapes. ``source``: the capture file's name,
    ``batch_size`` and ``mode`` from ``execution_details.json``.
    """

    source: str
    batch_size: Any
    mode: Any
    kernels: tuple[str, ...]
    launches: pd.DataFrame
    ops: pd.DataFrame


def execution_details(folder: Path) -> list[dict[str, Any]]:
    """The entries of ``folder/execution_details.json`` (each with a ``file``); TraceError when unusable."""
    path = folder / DETAILS_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TraceError(path, f"cannot be read as JSON ({type(exc).__name__}: {str(exc)[:100]})") from None
    if not isinstance(doc, list) or not all(isinstance(e, dict) and isinstance(e.get("file"), str) for e in doc):
        raise TraceError(path, 'expected a list of objects each with a "file" name')
    return doc


def launched_kernel_names(path: Path) -> dict[int, str]:
    """correlation id -> kernel name of every launch call in a capture trace (``args.kernel``).

    The loader keeps no ``args.kernel``; capture traces are small and read
    only when a replay trace has them, so this reads the JSON once more.
    """
    try:
        with gzip.open(path) if path.name.endswith(".gz") else open(path, "rb") as f:
            doc = _LAUNCH_DOC.decode(f.read())
    except (OSError, EOFError, msgspec.DecodeError) as exc:
        raise TraceError(path, f"cannot be read as a trace ({type(exc).__name__}: {str(exc)[:100]})") from None
    return {
        e.args.correlation: e.args.kernel
        for e in doc.traceEvents
        if e.args is not None and isinstance(e.args.kernel, str) and isinstance(e.args.correlation, int)
    }


class _LaunchArgs(msgspec.Struct):
    kernel: Any = None
    correlation: Any = None


class _LaunchEvent(msgspec.Struct):
    args: Union[_LaunchArgs, None] = None


class _LaunchDoc(msgspec.Struct):
    traceEvents: list[_LaunchEvent] = []


# Only args.kernel and args.correlation are built; msgspec skips the rest of each event.
_LAUNCH_DOC = msgspec.json.Decoder(_LaunchDoc)


def captured_graphs(
    events: pd.DataFrame, kernel_of: dict[int, str], source: str, entry: dict[str, Any]
) -> list[CapturedGraph]:
    """The graphs captured in one capture trace: one per ``*StreamBeginCapture`` .. ``*StreamEndCapture``
    pair on a thread (in order), each with its kernel launches and the ops around them."""
    names = events["name"].astype(str).to_numpy(object)
    host = events["kind"].isin(["runtime", "other"]).to_numpy()
    begin = np.flatnonzero(host & np.array([n.endswith("StreamBeginCapture") for n in names], dtype=bool))
    end = np.flatnonzero(host & np.array([n.endswith("StreamEndCapture") for n in names], dtype=bool))
    corr = events["correlation"].to_numpy(np.int64)
    launch = host & np.isin(corr, np.fromiter(kernel_of, dtype=np.int64, count=len(kernel_of)))
    start = events["start_ns"].to_numpy(np.int64)
    tid = events["tid"].to_numpy(np.int64)
    cpu_ops = events.loc[(events["kind"] == "cpu_op").to_numpy()]
    graphs = []
    for b in begin:
        later = end[(start[end] >= start[b]) & (tid[end] == tid[b])]
        if not len(later):
            continue
        e = later[0]
        rows = np.flatnonzero(launch & (start >= start[b]) & (start < start[e]) & (tid == tid[b]))
        if not len(rows):
            continue
        launches = events.iloc[rows]
        ops = _enclosing(cpu_ops, launches)
        graphs.append(
            CapturedGraph(
                source,
                entry.get("batch_size"),
                entry.get("mode"),
                tuple(kernel_of[int(c)] for c in corr[rows]),
                launches,
                ops,
            )
        )
    return graphs


def _enclosing(ops: pd.DataFrame, launches: pd.DataFrame) -> pd.DataFrame:
    """The ops (same pid and tid) whose interval holds at least one launch call's start."""
    ops = ops.loc[
        (ops["pid"].to_numpy() == launches["pid"].iloc[0]) & (ops["tid"].to_numpy() == launches["tid"].iloc[0])
    ]
    t = np.sort(launches["start_ns"].to_numpy(np.int64))
    lo = np.searchsorted(t, ops["start_ns"].to_numpy(np.int64), side="left")
    hi = np.searchsorted(t, ops["end_ns"].to_numpy(np.int64), side="left")
    return ops.loc[hi > lo]


def load_captures(folder: Path, load: Callable[[Path], Any]) -> tuple[list[CapturedGraph], list[str]]:
    """Every graph of every capture trace ``execution_details.json`` lists, and one note per unusable file.

    ``load(path)`` returns the capture's :class:`analyzer.ingest.tables.RankTrace`
    (the loader's, passed in to keep the import one-way).
    """
    graphs: list[CapturedGraph] = []
    notes: list[str] = []
    try:
        entries = execution_details(folder)
    except TraceError as err:
        return [], [str(err)]
    for entry in entries:
        path = folder / entry["file"]
        try:
            rt = load(path)
            kernel_of = launched_kernel_names(path)
        except TraceError as err:
            notes.append(f"capture trace not used: {err}")
            continue
        found = captured_graphs(rt.events, kernel_of, entry["file"], entry)
        if not found:
            notes.append(
                f"capture trace not used: {path}: no kernel launches between a stream's begin and end of capture"
            )
        graphs += found
    return graphs, notes


def replay_kernels(events: pd.DataFrame) -> tuple[np.ndarray, int]:
    """(rows of the kernels run by graph replays, number of graph launches that ran kernels).

    Cheap when the trace has no graph launch: the name categories are checked first."""
    names = events["name"]
    if not names.cat.categories.isin(list(GRAPH_LAUNCHES)).any():
        return np.empty(0, dtype=np.int64), 0
    kind = events["kind"].astype(str).to_numpy(object)
    corr = events["correlation"].to_numpy(np.int64)
    launch = ((kind == "runtime") | (kind == "other")) & names.isin(GRAPH_LAUNCHES).to_numpy() & (corr >= 0)
    kernel = (kind == "compute") | (kind == "comm")
    replayed = np.flatnonzero(kernel & np.isin(corr, corr[launch]))
    return replayed, int(len(np.intersect1d(corr[launch], corr[replayed])))


def uncovered_replays_note(events: pd.DataFrame, rows: np.ndarray, n_launches: int, why: str) -> str:
    """The warning for replayed kernels left without ops: their time and share of the GPU kernel time."""
    dur = (events["end_ns"] - events["start_ns"]).to_numpy(np.int64)
    kind = events["kind"].astype(str).to_numpy(object)
    total = int(dur[(kind == "compute") | (kind == "comm")].sum())
    replayed = int(dur[rows].sum())
    share = 100.0 * replayed / total if total else 0.0
    return (
        f"CUDA-graph replays: {replayed / 1e6:.3f} ms of kernels ({share:.1f} % of the GPU kernel time) from "
        f"{n_launches} graph launches {why}: no ops, shapes or FLOPs for them"
    )


def splice_replays(events: pd.DataFrame, graphs: Sequence[CapturedGraph]) -> tuple[pd.DataFrame, list[str]]:
    """``events`` with every graph replay that matches a captured graph linked to its captured ops
    (module docstring), and notes: how many replays were mapped, and each replay left unmapped."""
    names = events["name"].astype(str)
    kind = events["kind"].astype(str).to_numpy(object)
    corr = events["correlation"].to_numpy(np.int64)
    is_launch = ((kind == "runtime") | (kind == "other")) & names.isin(GRAPH_LAUNCHES).to_numpy()
    launches = np.flatnonzero(is_launch & (corr >= 0))
    if not len(launches):
        return events, []
    kernel_rows = np.flatnonzero((kind == "compute") | (kind == "comm"))
    starts = events["start_ns"].to_numpy(np.int64)
    by_sequence = {g.kernels: g for g in graphs}
    next_corr = int(corr.max()) + 1
    new_corr = corr.copy()
    added: list[pd.DataFrame] = []
    mapped = 0
    unmapped: list[str] = []
    for row in launches:
        replayed = kernel_rows[corr[kernel_rows] == corr[row]]  # rows sorted by start: replay order
        if not len(replayed):
            continue
        graph = by_sequence.get(tuple(names.iloc[replayed]))
        if graph is None:
            unmapped.append(f"{len(replayed)} kernels launched at ts {starts[row] / 1e9:.6f} s")
            continue
        ids = np.arange(next_corr, next_corr + len(replayed), dtype=np.int64)
        next_corr += len(replayed)
        new_corr[replayed] = ids
        added.append(_laid_out(graph, events.iloc[row], ids))
        mapped += 1
    notes = []
    if mapped:
        sources = sorted({g.source for g in graphs})
        notes.append(f"{mapped} graph replays mapped to the ops captured in {', '.join(sources)} (capture_traces/)")
    if unmapped:
        shown = "; ".join(unmapped[:3]) + (f"; {len(unmapped) - 3} more" if len(unmapped) > 3 else "")
        left = kernel_rows[np.isin(new_corr[kernel_rows], corr[launches])]
        notes.append(
            uncovered_replays_note(
                events, left, len(unmapped), f"whose kernels match no captured graph (kernel names in order; {shown})"
            )
        )
    if not added:
        return events, notes
    out = events.copy()
    out["correlation"] = new_corr
    return _concat_sorted(out, added), notes


def _laid_out(graph: CapturedGraph, launch: pd.Series, ids: np.ndarray) -> pd.DataFrame:
    """The graph's captured ops and launch calls, as rows of the replay: on the spliced thread of the
    launch's process, each distinct capture time mapped, in order, to a point inside the launch call."""
    ops, calls = graph.ops.copy(), graph.launches.copy()
    calls["correlation"] = ids
    # Renamed so that launch statistics and sync rules, which go by the runtime call's name, do not take
    # these laid-out rows for calls the host made at replay time: the replay had one call, the graph launch.
    calls["name"] = (
        calls["name"].cat.remove_unused_categories().cat.rename_categories(lambda n: f"{n}{CAPTURED_SUFFIX}")
    )
    points = np.unique(
        np.concatenate([ops["start_ns"], ops["end_ns"], calls["start_ns"], calls["end_ns"]]).astype(np.int64)
    )
    lo, hi = int(launch["start_ns"]), int(launch["end_ns"])
    step = max(1, (hi - lo) // (len(points) + 1))
    rows = pd.concat([ops, calls], ignore_index=True)
    for col in ("start_ns", "end_ns"):
        rows[col] = lo + step * (1 + np.searchsorted(points, rows[col].to_numpy(np.int64)))
    rows["pid"] = int(launch["pid"])
    rows["tid"] = SPLICED_TID
    rows["rank"] = launch["rank"]
    for col in ("external_id", "seq_num", "fwd_tid"):
        rows[col] = np.int64(-1)
    return rows


def _concat_sorted(events: pd.DataFrame, added: list[pd.DataFrame]) -> pd.DataFrame:
    """Rows of ``events`` and ``added`` in one table, categories unified, sorted by start (stable)."""
    frames = [events] + added
    categorical = [c for c in events.columns if isinstance(events[c].dtype, pd.CategoricalDtype) and c != "kind"]

    def values(f: pd.DataFrame, c: str) -> list[Any]:
        col = f[c]
        return list(col.cat.categories) if isinstance(col.dtype, pd.CategoricalDtype) else list(pd.unique(col.dropna()))

    cats = {
        c: pd.Index(list(dict.fromkeys(v for f in frames for v in values(f, c))), dtype=events[c].cat.categories.dtype)
        for c in categorical
    }
    unified = []
    for f in frames:
        f = f.copy(deep=False)
        for c, index in cats.items():
            col = f[c]
            f[c] = (
                col.cat.set_categories(index)
                if isinstance(col.dtype, pd.CategoricalDtype)
                else pd.Categorical(col, categories=index)
            )
        f["kind"] = pd.Categorical(f["kind"].astype(object), categories=events["kind"].cat.categories)
        unified.append(f)
    out = pd.concat(unified, ignore_index=True)
    order = np.argsort(out["start_ns"].to_numpy(np.int64), kind="stable")
    plain = {c: events[c].dtype for c in events.columns if c not in cats and c != "kind"}
    return out.iloc[order].reset_index(drop=True).astype(plain)
