"""Experiment trackers rank 0 logs to while training: TensorBoard, Weights & Biases, MLflow.

`reftrain --log tensorboard,wandb,mlflow` (any subset; config key
`log.trackers`, section `log`) sends, from rank 0 only and each in the
tracker's own conventions (docs/reftrain.md, "Experiment trackers"):

* every step: the numeric fields of rank 0's metrics record (the line it
  writes to metrics/rank0.jsonl) as `train/<field>` at the record's step;
* at the start: the resolved config (config.yaml);
* at the end: the run summary of the closing console lines as
  `summary/<key>` (:func:`run_summary`: the report's step time, tokens/s,
  MFU and HFU over all ranks) and the run's status.

`train/<field>` is rank 0's own value: `train/step_time_ms` rank 0's step
time, `train/tokens_per_s` rank 0's tokens over it; `analyzer export`'s
all-ranks curves are `run/<metric>` (docs/export.md, "One name, one meaning").

| | config | per step | summary and status |
| --- | --- | --- | --- |
| TensorBoard (`SummaryWriter`) | hparams plugin: experiment and session start (flattened keys), the YAML as text `config` | scalars | scalars at the last step; hparams session end (success, failure) |
| W&B (`wandb.init`) | `config=` (nested) | `run.log(..., step=)` | `run.summary`; `finish(exit_code=)` |
| MLflow (`MlflowClient`) | params (flattened keys) | metrics with step | metrics at the last step; tag `reftrain.status`; run status |

A tracker that fails (cannot start, a write raises) prints one warning line
and is dropped; training goes on. A tracker whose library is absent is an
error before any rank starts (:func:`require`), naming the extra.
"""

from __future__ import annotations

import importlib.util
import math
import netrc
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Protocol, TypeGuard, get_args
from urllib.parse import urlparse

import yaml

from reftrain.config import LogConfig, tracker_names
from reftrain.errors import ReftrainError

# The module each tracker imports (mlflow-skinny installs the `mlflow` package).
MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
EXTRA = "pip install 'trainperf[trackers]'"

# Fields of a metrics record that identify it rather than measure the step.
_NOT_METRICS = ("step", "rank", "time_ns", "attempt")
# Keys of run_summary() that are numbers (status is text): the metrics a tracker declares up front.
SUMMARY_METRICS = ("steps_run", "wall_s", "steady_steps", "step_time_ms", "tokens_per_s", "mfu", "hfu", "final_loss")


def require(log: LogConfig) -> list[str]:
    """The configured trackers; ReftrainError (one line naming the extra) when a library is absent."""
    names = tracker_names(log.trackers, "config: log.trackers")
    for name in names:
        if importlib.util.find_spec(MODULES[name]) is None:
            raise ReftrainError(f"--log {name} needs the {MODULES[name]} package: {EXTRA}")
    return names


