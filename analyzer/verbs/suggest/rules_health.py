"""Rules on the run as a whole: stragglers, profiler overhead, and the MFU gap diagnosis.

docs/suggestions.md is the reference; thresholds are the module constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from analyzer.verbs.suggest import whatif
from analyzer.verbs.suggest.engine import Change, Suggestion, rule
from analyzer.verbs.suggest.facts import RunFacts

if TYPE_CHECKING:
    from analyzer.metrics.stragglers import StragglerResult

# A flagged straggler is worth a suggestion when it holds the step up by this share.
MIN_STRAGGLER_SHARE = 0.02
# ... and when its per-step excess on a flagged signal is at least this many of its own step-to-step standard
# deviations (robust: median over 1.4826 MAD). Machine contention delays a rank by whatever the scheduler takes
# from it, a non-negative amount about as variable as it is large (measured 1.2 and 1.5 on this project's
# shared 2-core machine; an exponential delay gives 0.97, a uniform one 1.35); a fixed cause (an injected
# delay, a slower device, a slower data path) shifts every step alike (measured 17.1 and 30.3 with 400 ms
# injected under load, 3.3 in the checked-in 300 ms example run). docs/suggestions.md, rule `straggler`.
MIN_EFFECT_SIZE = 2.0
# Profiled steps slower than steady ones by at least this factor ...
PROFILER_MIN_SLOWDOWN = 1.20
# ... and making up at least this share of the run's steps.
PROFILER_MIN_STEP_SHARE = 0.20
# A run under this fraction of the MFU its model size reaches is "far under".
MFU_GAP_FRACTION = 0.5
# The MFU well-tuned runs reach on GPUs with bf16: PaLM 540B 46.2 % (Chowdhery
# et al. 2022, table 3), Megatron-LM 175B-1T 44-52 % (Narayanan et al. 2021),
# torchtitan Llama 3 8B on H100 ~38-43 %; taken as 40 %.
GPU_REFERENCE_MFU = 0.40
# Phase -> the rules that act on it (for the diagnosis' "what to do").
_CONTRIBUTOR_RULES = {
    "data_wait": "data_wait",
    "optimizer": "fused_adamw",
    "grad_sync": "overlap_grad_sync",
    "exposed_comm": "ddp_bucket_size, grad_accumulation, fsdp_reshard",
    "fixed_overhead": "micro_batch",
    "idle": "launch_bound, cuda_graphs, host_sync, dependency_idle",
    "exposed_memcpy": "exposed_memcpy, pin_memory, pageable_copies",
    "other": "-",
}


def _slowest_phase(f: RunFacts, rank: int) -> tuple[str, float] | None:
    """The phase in which ``rank`` exceeds the other ranks' median the most: (phase, excess ms)."""
    mine = f.rank_phases.get(rank)
    others = [p for r, p in f.rank_phases.items() if r != rank]
    if not mine or not others:
        return None
    best = None
    for phase in ("data_wait", "forward", "backward", "optimizer", "grad_sync"):
        if phase not in mine:
            continue
        vals = sorted(o.get(phase, 0.0) for o in others)
        ref = vals[len(vals) // 2] if len(vals) % 2 else 0.5 * (vals[len(vals) // 2 - 1] + vals[len(vals) // 2])
        excess = mine[phase] - ref
        if best is None or excess > best[1]:
            best = (phase, excess)
    return best


def _throttle_note(f: RunFacts, rank: int) -> str | None:
    """NVML evidence for one rank: throttle reasons seen and its median SM clock vs the others'."""
    t = f.telemetry
    if t is None or t.empty or "rank" not in t.columns:
        return None
    mine = t.loc[t["rank"] == rank]
    if mine.empty:
        return None
    parts = []
    if "throttle_reasons" in mine.columns:
        reasons = sorted(
            {str(x) for lst in mine["throttle_reasons"].dropna() for x in (lst if isinstance(lst, list) else [lst])}
            - {"gpu_idle", "none", "applications_clocks_setting"}
        )
        if reasons:
            parts.append(f"throttle reasons {', '.join(reasons)}")
    if "sm_clock_mhz" in t.columns:
        own = float(mine["sm_clock_mhz"].median())
        other = float(t.loc[t["rank"] != rank, "sm_clock_mhz"].median()) if (t["rank"] != rank).any() else None
        if other:
            parts.append(f"SM clock {own:.0f} MHz vs {other:.0f} MHz on the other ranks")
    if "temp_c" in mine.columns:
        parts.append(f"temperature {float(mine['temp_c'].median()):.0f} C")
    return "; ".join(parts) if parts else None


@dataclass(frozen=True)
class ExcessEffect:
    """One rank's per-step excess on one straggler signal, against its own step-to-step spread (ms)."""

    signal: str  # "lateness" or "step_time" (analyzer.metrics.stragglers)
    n_steps: int
    excess_ms: float  # median over steps of d = x[rank] - median of the other ranks' x (the verdict's excess)
    spread_ms: float  # 1.4826 x MAD over steps of d, floored at the verdict's noise floor
    effect: float  # excess_ms / spread_ms


_SIGNAL_COLUMNS = {"lateness": "lateness_ms", "step_time": "step_time_ms"}


def excess_effect(result: "StragglerResult", rank: int, signal: str) -> ExcessEffect | None:
    """The robust effect size of ``rank``'s excess on ``signal`` over the verdict's steps (``result.per_step``).

    ``d_s = x[rank, s] - median over the other ranks of x[., s]`` (the
    verdict's leave-one-out excess); effect ``= median_s d / (MAD_s d /
    Phi^-1(3/4))``, the median excess in robust standard deviations of the
    rank's own step-to-step excess, not of the median's standard error: it
    does not grow with the number of steps, so a long run of a rank that the
    scheduler slows at random does not reach it. The spread is floored at
    ``0.1 x min_excess_ms`` as the verdict's is (a constant delay has MAD 0).
    None when the signal or the rank is absent.
    """
    col = _SIGNAL_COLUMNS.get(signal)
    ps = result.per_step
    if col is None or ps is None or ps.empty or col not in ps.columns:
        return None
    table = ps.pivot_table(index="step", columns="rank", values=col, aggfunc="mean")
    if rank not in table.columns or table.shape[1] < 2:
        return None
    d = (table[rank] - table.drop(columns=[rank]).median(axis=1)).dropna().to_numpy(np.float64)
    if d.size == 0:
        return None
    excess = float(np.median(d))
    # scipy.stats.median_abs_deviation(scale="normal"), as analyzer.metrics.stragglers writes it out.
    spread = max(float(np.median(np.abs(d - excess))) / 0.6744897501960817, 0.1 * result.config.min_excess_ms)
    return ExcessEffect(signal, int(d.size), excess, spread, excess / spread)


def _persistent_effect(result: "StragglerResult", rank: int, signals: list[str]) -> ExcessEffect | None:
    """The largest effect among the rank's flagged signals."""
    effects = [e for e in (excess_effect(result, rank, sig) for sig in signals) if e is not None]
    return max(effects, key=lambda e: e.effect) if effects else None


_PHASE_ADVICE = {
    "data_wait": "its data wait: a slower data shard or storage path, fewer DataLoader workers, a busier host",
    "forward": "its compute: other processes on its host or CPU cores, thermal or power throttling (NVML), a slower device",
    "backward": "its compute: other processes on its host or CPU cores, thermal or power throttling (NVML), a slower device",
    "optimizer": "its optimizer step: host contention while stepping",
    "grad_sync": "its gradient sync: its network link or NIC",
}


@rule(part="exposed_comm")
def rule_straggler(f: RunFacts) -> Suggestion | None:
    """A persistent straggler (analyzer.stragglers' verdict): which rank, its excess, what to check.

    What-if: in synchronous data parallelism every rank waits for the
    slowest, so the step shrinks by the straggler's excess when it runs at
    the median: its per-step sync delay (facts.sync_delay_ms: the largest
    arrival skew among the collectives it arrived at last), or without
    collectives its step-time excess. Silent when that is under
    MIN_STRAGGLER_SHARE of the step. A straggler reftrain injected on purpose
    (``inject.slow_rank``) gets the exact change that removes the injection,
    and the step loses ``min(excess, injected)`` with ``injected`` the
    rank's measured ``injected_ms`` per step: an excess beyond the injected
    delay is the rank's own slower compute, which stays.

    The verdict's tests (late in most steps, sign test, robust z of the
    median) grow more certain with the number of steps whatever the size of
    the step-to-step spread; a rank that other processes on its host slow
    at random passes them on a long enough run. So a flagged rank is also
    required to be slow by MIN_EFFECT_SIZE of its own step-to-step spread on
    a flagged signal (:func:`excess_effect`), which contention does not reach.
    """
    s = f.stragglers
    if s is None or not s.ranks or not f.step_time_ms:
        return None
    effects: dict[int, ExcessEffect] = {}
    for r in s.per_rank:
        e = _persistent_effect(s, r.rank, r.signals) if r.flagged else None
        if e is not None and e.effect >= MIN_EFFECT_SIZE:
            effects[r.rank] = e
    flagged = [r for r in s.per_rank if r.rank in effects]
    if not flagged:
        return None  # flagged, but its excess varies from step to step about as much as it is large: load noise

    def excess_of(r) -> float:
        # Time the rank holds the others up per step: its arrival delay at the step's collectives when
        # there are any (a sum of lateness over many collectives overcounts: they overlap), else its
        # step-time excess.
        if r.rank in f.sync_delay_ms:
            return f.sync_delay_ms[r.rank]
        return max(r.step_excess_ms or 0.0, 0.0)

    worst = max(flagged, key=excess_of)
    excess = excess_of(worst)
    effect = effects[worst.rank]
    if excess < MIN_STRAGGLER_SHARE * f.step_time_ms:
        return None  # flagged, but costs the step too little to act on
    slow = _slowest_phase(f, worst.rank)
    where = f"; slowest phase on that rank: {slow[0]} (+{slow[1]:.1f} ms vs the others)" if slow and slow[1] > 0 else ""
    checks = _PHASE_ADVICE.get(
        slow[0] if slow else "", "its host (other processes), its data shard, thermal throttling (NVML)"
    )
    throttle = _throttle_note(f, worst.rank)
    inject = f.inject or {}
    injected = inject.get("slow_rank") == worst.rank and inject.get("delay_ms")
    overrides = {"inject.slow_rank": None, "inject.delay_ms": None} if (injected and f.is_reftrain) else {}
    advice = f"find out why rank {worst.rank} is slow: check {checks}" + (f" (NVML: {throttle})" if throttle else "")
    if injected:
        advice = f"rank {worst.rank} carries an injected {inject['delay_ms']:g} ms delay per step (inject.slow_rank): remove it"
    host = f.hostnames[worst.rank] if f.hostnames and worst.rank < len(f.hostnames) else None
    injected_ms = (f.rank_phases.get(worst.rank) or {}).get("injected") if injected else None
    if injected_ms:
        saved = min(excess, injected_ms)
        method = (
            f"rank {worst.rank} without its injected {injected_ms:.1f} ms per step: the step loses "
            f"min(excess {excess:.1f}, injected {injected_ms:.1f}) ms"
        )
    else:
        saved = excess
        method = f"rank {worst.rank} at the median: the step loses its {excess:.1f} ms excess"
    return Suggestion(
        title=f"Rank {worst.rank} is a persistent straggler (+{excess:.1f} ms per step)",
        trigger=f"analyzer.stragglers flagged rank(s) {s.ranks} on {', '.join(worst.signals)}; rank {worst.rank}'s "
        f"{effect.signal} excess {effect.excess_ms:.1f} ms = {effect.effect:.1f} x its step-to-step spread "
        f"{effect.spread_ms:.1f} ms >= MIN_EFFECT_SIZE {MIN_EFFECT_SIZE:g}",
        evidence={
            "rank": worst.rank,
            "excess_ms": excess,
            "step_time_ms": f.step_time_ms,
            "sync_delay_ms": f.sync_delay_ms.get(worst.rank),
            "lateness_excess_ms": worst.lateness_excess_ms,
            "step_excess_ms": worst.step_excess_ms,
            "last_arrivals": worst.last_arrivals,
            "n_collectives": worst.n_collectives,
            "others_waited_ms": worst.caused_wait_ms,
            "slowest_phase": slow[0] if slow else None,
            "slowest_phase_excess_ms": slow[1] if slow else None,
            "nvml": throttle,
            "host": host,
            "injected_ms": injected_ms,
            "effect_signal": effect.signal,
            "effect_size": effect.effect,
            "excess_spread_ms": effect.spread_ms,
            "verdict": worst.evidence + where,
        },
        change=Change(overrides, advice),
        predicted=whatif.prediction(f, whatif.remove(f.step_time_ms, saved), method),
        confidence="high" if injected or (worst.lateness_z or 0) > 10 else "medium",
    )


@rule()
def rule_profiler_overhead(f: RunFacts) -> Suggestion | None:
    """Profiled steps PROFILER_MIN_SLOWDOWN slower and over PROFILER_MIN_STEP_SHARE of the run: trace less.

    Scope: the run's wall time (steady-state MFU excludes profiled steps).
    What-if: the mean step over the run with one window of ``profile.active
    = 2`` steps (plus its warm-up step) instead of the measured count.
    """
    if not f.is_reftrain or not f.profiled_step_time_ms or not f.step_time_ms:
        return None
    n_prof, n_all = f.profile_steps
    if n_all == 0 or n_prof / n_all < PROFILER_MIN_STEP_SHARE:
        return None
    slowdown = f.profiled_step_time_ms / f.step_time_ms
    if slowdown < PROFILER_MIN_SLOWDOWN:
        return None
    keep = min(n_prof, 1 + 2)  # one warm-up and two active steps
    if keep >= n_prof:
        return None
    mean_before = ((n_all - n_prof) * f.step_time_ms + n_prof * f.profiled_step_time_ms) / n_all
    mean_after = ((n_all - keep) * f.step_time_ms + keep * f.profiled_step_time_ms) / n_all
    overrides = {"profile.repeat": 1, "profile.active": 2, "profile.warmup": 1}
    if f.cfg("profile.with_stack"):
        overrides["profile.with_stack"] = False
    if f.cfg("profile.memory") or f.cfg("profile.profile_memory"):  # profile_memory: the key's older name
        overrides["profile.memory"] = False
    pred = whatif.prediction(
        f,
        mean_after,
        f"{n_prof} -> {keep} profiled steps of {n_all}, each {slowdown:.2f}x a steady step",
        scope="run wall time",
        step_before_ms=mean_before,
    )
    return Suggestion(
        title=f"The profiler runs in {n_prof} of {n_all} steps: trace one short window",
        trigger=f"profiled steps {slowdown:.2f}x slower >= {PROFILER_MIN_SLOWDOWN} and {n_prof / n_all:.0%} of the run "
        f">= PROFILER_MIN_STEP_SHARE {PROFILER_MIN_STEP_SHARE:.0%}",
        evidence={
            "profiled_steps": n_prof,
            "steps": n_all,
            "profiled_step_time_ms": f.profiled_step_time_ms,
            "step_time_ms": f.step_time_ms,
            "slowdown": slowdown,
        },
        change=Change(
            overrides,
            "torch.profiler.schedule(wait=..., warmup=1, active=2, repeat=1); "
            "with_stack/profile_memory (profile.memory) only when needed",
        ),
        predicted=pred,
        confidence="high",
    )


def _contributors(f: RunFacts) -> list[tuple[str, float]]:
    """Non-compute parts of the steady step in ms, largest first."""
    out: dict[str, float] = {}
    step = f.step_time_ms or 0.0
    if f.phases:
        for phase in ("data_wait", "optimizer", "grad_sync"):
            if f.phases.get(phase):
                out[phase] = f.phases[phase]
        if f.exposed_comm_ms:
            out["exposed_comm"] = f.exposed_comm_ms - f.phases.get("grad_sync", 0.0)
        split = whatif.cpu_micro_batch_split(f) if f.device == "cpu" else None
        if split is not None:
            ga = int(f.cfg("train.grad_accum", 1) or 1)
            out["fixed_overhead"] = ga * split[1]
    elif f.shares_source == "device":
        for part in ("idle", "exposed_comm", "exposed_memcpy"):
            if f.shares.get(part):
                out[part] = f.shares[part] * step
    elif f.shares_source == "host":
        for part in ("data", "optimizer", "grad_sync", "exposed_comm", "other"):
            if f.shares.get(part):
                out["data_wait" if part == "data" else part] = f.shares[part] * step
    return sorted(((k, v) for k, v in out.items() if v > 0), key=lambda kv: -kv[1])


def reference_mfu(f: RunFacts) -> tuple[float, str]:
    """The MFU this model reaches on this kind of device, and where that number comes from."""
    if f.device == "cuda":
        return GPU_REFERENCE_MFU, "well-tuned GPU runs in bf16 (PaLM, Megatron-LM, torchtitan)"
    eta = whatif.cpu_eta(f.cfg("model.d_model"))
    return eta, f"the per-token efficiency this model width reaches on CPU at large micro-batch (eta {eta:.2f})"


@rule(flops=True)
def rule_mfu_gap(f: RunFacts) -> Suggestion | None:
    """Diagnosis: MFU under MFU_GAP_FRACTION of the reference for this model and device; the top contributors.

    Lists the non-compute parts of the step (data wait, optimizer, exposed
    communication, fixed per-micro-batch overhead on CPU; idle, exposed
    communication and copies on GPU), largest first, with the rules that act
    on each. What-if (an upper bound): all listed contributors removed.
    """
    if f.mfu is None or not f.step_time_ms:
        return None
    ref, ref_source = reference_mfu(f)
    if f.mfu >= MFU_GAP_FRACTION * ref:
        return None
    contributors = _contributors(f)
    if not contributors:
        return None
    top = contributors[:4]
    removed = sum(v for _, v in top)
    listing = "; ".join(
        f"{k} {v:.1f} ms ({v / f.step_time_ms:.0%}) -> {_CONTRIBUTOR_RULES.get(k, '-')}" for k, v in top
    )
    evidence = {"mfu": f.mfu, "reference_mfu": ref, "reference_source": ref_source, "step_time_ms": f.step_time_ms}
    evidence |= {f"{k}_ms": v for k, v in top}
    return Suggestion(
        title=f"MFU {f.mfu:.1%} is under {MFU_GAP_FRACTION:.0%} of the {ref:.0%} this model reaches",
        trigger=f"MFU {f.mfu:.3f} < MFU_GAP_FRACTION {MFU_GAP_FRACTION} x reference {ref:.2f}",
        evidence=evidence,
        change=Change({}, f"top contributors (part, ms per step, share -> rules): {listing}"),
        predicted=whatif.prediction(
            f, whatif.remove(f.step_time_ms, removed), "upper bound: every listed contributor removed"
        ),
        confidence="medium",
        kind="diagnosis",
    )
