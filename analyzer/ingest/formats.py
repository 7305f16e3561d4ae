"""The saved formats, one typed definition each: the run manifest (``run.json``,
``reftrain.run/1``), a metrics line (``metrics/rank{R}.jsonl``,
``reftrain.metrics/1``) and the report document's top level
(``analyzer.report/1``). docs/rundir.md and docs/cli.md describe the fields.

Writers and readers share these classes: reftrain builds a
:class:`RunManifest` and writes ``to_json()``; the analyzer reads it back
with :meth:`RunManifest.from_json`. Reading is tolerant, so old runs stay
readable: a field a version did not write, or wrote with an unexpected type,
reads as ``None`` (lists: empty); fields this version does not know are kept
in ``extra`` and written back after the known ones, so a read-modify-write
(the launcher marking a run failed) loses nothing. ``to_json()`` writes the
known fields in their documented order, ``None`` as ``null``, except the
fields marked ``omit_none`` (``error``, ``checkpoint_saves``,
``inject.measured``, ...), which are absent until they have a value, as the
dict literal reftrain wrote before wrote them.

Torch-free and pandas-free: reftrain's launcher imports this before any rank starts.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, TypeVar

RUN_SCHEMA = "reftrain.run/1"
METRICS_SCHEMA = "reftrain.metrics/1"
COLLECTIVES_SCHEMA = "reftrain.collectives/1"
TELEMETRY_SCHEMA = "reftrain.telemetry/1"
REPORT_SCHEMA = "analyzer.report/1"
# The manifest's `schemas`: the schema of each JSON-lines family.
FAMILY_SCHEMAS: dict[str, str] = {
    "metrics": METRICS_SCHEMA,
    "collectives": COLLECTIVES_SCHEMA,
    "telemetry": TELEMETRY_SCHEMA,
}
FILE_FAMILIES = ("metrics", "collectives", "telemetry", "traces")


# ---------------------------------------------------------------------------
# File names in a run directory, one pattern per kind (docs/rundir.md): the
# writer (reftrain) formats them with the functions, the readers
# (analyzer.ingest.rundir, .locate) match them with the patterns beside them.
# ---------------------------------------------------------------------------

# Records files: metrics/[attempt{k}/]rank{R}.jsonl, collectives/[attempt{k}/]rank{R}.jsonl,
# telemetry/gpu{R}.jsonl (R the rank; telemetry has no attempt folder).
RECORDS_PREFIX: dict[str, str] = {"metrics": "rank", "collectives": "rank", "telemetry": "gpu"}
# A records file of the first attempt, as a glob (the attempts after it are listed in run.json).
RECORDS_GLOB: dict[str, str] = {f: f"{f}/{p}*.jsonl" for f, p in RECORDS_PREFIX.items()}
# The rank in a records file's name.
RECORDS_RANK_RE = re.compile(rf"(?:{'|'.join(sorted(set(RECORDS_PREFIX.values())))})(\d+)\.jsonl$")
# Traces: traces/[attempt{k}/]step{N}/rank{R}.pt.trace.json.gz, one folder per profiler window
# (N its last step; the TensorBoard plugin's suffix); before it, traces/rank{R}.step{N}.json.gz.
TRACE_WINDOW_DIR_RE = re.compile(r"^step(\d+)$")
LEGACY_TRACE_RE = re.compile(r"^rank\d+\.step(\d+)\.json(?:\.gz)?$")


def attempt_folder(attempt: int) -> str:
    """The sub-folder of an attempt's files: '' for the first, ``attempt{k}/`` after the k-th restart."""
    return "" if attempt == 0 else f"attempt{attempt}/"


def records_file(family: str, rank: int, attempt: int = 0) -> str:
    """A rank's records file, relative to the run directory (``metrics/attempt1/rank3.jsonl``)."""
    sub = "" if family == "telemetry" else attempt_folder(attempt)
    return f"{family}/{sub}{RECORDS_PREFIX[family]}{rank}.jsonl"


def trace_window_dir(step: int) -> str:
    """The folder of the profiler window that ends at ``step``, relative to the traces folder."""
    return f"step{step}"


def trace_file(step: int, rank: int) -> str:
    """A rank's trace of the profiler window that ends at ``step``, relative to the traces folder."""
    return f"{trace_window_dir(step)}/rank{rank}.pt.trace.json.gz"


