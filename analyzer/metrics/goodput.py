"""Goodput of a reftrain run: productive step time / wall time, and where the rest went
(definition: docs/rundir.md, "Restarts and goodput").

All times are seconds on rank 0's wall clock (``time_ns`` of its metrics
records, run.json's ISO timestamps). Per (attempt, step) the job moves at its
slowest rank, so a step's time is the max over ranks of ``step_time_ms``
and its data wait the max over ranks of ``data_wait_ms``; a step's start is
rank 0's ``time_ns`` minus that step time.

* wall = last attempt's ``end_time`` (else the last record's time) minus the
  first attempt's ``start_time``.
* kept steps: each step's execution in the latest attempt that ran it.
  productive = sum over kept steps of (step time - data wait).
* data_wait = sum over kept steps of the data wait.
* recomputed = sum of the step times of the executions a later attempt
  ran again (steps after the last complete checkpoint of a failed attempt).
* startup = per attempt, its first step's start minus its ``start_time``
  (process group, model build, peak measurement, checkpoint load).
* hang = per attempt the launcher's watchdog ended (``status`` ``hung``),
  its ``end_time`` (the detection) minus its last step record: the time the
  job sat stalled until the watchdog named the hung rank.
* restarts = per attempt after the first, its ``start_time`` minus the
  last record of the attempts before it, less the hang time in between
  (failure detection and relaunch; the part of a failed attempt after its
  last step record is here too).
* checkpoint = sum of run.json's ``checkpoint_saves[].stall_s`` (rank 0's
  wall time inside each save, the training loop stalled).
* other = wall minus all the above: time between steps not in a save
  (printing, profiler export), the tail after the last step, clock error.

A preempted attempt (``status`` ``preempted``: SIGTERM/SIGINT, the step
finished and saved) is the job's last and ends at its ``end_time`` like a
completed one; its final save is in ``checkpoint``, and it recomputes
nothing, since the save holds its last step. The resumed run, a new run
directory, counts its own start-up (the checkpoint load).

Withheld (None) without a start time, without step records, or for a
restarted run whose records carry no ``attempt``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Mapping

import pandas as pd

from analyzer.ingest.formats import Attempt, RunManifest

PARTS = ("data_wait", "recomputed", "startup", "restarts", "hang", "checkpoint", "other")


@dataclass(frozen=True)
class Goodput:
    wall_s: float
    productive_s: float
    lost_s: dict[str, float]  # PARTS -> seconds
    attempts: int
    recomputed_steps: int
    hung_attempts: int = 0
    preempted: bool = False  # the last attempt was preempted (resumable), not completed

    @property
    def goodput(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else float("nan")

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"goodput": self.goodput}


def _ts(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _attempt_no(a: Attempt, i: int) -> int:
    """An attempt's number: its ``attempt`` field, else its place in the list."""
    return a.attempt if a.attempt is not None else i


def goodput(manifest: RunManifest | Mapping[str, Any], metrics: pd.DataFrame) -> Goodput | None:
    """Goodput of a run from its run.json and its metrics table (columns rank, step,
    step_time_ms, data_wait_ms, time_ns, and attempt, 0 when absent)."""
    if metrics is None or metrics.empty:
        return None
    man = RunManifest.read(manifest)
    attempts = man.attempts or [Attempt(attempt=0, start_time=man.start_time, end_time=man.end_time)]
    if len(attempts) > 1 and "attempt" not in metrics:
        return None  # restarted, but the records do not say which attempt ran them: withheld
    m = metrics.copy()
    m["attempt"] = m["attempt"].fillna(0).astype("int64") if "attempt" in m else 0
    per = m.groupby(["attempt", "step"], sort=True).agg(
        step_ms=("step_time_ms", "max"), data_ms=("data_wait_ms", "max")
    )
    r0 = m[m["rank"] == m["rank"].min()].set_index(["attempt", "step"])["time_ns"]
    per = per.join(r0.rename("end_ns"), how="inner")
    per["end_s"] = per["end_ns"] / 1e9
    per["start_s"] = per["end_s"] - per["step_ms"] / 1e3
    per = per.reset_index()
    latest = per.groupby("step")["attempt"].transform("max")
    kept, redone = per[per["attempt"] == latest], per[per["attempt"] != latest]

    starts = {_attempt_no(a, i): _ts(a.start_time) for i, a in enumerate(attempts)}
    begin = _ts(attempts[0].start_time) or _ts(man.start_time)
    end = _ts(attempts[-1].end_time) or _ts(man.end_time) or float(per["end_s"].max())
    if begin is None:
        return None
    startup = restarts = 0.0
    first_start = per.groupby("attempt")["start_s"].min()
    for k, first in zip(first_start.index.tolist(), first_start.tolist()):
        start = starts.get(int(k))
        if start is not None:
            startup += first - start
    last_end = per.groupby("attempt")["end_s"].max()
    hang_of: dict[int, float] = {}
    for i, a in enumerate(attempts):
        k, stop = _attempt_no(a, i), _ts(a.end_time)
        if a.status == "hung" and stop is not None and k in last_end.index:
            hang_of[k] = max(0.0, stop - float(last_end[k]))
    for k in sorted(starts):
        # From the last record of any earlier attempt: an attempt that died before
        # writing anything (a failed rendezvous) is absent from both tables.
        before, start = last_end[last_end.index < k], starts[k]
        if k > 0 and start is not None and len(before):
            # a hung attempt's stall since that record is `hang`, not restart time
            last_attempt = int(before.index.to_numpy()[before.to_numpy().argmax()])
            stalled = sum((h for j, h in hang_of.items() if last_attempt <= j < k), 0.0)
            restarts += start - float(before.max()) - stalled
    stall = sum(float(s.stall_s or 0.0) for s in man.checkpoint_saves or [])
    wall = end - begin
    lost = {
        "data_wait": float(kept["data_ms"].sum()) / 1e3,
        "recomputed": float(redone["step_ms"].sum()) / 1e3,
        "startup": startup,
        "restarts": restarts,
        "hang": sum(hang_of.values()),
        "checkpoint": stall,
    }
    productive = float((kept["step_ms"] - kept["data_ms"]).sum()) / 1e3
    lost["other"] = wall - productive - sum(lost.values())
    hung = sum(a.status == "hung" for a in attempts)
    return Goodput(
        wall,
        productive,
        lost,
        len(attempts),
        len(redone),
        hung_attempts=hung,
        preempted=attempts[-1].status == "preempted",
    )
