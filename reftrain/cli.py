"""`reftrain` command line: build and check the config, then train here or launch ranks.

Three ways to run, one code path per rank (`reftrain.train.run`):

- `reftrain --nproc N ...`: this process validates the config, creates the
  run directory, and starts N ranks through torch's own launcher
  (`torch.distributed.run`, the code behind `torchrun --standalone`). Each
  rank re-enters here with the internal `--attach RUN_DIR`.
- `torchrun --nproc-per-node N [rendezvous flags] -m reftrain ...`: every
  rank builds the config itself; rank 0 creates the run directory.
- `reftrain ...` alone: one rank in this process, unless the config records
  `parallel.world_size` > 1 (a repeated run): then as `--nproc` that many.

Errors a user can fix are ReftrainError: one line on stderr, exit status 1.
Under the launcher a rank does not print its error; it writes it to
torchelastic's per-rank error file and the launcher prints the first one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, NoReturn

from recorder import manifest
from reftrain import checkpoint, rundir
from reftrain.config import (
    Config,
    FaultConfig,
    apply_set,
    from_dict,
    load_file,
    merge_dict,
    resolve,
    set_value,
    to_yaml,
    tracker_names,
)
from reftrain.errors import ReftrainError
from reftrain.exits import ExitTimes

_ENV_LAUNCHED = "REFTRAIN_LAUNCHED"  # set by our launcher for its ranks
_ENV_COMMAND = "REFTRAIN_COMMAND"  # the user's command line, JSON, for the manifest
_ENV_LAUNCHER_PID = "REFTRAIN_LAUNCHER_PID"  # the launcher's pid: its ranks die with it (reftrain/lifeline.py)

# Convenience flags: each sets one config key (applied before --set).
_FLAG_KEYS = {
    "runs_dir": "run.runs_dir",
    "run_name": "run.name",
    "steps": "train.steps",
    "preset": "model.preset",
    "strategy": "parallel.strategy",
    "device": "train.device",
    "data": "data.path",
    "checkpoint_every": "train.checkpoint_every",
    "inject_slow_rank": "inject.slow_rank",
    "inject_delay_ms": "inject.delay_ms",
    "inject_slowdown": "inject.slowdown",
    "peak_flops": "run.peak_flops",
    "crash_rank": "fault.crash_rank",
    "crash_step": "fault.crash_step",
    "hang_rank": "fault.hang_rank",
    "hang_step": "fault.hang_step",
    "log": "log.trackers",
    "tensorboard_dir": "log.tensorboard_dir",
    "wandb_dir": "log.wandb_dir",
    "mlflow_uri": "log.mlflow_uri",
}
_DEMO = {"train.device": "cpu", "profile.enabled": True}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line instead of usage + error
        raise ReftrainError(f"{message} (see reftrain --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="reftrain",
        description="Instrumented reference trainer: a decoder-only transformer with DDP or FSDP2; "
        "every run writes a run directory (docs/rundir.md).",
        epilog="Config reference: docs/reftrain.md. Multi-node: torchrun --nnodes ... -m reftrain ...",
    )
    from analyzer.ingest.formats import package_version  # the one version lookup of trainperf's commands

    p.add_argument("--version", action="version", version=f"reftrain (trainperf) {package_version()}")
    p.add_argument("--config", metavar="FILE", help="YAML or TOML config (e.g. RUN_DIR/config.yaml to repeat a run)")
    p.add_argument(
        "--set",
        metavar="SECTION.KEY=VALUE",
        action="append",
        default=[],
        help="override one config key; repeatable, applied last",
    )
    p.add_argument("--demo", action="store_true", help="the built-in small CPU config with profiling on")
    p.add_argument("--nproc", type=int, metavar="N", help="start N ranks on this machine (torch.distributed.run)")
    p.add_argument("--runs-dir", metavar="DIR", help="where run directories go (run.runs_dir)")
    p.add_argument("--run-name", metavar="NAME", help="run directory name (run.name); must not exist")
    p.add_argument("--steps", type=int, metavar="N", help="optimizer steps (train.steps)")
    p.add_argument("--preset", metavar="NAME", help="model size preset (model.preset)")
    p.add_argument("--strategy", metavar="ddp|fsdp", help="parallel.strategy")
    p.add_argument("--device", metavar="auto|cpu|cuda", help="train.device")
    p.add_argument("--data", metavar="PATH", help="uint16 token file, nanoGPT .bin layout (data.path)")
    p.add_argument(
        "--checkpoint-every", type=int, metavar="K", help="checkpoint every K steps (train.checkpoint_every)"
    )
    p.add_argument(
        "--resume",
        metavar="PATH",
        help="continue from a run directory's latest checkpoint or from RUN_DIR/checkpoints/stepK, "
        "with that run's config (flags and --set still apply); writes a new run directory",
    )
    p.add_argument("--inject-slow-rank", type=int, metavar="R", help="make rank R a straggler (inject.slow_rank)")
    p.add_argument(
        "--inject-delay-ms", type=float, metavar="D", help="the straggler's delay per step (inject.delay_ms)"
    )
    p.add_argument("--inject-slowdown", type=float, metavar="F", help="all compute F times slower (inject.slowdown)")
    p.add_argument(
        "--max-restarts",
        type=int,
        metavar="N",
        default=0,
        help="with --nproc: when a rank dies, restart the whole job up to N times (torchelastic); "
        "each restart resumes from the run's latest complete checkpoint",
    )
    p.add_argument(
        "--crash-rank", type=int, metavar="R", help="fault injection: rank R dies at --crash-step (fault.crash_rank)"
    )
    p.add_argument(
        "--crash-step", type=int, metavar="S", help="the step at whose start --crash-rank dies (fault.crash_step)"
    )
    p.add_argument(
        "--crash-in-save",
        action="store_true",
        help="die instead inside the save of checkpoint stepS, the state after S steps; S must be a "
        "multiple of --checkpoint-every (fault.crash_in_save)",
    )
    p.add_argument(
        "--hang-rank",
        type=int,
        metavar="R",
        help="fault injection: rank R stops making progress at --hang-step (fault.hang_rank)",
    )
    p.add_argument(
        "--hang-step", type=int, metavar="S", help="the step at whose start --hang-rank hangs (fault.hang_step)"
    )
    p.add_argument("--peak-flops", type=float, metavar="FLOP_PER_S", help="per-device peak for MFU (run.peak_flops)")
    p.add_argument(
        "--log",
        metavar="TRACKERS",
        help="log live from rank 0 to experiment trackers: any of tensorboard,wandb,mlflow, comma separated "
        "(log.trackers; extra trackers)",
    )
    p.add_argument(
        "--tensorboard-dir",
        metavar="DIR",
        help="TensorBoard log root, events in DIR/<run id> (log.tensorboard_dir; default RUN_DIR/tb)",
    )
    p.add_argument("--wandb-dir", metavar="DIR", help="W&B directory (log.wandb_dir; default RUN_DIR)")
    p.add_argument(
        "--mlflow-uri",
        metavar="URI",
        help="MLflow tracking URI or file-store folder (log.mlflow_uri; default RUN_DIR/mlruns)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no opening line and no progress lines; warnings, errors and the closing summary stay",
    )
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    p.add_argument("--attach", metavar="RUN_DIR", help=argparse.SUPPRESS)  # internal: a rank started by --nproc
    # The help shows each flag's default. A config flag's argparse default stays None (unset: a config file's
    # value is kept), so its default is the config key's own (reftrain/config.py), or what its help says null means.
    config = Config()
    for action in p._actions:
        value, key = action.default, _FLAG_KEYS.get(action.dest)
        if key:
            section, name = key.split(".")
            value = getattr(getattr(config, section), name)
            if value is None:
                meta = next(f.metadata for f in dataclasses.fields(getattr(config, section)) if f.name == name)
                value = meta["help"].partition("null = ")[2] or None
        if action.help not in (None, argparse.SUPPRESS) and value not in (None, "", [], argparse.SUPPRESS):
            if value is not False and "default" not in action.help:
                action.help += f" (default: {value})"
    return p


def build_config(
    args: argparse.Namespace, world_size: int | None, notes: list[str] | None = None
) -> tuple[Config, Path | None, Path | None]:
    """(resolved config, checkpoint to resume from, the run it belongs to) from the command line.

    Lines to tell the user (faults of a repeated run not repeated) are appended to `notes`."""
    resume_ckpt = resumed_run = None
    notes = [] if notes is None else notes
    if sum(bool(x) for x in (args.config, args.resume, args.demo)) > 1:
        raise ReftrainError("--config, --resume and --demo are exclusive: each supplies the base config")
    if args.resume:
        resumed_run, resume_ckpt = checkpoint.find_checkpoint(Path(args.resume))
        cfg = from_dict(load_file(resumed_run / "config.yaml"), str(resumed_run / "config.yaml"))
        _world_from_manifest(cfg, resumed_run / "config.yaml")
        notes += _disarm_faults(cfg, f"--resume {args.resume}")
    elif args.config:
        cfg = merge_dict(Config(), load_file(args.config), args.config)
        _world_from_manifest(cfg, Path(args.config))
        if _in_run_dir(Path(args.config)):
            notes += _disarm_faults(cfg, f"--config {args.config}")
    else:
        cfg = Config()
        if args.demo:
            for key, value in _DEMO.items():
                set_value(cfg, key, value, "--demo")
    if args.log is not None:
        tracker_names(args.log, f"--log {args.log}")  # named by the flag, before the config's own check
    for attr, key in _FLAG_KEYS.items():
        value = getattr(args, attr)
        if value is not None:
            set_value(cfg, key, value, f"--{attr.replace('_', '-')}")
    if args.crash_in_save:
        set_value(cfg, "fault.crash_in_save", True, "--crash-in-save")
    for assignment in args.set:
        apply_set(cfg, assignment)
    return resolve(cfg, world_size), resume_ckpt, resumed_run


def _in_run_dir(config_path: Path) -> bool:
    """Whether a config file is a run's saved config.yaml (a run.json beside it)."""
    return config_path.name == "config.yaml" and (config_path.parent / "run.json").is_file()


