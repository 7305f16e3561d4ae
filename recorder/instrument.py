"""Always-on instrumentation: JSON-lines writer, collective timer, phase timer, memory.

Everything here runs on every training step, outside profiler windows, so each
piece is built to cost microseconds per step:

- `JsonlWriter` appends one JSON object per line through a 1 MiB buffer.
- `CollectiveTimer` times every collective (DDP bucket all-reduces through a
  comm hook; FSDP2 and explicit collectives by wrapping `torch.distributed`)
  and writes `reftrain.collectives/1` records (docs/rundir.md).
- `PhaseTimer` accumulates per-step phase times and annotates them for the
  profiler with `record_function`.
- `process_memory_bytes` reads peak CUDA memory or the process RSS; `peak_reserved_bytes` the CUDA
  caching allocator's peak reserved bytes.

Clocks. On CPU every timestamp is the host's `time.time_ns()`. On CUDA the
collective timer records CUDA events on the issuing thread's current stream and
converts them to epoch ns lazily, in `flush()`, through a host anchor: once
(and again every `_CUDA_REANCHOR_S` seconds, inside a flush, so that float32
`elapsed_time` keeps microsecond precision and GPU/host clock drift stays
bounded) the timer synchronizes the device, records an anchor event and reads
`time.time_ns()` just before recording and just after the event completes; the
anchor's host time is the midpoint of those two reads. An event's epoch time
is then `anchor_host_ns + anchor.elapsed_time(event) * 1e6`. No synchronize is
added per collective.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import orjson
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from recorder.errors import RecorderError

_ORJSON_OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
_WRITE_BUFFER_BYTES = 1 << 20
_CUDA_REANCHOR_S = 30.0


def _json_default(obj: Any) -> Any:
    """orjson fallback: torch scalars/tensors, numpy scalars, paths, dtypes."""
    if isinstance(obj, torch.Tensor):
        return obj.item() if obj.numel() == 1 else obj.tolist()
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar types orjson does not know
        return obj.item()
    if isinstance(obj, (Path, torch.dtype, torch.device)):
        return str(obj)
    raise TypeError(f"cannot serialize {type(obj).__name__} to JSON")


class JsonlWriter:
    """Buffered JSON-lines file: one JSON object per line.

    The file is created exclusively: an existing file is never overwritten
    (raises `RecorderError`). Parent directories are created. Non-finite floats
    (NaN, inf) are written as `null`, since JSON has no representation for them.
    Not thread-safe: write from one thread (or serialize calls yourself).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # "x": exclusive create, so two runs can never append into one file.
            self._file: IO[bytes] | None = open(self.path, "xb", buffering=_WRITE_BUFFER_BYTES)
        except FileExistsError:
            raise RecorderError(f"{self.path}: already exists; refusing to overwrite") from None
        except OSError as exc:
            raise RecorderError(f"{self.path}: cannot create file: {exc.strerror or exc}") from None

    def write(self, record: dict) -> None:
        """Append one record (a dict of JSON-serializable values, numpy/torch scalars allowed)."""
        if self._file is None:
            raise RecorderError(f"{self.path}: write after close")
        try:
            line = orjson.dumps(record, default=_json_default, option=_ORJSON_OPTS)
        except TypeError as exc:
            raise RecorderError(f"{self.path}: cannot serialize record: {exc}") from None
        self._file.write(line)

    def flush(self) -> None:
        """Push buffered lines to the OS (readers see complete lines up to here)."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Flush and close; further writes raise. Closing twice is harmless."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------
# Collective timing
# ---------------------------------------------------------------------------

# torch.distributed functions that issue a collective, with the record `kind`
# and the parameter whose tensor(s) are this rank's payload ("bytes" in the
# record = input size on this rank; None = no payload, e.g. barrier).
# Deprecated aliases (all_gather_into_tensor, _all_gather_base,
# reduce_scatter_tensor, _reduce_scatter_base) forward to the *_single
# functions through distributed_c10d's module globals; both are wrapped and a
# thread-local guard records only the outermost call.
_COLLECTIVES: dict[str, tuple[str, str | None]] = {
    "all_reduce": ("all_reduce", "tensor"),
    "all_reduce_coalesced": ("all_reduce", "tensors"),
    "broadcast": ("broadcast", "tensor"),
    "reduce": ("reduce", "tensor"),
    "all_gather": ("all_gather", "tensor"),
    "all_gather_single": ("all_gather", "input_tensor"),
    "all_gather_into_tensor": ("all_gather", "input_tensor"),
    "_all_gather_base": ("all_gather", "input_tensor"),
    "all_gather_coalesced": ("all_gather", "input_tensor_list"),
    "gather": ("gather", "tensor"),
    "scatter": ("scatter", "tensor"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "_reduce_scatter_base": ("reduce_scatter", "input"),
    "all_to_all_single": ("all_to_all", "input"),
    "all_to_all": ("all_to_all", "input_tensor_list"),
    "barrier": ("barrier", None),
}

# Per-thread "already inside a timed collective" flag: nested calls (an alias
# forwarding to the function it wraps, or the DDP hook's own all_reduce) are
# passed through unrecorded so nothing is counted twice.
_TLS = threading.local()


@contextmanager
def untimed_collectives() -> Iterator[None]:
    """Within this block, collectives on this thread are not recorded by an installed timer."""
    previous = getattr(_TLS, "inside", False)
    _TLS.inside = True
    try:
        yield
    finally:
        _TLS.inside = previous


# Process groups whose collectives are never training communication (the async
# checkpoint's group: DCP's background thread runs them, outside untimed_collectives).
_UNTIMED_GROUPS: list[Any] = []


def untimed_group(group: Any) -> None:
    """Never record collectives on `group`, from any thread."""
    _UNTIMED_GROUPS.append(group)


# The timer whose wrappers are installed (at most one per process).
_INSTALLED: CollectiveTimer | None = None


def _payload_bytes_dtype(payload: Any) -> tuple[int, str | None]:
    """(bytes, dtype name) of a tensor or a list of tensors; (0, None) for no payload."""
    if payload is None:
        return 0, None
    if isinstance(payload, torch.Tensor):
        return payload.numel() * payload.element_size(), _dtype_name(payload.dtype)
    nbytes = 0
    dtype = None
    for t in payload:
        nbytes += t.numel() * t.element_size()
        dtype = dtype or _dtype_name(t.dtype)
    return nbytes, dtype


@functools.cache
def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _Record:
    """One collective in flight or completed (internal; see `CollectiveTimer`)."""

    __slots__ = (
        "step",
        "seq",
        "kind",
        "nbytes",
        "dtype",
        "pg",
        "group_size",
        "start_ns",
        "end_ns",
        "start_event",
        "end_event",
        "anchor",
        "future",
    )

    def __init__(
        self, step: int, seq: int, kind: str, nbytes: int, dtype: str | None, pg: str, group_size: int
    ) -> None:
        self.step = step
        self.seq = seq
        self.kind = kind
        self.nbytes = nbytes
        self.dtype = dtype
        self.pg = pg
        self.group_size = group_size
        self.start_ns: int | None = None
        self.end_ns: int | None = None
        self.start_event: torch.cuda.Event | None = None
        self.end_event: torch.cuda.Event | None = None
        self.anchor: _CudaAnchor | None = None
        self.future: torch.futures.Future | None = None


class _CudaAnchor:
    """A CUDA event whose host epoch time is known (see module docstring)."""

    def __init__(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)
        self.event = torch.cuda.Event(enable_timing=True)
        before_ns = time.time_ns()
        self.event.record(torch.cuda.current_stream(device))
        self.event.synchronize()
        after_ns = time.time_ns()
        self.host_ns = (before_ns + after_ns) // 2
        self.uncertainty_ns = (after_ns - before_ns + 1) // 2
        self.created_s = time.monotonic()

    def to_epoch_ns(self, event: torch.cuda.Event) -> int:
        return self.host_ns + round(self.event.elapsed_time(event) * 1e6)


class CollectiveTimer:
    """Times every collective the trainer issues; writes reftrain.collectives/1 records.

    Two entry points, used together or alone:

    - `ddp_comm_hook`: register with
      `ddp_model.register_comm_hook(state=None, hook=timer.ddp_comm_hook)`
      (`state` may be the DDP process group; None means WORLD). It does DDP's
      default averaging all-reduce of each gradient bucket and times it.
    - `install()`: wraps the `torch.distributed` collective functions (on both
      `torch.distributed` and `torch.distributed.distributed_c10d`, which is
      what FSDP2 and the deprecated aliases call) so FSDP2's all-gathers and
      reduce-scatters and any explicit collective are timed. The hook's own
      all-reduce is not counted twice.

    Timing (docs/rundir.md, `reftrain.collectives/1`): on CPU `start_ns` is
    `time.time_ns()` at issue and `end_ns` the same clock when the work
    completes (the work future's `then` callback for async ops, the return of
    the blocking call for sync ops). On CUDA both ends are CUDA events on the
    issuing thread's current stream (the end event is recorded in the future
    callback, which runs on streams synchronized with the collective), turned
    into epoch ns in `flush()`.

    Thread safety: collectives may be issued from the autograd threads (DDP
    hooks, FSDP2 backward hooks) and completed on backend threads; the timer's
    state is guarded by a lock. `set_step`, `step_comm_ms` and `flush` are
    meant for the training loop's thread.

    Not seen: collectives issued by C++ directly (DDP's own reducer without
    the hook, DDP's construction-time broadcast), code that bound a collective
    function by `from torch.distributed import all_reduce` before `install()`,
    ops batched inside `torch.distributed._coalescing_manager`, and
    point-to-point send/recv.
    """

    def __init__(self, writer: JsonlWriter, rank: int, device: torch.device) -> None:
        self._writer = writer
        self._rank = rank
        self._device = torch.device(device)
        self._cuda = self._device.type == "cuda"
        self._clock = "cuda" if self._cuda else "host"
        self._step = -1  # collectives before the first set_step (setup) are step -1
        self._seq: dict[str, int] = {}
        self._pg_info: dict[Any, tuple[str, int]] = {}
        self._pending: list[_Record] = []
        self._step_comm_ns: dict[int, int] = {}
        self._lock = threading.Lock()
        # Anchor now, outside any step, so the first collective adds no synchronize.
        self._anchor: _CudaAnchor | None = _CudaAnchor(self._device) if self._cuda else None
        self._originals: list[tuple[Any, str, Any]] = []
        self._hook_opts: dict[Any, dist.AllreduceOptions] = {}  # per process group, for ddp_comm_hook

    # -- bookkeeping -------------------------------------------------------

    def set_step(self, step: int) -> None:
        """Attribute collectives issued from now on to optimizer step `step`."""
        self._step = step

    def _group_info(self, group: Any) -> tuple[str, int]:
        info = self._pg_info.get(group)
        if info is None:
            pg = group if group is not None else c10d._get_default_group()
            info = (pg.group_name, pg.size())
            self._pg_info[group] = info
        return info

    def _begin(self, kind: str, nbytes: int, dtype: str | None, group: Any) -> _Record:
        pg, size = self._group_info(group)
        rec = _Record(self._step, -1, kind, nbytes, dtype, pg, size)
        if self._cuda:
            rec.anchor = self._anchor
            rec.start_event = torch.cuda.Event(enable_timing=True)
            rec.start_event.record()
        else:
            rec.start_ns = time.time_ns()
        # c10d requires one issue order per group on all ranks, so a per-group
        # counter taken at issue names the same collective everywhere.
        with self._lock:
            rec.seq = self._seq.get(pg, 0)
            self._seq[pg] = rec.seq + 1
            self._pending.append(rec)
        return rec

    def _end_now(self, rec: _Record) -> None:
        """Mark completion at this instant (host) or on the current stream (CUDA)."""
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            rec.end_event = event  # duration is added when resolved in flush/step_comm_ms
        else:
            end_ns = time.time_ns()
            rec.end_ns = end_ns
            assert rec.start_ns is not None  # host records are stamped at issue (_begin)
            with self._lock:
                self._step_comm_ns[rec.step] = self._step_comm_ns.get(rec.step, 0) + end_ns - rec.start_ns

    def _end_on(self, rec: _Record, work: Any) -> None:
        """Mark completion when an async work's future completes."""
        if work is None:  # not a member of the group, or coalescing: nothing was issued
            self._end_now(rec)
            return

        def done(fut: torch.futures.Future) -> None:
            self._end_now(rec)

        rec.future = work.get_future().then(done)

    # -- DDP --------------------------------------------------------------

    def ddp_comm_hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP comm hook: average the bucket by one all-reduce with `ReduceOp.AVG`, timed.

        Without a hook DDP's reducer copies each gradient into the bucket as
        `grad * (1 / world_size)` (reducer.cpp, `at::mul_out`: the scaling is fused
        into the copy) and all-reduces with SUM; with a hook it copies the
        gradient unscaled and leaves the averaging to the hook. Scaling the
        bucket here would be a separate pass over every gradient per step (torch's
        own `allreduce_hook` divides before its SUM), measurable on CPU with few
        tokens per step (bench/bench_instrument.py). AVG folds the division into
        the reduction itself (gloo and NCCL both have it); backends without AVG
        divide first, as `allreduce_hook` does. The result equals DDP's default
        average up to the last bit (sum-then-divide instead of scale-then-sum).
        """
        group: Any = state if state is not None else dist.group.WORLD
        buffer = bucket.buffer()
        opts = self._hook_opts.get(group)
        if opts is None:
            opts = self._hook_opts[group] = self._average_opts(group)
        if opts.reduceOp == dist.ReduceOp.SUM:  # a backend without AVG: divide first, as allreduce_hook does
            buffer.div_(group.size())
        nbytes, dtype = _payload_bytes_dtype(buffer)
        rec = self._begin("all_reduce", nbytes, dtype, group)
        # The process group's own allreduce: a bucket needs none of dist.all_reduce's argument
        # checks, and an installed wrapper must not record it a second time.
        fut = group.allreduce([buffer], opts).get_future()

        def done(f: torch.futures.Future) -> torch.Tensor:
            self._end_now(rec)
            return f.value()[0]

        out = fut.then(done)
        rec.future = out
        return out

    @staticmethod
    def _average_opts(group: Any) -> dist.AllreduceOptions:
        """Asynchronous all-reduce options: `ReduceOp.AVG` where the group's backend has it (gloo, NCCL),
        else SUM (the hook divides first)."""
        opts = dist.AllreduceOptions()
        backend = str(dist.get_backend(group)).lower()
        opts.reduceOp = dist.ReduceOp(dist.ReduceOp.AVG if backend in ("gloo", "nccl") else dist.ReduceOp.SUM)
        opts.asyncOp = True
        return opts

    # -- torch.distributed wrapping ----------------------------------------

    def install(self) -> None:
        """Wrap torch.distributed's collective functions so every call is timed."""
        global _INSTALLED
        if _INSTALLED is not None:
            raise RecorderError("a CollectiveTimer is already installed in this process")
        for name, (kind, payload_param) in _COLLECTIVES.items():
            original = getattr(c10d, name, None)
            if original is None:  # older torch without this function
                continue
            wrapper = self._wrap(original, kind, payload_param)
            for module in (c10d, dist):
                if getattr(module, name, None) is original:
                    self._originals.append((module, name, original))
                    setattr(module, name, wrapper)
        _INSTALLED = self

    def uninstall(self) -> None:
        """Restore the original torch.distributed functions."""
        global _INSTALLED
        for module, name, original in reversed(self._originals):
            setattr(module, name, original)
        self._originals.clear()
        if _INSTALLED is self:
            _INSTALLED = None

    def _wrap(self, original: Callable, kind: str, payload_param: str | None) -> Callable:
        params = list(inspect.signature(original).parameters)
        group_pos = params.index("group")
        async_pos = params.index("async_op")
        payload_pos = params.index(payload_param) if payload_param else -1
        default_group = inspect.signature(original).parameters["group"].default

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if getattr(_TLS, "inside", False):
                return original(*args, **kwargs)
            group = (
                kwargs["group"] if "group" in kwargs else (args[group_pos] if len(args) > group_pos else default_group)
            )
            if group is None:
                group = c10d.GroupMember.WORLD
            # Nothing is issued for a non-member, and inside a coalescing
            # manager the call is only queued: pass both through unrecorded.
            if c10d._rank_not_in_group(group) or group in c10d._world.pg_coalesce_state or group in _UNTIMED_GROUPS:
                return original(*args, **kwargs)
            if payload_pos >= 0:
                payload = kwargs[payload_param] if payload_param in kwargs else args[payload_pos]
                nbytes, dtype = _payload_bytes_dtype(payload)
            else:
                nbytes, dtype = 0, None
            async_op = (
                kwargs["async_op"] if "async_op" in kwargs else (args[async_pos] if len(args) > async_pos else False)
            )
            rec = self._begin(kind, nbytes, dtype, group)
            _TLS.inside = True
            try:
                result = original(*args, **kwargs)
            except BaseException:
                with self._lock:
                    self._pending.remove(rec)
                raise
            finally:
                _TLS.inside = False
            if async_op:
                self._end_on(rec, result)
            else:
                self._end_now(rec)
            return result

        return timed

    # -- results ----------------------------------------------------------

    def _resolve_cuda(self, rec: _Record) -> bool:
        """Fill start_ns/end_ns from events if the collective has completed on the device."""
        if rec.end_event is None or not rec.end_event.query():
            return False
        assert rec.anchor is not None and rec.start_event is not None  # CUDA records carry both (_begin)
        rec.start_ns = rec.anchor.to_epoch_ns(rec.start_event)
        rec.end_ns = rec.anchor.to_epoch_ns(rec.end_event)
        with self._lock:
            self._step_comm_ns[rec.step] = self._step_comm_ns.get(rec.step, 0) + rec.end_ns - rec.start_ns
        return True

    def _resolve_pending(self) -> None:
        if not self._cuda:
            return
        with self._lock:
            unresolved = [r for r in self._pending if r.start_ns is None]
        for rec in unresolved:
            self._resolve_cuda(rec)

    def step_comm_ms(self, step: int) -> float:
        """Sum of durations (ms) of `step`'s collectives completed so far on this rank.

        Durations overlap compute (and each other); this is time in
        collectives, not exposed communication. On CUDA, call it after the
        step's end synchronization (`PhaseTimer.end_step`) so all are resolved.
        """
        self._resolve_pending()
        with self._lock:
            return self._step_comm_ns.get(step, 0) / 1e6

    def flush(self, wait: bool = False) -> None:
        """Write the records of completed collectives and flush the writer.

        Collectives still in flight stay pending for the next flush. With
        `wait=True` (use it once at the end of training) first wait for every
        outstanding collective, so nothing is left unwritten.
        """
        with self._lock:
            pending = self._pending
            self._pending = []
        if wait:
            for rec in pending:
                if rec.future is not None:
                    rec.future.wait()
            if self._cuda:
                torch.cuda.synchronize(self._device)
        keep: list[_Record] = []
        rank, clock, write = self._rank, self._clock, self._writer.write
        for rec in pending:
            if rec.end_ns is None and not (self._cuda and self._resolve_cuda(rec)):
                keep.append(rec)
                continue
            write(
                {
                    "step": rec.step,
                    "rank": rank,
                    "seq": rec.seq,
                    "kind": rec.kind,
                    "bytes": rec.nbytes,
                    "dtype": rec.dtype,
                    "pg": rec.pg,
                    "group_size": rec.group_size,
                    "start_ns": rec.start_ns,
                    "end_ns": rec.end_ns,
                    "clock": clock,
                }
            )
        with self._lock:
            self._pending[:0] = keep
            # Per-step sums are only asked for recent steps; keep memory bounded.
            for old in [s for s in self._step_comm_ns if s < self._step - 16]:
                del self._step_comm_ns[old]
        self._writer.flush()
        # Records keep the anchor they were timed against, so re-anchoring is always safe.
        if self._anchor is not None and time.monotonic() - self._anchor.created_s > _CUDA_REANCHOR_S:
            self._anchor = _CudaAnchor(self._device)


# ---------------------------------------------------------------------------
# Phase timing
# ---------------------------------------------------------------------------


class _Phase:
    """Context manager returned by `PhaseTimer.phase` (a class, not a generator: cheaper)."""

    __slots__ = ("_timer", "_name", "_host", "_start", "_profile")

    _start: Any  # perf_counter_ns on the host clock, a recorded CUDA event on the device's

    def __init__(self, timer: PhaseTimer, name: str, host: bool) -> None:
        self._timer = timer
        self._name = name
        self._host = host
        self._profile: Any = None

    def __enter__(self) -> _Phase:
        # record_function costs a few microseconds even with no profiler, so
        # only annotate while one is collecting.
        if torch.autograd._profiler_enabled():
            self._profile = torch.profiler.record_function(self._name)
            self._profile.__enter__()
        if self._host:
            self._start = time.perf_counter_ns()
        else:
            self._start = self._timer._event()
            self._start.record()
        return self

    def __exit__(self, *exc: object) -> None:
        timer = self._timer
        if self._host:
            timer._host_ns[self._name] = timer._host_ns.get(self._name, 0) + time.perf_counter_ns() - self._start
        else:
            end = timer._event()
            end.record()
            timer._event_pairs.append((self._name, self._start, end))
        if self._profile is not None:
            self._profile.__exit__(None, None, None)
            self._profile = None


class PhaseTimer:
    """Per-step phase times in ms.

    CPU: host `perf_counter` around each phase block. CUDA: a pair of timing
    events on the current stream per block (GPU time from the block's first to
    its last enqueued work, idle gaps included), resolved in `end_step` after
    one `torch.cuda.synchronize`; pass `host_clock=True` to `phase` for blocks
    that wait on the host (the DataLoader), where the host clock is the truth.

    Phases accumulate within a step (e.g. forward once per micro-batch).
    `step_time_ms` is host wall time from `start_step` to `end_step`
    (after the synchronize on CUDA), so it covers everything in the step.
    One PhaseTimer per training loop; not thread-safe.
    """

    def __init__(self, device: torch.device, phases: Sequence[str] = ()) -> None:
        """`phases` are always present in `end_step`'s result (0.0 when not entered)."""
        self._device = torch.device(device)
        self._cuda = self._device.type == "cuda"
        self._always = tuple(phases)
        self._host_ns: dict[str, int] = {}
        self._event_pairs: list[tuple[str, Any, Any]] = []
        self._free_events: list[Any] = []
        self._step_start_ns: int | None = None

    def _event(self) -> Any:
        return self._free_events.pop() if self._free_events else torch.cuda.Event(enable_timing=True)

    def phase(self, name: str, host_clock: bool = False) -> _Phase:
        """Context manager timing one block of phase `name` (and annotating it as `name` for the profiler)."""
        return _Phase(self, name, host_clock or not self._cuda)

    def start_step(self) -> None:
        """Start the step clock and clear the phase sums."""
        self._host_ns.clear()
        self._event_pairs.clear()
        self._step_start_ns = time.perf_counter_ns()

    def end_step(self) -> dict[str, float]:
        """{"step_time_ms": ..., "<phase>_ms": ...} for this step (CUDA: one synchronize)."""
        if self._step_start_ns is None:
            raise RecorderError("PhaseTimer.end_step called without start_step")
        if self._cuda:
            torch.cuda.synchronize(self._device)
        end_ns = time.perf_counter_ns()
        out = {"step_time_ms": (end_ns - self._step_start_ns) / 1e6}
        for name in self._always:
            out[f"{name}_ms"] = 0.0
        for name, ns in self._host_ns.items():
            out[f"{name}_ms"] = out.get(f"{name}_ms", 0.0) + ns / 1e6
        for name, start, end in self._event_pairs:
            out[f"{name}_ms"] = out.get(f"{name}_ms", 0.0) + start.elapsed_time(end)
            self._free_events += (start, end)
        self._event_pairs.clear()
        self._step_start_ns = None
        return out


# ---------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_statm: tuple[int, int] | None = None  # (pid, fd) of an open /proc/self/statm


def _statm_fd() -> int:
    """An fd on this process's /proc/<pid>/statm, kept open: opening costs ~10x a pread.

    Reopened after a fork, since the inherited fd describes the parent.
    """
    global _statm
    pid = os.getpid()
    if _statm is None or _statm[0] != pid:
        _statm = (pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC))
    return _statm[1]


