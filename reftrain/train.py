"""The training loop of one rank, instrumented on every step.

Reads top to bottom: set up (process group, clocks, model, FLOPs and peak,
parallelism, optimizer, resume, data, writers), then the loop, then the
summary. Each step runs the phases data -> forward -> backward (per
micro-batch) -> grad_sync (only with parallel.overlap_grad_sync=false) ->
optimizer, timed by PhaseTimer and annotated for the profiler, and writes one
metrics record (docs/rundir.md, reftrain.metrics/1).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from analyzer.ingest import formats as fmt
from recorder import manifest
from recorder.clock import align_clocks
from reftrain import checkpoint, data, flops, parallel, rundir
from recorder.canary import Canary
from reftrain.config import Config, resolve
from reftrain.errors import ReftrainError
from reftrain.faults import Faults, restart_count
from recorder.heartbeat import Heartbeat
from recorder.hardware import describe_hardware, git_state
from reftrain.inject import Injector
from recorder.instrument import (
    CollectiveTimer,
    JsonlWriter,
    PhaseTimer,
    peak_reserved_bytes,
    process_memory_bytes,
    untimed_collectives,
    untimed_group,
)
from reftrain.model import Transformer, block_parameter_count, parameter_counts
from recorder.preemption import Preemption
from recorder.ranks import max_restarts
from recorder.profiling import StepProfiler
from recorder.telemetry import GpuTelemetry, nvml_index_of
from reftrain.trackers import Trackers, run_summary

PHASES = ("data", "forward", "backward", "grad_sync", "optimizer")
REPO_ROOT = Path(__file__).resolve().parent.parent


def lr_at(step: int, cfg: Config) -> float:
    """Linear warm-up to optim.lr, then cosine decay to optim.min_lr at the last step."""
    o, steps = cfg.optim, cfg.train.steps
    if step < o.lr_warmup_steps:
        return o.lr * (step + 1) / o.lr_warmup_steps
    span = max(1, steps - 1 - o.lr_warmup_steps)
    progress = min(1.0, (step - o.lr_warmup_steps) / span)
    return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1 + math.cos(math.pi * progress))


# ---------------------------------------------------------------------------
# Set-up helpers
# ---------------------------------------------------------------------------


def _agree_on_run_dir(cfg: Config, run_dir: Path | None, env: parallel.DistEnv) -> Path:
    """The run directory: given by the launcher, or created by rank 0 and broadcast (torchrun)."""
    if run_dir is not None:
        return run_dir
    box: list = [None]
    if env.rank == 0:
        try:
            box[0] = ("ok", str(rundir.create_run_dir(cfg, env.world_size)))
        except ReftrainError as exc:
            box[0] = ("error", str(exc))
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status == "error":
        raise ReftrainError(value)
    return Path(value)


def _peak_flops(cfg: Config, env: parallel.DistEnv) -> flops.PeakFlops:
    """Override, else the GPU table, else a matmul measured on every rank at once (max taken)."""
    key = flops.peak_dtype(cfg.train.dtype, env.device.type, cfg.train.tf32)
    if cfg.run.peak_flops is not None:
        return flops.PeakFlops(cfg.run.peak_flops, "override", "--peak-flops / run.peak_flops", key)
    if env.device.type == "cuda":
        found = flops.table_peak(torch.cuda.get_device_name(env.device), key)
        if found is not None:
            return found
    # All ranks measure concurrently, as they will train: on a shared CPU the
    # ranks share cores. The max over ranks is the per-device peak.
    measured = flops.measure_matmul_peak(env.device, key)
    value = torch.tensor([measured.per_s], dtype=torch.float64, device=env.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    detail = measured.detail + (f", max over {env.world_size} ranks measuring at once" if env.world_size > 1 else "")
    return flops.PeakFlops(float(value.item()), "measured", detail, key)


def _optimizer(model: torch.nn.Module, cfg: Config) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (norm gains are 1-D)."""
    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    impl = {"auto": {}, "fused": {"fused": True}, "foreach": {"foreach": True}, "for_loop": {"foreach": False}}[o.impl]
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, **impl)


