"""The columnar tables every analysis reads.

A trace is parsed once (``analyzer.load``) into one *events* table per rank,
plus a small :class:`RankTrace` record of per-rank metadata. Every metric in
``analyzer.metrics`` is a pure function over these tables.

Units: all times are integer **nanoseconds** (Kineto writes microseconds,
as integers in old traces and with three decimals in newer ones; the loader
converts exactly, see docs/loading.md). Timestamps are the trace's own
clock, not shifted. Rows are sorted by ``start_ns`` (stable: ties keep file
order).

Which events become rows: every complete event (``"ph": "X"``) with ``ts``
and a non-negative ``dur``, except Kineto's ``cat: "Trace"`` span (the
profiler's own window, which HTA drops too). Flow, instant, counter and
metadata events are not rows; process and thread names from metadata
events are kept in :attr:`RankTrace.processes` and :attr:`RankTrace.threads`.

Events table columns (dtype):

=============== ========== ===================================================
column          dtype      meaning
=============== ========== ===================================================
rank            int32      rank the trace belongs to
cat             category   Kineto ``cat`` lower-cased (kernel, gpu_memcpy,
                           gpu_memset, cpu_op, user_annotation,
                           gpu_user_annotation, cuda_runtime, ...)
name            category   event name as written
kind            category   one of KINDS, see :func:`classify`; the categories
                           are always exactly KINDS, in that order
pid             int64      Kineto pid (device index for GPU events);
                           non-numeric pids map to stable negative ids
tid             int64      Kineto tid (stream for GPU events); non-numeric
                           tids are mapped to stable negative ids
                           (:func:`text_id`)
stream          int64      GPU stream for events on a GPU timeline
                           (GPU_TIMELINE_CATS: kernels, memcpy, memset,
                           gpu_user_annotation, cuda_sync): ``args.stream``
                           when numeric, else the tid; -1 for host events
start_ns        int64      start
end_ns          int64      end (start + dur); instant events are dropped
correlation     int64      ``args.correlation``, -1 when absent
external_id     int64      ``args.External id``, -1 when absent
input_dims      object     ``args["Input Dims"]`` as a JSON string, only for
                           matmul-like cpu_ops (see MATMUL_OPS) and cpu_comm
                           rows (gloo collectives carry their tensor shapes
                           there); else None
input_types     object     ``args["Input type"]`` as a JSON string, same rows
coll_name       category   collective name: ``args["Collective name"]``
                           (record_param_comms, comm kernels of newer
                           PyTorch), else the suffix of a ``gloo:*`` /
                           ``nccl:*`` annotation (``all_reduce``); else NaN
msg_in_nelems   int64      ``args["In msg nelems"]``; for ``gloo:*``
                           annotations without it, the element count of
                           their first input (``Input Dims[0]``); -1 when
                           unknown
msg_out_nelems  int64      ``args["Out msg nelems"]``, -1 when absent
msg_dtype       category   ``args["dtype"]`` for comm events (for ``gloo:*``
                           annotations ``Input type[0]``), else NaN
group_size      int64      ``args["Group size"]``, -1 when absent
pg_name         category   ``args["Process Group Name"]``, else NaN
=============== ========== ===================================================
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

# Device-side kinds (events that run on a GPU stream) and host-side kinds.
DEVICE_KINDS = ("compute", "comm", "memcpy", "memset")
HOST_KINDS = ("cpu_op", "cpu_comm", "annotation", "runtime", "other")
KINDS = DEVICE_KINDS + HOST_KINDS

# HTA matches "nccl" by prefix in places and misses ``ncclDevKernel_*``;
# we match nccl/rccl anywhere, case-insensitively (issue: analyzer loading).
COMM_KERNEL_RE = re.compile(r"nccl|rccl", re.IGNORECASE)
# Host-side collective ops: c10d dispatcher ops, gloo/nccl annotations and
# record_param_comms, the marker PyTorch emits around every collective.
CPU_COMM_RE = re.compile(
    r"^(c10d::|record_param_comms$|gloo:|nccl:|c10d_functional::)", re.IGNORECASE
)
MATMUL_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::matmul",
        "aten::linear",
        "aten::scaled_dot_product_attention",
    }
)
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
ANNOTATION_CATS = frozenset({"user_annotation", "gpu_user_annotation"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver"})
# Categories Kineto writes on a GPU's timeline (pid = device, tid = stream).
# cuda_sync ("Stream Sync", "Event Sync") sits on a stream but is waiting,
# not device work: it gets a stream and kind "other".
GPU_TIMELINE_CATS = DEVICE_CATS | {"gpu_user_annotation", "cuda_sync"}

COLUMNS: dict[str, str] = {
    "rank": "int32",
    "cat": "category",
    "name": "category",
    "kind": "category",
    "pid": "int64",
    "tid": "int64",
    "stream": "int64",
    "start_ns": "int64",
    "end_ns": "int64",
    "correlation": "int64",
    "external_id": "int64",
    "input_dims": "object",
    "input_types": "object",
    "coll_name": "category",
    "msg_in_nelems": "int64",
    "msg_out_nelems": "int64",
    "msg_dtype": "category",
    "group_size": "int64",
    "pg_name": "category",
}
_INT_DEFAULT = -1


def classify(cat: str, name: str) -> str:
    """Kind of one event from its Kineto category and name.

    Device events: ``comm`` when the name matches nccl/rccl anywhere,
    ``memcpy``/``memset`` by category, else ``compute``. Host events:
    ``cpu_comm`` for collective ops and annotations (c10d::*, gloo:*,
    record_param_comms), ``cpu_op``, ``annotation``, ``runtime``, ``other``.
    """
    cat = cat.lower()
    if cat in DEVICE_CATS:
        if cat == "gpu_memcpy":
            return "memcpy"
        if cat == "gpu_memset":
            return "memset"
        return "comm" if COMM_KERNEL_RE.search(name) else "compute"
    if CPU_COMM_RE.search(name):
        return "cpu_comm"
    if cat == "cpu_op":
        return "cpu_op"
    if cat in ANNOTATION_CATS:
        return "annotation"
    if cat in RUNTIME_CATS:
        return "runtime"
    return "other"


def text_id(value: object) -> int:
    """A pid/tid/stream as an integer: numbers as they are, numeric strings
    parsed (``"7"``, ``"0x1f"``), any other text a stable negative id
    ``-2 - crc32(text)`` (never -1, which means "absent")."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value == value else -1
    if value is None:
        return -1
    text = str(value).strip()
    try:
        return int(text, 0)
    except ValueError:
        return -2 - zlib.crc32(text.encode())


