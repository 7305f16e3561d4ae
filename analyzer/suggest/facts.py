"""The measured numbers the rules read, derived once from a RunAnalysis (pure: no file access).

:func:`run_facts` condenses an :class:`analyzer.api.RunAnalysis` into a
:class:`RunFacts`. Definitions (docs/suggestions.md, "Facts"):

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
  over steps. See :func:`collective_tail_ms`.
* ``comm``: per-step collective counts and sizes, and a per-collective
  service time (queue-corrected duration, :func:`service_times_ms`).
* ``kernels`` (device traces): GEMM time, kernel launches and short-kernel
  share per step from the per-rank top-kernel table (its
  :data:`analyzer.api.TOP_KERNELS_PER_RANK` names, so counts are lower bounds).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analyzer.metrics.mfu import steady_state

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis
    from analyzer.stragglers import StragglerResult

PHASES = ("data_wait", "forward", "backward", "optimizer", "grad_sync", "comm")

# Matrix-multiply kernels on NVIDIA (cuBLAS/cuBLASLt/CUTLASS names: sm80_xmma_gemm, ampere_sgemm,
# sm90_xmma_gemm, cutlass::Kernel, nvjet) and AMD (rocBLAS/hipBLASLt Tensile "Cijk_") GPUs,
# and flash attention. Case-insensitive.
GEMM_KERNEL_RE = re.compile(r"gemm|cutlass|cublas|nvjet|xmma|Cijk_|wgmma|flash|fmha|mma_", re.I)
# GEMMs on TF32 tensor cores: cuBLAS/CUTLASS name them tf32, or "s1688"/"s16816" tensor-op SGEMMs (sm80).
TF32_GEMM_RE = re.compile(r"tf32|tensorop_s1688|tensorop_s16816|s1688gemm|s16816gemm", re.I)
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


@dataclass(frozen=True)
class KernelFacts:
    """Device kernels per step of one rank (mean over ranks), from the top-kernel table."""

    n_per_step: float
    gemm_ms_per_step: float
    kernel_ms_per_step: float
    short_share: float  # share of launches whose mean duration is under SHORT_KERNEL_US
    mean_us: float
    tf32_gemm_ms_per_step: float = 0.0  # GEMMs whose names say TF32 tensor cores


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
    telemetry: pd.DataFrame | None = None
    params: dict | None = None
    cpu_cores: int | None = None  # usable cores of one host
    rank_phases: dict[int, dict[str, float]] = field(default_factory=dict)  # per rank: phase -> median ms
    sync_delay_ms: dict[int, float] = field(default_factory=dict)  # per rank: see sync_delay_ms()
    inject: dict | None = None  # the manifest's injected slowness
    hostnames: list[str] | None = None  # per rank
    profile_steps: tuple[int, int] = (0, 0)  # (profiled steps, all steps) of the run
    ranks_per_host: int | None = None
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


def _steady(ra: "RunAnalysis") -> pd.DataFrame | None:
    m = ra.metrics
    if m is None or m.empty or not {"rank", "step", "step_time_ms"} <= set(m.columns):
        return None
    man = ra.manifest or {}
    s = steady_state(m, int(man.get("warmup_steps") or 0), list(man.get("profiled_steps") or []))
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
    return {int(r): {c.removesuffix("_ms"): float(v) for c, v in row.items() if pd.notna(v)} for r, row in med.iterrows()}


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


def _collective_times(coll: pd.DataFrame) -> pd.DataFrame:
    """Per collective: ``step``, ``bytes``, start and end on the last arriver (ns, aligned clock), sorted by start."""
    first = coll["first_arrival_ns"].to_numpy(np.int64)
    # Relative to the first arrival of all, so float64 keeps nanoseconds (epoch ns do not fit its mantissa).
    start = (first - first.min()).astype(np.float64) + coll["skew_ms"].to_numpy(np.float64) * 1e6
    end = start + coll["duration_ms"].to_numpy(np.float64) * 1e6
    out = pd.DataFrame({"step": coll["step"].to_numpy(np.int64), "bytes": coll["bytes"].to_numpy(np.float64),
                        "kind": coll["kind"].astype(str).to_numpy(), "start_ns": start, "end_ns": end})
    return out.sort_values("start_ns", kind="stable").reset_index(drop=True)


def service_times_ms(times: pd.DataFrame) -> np.ndarray:
    """Queue-corrected duration of each collective: ``end_i - max(start_i, end_{i-1})`` in ms.

    A process group runs its collectives one after another (NCCL on one
    stream, gloo in issue order), so a collective issued while the previous
    one still runs waits in the queue; its own service begins when the
    previous one ends. ``times`` sorted by start (see :func:`_collective_times`).
    """
    start = times["start_ns"].to_numpy(np.float64)
    end = times["end_ns"].to_numpy(np.float64)
    prev_end = np.concatenate([[-np.inf], np.maximum.accumulate(end)[:-1]])
    return np.clip(end - np.maximum(start, prev_end), 0.0, None) / 1e6


def collective_tail_ms(times: pd.DataFrame) -> pd.Series:
    """Per step: end of the step's last collective minus the issue time of the last-issued one (ms).

    Data parallelism issues its last gradient collective when backward has
    computed the last gradient; everything after that until the last
    collective ends is communication no compute hides (DDP waits for it at
    the end of backward, FSDP2 before the optimizer).
    """
    g = times.groupby("step")
    return (g["end_ns"].max() - g["start_ns"].max()).clip(lower=0) / 1e6


def fit_alpha_beta(bytes_: np.ndarray, service_ms: np.ndarray) -> tuple[float | None, float | None]:
    """Least-squares ``service = alpha + bytes * per_byte`` (the alpha-beta model of Hockney 1994).

    Needs two or more distinct sizes; both coefficients are clipped at 0.
    Returns ``(alpha_ms, per_byte_ms)`` or ``(None, None)``.
    """
    ok = np.isfinite(bytes_) & np.isfinite(service_ms)
    x, y = bytes_[ok], service_ms[ok]
    if len(np.unique(x)) < 2:
        return None, None
    slope, intercept = np.polyfit(x, y, 1)
    if slope < 0:  # sizes explain nothing: all fixed cost
        return float(np.median(y)), 0.0
    if intercept < 0:  # no measurable fixed cost: through the origin
        return 0.0, float(np.sum(x * y) / np.sum(x * x))
    return float(intercept), float(slope)


def sync_delay_ms(coll: pd.DataFrame) -> dict[int, float]:
    """Per rank: how long it holds the others up per step, median over steps (ms).

    Per step, the largest arrival skew among the collectives the rank
    arrived at last (0 when it arrived last at none): a rank that is late by
    ``x`` at a gradient collective delays every other rank's step by ``x``
    (later collectives of the step then start together).
    """
    if coll is None or coll.empty or "last_rank" not in coll.columns:
        return {}
    steps = sorted(coll["step"].unique())
    ranks = sorted(int(r) for r in coll["last_rank"].unique() if r >= 0)
    out = {}
    for r in ranks:
        per_step = coll.loc[coll["last_rank"] == r].groupby("step")["skew_ms"].max().reindex(steps, fill_value=0.0)
        out[r] = float(per_step.median())
    return out


def comm_facts(ra: "RunAnalysis", steady_steps: set[int] | None) -> tuple[CommFacts | None, pd.Series | None]:
    """Collective counts, sizes and service times per steady step, and the per-step tail (ms)."""
    coll = ra.collectives
    if coll is None or coll.empty:
        return None, None
    if steady_steps:
        coll = coll.loc[coll["step"].isin(steady_steps)]
        if coll.empty:
            return None, None
    times = _collective_times(coll)
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
    )
    return facts, collective_tail_ms(times)


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
        names = mine["name"].astype(str)
        kind = mine["kind"].astype(str)
        count = mine["count"].to_numpy(np.float64)
        total = mine["total_ms"].to_numpy(np.float64)
        compute = (kind == "compute").to_numpy()
        gemm = compute & names.str.contains(GEMM_KERNEL_RE).to_numpy()
        tf32 = gemm & names.str.contains(TF32_GEMM_RE).to_numpy()
        short = compute & (mine["mean_us"].to_numpy(np.float64) < SHORT_KERNEL_US)
        n = count[compute].sum()
        rows.append(
            (n / r.n_steps, total[gemm].sum() / r.n_steps, total[compute].sum() / r.n_steps,
             count[short].sum() / n if n else 0.0, 1e3 * total[compute].sum() / n if n else 0.0,
             total[tf32].sum() / r.n_steps)
        )
    if not rows:
        return None
    a = np.asarray(rows).mean(axis=0)
    return KernelFacts(float(a[0]), float(a[1]), float(a[2]), float(a[3]), float(a[4]), float(a[5]))


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


def memory_facts(ra: "RunAnalysis", steady: pd.DataFrame | None, device: str, device_name: str | None) -> MemoryFacts:
    """Peak memory over steady steps (max over ranks) against the device capacity (GPU runs)."""
    peak = kind = None
    if steady is not None and "mem_bytes" in steady.columns:
        values = pd.to_numeric(steady["mem_bytes"], errors="coerce").dropna()
        if len(values):
            peak = float(values.max())
            kinds = steady["mem_kind"].astype(str).unique() if "mem_kind" in steady.columns else []
            kind = str(kinds[0]) if len(kinds) else None
    hw = (ra.manifest or {}).get("hardware") or {}
    capacity, source = None, None
    if isinstance(hw.get("device_memory_bytes"), (int, float)) and hw["device_memory_bytes"] > 0:
        capacity, source = float(hw["device_memory_bytes"]), "run.json hardware.device_memory_bytes"
    elif device == "cuda":
        capacity, source = gpu_memory_bytes(device_name)
    if kind != "cuda_peak_allocated":
        capacity, source = None, None  # CPU RSS has no device limit to hit
    return MemoryFacts(peak, kind, capacity, source)


def _ranks_per_host(hostnames: object, world: int) -> int:
    """Most ranks on one host (all on one host when the manifest does not list hosts)."""
    if isinstance(hostnames, list) and hostnames:
        return max(hostnames.count(h) for h in set(hostnames))
    return world


def _trace_step_time(steps: pd.DataFrame) -> tuple[float | None, int]:
    if steps is None or steps.empty:
        return None, 0
    per_step = steps.groupby("step")["step_time_ms"].mean()
    return float(per_step.median()), int(len(per_step))


# ---------------------------------------------------------------------------
# run_facts
# ---------------------------------------------------------------------------


def run_facts(ra: "RunAnalysis") -> RunFacts:
    """Condense a RunAnalysis into the numbers the rules read (see module doc).

    Computed once per analysis (kept in ``ra.derived``): the report's text,
    its JSON and the dashboard all ask for them.
    """
    memo = getattr(ra, "derived", None)
    if memo is not None and "facts" in memo:
        return memo["facts"]
    facts = _run_facts(ra)
    if memo is not None:
        memo["facts"] = facts
    return facts


def _run_facts(ra: "RunAnalysis") -> RunFacts:
    man = ra.manifest or {}
    config = man.get("config") if isinstance(man.get("config"), dict) else None
    hw = man.get("hardware") or {}
    device_names = [r.device_name for r in ra.ranks if r.device_name]
    if man:
        device = "cuda" if hw.get("device_type") == "cuda" else "cpu"
        names = hw.get("device_names") or []
        device_name = (names[0] if names else None) if device == "cuda" else (hw.get("cpu_model") or None)
    else:
        device = "cuda" if any(r.source == "device" for r in ra.ranks) else "cpu"
        device_name = device_names[0] if device_names else None
    if device == "cuda" and device_names:
        device_name = device_names[0]

    steady = _steady(ra)
    phases = phase_medians(steady) if steady is not None else {}
    notes: list[str] = []
    if ra.kind == "reftrain" and "step_time" in phases:
        step_time_ms, source = phases.pop("step_time"), "metrics JSONL, steady-state steps"
        n_steps = int(steady["step"].nunique()) if steady is not None else 0
    else:
        phases.pop("step_time", None)
        step_time_ms, n_steps = _trace_step_time(ra.steps)
        source = "ProfilerStep windows"
    profiled_ms = None
    if ra.metrics is not None and not ra.metrics.empty and "profiled" in ra.metrics.columns:
        prof = ra.metrics.loc[ra.metrics["profiled"].fillna(False).astype(bool)]
        if not prof.empty:
            profiled_ms = float(prof.groupby("step")["step_time_ms"].mean().median())

    shares, shares_source = breakdown_shares(ra.steps)
    steady_steps = set(steady["step"].unique()) if steady is not None else None
    comm, tail = comm_facts(ra, steady_steps)
    coll = ra.collectives
    if coll is not None and steady_steps:
        coll = coll.loc[coll["step"].isin(steady_steps)]
    exposed, exposed_source = None, None
    if shares_source == "device" and step_time_ms:
        exposed, exposed_source = shares.get("exposed_comm", 0.0) * step_time_ms, "device breakdown of the trace windows"
    elif tail is not None and len(tail):
        exposed = float(tail.median()) + phases.get("grad_sync", 0.0)
        exposed_source = "collective records: tail after the last collective's issue" + (
            " plus grad_sync_ms" if phases.get("grad_sync") else "")
    elif shares_source == "host" and step_time_ms:
        exposed, exposed_source = shares.get("exposed_comm", 0.0) * step_time_ms, "host breakdown of the trace windows"

    if ra.mfu.lower_bound:
        notes.append(f"MFU from trace shapes is a lower bound (FLOP coverage {ra.mfu.flop_coverage:.1%}): not used by any rule")
    tokens_per_step = man.get("tokens_per_step")
    flops = man.get("flops") or {}
    dtype = (config or {}).get("train", {}).get("dtype") if config else None
    if dtype is None and ra.mfu.dtype:
        dtype = ra.mfu.dtype
    world = int(man.get("world_size") or len(ra.ranks) or 1)
    cores = hw.get("cpu_cores_usable") or hw.get("cpu_cores")
    run_path = ra.path if isinstance(ra.path, Path) else None
    config_path = str(run_path / "config.yaml") if (config is not None and run_path is not None) else None
    return RunFacts(
        kind=ra.kind,
        device=device,
        device_name=device_name,
        config=config,
        config_path=config_path,
        world_size=world,
        step_time_ms=step_time_ms,
        step_time_source=source,
        n_steps=n_steps,
        tokens_per_step=float(tokens_per_step) if tokens_per_step else None,
        # A lower-bound MFU (FLOP coverage under COVERAGE_MIN) is reported but never fed to a rule.
        mfu=ra.mfu.median if ra.mfu.median is not None and math.isfinite(ra.mfu.median) and not ra.mfu.lower_bound else None,
        peak_flops_per_s=ra.mfu.peak_flops_per_s,
        flops_per_token=float(flops["per_token"]) if flops.get("per_token") else None,
        dtype=dtype,
        phases=phases,
        profiled_step_time_ms=profiled_ms,
        shares=shares,
        shares_source=shares_source,
        exposed_comm_ms=exposed,
        exposed_comm_source=exposed_source,
        comm=comm,
        kernels=kernel_facts(ra),
        memory=memory_facts(ra, steady, device, device_name),
        stragglers=ra.stragglers,
        telemetry=getattr(ra, "telemetry", None),
        params=man.get("params") if isinstance(man.get("params"), dict) else None,
        cpu_cores=int(cores) if isinstance(cores, int) else None,
        rank_phases=rank_phase_medians(steady) if steady is not None else {},
        sync_delay_ms=sync_delay_ms(coll),
        inject=man.get("inject") if isinstance(man.get("inject"), dict) else None,
        hostnames=list(hw["hostnames"]) if isinstance(hw.get("hostnames"), list) else None,
        profile_steps=(len(man.get("profiled_steps") or []), int(ra.metrics["step"].nunique())
                       if ra.metrics is not None and not ra.metrics.empty else 0),
        ranks_per_host=_ranks_per_host(hw.get("hostnames"), world),
        notes=notes,
    )
