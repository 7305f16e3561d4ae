"""Typed run configuration: one dataclass per section, defaults and help text.

The configuration is built in layers, later ones winning:

    defaults  <  config file (YAML or TOML)  <  command-line flags  <  --set section.key=value

`resolve` fills the model's size fields from its preset and checks every
value, so the saved `config.yaml` holds concrete numbers and repeats the run
exactly. This module does not import torch: the command line validates a
configuration (and fails with one line) before any rank is started.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from reftrain.errors import ReftrainError


def _opt(default: Any, help: str, choices: tuple | None = None) -> Any:
    """A dataclass field carrying help text (and allowed values) for the CLI and docs."""
    return field(default=default, metadata={"help": help, "choices": choices})


# Model size presets. `small` is the CPU default: 4.2 M parameters, well
# under a second per step per core at the default micro-batch. The GPT-2/GPT-3-like sizes follow the
# GPT-3 paper's table 2.1 shapes (Brown et al. 2020) with GPT-2's
# 50304-token padded vocabulary; "1.3b" is GPT-3 XL's depth and width.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(n_layers=2, d_model=64, n_heads=4, seq_len=64, vocab_size=512, mlp="gelu", tie_embeddings=True),
    "small": dict(n_layers=4, d_model=256, n_heads=4, seq_len=128, vocab_size=4096, mlp="gelu", tie_embeddings=True),
    "125m": dict(n_layers=12, d_model=768, n_heads=12, seq_len=1024, vocab_size=50304, mlp="gelu", tie_embeddings=True),
    "350m": dict(
        n_layers=24, d_model=1024, n_heads=16, seq_len=1024, vocab_size=50304, mlp="gelu", tie_embeddings=True
    ),
    "760m": dict(
        n_layers=24, d_model=1536, n_heads=16, seq_len=1024, vocab_size=50304, mlp="gelu", tie_embeddings=True
    ),
    "1.3b": dict(
        n_layers=24, d_model=2048, n_heads=16, seq_len=2048, vocab_size=50304, mlp="swiglu", tie_embeddings=True
    ),
}


@dataclass
class ModelConfig:
    preset: str = _opt("small", "size preset; the fields below default to it", tuple(PRESETS))
    n_layers: int | None = _opt(None, "transformer blocks (L)")
    d_model: int | None = _opt(None, "residual width")
    n_heads: int | None = _opt(None, "attention heads (H); must divide d_model, head dim Q = d_model / H")
    seq_len: int | None = _opt(None, "tokens per sequence (T)")
    vocab_size: int | None = _opt(None, "vocabulary size")
    mlp: str | None = _opt(None, "MLP type", ("gelu", "swiglu"))
    d_ff: int | None = _opt(None, "MLP hidden width; default 4*d_model (gelu) or 8/3*d_model rounded up to 64 (swiglu)")
    tie_embeddings: bool | None = _opt(None, "share the token embedding with the output projection")


@dataclass(frozen=True)
class ModelShape:
    """A model's sizes once :func:`resolve` filled :class:`ModelConfig` from its preset: none is None."""

    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    vocab_size: int
    mlp: str
    d_ff: int
    tie_embeddings: bool


def model_shape(m: ModelConfig) -> ModelShape:
    """The sizes of a resolved model config; ReftrainError naming a field still left to the preset."""
    values = {f.name: getattr(m, f.name) for f in dataclasses.fields(ModelShape)}
    unset = [name for name, value in values.items() if value is None]
    if unset:
        raise ReftrainError(f"config: model.{unset[0]} is not set (resolve() fills it from model.preset={m.preset})")
    return ModelShape(**values)


@dataclass
class DataConfig:
    path: str | None = _opt(None, "flat uint16 token file (nanoGPT .bin); null = deterministic synthetic stream")
    num_workers: int = _opt(1, "DataLoader worker processes (0 = load in the training process)")
    pin_memory: bool = _opt(True, "pin host batches for asynchronous copies (CUDA only; ignored on CPU)")
    prefetch_factor: int = _opt(2, "batches each worker loads ahead (with num_workers > 0)")
    delay_ms: float = _opt(0.0, "sleep this long per micro-batch inside the data source: a deliberately slow loader")


