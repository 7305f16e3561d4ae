"""Rules on the compute itself: micro-batch size, launch overhead, compile, precision, optimizer.

docs/suggestions.md is the reference; thresholds are the module constants.
"""

from __future__ import annotations

from analyzer.metrics.hardware import datasheet_peak
from analyzer.verbs.suggest import whatif
from analyzer.verbs.suggest.engine import Change, Suggestion, rule
from analyzer.verbs.suggest.facts import RunFacts

# Share of the step that is not marginal per-token compute (dispatch and
# per-layer overheads, optimizer, data, communication) above which a larger
# micro-batch pays: at 30 % fixed, doubling the micro-batch still gains ~18 %.
MICRO_BATCH_MIN_FIXED_SHARE = 0.30
# The micro-batch grows by the smallest power of two bringing the fixed share
# under this, at most MICRO_BATCH_MAX_FACTOR times.
MICRO_BATCH_TARGET_FIXED_SHARE = 0.25
MICRO_BATCH_MAX_FACTOR = 8
# A GPU run may grow its batch only while memory stays under this fraction.
MEMORY_GROWTH_LIMIT = 0.85
# Device idle above this share of the step: the GPU waits for the host.
IDLE_MIN_SHARE = 0.20
# Launch-bound: at least this share of kernel launches run under SHORT_KERNEL_US.
SHORT_KERNEL_MIN_SHARE = 0.50
# Launch-bound idle: host wait (the next kernel not launched yet) plus kernel wait (gaps under 30 us between
# launched kernels) hold at least this share of the device idle time (analyzer.metrics.idle, HTA's breakdown);
# below it the idle is dependency-bound (rules_host.dependency_idle).
LAUNCH_WAIT_MIN_FRAC = 0.5
# torch.compile: fusable kernel time (elementwise, reduction, normalization;
# analyzer.metrics.taxonomy) above this share of kernel time, on a
# device-bound step (idle under IDLE_MIN_SHARE).
COMPILE_MIN_NON_GEMM_SHARE = 0.30
# Fused (Inductor) elementwise/normalization kernels take this fraction of
# the eager time: PyTorch 2 (Ansel et al., ASPLOS 2024) reports a 1.41x
# geomean training speedup on A100 over benchmarks with roughly half their
# time in non-GEMM kernels; 1 / 1.41 = 0.5 + 0.5 x gives x ~ 0.42, rounded up.
COMPILE_NON_GEMM_TIME_FACTOR = 0.5
# GEMM kernel time above this share of the step makes matmul precision worth changing.
GEMM_MIN_SHARE = 0.20
# Optimizer step above this share of the step.
OPTIMIZER_MIN_SHARE = 0.10
# optimizer_ms (AdamW step + grad clipping + zero_grad) with fused AdamW over
# the same phase with the for-loop/foreach implementation. CPU: measured on
# reftrain's small preset, 2 ranks (see docs/suggestions.md, calibration);
# CUDA: fused vs foreach, not measured here (no GPU), from the torch 2.x
# release notes' "up to 2x" for fused AdamW, taken conservatively.
FUSED_OPTIMIZER_TIME_FACTOR = {"cpu": 0.35, "cuda": 0.6}


# reftrain's phases that run one after another within a step (comm_ms is not one: it overlaps backward).
SEQUENTIAL_PHASES = ("data_wait", "forward", "backward", "optimizer", "grad_sync")


def phase_sum_ms(f: RunFacts) -> float:
    """The step as the sum of its sequential phases' medians (ms); the steady step when phases are missing.

    Shares of the step are taken against this sum, not against the median
    step: a median per phase and a median step come from different steps
    when step times vary (under load, 476 to 2003 ms within one run, whose
    phase medians summed to 986 ms against a 1217 ms median step, while each
    step's phases summed to that step within 15 ms), and the difference
    would count as fixed time.
    """
    parts = [f.phases[p] for p in SEQUENTIAL_PHASES if p in f.phases]
    return float(sum(parts)) if parts and "forward" in f.phases else float(f.step_time_ms or 0.0)