def _disarm_faults(cfg: Config, source: str) -> list[str]:
    """Clear the fault injection a run's saved config records; a note naming it, or none.

    A repeated or resumed run continues the training, not its test of a
    failure: flags and --set on this command line can inject faults again."""
    armed = {k: v for k, v in dataclasses.asdict(cfg.fault).items() if v not in (None, False)}
    if not armed:
        return []
    cfg.fault = FaultConfig()
    keys = ", ".join(f"fault.{k}={v}" for k, v in armed.items())
    return [f"{source}: the run's fault injection ({keys}) is not repeated; pass the flags again to inject it"]


def _world_from_manifest(cfg: Config, config_path: Path) -> None:
    """A run's config.yaml from before `parallel.world_size` existed: take the world from its run.json.

    Only when the file sits in a run directory (a run.json next to it whose
    ``world_size`` is a positive integer); otherwise nothing changes.
    """
    if cfg.parallel.world_size is not None:
        return
    try:
        world = json.loads((config_path.parent / "run.json").read_text()).get("world_size")
    except (OSError, ValueError, AttributeError):
        return
    if isinstance(world, int) and not isinstance(world, bool) and world >= 1:
        cfg.parallel.world_size = world


@dataclass(frozen=True)
class LaunchPlan:
    """How many ranks to start and how.

    ``nproc``: local ranks to start through torch.distributed.run, or None to
    train in this process (one rank, or one rank of a torchrun job).
    ``world_size``: ranks of the run (None only for ``--print-config``).
    ``notes``: lines to print before starting (where the world size came from).
    """

    nproc: int | None
    world_size: int | None
    notes: tuple[str, ...] = ()


