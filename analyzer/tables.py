"""The columnar tables every analysis reads.

A trace is parsed once (``analyzer.load``) into one *events* table per rank,
plus a small :class:`RankTrace` record of per-rank metadata. Every metric in
``analyzer.metrics`` is a pure function over these tables.

Units: all times are integer **nanoseconds** (Kineto writes microseconds with
three decimals; the loader multiplies by 1000 and rounds). Timestamps are the
trace's own clock, not shifted.

Events table columns (dtype):

=============== ========== ===================================================
column          dtype      meaning
=============== ========== ===================================================
rank            int32      rank the trace belongs to
cat             category   Kineto ``cat`` lower-cased (kernel, gpu_memcpy,
                           gpu_memset, cpu_op, user_annotation,
                           gpu_user_annotation, cuda_runtime, ...)
name            category   event name as written
kind            category   one of KINDS, see :func:`classify`
pid             int64      Kineto pid (device index for GPU events)
tid             int64      Kineto tid (stream for GPU events); non-numeric
                           tids are mapped to stable negative ids
stream          int64      GPU stream (``args.stream`` or tid) for device
                           events, -1 for host events
start_ns        int64      start
end_ns          int64      end (start + dur); instant events are dropped
correlation     int64      ``args.correlation``, -1 when absent
external_id     int64      ``args.External id``, -1 when absent
input_dims      object     ``args["Input Dims"]`` as a JSON string, only for
                           matmul-like cpu_ops (see MATMUL_OPS); else None
input_types     object     ``args["Input type"]`` as a JSON string, same rows
coll_name       category   collective name (``args["Collective name"]``) for
                           record_param_comms / comm kernels, else NaN
msg_in_nelems   int64      ``args["In msg nelems"]``, -1 when absent
msg_out_nelems  int64      ``args["Out msg nelems"]``, -1 when absent
msg_dtype       category   ``args["dtype"]`` for comm events, else NaN
group_size      int64      ``args["Group size"]``, -1 when absent
pg_name         category   ``args["Process Group Name"]``, else NaN
=============== ========== ===================================================
"""
from __future__ import annotations

import re
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


def empty_events() -> pd.DataFrame:
    """An events table with no rows and the documented dtypes."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in COLUMNS.items()})


def events_from_records(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Build an events table from plain dicts (tests, small inputs).

    Each record needs ``rank, cat, name, start_ns, end_ns``; missing integer
    columns default to -1, missing text columns to NaN/None, ``kind`` is
    derived with :func:`classify` unless given, ``stream`` defaults to ``tid``
    for device events and -1 otherwise.
    """
    rows = []
    for r in records:
        row = dict(r)
        row.setdefault("kind", classify(row["cat"], row["name"]))
        row.setdefault("tid", 0)
        row.setdefault("pid", 0)
        if "stream" not in row:
            row["stream"] = row["tid"] if row["kind"] in DEVICE_KINDS else -1
        rows.append(row)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for col, dtype in COLUMNS.items():
        if dtype == "int64" or dtype == "int32":
            frame[col] = frame[col].fillna(_INT_DEFAULT).astype(dtype)
        elif dtype == "category":
            frame[col] = frame[col].astype("category")
        else:
            frame[col] = frame[col].astype(object).where(frame[col].notna(), None)
    return frame


@dataclass
class RankTrace:
    """One rank's parsed trace: events plus metadata.

    ``steps`` has one row per ProfilerStep#N annotation with columns
    ``step`` (int64, N), ``start_ns``, ``end_ns`` (int64); empty when the
    trace has no ProfilerStep markers.
    """

    rank: int
    path: Path
    events: pd.DataFrame
    steps: pd.DataFrame
    distributed_info: dict = field(default_factory=dict)
    device_properties: list = field(default_factory=list)
    # True when the trace has device (GPU) events at all.
    has_device: bool = False

    @property
    def world_size(self) -> int | None:
        ws = self.distributed_info.get("world_size")
        return int(ws) if ws is not None else None


def steps_from_events(events: pd.DataFrame) -> pd.DataFrame:
    """ProfilerStep#N windows from an events table (host annotations)."""
    names = events["name"].astype(str)
    cats = events["cat"].astype(str)
    mask = (
        names.str.startswith("ProfilerStep#")
        & ~events["kind"].isin(DEVICE_KINDS)
        & (cats != "gpu_user_annotation")
    )
    sel = events.loc[mask, ["name", "start_ns", "end_ns"]]
    step = sel["name"].astype(str).str.slice(len("ProfilerStep#")).astype(np.int64)
    out = pd.DataFrame(
        {"step": step.to_numpy(), "start_ns": sel["start_ns"].to_numpy(), "end_ns": sel["end_ns"].to_numpy()}
    )
    return out.drop_duplicates("step").sort_values("step").reset_index(drop=True)
