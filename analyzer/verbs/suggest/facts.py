"""The measured numbers the rules read, derived once from a RunAnalysis (pure: no file access).

:func:`run_facts` condenses an :class:`analyzer.api.RunAnalysis` into a
:class:`RunFacts`, the flat record the rules read, assembled from five typed
parts each built by its own function: :class:`SetupFacts` (what ran where),
:class:`StepFacts` (the steady step), :class:`CommunicationFacts`,
:class:`ComputeFacts` and :class:`WorkloadFacts` (tokens, memory, recompute);
their fields partition RunFacts' (all but ``notes``). Definitions
(docs/suggestions.md, "Facts"):

* ``step_time_ms``: the steady-state step. reftrain runs: the median over
  steady-state steps (warmup and profiled steps excluded) of the mean over
  ranks of ``step_time_ms`` in ``metrics/rank*.jsonl``, the same step time
  as the run's MFU (analyzer.metrics.mfu). Traces: the median over
  ProfilerStep windows of the mean over ranks.
* ``phases``: reftrain runs only; per phase (``data_wait``, ``forward``,
  ``backward``, ``optimizer``, ``grad_sync``, ``comm``) the median over the
  same steps of the mean over ranks, in ms.
* ``shares``: the step breakdown of the trace windows (device: compute,
  overlapped_comm, exposed_comm, exposed_memcpy, idle; host: data, forward,
  backward, optimizer, grad_sync, exposed_comm, other) as fractions of step
  time, summed over ranks and windows (the parts sum to 1). Rules apply a
  share to the steady ``step_time_ms``: profiled windows are slower, shares
  move less.
* ``exposed_comm_ms``: communication nothing hides, per steady step; from
  the device breakdown when the run has GPU traces, else (CPU runs) from
  the collective records: ``grad_sync_ms`` plus the *tail*, the time from the
  issue of the step's last collective (the moment backward's last gradient
  is ready) to the end of the last collective, on the last arriver, median
  over steps (:func:`analyzer.metrics.collective_model.collective_tail_ms`).
* ``comm``: per-step collective counts and sizes, and a per-collective
  service time (queue-corrected duration,
  :func:`analyzer.metrics.collective_model.service_times_ms`).
* ``tokens_per_step``: run.json's (reftrain); for traces, estimated from the
  input shapes (:func:`trace_tokens`: ``aten::embedding``'s token ids, else
  the first ``aten::linear``'s ``[batch, seq]``), its source in
  ``tokens_source``; None when neither is in the trace (predictions are then
  per step).
* ``recompute``: activation recompute (forward ops rerun in backward) as a
  share of the trace windows' step time, and the matmul outputs' bytes that
  saving instead of recomputing would hold (:func:`recompute_facts`).
* ``kernels`` (device traces): GEMM time, kernel launches and short-kernel
  share per step from the per-rank top-kernel table (its
  :data:`analyzer.rankmap.TOP_KERNELS_PER_RANK` names, so counts are lower bounds).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analyzer.ingest.formats import RunManifest
from analyzer.metrics.collective_model import (
    collective_tail_ms,
    collective_times,
    fit_alpha_beta,
    service_times_ms,
    sync_delay_ms,
)
from analyzer.metrics.mfu import steady_state
from analyzer.metrics.taxonomy import FUSABLE_CLASSES, classify_name, is_compiled, kernel_precision
from analyzer.verbs.suggest.memo import memo_of

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis
    from analyzer.metrics.collectives import CommDiagnosis
    from analyzer.metrics.stragglers import StragglerResult

PHASES = ("data_wait", "forward", "backward", "optimizer", "grad_sync", "comm")

# Collectives whose bytes grow with the per-GPU batch (activations, not gradients or parameters).
BATCH_SCALED_COLLECTIVES = frozenset({"all_to_all"})
# A kernel this short does too little work to hide its ~5 us launch cost.
SHORT_KERNEL_US = 10.0

# GPU memory by device name when the name does not carry it ("80GB"): datasheet capacities.
_GPU_MEMORY_GB = (
    (re.compile(r"h200", re.I), 141),
    (re.compile(r"gb200|b200", re.I), 180),
    (re.compile(r"h100", re.I), 80),
    (re.compile(r"mi300x", re.I), 192),
    (re.compile(r"mi325x", re.I), 256),
    (re.compile(r"mi250x", re.I), 128),
    (re.compile(r"l40s|a40|\bl40\b", re.I), 48),
    (re.compile(r"a10g?\b|\bl4\b", re.I), 24),
    (re.compile(r"\bt4\b", re.I), 16),
)
_GB_IN_NAME_RE = re.compile(r"(\d+)\s*GB", re.I)


@dataclass(frozen=True)
class CommFacts:
    """Collectives per steady step (median over steps), from the matched collective table."""

    n_per_step: float
    bytes_per_step: float
    mean_bytes: float
    service_ms_per_step: float  # sum of queue-corrected service times
    alpha_ms: float | None  # fitted fixed cost per collective
    per_byte_ms: float | None  # fitted cost per byte
    kinds: tuple[str, ...]
    gather_service_share: float | None = None  # share of the service time spent in all_gather
    gathers_per_step: float = 0.0  # all_gather collectives per step (FSDP's parameter gathers)
    # The step's last all_reduce (DDP's last bucket, issued when backward's last gradient is ready): median over
    # steps of its bytes and duration (ms); traces only (trace_comm_facts), None elsewhere.
    last_bytes: float | None = None
    last_ms: float | None = None


@dataclass(frozen=True)
class KernelFacts:
    """Device kernels per step of one rank (mean over ranks), from the top-kernel table."""

    n_per_step: float
    gemm_ms_per_step: float
    kernel_ms_per_step: float
    short_share: float  # share of launches whose mean duration is under SHORT_KERNEL_US
    mean_us: float
    tf32_gemm_ms_per_step: float = 0.0  # GEMMs whose names say TF32 tensor cores
    # Elementwise, reduction and normalization kernels not generated by Inductor: what torch.compile can fuse.
    fusable_ms_per_step: float = 0.0
    compiled_ms_per_step: float = 0.0  # Inductor's Triton kernels (the model is compiled already)
    comm_ms_per_step: float = 0.0  # communication kernels
    # Communication whose volume grows with the batch: all-to-all (embedding and expert exchanges move
    # activations), by the collective kind the host ranges name (analyzer.metrics.taxonomy).
    batch_comm_ms_per_step: float = 0.0


@dataclass(frozen=True)
class IdleFacts:
    """Why the device idles, over every traced rank with device events (analyzer.metrics.idle; docs/metrics.md).

    ``*_frac``: each cause's share of the device idle time (host wait, kernel
    wait, other; they sum to 1); ``idle_ms``: that idle time, summed over
    ranks in HTA's window. Launches (HTA's launch statistics): ``n_launches``
    and ``short_share`` (kernels shorter than their launch call), medians over
    ranks of the per-rank median launch call and delay (us). Per step inside
    the ProfilerStep windows (summed over ranks and windows): ``syncs_per_step``
    (sync points), ``sync_names`` (name -> calls per step), and as shares of
    step time ``sync_host_share``, ``sync_idle_share`` (device idle after a
    sync), ``pageable_per_step``, ``pageable_share`` and
    ``pageable_exposed_share`` (pageable host-to-device copies, and the part no
    kernel overlaps). None where the windows are missing.
    """

    idle_ms: float
    host_wait_frac: float
    kernel_wait_frac: float
    other_frac: float
    n_launches: int = 0
    short_share: float | None = None
    launch_us_p50: float | None = None
    launch_delay_us_p50: float | None = None
    syncs_per_step: float | None = None
    sync_names: dict[str, float] = field(default_factory=dict)
    sync_host_share: float | None = None
    sync_idle_share: float | None = None
    pageable_per_step: float | None = None
    pageable_share: float | None = None
    pageable_exposed_share: float | None = None


@dataclass(frozen=True)
class RecomputeFacts:
    """Activation recompute in the usable step windows (analyzer.metrics.workload; docs/suggestions.md, "Recompute").

    ``share``: recompute device time (host time on CPU traces) over the
    windows' step time, summed over ranks and windows; ``flop_share`` its
    GEMM/attention/convolution part; ``ms_per_window`` / ``flop_ms_per_window``
    the same per window and rank (mean). ``out_bytes``: the recomputed
    matmul-like ops' outputs per window, the median over windows of the
    largest rank (``shaped_ops`` of ``flop_ops`` per window had a known
    size). ``peak_bytes`` / ``capacity_bytes``: the device memory the rule
    weighs them against (the facts' memory, else the traces' ``[memory]``
    peak), None when unknown.
    """

    share: float
    flop_share: float
    ms_per_window: float
    flop_ms_per_window: float
    ranges_per_window: float
    flop_ops: float
    shaped_ops: float
    out_bytes: float
    reentrant: bool
    ranks: int
    windows: int
    peak_bytes: float | None = None
    capacity_bytes: float | None = None
    memory_source: str | None = None

    @property
    def headroom_bytes(self) -> float | None:
        """Capacity minus peak; None when either is unknown."""
        if self.peak_bytes is None or self.capacity_bytes is None:
            return None
        return self.capacity_bytes - self.peak_bytes


@dataclass(frozen=True)
class MemoryFacts:
    """Peak memory per rank over steady steps and the capacity it is measured against."""

    peak_bytes: float | None
    kind: str | None  # cuda_peak_allocated | cpu_rss
    capacity_bytes: float | None
    capacity_source: str | None

    @property
    def fraction(self) -> float | None:
        if not self.peak_bytes or not self.capacity_bytes:
            return None
        return self.peak_bytes / self.capacity_bytes


@dataclass(frozen=True)
class RunFacts:
    """What the rules read. None where the run does not say (see module doc)."""

    kind: str  # "reftrain" | "traces"
    device: str  # "cuda" | "cpu"
    device_name: str | None
    config: dict | None
    config_path: str | None
    world_size: int
    step_time_ms: float | None
    step_time_source: str
    n_steps: int
    tokens_per_step: float | None
    mfu: float | None
    peak_flops_per_s: float | None
    flops_per_token: float | None
    dtype: str | None  # compute dtype: config train.dtype, else the trace's matmul dtype
    phases: dict[str, float]
    profiled_step_time_ms: float | None
    shares: dict[str, float]
    shares_source: str | None
    exposed_comm_ms: float | None
    exposed_comm_source: str | None
    comm: CommFacts | None
    kernels: KernelFacts | None
    memory: MemoryFacts
    stragglers: "StragglerResult"
    # Why the device idles: causes, launches, host syncs, pageable copies; None without device events.
    idle: IdleFacts | None = None
    telemetry: pd.DataFrame | None = None
    params: dict | None = None
    cpu_cores: int | None = None  # usable cores of one host
    rank_phases: dict[int, dict[str, float]] = field(default_factory=dict)  # per rank: phase -> median ms
    sync_delay_ms: dict[int, float] = field(default_factory=dict)  # per rank: collective_model.sync_delay_ms
    inject: dict | None = None  # the manifest's injected slowness
    hostnames: list[str] | None = None  # per rank
    profile_steps: tuple[int, int] = (0, 0)  # (profiled steps, all steps) of the run
    ranks_per_host: int | None = None
    ranks_traced: int = 0  # ranks with a trace or records in this analysis (one rank cannot tell waiting from transfer)
    # The ranks' communication kernels (analyzer.metrics.collectives): the latency/bandwidth/waiting diagnosis,
    # the alpha-beta fit per kind, and the link peak it is rated against (GB/s per GPU, hardware table).
    comm_diagnosis: "CommDiagnosis | None" = None
    comm_fits: dict = field(default_factory=dict)
    link_gbps: float | None = None
    link_name: str | None = None
    # Coverage of the inputs (each suggestion's confidence rests on it): FLOP coverage of the trace-shape MFU,
    # step windows used / all, and the group size the collectives name (the job's ranks, when traces say).
    flop_coverage: float | None = None
    windows_used: int = 0
    windows_total: int = 0
    comm_group_size: int | None = None
    # Where tokens_per_step comes from: run.json, or the trace's input shapes (trace_tokens); None without it.
    tokens_source: str | None = None
    recompute: RecomputeFacts | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def cores_per_rank(self) -> int | None:
        if not self.cpu_cores:
            return None
        return max(1, self.cpu_cores // max(1, self.ranks_per_host or 1))

    @property
    def is_reftrain(self) -> bool:
        return self.kind == "reftrain" and self.config is not None

    @property
    def tokens_per_s(self) -> float | None:
        if not self.tokens_per_step or not self.step_time_ms:
            return None
        return self.tokens_per_step / (self.step_time_ms / 1e3)

    def cfg(self, dotted: str, default: Any = None) -> Any:
        """A value of the run's resolved reftrain config (``train.micro_batch_size``); default when absent."""
        if self.config is None:
            return default
        section, _, key = dotted.partition(".")
        sec = self.config.get(section)
        if not isinstance(sec, dict) or key not in sec:
            return default
        return sec[key]

    def share_ms(self, part: str) -> float | None:
        """A breakdown part scaled to the steady step: ``shares[part] * step_time_ms``."""
        if part not in self.shares or self.step_time_ms is None:
            return None
        return self.shares[part] * self.step_time_ms