@rule(part="other")
def rule_micro_batch(f: RunFacts) -> Suggestion | None:
    """CPU run whose step is dominated by fixed costs: a larger micro-batch (``train.micro_batch_size``).

    Model (whatif.cpu_micro_batch_split, whatif.micro_batch_step_ms): per
    micro-batch, forward+backward (less the communication tail) is ``P *
    (kappa + B)``: a fixed part of ``kappa`` sequences' worth (dispatch and
    module overheads; kappa calibrated per model width) and ``P`` per
    sequence. Everything else in the step (optimizer, data wait, gradient
    communication) does not grow with ``B``. Fires when the fixed share
    ``1 - grad_accum * P * B / step`` exceeds MICRO_BATCH_MIN_FIXED_SHARE,
    with ``step`` the sum of the sequential phases (:func:`phase_sum_ms`);
    the prediction starts from the measured steady step.
    """
    if not f.is_reftrain or f.device != "cpu" or not f.step_time_ms:
        return None
    split = whatif.cpu_micro_batch_split(f)
    if split is None:
        return None
    per_micro, c0, per_seq, kappa = split
    mb, ga = int(f.cfg("train.micro_batch_size")), int(f.cfg("train.grad_accum", 1) or 1)
    basis = phase_sum_ms(f)
    fixed_share = 1.0 - min(1.0, ga * per_seq * mb / basis)
    if fixed_share <= MICRO_BATCH_MIN_FIXED_SHARE:
        return None
    factor, step_after = 1, f.step_time_ms
    while factor < MICRO_BATCH_MAX_FACTOR:
        factor *= 2
        step_after = whatif.micro_batch_step_ms(f.step_time_ms, ga, mb, per_seq, factor)
        basis_after = whatif.micro_batch_step_ms(basis, ga, mb, per_seq, factor)
        if 1.0 - ga * per_seq * mb * factor / basis_after <= MICRO_BATCH_TARGET_FIXED_SHARE:
            break
    new_mb = mb * factor
    return Suggestion(
        title=f"Amortize fixed costs over more tokens: micro-batch {mb} -> {new_mb}",
        trigger=f"fixed (not per-token) share {fixed_share:.0%} of step > MICRO_BATCH_MIN_FIXED_SHARE "
        f"{MICRO_BATCH_MIN_FIXED_SHARE:.0%}",
        evidence={
            "step_time_ms": f.step_time_ms,
            "forward_backward_per_micro_batch_ms": per_micro,
            "micro_batch_size": mb,
            "grad_accum": ga,
            "per_sequence_ms": per_seq,
            "fixed_per_micro_batch_ms": c0,
            "fixed_in_sequences": kappa,
            "fixed_share": fixed_share,
            "phase_sum_ms": basis,
            "optimizer_ms": f.phases.get("optimizer"),
            "data_wait_ms": f.phases.get("data_wait"),
            "exposed_comm_ms": f.exposed_comm_ms,
        },
        change=Change(
            {"train.micro_batch_size": new_mb},
            f"a {factor}x larger per-rank batch (DataLoader batch_size x{factor}); keep the global batch "
            f"by dividing gradient accumulation by {factor} where there is any",
        ),
        predicted=whatif.prediction(
            f,
            step_after,
            f"forward+backward per micro-batch {per_micro:.1f} ms = {c0:.1f} ms fixed ({kappa:.2f} sequences' worth) "
            f"+ {per_seq:.2f} ms x {mb} sequences; at {new_mb} sequences the step is {f.step_time_ms:.1f} + "
            f"{ga} x {per_seq:.2f} x {mb} x {factor - 1} ms, the rest unchanged",
            tokens_per_step_after=f.tokens_per_step * factor if f.tokens_per_step else None,
        ),
        confidence="medium",
        notes=(
            "the global batch grows with the micro-batch: retune the learning rate, or lower train.grad_accum "
            "by the same factor where it is > 1",
        ),
    )


def _device_parts(f: RunFacts) -> tuple[float, float, float, float] | None:
    """(idle share, batch-proportional device ms, fixed device ms, step ms) of a device breakdown.

    Exposed communication is fixed (gradient all-reduce, parameter
    all-gather: sizes set by the model) except its all-to-all share, whose
    bytes grow with the batch (embedding and expert exchanges), which scales:
    on an embedding job holding all-to-all constant while doubling the batch
    predicted a speed-up the job cannot have.
    """
    step = f.step_time_ms
    if f.shares_source != "device" or not step:
        return None
    s = f.shares
    scaled = (s.get("compute", 0.0) + s.get("overlapped_comm", 0.0) + s.get("exposed_memcpy", 0.0)) * step
    exposed = s.get("exposed_comm", 0.0) * step
    ks = f.kernels
    batch_share = ks.batch_comm_ms_per_step / ks.comm_ms_per_step if ks and ks.comm_ms_per_step > 0 else 0.0
    return s.get("idle", 0.0), scaled + exposed * batch_share, exposed * (1.0 - batch_share), step