@dataclass
class TrainConfig:
    steps: int = _opt(20, "optimizer steps (the learning-rate schedule spans them)")
    micro_batch_size: int = _opt(4, "sequences per micro-batch per rank")
    grad_accum: int = _opt(1, "micro-batches per optimizer step")
    dtype: str = _opt(
        "fp32", "compute dtype: fp32, or bf16 (autocast for DDP, FSDP2 mixed precision)", ("fp32", "bf16")
    )
    tf32: bool = _opt(True, "CUDA only: fp32 matmuls on TF32 tensor cores (the peak FLOPs follow)")
    compile: bool = _opt(False, "torch.compile each transformer block")
    compile_backend: str = _opt(
        "inductor",
        "torch.compile backend: inductor generates kernels; aot_eager traces and "
        "partitions the same graphs without generating code (seconds instead of minutes on a CPU)",
        ("inductor", "aot_eager"),
    )
    activation_checkpointing: bool = _opt(False, "recompute each block's activations in backward")
    seed: int = _opt(1234, "seed for initialization and the synthetic data")
    device: str = _opt("auto", "auto = cuda when available, else cpu", ("auto", "cpu", "cuda"))
    warmup_steps: int = _opt(3, "leading steps excluded from steady-state statistics")
    checkpoint_every: int = _opt(0, "save a torch.distributed.checkpoint every K steps (0 = never)")


@dataclass
class ParallelConfig:
    strategy: str = _opt("ddp", "data parallelism: DDP or FSDP2 (fully_shard)", ("ddp", "fsdp"))
    world_size: int | None = _opt(
        None,
        "ranks of the run, recorded at launch (--nproc or torchrun's WORLD_SIZE); `reftrain` without --nproc "
        "(e.g. --config RUN_DIR/config.yaml) starts this many local ranks; null = 1",
    )
    backend: str = _opt("auto", "process-group backend; auto = nccl on CUDA, gloo on CPU", ("auto", "gloo", "nccl"))
    bucket_cap_mb: float = _opt(25.0, "DDP gradient bucket size (MiB); also the bucket size of the explicit sync")
    gradient_as_bucket_view: bool = _opt(False, "DDP: gradients are views into the buckets (saves a copy)")
    static_graph: bool = _opt(False, "DDP: the graph is the same every step")
    overlap_grad_sync: bool = _opt(
        True, "DDP: all-reduce during backward; false = one explicit all-reduce pass after backward"
    )
    reshard_after_forward: bool = _opt(True, "FSDP2: free gathered parameters after forward (re-gather in backward)")
    timeout_s: float = _opt(
        300.0,
        "process-group timeout (s): init_process_group's rendezvous and every collective; "
        "a rank waiting longer fails, so a hang ends the attempt",
    )


@dataclass
class OptimConfig:
    lr: float = _opt(1e-3, "peak learning rate (AdamW)")
    min_lr: float = _opt(1e-4, "learning rate at the last step (cosine decay)")
    lr_warmup_steps: int = _opt(2, "linear learning-rate warm-up steps")
    beta1: float = _opt(0.9, "AdamW beta1")
    beta2: float = _opt(0.95, "AdamW beta2")
    eps: float = _opt(1e-8, "AdamW epsilon")
    weight_decay: float = _opt(0.1, "decoupled weight decay on matrices (not on norm gains)")
    grad_clip: float = _opt(1.0, "clip the global gradient norm to this (0 = off)")
    impl: str = _opt("auto", "AdamW implementation; auto = torch's default", ("auto", "fused", "foreach", "for_loop"))


