"""The recorder: one object that a training loop opens, marks each step on, and closes.

It writes the run directory of docs/rundir.md (the format reftrain writes and
the analyzer, the dashboard and the trackers read): run.json, config.yaml,
metrics/rank{R}.jsonl, collectives/rank{R}.jsonl, telemetry/gpu{R}.jsonl on
GPUs, traces/step{N}/rank{R}.pt.trace.json.gz, heartbeat/rank{R}.json.
docs/record.md says what each measurement is.

Failure policy: the recorder must never be why a training run dies or loses
what it wrote. A problem with the recorder's own files (a trace that cannot
be written, a rank that never opened the recorder) is one line on stderr and
the run goes on; a mistake in how the loop marks steps is one line and the
mark is ignored; an exception in the user's loop marks the run failed and
propagates unchanged.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from analyzer.ingest import formats as fmt
from recorder import manifest, peak
from recorder.canary import Canary
from recorder.clock import align_clocks
from recorder.errors import RecorderError
from recorder.flops import StepFlopCounter
from recorder.hardware import describe_hardware, git_state
from recorder.heartbeat import Heartbeat
from recorder.instrument import (
    CollectiveTimer,
    JsonlWriter,
    PhaseTimer,
    peak_reserved_bytes,
    process_memory_bytes,
    untimed_collectives,
)
from recorder.profiling import StepProfiler
from recorder.ranks import Meeting, Place, max_restarts, restart_count, this_place
from recorder.telemetry import GpuTelemetry, nvml_index_of

# The phases of a step: the hooks time forward, backward and optimizer; a loop that times its phases
# itself (`Recorder.phase`) may also time its batch fetch (`data`) and an explicit gradient all-reduce.
PHASES = ("data", "forward", "backward", "grad_sync", "optimizer")
# run.json fields a loop may set at open or close (`run_json=`): what the loop knows better than the
# recorder. The rest (status, files, attempts, clock, ...) is the recorder's to write.
RUN_JSON_FIELDS = ("command", "git", "params", "inject", "resumed_from", "tokens_per_step")
# Metrics fields a loop may add to a step's record (`step_end(extra=...)`): what only the loop measures.
EXTRA_STEP_FIELDS = (
    "injected_ms",
    "injected_forward_ms",
    "injected_backward_ms",
    "compute_cpu_ms",
    "injected_cpu_ms",
)
# The heartbeat file is rewritten at most this often (seconds) by a background thread.
BEAT_EVERY_S = 0.5
# How long open() and close() wait for the other ranks (their keys on the store).
MEET_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ProfileSchedule:
    """When torch.profiler records (torch.profiler.schedule's terms, counted from the first step).

    The default is one small window: steps 6 and 7 are traced (after 5 idle
    steps and 1 warm-up step), written to traces/step7/rank{R}.pt.trace.json.gz.
    Those steps run slower and are left out of steady-state statistics.
    """

    enabled: bool = True
    wait: int = 5
    warmup: int = 1
    active: int = 2
    repeat: int = 1  # windows; 0 = until the end
    record_shapes: bool = True  # the analyzer's FLOP count from the trace needs the shapes
    memory: bool = False
    with_stack: bool = False


def _say(text: str) -> None:
    print(f"recorder: {text}", file=sys.stderr, flush=True)


def _yaml_safe(value: Any) -> Any:
    """The user's config as plain YAML values: dataclasses and namespaces as dicts, the rest as text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    elif hasattr(value, "__dict__") and not isinstance(value, (dict, list, tuple, str, int, float, bool)):
        value = vars(value)
    if isinstance(value, dict):
        return {str(k): _yaml_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_yaml_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _default_name(model: torch.nn.Module | None, world_size: int) -> str:
    """`YYYYmmdd-HHMMSS-<model class>-w<world>`; under torchelastic the rendezvous id replaces
    the time, so that every attempt of a restarted job writes into the same directory."""
    what = type(model).__name__.lower() if model is not None else "run"
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        what = type(model.module).__name__.lower()
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    if job and job != "none" and "TORCHELASTIC_RESTART_COUNT" in os.environ:
        return f"{what}-{job}-w{world_size}"
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{what}-w{world_size}"


def _param_counts(model: torch.nn.Module | None) -> fmt.Params | None:
    """Total parameters, those of nn.Embedding modules, and the rest (non-embedding)."""
    if model is None:
        return None
    total = sum(p.numel() for p in model.parameters())
    embedding = sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters())
    return fmt.Params(total=total, non_embedding=total - embedding, embedding=embedding)


class _Beats:
    """This rank's heartbeat written behind the loop: a step's start and end only note the progress
    and its time (no file I/O on the loop's thread); a thread writes the latest note every
    BEAT_EVERY_S, so the file lags the loop by at most that, and a rank blocked in a collective
    leaves its last progress with the time it was reached, which is what the hang watchdog reads.
    Set-up, checkpoint and done are written at once."""

    def __init__(self, heartbeat: Heartbeat) -> None:
        import threading

        self.heartbeat = heartbeat
        self.latest: tuple[int, str, float] | None = None
        self._written: tuple[int, str, float] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="recorder-heartbeat", daemon=True)
        self._thread.start()

    def note(self, step: int, phase: str) -> None:
        self.latest = (step, phase, time.time())

    def now(self, step: int, phase: str) -> None:
        self.note(step, phase)
        self._write()

    def _run(self) -> None:
        while not self._stop.wait(BEAT_EVERY_S):
            try:
                self._write()
            except OSError as exc:  # a full disk must not end the run; the watchdog then sees an old beat
                _say(f"{self.heartbeat.path}: cannot write the heartbeat: {exc.strerror or exc}")
                return

    def _write(self) -> None:
        with self._lock:
            latest = self.latest
            if latest is not None and latest is not self._written:
                self.heartbeat.beat(*latest[:2], at=latest[2])
                self._written = latest

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.heartbeat.close()


class _PendingSave:
    """A checkpoint save whose write goes on in the background after its `rec.saving()` block."""

    __slots__ = ("step", "stall_s", "started_s", "done")

    def __init__(self, step: int, started_s: float, done: Callable[[bool], bool]) -> None:
        self.step, self.started_s, self.done = step, started_s, done
        self.stall_s = 0.0