@rule(part="idle", also=("exposed_comm",))
def rule_launch_bound(f: RunFacts) -> Suggestion | None:
    """GPU idle over IDLE_MIN_SHARE of the step: a larger batch fills the device for free.

    What-if (whatif.device_batch_step_ms): the host launches the same
    kernels, each doing ``k`` times the work, so the step stays at the
    measured time until the device work ``k * (compute + memcpy +
    exposed all-to-all) + other exposed comm`` catches up. ``k`` is the largest power of two (at most
    MICRO_BATCH_MAX_FACTOR) that fits, at least 2, and no more than memory
    allows (MEMORY_GROWTH_LIMIT) when memory is known. With the idle
    breakdown (f.idle), silent unless host and kernel wait hold LAUNCH_WAIT_MIN_FRAC of
    the idle time: a stream waiting on a dependency is not filled by a larger
    batch (rule dependency_idle); HTA's short-kernel share then sets the
    confidence.
    """
    parts = _device_parts(f)
    if parts is None:
        return None
    idle, scaled, fixed, step = parts
    if idle <= IDLE_MIN_SHARE or scaled <= 0:
        return None
    if f.idle is not None and f.idle.host_wait_frac + f.idle.kernel_wait_frac < LAUNCH_WAIT_MIN_FRAC:
        return None
    mem = f.memory.fraction
    k = 2
    while k < MICRO_BATCH_MAX_FACTOR and 2 * k * scaled + fixed <= step:
        k *= 2
    while mem is not None and k > 1 and mem * k > MEMORY_GROWTH_LIMIT:
        k //= 2
    if k < 2:
        return None
    step_after = whatif.device_batch_step_ms(step, scaled, fixed, k)
    mb = f.cfg("train.micro_batch_size")
    overrides = {"train.micro_batch_size": mb * k} if (f.is_reftrain and mb) else {}
    pred = whatif.prediction(
        f,
        step_after,
        f"device busy {scaled:.2f} ms batch-proportional + {fixed:.2f} ms exposed comm of a {f.step_time_ms:.2f} ms "
        f"step: {k}x the batch costs max(step, {k} x {scaled:.2f} + {fixed:.2f}) = {step_after:.2f} ms",
        tokens_per_step_after=f.tokens_per_step * k if f.tokens_per_step else None,
        work_ratio=float(k),
    )
    ks = f.kernels
    short = (
        f.idle.short_share
        if f.idle is not None and f.idle.short_share is not None
        else (ks.short_share if ks else None)
    )
    return Suggestion(
        title=f"The GPU waits {idle:.0%} of the step: {k}x larger batch per GPU",
        trigger=f"device idle {idle:.1%} of step > IDLE_MIN_SHARE {IDLE_MIN_SHARE:.0%}",
        evidence={
            "idle_share": idle,
            "step_time_ms": f.step_time_ms,
            "device_busy_scaled_ms": scaled,
            "exposed_comm_ms": fixed,
            "memory_fraction": mem,
            "kernels_per_step": ks.n_per_step if ks else None,
            "short_kernel_share": ks.short_share if ks else None,
            "host_wait_frac": f.idle.host_wait_frac if f.idle else None,
            "launch_short_share": f.idle.short_share if f.idle else None,
        },
        change=Change(
            overrides,
            f"a {k}x larger per-GPU batch (DataLoader batch_size x{k}); with a fixed global "
            "batch, fewer gradient-accumulation steps",
        ),
        predicted=pred,
        confidence="medium" if (short is not None and short >= SHORT_KERNEL_MIN_SHARE) else "low",
        notes=() if mem is not None else ("device memory unknown: check headroom before growing the batch",),
    )