T = TypeVar("T", bound="Record")
_OMIT = "omit_none"


def _omit_none(default: Any = None) -> Any:
    """A field absent from ``to_json()`` while it is None."""
    return field(default=default, metadata={_OMIT: True})


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _coerce(value: Any, hint: Any) -> Any:
    """``value`` as ``hint`` describes it, or None when it is not of that type."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        for a in args:
            out = _coerce(value, a)
            if out is not None:
                return out
        return None
    if hint is Any:
        return value
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_json(value) if isinstance(value, dict) else None
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        if not isinstance(value, list):
            return None
        out = [_coerce(v, item) for v in value]
        return [v for v in out if v is not None] if item is not Any else out
    if origin is dict or hint is dict:
        return value if isinstance(value, dict) else None
    if hint is bool:
        return value if isinstance(value, bool) else None
    if hint is int:
        return value if _is_int(value) else None
    if hint is float:  # an int where a float is documented stays the int it was (same JSON back)
        return value if (_is_int(value) or isinstance(value, float)) else None
    if hint is str:
        return value if isinstance(value, str) else None
    return value


def _to_json(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    return value


@dataclass
class Record:
    """Base of the saved formats: ``from_json`` (tolerant) and ``to_json`` (documented order)."""

    _hints: ClassVar[dict[type, dict[str, Any]]] = {}

    @classmethod
    def _field_hints(cls) -> dict[str, Any]:
        hints = Record._hints.get(cls)
        if hints is None:
            resolved = typing.get_type_hints(cls)
            hints = {f.name: resolved[f.name] for f in dataclasses.fields(cls) if f.name != "extra"}
            Record._hints[cls] = hints
        return hints

    @classmethod
    def from_json(cls: type[T], data: Any) -> T:
        """Read a decoded JSON object; anything not an object reads as an empty record."""
        data = data if isinstance(data, dict) else {}
        hints = cls._field_hints()
        known = {}
        for f in dataclasses.fields(cls):
            if f.name not in hints:
                continue
            factory = f.default is dataclasses.MISSING
            value = _coerce(data[f.name], hints[f.name]) if f.name in data else None
            # An optional field absent or of the wrong type is None (not its writer's
            # default); a non-optional one (a list, the files object) keeps its default.
            if value is not None or not factory:
                known[f.name] = value
        extra = {k: v for k, v in data.items() if k not in hints}
        return cls(**known, extra=extra)  # type: ignore[call-arg]

    def to_json(self) -> dict[str, Any]:
        """The JSON object (a dict of JSON values), known fields first in their order, then ``extra``."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if value is None and f.metadata.get(_OMIT):
                continue
            out[f.name] = _to_json(value)
        for k, v in getattr(self, "extra", {}).items():
            out.setdefault(k, v)
        return out


# ---------------------------------------------------------------------------
# run.json (reftrain.run/1)
# ---------------------------------------------------------------------------


@dataclass
class Git(Record):
    sha: str | None = None
    dirty: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Hardware(Record):
    device_type: str | None = None  # "cpu" | "cuda"
    device_names: list[str] = field(default_factory=list)  # per rank
    device_memory_bytes: int | None = None  # the smallest GPU of the run; None on CPU
    cpu_model: str | None = None
    cpu_cores: int | None = None
    cpu_cores_usable: int | None = None
    hostnames: list[str] = field(default_factory=list)  # per rank
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Params(Record):
    total: int | None = None
    non_embedding: int | None = None
    embedding: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class MeasuredFlops(Record):
    """One training step counted by torch's FlopCounterMode (recorder.flops, docs/record.md "Model FLOPs").

    FLOPs of that step on rank 0: ``model`` (forward + backward as written),
    ``recompute`` (activation checkpointing's and the fused attention
    backward's), ``hardware`` (their sum), ``optimizer`` (inside
    ``Optimizer.step``; in neither).
    """

    model: int | None = None
    hardware: int | None = None
    recompute: int | None = None
    optimizer: int | None = None
    tokens: int | None = None  # of the counted step on rank 0
    step: int | None = None
    by_op: dict[str, Any] | None = None  # model FLOPs per aten op
    added_formulas: list[str] = field(default_factory=list)  # ops counted with formulas torch lacks
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Flops(Record):
    """Model FLOPs per token: PaLM's formula (reftrain, 6N + 12LHQT, docs/mfu.md) or measured (the recorder)."""

    per_token: float | None = None
    per_token_hardware: float | None = None
    formula: str | None = None
    hardware_formula: str | None = None
    terms: dict[str, Any] | None = None  # N, N_blocks, L, H, Q, T
    # "measured" (absent: the formula above, or a count given to recorder.open): where per_token came from
    source: str | None = _omit_none()
    detail: str | None = _omit_none()
    measured: MeasuredFlops | None = _omit_none()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def source_text(self) -> str | None:
        """Where ``per_token`` came from, in one line: ``measured: <detail>`` or ``formula: <formula>``."""
        if self.per_token is None:
            return None
        if self.source:
            return f"{self.source}: {self.detail}" if self.detail else self.source
        return f"formula: {self.formula}" if self.formula else None