@dataclass
class ProfileConfig:
    enabled: bool = _opt(True, "run torch.profiler on a schedule")
    wait: int = _opt(5, "profiler schedule: idle steps before each window")
    warmup: int = _opt(1, "profiler schedule: warm-up steps (traced, discarded)")
    active: int = _opt(2, "profiler schedule: recorded steps per window")
    repeat: int = _opt(1, "profiler schedule: windows (0 = until the end)")
    record_shapes: bool = _opt(True, "record operator input shapes")
    memory: bool = _opt(
        False,
        "record memory allocations and frees (torch.profiler profile_memory): the analyzer's "
        "peak memory per step and memory timeline from the traces",
    )
    with_stack: bool = _opt(False, "record Python stacks (large traces)")


@dataclass
class InjectConfig:
    slow_rank: int | None = _opt(None, "rank whose compute is delayed every step (a straggler)")
    delay_ms: float | None = _opt(None, "delay added to slow_rank's forward, once per step (ms)")
    slowdown: float | None = _opt(None, "every rank's forward and backward take this factor longer (>= 1)")


@dataclass
class FaultConfig:
    """Failures on purpose, to test recovery (reftrain/faults.py). Each fires in the
    first attempt only (TORCHELASTIC_RESTART_COUNT=0), so a restarted job can finish."""

    crash_rank: int | None = _opt(None, "rank that dies (os._exit(17)) at the start of fault.crash_step")
    crash_step: int | None = _opt(
        None, "global step at whose start fault.crash_rank dies (train.steps: after the last step and its checkpoint)"
    )
    crash_in_save: bool = _opt(
        False,
        "die instead inside the save of checkpoint step{crash_step}, the state after "
        "crash_step steps (after DCP wrote the data, before the rename that publishes "
        "it); crash_step must be a save step (a multiple of train.checkpoint_every)",
    )
    hang_rank: int | None = _opt(None, "rank that stops (sleeps forever, in Python) at the start of fault.hang_step")
    hang_step: int | None = _opt(None, "global step at whose start fault.hang_rank hangs")


@dataclass
class CheckpointConfig:
    """How checkpoints are written (how often: train.checkpoint_every)."""

    async_save: bool = _opt(
        False,
        "torch.distributed.checkpoint.async_save: the loop stalls only to stage a copy; "
        "the write runs in a background thread and is published when it completes",
    )


@dataclass
class PreemptionConfig:
    """Stopping on SIGTERM/SIGINT (the recorder stops the ranks: docs/reftrain.md "Preemption")."""

    grace_s: int = _opt(
        20,
        "under reftrain --nproc: seconds the ranks get to finish their steps (the one in progress and, with "
        "several ranks, the next: they agree on the stop) and save after "
        "a SIGTERM/SIGINT before the launcher kills them; keep it below the scheduler's own "
        "(Slurm KillWait, Kubernetes terminationGracePeriodSeconds: 30 s by default)",
    )


@dataclass
class WatchdogConfig:
    """Hang detection by `reftrain --nproc`'s launcher over the per-rank heartbeat files (heartbeat/rank{R}.json)."""

    enabled: bool = _opt(True, "watch the heartbeats (only under reftrain --nproc)")
    timeout_s: float = _opt(
        120.0,
        "a live rank whose heartbeat is this old, while its job is not done, is a hang; "
        "keep it below parallel.timeout_s, or the collective timeout ends the job first",
    )
    interval_s: float = _opt(1.0, "how often the launcher reads the heartbeats")


@dataclass
class TelemetryConfig:
    enabled: bool = _opt(True, "NVML sampling on GPU machines (a note otherwise)")
    interval_ms: int = _opt(100, "NVML sampling interval")


# Experiment trackers `--log` accepts (reftrain/trackers.py).
TRACKERS = ("tensorboard", "wandb", "mlflow")


