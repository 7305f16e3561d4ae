"""The run directory: its name, creation, config.yaml and the run.json manifest (docs/rundir.md).

The manifest is :class:`analyzer.ingest.formats.RunManifest`, the one typed
definition its readers (the analyzer, the dashboard) use too. Torch-free, so
reftrain's command line can create and fail run directories before any rank starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

from analyzer.ingest.formats import (
    FAMILY_SCHEMAS,
    RUN_SCHEMA,
    Attempt,
    CheckpointSave,
    Files,
    HangReport,
    RunManifest,
    attempt_folder,
    records_file,
)
from recorder.errors import RecorderError

SCHEMA = RUN_SCHEMA
SCHEMAS = FAMILY_SCHEMAS


def utc_now() -> str:
    """ISO 8601 UTC timestamp with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def create_run_dir(
    runs_dir: Path,
    name: str,
    explicit: bool,
    config_yaml: str,
    *,
    runs_label: str = "runs_dir",
    writer: str = "the recorder",
    name_option: str = "name=",
) -> Path:
    """Create RUNS_DIR/<name>/ and write config.yaml (`config_yaml`, the text); never reuses a directory.

    An `explicit` name (the user's) that exists is an error. A generated name that
    exists (two runs in the same second) gets a `-2`, `-3`, ... suffix. Errors name
    the runs folder by `runs_label`, the writer and the option that names a run as the
    caller's user knows them.
    """
    runs = Path(runs_dir)
    try:
        runs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RecorderError(f"{runs_label}: cannot create {runs}: {exc.strerror or exc}") from None
    if not runs.is_dir():
        raise RecorderError(f"{runs_label}: {runs} is not a directory")
    if not os.access(runs, os.W_OK | os.X_OK):
        raise RecorderError(f"{runs_label}: {runs} is not writable")
    for attempt in range(1, 100):
        path = runs / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            path.mkdir()
            break
        except FileExistsError:
            if explicit:
                raise RecorderError(
                    f"run directory {path} already exists; {writer} never overwrites a run (choose another {name_option})"
                ) from None
        except OSError as exc:
            raise RecorderError(f"{runs_label}: cannot create {path}: {exc.strerror or exc}") from None
    else:
        raise RecorderError(f"{runs_label}: {runs}: too many runs named {name}-N")
    (path / "config.yaml").write_text(config_yaml)
    return path


def saved_config_dict(run_dir: Path) -> dict:
    """The content of RUN_DIR/config.yaml as a dict (the manifest's `config`)."""
    import yaml

    return yaml.safe_load((Path(run_dir) / "config.yaml").read_text())


def write_json(path: Path, data: dict | RunManifest) -> None:
    """Write JSON atomically (temp file + rename): readers never see half a manifest."""
    path = Path(path)
    if isinstance(data, RunManifest):
        data = data.to_json()
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def read_manifest(run_dir: Path) -> RunManifest | None:
    """run.json, or None when it does not exist yet (or is not a JSON object)."""
    try:
        data = json.loads((Path(run_dir) / "run.json").read_text())
    except FileNotFoundError:
        return None
    return RunManifest.from_json(data) if isinstance(data, dict) else None


def mark_failed(
    run_dir: Path,
    error: str,
    command: list[str],
    world_size: int | None,
    secondary: list[str] | None = None,
    launcher: bool = False,
) -> None:
    """Record a failure in run.json (rank 0 on its own error; the launcher when the job ends).

    Keeps everything rank 0 wrote; a run that failed before rank 0 wrote
    anything gets a minimal manifest with the config and the error. A run
    already ended stays as it is, except that the launcher's verdict
    (`launcher`: it saw every rank, and which failed first) replaces a
    failure rank 0 recorded: rank 0's own error is often only the
    consequence of another rank's death. `secondary`: the other ranks' errors.
    """
    run_dir = Path(run_dir)
    data = read_manifest(run_dir)
    if data is None:  # the fields rank 0 would have filled stay null
        data = RunManifest(
            run_id=run_dir.name,
            command=list(command),
            config=saved_config_dict(run_dir),
            world_size=world_size,
            files=empty_files(),
        )
    elif data.status != "running" and not (launcher and data.status == "failed"):
        return
    # What is on disk now, whatever rank 0 last recorded (a save may have
    # completed after its last write of run.json).
    data.files.checkpoints = complete_checkpoints(run_dir)
    data.status, data.end_time, data.error = "failed", utc_now(), error
    data.secondary_errors = list(secondary) if secondary else None
    write_json(run_dir / "run.json", data)


def empty_files() -> Files:
    """The manifest's `files` before any rank has written a file."""
    return Files(config="config.yaml", metrics=[], collectives=[], telemetry=[], traces=[], checkpoints=[])


def files_listing(run_dir: Path, per_rank: list[dict[str, list[str]]]) -> Files:
    """The manifest's `files` object from each rank's own list of files it wrote.

    `per_rank[r]` maps "metrics", "collectives", "traces", "telemetry" to
    paths relative to the run directory. Checkpoints are listed from disk
    (complete ones only: DCP writes `.metadata` last).
    """
    out = Files(config="config.yaml")
    for family in ("metrics", "collectives", "telemetry", "traces"):
        setattr(out, family, [path for files in per_rank for path in files.get(family, [])])
    out.checkpoints = complete_checkpoints(run_dir)
    return out