# ---------------------------------------------------------------------------
# Helpers (pure)
# ---------------------------------------------------------------------------


def _steady(ra: "RunAnalysis", man: RunManifest) -> pd.DataFrame | None:
    m = ra.metrics
    if m is None or m.empty or not {"rank", "step", "step_time_ms"} <= set(m.columns):
        return None
    s = steady_state(m, man.warmup_steps or 0, list(man.profiled_steps))
    return s if not s.empty else None


def phase_medians(steady: pd.DataFrame) -> dict[str, float]:
    """Per phase: median over steps of the mean over ranks (ms); phases absent from the records are left out."""
    out: dict[str, float] = {}
    per_step = steady.groupby("step")
    for phase in PHASES + ("step_time",):
        col = f"{phase}_ms"
        if col in steady.columns:
            values = pd.to_numeric(per_step[col].mean(), errors="coerce").dropna()
            if len(values):
                out[phase] = float(values.median())
    return out


def rank_phase_medians(steady: pd.DataFrame) -> dict[int, dict[str, float]]:
    """Per rank and phase (PHASES plus step_time and injected): the median over steady steps (ms)."""
    cols = [f"{p}_ms" for p in PHASES + ("step_time", "injected")]
    cols = [c for c in cols if c in steady.columns]
    med = steady.groupby("rank")[cols].median(numeric_only=True)
    names = [str(c).removesuffix("_ms") for c in med.columns]
    return {
        int(r): {n: float(v) for n, v in zip(names, row) if pd.notna(v)}
        for r, row in zip(med.index.tolist(), med.to_numpy(dtype=float))
    }