@dataclass
class LogConfig:
    """Experiment trackers rank 0 logs to while training (reftrain/trackers.py, docs/reftrain.md "Experiment trackers")."""

    trackers: str = _opt(
        "",
        "comma-separated trackers to log to live from rank 0: tensorboard, wandb, mlflow "
        "(empty = none); each needs the extra trackers",
    )
    tensorboard_dir: str | None = _opt(None, "TensorBoard log root: events go to DIR/<run id>/; null = RUN_DIR/tb")
    wandb_dir: str | None = _opt(None, "W&B directory (W&B writes DIR/wandb/); null = RUN_DIR")
    wandb_project: str = _opt("reftrain", "W&B project")
    wandb_mode: str = _opt(
        "auto",
        "W&B mode; auto = $WANDB_MODE if set, online with a W&B login (WANDB_API_KEY or a netrc entry), else offline",
        ("auto", "offline", "online"),
    )
    mlflow_uri: str | None = _opt(
        None, "MLflow tracking URI (a server, or a file store folder); null = the file store RUN_DIR/mlruns"
    )
    mlflow_experiment: str = _opt("reftrain", "MLflow experiment")
    console_interval_steps: int = _opt(
        10,
        "rank 0 prints a progress line (step k/N, step time, tokens/s, ETA) every N steps, after an attempt's "
        "first step and after the last; 0 = none; not the trackers, which log every step",
    )


