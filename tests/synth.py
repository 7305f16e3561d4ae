"""Synthetic Kineto (PyTorch profiler) traces with exact timings, for tests.

The builder writes the layout PyTorch's profiler writes (checked against
the HTA sample traces and a gloo trace from torch 2.13): top-level
``schemaVersion``, ``deviceProperties``, ``distributedInfo``, ...,
``traceEvents``, ``traceName``; complete events ``"ph": "X"`` with ``cat``
``cpu_op`` / ``user_annotation`` / ``cuda_runtime`` on the host pid and
thread, and ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` /
``gpu_user_annotation`` on ``pid`` = device index, ``tid`` = stream, with
args ``stream``, ``correlation``, ``External id``; process and thread
metadata events (``"ph": "M"``); the profiler's ``Trace`` span with
``pid: "Spans"``; instant events; ``ac2g`` flow events for kernel launches.

Times are microseconds, written exactly as given: with ``time_format=
"float"`` (PyTorch >= 2.2) as floats, with ``"int"`` (older PyTorch) as
integers. The loader turns them into ns, so ``start_us=12.5`` is
``start_ns=12500``.

Example::

    t = KinetoTrace(rank=1, world_size=2)
    t.step(1, 0, 1000)                                   # ProfilerStep#1, 0..1000 us
    t.kernel("sgemm", 100, 200)                          # compute on stream 7
    t.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 250, 100, stream=20,
             args=t.comm_args("allreduce", 1024))
    t.memcpy(400, 10, kind="HtoD")
    t.write(tmp_path / "rank1.json.gz")

CPU-only (gloo) traces: ``KinetoTrace(gpu=False, backend="gloo")``, then
``cpu_op("c10d::allreduce_", ...)`` and
``annotation("gloo:all_reduce", ..., tid=t.comm_tid, args=...)``.

``layout`` of the written JSON: ``"kineto"`` (one key per line inside each
event, like libkineto), ``"compact"`` (one line, no spaces) or ``"pretty"``
(``json.dumps(indent=2)``, as HTA rewrites traces).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Literal

import orjson

Number = int | float
Layout = Literal["kineto", "compact", "pretty"]

# cupti callback id of cudaLaunchKernel, as Kineto writes it in args.cbid.
_CBID_LAUNCH_KERNEL = 211


class KinetoTrace:
    """Builder for one rank's Kineto trace; see the module docstring.

    Parameters: ``rank`` and ``world_size`` go to ``distributedInfo``
    (``distributed=False`` leaves it out, as a non-distributed run does);
    ``gpu=False`` makes a CPU-only trace (empty ``deviceProperties``, no
    device metadata); ``device`` is the GPU index (the pid of device
    events; default ``rank % 8``); ``pid`` / ``tid`` the host process and
    main thread; ``time_format`` ``"float"`` or ``"int"``.

    Format eras (the same events, written as another PyTorch wrote them):
    ``era="tb_plugin"`` writes the TensorBoard-plugin era's categories
    (``Operator``, ``Runtime``, ``Kernel``, ``Memcpy``, ``Memset``) and
    ``computeProperties`` instead of ``deviceProperties``;
    ``time_unit="ns"`` writes every time as integer nanoseconds with
    ``"displayTimeUnit": "ns"``. Times are still given in microseconds.
    """

    def __init__(
        self,
        rank: int = 0,
        world_size: int = 2,
        *,
        distributed: bool = True,
        backend: str | None = None,
        gpu: bool = True,
        device: int | None = None,
        device_name: str = "NVIDIA H100 80GB HBM3",
        pid: int = 4242,
        tid: int | None = None,
        time_format: Literal["float", "int"] = "float",
        era: Literal["today", "tb_plugin"] = "today",
        time_unit: Literal["us", "ns"] = "us",
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.gpu = gpu
        self.device = rank % 8 if device is None else device
        self.device_name = device_name
        self.pid = pid
        self.tid = pid if tid is None else tid
        # gloo and NCCL run collectives on their own host threads.
        self.comm_tid = self.tid + 7
        self.time_format = time_format
        self.era = era
        self.time_unit = time_unit
        self.backend = backend or ("nccl" if gpu else "gloo")
        self.distributed = distributed
        self.events: list[dict] = []
        self.extra_top: dict[str, Any] = {}
        self._external_id = 0
        self._correlation = 0
        self._ev_idx = 0
        self._streams: set[int] = set()
        self._threads: set[int] = {self.tid}

    # -- ids and times ----------------------------------------------------

    def _t(self, us: Number) -> Number:
        if self.time_format == "int":
            if int(us) != us:
                raise ValueError(f"time_format='int' needs whole microseconds, got {us}")
            return int(us)
        return round(float(us), 3)

    def _next_external(self) -> int:
        self._external_id += 1
        return self._external_id

    def next_correlation(self) -> int:
        """A fresh correlation id (what CUPTI assigns to each launch)."""
        self._correlation += 1
        return self._correlation

    def _host_args(self, args: dict | None) -> dict:
        self._ev_idx += 1
        out = {"External id": self._next_external(), "Record function id": 0}
        out.update(args or {})
        out["Ev Idx"] = self._ev_idx
        return out

    # -- host events --------------------------------------------------------

    def _x(self, cat: str, name: str, pid: Any, tid: Any, start_us: Number, dur_us: Number, args: dict) -> dict:
        ev = {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": pid,
            "tid": tid,
            "ts": self._t(start_us),
            "dur": self._t(dur_us),
            "args": args,
        }
        self.events.append(ev)
        return ev

    def step(self, n: int, start_us: Number, dur_us: Number) -> dict:
        """``ProfilerStep#n`` on the main thread, as ``profiler.step()`` writes it."""
        return self._x(
            "user_annotation", f"ProfilerStep#{n}", self.pid, self.tid, start_us, dur_us, self._host_args(None)
        )

    def cpu_op(
        self,
        name: str,
        start_us: Number,
        dur_us: Number,
        tid: int | None = None,
        args: dict | None = None,
        *,
        input_dims: list | None = None,
        input_types: list | None = None,
    ) -> dict:
        """An operator (``cat: cpu_op``). ``input_dims``/``input_types`` set
        ``Input Dims``/``Input type`` (what ``record_shapes=True`` adds)."""
        extra = dict(args or {})
        if input_dims is not None:
            extra["Input Dims"] = input_dims
        if input_types is not None:
            extra["Input type"] = input_types
        tid = self.tid if tid is None else tid
        self._threads.add(tid)
        return self._x("cpu_op", name, self.pid, tid, start_us, dur_us, self._host_args(extra))

    def annotation(
        self,
        name: str,
        start_us: Number,
        dur_us: Number,
        tid: int | None = None,
        args: dict | None = None,
        *,
        gpu: bool = False,
        stream: int = 7,
    ) -> dict:
        """A ``record_function`` range: ``user_annotation`` on a host thread,
        or with ``gpu=True`` its ``gpu_user_annotation`` copy on a stream
        (no ``stream`` arg, as Kineto writes it)."""
        if gpu:
            self._streams.add(stream)
            ev = {"External id": self._next_external()}
            ev.update(args or {})
            return self._x("gpu_user_annotation", name, self.device, stream, start_us, dur_us, ev)
        tid = self.tid if tid is None else tid
        self._threads.add(tid)
        return self._x("user_annotation", name, self.pid, tid, start_us, dur_us, self._host_args(args))

    def runtime(self, name: str, start_us: Number, dur_us: Number, correlation: int, tid: int | None = None) -> dict:
        """A CUDA runtime call (``cat: cuda_runtime``) with its correlation id."""
        tid = self.tid if tid is None else tid
        args = {"External id": self._next_external(), "cbid": _CBID_LAUNCH_KERNEL, "correlation": correlation}
        return self._x("cuda_runtime", name, self.pid, tid, start_us, dur_us, args)

    def record_param_comms(
        self, start_us: Number, dur_us: Number, args: dict | None = None, tid: int | None = None
    ) -> dict:
        """The ``record_param_comms`` op PyTorch writes around a collective;
        pass :meth:`comm_args` as ``args``."""
        return self.cpu_op("record_param_comms", start_us, dur_us, tid=tid, args=args)

    def instant(self, name: str, ts_us: Number) -> dict:
        """A ``cpu_instant_event`` (the loader drops these)."""
        ev = {
            "ph": "i",
            "cat": "cpu_instant_event",
            "s": "t",
            "name": name,
            "pid": self.pid,
            "tid": self.tid,
            "ts": self._t(ts_us),
            "args": {},
        }
        self.events.append(ev)
        return ev

    def memory(
        self,
        ts_us: Number,
        allocated: int,
        reserved: int,
        nbytes: int = 0,
        *,
        device_type: int = 1,
        device_id: int | None = None,
    ) -> dict:
        """A ``[memory]`` instant event, as ``profile_memory=True`` writes one per allocation or free:
        the allocator's ``Total Allocated``/``Total Reserved`` bytes on the device after it, ``Bytes``
        (negative for a free). ``device_type`` 1 is CUDA (id default: this trace's GPU), 0 the CPU (id -1)."""
        did = (-1 if device_type == 0 else self.device) if device_id is None else device_id
        ev = {
            "ph": "i",
            "cat": "cpu_instant_event",
            "s": "t",
            "name": "[memory]",
            "pid": self.pid,
            "tid": self.tid,
            "ts": self._t(ts_us),
            "args": {
                "Total Reserved": reserved,
                "Total Allocated": allocated,
                "Bytes": nbytes,
                "Addr": 1 << 40,
                "Device Id": did,
                "Device Type": device_type,
            },
        }
        self.events.append(ev)
        return ev

    def raw(self, event: dict) -> dict:
        """Append an event exactly as given (odd inputs for loader tests)."""
        self.events.append(event)
        return event

    # -- device events ------------------------------------------------------

    def _device(
        self,
        cat: str,
        name: str,
        start_us: Number,
        dur_us: Number,
        stream: int,
        correlation: int | None,
        args: dict | None,
        launch_us: Number | None,
        launch_name: str,
    ) -> dict:
        if not self.gpu:
            raise ValueError("a CPU-only trace (gpu=False) has no device events")
        corr = self.next_correlation() if correlation is None else correlation
        ext = self._next_external()
        base = {"External id": ext, "device": self.device, "context": 1, "stream": stream, "correlation": corr}
        base.update(args or {})
        self._streams.add(stream)
        ev = self._x(cat, name, self.device, stream, start_us, dur_us, base)
        if launch_us is not None:
            self.runtime(launch_name, launch_us, min(5, max(dur_us, 1)) if self.time_format == "int" else 5.0, corr)
            self.events.append(
                {
                    "ph": "s",
                    "id": corr,
                    "pid": self.pid,
                    "tid": self.tid,
                    "ts": self._t(launch_us),
                    "cat": "ac2g",
                    "name": "ac2g",
                }
            )
            self.events.append(
                {
                    "ph": "f",
                    "id": corr,
                    "pid": self.device,
                    "tid": stream,
                    "ts": self._t(start_us),
                    "cat": "ac2g",
                    "name": "ac2g",
                    "bp": "e",
                }
            )
        return ev

    def kernel(
        self,
        name: str,
        start_us: Number,
        dur_us: Number,
        stream: int = 7,
        correlation: int | None = None,
        args: dict | None = None,
        *,
        launch_us: Number | None = None,
    ) -> dict:
        """A GPU kernel (``cat: kernel``) on ``stream``. ``correlation``
        defaults to a fresh id; ``launch_us`` adds the ``cudaLaunchKernel``
        runtime event (5 us) and the ac2g flow that link it to the kernel."""
        kargs = {
            "queued": 0,
            "registers per thread": 32,
            "shared memory": 0,
            "blocks per SM": 1.0,
            "warps per SM": 4.0,
            "grid": [108, 1, 1],
            "block": [128, 1, 1],
            "est. achieved occupancy %": 12,
        }
        kargs.update(args or {})
        return self._device("kernel", name, start_us, dur_us, stream, correlation, kargs, launch_us, "cudaLaunchKernel")

    def memcpy(
        self,
        start_us: Number,
        dur_us: Number,
        stream: int = 7,
        *,
        kind: str = "HtoD",
        nbytes: int = 4096,
        correlation: int | None = None,
        launch_us: Number | None = None,
    ) -> dict:
        """A ``gpu_memcpy``; ``kind`` HtoD, DtoH, DtoD (named as Kineto does)."""
        names = {
            "HtoD": "Memcpy HtoD (Pageable -> Device)",
            "DtoH": "Memcpy DtoH (Device -> Pageable)",
            "DtoD": "Memcpy DtoD (Device -> Device)",
        }
        args = {"bytes": nbytes, "memory bandwidth (GB/s)": nbytes / max(float(dur_us), 1e-3) / 1e3}
        return self._device(
            "gpu_memcpy", names[kind], start_us, dur_us, stream, correlation, args, launch_us, "cudaMemcpyAsync"
        )

    def memset(
        self,
        start_us: Number,
        dur_us: Number,
        stream: int = 7,
        *,
        nbytes: int = 4096,
        correlation: int | None = None,
        launch_us: Number | None = None,
    ) -> dict:
        """A ``gpu_memset`` (``Memset (Device)``)."""
        args = {"bytes": nbytes, "memory bandwidth (GB/s)": nbytes / max(float(dur_us), 1e-3) / 1e3}
        return self._device(
            "gpu_memset", "Memset (Device)", start_us, dur_us, stream, correlation, args, launch_us, "cudaMemsetAsync"
        )

    def comm_args(
        self,
        collective: str,
        in_nelems: int,
        out_nelems: int | None = None,
        *,
        dtype: str = "Float",
        group_size: int | None = None,
        pg_name: str = "0",
    ) -> dict:
        """Collective args as on ``record_param_comms`` (and on NCCL kernels
        in PyTorch >= 2.3)."""
        size = self.world_size if group_size is None else group_size
        return {
            "Collective name": collective,
            "In msg nelems": in_nelems,
            "Out msg nelems": in_nelems if out_nelems is None else out_nelems,
            "Group size": size,
            "dtype": dtype,
            "In split size": "[]",
            "Out split size": "[]",
            "Process Group Name": pg_name,
            "Process Group Description": "default_pg",
            "Process Group Ranks": str(list(range(size))),
        }

    # -- composite patterns (with exact FLOPs) -----------------------------

    def linear(
        self,
        start_us: Number,
        m: int,
        k: int,
        n: int,
        kernel_us: Number,
        *,
        consistent: bool = True,
        kernel: str = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
        dtype: str = "c10::BFloat16",
    ) -> int:
        """``aten::linear`` (50 us) around ``aten::addmm`` (30 us) that launches one GEMM kernel ``kernel_us`` long
        at ``start_us + 60``. With ``consistent=False`` the linear records shapes that do not fit (its weight's
        inner dimension is ``k + 1``, as a real NCCL trace recorded), the addmm's stay right. Returns the
        product's FLOPs, ``2 m k n``: what must be counted, once, either way."""
        w_k = k if consistent else k + 1
        self.cpu_op("aten::linear", start_us, 50, input_dims=[[m, k], [n, w_k], [n]], input_types=[dtype] * 3)
        self.cpu_op(
            "aten::addmm",
            start_us + 10,
            30,
            input_dims=[[n], [m, k], [k, n], [], []],
            input_types=[dtype] * 3 + ["Scalar", "Scalar"],
        )
        self.kernel(kernel, start_us + 60, kernel_us, launch_us=start_us + 15)
        return 2 * m * k * n

    def compiled_region(self, start_us: Number, kernels: list[tuple[str, Number]]) -> None:
        """A torch.compile'd region: a ``CompiledFunction`` range (no shapes) launching ``kernels``
        (name, duration) back to back from ``start_us + 60``; none has FLOPs the analyzer can know."""
        self.cpu_op("CompiledFunction", start_us, 10 + 5 * len(kernels))
        t = start_us + 60
        for i, (name, dur) in enumerate(kernels):
            self.kernel(name, t, dur, launch_us=start_us + 2 + 5 * i)
            t += dur

    def graph_launch(self, start_us: Number, kernels: list[tuple[str, Number]], stream: int = 7) -> None:
        """A CUDA-graph replay: one ``cudaGraphLaunch`` whose correlation id every replayed kernel carries
        (as CUPTI reports graph kernels); the kernels run back to back from ``start_us + 20``."""
        corr = self.next_correlation()
        self.runtime("cudaGraphLaunch", start_us, 8, corr)
        t = start_us + 20
        for name, dur in kernels:
            self.kernel(name, t, dur, stream=stream, correlation=corr)
            t += dur

    # -- output -------------------------------------------------------------

    def _metadata(self) -> list[dict]:
        ts = self._t(min((e["ts"] for e in self.events if "ts" in e), default=0))
        meta = [
            {"ph": "M", "name": "process_name", "ts": ts, "pid": self.pid, "tid": 0, "args": {"name": "python3"}},
            {"ph": "M", "name": "process_labels", "ts": ts, "pid": self.pid, "tid": 0, "args": {"labels": "CPU"}},
            {
                "ph": "M",
                "name": "process_sort_index",
                "ts": ts,
                "pid": self.pid,
                "tid": 0,
                "args": {"sort_index": self.pid},
            },
        ]
        for tid in sorted(self._threads):
            label = "pt_gloo_runloop" if tid == self.comm_tid else "python3"
            meta.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "ts": ts,
                    "pid": self.pid,
                    "tid": tid,
                    "args": {"name": f"thread {tid} ({label})"},
                }
            )
        if self.gpu:
            meta.append(
                {"ph": "M", "name": "process_name", "ts": ts, "pid": self.device, "tid": 0, "args": {"name": "python3"}}
            )
            meta.append(
                {
                    "ph": "M",
                    "name": "process_labels",
                    "ts": ts,
                    "pid": self.device,
                    "tid": 0,
                    "args": {"labels": f"GPU {self.device}"},
                }
            )
            for s in sorted(self._streams):
                meta.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "ts": ts,
                        "pid": self.device,
                        "tid": s,
                        "args": {"name": f"stream {s} "},
                    }
                )
        return meta

    def _span(self) -> list[dict]:
        timed = [e for e in self.events if e.get("ph") == "X"]
        start = min((e["ts"] for e in timed), default=0)
        end = max((e["ts"] + e["dur"] for e in timed), default=0)
        return [
            {
                "ph": "X",
                "cat": "Trace",
                "name": "PyTorch Profiler (0)",
                "pid": "Spans",
                "tid": "PyTorch Profiler",
                "ts": self._t(start),
                "dur": self._t(end - start),
                "args": {"Op count": 0},
            },
            {
                "ph": "i",
                "s": "g",
                "name": "Iteration Start: PyTorch Profiler",
                "pid": "Traces",
                "tid": "Trace PyTorch Profiler",
                "ts": self._t(start),
            },
            {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": self._t(end)},
        ]

    def to_dict(self) -> dict:
        """The trace document (top-level keys in Kineto's order)."""
        doc: dict[str, Any] = {"schemaVersion": 1}
        doc["deviceProperties"] = (
            [
                {
                    "id": self.device,
                    "name": self.device_name,
                    "totalGlobalMem": 85029158912,
                    "computeMajor": 9,
                    "computeMinor": 0,
                    "maxThreadsPerBlock": 1024,
                    "maxThreadsPerMultiprocessor": 2048,
                    "regsPerBlock": 65536,
                    "warpSize": 32,
                    "sharedMemPerBlock": 49152,
                    "numSms": 132,
                    "regsPerMultiprocessor": 65536,
                    "sharedMemPerMultiprocessor": 233472,
                }
            ]
            if self.gpu
            else []
        )
        if self.distributed:
            doc["distributedInfo"] = {
                "backend": self.backend,
                "rank": self.rank,
                "world_size": self.world_size,
                "pg_count": 1,
                "pg_config": [
                    {
                        "pg_name": "0",
                        "pg_desc": "default_pg",
                        "backend_config": f"cpu:gloo,cuda:{self.backend}",
                        "pg_size": self.world_size,
                        "ranks": list(range(self.world_size)),
                    }
                ],
            }
        doc["record_shapes"] = 1
        doc["displayTimeUnit"] = "ms"
        doc["baseTimeNanoseconds"] = 1700000000000000000
        doc.update(self.extra_top)
        doc["traceEvents"] = self._metadata() + self.events + self._span()
        doc["traceName"] = f"rank{self.rank}.json"
        if self.era == "tb_plugin":
            doc = _tb_plugin_era(doc)
        if self.time_unit == "ns":
            doc = _in_ns(doc)
        return doc

    def dumps(self, layout: Layout = "kineto") -> bytes:
        """The JSON text in the chosen ``layout``."""
        doc = self.to_dict()
        if layout == "compact":
            return orjson.dumps(doc)
        if layout == "pretty":
            return json.dumps(doc, indent=2).encode()
        events = doc.pop("traceEvents")
        trailer = {"traceName": doc.pop("traceName")}
        head = orjson.dumps(doc, option=orjson.OPT_INDENT_2)[:-2]  # drop "\n}"
        body = b",\n".join(
            orjson.dumps(e, option=orjson.OPT_INDENT_2).replace(b"\n", b"\n  ").join((b"  ", b"")) for e in events
        )
        tail = b",".join(b"%s: %s" % (orjson.dumps(k), orjson.dumps(v)) for k, v in trailer.items())
        return head + b',\n  "traceEvents": [\n' + body + b"\n  ],\n  " + tail + b"\n}\n"

    def write(self, path: Path, gz: bool = True, layout: Layout = "kineto") -> Path:
        """Write the trace to ``path`` (gzip-compressed when ``gz``); return it."""
        path = Path(path)
        data = self.dumps(layout)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(data, compresslevel=1) if gz else data)
        return path