@dataclass
class PeakFlops(Record):
    per_s: float | None = None  # per device, in the run's dtype
    source: str | None = None  # table | measured | override
    detail: str | None = None
    dtype: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Clock(Record):
    offsets_ns: list[int] = field(default_factory=list)  # per rank: its clock minus rank 0's
    uncertainty_ns: int | None = None
    method: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Inject(Record):
    slow_rank: int | None = None
    delay_ms: float | None = None
    slowdown: float | None = None
    # At completion, with any injection: per rank injected_ms and compute_factor medians.
    measured: dict[str, Any] | None = _omit_none()
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ResumedFrom(Record):
    run_dir: str | None = None
    checkpoint: str | None = None
    step: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Files(Record):
    """Paths relative to the run directory. A family the manifest does not list is None
    (a run still running, or killed before the end: readers then look on disk)."""

    config: str | None = None  # "config.yaml"
    metrics: list[str] | None = None
    collectives: list[str] | None = None
    telemetry: list[str] | None = None
    traces: list[str] | None = None
    checkpoints: list[str] | None = None  # complete ones only
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Attempt(Record):
    """One torchelastic attempt."""

    attempt: int | None = None  # 0 = the first
    start_time: str | None = None
    end_time: str | None = None
    status: str | None = None  # running | completed | failed | preempted | hung
    resumed_from_step: int | None = None
    cause: str | None = None
    exit_codes: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckpointSave(Record):
    step: int | None = None
    stall_s: float | None = None  # rank 0's wall time in the save
    attempt: int | None = None
    mode: str | None = _omit_none()  # sync | async (absent: sync, before async saves existed)
    complete_s: float | None = _omit_none()  # async: save start to publish (the write ran behind the steps)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class HangReport(Record):
    """The launcher's watchdog naming a hung rank (docs/reftrain.md, "Hangs")."""

    rank: int | None = None
    attempt: int | None = None
    step: int | None = None  # the hung rank's last heartbeat: step and phase
    phase: str | None = None
    stalled_s: float | None = None  # detection time minus that heartbeat's
    timeout_s: float | None = None
    detected_time: str | None = None  # ISO 8601, UTC
    stacks: list[str] = field(default_factory=list)  # per-rank Python stack dumps, relative paths
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunManifest(Record):
    """``run.json``: every field of docs/rundir.md, in the order reftrain writes them."""

    schema: str | None = RUN_SCHEMA
    run_id: str | None = None
    status: str | None = None  # running | completed | failed | preempted
    start_time: str | None = None  # ISO 8601, UTC
    end_time: str | None = None
    git: Git | None = None
    command: list[str] = field(default_factory=list)
    config: dict[str, Any] | None = None  # the resolved config, as config.yaml
    world_size: int | None = None
    backend: str | None = None
    hardware: Hardware | None = None
    torch_version: str | None = None
    params: Params | None = None
    flops: Flops | None = None
    peak_flops: PeakFlops | None = None
    tokens_per_step: int | None = None
    steps: int | None = None
    start_step: int | None = None
    warmup_steps: int | None = None
    profiled_steps: list[int] = field(default_factory=list)
    clock: Clock | None = None
    inject: Inject | None = None
    resumed_from: ResumedFrom | None = None
    telemetry_note: str | None = None
    files: Files = field(default_factory=Files)
    schemas: dict[str, str] = field(default_factory=lambda: dict(FAMILY_SCHEMAS))
    max_restarts: int | None = None
    attempts: list[Attempt] = field(default_factory=list)
    checkpoint_saves: list[CheckpointSave] | None = _omit_none()
    hangs: list[HangReport] | None = _omit_none()
    error: str | None = _omit_none()  # only when failed: the one-line reason (the first rank to fail)
    # Only when failed with several ranks failing: the other ranks' errors, in the order their processes
    # exited, each "rank R: ..." (mostly consequences of the first, e.g. gloo's "Connection reset by peer").
    secondary_errors: list[str] | None = _omit_none()
    # Runs written by the recorder: how its collectives were timed ("none: ..." with the reason).
    collective_timing: str | None = _omit_none()
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, manifest: "RunManifest | Mapping[str, Any] | None") -> "RunManifest":
        """The typed manifest of ``manifest``: itself when typed, else read from the decoded JSON (None: empty).

        The metric functions take either, so that callers holding only the
        decoded run.json (tests, notebooks) and the analysis (typed once,
        ``RunAnalysis.run_manifest``) read it the same way."""
        return manifest if isinstance(manifest, RunManifest) else cls.from_json(manifest or {})

    # Readers' conveniences: an absent object reads as an empty one.
    @property
    def hw(self) -> Hardware:
        return self.hardware or Hardware()

    @property
    def model_flops(self) -> Flops:
        return self.flops or Flops()

    @property
    def peak(self) -> PeakFlops:
        return self.peak_flops or PeakFlops()

    def family_schema(self, family: str) -> object:
        """The schema of a JSON-lines family as written (the reader checks it); version 1
        when the manifest does not say."""
        return self.schemas.get(family, f"reftrain.{family}/1")