def step_metrics(record: dict) -> dict[str, float]:
    """`train/<field>` for every numeric field of a reftrain.metrics/1 record (booleans, text, null left out)."""
    return {
        f"train/{k}": float(v)
        for k, v in record.items()
        if k not in _NOT_METRICS and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def run_summary(run_dir: Path, records: list[dict], wall_s: float, status: str) -> dict[str, Any]:
    """The run's closing figures, as `reftrain` prints them at the end and the trackers log them as `summary/<key>`.

    `step_time_ms`, `tokens_per_s`, `mfu`, `hfu` are the report's figures, computed by the
    analyzer from every rank's metrics records and run.json (docs/metrics.md: "Step time",
    "Throughput", "MFU and HFU"): over the steady-state steps (`step >= warmup_steps`, not
    profiled), per step the mean over ranks, then the median over steps; tokens/s counts all
    ranks' tokens. NaN where the analyzer has no such figure (no steady-state step), or when the
    run directory cannot be read (`summary_error` says why). `steady_steps`: how many steps those
    medians cover; `final_loss`: rank 0's loss of the last step run; `wall_s`: the loop's wall time (s).
    Call it on rank 0 after every rank has closed its metrics file and run.json is written.
    """
    from analyzer.errors import AnalyzerError
    from analyzer.ingest.rundir import read_run_dir
    from analyzer.metrics.mfu import mfu_from_manifest, steady_state
    from analyzer.metrics.step_time import median_of_rank_mean
    from analyzer.metrics.throughput import throughput

    out: dict[str, Any] = {
        "status": status,
        "steps_run": len(records),
        "wall_s": wall_s,
        "steady_steps": 0,
        "step_time_ms": math.nan,
        "tokens_per_s": math.nan,
        "mfu": math.nan,
        "hfu": math.nan,
        "final_loss": records[-1]["loss"] if records else math.nan,
    }
    try:
        rd = read_run_dir(run_dir)
    except AnalyzerError as exc:
        out["summary_error"] = str(exc)
        return out
    man, metrics = rd.run, rd.metrics
    if not metrics.empty and "step_time_ms" in metrics.columns:
        step_ms, n_steps = median_of_rank_mean(steady_state(metrics, man.warmup_steps or 0, man.profiled_steps))
        out["step_time_ms"], out["steady_steps"] = (math.nan if step_ms is None else step_ms), n_steps
    tp, mfu = throughput(rd.manifest, metrics), mfu_from_manifest(rd.manifest, metrics)
    for key, value in (("tokens_per_s", tp.median), ("mfu", mfu.median), ("hfu", mfu.hfu_median)):
        out[key] = math.nan if value is None else float(value)
    return out


def flat_config(config: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`section.key -> value` of a nested config dict (MLflow params, TensorBoard hparams)."""
    return {f"{section}.{key}": value for section, values in config.items() for key, value in values.items()}


def param_text(value: Any) -> str:
    """A config value as an MLflow param (params are text), spelled as in config.yaml: null, true, false, 0.001."""
    if value is None or isinstance(value, bool):
        return yaml.safe_dump(value).removesuffix("\n...\n").strip()
    return str(value)


class _Tracker(Protocol):
    def log_step(self, step: int, metrics: dict[str, float], time_ns: int) -> None: ...
    def finish(self, summary: dict[str, Any] | None, status: str, step: int) -> None: ...


class Trackers:
    """The trackers of one run, on rank 0 (on any other rank every call does nothing).

    `start()` opens each tracker and logs the config; `log_step()` logs one
    metrics record; `finish()` logs the summary and closes them (idempotent:
    `reftrain.train.run` calls `finish(None, "failed")` when training raised).
    An exception inside a tracker prints `reftrain: warning: <tracker>: ...`
    once on stderr and drops that tracker.
    """

    def __init__(self, log: LogConfig, run_dir: Path, rank: int) -> None:
        self.log, self.run_dir = log, run_dir
        self.names = tracker_names(log.trackers, "config: log.trackers") if rank == 0 else []
        self.live: dict[str, _Tracker] = {}
        self.last_step = 0
        self.warnings: list[str] = []

    def start(self, config: dict[str, dict[str, Any]], run_id: str, attempt: int) -> None:
        """Open the trackers and log `config` (config.yaml's content) to each."""
        for name in self.names:
            try:
                self.live[name] = OPENERS[name](self.log, self.run_dir, run_id, config, attempt)
            except Exception as exc:  # noqa: BLE001 - a tracker must never stop training
                self._warn(name, "could not start", exc)

    def log_step(self, record: dict) -> None:
        if not self.live:
            return
        self.last_step = int(record["step"])
        metrics = step_metrics(record)
        for name, tracker in list(self.live.items()):
            try:
                tracker.log_step(self.last_step, metrics, int(record.get("time_ns") or time.time_ns()))
            except Exception as exc:  # noqa: BLE001
                self._warn(name, f"logging step {self.last_step} failed", exc)
                self._drop(name, tracker)

    def finish(self, summary: dict[str, Any] | None, status: str) -> None:
        for name, tracker in list(self.live.items()):
            try:
                tracker.finish(summary, status, self.last_step)
            except Exception as exc:  # noqa: BLE001
                self._warn(name, "closing failed", exc)
        self.live.clear()

    def _drop(self, name: str, tracker: _Tracker) -> None:
        self.live.pop(name, None)
        try:
            tracker.finish(None, "failed", self.last_step)
        except Exception:  # noqa: BLE001 - already warned once for this tracker; closing is best effort
            pass

    def _warn(self, name: str, what: str, exc: BaseException) -> None:
        detail = (str(exc).strip().splitlines() or [""])[0][:300]
        line = f"reftrain: warning: {name}: {what} ({type(exc).__name__}: {detail}); not logging to {name}, training continues"
        self.warnings.append(line)
        print(line, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# TensorBoard
# ---------------------------------------------------------------------------


class _TensorBoard:
    """torch.utils.tensorboard.SummaryWriter; the hparams plugin's experiment and session records.

    The hparams records are built from the plugin's own protos
    (tensorboard.plugins.hparams: api_pb2, plugin_data_pb2, metadata), as
    torch's `hparams()` does, but typed right (a bool is DATA_TYPE_BOOL, not
    a number) and written into the run's own event file instead of a
    sub-folder; tensorboard's `hparams.summary` helpers would need TensorFlow.
    """

    def __init__(self, log: LogConfig, run_dir: Path, run_id: str, config: dict, attempt: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
        from torch.utils.tensorboard import SummaryWriter

        self.api_pb2, self.plugin_data_pb2 = api_pb2, plugin_data_pb2

        def record(tag: str, data: Any) -> Any:
            return Summary(value=[Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(data))])

        self.record, self.metadata = record, metadata
        logdir = run_dir / "tb" if log.tensorboard_dir is None else Path(log.tensorboard_dir) / run_id
        self.writer = SummaryWriter(log_dir=str(logdir))
        # One hparams session per run. Null values are left out (the plugin has no null).
        hparams = {k: v for k, v in flat_config(config).items() if v is not None}
        infos = [
            api_pb2.HParamInfo(
                name=k,
                type=api_pb2.DATA_TYPE_BOOL
                if isinstance(v, bool)
                else api_pb2.DATA_TYPE_FLOAT64
                if isinstance(v, (int, float))
                else api_pb2.DATA_TYPE_STRING,
            )
            for k, v in hparams.items()
        ]
        metrics = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=f"summary/{k}")) for k in SUMMARY_METRICS]
        experiment = api_pb2.Experiment(hparam_infos=infos, metric_infos=metrics, time_created_secs=time.time())
        start = plugin_data_pb2.SessionStartInfo(group_name=run_id, start_time_secs=time.time())
        for k, v in hparams.items():
            if isinstance(v, bool):
                start.hparams[k].bool_value = v
            elif isinstance(v, (int, float)):
                start.hparams[k].number_value = v
            else:
                start.hparams[k].string_value = str(v)
        fw = self.writer._get_file_writer()
        fw.add_summary(record(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment)))
        fw.add_summary(
            record(metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start))
        )
        self.writer.add_text("config", "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "```")
        self.writer.flush()

    def log_step(self, step: int, metrics: dict[str, float], time_ns: int) -> None:
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, step, walltime=time_ns / 1e9)
        self.writer.flush()  # live: TensorBoard reads the file while the run goes on

    def finish(self, summary: dict[str, Any] | None, status: str, step: int) -> None:
        for key, value in (summary or {}).items():
            if key in SUMMARY_METRICS and isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(f"summary/{key}", value, step)
        pb = self.api_pb2
        end = self.plugin_data_pb2.SessionEndInfo(
            status=pb.STATUS_SUCCESS if status == "completed" else pb.STATUS_FAILURE, end_time_secs=time.time()
        )
        self.writer._get_file_writer().add_summary(
            self.record(
                self.metadata.SESSION_END_INFO_TAG, self.plugin_data_pb2.HParamsPluginData(session_end_info=end)
            )
        )
        self.writer.close()


# ---------------------------------------------------------------------------
# Weights & Biases
# ---------------------------------------------------------------------------


def wandb_logged_in(environ: Mapping[str, str] | None = None) -> bool:
    """Whether W&B has a login here: WANDB_API_KEY, or a netrc entry for the W&B host (what `wandb login` writes)."""
    env = os.environ if environ is None else environ
    if env.get("WANDB_API_KEY"):
        return True
    host = urlparse(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = Path(env["NETRC"]) if env.get("NETRC") else Path.home() / ".netrc"
    try:
        return path.is_file() and netrc.netrc(str(path)).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


WandbMode = Literal["online", "offline", "disabled", "shared"]
# W&B's older names, which its settings still accept for $WANDB_MODE.
_WANDB_MODE_ALIASES = {"dryrun": "offline", "run": "online"}


def _is_wandb_mode(mode: str) -> TypeGuard[WandbMode]:
    return mode in get_args(WandbMode)


def wandb_mode(log: LogConfig, environ: Mapping[str, str] | None = None) -> WandbMode:
    """The W&B mode the run uses: log.wandb_mode, or for `auto` $WANDB_MODE, else online with a login, else offline.

    ReftrainError for a $WANDB_MODE that W&B does not know."""
    env = os.environ if environ is None else environ
    if log.wandb_mode != "auto":
        mode = log.wandb_mode
    else:
        mode = env.get("WANDB_MODE") or ("online" if wandb_logged_in(env) else "offline")
    mode = _WANDB_MODE_ALIASES.get(mode, mode)
    if not _is_wandb_mode(mode):
        raise ReftrainError(
            f"W&B mode {mode!r} ($WANDB_MODE or log.wandb_mode): expected one of {', '.join(get_args(WandbMode))}"
        )
    return mode


def wandb_run_id(run_id: str) -> str:
    """The W&B run id of a run directory name: W&B ids may not hold / \\ # ? % : and are at most 64 characters."""
    return "".join("-" if c in "/\\#?%:" else c for c in run_id)[:64]


class _Wandb:
    """wandb.init(config=...), run.log(..., step=), run.summary; offline without a login."""

    def __init__(self, log: LogConfig, run_dir: Path, run_id: str, config: dict, attempt: int) -> None:
        import wandb

        root = run_dir if log.wandb_dir is None else Path(log.wandb_dir)
        root.mkdir(parents=True, exist_ok=True)
        # console="off": reftrain's own output stays as it is (no wrapped stdout); silent: no banner.
        self.wandb = wandb
        settings = wandb.Settings(silent=True, console="off", disable_git=True, save_code=False)
        # The run id is the run directory's name, so a restarted attempt (a new process) continues the same run.
        self.run = wandb.init(
            project=log.wandb_project,
            name=run_id,
            id=wandb_run_id(run_id),
            dir=str(root),
            mode=wandb_mode(log),
            config=config,
            resume="allow" if attempt > 0 else None,
            settings=settings,
        )

    def log_step(self, step: int, metrics: dict[str, float], time_ns: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self, summary: dict[str, Any] | None, status: str, step: int) -> None:
        for key, value in (summary or {}).items():
            if not (isinstance(value, float) and not math.isfinite(value)):
                self.run.summary[f"summary/{key}"] = value
        self.run.summary["summary/status"] = status
        self.run.finish(exit_code=0 if status == "completed" else 1)
        # Stop W&B's service process now: a launched rank leaves by os._exit, past the atexit hook that would.
        self.wandb.teardown()


# ---------------------------------------------------------------------------
# MLflow
# ---------------------------------------------------------------------------


def mlflow_uri(log: LogConfig, run_dir: Path) -> str:
    """The tracking URI: log.mlflow_uri (a plain folder becomes a file: URI), else the file store RUN_DIR/mlruns."""
    if log.mlflow_uri is None:
        return (run_dir / "mlruns").resolve().as_uri()
    if "://" in log.mlflow_uri or log.mlflow_uri.startswith("file:"):
        return log.mlflow_uri
    return Path(log.mlflow_uri).resolve().as_uri()


_MLFLOW_STATUS = {"completed": "FINISHED", "preempted": "KILLED"}
_MLFLOW_BATCH = 100  # MlflowClient.log_batch takes at most 100 params (and 1000 metrics) per call


class _Mlflow:
    """MlflowClient: params from the flattened config, metrics with step, the summary as metrics and a tag."""

    def __init__(self, log: LogConfig, run_dir: Path, run_id: str, config: dict, attempt: int) -> None:
        uri = mlflow_uri(log, run_dir)
        if uri.startswith("file:"):
            # MLflow 3 refuses a file store unless opted in (maintenance mode, not removed);
            # a file: URI is what the user asked for, so opt in for this process.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self.Metric = Metric
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(log.mlflow_experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(log.mlflow_experiment)
        if attempt > 0 and "'" not in run_id:  # a restarted attempt continues the run its first attempt created
            found = self.client.search_runs(
                [exp_id], filter_string=f"tags.`reftrain.run_id` = '{run_id}'", max_results=1
            )
            if found:
                self.run_id = found[0].info.run_id
                return
        run = self.client.create_run(
            exp_id,
            run_name=run_id,
            tags={"reftrain.run_id": run_id, "reftrain.run_dir": str(run_dir), "mlflow.source.name": "reftrain"},
        )
        self.run_id = run.info.run_id
        params = [Param(k, param_text(v)) for k, v in flat_config(config).items()]
        for i in range(0, len(params), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + _MLFLOW_BATCH])

    def log_step(self, step: int, metrics: dict[str, float], time_ns: int) -> None:
        ms = time_ns // 1_000_000
        self.client.log_batch(self.run_id, metrics=[self.Metric(k, v, ms, step) for k, v in metrics.items()])

    def finish(self, summary: dict[str, Any] | None, status: str, step: int) -> None:
        now = int(time.time() * 1000)
        metrics = [
            self.Metric(f"summary/{k}", float(v), now, step)
            for k, v in (summary or {}).items()
            if k in SUMMARY_METRICS and isinstance(v, (int, float)) and math.isfinite(v)
        ]
        self.client.log_batch(self.run_id, metrics=metrics)
        self.client.set_tag(self.run_id, "reftrain.status", status)
        self.client.set_terminated(self.run_id, _MLFLOW_STATUS.get(status, "FAILED"))


OPENERS: dict[str, Callable[..., _Tracker]] = {"tensorboard": _TensorBoard, "wandb": _Wandb, "mlflow": _Mlflow}