def usable_windows(steps: pd.DataFrame) -> pd.DataFrame:
    """The step windows a rule may read: not flagged by :func:`analyzer.metrics.windows.check_windows`."""
    if steps is None or steps.empty or "window_flagged" not in steps.columns:
        return steps
    return steps.loc[~steps["window_flagged"].fillna(False).astype(bool)]


def breakdown_shares(steps: pd.DataFrame) -> tuple[dict[str, float], str | None]:
    """Each breakdown part's share of step time over all ranks and windows (sums to 1)."""
    if steps is None or steps.empty or "source" not in steps.columns:
        return {}, None
    from analyzer.metrics.breakdown import parts_of

    sources = steps["source"].astype(str)
    source = "device" if (sources == "device").any() else "host"
    sel = steps.loc[sources == source]
    total = float(sel["step_time_ms"].sum())
    if total <= 0:
        return {}, None
    out = {}
    for part in parts_of(source):  # type: ignore[arg-type]
        if part in sel.columns:
            out[part.removesuffix("_ms")] = float(pd.to_numeric(sel[part], errors="coerce").fillna(0).sum()) / total
    return out, source


def comm_facts(ra: "RunAnalysis", steady_steps: set[int] | None) -> tuple[CommFacts | None, pd.Series | None]:
    """Collective counts, sizes and service times per steady step, and the per-step tail (ms)."""
    coll = ra.collectives
    if coll is None or coll.empty:
        return None, None
    if steady_steps:
        coll = coll.loc[coll["step"].isin(steady_steps)]
        if coll.empty:
            return None, None
    times = collective_times(coll)
    times["service_ms"] = service_times_ms(times)
    per_step = times.groupby("step").agg(n=("bytes", "size"), bytes=("bytes", "sum"), service_ms=("service_ms", "sum"))
    alpha, per_byte = fit_alpha_beta(times["bytes"].to_numpy(), times["service_ms"].to_numpy())
    total_service = float(times["service_ms"].sum())
    gather = float(times.loc[times["kind"] == "all_gather", "service_ms"].sum())
    facts = CommFacts(
        n_per_step=float(per_step["n"].median()),
        bytes_per_step=float(per_step["bytes"].median()),
        mean_bytes=float(times["bytes"].mean()),
        service_ms_per_step=float(per_step["service_ms"].median()),
        alpha_ms=alpha,
        per_byte_ms=per_byte,
        kinds=tuple(sorted(set(times["kind"]))),
        gather_service_share=gather / total_service if total_service > 0 else None,
        gathers_per_step=float(
            times.loc[times["kind"] == "all_gather"]
            .groupby("step")
            .size()
            .reindex(per_step.index, fill_value=0)
            .median()
        ),
    )
    return facts, collective_tail_ms(times)