# ---------------------------------------------------------------------------
# metrics/rank{R}.jsonl (reftrain.metrics/1)
# ---------------------------------------------------------------------------


@dataclass
class MetricsLine(Record):
    """One optimizer step of one rank (docs/rundir.md). Times in ms of that rank's wall clock.

    The fields in the order the recorder writes them (``recorder.Recorder.step_end`` builds one per
    step, for reftrain and for a user's own loop, and writes ``to_json()``).
    """

    step: int | None = None
    rank: int | None = None
    loss: float | None = None
    step_time_ms: float | None = None
    cpu_ms: float | None = None  # CPU time of the rank's process over the step (all threads)
    data_wait_ms: float | None = None
    forward_ms: float | None = None
    backward_ms: float | None = None
    optimizer_ms: float | None = None
    grad_sync_ms: float | None = None
    comm_ms: float | None = None
    tokens: int | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    mem_bytes: int | None = None
    mem_kind: str | None = None  # cuda_peak_allocated | cpu_rss
    mem_reserved_bytes: int | None = None  # peak reserved by the CUDA caching allocator this step; None on CPU
    profiled: bool | None = None
    lr: float | None = None
    grad_norm: float | None = None  # before clipping; None when optim.grad_clip is 0
    injected_ms: float | None = None  # wall time the --inject-* options added, measured
    injected_forward_ms: float | None = None
    injected_backward_ms: float | None = None
    compute_cpu_ms: float | None = None  # --inject-slowdown on CPU: forward + backward's own CPU work
    injected_cpu_ms: float | None = None  # ... and the injected work's
    # The machine-speed canary (recorder/canary.py; reftrain and the recorder run it) before this step (CPU runs):
    # the fixed probe's wall time and its thread's CPU time; absent otherwise and in older runs.
    canary_ms: float | None = _omit_none()
    canary_cpu_ms: float | None = _omit_none()
    time_ns: int | None = None
    attempt: int | None = None  # torchelastic attempt that ran the step (absent in older runs: 0)
    extra: dict[str, Any] = field(default_factory=dict)

    # The table dtype of each column that the run-directory table always has
    # (analyzer.ingest.rundir reads the lines into one table; the other fields
    # are columns only where the lines carry them, as before they were typed here).
    DTYPES: ClassVar[dict[str, str]] = {}
    TABLE_FIELDS: ClassVar[tuple[str, ...]] = (
        "step",
        "rank",
        "loss",
        "step_time_ms",
        "data_wait_ms",
        "forward_ms",
        "backward_ms",
        "optimizer_ms",
        "grad_sync_ms",
        "comm_ms",
        "tokens",
        "tokens_per_s",
        "mfu",
        "hfu",
        "mem_bytes",
        "mem_kind",
        "mem_reserved_bytes",
        "profiled",
        "time_ns",
    )