def peak_reserved_bytes(device: torch.device) -> int | None:
    """Peak bytes the CUDA caching allocator reserved since the last reset (`torch.cuda.max_memory_reserved`);
    None on CPU. Read it before `process_memory_bytes(..., reset_peak=True)`, which resets both peaks."""
    device = torch.device(device)
    return int(torch.cuda.max_memory_reserved(device)) if device.type == "cuda" else None


def process_memory_bytes(device: torch.device, reset_peak: bool = False) -> tuple[int, str]:
    """Memory in bytes and its kind: peak CUDA allocation, or the process's resident set.

    CUDA: `torch.cuda.max_memory_allocated(device)`, the peak since the last
    reset; pass `reset_peak=True` to restart the peak after reading (per-step
    peaks). CPU: current RSS from /proc/<pid>/statm (resident pages x page
    size); where /proc is missing, the lifetime peak RSS from getrusage.
    """
    device = torch.device(device)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        if reset_peak:
            torch.cuda.reset_peak_memory_stats(device)
        return int(peak), "cuda_peak_allocated"
    try:
        resident_pages = int(os.pread(_statm_fd(), 256, 0).split()[1])
        return resident_pages * _PAGE_BYTES, "cpu_rss"
    except OSError:
        import resource
        import sys

        # ru_maxrss is KiB on Linux, bytes on macOS.
        scale = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, "cpu_rss"


# DDP's register_comm_hook compares the hook's annotations with the real
# objects; `from __future__ import annotations` made them strings.
CollectiveTimer.ddp_comm_hook.__annotations__.update(
    bucket=dist.GradBucket, state=Any, **{"return": torch.futures.Future[torch.Tensor]}
)