def _autocast(cfg: Config, env: parallel.DistEnv):
    """bf16 autocast for DDP; FSDP2 casts through its MixedPrecisionPolicy instead."""
    if cfg.train.dtype == "bf16" and cfg.parallel.strategy == "ddp":
        return torch.autocast(env.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@dataclass
class _Telemetry:
    sampler: GpuTelemetry | None
    files: list[str]
    note: str | None


def _start_telemetry(cfg: Config, env: parallel.DistEnv, run_dir: Path) -> _Telemetry:
    if not cfg.telemetry.enabled:
        return _Telemetry(None, [], "telemetry disabled (telemetry.enabled=false)")
    if env.device.type != "cuda":
        ok, reason = GpuTelemetry.available()
        note = "CPU run: no GPU to sample" + (f" ({reason})" if not ok else "")
        return _Telemetry(None, [], note)
    ok, reason = GpuTelemetry.available()
    if not ok:
        return _Telemetry(None, [], reason)
    rel = fmt.records_file("telemetry", env.rank)
    sampler = GpuTelemetry(run_dir / rel, nvml_index_of(env.device), cfg.telemetry.interval_ms)
    sampler.start()
    return _Telemetry(sampler, [rel], None)


def _say(env: parallel.DistEnv, text: str) -> None:
    if env.rank == 0:
        print(text, flush=True)


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def run(
    cfg: Config,
    run_dir: Path | None,
    resume: Path | None,
    command: list[str],
    resumed_from_run: Path | None = None,
    quiet: bool = False,
) -> None:
    """Train on this rank. Collective: every rank of the job calls it with the same arguments.

    ``quiet``: rank 0 prints neither the opening line nor the progress lines (docs/reftrain.md,
    "What a step records"); warnings, errors and the closing summary stay."""
    env = parallel.init_distributed(cfg)
    try:
        resolve(cfg, env.world_size)
        run_dir = _agree_on_run_dir(cfg, run_dir, env)
        if restart_count() > 0:
            # torchelastic restarted the job (--max-restarts) after a rank died: carry on
            # from this run's latest complete checkpoint, or from the start without one.
            if _finished(run_dir, env):
                return  # a rank died after the job's end (run.json completed): nothing to redo
            latest = checkpoint.latest_checkpoint(run_dir)
            if latest is not None:
                resume, resumed_from_run = latest, run_dir
        trackers = Trackers(cfg.log, run_dir, env.rank)  # --log: rank 0 only (reftrain/trackers.py)
        try:
            _train(cfg, env, run_dir, resume, command, resumed_from_run, trackers, quiet)
        except BaseException as exc:
            trackers.finish(None, "failed")
            if env.rank == 0:
                reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else (str(exc) or type(exc).__name__)
                manifest.mark_failed(run_dir, reason, command, env.world_size)
            raise
    finally:
        parallel.shutdown()


def _finished(run_dir: Path, env: parallel.DistEnv) -> bool:
    """Whether rank 0 finds run.json completed (broadcast, so every rank decides alike)."""
    box = [env.rank == 0 and (manifest.read_manifest(run_dir) or fmt.RunManifest()).status == "completed"]
    dist.broadcast_object_list(box, src=0)
    return bool(box[0])


def _train(
    cfg: Config,
    env: parallel.DistEnv,
    run_dir: Path,
    resume: Path | None,
    command: list[str],
    resumed_from_run: Path | None,
    trackers: Trackers | None = None,
    quiet: bool = False,
) -> fmt.RunManifest:
    t, device = cfg.train, env.device
    start_time = manifest.utc_now()
    torch.manual_seed(t.seed)  # identical initial weights on every rank (FSDP2 shards them as is)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = t.tf32
        torch.backends.cudnn.allow_tf32 = t.tf32
    clock = align_clocks().to_dict()

    # Model, its FLOPs and the peak they are compared with.
    model = Transformer(cfg.model).to(device)
    params = parameter_counts(model)
    m = cfg.model
    fpt = flops.flops_per_token(
        params["non_embedding"],
        block_parameter_count(model),
        m.n_layers,
        m.n_heads,
        m.d_model // m.n_heads,
        m.seq_len,
        m.d_ff,
        t.activation_checkpointing,
    )
    peak = _peak_flops(cfg, env)

    if t.activation_checkpointing:
        parallel.apply_activation_checkpointing(model)
    if t.compile:
        parallel.apply_compile(model, t.compile_backend)
    ddp = cfg.parallel.strategy == "ddp"
    model = parallel.apply_ddp(model, cfg, env) if ddp else parallel.apply_fsdp(model, cfg, env)
    optimizer = _optimizer(model, cfg)

    start_step = 0
    if resume is not None:
        start_step = checkpoint.load(resume, model, optimizer)
        # A restart after the last step's checkpoint (a rank died on its way out) has
        # nothing to run; it completes the run. A user's --resume there is a mistake.
        if start_step >= t.steps and not (restart_count() > 0 and resumed_from_run == run_dir):
            raise ReftrainError(
                f"--resume {resume}: checkpoint is at step {start_step}, "
                f"train.steps={t.steps} leaves nothing to do (raise it with --steps)"
            )
    loader = data.build_loader(cfg, env.rank, start_step, device.type)
    tokens_per_micro = t.micro_batch_size * m.seq_len
    tokens_per_rank_step = tokens_per_micro * t.grad_accum
    tokens_per_step = tokens_per_rank_step * env.world_size

    # Who ran where (gathered so rank 0 can write it).
    hw = describe_hardware(device)
    all_hw: list = [None] * env.world_size
    dist.all_gather_object(all_hw, hw)

    attempt = restart_count()
    # Each attempt writes its own files (JsonlWriter never appends): the first the
    # documented names, a restart's under attempt{k}/ (docs/rundir.md, "Restarts").
    sub = fmt.attempt_folder(attempt)
    profiler = StepProfiler(cfg.profile, env.rank, run_dir / "traces" / sub, device, start_step)
    steps_run = list(range(start_step, t.steps))
    profiled_steps = [s for s in steps_run if profiler.collecting(s)]
    telemetry = _start_telemetry(cfg, env, run_dir)
    injector = Injector(cfg, env.rank, device)
    faults = Faults(cfg.fault, env.rank)
    for line in faults.unreachable(start_step):  # a resumed run can start past the step of a fault
        print(f"reftrain: warning: rank {env.rank}: {line}", file=sys.stderr, flush=True)

    # run.json: the one typed definition of the manifest (analyzer.ingest.formats, docs/rundir.md).
    man = fmt.RunManifest(
        schema=manifest.SCHEMA,
        run_id=run_dir.name,
        status="running",
        start_time=start_time,
        end_time=None,
        git=fmt.Git.from_json(git_state(REPO_ROOT)),
        command=command,
        config=manifest.saved_config_dict(run_dir),
        world_size=env.world_size,
        backend=env.backend,
        hardware=fmt.Hardware(
            device_type=device.type,
            device_names=[h["device_name"] for h in all_hw],
            # The smallest device bounds the run (None on CPU).
            device_memory_bytes=min(
                (h["device_memory_bytes"] for h in all_hw if h["device_memory_bytes"]), default=None
            ),
            cpu_model=hw["cpu_model"],
            cpu_cores=hw["cpu_cores"],
            cpu_cores_usable=hw["cpu_cores_usable"],
            hostnames=[h["hostname"] for h in all_hw],
        ),
        torch_version=torch.__version__,
        params=fmt.Params.from_json(params),
        flops=fmt.Flops.from_json(fpt.to_manifest()),
        peak_flops=fmt.PeakFlops.from_json(peak.to_manifest()),
        tokens_per_step=tokens_per_step,
        steps=t.steps,
        start_step=start_step,
        warmup_steps=t.warmup_steps,
        profiled_steps=profiled_steps,
        clock=fmt.Clock.from_json(clock),
        inject=fmt.Inject(slow_rank=cfg.inject.slow_rank, delay_ms=cfg.inject.delay_ms, slowdown=cfg.inject.slowdown),
        resumed_from=None
        if resume is None
        else fmt.ResumedFrom(run_dir=str(resumed_from_run), checkpoint=str(resume), step=start_step),
        telemetry_note=telemetry.note,
        files=manifest.files_listing(run_dir, []),
        schemas=dict(manifest.SCHEMAS),
        max_restarts=max_restarts(),
        attempts=[],
    )
    if env.rank == 0:
        man.attempts = manifest.attempts_so_far(run_dir, attempt, start_time, start_step)
        if attempt > 0:  # the first attempt's start, and the files earlier attempts wrote
            previous = manifest.read_manifest(run_dir) or fmt.RunManifest()
            man.start_time = previous.start_time or start_time
            if previous.files.metrics is not None:
                man.files = previous.files
            man.checkpoint_saves = previous.checkpoint_saves or []
            man.hangs = previous.hangs  # the launcher's watchdog ended an earlier attempt
    if env.rank == 0:
        manifest.write_json(run_dir / "run.json", man)
    if env.rank == 0 and not quiet:
        print(
            f"reftrain: {run_dir}  |  {env.world_size} x {device.type} ({env.backend}), "
            f"{cfg.parallel.strategy}, {params['total'] / 1e6:.2f} M params, "
            f"{fpt.model / 1e6:.1f} MFLOP/token, peak {peak.per_s / 1e12:.3g} TFLOP/s ({peak.source}: {peak.detail})"
        )
        if telemetry.note and cfg.telemetry.enabled:
            print(f"telemetry: {telemetry.note}", flush=True)
    if env.rank == 0 and trackers is not None:
        trackers.start(man.config or cfg.to_dict(), run_dir.name, attempt)

    metrics_rel = fmt.records_file("metrics", env.rank, attempt)
    colls_rel = fmt.records_file("collectives", env.rank, attempt)
    metrics_writer = JsonlWriter(run_dir / metrics_rel)
    colls_writer = JsonlWriter(run_dir / colls_rel)
    timer = CollectiveTimer(colls_writer, env.rank, device)
    if ddp:
        model.register_comm_hook(None, timer.ddp_comm_hook)
    timer.install()
    records: list[dict] = []
    heartbeat = Heartbeat(run_dir, env.rank, attempt)
    saver = Saver(cfg, env, run_dir, faults, heartbeat)
    wall_start = time.perf_counter()
    try:
        with profiler, Preemption(env.rank, device) as preemption:
            # The machine-speed canary on CPU runs, where the steps' work is host CPU time (docs/ci.md).
            canary = Canary(start_step, t.steps - 1) if device.type == "cpu" else None
            step_fn = TrainStep(
                cfg, env, model, optimizer, iter(loader), timer, metrics_writer, injector, profiler, peak, fpt, canary
            )
            console = None if env.rank != 0 or quiet else Console(cfg, start_step, env.world_size)
            stopped_by = _loop(
                cfg, env, run_dir, step_fn, start_step, records, faults, saver, heartbeat, preemption, trackers, console
            )
        timer.flush(wait=True)
        heartbeat.beat(records[-1]["step"] if records else start_step, "done")
    finally:
        heartbeat.close()
        timer.uninstall()
        metrics_writer.close()
        colls_writer.close()
        if telemetry.sampler is not None:
            telemetry.sampler.stop()
            if telemetry.sampler.error:
                print(f"rank {env.rank}: {telemetry.sampler.error}", file=sys.stderr, flush=True)
    wall_s = time.perf_counter() - wall_start

    mine = {
        "metrics": [metrics_rel],
        "collectives": [colls_rel],
        "telemetry": telemetry.files,
        "traces": [f"traces/{sub}{name}" for name in profiler.traces],
        "summary": _rank_summary(records, cfg, start_step),
    }
    everyone: list = [None] * env.world_size
    dist.all_gather_object(everyone, mine)
    if env.rank == 0:
        earlier = manifest.earlier_attempt_files(run_dir, attempt, env.world_size)
        status = "completed" if stopped_by is None else "preempted"
        man.status, man.end_time = status, manifest.utc_now()
        man.files = manifest.files_listing(run_dir, [earlier, *everyone])
        on_disk = manifest.read_manifest(run_dir) or fmt.RunManifest()
        man.checkpoint_saves, man.hangs = on_disk.checkpoint_saves or [], on_disk.hangs
        last = man.attempts[-1]
        last.end_time, last.status, last.exit_codes = man.end_time, status, [0] * env.world_size
        if stopped_by is not None:
            done = records[-1]["step"] + 1 if records else start_step
            last.cause = (
                f"preempted: {stopped_by} received; stopped after step {done - 1} with checkpoint "
                f"checkpoints/step{done} (reftrain --resume {run_dir} continues)"
            )
        if (cfg.inject.slowdown is not None or cfg.inject.slow_rank is not None) and man.inject is not None:
            # What the injection measured per rank (medians over steady steps): the analyzer and
            # bench_gate read the injected time from here instead of trusting the request.
            man.inject.measured = {
                "injected_ms": [e["summary"]["injected_ms"] for e in everyone],
                "compute_factor": [e["summary"]["compute_factor"] for e in everyone],
            }
        manifest.write_json(run_dir / "run.json", man)
        summary = run_summary(run_dir, records, wall_s, status)
        _print_summary(cfg, run_dir, records, everyone, summary, start_step, profiled_steps)
        if trackers is not None:
            trackers.finish(summary, status)
        if stopped_by is not None:
            print(f"reftrain: {last.cause}", flush=True)
    return man


class TrainStep:
    """One optimizer step with everything that is always on: phase timing, collective
    timing, the metrics record and its write. The loop (and bench/bench_reftrain.py)
    call `run(step)`; printing, checkpoints and the profiler stay in the loop.
    """

    def __init__(
        self,
        cfg: Config,
        env: parallel.DistEnv,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        batches,
        timer: CollectiveTimer,
        writer: JsonlWriter,
        injector: Injector,
        profiler: StepProfiler,
        peak: flops.PeakFlops,
        fpt: flops.FlopsPerToken,
        canary: Canary | None = None,
    ) -> None:
        self.cfg, self.env, self.model, self.optimizer = cfg, env, model, optimizer
        self.canary = canary
        self.batches = batches
        self.timer, self.writer, self.injector, self.profiler = timer, writer, injector, profiler
        self.peak, self.fpt = peak, fpt
        self.params = [q for q in model.parameters() if q.requires_grad]
        self.phases = PhaseTimer(env.device, PHASES)
        self.autocast = _autocast(cfg, env)
        self.tokens = cfg.train.micro_batch_size * cfg.model.seq_len * cfg.train.grad_accum

    def run(self, step: int) -> dict:
        """Train step `step`; returns the reftrain.metrics/1 record it wrote."""
        cfg, env, model, pt = self.cfg, self.env, self.model, self.phases
        t, p, device = cfg.train, cfg.parallel, env.device
        ddp = p.strategy == "ddp"
        canary_ms = canary_cpu_ms = None
        if self.canary is not None and self.canary.due(step) and not self.profiler.collecting(step):
            canary_ms, canary_cpu_ms = self.canary.probe()  # before the step's clocks start
        self.timer.set_step(step)
        lr = lr_at(step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.injector.start_step()
        pt.start_step()
        cpu_start_s = time.process_time()
        loss_sum = torch.zeros((), device=device)
        for micro in range(t.grad_accum):
            last = micro == t.grad_accum - 1
            with pt.phase("data", host_clock=True):
                x, y = next(self.batches)
                if cfg.data.path is not None:
                    data.check_batch(x, cfg.model.vocab_size, cfg.data.path)
                    data.check_batch(y, cfg.model.vocab_size, cfg.data.path)
                x = x.to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
            if ddp:
                # Gradients are all-reduced only in the last micro-batch's backward (or after it).
                sync = contextlib.nullcontext() if (last and p.overlap_grad_sync) else model.no_sync()
            else:
                model.set_requires_gradient_sync(last)
                sync = contextlib.nullcontext()
            with sync:
                with pt.phase("forward"), self.injector.compute("forward", first_forward=micro == 0):
                    with self.autocast:
                        loss = model(x, y)
                with pt.phase("backward"), self.injector.compute("backward"):
                    (loss / t.grad_accum).backward()
            loss_sum += loss.detach()
        if ddp and not p.overlap_grad_sync:
            with pt.phase("grad_sync"):
                parallel.allreduce_gradients(self.params, p.bucket_cap_mb, env.world_size)
        with pt.phase("optimizer"):
            grad_norm = None
            if cfg.optim.grad_clip > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.optim.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        times = pt.end_step()
        # CPU time of this rank's process (all threads) over the step. Beside the
        # wall-clock step time it tells more work from a busier machine: time
        # spent descheduled by neighbours is wall time, not CPU time (docs/ci.md).
        cpu_ms = (time.process_time() - cpu_start_s) * 1e3
        mem_reserved = peak_reserved_bytes(device)  # before the reset below, which resets both peaks
        mem_bytes, mem_kind = process_memory_bytes(device, reset_peak=True)
        step_s = times["step_time_ms"] / 1e3
        if grad_norm is not None and hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        tokens = self.tokens
        # The typed line (docs/rundir.md), written and returned as its JSON object.
        record = fmt.MetricsLine(
            step=step,
            rank=env.rank,
            loss=loss_sum.item() / t.grad_accum,
            step_time_ms=times["step_time_ms"],
            cpu_ms=cpu_ms,
            data_wait_ms=times["data_ms"],
            forward_ms=times["forward_ms"],
            backward_ms=times["backward_ms"],
            optimizer_ms=times["optimizer_ms"],
            grad_sync_ms=times["grad_sync_ms"],
            comm_ms=self.timer.step_comm_ms(step),
            tokens=tokens,
            tokens_per_s=tokens / step_s if step_s > 0 else 0.0,
            mfu=flops.mfu(tokens, self.fpt.model, step_s, self.peak.per_s),
            hfu=flops.mfu(tokens, self.fpt.hardware, step_s, self.peak.per_s),
            mem_bytes=mem_bytes,
            mem_kind=mem_kind,
            mem_reserved_bytes=mem_reserved,
            profiled=self.profiler.collecting(step),
            lr=lr,
            grad_norm=None if grad_norm is None else float(grad_norm),
            injected_ms=self.injector.injected_ms,
            injected_forward_ms=self.injector.injected["forward"],
            injected_backward_ms=self.injector.injected["backward"],
            # Slowdown on CPU: CPU time of forward + backward's own work and of the injected work.
            compute_cpu_ms=self.injector.compute_cpu_ms if self.injector.compute_cpu_ms else None,
            injected_cpu_ms=self.injector.injected_cpu_ms if self.injector.compute_cpu_ms else None,
            canary_ms=canary_ms,
            canary_cpu_ms=canary_cpu_ms,
            time_ns=time.time_ns(),
            attempt=restart_count(),  # which torchelastic attempt ran it (a restart runs steps again)
        ).to_json()
        self.writer.write(record)
        self.writer.flush()
        self.timer.flush()
        return record


def _loop(
    cfg: Config,
    env: parallel.DistEnv,
    run_dir: Path,
    step_fn: TrainStep,
    start_step: int,
    records: list[dict],
    faults: Faults | None = None,
    saver: Saver | None = None,
    heartbeat: Heartbeat | None = None,
    preemption: Preemption | None = None,
    trackers: Trackers | None = None,
    console: Console | None = None,
) -> str | None:
    """Run the steps; returns None at the end, or the signal's name when preempted
    (the state after the last step run is then saved)."""
    t = cfg.train
    saver = saver or Saver(cfg, env, run_dir, faults, heartbeat)
    for step in range(start_step, t.steps):
        if faults is not None:
            faults.step_start(step)
        if heartbeat is not None:
            heartbeat.beat(step, "start")
        record = step_fn.run(step)
        records.append(record)
        if heartbeat is not None:
            heartbeat.beat(step, "end")
        if console is not None:
            console.after(records)
        if trackers is not None:
            trackers.log_step(record)
        saver.poll()
        saved = False
        if t.checkpoint_every and (step + 1) % t.checkpoint_every == 0:
            saver.save(step + 1, step_fn.model, step_fn.optimizer)
            saved = True
        step_fn.profiler.step_done(step)
        stop = preemption.agreed() if preemption is not None else None
        if stop is not None:
            if not saved:
                saver.save(step + 1, step_fn.model, step_fn.optimizer)
            saver.finish()
            return stop
    saver.finish()
    if faults is not None:
        faults.step_start(t.steps)  # "step train.steps": after the last step and its checkpoint
    return None


class Saver:
    """The loop's checkpoint saves, synchronous or asynchronous (checkpoint.async_save).

    Each save's stall (the loop's wall time inside it, rank 0) goes to
    run.json's `checkpoint_saves` when the save is published: for a
    synchronous save at once, for an asynchronous one when its write has
    completed (checked after every step; waited for before the next save
    and at the end), with `complete_s`, the time from its start to then.
    """

    def __init__(
        self, cfg: Config, env: parallel.DistEnv, run_dir: Path, faults: Faults | None, heartbeat: Heartbeat | None
    ) -> None:
        self.env, self.run_dir, self.faults, self.heartbeat = env, run_dir, faults, heartbeat
        self.pending: checkpoint.PendingSave | None = None
        self.group = None
        self.async_save = cfg.checkpoint.async_save and cfg.train.checkpoint_every > 0
        if self.async_save:
            # DCP's background collectives get a gloo group of their own (a CPU backend
            # is required, and they must not interleave with the loop's on the default group).
            self.group = dist.new_group(backend="gloo")
            untimed_group(self.group)

    def _before_publish(self, step: int) -> None:
        if self.faults is not None:
            self.faults.in_save(step)

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Save the state after `step` steps as checkpoints/step{step}. Collective."""
        if self.heartbeat is not None:
            self.heartbeat.beat(step - 1, "checkpoint")
        t0 = time.perf_counter()
        self.finish()  # one save in flight at most: waiting for the previous one stalls the loop too
        with untimed_collectives():  # checkpoint I/O is not training communication
            if self.async_save:
                try:
                    self.pending = checkpoint.save_async(self.run_dir, step, model, optimizer, self.group)
                except Exception as exc:  # noqa: BLE001 - DCP's async path refused: say so once, save synchronously
                    self.async_save = False
                    _say(
                        self.env,
                        f"  checkpoint: async_save failed ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}); saving synchronously from now on",
                    )
            if not self.async_save:
                path = checkpoint.save(self.run_dir, step, model, optimizer, before_publish=self._before_publish)
        stall_s = time.perf_counter() - t0
        if self.pending is not None:
            self.pending.stall_s = stall_s
            _say(self.env, f"  checkpoint step{step}: staged in {stall_s:.2f} s, writing in the background")
            return
        if self.env.rank == 0:  # the loop's stall per save, for goodput (run.json checkpoint_saves)
            manifest.record_checkpoint_save(self.run_dir, step, stall_s, restart_count())
        _say(self.env, f"  checkpoint {path.relative_to(self.run_dir.parent)} saved in {stall_s:.1f} s")

    def poll(self) -> None:
        """Publish the asynchronous save in flight if its write has completed (not collective)."""
        if self.pending is not None:
            self._complete(wait=False)

    def finish(self) -> None:
        """Wait for the asynchronous save in flight and publish it."""
        if self.pending is not None:
            self._complete(wait=True)

    def _complete(self, wait: bool) -> None:
        p = self.pending
        if not checkpoint.finish_async(self.run_dir, p, wait, self._before_publish):
            return
        self.pending = None
        complete_s = time.perf_counter() - p.started_s
        if self.env.rank == 0:
            manifest.record_checkpoint_save(self.run_dir, p.step, p.stall_s, restart_count(), "async", complete_s)
        _say(
            self.env,
            f"  checkpoint {p.path.relative_to(self.run_dir.parent)} published "
            f"{complete_s:.1f} s after it began (the loop stalled {p.stall_s:.2f} s)",
        )


# ---------------------------------------------------------------------------
# Console
# ---------------------------------------------------------------------------


def _fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k"


# The ETA's window: the last ETA_WINDOW steady-state steps of rank 0.
ETA_WINDOW = 10


def prints_after(step: int, start_step: int, steps: int, every: int) -> bool:
    """Whether rank 0's progress line follows ``step`` (0-based): after the attempt's first step, whenever
    ``every`` divides the steps done (counted from 0, so a resumed run prints at the same steps) and after
    the last step; never with ``every`` 0."""
    return every > 0 and (step == start_step or (step + 1) % every == 0 or step + 1 == steps)


def eta_s(records: list[dict], start_step: int, warmup_steps: int, steps: int) -> float | None:
    """Seconds until the last step ends: the median ``step_time_ms`` of rank 0's last :data:`ETA_WINDOW`
    steady-state steps (:func:`steady_state`: after the warm-up, outside profiler windows) x the steps left.

    The steps' own time: checkpoint saves and trace export between steps are not in it, nor are
    the profiler's slower steps still to come. None before the first steady-state step and after
    the last step.
    """
    left = steps - (records[-1]["step"] + 1) if records else steps
    window = steady_state(records, start_step, warmup_steps)[-ETA_WINDOW:]
    if left <= 0 or not window:
        return None
    return statistics.median(r["step_time_ms"] for r in window) * left / 1e3


def _fmt_duration(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def progress_line(r: dict, steps: int, world: int, eta: float | None) -> str:
    """Rank 0's line after a step: steps done of ``steps``, the step's loss, time, tokens/s of all ranks
    (this rank's x ``world``), MFU, the ETA (:func:`eta_s`; left out when None), ``[profiler]`` in a
    profiler window."""
    done = r["step"] + 1
    text = (
        f"step {done:>{len(str(steps))}}/{steps}  loss {r['loss']:.4f}  {r['step_time_ms']:7.1f} ms  "
        f"{_fmt_rate(r['tokens_per_s'] * world)} tok/s  MFU {r['mfu']:.1%}"
    )
    if eta is not None:
        text += f"  ETA {_fmt_duration(eta)}"
    return text + ("  [profiler]" if r["profiled"] else "")


class Console:
    """Rank 0's progress lines while training: :func:`progress_line` after the steps :func:`prints_after`
    picks (``log.console_interval_steps``)."""

    def __init__(self, cfg: Config, start_step: int, world: int) -> None:
        self.steps, self.start_step, self.world = cfg.train.steps, start_step, world
        self.warmup_steps, self.every = cfg.train.warmup_steps, cfg.log.console_interval_steps

    def after(self, records: list[dict]) -> None:
        r = records[-1]
        if prints_after(r["step"], self.start_step, self.steps, self.every):
            eta = eta_s(records, self.start_step, self.warmup_steps, self.steps)
            print(progress_line(r, self.steps, self.world, eta), flush=True)


def steady_state(records: list[dict], start_step: int, warmup_steps: int) -> list[dict]:
    """Records after the warm-up steps and outside profiler windows."""
    return [r for r in records if r["step"] >= start_step + warmup_steps and not r["profiled"]]


def _rank_summary(records: list[dict], cfg: Config, start_step: int) -> dict:
    """Medians over this rank's steady-state steps (all steps when there are none)."""
    steady = steady_state(records, start_step, cfg.train.warmup_steps)
    pool = steady or records

    def med(key: str) -> float:
        return statistics.median(r[key] for r in pool) if pool else float("nan")

    def compute_factor(r: dict) -> float:
        # (own + injected) / own work of forward + backward: F when the slowdown did what it says.
        # CPU time where measured (slowdown on CPU), else wall time (CUDA events).
        if r.get("compute_cpu_ms"):
            return (r["compute_cpu_ms"] + r["injected_cpu_ms"]) / r["compute_cpu_ms"]
        compute_ms = r["forward_ms"] + r["backward_ms"]
        own_ms = compute_ms - r["injected_ms"]
        return compute_ms / own_ms if own_ms > 0 else float("nan")

    keys = ("step_time_ms", "forward_ms", "backward_ms", "data_wait_ms", "comm_ms", "mfu", "hfu", "injected_ms")
    factor = statistics.median(compute_factor(r) for r in pool) if pool else float("nan")
    return {k: med(k) for k in keys} | {"steady_steps": len(steady), "compute_factor": factor}


def _print_summary(
    cfg: Config,
    run_dir: Path,
    records: list[dict],
    everyone: list[dict],
    summary: dict,
    start_step: int,
    profiled_steps: list[int],
) -> None:
    print(f"\nreftrain: {len(records)} steps in {summary['wall_s']:.1f} s; ", end="")
    if summary["steady_steps"]:
        print(
            f"steady state = {summary['steady_steps']} steps (without the first {cfg.train.warmup_steps} "
            f"and the {len(profiled_steps)} with the profiler running)"
        )
    else:
        print("no steady-state steps (all in warm-up or profiler windows): no step time, tokens/s or MFU")
    if "summary_error" in summary:
        print(f"  no run figures: {summary['summary_error']}")
    if records and summary["steady_steps"]:
        # The report's figures (docs/metrics.md): median over steady steps of the mean over ranks.
        print(
            f"  median step {summary['step_time_ms']:.1f} ms   {_fmt_rate(summary['tokens_per_s'])} tok/s "
            f"(all ranks)   MFU {summary['mfu']:.1%}   HFU {summary['hfu']:.1%}   final loss {records[-1]['loss']:.4f}"
        )
    elif records:
        print(f"  final loss {records[-1]['loss']:.4f}")
    for i, e in enumerate(everyone):
        r = e["summary"]
        print(
            f"  rank {i}: median forward {r['forward_ms']:.1f} ms, backward {r['backward_ms']:.1f} ms, "
            f"data wait {r['data_wait_ms']:.1f} ms, in collectives {r['comm_ms']:.1f} ms"
        )
    print(f"\nrun directory: {run_dir}")
    print(f"next:  analyzer report {run_dir}\n       dashboard {run_dir.parent}", flush=True)