def plan_launch(
    nproc_flag: int | None, cfg: Config, environ: Mapping[str, str], print_config: bool = False
) -> LaunchPlan:
    """The launch of a command line: ``--nproc``, else torchrun's WORLD_SIZE, else the config's world size.

    A repeated config (``--config RUN_DIR/config.yaml``) records the world it
    ran with in ``parallel.world_size``; without ``--nproc`` the run starts
    that many local ranks again, and says so. An explicit ``--nproc`` or a
    torchrun launch decides instead, with a note when it differs.
    """
    recorded = cfg.parallel.world_size
    in_rank = "RANK" in environ and "WORLD_SIZE" in environ
    if nproc_flag is not None and in_rank:
        raise ReftrainError("--nproc starts its own ranks; under torchrun leave it out")
    if nproc_flag is not None:
        if nproc_flag < 1:
            raise ReftrainError(f"--nproc {nproc_flag}: need at least 1")
        notes = (
            ()
            if recorded in (None, nproc_flag)
            else (f"--nproc {nproc_flag} replaces the config's parallel.world_size={recorded}",)
        )
        return LaunchPlan(nproc_flag, nproc_flag, notes)
    if in_rank:
        world = int(environ["WORLD_SIZE"])
        notes = (
            ()
            if recorded in (None, world)
            else (f"torchrun started {world} ranks; the config's parallel.world_size={recorded} is replaced",)
        )
        return LaunchPlan(None, world, notes)
    if print_config:
        return LaunchPlan(None, None)  # printing a config does not fix the world size
    if recorded is not None and recorded > 1:
        return LaunchPlan(
            recorded,
            recorded,
            (f"starting {recorded} local ranks, the config's parallel.world_size (--nproc N to change it)",),
        )
    return LaunchPlan(None, 1)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `reftrain` script and of `python -m reftrain`."""
    argv = sys.argv[1:] if argv is None else argv
    launched = os.environ.get(_ENV_LAUNCHED) == "1"
    in_rank = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    try:
        args = build_parser().parse_args(argv)
        if args.attach:
            return _attached_rank(args)
        if args.nproc is not None and in_rank:
            raise ReftrainError("--nproc starts its own ranks; under torchrun leave it out")
        if args.max_restarts < 0:
            raise ReftrainError(f"--max-restarts {args.max_restarts}: need 0 or more")
        if args.max_restarts and in_rank:
            raise ReftrainError("--max-restarts is the launcher's: under torchrun pass torchrun --max-restarts N")
        # The world size can come from the config itself (a repeated run), so
        # the config is built first and checked against the world after.
        notes: list[str] = []
        cfg, resume, resumed_run = build_config(args, None, notes)
        plan = plan_launch(args.nproc, cfg, os.environ, args.print_config)
        resolve(cfg, plan.world_size)
        if args.print_config:
            print(to_yaml(cfg), end="")
            return 0
        if not in_rank or os.environ.get("RANK") == "0":
            for note in [*notes, *plan.notes]:
                print(f"reftrain: note: {note}", file=sys.stderr, flush=True)
        _require_torch()
        from reftrain.trackers import require as require_trackers

        require_trackers(cfg.log)  # an absent tracker library: one line before any rank starts
        command = ["reftrain", *argv]
        if plan.nproc is not None:
            return _launch(cfg, plan.nproc, resume, resumed_run, command, args.max_restarts, args.quiet)
        from reftrain import train  # imports torch

        train.run(cfg, None, resume, command, resumed_run, args.quiet)
        return 0
    except ReftrainError as exc:
        return _fail(str(exc), launched, in_rank)
    except KeyboardInterrupt:
        if not in_rank:
            print("reftrain: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug: the traceback is the useful output
        traceback.print_exc()
        _write_error_file(f"rank {os.environ.get('RANK', 0)}: {type(exc).__name__}: {exc} (traceback above)")
        return 1


def _require_torch() -> None:
    """torch is the `train` extra (the analyzer installs without it): one line, not a traceback."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ReftrainError(
            "torch is not installed: pip install 'trainperf[train]' (on a CPU machine first: pip install torch==2.13.0)"
        )


