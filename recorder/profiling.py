"""torch.profiler on a schedule, writing one gzipped Kineto trace per window per rank.

Traces are `traces/step{N}/rank{R}.pt.trace.json.gz`: one folder per
profiler window, N its last step, so that HTA's TraceAnalysis and the
TensorBoard plugin (which take a folder and want one trace per rank, of the
same window) read one consistent window. Runs from before this layout hold
`traces/rank{R}.step{N}.json.gz`; the analyzer reads both
(analyzer.locate.trace_window).
ProfilerStep#N markers carry the run's global step index (also after a
resume), so trace steps join metrics records by `step`. torch adds
`distributedInfo` (backend, rank, world size, process groups) to the trace
when a process group is initialized, which HTA needs.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import torch
from torch.profiler import ProfilerAction, ProfilerActivity

from analyzer.ingest.formats import trace_file, trace_window_dir


class ProfileOptions(Protocol):
    """What StepProfiler reads from its options (reftrain's `profile` config section, the
    recorder's ProfileSchedule): the torch.profiler schedule and what to record."""

    @property
    def enabled(self) -> bool: ...
    @property
    def wait(self) -> int: ...
    @property
    def warmup(self) -> int: ...
    @property
    def active(self) -> int: ...
    @property
    def repeat(self) -> int: ...
    @property
    def record_shapes(self) -> bool: ...
    @property
    def memory(self) -> bool: ...
    @property
    def with_stack(self) -> bool: ...


_COLLECTING = (ProfilerAction.WARMUP, ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)

# Each window is written to its own file, so clearing events between cycles is
# what we want; torch warns about it from the second window on.
warnings.filterwarnings(
    "ignore", message="Warning: Profiler clears events at the end of each cycle", category=UserWarning
)


@contextmanager
def _without_kineto_banners():
    """Drop the `USDT:`/`STAGE:` lines libkineto prints to fd 2 when a trace starts and stops.

    They are unconditional (KINETO_LOG_LEVEL does not silence them) and, from
    every rank, bury the progress lines. fd 2 goes to a temporary file for the
    duration; everything else written there is passed on unchanged.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not line.startswith(("USDT:", "STAGE:")))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


class StepProfiler:
    """torch.profiler.profile driven by the training loop's global step numbers.

    The schedule (wait, warmup, active, repeat) counts from the first step of
    this process (`start_step`), so a resumed run waits before profiling too.
    Use as a context manager around the loop; call `step_done(step)` at the
    end of every step. A disabled profiler is a no-op with the same interface.
    """

    def __init__(self, cfg: ProfileOptions, rank: int, traces_dir: Path, device: torch.device, start_step: int) -> None:
        self.cfg = cfg
        self.rank = rank
        self.traces_dir = Path(traces_dir)
        self.start_step = start_step
        self.traces: list[str] = []  # files written, relative to traces_dir
        self.errors: list[str] = []  # one line per window that could not be written
        self._finished_step = start_step - 1
        self._prof: torch.profiler.profile | None = None
        if not cfg.enabled:
            return
        self._schedule = torch.profiler.schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat)
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(
            activities=activities,
            # torch evaluates the schedule once at construction with 0; clamp so that maps to start_step.
            schedule=lambda step: self._schedule(max(step - start_step, 0)),
            on_trace_ready=self._write_trace,
            record_shapes=cfg.record_shapes,
            profile_memory=cfg.memory,
            with_stack=cfg.with_stack,
        )
        # ProfilerStep#N markers use step_num; start it at the global step.
        self._prof.step_num = start_step

    def action(self, step: int) -> ProfilerAction:
        """What the profiler does during global step `step`."""
        if self._prof is None:
            return ProfilerAction.NONE
        return self._schedule(step - self.start_step)

    def collecting(self, step: int) -> bool:
        """True when the profiler runs during `step` (warm-up or active): the step is slower."""
        return self.action(step) in _COLLECTING

    def _write_trace(self, prof: torch.profiler.profile) -> None:
        name = trace_file(self._finished_step, self.rank)  # step{N}/rank{R}.pt.trace.json.gz
        path = self.traces_dir / name
        try:
            (self.traces_dir / trace_window_dir(self._finished_step)).mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(path))  # torch gzips a .gz path
        except (OSError, RuntimeError) as exc:  # RuntimeError: Kineto's own write of its temporary file
            # A window that cannot be written (disk full, read-only folder) costs that window, never the
            # run: one line, no half-written file left for a reader to trip on, training goes on.
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]
            self.errors.append(f"{path}: cannot write the profiler trace: {reason}")
            print(f"rank {self.rank}: {self.errors[-1]}", file=sys.stderr, flush=True)
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass  # the folder itself is unwritable: nothing was left in it either
            return
        self.traces.append(name)

    def step_done(self, step: int) -> None:
        """Mark the end of global step `step` (may start or stop tracing, or write a trace)."""
        self._finished_step = step
        if self._prof is None:
            return
        if self.action(step) == self.action(step + 1):
            self._prof.step()
        else:  # a transition: libkineto prints its banners here
            with _without_kineto_banners():
                self._prof.step()

    def __enter__(self) -> StepProfiler:
        if self._prof is not None:
            with _without_kineto_banners():
                self._prof.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._prof is not None:
            with _without_kineto_banners():
                self._prof.stop()
