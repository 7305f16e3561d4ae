"""The columnar tables every analysis reads.

A trace is parsed once (``analyzer.ingest.load``) into one *events* table per rank,
plus a small :class:`RankTrace` record of per-rank metadata. Every metric in
``analyzer.metrics`` is a pure function over these tables.

Units: all times are integer **nanoseconds** (Kineto writes microseconds,
as integers in old traces and with three decimals in newer ones; the loader
converts exactly, see docs/loading.md). Timestamps are the trace's own
clock, not shifted. Rows are sorted by ``start_ns`` (stable: ties keep file
order).

Which events become rows: every complete event (``"ph": "X"``) whose
``ts`` and ``dur`` are valid (JSON numbers, finite, >= 0, start and end
within int64 ns; the others are dropped and counted in one note, see
docs/loading.md), except Kineto's ``cat: "Trace"`` span (the profiler's own
window, which HTA drops too). ``displayTimeUnit: "ns"`` traces are read in
ns, all others in µs. Flow, instant, counter and
metadata events are not rows; process and thread names from metadata
events are kept in :attr:`RankTrace.processes` and :attr:`RankTrace.threads`.

Events table columns (dtype):

=============== ========== ===================================================
column          dtype      meaning
=============== ========== ===================================================
rank            int32      rank the trace belongs to
cat             category   Kineto ``cat`` in today's spelling (kernel,
                           gpu_memcpy, gpu_memset, cpu_op, user_annotation,
                           gpu_user_annotation, cuda_runtime, ...): lower-
                           cased, older eras' names mapped
                           (:func:`canonical_category`; ``Memcpy`` ->
                           gpu_memcpy, ``Operator`` -> cpu_op)
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
seq_num         int64      ``args["Sequence number"]`` (autograd sequence
                           number of a cpu_op; a backward op carries its
                           forward op's), -1 when absent
fwd_tid         int64      ``args["Fwd thread id"]`` (on backward ops: the
                           thread of their forward op), -1 when absent
input_dims      object     ``args["Input Dims"]`` as a JSON string, only for
                           matmul-like, convolution, attention and
                           memory-bound (elementwise, reduction, softmax,
                           normalization) cpu_ops and ``aten::embedding``
                           (SHAPE_OPS) and cpu_comm
                           rows (gloo collectives carry their tensor shapes
                           there); else None
input_types     object     ``args["Input type"]`` as a JSON string, same rows
                           (and convolution ops, CONV_OPS)
concrete_inputs object     ``args["Concrete Inputs"]`` as a JSON string, only
                           for convolution, attention, reduction, softmax
                           and normalization cpu_ops (CONCRETE_OPS:
                           stride, padding, dilation, groups; is_causal;
                           the reduced dims; half_to_float; training);
                           else None
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
wait_stream     int64      ``args["wait_on_stream"]`` of a cuda_sync event
                           waiting on a recorded CUDA event (``Stream Wait
                           Event``, ``Event Sync``): the event's stream; -1
record_corr     int64      ``args["wait_on_cuda_event_record_corr_id"]``: the
                           correlation id of the cudaEventRecord call; -1
=============== ========== ===================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from analyzer.ingest.schema import (  # noqa: F401 - re-exported: the table schema lives with its docs here
    DEVICE_KINDS,
    HOST_KINDS,
    KINDS,
    COMM_KERNEL_RE,
    CPU_COMM_RE,
    MATMUL_OPS,
    CONV_OPS,
    ATTENTION_OPS,
    ATTENTION_BACKWARD_OPS,
    ATTENTION_INNER_OPS,
    CONV_BACKWARD_OPS,
    UNARY_OPS,
    BINARY_OPS,
    REDUCTION_OPS,
    SOFTMAX_OPS,
    NORM_OPS,
    MEMORY_BOUND_OPS,
    CONCRETE_OPS,
    FLOP_OPS,
    SHAPE_OPS,
    DEVICE_CATS,
    ANNOTATION_CATS,
    RUNTIME_CATS,
    GPU_TIMELINE_CATS,
    COLUMNS,
    INT_DEFAULT,
    CATEGORY_ALIASES,
    canonical_category,
    classify,
    text_id,
)


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
            row["stream"] = row["tid"] if canonical_category(str(row["cat"])) in GPU_TIMELINE_CATS else -1
        rows.append(row)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for col, dtype in COLUMNS.items():
        if dtype == "int64" or dtype == "int32":
            frame[col] = frame[col].fillna(INT_DEFAULT).astype(np.dtype(dtype))
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


# c10::DeviceType codes as written in a [memory] event's "Device Type" (c10/core/DeviceType.h): ROCm
# traces (the shared MI300 samples) write 6, HIP.
_DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 12: "xpu", 13: "mps"}
MEMORY_COLUMNS = ("ts_ns", "device", "allocated_bytes", "reserved_bytes", "delta_bytes")


def device_label(device_type: int, device_id: int) -> str:
    """``cuda:0``; ``cpu`` (the CPU allocator's events carry id -1); ``type20:0`` for a type not named here."""
    kind = _DEVICE_TYPES.get(int(device_type), f"type{int(device_type)}")
    return kind if kind == "cpu" or device_id < 0 else f"{kind}:{int(device_id)}"


def memory_table(columns: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """The memory events table of :class:`RankTrace` from a parse's memory columns.

    One row per ``[memory]`` instant event, sorted by ``ts_ns`` (stable: ties
    keep file order): ``device`` (:func:`device_label`), ``allocated_bytes``
    and ``reserved_bytes`` (the allocator's ``Total Allocated`` / ``Total
    Reserved`` on that device after the event), ``delta_bytes`` (``Bytes``:
    positive for an allocation, negative for a free). Empty (these columns)
    without memory events.
    """
    if not columns or not len(columns.get("ts_ns", ())):
        return pd.DataFrame(
            {
                "ts_ns": pd.Series(dtype="int64"),
                "device": pd.Series(dtype=object),
                "allocated_bytes": pd.Series(dtype="int64"),
                "reserved_bytes": pd.Series(dtype="int64"),
                "delta_bytes": pd.Series(dtype="int64"),
            }
        )
    pairs, inv = np.unique(
        np.stack([columns["device_type"], columns["device_id"]], axis=1), axis=0, return_inverse=True
    )
    labels = np.array([device_label(int(t), int(i)) for t, i in pairs], dtype=object)
    inv = inv.reshape(-1)
    order = np.argsort(columns["ts_ns"], kind="stable")
    return pd.DataFrame(
        {
            "ts_ns": columns["ts_ns"][order],
            "device": labels[inv][order],
            "allocated_bytes": columns["total_allocated"][order],
            "reserved_bytes": columns["total_reserved"][order],
            "delta_bytes": columns["bytes"][order],
        }
    )


def empty_processes() -> pd.DataFrame:
    """A processes table with no rows (see :class:`RankTrace`)."""
    return pd.DataFrame(
        {"pid": pd.Series(dtype="int64"), "name": pd.Series(dtype=object), "labels": pd.Series(dtype=object)}
    )


def empty_threads() -> pd.DataFrame:
    """A threads table with no rows (see :class:`RankTrace`)."""
    return pd.DataFrame(
        {"pid": pd.Series(dtype="int64"), "tid": pd.Series(dtype="int64"), "name": pd.Series(dtype=object)}
    )


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
    for a missing or invalid ts/dur, a ns time unit), each a short sentence.
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
    # [memory] instant events (profile_memory=True): memory_table's columns; empty without them.
    memory: pd.DataFrame = field(default_factory=lambda: memory_table({}))
    # The trace's baseTimeNanoseconds: the Unix time (ns) its event times count from; 0 when it has
    # none (older traces, whose times are Unix times already).
    clock_origin_ns: int = 0

    @property
    def world_size(self) -> int | None:
        ws = self.distributed_info.get("world_size")
        return int(ws) if ws is not None else None

    @property
    def device_kind(self) -> str:
        """``"GPU"`` when the trace has device events or device properties, else ``"CPU-only"``."""
        return "GPU" if self.has_device or self.device_properties else "CPU-only"

    @property
    def job(self) -> dict[str, str]:
        """The distributed job's identity: :func:`job_identity` of ``distributed_info``."""
        return job_identity(self.distributed_info)

    @property
    def first_ns(self) -> int | None:
        """The first event's start, ns since the Unix epoch; None without events."""
        return None if self.events.empty else int(self.events["start_ns"].min()) + self.clock_origin_ns

    @property
    def last_ns(self) -> int | None:
        """The last event's end, ns since the Unix epoch; None without events."""
        return None if self.events.empty else int(self.events["end_ns"].max()) + self.clock_origin_ns


# distributedInfo keys the ranks of one job share (PyTorch's profiler writes backend, world_size and
# pg_config; master_addr/master_port only when a user adds them). Not pg_count, nor the other
# process groups' configs: a rank lists only the groups it belongs to.
_JOB_KEYS = ("backend", "world_size", "master_addr", "master_port")


def job_identity(distributed_info: dict) -> dict[str, str]:
    """What every rank of one distributed job records alike in ``distributedInfo``: backend,
    world_size, the default process group's backend_config and size, and master_addr/master_port
    where present; values as text, keys absent from the trace left out."""
    out = {k: str(distributed_info[k]) for k in _JOB_KEYS if distributed_info.get(k) is not None}
    pgs = distributed_info.get("pg_config")
    default = (
        next((pg for pg in pgs if isinstance(pg, dict) and pg.get("pg_name") == "0"), None)
        if isinstance(pgs, list)
        else None
    )
    if default is not None:
        for key in ("backend_config", "pg_size"):
            if default.get(key) is not None:
                out[f"default pg {key}"] = str(default[key])
    return out


_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def steps_from_events(events: pd.DataFrame) -> pd.DataFrame:
    """ProfilerStep#N windows from an events table (host annotations).

    The GPU-side copies of the markers (``gpu_user_annotation``, newer
    PyTorch) are ignored; a step number seen twice keeps its first window.
    """
    names = events["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):
        # Match on the (few) categories, then index by the codes, not on every row.
        cats = names.cat.categories.tolist()
        is_step = np.fromiter((_STEP_RE.match(str(c)) is not None for c in cats), dtype=bool, count=len(cats))
        codes = names.cat.codes.to_numpy()
        mask = np.append(is_step, False)[codes]  # a missing name's code, -1, takes the appended False
    else:
        mask = names.astype(str).str.match(_STEP_RE.pattern).to_numpy()
    if not mask.any():
        return empty_steps()
    # The few marker rows, on plain arrays (selecting them from the whole table copied every column).
    rows = np.flatnonzero(mask)
    kinds = events["kind"].to_numpy(object)[rows]
    cats_at = events["cat"].to_numpy(object)[rows]
    host = np.array(
        [k not in DEVICE_KINDS and str(c) != "gpu_user_annotation" for k, c in zip(kinds, cats_at)], dtype=bool
    )
    rows = rows[host]
    out = pd.DataFrame(
        {
            "step": np.array(
                [int(str(n)[len("ProfilerStep#") :]) for n in events["name"].to_numpy(object)[rows]], dtype=np.int64
            ),
            "start_ns": events["start_ns"].to_numpy(np.int64)[rows],
            "end_ns": events["end_ns"].to_numpy(np.int64)[rows],
        }
    )
    return out.drop_duplicates("step").sort_values("step").reset_index(drop=True)