def _attached_rank(args: argparse.Namespace) -> int:
    """A rank started by `reftrain --nproc`: config and run directory come from the launcher."""
    from reftrain.lifeline import die_with_parent

    launcher = os.environ.get(_ENV_LAUNCHER_PID, "")
    die_with_parent(int(launcher) if launcher.isdigit() else None)  # never outlive the launcher
    from reftrain import train

    run_dir = Path(args.attach)
    cfg = resolve(
        from_dict(load_file(run_dir / "config.yaml"), str(run_dir / "config.yaml")),
        int(os.environ.get("WORLD_SIZE", 1)),
    )
    resume = resumed_run = None
    if args.resume:
        resumed_run, resume = checkpoint.find_checkpoint(Path(args.resume))
    command = json.loads(os.environ.get(_ENV_COMMAND, "null")) or ["reftrain", *sys.argv[1:]]
    train.run(cfg, run_dir, resume, command, resumed_run, args.quiet)
    # Leave without interpreter and static destruction: a gloo rank has aborted there
    # ('terminate called without an active exception') after its work was done, and
    # torchelastic then restarted a finished job. Everything is written and closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _write_error_file(message: str) -> None:
    """Hand the error to torchelastic's agent (it reads this file when the rank exits non-zero)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        Path(path).write_text(json.dumps({"message": message, "timestamp": int(time.time())}))
    except OSError:
        pass


def _fail(message: str, launched: bool, in_rank: bool) -> int:
    """Report a user error: one line on stderr (or, under our launcher, in the error file)."""
    if in_rank:
        rank = os.environ.get("RANK", "0")
        _write_error_file(message)
        if launched:
            return 1
        if os.environ.get("WORLD_SIZE", "1") != "1":
            message = f"rank {rank}: {message}"
    print(f"reftrain: error: {message}", file=sys.stderr, flush=True)
    return 1


def _launch(
    cfg: Config,
    nproc: int,
    resume: Path | None,
    resumed_run: Path | None,
    command: list[str],
    max_restarts: int = 0,
    quiet: bool = False,
) -> int:
    """Create the run directory and start `nproc` local ranks through torch.distributed.run."""
    run_dir = rundir.create_run_dir(cfg, nproc)
    import torch.distributed.run as torchrun  # the implementation of the torchrun command
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    # The agent logs each rank's failure, signals and restarts at WARNING/ERROR;
    # the one line printed below says it all. Its loggers set their own levels
    # (torch.distributed.elastic.utils.logging), so each is silenced by name.
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher")):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ[_ENV_LAUNCHED] = "1"
    # Each attempt gets its own rendezvous store: torch's dynamic rendezvous otherwise
    # shares one TCPStore with the workers across restarts, and a restarted attempt's
    # gloo rendezvous read the dead attempt's keys (docs/reftrain.md, "Restarts").
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    os.environ[_ENV_COMMAND] = json.dumps(command)
    os.environ[_ENV_LAUNCHER_PID] = str(os.getpid())
    # torchrun would set 1 thread per rank and warn; share the cores instead.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    child = ["--attach", str(run_dir)] + (["--resume", str(resume)] if resume is not None else [])
    child += ["--quiet"] if quiet else []
    # On SIGTERM/SIGINT the agent signals each rank and waits --shutdown-timeout seconds
    # before SIGKILL: the grace period in which the ranks finish their steps and save.
    launch_args = torchrun.parse_args(
        [
            "--standalone",
            f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}",
            f"--shutdown-timeout={cfg.preemption.grace_s}",
            "--module",
            "reftrain",
            *child,
        ]
    )
    watchdog = _start_watchdog(cfg, run_dir, nproc)
    exits = ExitTimes()
    exits.start()
    try:
        torchrun.run(launch_args)
    except ChildFailedError as exc:
        message, secondary = _first_failure(exc, exits.exit_time)
        if watchdog is not None and watchdog.hangs:  # the watchdog killed every rank: the hang is the cause
            message, secondary = watchdog.hangs[-1].describe(), []
        done = manifest.read_manifest(run_dir)
        if done is not None and done.status == "completed":
            # Every rank got through the end of training; one died on its way out
            # (after the final checkpoint and run.json): the job is done, not failed.
            print(f"reftrain: note: the run completed; a rank then exited abnormally ({message})", file=sys.stderr)
            return 0
        manifest.mark_failed(run_dir, message, command, nproc, secondary, launcher=True)
        manifest.close_attempt(
            run_dir, "failed", message, [exc.failures[r].exitcode if r in exc.failures else 0 for r in range(nproc)]
        )
        raise ReftrainError(message) from None
    except SignalException as exc:  # Ctrl-C or a scheduler's SIGTERM: the agent forwarded it to the ranks
        done = manifest.read_manifest(run_dir)
        if done is not None and done.status in ("preempted", "completed"):
            # The ranks finished their step, saved and recorded it (the recorder's preemption, docs/reftrain.md "Preemption").
            print(f"reftrain: {exc.sigval.name}: run {done.status}; {run_dir}", file=sys.stderr)
            return 0
        latest = checkpoint.latest_checkpoint(run_dir)
        message = (
            f"stopped by {exc.sigval.name}: the ranks saved no checkpoint at the stop (a rank failed, "
            f"the step and its save took longer than preemption.grace_s={cfg.preemption.grace_s} s and the "
            f"ranks were killed, or the signal came before training began); latest checkpoint: "
            f"{latest.relative_to(run_dir) if latest is not None else 'none'}"
        )
        manifest.mark_failed(run_dir, message, command, nproc)
        manifest.close_attempt(run_dir, "failed", message, None)
        print(f"reftrain: {message}; {run_dir} is marked failed", file=sys.stderr)
        return 130
    finally:
        exits.stop()
        if watchdog is not None:
            watchdog.stop()
    return 0


def _start_watchdog(cfg: Config, run_dir: Path, nproc: int):
    """The launcher's hang watchdog over the ranks' heartbeat files (reftrain/heartbeat.py), or None."""
    if not cfg.watchdog.enabled:
        return None
    from recorder import heartbeat
    from analyzer.ingest.formats import HangReport

    timeout_s = cfg.watchdog.timeout_s

    def on_hang(hang: heartbeat.Hang, stacks: list[str]) -> None:
        message = hang.describe()
        detected = datetime.fromtimestamp(hang.detected_time, timezone.utc).isoformat(timespec="milliseconds")
        report = HangReport(
            rank=hang.rank,
            attempt=hang.attempt,
            step=hang.step,
            phase=hang.phase,
            stalled_s=round(hang.stalled_s, 3),
            timeout_s=timeout_s,
            detected_time=detected,
            stacks=stacks,
        )
        manifest.record_hang(run_dir, report, message)
        print(
            f"reftrain: {message}; Python stacks of every rank in {', '.join(stacks)} "
            f"(under {run_dir}); stopping the attempt",
            file=sys.stderr,
            flush=True,
        )

    dog = heartbeat.Watchdog(run_dir, nproc, timeout_s, cfg.watchdog.interval_s, on_hang)
    dog.start()
    return dog


def _failure_text(rank: int, failure) -> str:
    """One rank's failure in one line: its own error message, else how its process ended."""
    message = failure.message
    if isinstance(message, dict):  # torchelastic's @record format
        message = message.get("message", "")
    message = next((line.strip() for line in str(message or "").splitlines() if line.strip()), "")  # one line
    if message and not message.startswith("To enable traceback") and not message.startswith("Signal "):
        return message
    if failure.exitcode < 0:
        return f"rank {rank} was killed by {failure.signal_name()}"
    return f"rank {rank} exited with status {failure.exitcode}"


def failure_order(failures: Mapping[int, object], exit_time) -> list[int]:
    """The failed ranks, first failure first: by the exit time the launcher saw
    (`exit_time(pid)`, None when unknown), then by rank.

    A rank whose exit time is unknown (not seen exiting: no pidfds, or reaped
    before the launcher saw it) comes after those known."""

    def key(rank: int) -> tuple[bool, float, int]:
        t = exit_time(failures[rank].pid)  # type: ignore[attr-defined]
        return (t is None, t if t is not None else 0.0, rank)

    return sorted(failures, key=key)


def _first_failure(exc, exit_time) -> tuple[str, list[str]]:
    """(the first failing rank's error, the other failed ranks' errors in order)."""
    ranks = failure_order(exc.failures, exit_time)
    texts = [_failure_text(r, exc.failures[r]) for r in ranks]
    return texts[0], [t if t.startswith(f"rank {r}") else f"rank {r}: {t}" for r, t in zip(ranks[1:], texts[1:])]
