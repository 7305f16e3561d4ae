"""The training loop of one rank, recorded on every step by the recorder (docs/record.md).

Reads top to bottom: set up (process group, model, FLOPs and peak,
parallelism, optimizer, resume, data), the recorder opened on the run
directory, then the loop, then the summary. Each step runs the phases
data -> forward -> backward (per micro-batch) -> grad_sync (only with
parallel.overlap_grad_sync=false) -> optimizer, timed by the recorder
(`Recorder.phase`) and annotated for the profiler, and the recorder writes
one metrics record (docs/rundir.md, reftrain.metrics/1). The recorder also
writes run.json, the collective records, telemetry, the profiler windows and
the heartbeat, and stops the run on SIGTERM/SIGINT; reftrain keeps its
model, config, checkpoints, fault injection and console.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel as DDP

import recorder
from analyzer.ingest import formats as fmt
from recorder import manifest
from recorder.hardware import git_state
from recorder.instrument import untimed_collectives, untimed_group
from recorder.ranks import restart_count
from recorder.run import ProfileSchedule
from reftrain import checkpoint, data, flops, parallel, rundir
from reftrain.config import Config, model_shape, resolve
from reftrain.errors import ReftrainError
from reftrain.faults import Faults
from reftrain.inject import Injector
from reftrain.model import Transformer, block_parameter_count, parameter_counts
from reftrain.trackers import Trackers, run_summary

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
                manifest.mark_failed(run_dir, _reason(exc), command, env.world_size)
            raise
    finally:
        parallel.shutdown()


def _reason(exc: BaseException) -> str:
    """run.json's `error` for an exception in the rank: its message (the launcher prints it as one line)."""
    return "interrupted" if isinstance(exc, KeyboardInterrupt) else (str(exc) or type(exc).__name__)


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
) -> None:
    t, device = cfg.train, env.device
    torch.manual_seed(t.seed)  # identical initial weights on every rank (FSDP2 shards them as is)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = t.tf32
        torch.backends.cudnn.allow_tf32 = t.tf32

    # Model, its FLOPs and the peak they are compared with.
    net = Transformer(cfg.model).to(device)
    params = parameter_counts(net)
    m = model_shape(cfg.model)
    fpt = flops.flops_per_token(
        params["non_embedding"],
        block_parameter_count(net),
        m.n_layers,
        m.n_heads,
        m.d_model // m.n_heads,
        m.seq_len,
        m.d_ff,
        t.activation_checkpointing,
    )
    peak = _peak_flops(cfg, env)

    if t.activation_checkpointing:
        parallel.apply_activation_checkpointing(net)
    if t.compile:
        parallel.apply_compile(net, t.compile_backend)
    ddp = cfg.parallel.strategy == "ddp"
    model = parallel.apply_ddp(net, cfg, env) if ddp else parallel.apply_fsdp(net, cfg, env)
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
    injector = Injector(cfg, env.rank, device)
    faults = Faults(cfg.fault, env.rank)
    for line in faults.unreachable(start_step):  # a resumed run can start past the step of a fault
        print(f"reftrain: warning: rank {env.rank}: {line}", file=sys.stderr, flush=True)
    saver = Saver(cfg, env, run_dir, faults)
    records: list[dict] = []  # this rank's metrics lines, as written
    console = None if env.rank != 0 or quiet else Console(cfg, start_step, env.world_size)
    listeners: list[Callable[[dict], None]] = [records.append]
    if console is not None:
        listeners.append(lambda record: console.after(records))
    if trackers is not None:
        listeners.append(trackers.log_step)
    inject = fmt.Inject(slow_rank=cfg.inject.slow_rank, delay_ms=cfg.inject.delay_ms, slowdown=cfg.inject.slowdown)

    # The recorder writes the run directory (docs/record.md): run.json, the metrics, collective and
    # telemetry records, the profiler windows, the heartbeat; reftrain times its own phases.
    rec = recorder.open(
        run_dir.parent,
        run_dir.name,
        model=model,
        optimizer=optimizer,
        existing=True,
        phase_hooks=False,
        steps=t.steps,
        start_step=start_step,
        warmup_steps=t.warmup_steps,
        flops=fmt.Flops.from_json(fpt.to_manifest()),
        peak_flops_per_s=fmt.PeakFlops.from_json(peak.to_manifest()),
        profile=ProfileSchedule(**dataclasses.asdict(cfg.profile)),
        device=device,
        telemetry_interval_ms=cfg.telemetry.interval_ms if cfg.telemetry.enabled else None,
        on_preempt=saver.final_save,
        preempt_signals=(signal.SIGTERM, signal.SIGINT),
        exit_on_preempt=False,
        on_step=listeners,
        run_json={
            "command": command,
            "git": fmt.Git.from_json(git_state(REPO_ROOT)),
            "params": fmt.Params.from_json(params),
            "inject": inject,
            "resumed_from": None
            if resume is None
            else fmt.ResumedFrom(run_dir=str(resumed_from_run), checkpoint=str(resume), step=start_step),
            "tokens_per_step": t.micro_batch_size * m.seq_len * t.grad_accum * env.world_size,
        },
    )
    try:
        saver.rec = rec
        note = rec.manifest.telemetry_note
        if env.rank == 0 and not quiet:
            print(
                f"reftrain: {run_dir}  |  {env.world_size} x {device.type} ({env.backend}), "
                f"{cfg.parallel.strategy}, {params['total'] / 1e6:.2f} M params, "
                f"{fpt.model / 1e6:.1f} MFLOP/token, peak {peak.per_s / 1e12:.3g} TFLOP/s ({peak.source}: {peak.detail})"
            )
            if note and cfg.telemetry.enabled:
                print(f"telemetry: {note}", flush=True)
        if env.rank == 0 and trackers is not None:
            trackers.start(rec.manifest.config or cfg.to_dict(), run_dir.name, restart_count())
        step_fn = TrainStep(cfg, env, model, optimizer, iter(loader), injector, rec)
        wall_start = time.perf_counter()
        preempted = _loop(cfg, rec, step_fn, start_step, faults, saver)
        wall_s = time.perf_counter() - wall_start
        everyone: list = [None] * env.world_size
        with untimed_collectives():  # the ranks' medians for the summary: not training communication
            dist.all_gather_object(everyone, {"summary": _rank_summary(records, cfg, start_step)})
        if cfg.inject.slowdown is not None or cfg.inject.slow_rank is not None:
            # What the injection measured per rank (medians over steady steps): the analyzer and
            # bench_gate read the injected time from here instead of trusting the request.
            inject.measured = {
                "injected_ms": [e["summary"]["injected_ms"] for e in everyone],
                "compute_factor": [e["summary"]["compute_factor"] for e in everyone],
            }
        if preempted:  # the recorder closed the run at the stop, before the ranks' medians were known
            if env.rank == 0 and inject.measured is not None:
                man = manifest.read_manifest(run_dir) or rec.manifest
                man.inject = inject
                manifest.write_json(run_dir / "run.json", man)
        else:
            rec.close(run_json={"inject": inject}, exit_codes=[0] * env.world_size)
    except BaseException as exc:
        rec.close(status="failed", error=_reason(exc))  # nothing when the run is closed already
        raise
    if env.rank == 0:
        status = "preempted" if preempted else "completed"
        summary = run_summary(run_dir, records, wall_s, status)
        _print_summary(cfg, run_dir, records, everyone, summary, start_step, rec.profiled_steps)
        if trackers is not None:
            trackers.finish(summary, status)
        if preempted:
            final = manifest.read_manifest(run_dir)
            if final is not None and final.attempts:
                print(f"reftrain: {final.attempts[-1].cause}", flush=True)