_STEP_DIR = re.compile(r"^step(\d+)$")


def complete_checkpoints(run_dir: Path) -> list[str]:
    """`checkpoints/step{K}` folders that are complete (DCP writes `.metadata`
    last), relative to the run directory, by step."""
    run_dir = Path(run_dir)
    found = []
    for p in (run_dir / "checkpoints").glob("step*"):
        m = _STEP_DIR.match(p.name)
        if m and (p / ".metadata").is_file():
            found.append((int(m.group(1)), str(p.relative_to(run_dir))))
    return [rel for _, rel in sorted(found)]


def record_checkpoints(run_dir: Path) -> None:
    """Rewrite run.json's `files.checkpoints` from disk, right after a save
    completes, so that a run that dies later (even by SIGKILL, when nobody
    gets to call :func:`mark_failed`) still lists every complete checkpoint.
    Rank 0 only; does nothing before rank 0 has written run.json."""
    run_dir = Path(run_dir)
    data = read_manifest(run_dir)
    if data is None:
        return
    data.files.checkpoints = complete_checkpoints(run_dir)
    write_json(run_dir / "run.json", data)


def attempts_so_far(run_dir: Path, attempt: int, start_time: str, start_step: int) -> list[Attempt]:
    """run.json's `attempts` at the start of attempt `attempt` (0 = the first): the
    earlier ones from run.json, the last of them closed as failed (torchelastic
    restarted the job because a rank died; its exit codes are the launcher's to
    know, and it records them when the job ends), then this one, running."""
    earlier: list[Attempt] = []
    if attempt > 0:
        data = read_manifest(Path(run_dir))
        earlier = list(data.attempts) if data is not None else []
        if earlier and earlier[-1].status == "running":
            earlier[-1] = dataclasses.replace(
                earlier[-1], status="failed", end_time=start_time, cause="a rank died; torchelastic restarted the job"
            )
    return [
        *earlier,
        Attempt(
            attempt=attempt,
            start_time=start_time,
            end_time=None,
            status="running",
            resumed_from_step=start_step,
            cause=None,
            exit_codes=None,
        ),
    ]


def earlier_attempt_files(run_dir: Path, attempt: int, world_size: int) -> dict[str, list[str]]:
    """The metrics, collectives and traces files the attempts before `attempt` left on disk."""
    run_dir = Path(run_dir)
    out: dict[str, list[str]] = {"metrics": [], "collectives": [], "traces": [], "telemetry": []}
    for k in range(attempt):
        for family in ("metrics", "collectives"):
            for r in range(world_size):
                rel = records_file(family, r, k)
                if (run_dir / rel).is_file():
                    out[family].append(rel)
        pattern = f"traces/{attempt_folder(k)}*/*.json*"
        for p in sorted(run_dir.glob(pattern)):
            trace_rel = p.relative_to(run_dir)
            # traces/<window>/... for the first attempt, traces/attempt<k>/<window>/... after a restart.
            # Only the first attempt's glob also matches later attempts' folders (traces/attempt<j>/...),
            # so only there are they skipped; a later attempt's own folder is named attempt<k>.
            window = trace_rel.parts[2] if k else trace_rel.parts[1]
            if window.startswith(".") or (k == 0 and window.startswith("attempt")):
                continue
            out["traces"].append(str(trace_rel))
    return out


def close_attempt(run_dir: Path, status: str, cause: str | None, exit_codes: list[int] | None) -> None:
    """The launcher's record of how the last attempt ended (the ranks could not write it);
    `exit_codes` None when the launcher does not know them (ranks killed on a signal)."""
    data = read_manifest(Path(run_dir))
    if data is None or not data.attempts:
        return
    last = data.attempts[-1]
    if last.status == "running":
        last.status, last.end_time, last.cause = status, utc_now(), cause
    if last.status in ("running", status, "hung"):  # a hung attempt keeps the watchdog's cause, gets the codes
        last.exit_codes = None if exit_codes is None else list(exit_codes)
        write_json(Path(run_dir) / "run.json", data)


def record_checkpoint_save(
    run_dir: Path, step: int, stall_s: float, attempt: int, mode: str = "sync", complete_s: float | None = None
) -> None:
    """Append one save to run.json's `checkpoint_saves` (step, the training loop's stall in
    seconds, attempt, mode sync|async, and for async the time to publication).
    Rank 0 only; does nothing before rank 0 has written run.json."""
    run_dir = Path(run_dir)
    data = read_manifest(run_dir)
    if data is None:
        return
    save = CheckpointSave(step=step, stall_s=stall_s, attempt=attempt, mode=mode, complete_s=complete_s)
    data.checkpoint_saves = [*(data.checkpoint_saves or []), save]
    write_json(run_dir / "run.json", data)


def record_hang(run_dir: Path, hang: HangReport, cause: str) -> None:
    """The watchdog's finding: appended to run.json's `hangs`, and the attempt it ended
    closed as `hung` with `cause` (the launcher; the ranks are blocked or being killed)."""
    run_dir = Path(run_dir)
    data = read_manifest(run_dir)
    if data is None:
        return
    data.hangs = [*(data.hangs or []), hang]
    for a in data.attempts:
        if a.attempt == hang.attempt and a.status == "running":
            a.status, a.end_time, a.cause = "hung", hang.detected_time, cause
    write_json(run_dir / "run.json", data)