# The TensorBoard-plugin era's category names for today's (PyTorch 1.8 to 1.9, Kineto tb_plugin test data).
_TB_PLUGIN_CATS = {
    "cpu_op": "Operator",
    "user_annotation": "Operator",
    "cuda_runtime": "Runtime",
    "kernel": "Kernel",
    "gpu_memcpy": "Memcpy",
    "gpu_memset": "Memset",
}


def _tb_plugin_era(doc: dict) -> dict:
    """The same trace as the TensorBoard-plugin era wrote it: old categories, computeProperties, no schema extras."""
    out = {"schemaVersion": 1, "computeProperties": doc.get("deviceProperties", [])}
    events = []
    for e in doc["traceEvents"]:
        e = dict(e)
        if e.get("cat") in _TB_PLUGIN_CATS:
            e["cat"] = _TB_PLUGIN_CATS[e["cat"]]
        if e.get("cat") == "gpu_user_annotation":
            continue  # the era wrote no GPU copies of annotations
        events.append(e)
    out["traceEvents"] = events
    out["traceName"] = doc["traceName"]
    return out


def _in_ns(doc: dict) -> dict:
    """Every ts/dur in integer nanoseconds, with ``displayTimeUnit: ns`` (exact for times given to the ns)."""
    out = {k: v for k, v in doc.items() if k != "traceEvents"}
    out["displayTimeUnit"] = "ns"
    events = []
    for e in doc["traceEvents"]:
        e = dict(e)
        for key in ("ts", "dur"):
            if isinstance(e.get(key), (int, float)) and not isinstance(e.get(key), bool):
                e[key] = int(round(e[key] * 1000))
        events.append(e)
    out["traceEvents"] = events
    return out