def trace_comm(ra: "RunAnalysis", device_name: str | None):
    """The communication kernels of every traced rank: (diagnosis, alpha-beta per kind, link peak, group size).

    Over all ranks' kernels together (analyzer.metrics.collectives); the link
    peak from the hardware table by device name (None off GPUs or for a model
    the table lacks, when only the latency and waiting tests can decide).
    """
    from analyzer.metrics.collectives import alpha_beta, diagnose
    from analyzer.metrics.hardware import link_peak

    tables = [t for t in getattr(ra, "rank_collectives", {}).values() if t is not None and len(t)]
    if not tables:
        return None, {}, None, None
    table = pd.concat(tables, ignore_index=True)
    link = link_peak(device_name) if device_name else None
    groups = table["group_size"].to_numpy(np.int64)
    group = int(groups.max()) if (groups > 0).any() else None
    return diagnose(table, link.gbps if link else None), alpha_beta(table), link, group


def trace_comm_facts(ra: "RunAnalysis", windows: pd.DataFrame) -> CommFacts | None:
    """CommFacts from the ranks' communication kernels inside the usable step windows (traces without records).

    Only when every such kernel carries its message size (otherwise bytes per
    step are unknown and the rules that need them stay silent). Per step: the
    mean over windows and ranks; ``service_ms`` is the kernel duration (one
    stream per process group runs them one after another); alpha and
    per-byte cost from :func:`analyzer.metrics.collective_model.fit_alpha_beta` over the kernels.
    """
    tables = getattr(ra, "rank_collectives", {})
    if not tables or windows is None or windows.empty or not {"rank", "start_ns", "end_ns"} <= set(windows.columns):
        return None
    rows, last = [], []
    for rank, table in tables.items():
        w = windows.loc[windows["rank"] == rank]
        if w.empty:
            continue
        start = table["start_ns"].to_numpy(np.int64)
        inside = np.zeros(len(table), dtype=bool)
        for s0, e0 in zip(w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64)):
            inside |= (start >= s0) & (start < e0)
        rows.append((table.loc[inside], len(w)))
        for s0, e0 in zip(w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64)):
            ar = table.loc[(start >= s0) & (start < e0) & (table["kind"] == "all_reduce").to_numpy()]
            if len(ar):
                last.append(ar.iloc[int(np.argmax(ar["start_ns"].to_numpy()))])
    n_windows = sum(n for _, n in rows)
    if not rows or not n_windows:
        return None
    table = pd.concat([t for t, _ in rows], ignore_index=True)
    size = table["size_bytes"].to_numpy(np.float64)
    if table.empty or not np.isfinite(size).all():
        return None
    service = table["duration_ns"].to_numpy(np.float64) / 1e6
    alpha, per_byte = fit_alpha_beta(size, service)
    total = float(service.sum())
    gather = float(service[(table["kind"] == "all_gather").to_numpy()].sum())
    return CommFacts(
        n_per_step=len(table) / n_windows,
        bytes_per_step=float(size.sum()) / n_windows,
        mean_bytes=float(size.mean()),
        service_ms_per_step=total / n_windows,
        alpha_ms=alpha,
        per_byte_ms=per_byte,
        kinds=tuple(sorted(set(table["kind"].astype(str)))),
        gather_service_share=gather / total if total > 0 else None,
        gathers_per_step=float((table["kind"] == "all_gather").sum()) / n_windows,
        last_bytes=float(np.median([r["size_bytes"] for r in last])) if last else None,
        last_ms=float(np.median([r["duration_ns"] for r in last])) / 1e6 if last else None,
    )