class Step:
    """What `Recorder.step()` yields: set `loss` (and `lr`, `grad_norm`) inside the block."""

    __slots__ = ("tokens", "loss", "lr", "grad_norm")

    def __init__(self, tokens: int | None) -> None:
        self.tokens = tokens
        self.loss: Any = None
        self.lr: float | None = None
        self.grad_norm: Any = None


class Recorder:
    """An open run directory that one rank records into. Make it with `recorder.open(...)`.

    Per step, either `with rec.step(tokens=N) as s: ...; s.loss = loss`, or
    `rec.step_start()` ... `rec.step_end(tokens=N, loss=loss)`. Checkpoint saves
    go in `with rec.saving(): ...`. `rec.close()` ends the run (also at the end of
    a `with recorder.open(...) as rec:` block, failed when the block raised).
    """

    def __init__(
        self,
        runs_dir: str | os.PathLike[str],
        name: str | None = None,
        config: Any = None,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        steps: int | None = None,
        start_step: int = 0,
        warmup_steps: int = 3,
        flops: fmt.Flops | None = None,
        peak_flops_per_s: float | fmt.PeakFlops | None = None,
        profile: ProfileSchedule | None = None,
        device: torch.device | str | None = None,
        telemetry_interval_ms: int | None = 100,
        on_preempt: Callable[[int], str | None] | None = None,
        meet_timeout_s: float = MEET_TIMEOUT_S,
        ddp_comm_hook: bool = True,
        existing: bool = False,
        phase_hooks: bool = True,
        run_json: dict[str, Any] | None = None,
        on_step: Sequence[Callable[[dict], None]] = (),
        preempt_signals: Sequence[int] = (signal.SIGTERM,),
        exit_on_preempt: bool = True,
    ) -> None:
        self.place: Place = this_place()
        self.existing = existing
        if existing and name is None:
            raise RecorderError("recorder.open(existing=True) needs the run directory's name (name=...)")
        unknown = sorted(set(run_json or {}) - set(RUN_JSON_FIELDS))
        if unknown:
            raise RecorderError(
                f"recorder.open(run_json=...): {', '.join(unknown)} not settable; one of {', '.join(RUN_JSON_FIELDS)}"
            )
        self.on_step = tuple(on_step)
        self.preempt_signals = tuple(preempt_signals)
        self.exit_on_preempt = exit_on_preempt
        self.attempt = restart_count()
        self.model, self.optimizer = model, optimizer
        self.warmup_steps, self.steps_planned = warmup_steps, steps
        self.on_preempt = on_preempt
        self.device = torch.device(device) if device is not None else _model_device(model)
        self.flops = flops
        self.closed = False
        self.status: str | None = None
        self._start_time = manifest.utc_now()
        self._meeting = Meeting(meet_timeout_s) if self.place.distributed and self.place.world_size > 1 else None
        # False when some rank never opened the recorder: no collective may then be issued.
        self.all_ranks = self._meeting is None
        run_dir = self._agree_on_run_dir(Path(runs_dir), name, config, model)
        # False on a rank whose rank 0 never opened the recorder: there is no run to record into,
        # and every call is then a no-op, so the user's training goes on.
        self.recording = run_dir is not None
        if run_dir is None:
            _say(
                f"rank {self.place.rank}: rank 0 did not open the recorder within {meet_timeout_s:.0f} s: "
                "not recording (call recorder.open on every rank)"
            )
            return
        self.run_dir = run_dir
        self._everyone_here()
        rank = self.place.rank
        sub = fmt.attempt_folder(self.attempt)
        self.step_index = start_step
        self.start_step = start_step
        self._metrics_rel = fmt.records_file("metrics", rank, self.attempt)
        self._colls_rel = fmt.records_file("collectives", rank, self.attempt)
        self._metrics = JsonlWriter(self.run_dir / self._metrics_rel)
        # Collectives are timed only when every rank records (see _time_collectives); else no file for them.
        timed = self.place.distributed and self.all_ranks
        self._colls = JsonlWriter(self.run_dir / self._colls_rel) if timed else None
        self.timer = CollectiveTimer(self._colls or _NO_RECORDS, rank, self.device)
        self.collective_timing = self._time_collectives(model, ddp_comm_hook)
        self.phases = PhaseTimer(self.device, PHASES)
        self.heartbeat = _Beats(Heartbeat(self.run_dir, rank, self.attempt))
        self.profiler = StepProfiler(
            profile or ProfileSchedule(), rank, self.run_dir / "traces" / sub, self.device, self.step_index
        )
        # The machine-speed canary on CPU runs, where the steps' work is host CPU time (docs/record.md,
        # "Machine speed"); before the last step only when the loop said how many steps it runs.
        self.canary = Canary(start_step, None if steps is None else steps - 1) if self.device.type == "cpu" else None
        self._canary_ms: tuple[float, float] | None = None  # (wall, CPU) of the probe before this step
        self._telemetry, self._telemetry_files, telemetry_note = self._start_telemetry(telemetry_interval_ms)
        self._hooks: list[Any] = []
        if phase_hooks:
            self._hook_model(model, optimizer)
        self._clock = (
            align_clocks().to_dict()
            if self.all_ranks
            else {
                "offsets_ns": [0],
                "uncertainty_ns": None,
                "method": "not aligned: not every rank opened the recorder",
            }
        )
        hardware = self._gather_hardware()
        self.peak = self._peak(peak_flops_per_s)
        self._man = self._first_manifest(config, hardware, telemetry_note)
        for key, value in (run_json or {}).items():
            setattr(self._man, key, value)
        if rank == 0:
            self._write_manifest()
        # Per-step state.
        self._in_step = False
        self._boundary_ns: int | None = None  # end of the last step or save: the next step's time starts here
        self._step_start_ns = 0
        self._compute_start_ns: int | None = None
        self._cpu_start_s = 0.0
        self._fwd: Any = None
        self._opt: Any = None
        self._bwd: Any = None
        self.records_written = 0
        self._write_failed = False
        self.last_step: int | None = None
        self.tokens_per_step: int | None = None
        self.profiled_steps: list[int] = []
        self._preempt_signal: int | None = None
        # The ranks' agreement on a signal, issued after one step and read after the next (see _check_preemption).
        self._agreement: tuple[Any, torch.Tensor] | None = None
        # Without FLOPs given, the first step runs under a FLOP counter (recorder.flops).
        self._flop_counter: StepFlopCounter | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._pending_save: _PendingSave | None = None
        self._in_saving: _PendingSave | None = None  # the `saving()` block in progress
        self._install_signal_handlers()
        self.profiler.__enter__()
        self.heartbeat.now(self.step_index, "setup")

    @property
    def manifest(self) -> fmt.RunManifest:
        """run.json as this rank knows it (rank 0 writes it): what the recorder wrote at open and since."""
        return self._man

    # -- set-up ---------------------------------------------------------------

    def _agree_on_run_dir(
        self, runs_dir: Path, name: str | None, config: Any, model: torch.nn.Module | None
    ) -> Path | None:
        """Rank 0 creates (or, in a restarted attempt, reopens) the directory; the others read its path
        (None when rank 0 did not post it within the timeout)."""
        place = self.place
        if place.world_size > 1 and not place.distributed:
            raise RecorderError(
                f"recorder.open: WORLD_SIZE={place.world_size} but torch.distributed is not "
                "initialized; call torch.distributed.init_process_group before recorder.open "
                "(the ranks agree on the run directory through it)"
            )
        if self.existing:
            assert name is not None
            path = runs_dir / name
            if not (path / "config.yaml").is_file():
                raise RecorderError(
                    f"recorder.open(existing=True): {path}: no config.yaml (not a prepared run directory)"
                )
            return path
        if place.rank == 0:
            path = self._create_run_dir(runs_dir, name, config, model)
            if self._meeting is not None:
                self._meeting.post("run_dir", str(path))
            return path
        assert self._meeting is not None
        found = self._meeting.wait("run_dir")
        return None if found is None else Path(found)

    def _create_run_dir(self, runs_dir: Path, name: str | None, config: Any, model: torch.nn.Module | None) -> Path:
        import yaml

        base = name or _default_name(model, self.place.world_size)
        if self.attempt > 0 and (runs_dir / base / "run.json").is_file():
            return runs_dir / base  # torchelastic restarted the job: the attempts share the directory
        text = yaml.safe_dump(
            _yaml_safe(config if config is not None else {}), sort_keys=False, default_flow_style=False
        )
        return manifest.create_run_dir(runs_dir, base, explicit=name is not None, config_yaml=text)

    def _everyone_here(self) -> None:
        """Rank 0 learns whether every rank opened the recorder (and tells them), within the timeout."""
        meeting = self._meeting
        if meeting is None:
            return
        rank, world = self.place.rank, self.place.world_size
        meeting.post(f"open/{rank}", True)
        if rank == 0:
            missing = [r for r in range(1, world) if meeting.wait(f"open/{r}") is None]
            if missing:
                _say(
                    f"rank(s) {', '.join(map(str, missing))} of {world} did not open the recorder within "
                    f"{meeting.timeout_s:.0f} s: recording the ranks that did (call recorder.open on every rank)"
                )
            meeting.post("all_ranks", not missing)
            self.all_ranks = not missing
        else:
            self.all_ranks = bool(meeting.wait("all_ranks", timeout_s=2 * meeting.timeout_s))

    def _time_collectives(self, model: torch.nn.Module | None, ddp_comm_hook: bool) -> str:
        """Install the collective timer; returns run.json's `collective_timing`."""
        if not (self.place.distributed and self.all_ranks):
            return (
                "none: not a distributed run"
                if not self.place.distributed
                else "none: not every rank opened the recorder"
            )
        what = []
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            own = model._get_ddp_logging_data().get("comm_hook")
            if not ddp_comm_hook:
                what.append(
                    "not DDP's bucket all-reduces (recorder.open(ddp_comm_hook=False): DDP's own C++ "
                    "all-reduce, untimed)"
                )
            elif own:  # the model has a comm hook of its own (compression, ...): it stays, untimed
                what.append(f"not DDP's bucket all-reduces (the model has its own comm hook, {own})")
            else:
                try:
                    model.register_comm_hook(None, self.timer.ddp_comm_hook)
                    what.append("DDP comm hook (averaging all-reduce per gradient bucket)")
                except RuntimeError as exc:  # DDP refused it (e.g. registered after the first step)
                    what.append(f"not DDP's bucket all-reduces (DDP refused the comm hook: {str(exc).splitlines()[0]})")
        try:
            self.timer.install()
            what.append("torch.distributed collective functions wrapped")
        except RecorderError as exc:  # another timer is installed in this process (a second recorder)
            _say(f"collective timing: {exc}")
        return "; ".join(what) or "none"

    def _start_telemetry(self, interval_ms: int | None) -> tuple[GpuTelemetry | None, list[str], str | None]:
        if interval_ms is None:
            return None, [], "telemetry disabled (recorder.open(telemetry_interval_ms=None))"
        if self.device.type != "cuda":
            return None, [], "CPU run: no GPU to sample (metrics hold each step's process CPU time, cpu_ms)"
        ok, reason = GpuTelemetry.available()
        if not ok:
            return None, [], reason
        rel = fmt.records_file("telemetry", self.place.rank)
        try:
            sampler = GpuTelemetry(self.run_dir / rel, nvml_index_of(self.device), interval_ms)
            sampler.start()
        except RecorderError as exc:
            return None, [], str(exc)
        return sampler, [rel], None

    def _hook_model(self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None) -> None:
        """Forward and backward times from hooks on the model's root module; optimizer time from the
        optimizer's step hooks. Nothing about the model's computation changes."""
        if model is not None:
            self._hooks.append(model.register_forward_pre_hook(self._forward_start))
            self._hooks.append(model.register_forward_hook(self._forward_end))
        if optimizer is not None:
            self._hooks.append(optimizer.register_step_pre_hook(self._optimizer_start))
            self._hooks.append(optimizer.register_step_post_hook(self._optimizer_end))

    def _gather_hardware(self) -> list[dict]:
        mine = describe_hardware(self.device)
        if not self.all_ranks or not self.place.distributed:
            return [mine]
        everyone: list = [None] * self.place.world_size
        with untimed_collectives():
            torch.distributed.all_gather_object(everyone, mine)
        return everyone

    def _peak(self, given: float | fmt.PeakFlops | None) -> fmt.PeakFlops | None:
        """The given peak, else the datasheet's for a known GPU, else an fp32 (TF32 where CUDA allows it)
        matmul measured on every rank at once, the max over ranks (as reftrain measures it: on a shared
        CPU the ranks share cores, as they will while training)."""
        if isinstance(given, fmt.PeakFlops):  # the loop's own (its dtype's datasheet peak, its measurement)
            return given
        if given is not None:
            return fmt.PeakFlops(
                per_s=float(given), source="override", detail="recorder.open(peak_flops_per_s=...)", dtype=None
            )
        dtype = peak.peak_dtype("fp32", self.device.type, bool(torch.backends.cuda.matmul.allow_tf32))
        if self.device.type == "cuda":
            found = peak.table_peak(torch.cuda.get_device_name(self.device), dtype)
            if found is not None:
                return fmt.PeakFlops.from_json(found.to_manifest())
        measured = peak.measure_matmul_peak(self.device, dtype)
        per_s, detail = measured.per_s, measured.detail
        if self.place.distributed and self.all_ranks and self.place.world_size > 1:
            value = torch.tensor(
                [per_s], dtype=torch.float64, device=self.device if self.place.backend == "nccl" else "cpu"
            )
            with untimed_collectives():  # not training communication
                torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
            per_s = float(value.item())
            detail += f", max over {self.place.world_size} ranks measuring at once"
        return fmt.PeakFlops(per_s=per_s, source="measured", detail=detail, dtype=dtype)

    def _first_manifest(self, config: Any, hardware: list[dict], telemetry_note: str | None) -> fmt.RunManifest:
        hw0 = hardware[0]
        argv0 = Path(sys.argv[0]).resolve().parent if sys.argv and sys.argv[0] else Path.cwd()
        man = fmt.RunManifest(
            schema=manifest.SCHEMA,
            run_id=self.run_dir.name,
            status="running",
            start_time=self._start_time,
            end_time=None,
            git=fmt.Git.from_json(git_state(argv0)),
            command=list(sys.argv),
            config=manifest.saved_config_dict(self.run_dir),
            world_size=self.place.world_size,
            backend=self.place.backend,
            hardware=fmt.Hardware(
                device_type=self.device.type,
                device_names=[h["device_name"] for h in hardware],
                device_memory_bytes=min(
                    (h["device_memory_bytes"] for h in hardware if h["device_memory_bytes"]), default=None
                ),
                cpu_model=hw0["cpu_model"],
                cpu_cores=hw0["cpu_cores"],
                cpu_cores_usable=hw0["cpu_cores_usable"],
                hostnames=[h["hostname"] for h in hardware],
            ),
            torch_version=torch.__version__,
            params=_param_counts(self.model),
            flops=self.flops,
            peak_flops=self.peak,
            tokens_per_step=None,
            steps=self.steps_planned,
            start_step=self.step_index,
            warmup_steps=self.warmup_steps,
            # The planned windows until close lists the steps that ran in one.
            profiled_steps=[]
            if self.steps_planned is None
            else [s for s in range(self.step_index, self.steps_planned) if self.profiler.collecting(s)],
            clock=fmt.Clock.from_json(self._clock),
            inject=fmt.Inject(),
            resumed_from=None,
            telemetry_note=telemetry_note,
            files=manifest.files_listing(self.run_dir, []),
            schemas=dict(manifest.SCHEMAS),
            max_restarts=max_restarts(),
            attempts=manifest.attempts_so_far(self.run_dir, self.attempt, self._start_time, self.step_index),
            collective_timing=self.collective_timing,
        )
        if self.attempt > 0:  # the first attempt's start, and what earlier attempts recorded
            previous = manifest.read_manifest(self.run_dir) or fmt.RunManifest()
            man.start_time = previous.start_time or self._start_time
            man.checkpoint_saves = previous.checkpoint_saves
            man.hangs = previous.hangs
            if previous.files.metrics:  # the earlier attempts' files stay listed should this one die
                man.files = previous.files
        return man

    def _write_manifest(self) -> None:
        try:
            manifest.write_json(self.run_dir / "run.json", self._man)
        except OSError as exc:
            _say(f"{self.run_dir / 'run.json'}: cannot write: {exc.strerror or exc}")

    # -- hooks ----------------------------------------------------------------

    def _forward_start(self, module: Any, args: Any) -> None:
        if not self._in_step or self._fwd is not None:
            return
        if self._compute_start_ns is None:
            self._compute_start_ns = time.perf_counter_ns()
        self._fwd = self.phases.phase("forward").__enter__()

    def _forward_end(self, module: Any, args: Any, output: Any) -> None:
        if self._fwd is None:
            return
        self._fwd.__exit__(None, None, None)
        self._fwd = None
        if torch.is_grad_enabled():
            tensor = _first_grad_tensor(output)
            if tensor is not None:
                tensor.register_hook(self._backward_start)

    def _backward_start(self, grad: Any) -> None:
        # The gradient has reached the model's output: backward through the model starts. The
        # engine runs the queued callback when this backward pass has finished.
        if self._in_step and self._bwd is None:
            self._bwd = self.phases.phase("backward").__enter__()
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)

    def _backward_end(self) -> None:
        if self._bwd is not None:
            self._bwd.__exit__(None, None, None)
            self._bwd = None

    def _optimizer_start(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._in_step and self._opt is None:
            self._opt = self.phases.phase("optimizer").__enter__()

    def _optimizer_end(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._opt is not None:
            self._opt.__exit__(None, None, None)
            self._opt = None

    # -- the steps ------------------------------------------------------------

    def phase(self, name: str, host_clock: bool = False) -> Any:
        """A context manager timing one block of the step as phase `name` (`data`, `forward`,
        `backward`, `grad_sync`, `optimizer`), for a loop that times its phases itself
        (`recorder.open(..., phase_hooks=False)`); blocks of one phase add up within a step, and
        each is annotated as `name` in a profiler window. CUDA: timed by events on the current
        stream unless `host_clock` (a block that waits on the host, the batch fetch)."""
        if name not in PHASES:
            raise RecorderError(f"Recorder.phase({name!r}): not one of {', '.join(PHASES)}")
        return self.phases.phase(name, host_clock)

    def step_start(self) -> None:
        """Mark the start of a training step (after the batch is in hand, or before: the forward
        pass's start is the compute's start when the model was given)."""
        if not self.recording:
            return
        if self.closed:
            _say("step_start after close: ignored")
            return
        if self._in_step:
            _say(f"step_start called twice for step {self.step_index} (no step_end between): the second is ignored")
            return
        self._in_step = True
        self._canary_ms = None
        if (
            self.canary is not None
            and self.canary.due(self.step_index)
            and not self.profiler.collecting(self.step_index)
        ):
            probe_start = time.perf_counter_ns()
            self._canary_ms = self.canary.probe()
            if self._boundary_ns is not None:  # the probe's time is no part of the step's, nor of its data wait
                self._boundary_ns += time.perf_counter_ns() - probe_start
        self.timer.set_step(self.step_index)
        self.heartbeat.note(self.step_index, "start")
        now = time.perf_counter_ns()
        if self._boundary_ns is None:
            self._boundary_ns = now
        self._step_start_ns = now
        self._compute_start_ns = None
        self._cpu_start_s = time.process_time()
        self.phases.start_step()
        if self.flops is None and self.step_index == self.start_step:
            self._flop_counter = StepFlopCounter().__enter__()

    def step_end(
        self,
        tokens: int | None = None,
        loss: Any = None,
        lr: float | None = None,
        grad_norm: Any = None,
        extra: dict[str, float | None] | None = None,
    ) -> dict | None:
        """Mark the end of the step: writes its metrics record and returns it (its JSON object; None
        when nothing was recorded). `tokens`: tokens this rank processed in the step; `loss` a float
        or a 0-d tensor (read with .item()); `lr` defaults to the optimizer's first parameter
        group's; `grad_norm` as returned by clip_grad_norm_; `extra`: fields only the loop measures
        (EXTRA_STEP_FIELDS: the time and CPU time of work it injected)."""
        if not self.recording:
            return None
        if self.closed:
            _say("step_end after close: ignored")
            return None
        if not self._in_step:
            _say(f"step_end without step_start (step {self.step_index}): ignored")
            return None
        extra = dict(extra or {})
        for key in sorted(set(extra) - set(EXTRA_STEP_FIELDS)):
            _say(f"step_end(extra={{{key!r}: ...}}): not one of {', '.join(EXTRA_STEP_FIELDS)}: ignored")
            del extra[key]
        self._close_open_phases()
        step = self.step_index
        if self._flop_counter is not None:
            self._flop_counter.__exit__(None, None, None)
            counted = self._flop_counter.result(tokens=tokens, step=step)
            self._flop_counter = None
            if counted.model > 0:
                self.set_flops(counted.to_manifest())
            else:  # MFU 0 would be wrong, not small: the loop's ops ran elsewhere or not at all
                _say(
                    f"step {step} ran no operation with a FLOP formula (matmul, convolution, attention): "
                    "MFU withheld; pass flops= to recorder.open to give them"
                )
        times = self.phases.end_step()
        self._in_step = False
        boundary = self._boundary_ns if self._boundary_ns is not None else self._step_start_ns
        compute_start = self._compute_start_ns if self._compute_start_ns is not None else self._step_start_ns
        step_time_ms = times["step_time_ms"] + (self._step_start_ns - boundary) / 1e6
        cpu_ms = (time.process_time() - self._cpu_start_s) * 1e3
        mem_reserved = peak_reserved_bytes(self.device)
        mem_bytes, mem_kind = process_memory_bytes(self.device, reset_peak=True)
        if lr is None and self.optimizer is not None and self.optimizer.param_groups:
            lr = self.optimizer.param_groups[0].get("lr")
        step_s = step_time_ms / 1e3
        profiled = self.profiler.collecting(step)
        line = fmt.MetricsLine(
            step=step,
            rank=self.place.rank,
            loss=_number(loss),
            step_time_ms=step_time_ms,
            cpu_ms=cpu_ms,
            # Before the compute's start, plus the blocks a loop timed as `data` inside the step.
            data_wait_ms=(compute_start - boundary) / 1e6 + times["data_ms"],
            forward_ms=times["forward_ms"],
            backward_ms=times["backward_ms"],
            optimizer_ms=times["optimizer_ms"],
            grad_sync_ms=times["grad_sync_ms"],
            comm_ms=self.timer.step_comm_ms(step),
            tokens=tokens,
            tokens_per_s=tokens / step_s if tokens is not None and step_s > 0 else None,
            mfu=self._mfu(tokens, step_s, "per_token"),
            hfu=self._mfu(tokens, step_s, "per_token_hardware"),
            mem_bytes=mem_bytes,
            mem_kind=mem_kind,
            mem_reserved_bytes=mem_reserved,
            profiled=profiled,
            lr=None if lr is None else float(lr),
            grad_norm=_number(grad_norm),
            canary_ms=None if self._canary_ms is None else self._canary_ms[0],
            canary_cpu_ms=None if self._canary_ms is None else self._canary_ms[1],
            time_ns=time.time_ns(),
            attempt=self.attempt,
        )
        for key, value in extra.items():
            setattr(line, key, value)
        record = line.to_json()
        self._write_records(record)
        self.records_written += 1
        self.last_step = step
        if profiled:
            self.profiled_steps.append(step)
        if tokens is not None and self.tokens_per_step is None:
            # Every rank is taken to process as many tokens as this one (data parallelism).
            self.tokens_per_step = tokens * self.place.world_size
            if self.place.rank == 0:
                self._man.tokens_per_step = self.tokens_per_step
                self._write_manifest()
        self.heartbeat.note(step, "end")
        for listener in self.on_step:  # outside every step's clock, as the trace export below
            listener(record)
        exports = self.profiler.action(step) == torch.profiler.ProfilerAction.RECORD_AND_SAVE
        self.profiler.step_done(step)
        self.step_index = step + 1
        self._poll_save(wait=False)
        if exports and self._agrees_by_collective():
            self._meet()
        self._boundary_ns = time.perf_counter_ns()
        self._check_preemption()
        return record

    def _write_records(self, record: dict) -> None:
        """Append the step's metrics line and the completed collectives. A write that fails (disk
        full) is one line, once; the records are then dropped and training goes on."""
        if self._write_failed:
            return
        try:
            self._metrics.write(record)
            self._metrics.flush()
            self.timer.flush()
        except OSError as exc:
            self._write_failed = True
            _say(
                f"rank {self.place.rank}: {self.run_dir / self._metrics_rel}: cannot write the step records "
                f"from step {record['step']} on: {exc.strerror or exc}; training goes on unrecorded"
            )

    @contextmanager
    def step(self, tokens: int | None = None) -> Iterator[Step]:
        """One training step: `with rec.step(tokens=N) as s: ...; s.loss = loss`."""
        self.step_start()
        mark = Step(tokens)
        try:
            yield mark
        except BaseException:
            if self.recording:
                self._in_step_failed()
            raise
        self.step_end(tokens=mark.tokens, loss=mark.loss, lr=mark.lr, grad_norm=mark.grad_norm)

    def _in_step_failed(self) -> None:
        """The user's step raised: close the open phases so the step's hooks leave no state behind."""
        self._close_open_phases()
        if self._flop_counter is not None:  # the counted step failed: no FLOPs from it
            self._flop_counter.__exit__(None, None, None)
            self._flop_counter = None
        if self._in_step:
            self.phases.end_step()
            self._in_step = False

    def _close_open_phases(self) -> None:
        for attr in ("_fwd", "_bwd", "_opt"):
            ctx = getattr(self, attr)
            if ctx is not None:
                ctx.__exit__(None, None, None)
                setattr(self, attr, None)

    def _mfu(self, tokens: int | None, step_s: float, field: str) -> float | None:
        per_token = getattr(self.flops, field, None) if self.flops is not None else None
        if field == "per_token_hardware" and per_token is None and self.flops is not None:
            per_token = self.flops.per_token
        if tokens is None or per_token is None or self.peak is None or not self.peak.per_s or step_s <= 0:
            return None
        return tokens * per_token / (step_s * self.peak.per_s)

    def set_flops(self, flops: fmt.Flops) -> None:
        """Model FLOPs per token for MFU (run.json `flops`), e.g. counted on the first step; the
        following steps' records carry MFU."""
        self.flops = flops
        if not self.recording:
            return
        self._man.flops = flops
        if self.place.rank == 0:
            self._write_manifest()

    # -- checkpoints ----------------------------------------------------------

    @contextmanager
    def saving(self) -> Iterator[None]:
        """Wrap a checkpoint save: its wall time is the loop's stall (run.json `checkpoint_saves`).

        A save whose write goes on in the background after the block (torch.distributed.checkpoint's
        async_save) calls `rec.save_pending(done)` inside it; the save is recorded when `done` says
        its write is complete. One save is in flight at most: the block first waits for the
        previous one, and that wait is part of this save's stall."""
        if not self.recording:
            yield
            return
        step = self.step_index  # the save holds the state after this many steps
        self.heartbeat.now(step - 1, "checkpoint")
        t0 = time.perf_counter()
        self._poll_save(wait=True)
        self._in_saving = _PendingSave(step, t0, lambda wait: True)
        try:
            with untimed_collectives():  # checkpoint I/O is not training communication
                yield
        finally:
            block, self._in_saving = self._in_saving, None
        stall_s = time.perf_counter() - t0
        self._boundary_ns = time.perf_counter_ns()  # the next step's time starts after the save
        if block is self._pending_save:  # written in the background: recorded when complete
            block.stall_s = stall_s
            return
        self._record_save(step, stall_s)

    def save_pending(self, done: Callable[[bool], bool]) -> None:
        """Inside `rec.saving()`: this save's write goes on after the block. `done(wait)` says whether
        the write is complete (waiting for it when `wait`); the recorder calls it after each step
        and waits for it before the next save, in `wait_saves()` and at close. A `done` that raises
        (the write failed) propagates from there. The save is then recorded with `kind: async` and
        `complete_s`, the time from its start to its completion."""
        if not self.recording:
            return
        if self._in_saving is None:
            _say("save_pending outside a saving() block: ignored")
            return
        self._in_saving.done = done
        self._pending_save = self._in_saving

    def wait_saves(self) -> None:
        """Wait for the save in flight (`save_pending`) and record it."""
        if self.recording:
            self._poll_save(wait=True)

    def _poll_save(self, wait: bool) -> None:
        pending = self._pending_save
        if pending is None or not pending.done(wait):
            return
        self._pending_save = None
        self._record_save(pending.step, pending.stall_s, time.perf_counter() - pending.started_s)

    def _record_save(self, step: int, stall_s: float, complete_s: float | None = None) -> None:
        if self.place.rank != 0:
            return
        kind = "sync" if complete_s is None else "async"
        try:
            manifest.record_checkpoint_save(self.run_dir, step, stall_s, self.attempt, kind, complete_s)
        except OSError as exc:
            _say(f"{self.run_dir / 'run.json'}: cannot record the checkpoint save: {exc.strerror or exc}")
        else:
            self._man.checkpoint_saves = (manifest.read_manifest(self.run_dir) or self._man).checkpoint_saves

    # -- preemption -----------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():  # handlers live in the main thread
            return
        for sig in self.preempt_signals:
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._preempt_signal is None:
            when = "this step" if not self._agrees_by_collective() else "the next step (the ranks agree on it)"
            _say(
                f"rank {self.place.rank}: {signal.Signals(signum).name} received: stopping after {when}"
                + (" with the final checkpoint" if self.on_preempt is not None else "")
            )
        self._preempt_signal = signum

    def _agrees_by_collective(self) -> bool:
        return self.place.distributed and self.all_ranks and self.place.world_size > 1

    def _check_preemption(self) -> None:
        """After each step: whether any rank got SIGTERM; if so save, close as preempted, exit 0.

        One process decides at once. Ranks agree by an all-reduce (MAX) of the signal number that
        each issues asynchronously after step k and reads after step k+1, when it has long
        completed: every rank reads the same value after the same step, so all stop together,
        one step after the signal, and no step waits for the slowest rank a second time (a
        blocking all-reduce per step cost wall time on a loaded machine: docs/record.md, "Overhead").
        """
        signum = self._preempt_signal or 0
        if self._agrees_by_collective():
            flag = torch.tensor([float(signum)], device=self.device if self.place.backend == "nccl" else "cpu")
            with untimed_collectives():  # not training communication
                work = torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, async_op=True)
            previous, self._agreement = self._agreement, (work, flag)
            if previous is None:
                return
            previous[0].wait()
            signum = int(previous[1].item())
        if not signum:
            return
        self._settle_agreement()
        name = signal.Signals(signum).name
        done = self.step_index
        if self.on_preempt is not None:
            with self.saving():
                saved = self.on_preempt(done)
            self.wait_saves()
            what = saved or "the final checkpoint hook's save"
            cause = f"preempted: {name} received; stopped after step {done - 1} with {what}"
        else:
            cause = f"preempted: {name} received; stopped after step {done - 1} (no final checkpoint hook registered)"
        self.close(status="preempted", cause=cause, exit_codes=[0] * self.place.world_size)
        if self.exit_on_preempt:
            raise SystemExit(0)

    def _meet(self) -> None:
        """Wait for every rank (a blocking all-reduce of nothing). After a profiler window the ranks
        export their traces, which takes seconds and differs between ranks: without this, the
        first rank to finish would wait for the last inside the next step's first collective, and
        that step's time would hold the slowest rank's export."""
        nothing = torch.zeros(1, device=self.device if self.place.backend == "nccl" else "cpu")
        with untimed_collectives():  # not training communication
            torch.distributed.all_reduce(nothing)

    def _settle_agreement(self) -> None:
        """Wait for the agreement in flight: every rank issued it after the same step."""
        if self._agreement is not None:
            work, self._agreement = self._agreement[0], None
            work.wait()

    # -- the end --------------------------------------------------------------

    def close(
        self,
        status: str | None = None,
        error: str | None = None,
        cause: str | None = None,
        run_json: dict[str, Any] | None = None,
        exit_codes: list[int] | None = None,
    ) -> None:
        """End the run: flush and close this rank's files; rank 0 writes run.json's final state.

        `status` is `completed` (the default), `failed` (with `error`, one line) or `preempted`;
        `cause` the attempt's cause. Unless failed, the save in flight is waited for first.
        `run_json`: fields the loop sets in the final run.json (as at open, e.g. `inject` with
        what the injection measured); `exit_codes`: the ranks' exit status when the loop knows
        them (a trainer that exits 0 after closing), for the attempt's record.
        Closing twice is harmless.
        """
        if self.closed or not self.recording:
            return
        self.closed = True
        status = status or ("failed" if error else "completed")
        if status not in ("completed", "failed", "preempted"):
            _say(f"close(status={status!r}): not one of completed, failed, preempted; recorded as failed")
            error, status = error or f"closed with status {status!r}", "failed"
        self.status = status
        if self._in_step:
            self._in_step_failed()
        if status != "failed":
            self._settle_agreement()
            self.wait_saves()
        for key, value in (run_json or {}).items():
            if key not in RUN_JSON_FIELDS:
                _say(f"close(run_json={{{key!r}: ...}}): not one of {', '.join(RUN_JSON_FIELDS)}: ignored")
                continue
            setattr(self._man, key, value)
        for handle in self._hooks:
            handle.remove()
        self._restore_signal_handlers()
        errors: list[str] = []
        for what, stop in (
            ("profiler", lambda: self.profiler.__exit__(None, None, None)),
            ("collectives", lambda: self.timer.flush(wait=status == "completed")),
            (
                "heartbeat",
                lambda: self.heartbeat.now(self.last_step if self.last_step is not None else self.start_step, "done"),
            ),
            ("heartbeat", self.heartbeat.close),
            ("timer", self.timer.uninstall),
            ("metrics", self._metrics.close),
            ("collectives", self._colls.close if self._colls is not None else lambda: None),
        ):
            try:
                stop()
            except (OSError, RecorderError, RuntimeError) as exc:
                errors.append(f"{what}: {exc}")
        if self._telemetry is not None:
            self._telemetry.stop()
            if self._telemetry.error:
                errors.append(self._telemetry.error)
        for line in errors:
            _say(f"rank {self.place.rank}: {line}")
        mine = {
            "metrics": [self._metrics_rel],
            "collectives": [self._colls_rel] if self._colls is not None else [],
            "telemetry": self._telemetry_files,
            "traces": [f"traces/{fmt.attempt_folder(self.attempt)}{name}" for name in self.profiler.traces],
            "status": status,
            "error": error,
            "time_ns": time.time_ns(),
            "profiled_steps": self.profiled_steps,
        }
        everyone = self._gather_at_close(mine)
        if self.place.rank == 0:
            self._final_manifest(everyone, status, error, cause, exit_codes)

    def _gather_at_close(self, mine: dict) -> list[dict]:
        """Every rank's files and ending, through the store (never a collective: a rank may have died)."""
        meeting, rank = self._meeting, self.place.rank
        if meeting is None or not self.all_ranks:
            return [mine]
        meeting.post(f"close/{rank}", mine)
        if rank != 0:
            return [mine]
        everyone = [mine]
        for r in range(1, self.place.world_size):
            theirs = meeting.wait(f"close/{r}")
            if theirs is None:
                _say(
                    f"rank {r} did not close the recorder within {meeting.timeout_s:.0f} s: "
                    "its files are listed from disk"
                )
                theirs = _files_on_disk(self.run_dir, r, self.attempt)
            everyone.append(theirs)
        return everyone

    def _final_manifest(
        self, everyone: list[dict], status: str, error: str | None, cause: str | None, exit_codes: list[int] | None
    ) -> None:
        on_disk = manifest.read_manifest(self.run_dir)
        man = self._man
        if on_disk is not None:
            man.checkpoint_saves, man.hangs = on_disk.checkpoint_saves, on_disk.hangs
            if on_disk.status == "failed":  # another rank failed first and said so
                status, error = "failed", on_disk.error
        failed = sorted((e["time_ns"], r, e["error"]) for r, e in enumerate(everyone) if e.get("status") == "failed")
        if status != "failed" and failed:
            status = "failed"
        if failed and error is None:
            _, first, first_error = failed[0]
            error = f"rank {first}: {first_error}" if self.place.world_size > 1 else first_error
        man.status, man.end_time = status, manifest.utc_now()
        man.error = error if status == "failed" else None
        earlier = manifest.earlier_attempt_files(self.run_dir, self.attempt, self.place.world_size)
        man.files = manifest.files_listing(self.run_dir, [earlier, *everyone])
        man.profiled_steps = sorted(set(s for e in everyone for s in e.get("profiled_steps", [])))
        if man.steps is None and self.last_step is not None:
            man.steps = self.last_step + 1
        if man.attempts:
            last = man.attempts[-1]
            last.end_time, last.status, last.cause = (
                man.end_time,
                status,
                cause or (error if status == "failed" else None),
            )
            last.exit_codes = exit_codes
        self._write_manifest()

    def fail(self, exc: BaseException) -> None:
        """Close the run as failed with `exc` as its one-line error; this rank's error is written to
        run.json at once, so the first failing rank's error is the run's even when others are killed."""
        if self.closed or not self.recording:
            return
        message = (
            "interrupted"
            if isinstance(exc, KeyboardInterrupt)
            else (f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__)
        )
        where = _where(exc)
        if where:
            message += f" ({where})"
        if self.place.rank != 0 or not self.all_ranks:
            try:
                manifest.mark_failed(
                    self.run_dir, f"rank {self.place.rank}: {message}", list(sys.argv), self.place.world_size
                )
            except OSError as exc2:
                _say(f"{self.run_dir / 'run.json'}: cannot mark failed: {exc2.strerror or exc2}")
        self.close(status="failed", error=message)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or (isinstance(exc, SystemExit) and self.closed):
            self.close()
        else:
            self.fail(exc)


class _NoRecords:
    """The collective timer's writer in a process without collectives: nothing is ever written."""

    def write(self, record: dict) -> None:
        raise RecorderError("a collective was recorded in a process without torch.distributed")

    def flush(self) -> None:
        pass


_NO_RECORDS: Any = _NoRecords()


def _where(exc: BaseException) -> str:
    """`file:line` of the innermost frame that raised, for the one-line error."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f"{Path(last.filename).name}:{last.lineno}"


def _files_on_disk(run_dir: Path, rank: int, attempt: int) -> dict:
    out: dict = {"status": None, "error": None, "time_ns": time.time_ns()}
    for family in ("metrics", "collectives"):
        rel = fmt.records_file(family, rank, attempt)
        out[family] = [rel] if (run_dir / rel).is_file() else []
    return out


def _number(value: Any) -> float | None:
    """A float from a Python number or a one-element tensor; None for None or a non-finite value."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        value = value.detach().item()
    value = float(value)
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def _first_grad_tensor(output: Any) -> torch.Tensor | None:
    """The model output's first tensor that requires grad (a tensor, a tuple/list, a dict, or an object
    with a `loss`/`logits` attribute such as transformers' ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, dict):
        items = list(output.values())
    elif isinstance(output, (list, tuple)):
        items = list(output)
    else:
        items = [getattr(output, name, None) for name in ("loss", "logits")]
    for item in items:
        if isinstance(item, torch.Tensor) and item.requires_grad:
            return item
    return None


def _model_device(model: torch.nn.Module | None) -> torch.device:
    if model is not None:
        for p in model.parameters():
            return p.device
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def open(
    runs_dir: str | os.PathLike[str],
    name: str | None = None,
    config: Any = None,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    **options: Any,
) -> Recorder:
    """Open a run directory under `runs_dir` and start recording this rank (docs/record.md).

    `name`: the directory's name (default `YYYYmmdd-HHMMSS-<model class>-w<world size>`; an
    existing name is an error, a run is never overwritten). `config`: the user's configuration
    (a dict, a dataclass or a namespace), saved as config.yaml and in run.json. `model` (the
    module the loop calls, DDP-wrapped or not) gives forward/backward times, parameter counts and
    a DDP comm hook for collective timing; `optimizer` the optimizer's time and the learning rate.
    Keyword options: `steps`, `start_step` (the first step's index: a loop resumed from a checkpoint
    after K steps passes K), `warmup_steps` (3), `flops` (analyzer.ingest.formats.Flops),
    `peak_flops_per_s`, `profile` (ProfileSchedule; one small window by default), `device`,
    `telemetry_interval_ms`, `on_preempt` (called with the step count before a SIGTERM ends the
    run: the final checkpoint), `meet_timeout_s`, `ddp_comm_hook` (True: time DDP's bucket
    all-reduces through a Python comm hook; False leaves DDP's C++ all-reduce alone, untimed, for
    the lowest overhead: docs/record.md, "Overhead"). For a trainer that does more itself
    (docs/record.md, "A trainer of your own"): `existing` (record into runs_dir/name, made by a
    launcher), `phase_hooks` (False: the loop times its phases with `Recorder.phase`),
    `run_json` (run.json fields the loop knows better), `on_step` (listeners called with each
    step's record), `preempt_signals`, `exit_on_preempt`. Every rank of a distributed job calls it.
    """
    return Recorder(runs_dir, name, config, model, optimizer, **options)