@rule(part="idle")
def rule_cuda_graphs(f: RunFacts) -> Suggestion | None:
    """Launch-bound GPU (idle over IDLE_MIN_SHARE, over half the launches short): CUDA graphs.

    A captured graph replays all kernels with one launch, so the host's
    per-kernel launch cost leaves the critical path. What-if: the idle time
    attributable to launches, ``idle * short_kernel_share``, removed; with
    the idle breakdown (f.idle) no more than its host-wait and kernel-wait
    part (what launch overhead causes), and silent when host and kernel wait hold
    under LAUNCH_WAIT_MIN_FRAC of the idle (dependency-bound).
    reftrain has no CUDA-graph knob: plain advice.
    """
    parts = _device_parts(f)
    ks = f.kernels
    if parts is None or ks is None:
        return None
    idle, _, _, step = parts
    if idle <= IDLE_MIN_SHARE or ks.short_share < SHORT_KERNEL_MIN_SHARE:
        return None
    if f.idle is not None and f.idle.host_wait_frac + f.idle.kernel_wait_frac < LAUNCH_WAIT_MIN_FRAC:
        return None
    launch_frac = f.idle.host_wait_frac + f.idle.kernel_wait_frac if f.idle is not None else 1.0
    saved = idle * min(ks.short_share, launch_frac) * step
    return Suggestion(
        title="Replay the step as a CUDA graph to remove launch overhead",
        trigger=f"device idle {idle:.1%} > {IDLE_MIN_SHARE:.0%} and {ks.short_share:.0%} of launches under "
        f"10 us >= SHORT_KERNEL_MIN_SHARE {SHORT_KERNEL_MIN_SHARE:.0%}",
        evidence={
            "idle_share": idle,
            "short_kernel_share": ks.short_share,
            "kernels_per_step": ks.n_per_step,
            "mean_kernel_us": ks.mean_us,
            "step_time_ms": f.step_time_ms,
        },
        change=Change(
            {},
            'torch.compile(model, mode="reduce-overhead") (CUDA graphs), or capture the step with '
            "torch.cuda.graphs / torch.cuda.make_graphed_callables; needs static shapes",
        ),
        predicted=whatif.prediction(
            f,
            whatif.remove(step, saved),
            f"idle x short-launch share = {saved:.2f} ms of launch gaps removed",
        ),
        confidence="low",
    )


@rule(part="compute", flops=True)
def rule_torch_compile(f: RunFacts) -> Suggestion | None:
    """Device-bound GPU step with fusable kernels over COMPILE_MIN_NON_GEMM_SHARE: ``torch.compile``.

    Inductor fuses elementwise, reduction and normalization kernels (fewer
    passes over memory); GEMMs, attention, convolutions (cuDNN's are
    already tuned library kernels), communication and copies are not
    fusable (kernel classes: analyzer.metrics.taxonomy). What-if: fusable
    kernel time x COMPILE_NON_GEMM_TIME_FACTOR. Silent on CPU runs
    (Inductor's C++ backend needs a compiler toolchain and its gain there is
    not calibrated), on launch-bound steps (rule cuda_graphs / launch_bound
    apply) and when Inductor's Triton kernels already carry as much time as
    the fusable ones (the model is compiled).
    """
    parts = _device_parts(f)
    ks = f.kernels
    if parts is None or ks is None or (f.is_reftrain and f.cfg("train.compile")):
        return None
    idle, _, _, step = parts
    if idle > IDLE_MIN_SHARE or ks.kernel_ms_per_step <= 0 or ks.compiled_ms_per_step >= ks.fusable_ms_per_step:
        return None
    fusable = ks.fusable_ms_per_step
    share = fusable / ks.kernel_ms_per_step
    if share <= COMPILE_MIN_NON_GEMM_SHARE:
        return None
    saved = fusable * (1.0 - COMPILE_NON_GEMM_TIME_FACTOR)
    return Suggestion(
        title="Fuse elementwise kernels with torch.compile",
        trigger=f"fusable (elementwise, reduction, normalization) kernels {share:.0%} of kernel time > "
        f"COMPILE_MIN_NON_GEMM_SHARE {COMPILE_MIN_NON_GEMM_SHARE:.0%}, idle {idle:.0%}",
        evidence={
            "fusable_kernel_ms": fusable,
            "gemm_kernel_ms": ks.gemm_ms_per_step,
            "kernel_ms": ks.kernel_ms_per_step,
            "fusable_share": share,
            "step_time_ms": f.step_time_ms,
        },
        change=Change(
            {"train.compile": True} if f.is_reftrain else {},
            "model = torch.compile(model) (or compile each transformer block)",
        ),
        predicted=whatif.prediction(
            f,
            whatif.remove(step, saved),
            f"fusable kernel time {fusable:.2f} ms x {COMPILE_NON_GEMM_TIME_FACTOR} after fusion",
        ),
        confidence="low",
        notes=("the first steps compile (minutes on large models); steady state only",),
    )