def kernel_facts(ra: "RunAnalysis") -> KernelFacts | None:
    """GEMM time, launches and short-kernel share per step on the device (mean over ranks)."""
    k = ra.kernels
    if k is None or k.empty or "source" not in k.columns:
        return None
    dev = k.loc[k["source"].astype(str) == "device"]
    if dev.empty:
        return None
    rows = []
    for r in ra.ranks:
        mine = dev.loc[dev["rank"] == r.rank]
        if mine.empty or not r.n_steps:
            continue
        names = [str(n) for n in mine["name"]]
        kind = mine["kind"].astype(str)
        # Kernel classes from the one taxonomy (analyzer.metrics.taxonomy); tables saved without them are classified here.
        cls = (
            mine["cls"].to_numpy(object)
            if "cls" in mine.columns
            else np.array([classify_name(n) for n in names], dtype=object)
        )
        count = mine["count"].to_numpy(np.float64)
        total = mine["total_ms"].to_numpy(np.float64)
        compute = (kind == "compute").to_numpy()
        gemm = compute & (cls == "gemm")
        tf32 = gemm & np.array([kernel_precision(n) == "tf32" for n in names], dtype=bool)
        compiled = np.array([is_compiled(n) for n in names], dtype=bool)
        fusable = compute & np.isin(cls.astype(str), list(FUSABLE_CLASSES)) & ~compiled
        short = compute & (mine["mean_us"].to_numpy(np.float64) < SHORT_KERNEL_US)
        comm = (kind == "comm").to_numpy()
        coll = (
            mine["coll_kind"].to_numpy(object)
            if "coll_kind" in mine.columns
            else np.full(len(mine), None, dtype=object)
        )
        batch_comm = comm & np.isin(coll.astype(str), list(BATCH_SCALED_COLLECTIVES))
        n = count[compute].sum()
        rows.append(
            (
                n / r.n_steps,
                total[gemm].sum() / r.n_steps,
                total[compute].sum() / r.n_steps,
                count[short].sum() / n if n else 0.0,
                1e3 * total[compute].sum() / n if n else 0.0,
                total[tf32].sum() / r.n_steps,
                total[fusable].sum() / r.n_steps,
                total[compute & compiled].sum() / r.n_steps,
                total[comm].sum() / r.n_steps,
                total[batch_comm].sum() / r.n_steps,
            )
        )
    if not rows:
        return None
    a = np.asarray(rows).mean(axis=0)
    return KernelFacts(*(float(v) for v in a))


def idle_facts(ra: "RunAnalysis") -> IdleFacts | None:
    """IdleFacts from the run's idle figures (ranks with device events); None without any."""
    at = ra.idle
    if at is None or at.ranks.empty:
        return None
    t = at.ranks.loc[pd.to_numeric(at.ranks["span_ms"]) > 0]
    idle = float(t["idle_ms"].sum()) if len(t) else 0.0
    if t.empty or idle <= 0:
        return None
    launches = int(t["n_launches"].sum())
    steps = float(t["n_steps"].sum())
    step_ms = float(t["step_ms"].sum())

    def share(col: str) -> float | None:
        return float(t[col].sum()) / step_ms if step_ms > 0 else None

    def median(col: str) -> float | None:
        values = pd.to_numeric(t[col], errors="coerce").dropna()
        return float(values.median()) if len(values) else None

    names: dict[str, float] = {}
    if steps > 0 and len(at.syncs):
        mine = at.syncs.loc[at.syncs["rank"].isin(t["rank"])]
        names = {
            str(k): float(v) / steps
            for k, v in mine.groupby("name")["calls"].sum().sort_values(ascending=False).items()
        }
    return IdleFacts(
        idle_ms=idle,
        host_wait_frac=float(t["host_wait_ms"].sum()) / idle,
        kernel_wait_frac=float(t["kernel_wait_ms"].sum()) / idle,
        other_frac=float(t["other_ms"].sum()) / idle,
        n_launches=launches,
        short_share=float(t["n_short"].sum()) / launches if launches else None,
        launch_us_p50=median("cpu_duration_us_p50"),
        launch_delay_us_p50=median("launch_delay_us_p50"),
        syncs_per_step=float((t["syncs_per_step"].fillna(0) * t["n_steps"]).sum()) / steps if steps > 0 else None,
        sync_names=names,
        sync_host_share=share("sync_host_ms"),
        sync_idle_share=share("sync_idle_ms"),
        pageable_per_step=float((t["pageable_htod_per_step"].fillna(0) * t["n_steps"]).sum()) / steps
        if steps > 0
        else None,
        pageable_share=share("pageable_htod_ms"),
        pageable_exposed_share=share("pageable_htod_exposed_ms"),
    )


def usable_workload(ra: "RunAnalysis", windows: pd.DataFrame) -> pd.DataFrame | None:
    """Every rank's workload rows (analyzer.metrics.workload) of the usable step windows, as one table
    with ``rank`` and the window's ``step_time_ms``; None without any.

    One concatenation and one join over all ranks (a per-rank join cost seconds at 1,024 ranks).
    """
    tables = {r: t for r, t in (getattr(ra, "rank_workload", {}) or {}).items() if t is not None and len(t)}
    if not tables or windows is None or windows.empty:
        return None
    table = pd.concat(list(tables.values()), ignore_index=True)
    table["rank"] = np.repeat(np.fromiter(tables, dtype=np.int64, count=len(tables)), [len(t) for t in tables.values()])
    out = table.merge(windows[["rank", "step", "step_time_ms"]], on=["rank", "step"], how="inner")
    return out if len(out) else None


