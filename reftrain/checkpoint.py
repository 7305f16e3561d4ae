"""Checkpoint and resume through torch.distributed.checkpoint (DCP).

`checkpoints/step{K}/` holds the state after K optimizer steps (the next
step to run is K): model and optimizer state from
`torch.distributed.checkpoint.state_dict.get_state_dict` (fully qualified
names without DDP/FSDP/AC/compile wrappers, so a checkpoint loads under
either strategy and any world size) and the step counter. Data needs no
state: the token stream is a pure function of (seed, rank, step).

torch is imported inside the save/load functions so that the command line
can find and check a checkpoint path without importing it.
"""

from __future__ import annotations

import os
import re
import shutil
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reftrain.errors import ReftrainError

_STEP_DIR = re.compile(r"^step(\d+)$")


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step{step}"


def find_checkpoint(path: Path) -> tuple[Path, Path]:
    """(run directory, checkpoint directory) for `--resume PATH`.

    PATH is a run directory (its latest complete checkpoint is taken) or one
    `checkpoints/step{K}` directory. A checkpoint is complete when DCP's
    `.metadata` file exists (DCP writes it last); saves are also atomic
    (see :func:`save`), so a `step{K}` folder is complete by construction.
    """
    path = Path(path)
    if not path.exists():
        raise ReftrainError(f"--resume {path}: no such run or checkpoint directory")
    if _STEP_DIR.match(path.name) and path.parent.name == "checkpoints":
        if not (path / ".metadata").is_file():
            raise ReftrainError(f"--resume {path}: incomplete checkpoint (no .metadata)")
        return path.parent.parent, path
    steps = []
    for d in (path / "checkpoints").glob("step*"):
        m = _STEP_DIR.match(d.name)
        if m and (d / ".metadata").is_file():
            steps.append((int(m.group(1)), d))
    if not steps:
        raise ReftrainError(
            f"--resume {path}: no complete checkpoint under {path / 'checkpoints'} (run with --checkpoint-every K)"
        )
    return path, max(steps)[1]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The run's latest complete checkpoint, or None (a restarted job resumes from it)."""
    try:
        return find_checkpoint(Path(run_dir))[1]
    except ReftrainError:
        return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(run_dir: Path, step: int, model, optimizer, before_publish=None) -> Path:
    """Save model + optimizer + step as checkpoints/step{step} and list it in
    run.json (rank 0). Collective: call on all ranks.

    Atomic: DCP writes into `checkpoints/.step{K}.tmp` (its FileSystemWriter
    fsyncs each file, sync_files=True); rank 0 then fsyncs the folder, renames
    it to `step{K}` and fsyncs `checkpoints/`, so a save killed at any point
    (SIGKILL included) leaves no `step{K}` and the previous checkpoint is the
    latest. `before_publish(step)` runs between the two (fault injection)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    import torch.distributed as dist

    path = checkpoint_dir(run_dir, step)
    tmp = path.with_name(f".{path.name}.tmp")
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if rank0 and tmp.exists():  # left by a save that was killed
        shutil.rmtree(tmp)
    if dist.is_initialized():
        dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd, "trainer": {"step": step}}, checkpoint_id=str(tmp))
    # dcp.save returns on every rank after the coordinator wrote .metadata.
    if before_publish is not None:
        before_publish(step)
    if dist.is_initialized():
        dist.barrier()  # every rank's fault point passed: nobody dies after the rename
    if rank0:
        _publish(run_dir, tmp, path)
    if dist.is_initialized():
        dist.barrier()  # nobody reads step{K} before it exists
    return path


def _publish(run_dir: Path, tmp: Path, path: Path) -> None:
    """Rank 0: make a fully written `.step{K}.tmp` the checkpoint `step{K}` (fsync, rename, fsync)."""
    from recorder import manifest

    _fsync_dir(tmp)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    # The checkpoint is complete, so run.json lists it now, not only when
    # the run ends well: a killed run must still name its checkpoints.
    manifest.record_checkpoints(run_dir)


@dataclass
class PendingSave:
    """An asynchronous save in flight: DCP writes `tmp` in a background thread."""

    step: int
    tmp: Path
    path: Path
    future: Future[Any]  # of DCP's Metadata
    started_s: float  # time.perf_counter() when the save began
    stall_s: float  # the loop's wait inside async_save (barrier, state dict, staging copy, plan)


def save_async(run_dir: Path, step: int, model, optimizer, process_group) -> PendingSave:
    """Start saving checkpoints/step{step} with `torch.distributed.checkpoint.async_save`. Collective.

    The call stages a CPU copy of the state (DCP's DefaultStager deep-copies
    every tensor, so the training steps that follow cannot change what is
    written) and returns; the write runs in a thread, its collectives on
    `process_group` (a gloo group of its own: DCP needs a CPU backend, and
    the background collectives must not interleave with training's on the
    default group). Publishing waits for the future: :func:`finish_async`."""
    import time

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    t0 = time.perf_counter()
    path = checkpoint_dir(run_dir, step)
    tmp = path.with_name(f".{path.name}.tmp")
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if rank0 and tmp.exists():  # left by a save that was killed
        shutil.rmtree(tmp)
    if dist.is_initialized():
        dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    response = dcp.async_save(
        {"model": model_sd, "optim": optim_sd, "trainer": {"step": step}},
        checkpoint_id=str(tmp),
        process_group=process_group,
    )
    # A future of the write; DCP answers with an AsyncSaveResponse only when given an async stager.
    future = response if isinstance(response, Future) else response.upload_completion
    return PendingSave(step, tmp, path, future, t0, time.perf_counter() - t0)


def finish_async(run_dir: Path, pending: PendingSave, wait: bool, before_publish=None) -> bool:
    """Publish an asynchronous save once its write is complete; whether it was (not collective).

    With `wait` false, returns False at once while the write runs. Every
    rank's future completes only after DCP's coordinator (rank 0) gathered
    all ranks' write results and wrote `.metadata`, so rank 0 alone can
    rename, and never before: an incomplete save stays `.step{K}.tmp`.
    A failed write raises here (DCP's CheckpointException)."""
    import torch.distributed as dist

    if not wait and not pending.future.done():
        return False
    pending.future.result()
    if before_publish is not None:
        before_publish(pending.step)
    if not dist.is_initialized() or dist.get_rank() == 0:
        _publish(run_dir, pending.tmp, pending.path)
    return True


def load(path: Path, model, optimizer) -> int:
    """Load a checkpoint into model and optimizer in place; returns its step. Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "trainer": {"step": -1}}
    try:
        dcp.load(state, checkpoint_id=str(path))
    except Exception as exc:  # noqa: BLE001 - DCP raises CheckpointException with per-rank tracebacks
        first = str(exc).strip().splitlines()
        detail = next((line for line in reversed(first) if "Error" in line), first[-1] if first else repr(exc))
        raise ReftrainError(
            f"--resume {path}: checkpoint does not fit this model/optimizer: {detail.strip()}"
        ) from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    step = int(state["trainer"]["step"])
    if step < 0:
        raise ReftrainError(f"--resume {path}: checkpoint has no step counter")
    return step