@dataclass
class RunConfig:
    runs_dir: str = _opt("runs", "directory holding run directories")
    name: str | None = _opt(None, "run directory name; null = YYYYmmdd-HHMMSS-PRESET-STRATEGY-wWORLD")
    peak_flops: float | None = _opt(None, "per-device peak FLOP/s for MFU; null = GPU table or CPU measurement")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    inject: InjectConfig = field(default_factory=InjectConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    run: RunConfig = field(default_factory=RunConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict (the content of config.yaml)."""
        return dataclasses.asdict(self)


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]


# ---------------------------------------------------------------------------
# Building a config from layers
# ---------------------------------------------------------------------------


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(key: str, value: Any, hint: Any, choices: tuple | None, origin: str) -> Any:
    """Check one value against its field type; ints are accepted for floats."""
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if value is None:
        if optional:
            return None
        raise ReftrainError(f"{origin}: {key} must not be null")
    if base is float and isinstance(value, str):
        try:  # PyYAML (YAML 1.1) reads 3e-4 as a string: it wants 3.0e-4
            value = float(value)
        except ValueError:
            pass
    ok = (
        (base is bool and isinstance(value, bool))
        or (base is int and isinstance(value, int) and not isinstance(value, bool))
        or (base is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (base is str and isinstance(value, str))
    )
    if not ok:
        want = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[base]
        raise ReftrainError(f"{origin}: {key}={value!r} is not {want}")
    if base is float:
        value = float(value)
    if choices is not None and value not in choices:
        raise ReftrainError(f"{origin}: {key}={value!r} is not one of {', '.join(map(str, choices))}")
    return value


# Keys renamed since runs were first saved, old -> new, so an older config.yaml (resume, --config) still loads.
RENAMED_KEYS = {("profile", "profile_memory"): "memory"}


def _apply(cfg: Config, section: str, key: str, value: Any, origin: str) -> None:
    """Set cfg.section.key = value after checking name and type."""
    key = RENAMED_KEYS.get((section, key), key)
    if section not in SECTIONS:
        raise ReftrainError(f"{origin}: unknown config section '{section}' (known: {', '.join(SECTIONS)})")
    cls = SECTIONS[section]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if key not in fields:
        raise ReftrainError(
            f"{origin}: unknown config key '{section}.{key}' (known in [{section}]: {', '.join(fields)})"
        )
    hint = _field_types(cls)[key]
    value = _coerce(f"{section}.{key}", value, hint, fields[key].metadata.get("choices"), origin)
    setattr(getattr(cfg, section), key, value)


def merge_dict(cfg: Config, data: Any, origin: str) -> Config:
    """Apply a nested {section: {key: value}} mapping onto cfg (strict: unknown keys fail)."""
    if data is None:
        return cfg
    if not isinstance(data, dict):
        raise ReftrainError(f"{origin}: expected a mapping of sections, got {type(data).__name__}")
    for section, values in data.items():
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ReftrainError(f"{origin}: section '{section}' must be a mapping of keys to values")
        for key, value in values.items():
            _apply(cfg, str(section), str(key), value, origin)
    return cfg


def load_file(path: str | os.PathLike) -> dict:
    """Read a YAML (.yaml/.yml) or TOML (.toml) config file into a nested dict."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ReftrainError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ReftrainError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    if path.suffix == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            raise ReftrainError(f"{path}: TOML config files need Python 3.11+ (tomllib); use YAML") from None
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ReftrainError(f"{path}: invalid TOML: {exc}") from None
    if path.suffix not in (".yaml", ".yml"):
        raise ReftrainError(f"{path}: config files must end in .yaml, .yml or .toml")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ReftrainError(f"{path}: invalid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    return data if data is not None else {}


def apply_set(cfg: Config, assignment: str) -> Config:
    """Apply one `section.key=value` override; the value is parsed as YAML (1e-3, true, null, bf16)."""
    origin = f"--set {assignment}"
    name, sep, raw = assignment.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not key:
        raise ReftrainError(f"{origin}: expected section.key=value, e.g. train.steps=50")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    cls = SECTIONS.get(section)
    if cls is not None and value is not None and not isinstance(value, str):
        hint = _field_types(cls).get(key)
        if hint is not None and str in (typing.get_args(hint) or (hint,)):
            value = raw.strip()  # run.name=2024 or model.preset=125m stay text
    _apply(cfg, section, key, value, origin)
    return cfg


def set_value(cfg: Config, dotted: str, value: Any, origin: str) -> Config:
    """Set `section.key` to an already-typed value (command-line convenience flags)."""
    section, _, key = dotted.partition(".")
    _apply(cfg, section, key, value, origin)
    return cfg


# ---------------------------------------------------------------------------
# Resolution and validation
# ---------------------------------------------------------------------------


def _round_up(x: int, multiple: int) -> int:
    return (x + multiple - 1) // multiple * multiple


def resolve(cfg: Config, world_size: int | None = None) -> Config:
    """Fill model fields from the preset and validate everything; returns cfg.

    `world_size` (when known before launch) is recorded in
    `parallel.world_size` and lets rank-dependent settings be checked too.
    Raises ReftrainError with one line naming the key.
    """
    m = cfg.model
    preset = PRESETS[m.preset]
    for key, value in preset.items():
        if getattr(m, key) is None:
            setattr(m, key, value)
    if m.d_ff is None:
        assert m.d_model is not None  # every preset sets it
        m.d_ff = 4 * m.d_model if m.mlp == "gelu" else _round_up(8 * m.d_model // 3, 64)
    if world_size is not None:  # the world the run really has; config.yaml keeps it so --config repeats it
        cfg.parallel.world_size = world_size
    _validate(cfg, world_size)
    return cfg


def _positive(name: str, value: float | int, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ReftrainError(f"config: {name}={value} must be {'>= 0' if allow_zero else '> 0'}")


def _validate(cfg: Config, world_size: int | None) -> None:
    m, d, t, p, o, pr, inj = cfg.model, cfg.data, cfg.train, cfg.parallel, cfg.optim, cfg.profile, cfg.inject
    fl = cfg.fault
    if (fl.crash_rank is None) != (fl.crash_step is None):
        raise ReftrainError("config: fault.crash_rank and fault.crash_step go together (--crash-rank R --crash-step S)")
    if fl.crash_rank is not None and fl.crash_step is not None:
        _positive("fault.crash_rank", fl.crash_rank, allow_zero=True)
        _positive("fault.crash_step", fl.crash_step, allow_zero=True)
        if world_size is not None and fl.crash_rank >= world_size:
            raise ReftrainError(f"config: fault.crash_rank={fl.crash_rank} but the world has {world_size} ranks")
        if fl.crash_step > t.steps:
            raise ReftrainError(
                f"config: fault.crash_step={fl.crash_step} cannot fire: the run ends at train.steps={t.steps}"
            )
        every = t.checkpoint_every
        if fl.crash_in_save and (not every or fl.crash_step % every or fl.crash_step == 0):
            saves = (
                f"train.checkpoint_every={every} saves steps {every}, {2 * every}, ..."
                if every
                else "train.checkpoint_every=0 saves none"
            )
            raise ReftrainError(
                f"config: fault.crash_in_save: no checkpoint is saved at fault.crash_step="
                f"{fl.crash_step} ({saves}), so the crash could never fire"
            )
    elif fl.crash_in_save:
        raise ReftrainError(
            "config: fault.crash_in_save needs fault.crash_rank and fault.crash_step "
            "(--crash-rank R --crash-step S --crash-in-save)"
        )
    if (fl.hang_rank is None) != (fl.hang_step is None):
        raise ReftrainError("config: fault.hang_rank and fault.hang_step go together (--hang-rank R --hang-step S)")
    if fl.hang_rank is not None and fl.hang_step is not None:
        _positive("fault.hang_rank", fl.hang_rank, allow_zero=True)
        _positive("fault.hang_step", fl.hang_step, allow_zero=True)
        if world_size is not None and fl.hang_rank >= world_size:
            raise ReftrainError(f"config: fault.hang_rank={fl.hang_rank} but the world has {world_size} ranks")
        if fl.hang_step > t.steps:
            raise ReftrainError(
                f"config: fault.hang_step={fl.hang_step} cannot fire: the run ends at train.steps={t.steps}"
            )
    _positive("parallel.timeout_s", cfg.parallel.timeout_s)
    _positive("preemption.grace_s", cfg.preemption.grace_s)
    _positive("watchdog.timeout_s", cfg.watchdog.timeout_s)
    _positive("watchdog.interval_s", cfg.watchdog.interval_s)
    for name in ("n_layers", "d_model", "n_heads", "seq_len", "vocab_size", "d_ff"):
        _positive(f"model.{name}", getattr(m, name))
    shape = model_shape(m)
    if shape.d_model % shape.n_heads:
        raise ReftrainError(f"config: model.d_model={shape.d_model} is not divisible by model.n_heads={shape.n_heads}")
    for name in ("steps", "micro_batch_size", "grad_accum"):
        _positive(f"train.{name}", getattr(t, name))
    _positive("train.warmup_steps", t.warmup_steps, allow_zero=True)
    _positive("train.checkpoint_every", t.checkpoint_every, allow_zero=True)
    _positive("data.num_workers", d.num_workers, allow_zero=True)
    _positive("data.prefetch_factor", d.prefetch_factor)
    _positive("data.delay_ms", d.delay_ms, allow_zero=True)
    _positive("parallel.bucket_cap_mb", p.bucket_cap_mb)
    if p.world_size is not None:
        _positive("parallel.world_size", p.world_size)
    _positive("optim.lr", o.lr)
    _positive("optim.min_lr", o.min_lr, allow_zero=True)
    _positive("optim.lr_warmup_steps", o.lr_warmup_steps, allow_zero=True)
    _positive("optim.eps", o.eps)
    _positive("optim.weight_decay", o.weight_decay, allow_zero=True)
    _positive("optim.grad_clip", o.grad_clip, allow_zero=True)
    if not (0 <= o.beta1 < 1 and 0 <= o.beta2 < 1):
        raise ReftrainError(f"config: optim.beta1={o.beta1} and optim.beta2={o.beta2} must lie in [0, 1)")
    if p.strategy == "fsdp" and not p.overlap_grad_sync:
        raise ReftrainError(
            "config: parallel.overlap_grad_sync=false applies to ddp only (FSDP2 reduce-scatters in backward)"
        )
    if pr.enabled:
        _positive("profile.wait", pr.wait, allow_zero=True)
        _positive("profile.warmup", pr.warmup, allow_zero=True)
        _positive("profile.active", pr.active)
        _positive("profile.repeat", pr.repeat, allow_zero=True)
    _positive("telemetry.interval_ms", cfg.telemetry.interval_ms)
    if cfg.run.peak_flops is not None:
        _positive("run.peak_flops", cfg.run.peak_flops)
    if (inj.slow_rank is None) != (inj.delay_ms is None):
        raise ReftrainError(
            "config: inject.slow_rank and inject.delay_ms go together (--inject-slow-rank R --inject-delay-ms D)"
        )
    if inj.slow_rank is not None and inj.delay_ms is not None:
        _positive("inject.slow_rank", inj.slow_rank, allow_zero=True)
        _positive("inject.delay_ms", inj.delay_ms, allow_zero=True)
        if world_size is not None and inj.slow_rank >= world_size:
            raise ReftrainError(f"config: inject.slow_rank={inj.slow_rank} but the world has {world_size} ranks")
    if inj.slowdown is not None and inj.slowdown < 1:
        raise ReftrainError(f"config: inject.slowdown={inj.slowdown} must be >= 1 (a factor on compute time)")
    if cfg.run.name is not None and (not cfg.run.name or "/" in cfg.run.name or cfg.run.name in (".", "..")):
        raise ReftrainError(f"config: run.name={cfg.run.name!r} must be a plain directory name")
    _positive("log.console_interval_steps", cfg.log.console_interval_steps, allow_zero=True)
    tracker_names(cfg.log.trackers, "config: log.trackers")
    if d.path is not None:
        check_token_file(Path(d.path), shape.seq_len)


def tracker_names(text: str, origin: str) -> list[str]:
    """The trackers of a `log.trackers` value ("tensorboard,wandb"), each once, in the order given."""
    names: list[str] = []
    for part in text.split(","):
        name = part.strip().lower()
        if not name:
            continue
        if name not in TRACKERS:
            raise ReftrainError(f"{origin}: unknown tracker {name!r} (known: {', '.join(TRACKERS)})")
        if name not in names:
            names.append(name)
    return names


def check_token_file(path: Path, seq_len: int) -> int:
    """Check a flat uint16 token file; returns its token count."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ReftrainError(f"data.path: {path}: no such file") from None
    except OSError as exc:
        raise ReftrainError(f"data.path: {path}: {exc.strerror or exc}") from None
    if not path.is_file():
        raise ReftrainError(f"data.path: {path}: not a regular file")
    if size % 2:
        raise ReftrainError(f"data.path: {path}: {size} bytes is not a whole number of uint16 tokens")
    tokens = size // 2
    if tokens < seq_len + 2:
        raise ReftrainError(f"data.path: {path}: {tokens} tokens, need at least seq_len + 2 = {seq_len + 2}")
    return tokens


# ---------------------------------------------------------------------------
# Saving and documentation
# ---------------------------------------------------------------------------


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML, sections in declaration order."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=False)


def from_dict(data: dict, origin: str = "config") -> Config:
    """A Config from a nested dict (defaults for missing keys, strict on unknown ones)."""
    return merge_dict(Config(), data, origin)


def reference_markdown() -> str:
    """Markdown tables of every section and key with type, default and help (docs/reftrain.md)."""
    lines: list[str] = []
    for section, cls in SECTIONS.items():
        hints = _field_types(cls)
        lines += [f"### `{section}`", "", "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            type_name = (args[0] if args else hint).__name__ + (" or null" if typing.get_args(hint) else "")
            default = "null" if f.default is None else yaml.safe_dump(f.default).strip().removesuffix("\n...")
            help_text = f.metadata["help"]
            if f.metadata.get("choices"):
                help_text += f" ({' / '.join(map(str, f.metadata['choices']))})"
            lines.append(f"| `{f.name}` | {type_name} | `{default}` | {help_text} |")
        lines.append("")
    return "\n".join(lines)