def _gpu_peaks(f: RunFacts) -> dict[str, float] | None:
    """Datasheet peaks of the run's GPU by dtype key (bf16, tf32, fp32), from analyzer.metrics.hardware."""
    if f.device != "cuda" or not f.device_name:
        return None
    out = {}
    for key in ("bf16", "tf32", "fp32"):
        p = datasheet_peak(f.device_name, key)
        if p is not None:
            out[key] = p.per_s
    return out or None


def _matmul_precision(f: RunFacts) -> str | None:
    """``fp32`` (plain FP32 cores), ``tf32`` or ``bf16``: how the run's matmuls ran."""
    if f.is_reftrain:
        if f.cfg("train.dtype") == "bf16":
            return "bf16"
        return "tf32" if f.cfg("train.tf32") else "fp32"
    precision = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "bf16"}.get(f.dtype or "")
    ks = f.kernels
    if (
        precision == "fp32"
        and ks is not None
        and ks.gemm_ms_per_step > 0
        and ks.tf32_gemm_ms_per_step >= 0.5 * ks.gemm_ms_per_step
    ):
        precision = "tf32"  # fp32 tensors, but most GEMM time on TF32 tensor-core kernels
    return precision


def _gemm_ms(f: RunFacts) -> tuple[float, float] | None:
    """(GEMM kernel ms per step, step ms); None without kernels or a step time."""
    if f.kernels is None or not f.step_time_ms:
        return None
    return f.kernels.gemm_ms_per_step, f.step_time_ms


@rule(part="compute", flops=True)
def rule_bf16_autocast(f: RunFacts) -> Suggestion | None:
    """fp32/TF32 matmuls over GEMM_MIN_SHARE of the step on a GPU with bf16 tensor cores: bf16 autocast.

    What-if: GEMM kernel time scales by the datasheet peak ratio
    (current precision / bf16). MFU after is taken against the bf16 peak
    (reftrain rates a bf16 run against it), so it moves less than tokens/s.
    """
    precision = _matmul_precision(f)
    peaks = _gpu_peaks(f)
    gemm_step = _gemm_ms(f)
    if (
        precision not in ("fp32", "tf32")
        or peaks is None
        or "bf16" not in peaks
        or precision not in peaks
        or gemm_step is None
    ):
        return None
    gemm, step = gemm_step
    share = gemm / step
    if share <= GEMM_MIN_SHARE:
        return None
    ratio = peaks[precision] / peaks["bf16"]
    saved = gemm * (1.0 - ratio)
    pred = whatif.prediction(
        f,
        whatif.remove(step, saved),
        f"GEMM time {gemm:.2f} ms x {peaks[precision] / 1e12:.0f}/{peaks['bf16'] / 1e12:.0f} "
        f"(datasheet {precision} / bf16 peak of {f.device_name})",
        peak_ratio=peaks[precision] / peaks["bf16"],
    )
    return Suggestion(
        title=f"Run matmuls in bf16 ({precision} now)",
        trigger=f"{precision} GEMMs {share:.0%} of step > GEMM_MIN_SHARE {GEMM_MIN_SHARE:.0%} on a bf16-capable GPU",
        evidence={
            "gemm_ms": gemm,
            "step_time_ms": f.step_time_ms,
            "gemm_share": share,
            "precision": precision,
            "peak_current_flops_per_s": peaks[precision],
            "peak_bf16_flops_per_s": peaks["bf16"],
        },
        change=Change(
            {"train.dtype": "bf16"} if f.is_reftrain else {},
            "with torch.autocast('cuda', dtype=torch.bfloat16): loss = model(x, y) "
            "(FSDP2: MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))",
        ),
        predicted=pred,
        confidence="medium",
        notes=("bf16 changes numerics slightly; keep the optimizer state and reductions in fp32",),
    )