class TrainStep:
    """One optimizer step: the phases data -> forward -> backward (per micro-batch) -> grad_sync ->
    optimizer, each timed by the recorder (`rec.phase`) and annotated for the profiler, between
    the recorder's step marks, which write the metrics record. The loop (and
    bench/bench_reftrain.py) call `run(step)`; checkpoints stay in the loop.
    """

    def __init__(
        self,
        cfg: Config,
        env: parallel.DistEnv,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
        injector: Injector,
        rec: recorder.Recorder,
    ) -> None:
        self.cfg, self.env, self.model, self.optimizer = cfg, env, model, optimizer
        self.batches, self.injector, self.rec = batches, injector, rec
        self.params = [q for q in model.parameters() if q.requires_grad]
        self.autocast = _autocast(cfg, env)
        self.tokens = cfg.train.micro_batch_size * model_shape(cfg.model).seq_len * cfg.train.grad_accum
        self.vocab_size = model_shape(cfg.model).vocab_size

    def run(self, step: int) -> dict | None:
        """Train step `step`; returns the reftrain.metrics/1 record written (None when the recorder records nothing)."""
        cfg, env, model, rec = self.cfg, self.env, self.model, self.rec
        t, p, device = cfg.train, cfg.parallel, env.device
        ddp = p.strategy == "ddp"
        rec.step_start()  # the canary probe, when due, runs here: before the step's clocks start
        lr = lr_at(step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.injector.start_step()
        loss_sum = torch.zeros((), device=device)
        for micro in range(t.grad_accum):
            last = micro == t.grad_accum - 1
            with rec.phase("data", host_clock=True):
                x, y = next(self.batches)
                if cfg.data.path is not None:
                    data.check_batch(x, self.vocab_size, cfg.data.path)
                    data.check_batch(y, self.vocab_size, cfg.data.path)
                x = x.to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
            sync: contextlib.AbstractContextManager[Any]
            if ddp:
                # Gradients are all-reduced only in the last micro-batch's backward (or after it).
                sync = contextlib.nullcontext() if (last and p.overlap_grad_sync) else cast(DDP, model).no_sync()
            else:
                cast(FSDPModule, model).set_requires_gradient_sync(last)
                sync = contextlib.nullcontext()
            with sync:
                with rec.phase("forward"), self.injector.compute("forward", first_forward=micro == 0):
                    with self.autocast:
                        loss = model(x, y)
                with rec.phase("backward"), self.injector.compute("backward"):
                    (loss / t.grad_accum).backward()
            loss_sum += loss.detach()
        if ddp and not p.overlap_grad_sync:
            with rec.phase("grad_sync"):
                parallel.allreduce_gradients(self.params, p.bucket_cap_mb, env.world_size)
        with rec.phase("optimizer"):
            grad_norm = None
            if cfg.optim.grad_clip > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.optim.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        if grad_norm is not None and hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        injector = self.injector
        return rec.step_end(
            tokens=self.tokens,
            loss=loss_sum.item() / t.grad_accum,
            lr=lr,
            grad_norm=grad_norm,
            extra={
                "injected_ms": injector.injected_ms,
                "injected_forward_ms": injector.injected["forward"],
                "injected_backward_ms": injector.injected["backward"],
                # Slowdown on CPU: CPU time of forward + backward's own work and of the injected work.
                "compute_cpu_ms": injector.compute_cpu_ms if injector.compute_cpu_ms else None,
                "injected_cpu_ms": injector.injected_cpu_ms if injector.compute_cpu_ms else None,
            },
        )


def _loop(
    cfg: Config,
    rec: recorder.Recorder,
    step_fn: TrainStep,
    start_step: int,
    faults: Faults | None = None,
    saver: Saver | None = None,
) -> bool:
    """Run the steps; returns whether a signal stopped them (the recorder then saved the state
    after the last step run, through `Saver.final_save`, and closed the run as preempted)."""
    t = cfg.train
    for step in range(start_step, t.steps):
        if faults is not None:
            faults.step_start(step)
        step_fn.run(step)
        if rec.closed:
            return True
        if saver is not None and t.checkpoint_every and (step + 1) % t.checkpoint_every == 0:
            saver.save(step + 1)
    rec.wait_saves()
    if faults is not None:
        faults.step_start(t.steps)  # "step train.steps": after the last step and its checkpoint
    return False


class Saver:
    """The loop's checkpoint saves, synchronous or asynchronous (checkpoint.async_save), each inside
    the recorder's `saving()` block: its stall goes to run.json's `checkpoint_saves`; an
    asynchronous save's write goes on after the block (`Recorder.save_pending`), and the recorder
    records it, with `complete_s`, once published (checked after every step; waited for before
    the next save and at the end). The fault hooks run just before a save is published.
    """

    def __init__(self, cfg: Config, env: parallel.DistEnv, run_dir: Path, faults: Faults | None) -> None:
        self.env, self.run_dir, self.faults = env, run_dir, faults
        self.rec: recorder.Recorder | None = None  # set once the recorder is open
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

    def save(self, step: int) -> None:
        """Save the state after `step` steps as checkpoints/step{step}. Collective."""
        assert self.rec is not None
        with self.rec.saving():
            self._write(step)

    def final_save(self, step: int) -> str:
        """The save when a signal stops the run (the recorder's `on_preempt`, inside its `saving()`);
        returns what run.json's cause says of it."""
        self._write(step)
        return f"checkpoint checkpoints/step{step} (reftrain --resume {self.run_dir} continues)"

    def _write(self, step: int) -> None:
        assert self.rec is not None
        t0 = time.perf_counter()
        model, optimizer = self.rec.model, self.rec.optimizer
        if self.async_save:
            try:
                pending = checkpoint.save_async(self.run_dir, step, model, optimizer, self.group)
            except Exception as exc:  # noqa: BLE001 - DCP's async path refused: say so once, save synchronously
                self.async_save = False
                _say(
                    self.env,
                    f"  checkpoint: async_save failed ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}); saving synchronously from now on",
                )
            else:
                pending.stall_s = time.perf_counter() - t0
                self.rec.save_pending(lambda wait: self._complete(pending, wait))
                _say(self.env, f"  checkpoint step{step}: staged in {pending.stall_s:.2f} s, writing in the background")
                return
        path = checkpoint.save(self.run_dir, step, model, optimizer, before_publish=self._before_publish)
        _say(
            self.env, f"  checkpoint {path.relative_to(self.run_dir.parent)} saved in {time.perf_counter() - t0:.1f} s"
        )

    def _complete(self, p: checkpoint.PendingSave, wait: bool) -> bool:
        """Publish the asynchronous save `p` once its write has completed; whether it has."""
        if not checkpoint.finish_async(self.run_dir, p, wait, self._before_publish):
            return False
        _say(
            self.env,
            f"  checkpoint {p.path.relative_to(self.run_dir.parent)} published "
            f"{time.perf_counter() - p.started_s:.1f} s after it began (the loop stalled {p.stall_s:.2f} s)",
        )
        return True


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