def trace_tokens(table: pd.DataFrame | None) -> tuple[float | None, str | None]:
    """Tokens per step of a trace from its input shapes (analyzer.metrics.workload), and the source.

    ``table``: :func:`usable_workload`. Per rank the median over its usable
    windows with an estimate; summed over the ranks that have one (data
    parallelism: each rank embeds its own batch; a tensor-parallel group
    embeds the same ids on every rank, which this sum would overcount, and a
    single traced rank of a larger job gives that rank's tokens: the source
    says how many ranks it covers).
    """
    if table is None:
        return None, None
    known = table.loc[pd.to_numeric(table["tokens"], errors="coerce").notna()]
    if known.empty:
        return None, None
    per_rank = known.groupby("rank", sort=True)["tokens"].median()
    first = known.sort_values(["rank", "step"], kind="stable").iloc[0]
    where = f"rank {int(first['rank'])}" if len(per_rank) == 1 else f"{len(per_rank)} ranks summed"
    return float(per_rank.sum()), f"trace input shapes: {first['tokens_source']} ({where}, median over step windows)"


def recompute_facts(
    table: pd.DataFrame | None, ra: "RunAnalysis", memory: "MemoryFacts", device_name: str | None
) -> RecomputeFacts | None:
    """RecomputeFacts over :func:`usable_workload`'s rows; None when no window recomputes anything."""
    if table is None:
        return None
    step_ms = float(table["step_time_ms"].sum())
    rec_ms = float(table["recompute_device_ms"].sum())
    if step_ms <= 0 or rec_ms <= 0:
        return None
    n = len(table)
    out_bytes = float(table.groupby("rank")["recompute_out_bytes"].median().max())
    peak, capacity, source = memory.peak_bytes, memory.capacity_bytes, memory.capacity_source
    if peak is None:  # a trace: its [memory] events' peak (analyzer.metrics.memory), on a GPU of known capacity
        mem = getattr(ra, "memory", None)
        trace_peak = getattr(mem, "peak_allocated_bytes", None) if mem is not None and mem.source == "trace" else None
        if trace_peak:
            capacity, source = gpu_memory_bytes(device_name)
            peak = float(trace_peak) if capacity is not None else None
            source = f"trace [memory] events' peak; {source}" if capacity is not None else None
    return RecomputeFacts(
        share=rec_ms / step_ms,
        flop_share=float(table["recompute_flop_ms"].sum()) / step_ms,
        ms_per_window=rec_ms / n,
        flop_ms_per_window=float(table["recompute_flop_ms"].sum()) / n,
        ranges_per_window=float(table["recompute_ranges"].sum()) / n,
        flop_ops=float(table["recompute_flop_ops"].sum()) / n,
        shaped_ops=float(table["recompute_shaped"].sum()) / n,
        out_bytes=out_bytes,
        reentrant=bool(table["reentrant"].any()),
        ranks=int(table["rank"].nunique()),
        windows=n,
        peak_bytes=peak if capacity is not None else None,
        capacity_bytes=capacity if peak is not None else None,
        memory_source=source if (peak is not None and capacity is not None) else None,
    )


def gpu_memory_bytes(device_name: str | None) -> tuple[float | None, str | None]:
    """Device memory from its name ("... 80GB ...") or the datasheet table; (None, None) when unknown."""
    if not device_name:
        return None, None
    m = _GB_IN_NAME_RE.search(device_name)
    if m:
        return float(m.group(1)) * 1e9, f"device name '{device_name}'"
    for pattern, gb in _GPU_MEMORY_GB:
        if pattern.search(device_name):
            return float(gb) * 1e9, f"datasheet capacity of '{device_name}'"
    return None, None


def memory_facts(
    ra: "RunAnalysis", steady: pd.DataFrame | None, device: str, device_name: str | None, man: RunManifest | None = None
) -> MemoryFacts:
    """Peak memory over steady steps (max over ranks) against the device capacity (GPU runs)."""
    peak = kind = None
    if steady is not None and "mem_bytes" in steady.columns:
        values = pd.to_numeric(steady["mem_bytes"], errors="coerce").dropna()
        if len(values):
            peak = float(values.max())
            kinds = steady["mem_kind"].astype(str).unique().tolist() if "mem_kind" in steady.columns else []
            kind = str(kinds[0]) if len(kinds) else None
    hw = (man or ra.run_manifest).hw
    capacity, source = None, None
    if hw.device_memory_bytes is not None and hw.device_memory_bytes > 0:
        capacity, source = float(hw.device_memory_bytes), "run.json hardware.device_memory_bytes"
    elif device == "cuda":
        capacity, source = gpu_memory_bytes(device_name)
    if kind != "cuda_peak_allocated":
        capacity, source = None, None  # CPU RSS has no device limit to hit
    return MemoryFacts(peak, kind, capacity, source)


def _ranks_per_host(hostnames: list[str], world: int) -> int:
    """Most ranks on one host (all on one host when the manifest does not list hosts)."""
    if hostnames:
        return max(hostnames.count(h) for h in set(hostnames))
    return world


def _trace_step_time(steps: pd.DataFrame) -> tuple[float | None, int]:
    if steps is None or steps.empty:
        return None, 0
    per_step = steps.groupby("step")["step_time_ms"].mean()
    return float(per_step.median()), int(len(per_step))