def empty_events() -> pd.DataFrame:
    """An events table with no rows and the documented dtypes."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in COLUMNS.items()})


def events_from_records(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Build an events table from plain dicts (tests, small inputs).

    Each record needs ``rank, cat, name, start_ns, end_ns``; missing integer
    columns default to -1, missing text columns to NaN/None, ``kind`` is
    derived with :func:`classify` unless given, ``stream`` defaults to ``tid``
    for events on a GPU timeline (GPU_TIMELINE_CATS) and -1 otherwise.
    """
    rows = []
    for r in records:
        row = dict(r)
        row.setdefault("kind", classify(row["cat"], row["name"]))
        row.setdefault("tid", 0)
        row.setdefault("pid", 0)
        if "stream" not in row:
            row["stream"] = row["tid"] if str(row["cat"]).lower() in GPU_TIMELINE_CATS else -1
        rows.append(row)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for col, dtype in COLUMNS.items():
        if dtype == "int64" or dtype == "int32":
            frame[col] = frame[col].fillna(_INT_DEFAULT).astype(dtype)
        elif col == "kind":
            frame[col] = pd.Categorical(frame[col], categories=list(KINDS))
        elif dtype == "category":
            frame[col] = frame[col].astype("category")
        else:
            frame[col] = frame[col].astype(object).where(frame[col].notna(), None)
    return frame


def empty_steps() -> pd.DataFrame:
    """A steps table with no rows."""
    return pd.DataFrame({c: pd.Series(dtype="int64") for c in ("step", "start_ns", "end_ns")})


def empty_processes() -> pd.DataFrame:
    """A processes table with no rows (see :class:`RankTrace`)."""
    return pd.DataFrame({"pid": pd.Series(dtype="int64"), "name": pd.Series(dtype=object), "labels": pd.Series(dtype=object)})


def empty_threads() -> pd.DataFrame:
    """A threads table with no rows (see :class:`RankTrace`)."""
    return pd.DataFrame({"pid": pd.Series(dtype="int64"), "tid": pd.Series(dtype="int64"), "name": pd.Series(dtype=object)})


@dataclass
class RankTrace:
    """One rank's parsed trace: events plus metadata.

    ``steps`` has one row per ProfilerStep#N annotation with columns
    ``step`` (int64, N), ``start_ns``, ``end_ns`` (int64); empty when the
    trace has no ProfilerStep markers.

    ``rank_source`` says where ``rank`` came from: ``distributedInfo``,
    ``filename``, ``argument`` (the caller's hint) or ``default`` (0).
    ``processes`` (pid, name, labels) and ``threads`` (pid, tid, name) come
    from Kineto's metadata events: e.g. labels ``"GPU 0"`` for a device pid,
    thread name ``"thread 8220 (pt_gloo_runloop)"`` for gloo's worker.
    ``json_bytes`` is the size of the trace's JSON text (uncompressed).
    ``notes`` lists per-file oddities the loader coped with (events dropped
    for a missing or negative duration), each a short sentence.
    """

    rank: int
    path: Path
    events: pd.DataFrame
    steps: pd.DataFrame
    distributed_info: dict = field(default_factory=dict)
    device_properties: list = field(default_factory=list)
    # True when the trace has device (GPU) events at all.
    has_device: bool = False
    rank_source: str = "argument"
    processes: pd.DataFrame = field(default_factory=empty_processes)
    threads: pd.DataFrame = field(default_factory=empty_threads)
    json_bytes: int = 0
    notes: list = field(default_factory=list)

    @property
    def world_size(self) -> int | None:
        ws = self.distributed_info.get("world_size")
        return int(ws) if ws is not None else None


_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def steps_from_events(events: pd.DataFrame) -> pd.DataFrame:
    """ProfilerStep#N windows from an events table (host annotations).

    The GPU-side copies of the markers (``gpu_user_annotation``, newer
    PyTorch) are ignored; a step number seen twice keeps its first window.
    """
    names = events["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):
        # Match on the (few) categories, not on every row.
        cats = names.cat.categories.astype(str)
        step_names = cats[cats.str.match(_STEP_RE.pattern)]
        mask = names.isin(step_names).to_numpy()
    else:
        mask = names.astype(str).str.match(_STEP_RE.pattern).to_numpy()
    if not mask.any():
        return empty_steps()
    sel = events.loc[mask]
    host = ~sel["kind"].isin(DEVICE_KINDS) & (sel["cat"].astype(str) != "gpu_user_annotation")
    sel = sel.loc[host]
    step = sel["name"].astype(str).str.slice(len("ProfilerStep#")).astype(np.int64)
    out = pd.DataFrame(
        {
            "step": step.to_numpy(np.int64),
            "start_ns": sel["start_ns"].to_numpy(np.int64),
            "end_ns": sel["end_ns"].to_numpy(np.int64),
        }
    )
    return out.drop_duplicates("step").sort_values("step").reset_index(drop=True)