@rule(part="compute", flops=True)
def rule_tf32(f: RunFacts) -> Suggestion | None:
    """Plain fp32 matmuls over GEMM_MIN_SHARE on a GPU with TF32 tensor cores: allow TF32.

    What-if: GEMM time x fp32 peak / tf32 peak (datasheet). MFU after is
    taken against the TF32 peak, as reftrain rates fp32 runs with TF32 on.
    """
    precision = _matmul_precision(f)
    peaks = _gpu_peaks(f)
    gemm_step = _gemm_ms(f)
    if precision != "fp32" or peaks is None or not {"fp32", "tf32"} <= set(peaks) or gemm_step is None:
        return None
    gemm, step = gemm_step
    if peaks["tf32"] <= peaks["fp32"]:
        return None  # no TF32 tensor cores (V100, T4)
    share = gemm / step
    if share <= GEMM_MIN_SHARE:
        return None
    ratio = peaks["fp32"] / peaks["tf32"]
    pred = whatif.prediction(
        f,
        whatif.remove(step, gemm * (1.0 - ratio)),
        f"GEMM time {gemm:.2f} ms x {peaks['fp32'] / 1e12:.1f}/{peaks['tf32'] / 1e12:.0f} "
        f"(datasheet fp32 / tf32 peak of {f.device_name})",
        peak_ratio=ratio,
    )
    return Suggestion(
        title="Allow TF32 tensor cores for fp32 matmuls",
        trigger=f"fp32 GEMMs {share:.0%} of step > GEMM_MIN_SHARE {GEMM_MIN_SHARE:.0%}, TF32 available",
        evidence={
            "gemm_ms": gemm,
            "step_time_ms": f.step_time_ms,
            "gemm_share": share,
            "peak_fp32_flops_per_s": peaks["fp32"],
            "peak_tf32_flops_per_s": peaks["tf32"],
        },
        change=Change(
            {"train.tf32": True} if f.is_reftrain else {},
            'torch.set_float32_matmul_precision("high") (TF32 matmuls; cuDNN: torch.backends.cudnn.allow_tf32)',
        ),
        predicted=pred,
        confidence="medium",
    )


@rule(part="optimizer")
def rule_fused_adamw(f: RunFacts) -> Suggestion | None:
    """Optimizer step over OPTIMIZER_MIN_SHARE of the step without fused AdamW: ``optim.impl=fused``.

    What-if: the optimizer phase x FUSED_OPTIMIZER_TIME_FACTOR (one kernel,
    or one vectorized loop on CPU, over all parameters instead of a loop of
    small ops per tensor).
    """
    if not f.step_time_ms:
        return None
    opt = f.phases.get("optimizer")
    if opt is None and f.shares_source == "host":
        opt = f.share_ms("optimizer")
    if not opt or (f.is_reftrain and f.cfg("optim.impl") == "fused"):
        return None
    share = opt / f.step_time_ms
    if share <= OPTIMIZER_MIN_SHARE:
        return None
    factor = FUSED_OPTIMIZER_TIME_FACTOR["cuda" if f.device == "cuda" else "cpu"]
    saved = opt * (1.0 - factor)
    impl = f.cfg("optim.impl")
    return Suggestion(
        title=f"Fused AdamW ({impl or 'unknown'} now): one pass over all parameters",
        trigger=f"optimizer {share:.1%} of step > OPTIMIZER_MIN_SHARE {OPTIMIZER_MIN_SHARE:.0%}",
        evidence={"optimizer_ms": opt, "step_time_ms": f.step_time_ms, "optimizer_share": share, "impl": impl},
        change=Change(
            {"optim.impl": "fused"} if f.is_reftrain else {},
            "torch.optim.AdamW(params, ..., fused=True) (or foreach=True where fused is unsupported)",
        ),
        predicted=whatif.prediction(
            f,
            whatif.remove(f.step_time_ms, saved),
            f"optimizer {opt:.1f} ms x {factor} (measured fused/loop ratio on {f.device})",
        ),
        confidence="medium" if f.device == "cpu" else "low",
    )