# ---------------------------------------------------------------------------
# The sub-facts RunFacts is made of: each a typed part, built by its own function
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SetupFacts:
    """The run's setup: what ran where (run.json, else the traces), and its host."""

    kind: str
    device: str
    device_name: str | None
    config: dict | None
    config_path: str | None
    world_size: int
    ranks_traced: int
    params: dict | None
    cpu_cores: int | None
    inject: dict | None
    hostnames: list[str] | None
    ranks_per_host: int
    telemetry: pd.DataFrame | None
    profile_steps: tuple[int, int]


@dataclass(frozen=True)
class StepFacts:
    """The steady step: its time, phases and breakdown shares, and the step windows read."""

    step_time_ms: float | None
    step_time_source: str
    n_steps: int
    phases: dict[str, float]
    rank_phases: dict[int, dict[str, float]]
    profiled_step_time_ms: float | None
    shares: dict[str, float]
    shares_source: str | None
    windows_used: int
    windows_total: int


@dataclass(frozen=True)
class CommunicationFacts:
    """Communication: exposed per step, the collectives' model and diagnosis, the link, stragglers."""

    exposed_comm_ms: float | None
    exposed_comm_source: str | None
    comm: CommFacts | None
    comm_diagnosis: "CommDiagnosis | None"
    comm_fits: dict
    link_gbps: float | None
    link_name: str | None
    comm_group_size: int | None
    sync_delay_ms: dict[int, float]
    stragglers: "StragglerResult"


@dataclass(frozen=True)
class ComputeFacts:
    """Compute: MFU and what it rests on, the device kernels, why the device idles."""

    mfu: float | None
    peak_flops_per_s: float | None
    flops_per_token: float | None
    dtype: str | None
    flop_coverage: float | None
    kernels: KernelFacts | None
    idle: IdleFacts | None


@dataclass(frozen=True)
class WorkloadFacts:
    """Data and memory: tokens per step and their source, peak memory, activation recompute."""

    tokens_per_step: float | None
    tokens_source: str | None
    memory: MemoryFacts
    recompute: RecomputeFacts | None


def setup_facts(ra: "RunAnalysis") -> SetupFacts:
    """Device, config, world size and host of the run; run.json's when there is one, else the traces'."""
    man, hw = ra.run_manifest, ra.run_manifest.hw
    device_names = [r.device_name for r in ra.ranks if r.device_name]
    if ra.manifest:
        device = "cuda" if hw.device_type == "cuda" else "cpu"
        device_name = (hw.device_names[0] if hw.device_names else None) if device == "cuda" else (hw.cpu_model or None)
    else:
        device = "cuda" if any(r.source == "device" for r in ra.ranks) else "cpu"
        device_name = device_names[0] if device_names else None
    if device == "cuda" and device_names:
        device_name = device_names[0]
    world = int(man.world_size or len(ra.ranks) or 1)
    run_path = ra.path if isinstance(ra.path, Path) else None
    return SetupFacts(
        kind=ra.kind,
        device=device,
        device_name=device_name,
        config=man.config,
        config_path=str(run_path / "config.yaml") if (man.config is not None and run_path is not None) else None,
        world_size=world,
        ranks_traced=len(ra.ranks),
        params=man.params.to_json() if man.params is not None else None,
        cpu_cores=hw.cpu_cores_usable or hw.cpu_cores,
        inject=man.inject.to_json() if man.inject is not None else None,
        hostnames=list(hw.hostnames) or None,
        ranks_per_host=_ranks_per_host(hw.hostnames, world),
        telemetry=getattr(ra, "telemetry", None),
        profile_steps=(
            len(man.profiled_steps),
            int(ra.metrics["step"].nunique()) if ra.metrics is not None and not ra.metrics.empty else 0,
        ),
    )


def step_facts(ra: "RunAnalysis", steady: pd.DataFrame | None, windows: pd.DataFrame) -> StepFacts:
    """The steady step (module doc: ``step_time_ms``, ``phases``, ``shares``) over the steady records and
    the usable step windows."""
    phases = phase_medians(steady) if steady is not None else {}
    step_time_ms: float | None
    if ra.kind == "reftrain" and "step_time" in phases:
        step_time_ms, source = phases.pop("step_time"), "metrics JSONL, steady-state steps"
        n_steps = int(steady["step"].nunique()) if steady is not None else 0
    else:
        phases.pop("step_time", None)
        step_time_ms, n_steps = _trace_step_time(windows)
        source = "ProfilerStep windows"
    profiled_ms = None
    if ra.metrics is not None and not ra.metrics.empty and "profiled" in ra.metrics.columns:
        prof = ra.metrics.loc[ra.metrics["profiled"].fillna(False).astype(bool)]
        if not prof.empty:
            profiled_ms = float(prof.groupby("step")["step_time_ms"].mean().median())
    shares, shares_source = breakdown_shares(windows)
    return StepFacts(
        step_time_ms=step_time_ms,
        step_time_source=source,
        n_steps=n_steps,
        phases=phases,
        rank_phases=rank_phase_medians(steady) if steady is not None else {},
        profiled_step_time_ms=profiled_ms,
        shares=shares,
        shares_source=shares_source,
        windows_used=int(len(windows)) if windows is not None else 0,
        windows_total=int(len(ra.steps)) if ra.steps is not None else 0,
    )