def _dtypes(cls: type[Record], overrides: dict[str, str], only: tuple[str, ...]) -> dict[str, str]:
    kinds = {int: "int64", float: "float64", bool: "bool", str: "category"}
    out: dict[str, str] = {}
    for name, hint in cls._field_hints().items():
        if name not in only:
            continue
        base = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        out[name] = overrides.get(name, kinds.get(base[0], "object"))
    return out


# mem_reserved_bytes is null on CPU runs (and absent in older ones): a float column, NaN there.
MetricsLine.DTYPES = _dtypes(MetricsLine, {"mem_reserved_bytes": "float64"}, MetricsLine.TABLE_FIELDS)


# ---------------------------------------------------------------------------
# The report document (analyzer.report/1): its top level
# ---------------------------------------------------------------------------


class RunSection(typing.TypedDict):
    """The report's ``run``: the run's identity and its headline figures."""

    run_id: str | None
    status: str | None
    world_size: int | None
    n_ranks: int
    step_time_ms: float | None  # the headline; its definition and both figures in step_time
    step_time: dict[str, Any]  # analyzer.metrics.step_time.StepTime.to_json()
    mfu: dict[str, Any]  # analyzer.metrics.mfu.MfuResult.to_json()
    goodput: dict[str, Any] | None  # reftrain runs with attempts only


def package_version() -> str:
    """The trainperf version, behind every command's ``--version`` and the reports' generator lines.

    ``analyzer.__version__``, which pyproject.toml reads as the distribution's version
    (tool.setuptools.dynamic), so the two cannot differ; no importlib.metadata lookup, whose
    import alone cost about 10 ms of every report.
    """
    from analyzer import __version__

    return __version__


class Generator(typing.TypedDict):
    """Who wrote the report, and when (the volatile part, REPORT_VOLATILE)."""

    tool: str
    version: str
    created_at: str  # ISO 8601, UTC, seconds


class ReportCore(typing.TypedDict):
    """What :meth:`analyzer.api.RunAnalysis.to_json` writes, in this order."""

    schema: str  # REPORT_SCHEMA
    path: str | list[str]
    kind: str  # "reftrain" or "traces"
    run: RunSection
    ranks: list[dict[str, Any]]  # one RankSummary each
    steps: list[dict[str, Any]]  # one row per (rank, step)
    stragglers: dict[str, Any]
    kernels: list[dict[str, Any]]
    collectives: list[dict[str, Any]] | None
    attribution: dict[str, Any] | None
    memory: dict[str, Any]
    idle: dict[str, Any] | None
    roofline: dict[str, Any]
    critical_path: list[dict[str, Any]] | None  # one entry per rank and profiled step; None: not computed
    errors: list[str]
    warnings: list[str]


class ReportDocument(ReportCore, total=False):
    """``analyzer report --json``: the core plus what analyzer.verbs.report adds."""

    suggestions: list[dict[str, Any]]
    generator: Generator


# Top-level keys of `analyzer report --json`, in order, read off the typed
# definition; tests/test_public_surface.py checks it against the golden report.
REPORT_TOP_LEVEL = tuple(ReportDocument.__annotations__)
# What differs between two reports of the same input by the same code: the
# time it was written and the analyzer's version (tests/test_golden_reports.py
# masks them, and the input's path, by name).
REPORT_VOLATILE = (("generator", "created_at"), ("generator", "version"))


__all__ = [
    "COLLECTIVES_SCHEMA",
    "FAMILY_SCHEMAS",
    "FILE_FAMILIES",
    "LEGACY_TRACE_RE",
    "RECORDS_GLOB",
    "RECORDS_PREFIX",
    "RECORDS_RANK_RE",
    "TRACE_WINDOW_DIR_RE",
    "METRICS_SCHEMA",
    "REPORT_SCHEMA",
    "REPORT_TOP_LEVEL",
    "REPORT_VOLATILE",
    "RUN_SCHEMA",
    "TELEMETRY_SCHEMA",
    "Attempt",
    "CheckpointSave",
    "Clock",
    "Files",
    "Flops",
    "Generator",
    "Git",
    "Hardware",
    "Inject",
    "MetricsLine",
    "Params",
    "PeakFlops",
    "Record",
    "ReportCore",
    "ReportDocument",
    "ResumedFrom",
    "RunManifest",
    "RunSection",
    "attempt_folder",
    "records_file",
    "trace_file",
    "trace_window_dir",
]