def exposed_comm(step: StepFacts, tail: pd.Series | None) -> tuple[float | None, str | None]:
    """Exposed communication per steady step (ms) and its source (module doc, ``exposed_comm_ms``)."""
    if step.shares_source == "device" and step.step_time_ms:
        return step.shares.get("exposed_comm", 0.0) * step.step_time_ms, "device breakdown of the trace windows"
    if step.phases.get("grad_sync"):
        # reftrain's explicit sync after backward (overlap_grad_sync=false) issues every collective inside
        # its grad_sync phase, so their tail lies within it: adding the two would count the all-reduce twice.
        return step.phases["grad_sync"], "metrics JSONL grad_sync_ms (the collectives run inside it)"
    if tail is not None and len(tail):
        return float(tail.median()), "collective records: tail after the last collective's issue"
    if step.shares_source == "host" and step.step_time_ms:
        return step.shares.get("exposed_comm", 0.0) * step.step_time_ms, "host breakdown of the trace windows"
    return None, None


def communication_facts(
    ra: "RunAnalysis", step: StepFacts, steady: pd.DataFrame | None, windows: pd.DataFrame, gpu_name: str | None
) -> CommunicationFacts:
    """Exposed communication, the collectives per steady step, the kernels' diagnosis and the sync delays."""
    steady_steps = set(steady["step"].unique()) if steady is not None else None
    comm, tail = comm_facts(ra, steady_steps)
    coll = ra.collectives
    if coll is not None and steady_steps:
        coll = coll.loc[coll["step"].isin(steady_steps)]
    exposed, exposed_source = exposed_comm(step, tail)
    diag, fits, link, group = trace_comm(ra, gpu_name)
    if comm is None and ra.kind == "traces":
        comm = trace_comm_facts(ra, windows)
    return CommunicationFacts(
        exposed_comm_ms=exposed,
        exposed_comm_source=exposed_source,
        comm=comm,
        comm_diagnosis=diag,
        comm_fits=fits,
        link_gbps=link.gbps if link is not None else None,
        link_name=link.link if link is not None else None,
        comm_group_size=group,
        sync_delay_ms=sync_delay_ms(coll) if coll is not None else {},
        stragglers=ra.stragglers,
    )


def compute_facts(ra: "RunAnalysis") -> ComputeFacts:
    """MFU (withheld when it is a lower bound), the FLOPs it rests on, the kernels, why the device idles."""
    man = ra.run_manifest
    train = man.config.get("train") if man.config else None
    dtype = train.get("dtype") if isinstance(train, dict) else None
    per_token = man.model_flops.per_token
    median = ra.mfu.median
    return ComputeFacts(
        # A lower-bound MFU (FLOP coverage under COVERAGE_MIN) is reported but never fed to a rule.
        mfu=median if median is not None and math.isfinite(median) and not ra.mfu.lower_bound else None,
        peak_flops_per_s=ra.mfu.peak_flops_per_s,
        flops_per_token=float(per_token) if per_token else None,
        dtype=dtype if dtype is not None else (ra.mfu.dtype or None),
        flop_coverage=ra.mfu.flop_coverage,
        kernels=kernel_facts(ra),
        idle=idle_facts(ra),
    )


def workload_facts(
    ra: "RunAnalysis", setup: SetupFacts, steady: pd.DataFrame | None, windows: pd.DataFrame
) -> WorkloadFacts:
    """Tokens per step (run.json's, else the trace's input shapes), peak memory and activation recompute."""
    man = ra.run_manifest
    tokens: float | None = float(man.tokens_per_step) if man.tokens_per_step else None
    source = "run.json tokens_per_step" if tokens else None
    workload = usable_workload(ra, windows)
    if tokens is None and ra.kind == "traces":
        tokens, source = trace_tokens(workload)
    memory = memory_facts(ra, steady, setup.device, setup.device_name, man)
    gpu_name = setup.device_name if setup.device == "cuda" else None
    return WorkloadFacts(
        tokens_per_step=tokens,
        tokens_source=source,
        memory=memory,
        recompute=recompute_facts(workload, ra, memory, gpu_name),
    )


# ---------------------------------------------------------------------------
# run_facts
# ---------------------------------------------------------------------------


def run_facts(ra: "RunAnalysis") -> RunFacts:
    """Condense a RunAnalysis into the numbers the rules read (see module doc).

    Computed once per analysis (:mod:`analyzer.verbs.suggest.memo`): the
    report's text, its JSON and the dashboard all ask for them.
    """
    memo = memo_of(ra)
    if memo.facts is None:
        memo.facts = _run_facts(ra)
    return memo.facts


def _run_facts(ra: "RunAnalysis") -> RunFacts:
    setup = setup_facts(ra)
    steady = _steady(ra, ra.run_manifest)
    windows = usable_windows(ra.steps)
    step = step_facts(ra, steady, windows)
    gpu_name = setup.device_name if setup.device == "cuda" else None
    notes: list[str] = []
    if len(windows) < len(ra.steps):
        notes.append(f"{len(ra.steps) - len(windows)} step window(s) clipped to the trace are not used by any rule")
    if ra.mfu.lower_bound:
        notes.append(
            f"MFU from trace shapes is a lower bound (FLOP coverage {ra.mfu.flop_coverage:.1%}): not used by any rule"
        )
    parts = (
        setup,
        step,
        communication_facts(ra, step, steady, windows, gpu_name),
        compute_facts(ra),
        workload_facts(ra, setup, steady, windows),
    )
    return RunFacts(**{f.name: getattr(p, f.name) for p in parts for f in fields(p)}, notes=notes)
